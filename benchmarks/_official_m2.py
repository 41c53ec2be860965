"""The official M² Transformer code's beam search, re-done on an edgecap M² model's weights.

Issue 12 asks for the bundle's speed "against the official M² code". Its decoding
(aimagelab/meshed-memory-transformer: models/beam_search/beam_search.py, models/transformer/
decoders.py and attention.py) is neither our static-cache step nor a plain re-run of the
prefix. Per step it:

- runs step 0 at one row per image, then one row per beam;
- keeps each decoder layer's self-attention *inputs* (its stateful `running_keys` /
  `running_values`) and projects the whole prefix to keys and values again every step;
- projects every encoder level to cross-attention keys and values again every step, for every
  beam row (the cross-attention is not stateful), and its query once per level;
- masks padded positions (the query and key masks of the official decoder);
- gathers every state into the selected beams' order after each step, moved or not: the
  running inputs, the running mask and positions, the encoder output and its mask, and the raw
  region features (`_expand_visual`);
- ranks candidates by a full descending sort of beam x vocabulary per image; a finished beam
  keeps its score and continues with token 0 (every other candidate gets -999);
- keeps every chosen word's log-probability, gathered into the beams' order like the words.

The encoder is the model's own (the official one runs it once too, inside step 0). Attention
is written here as the official ScaledDotProductAttention computes it, over the model's own
linear layers, so the captions are the model's: `tests/test_beam_reference.py` checks them
against edgecap's decoding.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

# the official beam search's score for every continuation of a finished beam but the first
FINISHED = -999.0


def supports(cfg) -> str | None:
    """None if the model has the M² code's structure, else why not (one line)."""
    if cfg.decoder != "transformer" or cfg.cross_attention != "meshed" or cfg.decoder_self_attention != "plain":
        return ("the official M² decoding needs meshed cross-attention and plain decoder self-attention "
                f"({cfg.name}: {cfg.decoder}, {cfg.cross_attention}, {cfg.decoder_self_attention})")
    return None


def attention(att, queries, keys, values, masked=None):
    """The official ScaledDotProductAttention over the linear layers of `att` (an edgecap
    MultiHeadAttention): queries [B, Lq, d], keys / values [B, Lk, d] projected here; masked
    [B, 1, Lq or 1, Lk] True = hidden."""
    b, nq, _ = queries.shape
    nk, h, dh = keys.shape[1], att.n_heads, att.d_head
    q = att.fc_q(queries).view(b, nq, h, dh).permute(0, 2, 1, 3)
    k = att.fc_k(keys).view(b, nk, h, dh).permute(0, 2, 3, 1)
    v = att.fc_v(values).view(b, nk, h, dh).permute(0, 2, 1, 3)
    scores = torch.matmul(q, k) / math.sqrt(dh)
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))
    out = torch.matmul(torch.softmax(scores, -1), v).permute(0, 2, 1, 3).reshape(b, nq, h * dh)
    return att.fc_o(out)


def gather_beams(state: torch.Tensor, beam: torch.Tensor, width: int) -> torch.Tensor:
    """The official _expand_state / _expand_visual: rows [B * width, ...] -> the chosen beams'
    rows [B * k, ...] (beam [B, k]: each new row's beam among the image's `width`), always a
    full gather."""
    b, k = beam.shape
    shape = state.shape[1:]
    index = beam.view(b, k, *([1] * len(shape))).expand(b, k, *shape)
    return torch.gather(state.view(b, width, *shape), 1, index).reshape(b * k, *shape)


class OfficialM2Decoding:
    """`encode(feats, mask)` then `decode()` -> the best caption's tokens [B, max_len]."""

    def __init__(self, model, beam_size: int, max_len: int):
        reason = supports(model.cfg)
        if reason:
            raise ValueError(reason)
        self.model, self.beam, self.max_len = model, beam_size, max_len
        self.feats = self.enc_output = self.enc_masked = None

    @torch.no_grad()
    def encode(self, feats: torch.Tensor, mask: torch.Tensor) -> None:
        levels = self.model.encoder(feats, mask)  # [levels, B, N, d]
        self.feats = feats
        self.enc_output = levels.transpose(0, 1).contiguous()  # the official layout, [B, levels, N, d]
        self.enc_masked = ~mask.to(torch.bool)[:, None, None, :]

    def _layer(self, layer, x, running, enc_output, enc_masked, self_masked, pad):
        """One MeshedDecoderLayer on the step's token x [R, 1, d]; running: this layer's
        (keys, values) inputs so far, returned with x appended."""
        keys, values = (torch.cat([r, x], 1) for r in running)
        self_att = layer.norm(x + attention(layer.self_attn, x, keys, values, self_masked)) * pad
        cross = layer.cross
        mixed = 0
        for level, gate in enumerate(cross.gates):
            enc = enc_output[:, level]
            c = cross.norm(self_att + attention(cross.attention, self_att, enc, enc, enc_masked)) * pad
            mixed = mixed + c * torch.sigmoid(gate(torch.cat([self_att, c], -1)))
        mixed = mixed / math.sqrt(len(cross.gates)) * pad
        return layer.ff(mixed) * pad, (keys, values)

    @torch.no_grad()
    def decode(self) -> torch.Tensor:
        model, cfg, k = self.model, self.model.cfg, self.beam
        b = self.feats.shape[0]
        feats, enc_output, enc_masked = self.feats, self.enc_output, self.enc_masked
        d = cfg.d_model
        running = [(feats.new_zeros(b, 0, d), feats.new_zeros(b, 0, d)) for _ in model.layers]
        device = feats.device  # the official code's tensors live where the features do (a GPU too)
        self_masked = torch.zeros(b, 1, 1, 0, dtype=torch.bool, device=device)
        positions = torch.zeros(b, 1, dtype=torch.long, device=device)
        words = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=device)
        seq_logprob = feats.new_zeros(b, 1, 1)
        seq_mask = feats.new_ones(b, k, 1)
        outputs: list[torch.Tensor] = []
        log_probs: list[torch.Tensor] = []
        for t in range(self.max_len):
            width = 1 if t == 0 else k
            pad = (words != cfg.pad_id).unsqueeze(-1).float()  # [R, 1, 1]
            self_masked = torch.cat([self_masked, (words == cfg.pad_id)[:, None, None, :]], -1)
            positions = positions + 1
            x = model.word_emb(words) + model.positions[positions]
            for i, layer in enumerate(model.layers):
                x, running[i] = self._layer(layer, x, running[i], enc_output, enc_masked, self_masked, pad)
            word_logprob = F.log_softmax(model.fc(x), dim=-1).view(b, width, -1)
            vocab = word_logprob.shape[-1]
            candidates = seq_logprob + word_logprob
            if t > 0:
                seq_mask = seq_mask * (words.view(b, width) != cfg.eos_id).float().unsqueeze(-1)
                old = seq_logprob.expand_as(candidates).contiguous()
                old[:, :, 1:] = FINISHED
                candidates = seq_mask * candidates + old * (1 - seq_mask)
                word_logprob = word_logprob * seq_mask.expand_as(word_logprob)
            ranked, order = torch.sort(candidates.view(b, -1), -1, descending=True)
            seq_logprob, order = ranked[:, :k].unsqueeze(-1), order[:, :k]
            beam, chosen = order // vocab, order % vocab
            running = [(gather_beams(keys, beam, width), gather_beams(values, beam, width)) for keys, values in running]
            self_masked, positions = gather_beams(self_masked, beam, width), gather_beams(positions, beam, width)
            enc_output, enc_masked, feats = (gather_beams(t, beam, width) for t in (enc_output, enc_masked, feats))
            seq_mask = torch.gather(seq_mask, 1, beam.unsqueeze(-1))
            outputs = [torch.gather(o, 1, beam.unsqueeze(-1)) for o in outputs]
            outputs.append(chosen.unsqueeze(-1))
            picked = torch.gather(word_logprob, 1, beam.unsqueeze(-1).expand(b, k, vocab))
            log_probs = [torch.gather(o, 1, beam.unsqueeze(-1)) for o in log_probs]
            log_probs.append(torch.gather(picked, 2, chosen.unsqueeze(-1)))
            words = chosen.view(-1, 1)
        order = torch.sort(seq_logprob, 1, descending=True)[1]
        tokens = torch.gather(torch.cat(outputs, -1), 1, order.expand(b, k, self.max_len))
        return tokens[:, 0]
