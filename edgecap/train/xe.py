"""Cross-entropy training with teacher forcing, and the module DDP wraps.

`CaptionTrainModule.forward` runs the visual front end and encoder once per image, repeats
the cross state to that image's caption rows (`owner`), and decodes the whole prefix with
teacher forcing. XE and SCST both go through it, so under DistributedDataParallel every
gradient passes a DDP forward and is all-reduced. Extra encoder inputs (RA-Transformer's
retrieved captions, per image) follow the owner rows like the cross state.

A frozen visual front end (`frozen_visual`: RA-T, whose retrieval index was built with it)
runs in eval mode and without autograd on every call, whatever mode the model is in, so its
BatchNorm statistics never move away from the ones the index was built with.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from edgecap.models.captioner import CaptionModel


def select_cross(model: CaptionModel, cross, owner: torch.Tensor):
    """Row r of the result is image owner[r]'s cross state (batch axes per model)."""
    return tuple(t.index_select(axis, owner) for t, axis in zip(cross, model.cross_batch_axes, strict=True))


def run_visual(model: CaptionModel, inputs, mask, frozen: bool = False):
    """The visual front end; a frozen one always in eval mode and without autograd."""
    if not frozen:
        return model.visual(inputs, mask)
    if model.visual.training:
        model.visual.eval()
    with torch.no_grad():
        return model.visual(inputs, mask)


class CaptionTrainModule(nn.Module):
    def __init__(self, model: CaptionModel, frozen_visual: bool = False):
        super().__init__()
        self.model = model
        self.frozen_visual = frozen_visual

    def forward(self, inputs, mask, tokens, owner, *extra):
        """inputs/mask/extra per image, tokens [R, L] decoder inputs (BOS first), owner [R] -> log-probs [R, L, V]."""
        feats, fmask = run_visual(self.model, inputs, mask, self.frozen_visual)
        cross = select_cross(self.model, self.model.encode(feats, fmask, *extra), owner)
        return self.model.decode_prefix(cross, tokens)


def xe_loss(logprobs: torch.Tensor, targets: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Mean negative log-likelihood over the real (non-pad) target tokens."""
    return F.nll_loss(logprobs.reshape(-1, logprobs.shape[-1]), targets.reshape(-1), ignore_index=pad_id)


def xe_step(module: nn.Module, batch, pad_id: int, hooks=None) -> torch.Tensor:
    """Teacher-forced loss of a Batch: inputs tokens[:, :-1] predict tokens[:, 1:]. `hooks`
    (edgecap.train.hook) hear which input positions the forward pass trains."""
    inputs, targets = batch.tokens[:, :-1], batch.tokens[:, 1:]
    if hooks is not None:
        # Input positions that predict a real token: BOS and the words, not a trailing EOS.
        hooks.before_forward(targets != pad_id)
    logprobs = module(batch.inputs, batch.mask, inputs, batch.owner, *batch.extra)
    return xe_loss(logprobs, targets, pad_id)
