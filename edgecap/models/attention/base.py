"""Multi-head scaled dot-product attention, the plug point every variant extends.

A variant changes only what it must: extra always-visible key/value slots (`extra_kv`) or a
transform of the input keys (`adjust_keys`). Full-sequence attention (`forward`) and one
decoding step against a static cache (`step`) share the same code, which is what makes
incremental decoding equal to running the whole prefix.

A decoding step never rewrites its cache: it attends to the slots written before (`step`
masks the rest) plus its own new key/value as a separate block, and returns that new key /
value for the caller to write into slot `step` in place. Keys shared by several query rows
(an image's cross K/V, read by all its beams) are kept once per image; `attend` groups the
rows' queries per image instead of copying the keys per beam. Keys are kept transposed,
[..., H, dh, L] (values [..., H, L, dh]), the layout the score matmul reads: the cross keys and
the cache are graph inputs, and onnxruntime would copy a transposed view of one every step.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from edgecap.contract.state import StateTensor
from edgecap.models.registry import DECODER_SELF_ATTENTION, ENCODER_ATTENTION

# Finite, so a row with every key masked gives a uniform (not NaN) distribution, and large
# enough that exp() underflows to exactly 0 in fp32.
MASK_VALUE = -1e9


def slots_before(cache_v: torch.Tensor, step: torch.Tensor, dims: int = 4) -> torch.Tensor:
    """Which of the value cache's T slots (axis -2 of [..., T, dh]) hold earlier positions:
    bool [1, ..., 1, T] with `dims` axes, for masking attention scores."""
    slots = torch.arange(cache_v.shape[-2], device=cache_v.device)
    return (slots < step).view((1,) * (dims - 1) + (-1,))


def transpose_keys(k: torch.Tensor) -> torch.Tensor:
    """Keys [..., L, dh] -> [..., dh, L]; one position (a decoding step) is only a reshape, so
    the graph moves no data for it."""
    if k.shape[-2] == 1:
        return k.reshape(*k.shape[:-2], k.shape[-1], 1)
    return k.transpose(-1, -2)


def group_rows(q: torch.Tensor, groups: int) -> torch.Tensor:
    """[R, H, L, dh] -> [G, H, R/G * L, dh]: consecutive rows (one image's beams) become one
    row whose queries are the beams' queries in order."""
    rows, h, length, dh = q.shape
    return q.view(groups, rows // groups, h, length, dh).transpose(1, 2).reshape(groups, h, rows // groups * length, dh)


def ungroup_rows(out: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """The inverse of `group_rows` on [..., G, H, R/G * L, dh] -> [..., R, H, L, dh]."""
    *lead, groups, h, _, dh = out.shape
    out = out.reshape(*lead, groups, h, rows // groups, length, dh).transpose(-4, -3)
    return out.reshape(*lead, rows, h, length, dh)


@ENCODER_ATTENTION.register("plain")
@DECODER_SELF_ATTENTION.register("plain")
class MultiHeadAttention(nn.Module):
    @classmethod
    def describe(cls, cfg) -> str:
        """What this variant adds, for `edgecap models` ("" for nothing)."""
        return ""

    def __init__(self, d_model: int, n_heads: int, cfg=None):
        super().__init__()
        self.d_model, self.n_heads = d_model, n_heads
        self.d_head = d_model // n_heads
        self.fc_q = nn.Linear(d_model, d_model)
        self.fc_k = nn.Linear(d_model, d_model)
        self.fc_v = nn.Linear(d_model, d_model)
        self.fc_o = nn.Linear(d_model, d_model)
        for fc in (self.fc_q, self.fc_k, self.fc_v, self.fc_o):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, d] -> [B, H, L, dh]; a decoding step's rows [R, d] -> [R, H, 1, dh] (a view:
        with one position there is nothing to transpose)."""
        if x.dim() == 2:
            return x.view(x.shape[0], self.n_heads, 1, self.d_head)
        b, n, _ = x.shape
        return x.view(b, n, self.n_heads, self.d_head).transpose(1, 2)

    def merge(self, x: torch.Tensor, rows: bool = False) -> torch.Tensor:
        """[..., B, H, L, dh] -> [..., B, L, d]; rows: a decoding step's [..., R, H, 1, dh] ->
        [... * R, d], leading axes (M2's encoder levels) folded into the rows, so the output
        projection is one 2-D matmul."""
        if rows:
            return x.reshape(-1, self.d_model)
        *lead, b, _, n, _ = x.shape
        return x.transpose(-3, -2).reshape(*lead, b, n, self.d_model)

    def extra_kv(self):
        """Extra keys [1, H, dh, M] and values [1, H, M, dh] shared by every row, and which of
        the M are visible ([M] bool, or None for all), or None for no extra slots."""
        return None

    def adjust_keys(self, k: torch.Tensor) -> torch.Tensor:
        """Transform projected input keys [B, H, L, dh] before attention."""
        return k

    def project_kv(self, keys: torch.Tensor, values: torch.Tensor):
        """Projected input keys [B, H, dh, L] (transposed) and values [B, H, L, dh], from
        [B, L, d] or a decoding step's rows [R, d] (L = 1); cross-attention caches these."""
        return transpose_keys(self.adjust_keys(self.split(self.fc_k(keys)))), self.split(self.fc_v(values))

    def attend(self, q, k, v, mask, bias=None, current=None):
        """Attention of q [R, H, Lq, dh] over the keys k [..., Bk, H, dh, Lk] (transposed) and
        values v [..., Bk, H, Lk, dh], the layer's extra slots, and in a decoding step the
        position's own key and value.

        mask: bool broadcastable to the scores [..., Bk, H, Lq, Lk], True = visible; bias: added
        to those scores before masking (ACF's log C). Bk is R, or B images whose R / B
        consecutive rows (their beams) share the keys: the rows' queries are then grouped per
        image. Leading dims of k batch several attentions (M2's encoder levels) -> [..., R, H,
        Lq, dh]. current: (k [R, H, dh, Lq], v [R, H, Lq, dh], bias or None), always visible.
        Every block is scored on its own and one softmax normalises them all, as if their keys
        were concatenated, so nothing the size of the cache or the memory is copied.
        """
        rows, length, shared = q.shape[0], q.shape[2], k.shape[-4]
        grouped = shared != rows
        if grouped:
            if rows % shared or current is not None:
                raise ValueError(f"{rows} query rows cannot share keys of {shared} images")
            q = group_rows(q, shared)
        scale = math.sqrt(self.d_head)
        blocks = []
        extra = self.extra_kv()
        if extra is not None:
            mk, mv, visible = extra
            scores = torch.matmul(q, mk) / scale
            if visible is not None:
                scores = scores.masked_fill(~visible.view(1, 1, 1, -1), MASK_VALUE)
            blocks.append((scores, mv))
        scores = torch.matmul(q, k) / scale
        if bias is not None:
            scores = scores + bias
        blocks.append((scores.masked_fill(~mask, MASK_VALUE), v))
        if current is not None:
            ck, cv, cbias = current
            scores = torch.matmul(q, ck) / scale
            blocks.append((scores if cbias is None else scores + cbias, cv))
        if len(blocks) == 1:
            out = torch.matmul(torch.softmax(blocks[0][0], dim=-1), v)
        else:
            probs = torch.softmax(torch.cat([b[0] for b in blocks], dim=-1), dim=-1)
            out, start = 0, 0
            for scores, values in blocks:
                width = scores.shape[-1]
                out = out + torch.matmul(probs[..., start:start + width], values)
                start += width
        return ungroup_rows(out, rows, length) if grouped else out

    def forward(self, queries, keys, values, mask):
        k, v = self.project_kv(keys, values)
        out = self.attend(self.split(self.fc_q(queries)), k, v, mask)
        return self.fc_o(self.merge(out))

    # Plug points the core calls. The defaults are plain attention; a variant that needs more
    # than the sentence overrides them. `carry` is state handed from one layer to the next in
    # the same stack (None at the first layer; ACF's accumulated clustering matrix); `side` is
    # this layer's slice of the extra cross tensors a side encoder produced (RA-T's retrieved
    # captions); `cache` is (k, v, *the extra per-layer tensors `cache_state` describes).
    # The state a variant adds to the Transformer core's, described for export and runtime
    # (edgecap.contract.state): extra cache tensors (batch first, per layer) and the cross
    # tensors its side encoder makes, in the order `init_extra_cache` / `project_side` give them.
    cache_state: tuple[StateTensor, ...] = ()
    cross_state: tuple[StateTensor, ...] = ()
    # the export spec a model with this variant needs ("": its decoder's own)
    export_spec = ""
    # the training hook (edgecap.train.hook) that gives this variant what it needs from the
    # training loop beyond the core's steps ("": nothing)
    training_hook = ""

    @classmethod
    def side_encoder(cls, cfg):
        """A module turning the extra inputs of `encode` into states the decoder attends to."""
        return None

    def init_extra_cache(self, batch: int, length: int, device) -> tuple[torch.Tensor, ...]:
        """Zeros for the extra per-layer cache tensors, batch first."""
        return ()

    def encode_layer(self, x, mask, carry):
        return self.forward(x, x, x, mask), carry

    def decode_prefix(self, x, mask, side, carry):
        return self.forward(x, x, x, mask), carry

    def decode_step(self, x, cache, step, side, carry):
        """-> (output, the new position's values of this layer's cache fields, carry)."""
        out, k, v = self.step(x, cache[0], cache[1], step)
        return out, (k, v), carry

    def step(self, x, cache_k, cache_v, step):
        """One query position against a static cache.

        x [R, d] (one position per row: no length axis, so every linear layer is a plain 2-D
        matmul); cache_k [R, H, dh, T] / cache_v [R, H, T, dh] with positions < step filled;
        step: 0-d int64 tensor. Returns (out [R, d], k [R, H, dh, 1], v [R, H, 1, dh]): the
        position's own key and value, which the caller writes into slot `step`.
        """
        k, v = self.project_kv(x, x)
        out = self.attend(self.split(self.fc_q(x)), cache_k, cache_v, slots_before(cache_v, step), current=(k, v, None))
        return self.fc_o(self.merge(out, rows=True)), k, v
