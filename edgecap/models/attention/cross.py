"""Decoder cross-attention to the last encoder layer (Transformer, SMArT, PMA-Net).

Cross modules own their residual and layer norm because the meshed variant normalises each
encoder level before gating. Keys/values are projected once per image (`project`) and passed
to every decoding step, as the exported encoder graph does; a step's R = B * beam query rows
read them at batch B (the beams of an image share its keys).
"""

from __future__ import annotations

import torch
from torch import nn

from edgecap.models.attention.base import MultiHeadAttention
from edgecap.models.registry import CROSS_ATTENTION


@CROSS_ATTENTION.register("single")
class CrossAttention(nn.Module):
    @classmethod
    def describe(cls, cfg) -> str:
        """What this variant adds, for `edgecap models` ("" for nothing)."""
        return ""

    def __init__(self, cfg):
        super().__init__()
        self.attention = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm = nn.LayerNorm(cfg.d_model)

    @staticmethod
    def levels_used(cfg) -> int:
        return 1

    def project(self, levels: torch.Tensor):
        """levels [n_enc, B, N, d] -> keys [1, B, H, dh, N], values [1, B, H, N, dh] from the
        last level."""
        k, v = self.attention.project_kv(levels[-1], levels[-1])
        return k.unsqueeze(0), v.unsqueeze(0)

    def attend_levels(self, x, k, v, enc_mask):
        """x [R, L, d] (or a decoding step's rows [R, d]); k [n, B, H, dh, N], v [n, B, H, N, dh]
        (n encoder levels of B images, whose R / B beams share them); enc_mask [B, N] bool ->
        LN(x + att) for every level [n, R, L, d] ([n, R, d]).

        One call for all levels: the query and output projections run once, each image's keys
        are read once whatever the beam size, and no level is sliced out of its input."""
        att = self.attention
        out = att.attend(att.split(att.fc_q(x)), k, v, enc_mask[:, None, None, :])
        out = att.fc_o(att.merge(out, rows=x.dim() == 2)).view(-1, *x.shape)
        return self.norm(x + self.dropout(out))

    def forward(self, x, k, v, enc_mask):
        return self.attend_levels(x, k, v, enc_mask)[0]
