"""PMA-Net prototypical memory in decoder self-attention (Barraco et al., ICCV 2023).

Each layer holds m prototype keys and values as buffers (K-Means centroids of past keys and
their value summaries, computed by `edgecap.train.prototypes`). They are concatenated to the
input keys/values and always visible once set; two learnable segment embeddings are added to
prototype keys and input keys so attention can tell memory from the sentence. With no
prototypes set, the layer is plain self-attention plus the input segment embedding. At export
the buffers become constant initializers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from edgecap.models.attention.base import MultiHeadAttention
from edgecap.models.registry import CONFIG_SECTIONS, DECODER_SELF_ATTENTION

MEMORY_SEGMENT, INPUT_SEGMENT = 0, 1


@CONFIG_SECTIONS.register("prototype")
@dataclass
class PrototypeConfig:
    """PMA-Net prototype memory in decoder self-attention (buffers; filled during training)."""

    count: int = 1024  # m prototype key/value vectors per layer
    segment_embeddings: bool = True


@DECODER_SELF_ATTENTION.register("prototype")
class PrototypeAttention(MultiHeadAttention):
    training_hook = "prototypes"  # fills the buffers during training (edgecap/train/hooks/prototypes.py)

    @classmethod
    def describe(cls, cfg) -> str:
        return f"{cfg.prototype.count} prototypes"

    def __init__(self, d_model: int, n_heads: int, cfg):
        super().__init__(d_model, n_heads, cfg)
        count = cfg.prototype.count
        self.register_buffer("proto_k", torch.zeros(count, d_model))
        self.register_buffer("proto_v", torch.zeros(count, d_model))
        self.register_buffer("proto_valid", torch.zeros(count, dtype=torch.bool))
        self.segment = (
            nn.Parameter(torch.randn(2, d_model) * 0.02) if cfg.prototype.segment_embeddings else None
        )
        # Called in training with projected input keys and values [B, L, d] (detached), so
        # the trainer can fill its key/value banks without a second forward pass.
        self.observer: Callable[[torch.Tensor, torch.Tensor], None] | None = None

    @torch.no_grad()
    def set_prototypes(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Install prototypes [m', d] with m' <= m; the rest stay masked out."""
        count = keys.shape[0]
        if count > self.proto_k.shape[0] or keys.shape != values.shape:
            raise ValueError(
                f"prototypes {tuple(keys.shape)}/{tuple(values.shape)} do not fit buffers {tuple(self.proto_k.shape)}"
            )
        self.proto_k.zero_()
        self.proto_v.zero_()
        self.proto_valid.zero_()
        self.proto_k[:count] = keys.to(self.proto_k)
        self.proto_v[:count] = values.to(self.proto_v)
        self.proto_valid[:count] = True

    def _segment(self, which: int) -> torch.Tensor | None:
        return None if self.segment is None else self.segment[which]

    def adjust_keys(self, k):
        seg = self._segment(INPUT_SEGMENT)
        if seg is None:
            return k
        return k + seg.view(1, self.n_heads, 1, self.d_head)

    def extra_kv(self):
        if self.proto_k.shape[0] == 0:
            return None
        keys = self.proto_k
        seg = self._segment(MEMORY_SEGMENT)
        if seg is not None:
            keys = keys + seg
        # [m, d] -> keys [1, H, dh, m], values [1, H, m, dh], broadcast over the batch
        mk = self.split(keys.unsqueeze(0)).transpose(-1, -2)
        return mk, self.split(self.proto_v.unsqueeze(0)), self.proto_valid

    def forward(self, queries, keys, values, mask):
        if self.training and self.observer is not None:
            self.observer(self.fc_k(keys).detach(), self.fc_v(values).detach())
        return super().forward(queries, keys, values, mask)
