"""Captioning preprocessed images with a checkpoint in PyTorch, one batch at a time.

Shared by `edgecap caption` and the demo packaging (`edgecap.train.demo`). A checkpoint whose
encoder takes extra inputs gets them from its training hooks (edgecap.train.hook): an
RA-Transformer searches the retrieval index its config names, as validation and the bundle do.
"""

from __future__ import annotations

import torch

from edgecap.contract.beam import DecodeOptions
from edgecap.models.checkpoint import Checkpoint
from edgecap.models.decoding import generate
from edgecap.train.hook import checkpoint_hooks


def extra_inputs_for(ck: Checkpoint):
    """What feeds the checkpoint's extra encoder inputs (`for_features`); None when it has none."""
    return checkpoint_hooks(ck)


@torch.no_grad()
def caption_batch(ck: Checkpoint, images: torch.Tensor, options: DecodeOptions, extra_inputs=None) -> list[str]:
    """Captions of a batch of preprocessed images [B, 3, H, W]."""
    model = ck.model.eval()
    feats, mask = model.visual(images)
    extra = extra_inputs.for_features(feats, mask) if extra_inputs is not None else ()
    hyps = generate(model, feats, mask, options, extra=extra)
    return [" ".join(ck.vocab.decode(row)) for row in hyps.best()]
