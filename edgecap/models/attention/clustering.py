"""ACF adaptive-clustering self-attention (Wang et al., "Adaptively Clustering Neighbor
Elements for Image-Text Generation", a.k.a. Ada-ClustFormer).

A clustering matrix C, computed from the layer input s, softly limits self-attention to a
local cluster window. 1-D (decoder, over words):

    p_ik = sigmoid(FC([s_k, mean(s_i..s_{k-1})]))          for i < k
    C_ij = prod_{k=i+1..j} p_ik  (j > i),  C_ji = C_ij,  C_ii = 1

2-D (encoder, over the h x w feature grid): 1-D matrices along every row (H_r) and every
column (V_c) of the (optionally 2x average-pooled) grid, combined along the two L-shaped paths
between two cells, C((r1,c1),(r2,c2)) = (H_r1[c1,c2] V_c2[r1,r2] + V_c1[r1,r2] H_r2[c1,c2]) / 2,
which is symmetric with C_ii = 1, then repeated back to the full grid. Across layers
C~(m) = (1 - C(m)) * C~(m-1) + C(m), so clusters only grow with depth.

Choices (docs/rat-acf.md has the reasons): C is shared by all heads; it reweights the
attention probabilities and the rows are renormalised, computed as softmax(QK^T/sqrt(d) +
log C~). FC is linear, so FC([s_k, mean]) = a_k + (U_k - U_i) / (k - i) with per-position
scalars a = w1.s + b, u = w2.s and exclusive prefix sums U; the products are sums of
log-sigmoids taken with a triangular matrix product (no CumProd in ONNX). The decoder step
caches a and u per position (cache fields clu_a, clu_u) and rebuilds its row of C from them,
so incremental decoding equals the full prefix with static shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from edgecap.contract.state import cache_tensor
from edgecap.errors import EdgecapError
from edgecap.models.attention.base import MultiHeadAttention, slots_before
from edgecap.models.registry import CONFIG_SECTIONS, DECODER_SELF_ATTENTION, ENCODER_ATTENTION


@CONFIG_SECTIONS.register("clustering")
@dataclass
class ClusteringConfig:
    """ACF clustering attention: the encoder's 2-D grid and its down-up sampling rate."""

    grid_w: int = 0  # grid width in tokens; 0 = square grid (sqrt of n_regions)
    downsample: int = 2  # 1 = none; 2 = C on a 2x average-pooled grid, repeated back


# Floor of C~ before the log: a weight of 1e-6 is negligible, and it stays representable
# in fp16, so log C~ never becomes -inf.
C_FLOOR = 1e-6


def log_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """log(sigmoid(x)) without -inf for very negative x (ONNX has no LogSigmoid)."""
    return torch.clamp(x, max=0) - torch.log(1 + torch.exp(-x.abs()))


def log_links(a: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """a, u [B, L] -> log p [B, L(i), L(k)], zero unless i < k."""
    length = a.shape[-1]
    pos = torch.arange(length, device=a.device)
    before = (pos[:, None] < pos[None, :]).to(a.dtype)  # [m, k]: m < k
    prefix = torch.matmul(u, before)  # U_k = sum_{m<k} u_m, [B, L]
    dist = (pos[None, :] - pos[:, None]).clamp(min=1).to(a.dtype)  # [i, k]: k - i
    logits = a[:, None, :] + (prefix[:, None, :] - prefix[:, :, None]) / dist
    upper = pos[:, None] < pos[None, :]  # [i, k]: i < k
    return torch.where(upper, log_sigmoid(logits), torch.zeros_like(logits))


def log_cluster(a: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """a, u [B, L] -> log C [B, L, L], symmetric with a zero diagonal."""
    links = log_links(a, u)
    length = a.shape[-1]
    pos = torch.arange(length, device=a.device)
    upto = (pos[:, None] <= pos[None, :]).to(a.dtype)  # [k, j]: k <= j
    upper = torch.matmul(links, upto)  # sum_{k<=j} log p_ik; zero for j <= i
    return upper + upper.transpose(-1, -2)


def accumulate(c: torch.Tensor, carry):
    """Cross-layer update C~(m) = (1 - C(m)) C~(m-1) + C(m) -> (log C~, C~)."""
    total = c if carry is None else (1 - c) * carry + c
    return torch.log(total.clamp(min=C_FLOOR)), total


class _ClusteringBase(MultiHeadAttention):
    @classmethod
    def describe(cls, cfg) -> str:
        return "clustering"

    def __init__(self, d_model: int, n_heads: int, cfg):
        super().__init__(d_model, n_heads, cfg)
        self.norm_s = nn.LayerNorm(d_model)
        self.fc = nn.Linear(2 * d_model, 1)  # FC([s_k, mean(s_i..s_{k-1})])
        nn.init.normal_(self.fc.weight, std=0.02)
        nn.init.zeros_(self.fc.bias)

    def scalars(self, s: torch.Tensor):
        """s [..., d] -> a = w1.s + b, u = w2.s, each [...]."""
        d = self.d_model
        w = self.fc.weight[0]
        return s @ w[:d] + self.fc.bias[0], s @ w[d:]

    def biased_forward(self, x, mask, bias):
        q = self.split(self.fc_q(x))
        k, v = self.project_kv(x, x)
        return self.fc_o(self.merge(self.attend(q, k, v, mask, bias=bias)))


@DECODER_SELF_ATTENTION.register("clustering")
class ClusteringSelfAttention(_ClusteringBase):
    """1-D clustering over the words generated so far (causal)."""

    # per layer [R, T]: a and u of every position, one new slot per step
    cache_state = (cache_tensor("clu_a", 0, slot_axis=1), cache_tensor("clu_u", 0, slot_axis=1))

    def init_extra_cache(self, batch, length, device):
        return torch.zeros(batch, length, device=device), torch.zeros(batch, length, device=device)

    def decode_prefix(self, x, mask, side, carry):
        a, u = self.scalars(self.norm_s(x))
        log_c, carry = accumulate(torch.exp(log_cluster(a, u)), carry)
        return self.biased_forward(x, mask, log_c.unsqueeze(1)), carry

    def decode_step(self, x, cache, step, side, carry):
        cache_k, cache_v, cache_a, cache_u = cache
        # [R, 1]: the new position's slots of clu_a, clu_u
        a, u = (t.unsqueeze(-1) for t in self.scalars(self.norm_s(x)))
        slots = torch.arange(cache_a.shape[1], device=x.device)
        hit = (slots == step).view(1, -1)
        all_a = torch.where(hit, a.to(cache_a.dtype), cache_a)
        all_u = torch.where(hit, u.to(cache_u.dtype), cache_u)
        # Row `step` of log C: sum over k <= step of log p_ik, for every key i (i > step is
        # masked below; slots after `step` hold stale values and are excluded by k <= step).
        links = log_links(all_a, all_u)
        row = torch.where((slots <= step).view(1, 1, -1), links, torch.zeros_like(links)).sum(-1)
        log_c, carry = accumulate(torch.exp(row).unsqueeze(1), carry)  # [B, 1, T]
        bias = log_c.unsqueeze(1)  # [B, 1, 1, T]; the position's own entry goes with its key
        own = torch.where(hit.view(1, 1, 1, -1), bias, torch.zeros_like(bias)).sum(-1, keepdim=True)

        k, v = self.project_kv(x, x)
        q = self.split(self.fc_q(x))
        out = self.attend(q, cache_k, cache_v, slots_before(cache_v, step), bias=bias, current=(k, v, own))
        return self.fc_o(self.merge(out, rows=True)), (k, v, a, u), carry


@ENCODER_ATTENTION.register("clustering")
class GridClusteringAttention(_ClusteringBase):
    """2-D clustering over the encoder's h x w feature grid."""

    def __init__(self, d_model: int, n_heads: int, cfg):
        super().__init__(d_model, n_heads, cfg)
        n, cc = cfg.n_regions, cfg.clustering
        w = cc.grid_w or math.isqrt(n)
        if w <= 0 or n % w:
            raise EdgecapError(
                f"config {cfg.name!r}: clustering.grid_w={cc.grid_w} does not divide n_regions={n} "
                "(set clustering.grid_w to the feature grid's width)"
            )
        h = n // w
        if not cc.grid_w and h != w:
            raise EdgecapError(
                f"config {cfg.name!r}: n_regions={n} is not a square grid; set clustering.grid_w"
            )
        rate = cc.downsample
        if rate not in (1, 2) or h % rate or w % rate:
            raise EdgecapError(
                f"config {cfg.name!r}: clustering.downsample={rate} must be 1 or 2 and divide "
                f"the {h}x{w} grid"
            )
        self.h, self.w, self.rate = h, w, rate
        rows, cols = torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)
        # fine cell (r, c) -> its coarse cell, to repeat C back to the full grid
        self.register_buffer("coarse", (rows // rate) * (w // rate) + cols // rate, persistent=False)

    def grid_cluster(self, s: torch.Tensor) -> torch.Tensor:
        """s [B, N, d] -> C [B, N, N]."""
        b, _, d = s.shape
        h, w, rate = self.h, self.w, self.rate
        grid = s.reshape(b, h // rate, rate, w // rate, rate, d).mean(dim=(2, 4))  # [B, h', w', d]
        h, w = h // rate, w // rate
        a, u = self.scalars(grid)
        horiz = torch.exp(log_cluster(a.reshape(b * h, w), u.reshape(b * h, w))).view(b, h, w, w)
        at, ut = a.transpose(1, 2), u.transpose(1, 2)  # [B, w', h']
        vert = torch.exp(log_cluster(at.reshape(b * w, h), ut.reshape(b * w, h))).view(b, w, h, h)
        # [B, r1, c1, r2, c2]: row r1 then column c2, and column c1 then row r2
        first = horiz.unsqueeze(3) * vert.permute(0, 2, 3, 1).unsqueeze(2)
        second = vert.permute(0, 2, 1, 3).unsqueeze(-1) * horiz.permute(0, 2, 1, 3).unsqueeze(1)
        c = (0.5 * (first + second)).reshape(b, h * w, h * w)
        if self.rate == 1:
            return c
        return c.index_select(1, self.coarse).index_select(2, self.coarse)

    def encode_layer(self, x, mask, carry):
        valid = mask.reshape(mask.shape[0], -1).to(x.dtype)  # [B, 1, 1, N] -> [B, N]
        s = self.norm_s(x) * valid.unsqueeze(-1)  # padded cells contribute zeros
        log_c, carry = accumulate(self.grid_cluster(s), carry)
        return self.biased_forward(x, mask, log_c.unsqueeze(1)), carry
