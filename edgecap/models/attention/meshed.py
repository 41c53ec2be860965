"""Meshed cross-attention (M2 Transformer, Cornia et al. CVPR 2020).

The decoder attends to every encoder layer's output with one shared attention block; each
level's result C_i is weighted by a gate alpha_i = sigmoid(W_i [Y; C_i] + b_i) and the sum is
divided by sqrt(N). N is the encoder depth from the config, not a hard-wired 3.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from edgecap.models.attention.cross import CrossAttention
from edgecap.models.registry import CROSS_ATTENTION


@CROSS_ATTENTION.register("meshed")
class MeshedCrossAttention(CrossAttention):
    @classmethod
    def describe(cls, cfg) -> str:
        return "meshed"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.gates = nn.ModuleList(nn.Linear(2 * cfg.d_model, cfg.d_model) for _ in range(cfg.enc_layers))
        for gate in self.gates:
            nn.init.xavier_uniform_(gate.weight)
            nn.init.zeros_(gate.bias)

    @staticmethod
    def levels_used(cfg) -> int:
        return cfg.enc_layers

    def project(self, levels):
        """levels [n_enc, B, N, d] -> keys [n_enc, B, H, dh, N], values [n_enc, B, H, N, dh]."""
        n, b, length, d = levels.shape
        k, v = self.attention.project_kv(levels.reshape(n * b, length, d), levels.reshape(n * b, length, d))
        return k.view(n, b, *k.shape[1:]), v.view(n, b, *v.shape[1:])

    def forward(self, x, k, v, enc_mask):
        levels = self.attend_levels(x, k, v, enc_mask)  # [N, R, (L,) d]: every C_i in one call
        total = 0
        for level, gate in enumerate(self.gates):
            c = levels[level]
            alpha = torch.sigmoid(gate(torch.cat([x, c], dim=-1)))
            total = total + c * alpha
        return total / math.sqrt(len(self.gates))
