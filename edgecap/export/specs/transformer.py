"""Transformer-core captioners (SMArT, PMA-Net, M2, Transformer).

    cache   self_k.<layer> [R, H, d_head, T], self_v.<layer> [R, H, T, d_head]   T = max_len;
            the step returns the slot of position `step` (self_k.<layer>.new [R, H, d_head, 1], ...)
    cross   cross_k.<layer> [levels, B, H, d_head, N], cross_v.<layer> [levels, B, H, N, d_head],
            enc_mask [B, N] bool (keys transposed: the layout the score matmul reads)

Memory slots (SMArT, M2) and PMA prototypes with their segment embeddings are parameters or
buffers of the attention modules, so the exporter writes them as constant initializers.
"""

from __future__ import annotations

from edgecap.export.specs.base import EXPORT_SPECS, ExportSpec


@EXPORT_SPECS.register("transformer")
class TransformerSpec(ExportSpec):
    # log-softmax over a vocabulary after several layers of fp32 attention: a few ulps of 1
    encoder_atol = 1e-4
    step_atol = 2e-4
