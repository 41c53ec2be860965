"""RA-Transformer kNN-augmented decoder self-attention (Sarto et al., CBMI 2022).

A one-layer memory encoder reads each of the k retrieved captions (word embedding +
sinusoidal positions, self-attention + feed-forward, post-LN like the core) once per image;
its states are the side input of every decoder layer. Each decoder layer attends, from the
same queries, causally to the sentence and to all retrieved-caption tokens, and mixes the two
as alpha * self + (1 - alpha) * memory with alpha = sigmoid(a learned scalar, initially 0).

Shapes are static: k captions of `retrieval.length` tokens each, padded with <pad>; padding is
masked, and an image with no retrieved caption at all gets no memory term.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from edgecap.contract.state import cross_tensor
from edgecap.errors import EdgecapError
from edgecap.models.attention.base import MultiHeadAttention, slots_before
from edgecap.models.core import FeedForward, sinusoid_table
from edgecap.models.registry import CONFIG_SECTIONS, DECODER_SELF_ATTENTION


@CONFIG_SECTIONS.register("retrieval")
@dataclass
class RetrievalConfig:
    """RA-Transformer: k retrieved captions per image, each padded to `length` tokens."""

    k: int = 10
    length: int = 20  # tokens per retrieved caption (BOS .. EOS, then padding)
    index: str = ""  # the `edgecap index build` directory; export copies it into the bundle


class MemoryEncoder(nn.Module):
    """memory_tokens [B, k, Lm] int64 -> states [B, k*Lm, d], visible [B, k*Lm] bool."""

    input_names = ("memory_tokens",)

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.word_emb = nn.Embedding(cfg.vocab_size, d, padding_idx=cfg.pad_id)
        self.register_buffer("positions", sinusoid_table(cfg.retrieval.length, d), persistent=False)
        self.attention = MultiHeadAttention(d, cfg.n_heads, cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm = nn.LayerNorm(d)
        self.ff = FeedForward(d, cfg.d_ff, cfg.dropout)

    def example_inputs(self, batch: int, device) -> tuple[torch.Tensor]:
        """Deterministic captions of varied length, the last neighbour missing (export parity)."""
        cfg, r = self.cfg, self.cfg.retrieval
        g = torch.Generator().manual_seed(0)
        words = torch.randint(4, max(cfg.vocab_size, 5), (batch, r.k, r.length), generator=g)
        lengths = torch.randint(1, r.length - 1, (batch, r.k, 1), generator=g)  # words per caption
        pos = torch.arange(r.length).view(1, 1, -1)
        tokens = torch.where(pos <= lengths, words, torch.full_like(words, cfg.pad_id))
        tokens = torch.where(pos == lengths + 1, torch.full_like(words, cfg.eos_id), tokens)
        tokens[..., 0] = cfg.bos_id
        if r.k > 1:
            tokens[:, -1] = cfg.pad_id
        return (tokens.to(device),)

    def forward(self, tokens: torch.Tensor):
        b, k, length = tokens.shape
        r = self.cfg.retrieval
        if (k, length) != (r.k, r.length):
            raise EdgecapError(
                f"memory_tokens have shape {tuple(tokens.shape)}, expected [B, {r.k}, {r.length}] "
                "(retrieval.k captions of retrieval.length tokens)"
            )
        flat = tokens.reshape(b * k, length)  # each caption encoded on its own
        visible = flat != self.cfg.pad_id  # [B*k, Lm]
        x = self.word_emb(flat) + self.positions
        att = self.attention(x, x, x, visible[:, None, None, :])
        x = self.ff(self.norm(x + self.dropout(att)))
        return x.reshape(b, k * length, -1), visible.reshape(b, k * length)


@DECODER_SELF_ATTENTION.register("knn")
class KnnAugmentedAttention(MultiHeadAttention):
    def __init__(self, d_model: int, n_heads: int, cfg):
        super().__init__(d_model, n_heads, cfg)
        # Memory keys/values come from another encoder, so they get their own projections;
        # the queries and the output projection are shared with self-attention.
        self.mem_k = nn.Linear(d_model, d_model)
        self.mem_v = nn.Linear(d_model, d_model)
        for fc in (self.mem_k, self.mem_v):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)
        self.gate = nn.Parameter(torch.zeros(()))  # alpha = sigmoid(0) = 0.5 at the start

    # per layer: memory keys [B, H, dh, M] and values [B, H, M, dh]; which of the M are captions [B, M]
    export_spec = "retrieval"  # the Transformer graphs plus the retrieval index and captions
    training_hook = "retrieval"  # the run's index and retrieved captions (edgecap/train/hooks/retrieval.py)
    cross_state = (cross_tensor("side_k", 0, per_layer=True), cross_tensor("side_v", 0, per_layer=True),
                   cross_tensor("side_mask", 0))

    @classmethod
    def describe(cls, cfg) -> str:
        return f"kNN {cfg.retrieval.k} captions"

    @classmethod
    def side_encoder(cls, cfg):
        return MemoryEncoder(cfg)

    def project_side(self, states):
        """states [B, M, d] -> memory keys [B, H, dh, M], values [B, H, M, dh] (once per image)."""
        return self.split(self.mem_k(states)).transpose(-1, -2), self.split(self.mem_v(states))

    def mix(self, q, own, side):
        """q [R,H,L,dh]; own = self-attention heads [R,H,L,dh]; side = (k [B,H,dh,M], v [B,H,M,dh],
        visible [B,M]) of the R rows' B images (R / B beams each) -> the mixed heads [R,H,L,dh]."""
        mem_k, mem_v, visible = side
        memory = self.attend(q, mem_k, mem_v, visible[:, None, None, :])
        # An image with no retrieved caption must not attend uniformly to padding.
        has_memory = visible.to(q.dtype).amax(dim=-1)
        if has_memory.shape[0] != q.shape[0]:
            has_memory = has_memory.repeat_interleave(q.shape[0] // has_memory.shape[0])
        alpha = torch.sigmoid(self.gate)
        return alpha * own + (1 - alpha) * memory * has_memory.view(-1, 1, 1, 1)

    def decode_prefix(self, x, mask, side, carry):
        q = self.split(self.fc_q(x))
        k, v = self.project_kv(x, x)
        return self.fc_o(self.merge(self.mix(q, self.attend(q, k, v, mask), side))), carry

    def decode_step(self, x, cache, step, side, carry):
        k, v = self.project_kv(x, x)
        q = self.split(self.fc_q(x))
        own = self.attend(q, cache[0], cache[1], slots_before(cache[1], step), current=(k, v, None))
        return self.fc_o(self.merge(self.mix(q, own, side), rows=True)), (k, v), carry
