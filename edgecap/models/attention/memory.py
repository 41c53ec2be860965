"""Memory-augmented self-attention (M2 Transformer, SMArT): M learnable key and value slots.

Keys and values are separate parameters, not projections of the input, and are always visible.
Scaling follows the M2 reference: slots are initialised N(0, 1/d_head) for keys and N(0, 1/M)
for values and multiplied by sqrt(d_head) and sqrt(M) when used, so official M2 weights load
unchanged (see docs/models.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from edgecap.models.attention.base import MultiHeadAttention
from edgecap.models.registry import CONFIG_SECTIONS, ENCODER_ATTENTION


@CONFIG_SECTIONS.register("memory")
@dataclass
class MemoryConfig:
    """Learnable memory slots in encoder self-attention (SMArT, M2)."""

    slots: int = 40


@ENCODER_ATTENTION.register("memory")
class MemoryAttention(MultiHeadAttention):
    @classmethod
    def describe(cls, cfg) -> str:
        return f"{cfg.memory.slots} slots"

    def __init__(self, d_model: int, n_heads: int, cfg):
        super().__init__(d_model, n_heads, cfg)
        self.slots = cfg.memory.slots
        self.m_k = nn.Parameter(torch.empty(1, self.slots, d_model))
        self.m_v = nn.Parameter(torch.empty(1, self.slots, d_model))
        nn.init.normal_(self.m_k, 0, 1 / self.d_head)
        nn.init.normal_(self.m_v, 0, 1 / max(self.slots, 1))

    def extra_kv(self):
        if self.slots == 0:
            return None
        # [1, M, d] -> keys [1, H, dh, M], values [1, H, M, dh], broadcast over the batch
        mk = self.split(math.sqrt(self.d_head) * self.m_k).transpose(-1, -2)
        mv = self.split(math.sqrt(self.slots) * self.m_v)
        return mk, mv, None
