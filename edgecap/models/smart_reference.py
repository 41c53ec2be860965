"""SMArT in plain PyTorch: the model in one file, to read first.

SMArT (Sarto et al.) is the memory-augmented Transformer captioner this project is built on:

    region features [B, N, D_in] --encoder--> N contextual regions
    caption so far [B, L] --decoder (self-attention, cross-attention to the regions)--> next word

The encoder's self-attention also attends to M learned "memory slots": keys and values that are
parameters, not computed from the image, so a layer can hold knowledge no single image carries.
Everything else is the post-layer-norm Transformer of the M2 code.

This file has none of the machinery the exported model needs (static decoding cache, one
position per step, beams sharing an image's keys, per-layer graph tensors, pluggable attention
registries): the decoder reruns the whole prefix at every step. `edgecap.models.core` is the
same model built for export, and tests/test_family_contract.py checks it against this one
(same weights, same log-probs, same greedy captions). Parameter names match the core's, so
`SMArT.from_model(build("smart", ...))` copies a core model's weights in.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

MASK_VALUE = -1e9  # finite: a row with every key masked stays finite


class Attention(nn.Module):
    """Multi-head scaled dot-product attention; `slots` > 0 adds SMArT's memory slots."""

    def __init__(self, d_model: int, n_heads: int, slots: int = 0):
        super().__init__()
        self.n_heads, self.d_head, self.slots = n_heads, d_model // n_heads, slots
        self.fc_q, self.fc_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.fc_v, self.fc_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        if slots:
            self.m_k = nn.Parameter(torch.zeros(1, slots, d_model))
            self.m_v = nn.Parameter(torch.zeros(1, slots, d_model))

    def heads(self, x):  # [B, L, d] -> [B, H, L, dh]
        return x.view(x.shape[0], x.shape[1], self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, queries, keys, values, visible):
        """visible: bool, broadcastable to the scores [B, H, Lq, Lk]; True = may attend."""
        q, k, v = self.heads(self.fc_q(queries)), self.heads(self.fc_k(keys)), self.heads(self.fc_v(values))
        scores = ((q @ k.transpose(-1, -2)) / math.sqrt(self.d_head)).masked_fill(~visible, MASK_VALUE)
        if self.slots:
            # The slots join every image's keys and values, always visible. Scaled as in the
            # paper's code: keys by sqrt(d_head), values by sqrt(M).
            batch = keys.shape[0]
            m_k = self.heads(math.sqrt(self.d_head) * self.m_k.expand(batch, -1, -1))
            m_v = self.heads(math.sqrt(self.slots) * self.m_v.expand(batch, -1, -1))
            scores = torch.cat([(q @ m_k.transpose(-1, -2)) / math.sqrt(self.d_head), scores], dim=-1)
            v = torch.cat([m_v, v], dim=2)
        out = torch.softmax(scores, dim=-1) @ v
        return self.fc_o(out.transpose(1, 2).reshape(queries.shape))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout, self.dropout_inner = nn.Dropout(dropout), nn.Dropout(dropout)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x):
        return self.norm(x + self.dropout(self.fc2(self.dropout_inner(F.relu(self.fc1(x))))))


class EncoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg.d_model, cfg.n_heads, slots=cfg.memory.slots)
        self.dropout, self.norm = nn.Dropout(cfg.dropout), nn.LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)

    def forward(self, x, visible):
        return self.ff(self.norm(x + self.dropout(self.self_attn(x, x, x, visible))))


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc_in, self.norm_in = nn.Linear(cfg.d_in, cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.enc_layers))

    def forward(self, feats, mask):
        x = self.norm_in(self.dropout(F.relu(self.fc_in(feats))))
        visible = mask[:, None, None, :]  # every query sees the image's real regions
        for layer in self.layers:
            x = layer(x, visible)
        return x


class CrossAttention(nn.Module):
    """The decoder's attention to the last encoder layer's regions."""

    def __init__(self, cfg):
        super().__init__()
        self.attention = Attention(cfg.d_model, cfg.n_heads)
        self.dropout, self.norm = nn.Dropout(cfg.dropout), nn.LayerNorm(cfg.d_model)

    def forward(self, x, regions, mask):
        return self.norm(x + self.dropout(self.attention(x, regions, regions, mask[:, None, None, :])))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg.d_model, cfg.n_heads)
        self.dropout, self.norm = nn.Dropout(cfg.dropout), nn.LayerNorm(cfg.d_model)
        self.cross = CrossAttention(cfg)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)

    def forward(self, x, causal, regions, mask):
        x = self.norm(x + self.dropout(self.self_attn(x, x, x, causal)))
        return self.ff(self.cross(x, regions, mask))


class SMArT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.word_emb = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.register_buffer("positions", torch.zeros(cfg.max_len + 1, cfg.d_model))  # row t + 1: step t
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.dec_layers))
        self.fc = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    @classmethod
    def from_model(cls, model) -> SMArT:
        """This reading of a core-built SMArT (`build("smart", ...)`), with its weights."""
        reference = cls(model.cfg)
        weights = {k: v for k, v in model.state_dict().items() if not k.startswith("visual.")}
        reference.load_state_dict(weights)
        return reference.train(model.training)

    def forward(self, feats, mask, tokens):
        """Teacher forcing: features [B, N, D_in], mask [B, N] bool, tokens [B, L] starting with
        BOS -> log-probs of the next word at every position [B, L, V]."""
        mask = mask.to(torch.bool)
        regions = self.encoder(feats, mask)
        length = tokens.shape[1]
        x = self.word_emb(tokens) + self.positions[1:length + 1]
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).tril()[None, None]
        for layer in self.layers:
            x = layer(x, causal, regions, mask)
        return F.log_softmax(self.fc(x), dim=-1)

    @torch.no_grad()
    def greedy(self, feats, mask, max_len: int | None = None):
        """The most likely word at each step, the whole prefix rerun every step -> [B, T]
        token ids (BOS not included; after EOS, padding)."""
        cfg = self.cfg
        tokens = torch.full((feats.shape[0], 1), cfg.bos_id, dtype=torch.long, device=feats.device)
        done = torch.zeros(feats.shape[0], dtype=torch.bool, device=feats.device)
        for _ in range(max_len or cfg.max_len):
            word = self(feats, mask, tokens)[:, -1].argmax(-1)
            word = torch.where(done, torch.full_like(word, cfg.pad_id), word)
            done |= word == cfg.eos_id
            tokens = torch.cat([tokens, word[:, None]], dim=1)
        return tokens[:, 1:]
