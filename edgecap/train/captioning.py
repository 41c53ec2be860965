"""Captioning preprocessed images with a checkpoint in PyTorch, one batch at a time.

Shared by `edgecap caption` and the demo packaging (`edgecap.train.demo`). An RA-Transformer
checkpoint searches the retrieval index its config names, as validation and the bundle do.
"""

from __future__ import annotations

from pathlib import Path

import torch

from edgecap.contract.beam import DecodeOptions
from edgecap.errors import EdgecapError
from edgecap.models.checkpoint import Checkpoint
from edgecap.models.decoding import generate


def retrieval_for(ck: Checkpoint):
    """The caption index an RA-Transformer checkpoint decodes with; None for other families."""
    from edgecap.train.retrieval import TrainingRetrieval, needs_retrieval

    if not needs_retrieval(ck.model):
        return None
    if not ck.model.cfg.retrieval.index:
        raise EdgecapError("this RA-Transformer checkpoint names no retrieval index (retrieval.index)")
    return TrainingRetrieval(Path(ck.model.cfg.retrieval.index), ck.vocab, ck.model.cfg)


@torch.no_grad()
def caption_batch(ck: Checkpoint, images: torch.Tensor, options: DecodeOptions, retrieval=None) -> list[str]:
    """Captions of a batch of preprocessed images [B, 3, H, W]."""
    model = ck.model.eval()
    feats, mask = model.visual(images)
    extra = retrieval.for_features(feats, mask) if retrieval is not None else ()
    hyps = generate(model, feats, mask, options, extra=extra)
    return [" ".join(ck.vocab.decode(row)) for row in hyps.best()]
