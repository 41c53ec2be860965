"""Captioning a Karpathy split in PyTorch, from the images or the HDF5 features a model reads.

Shared by validation and `train --test` (the live model) and by `edgecap caption CHECKPOINT
--features FILE --split test` (a saved one): the same batches, the same decoding, so a test
score printed at the end of training is the one `edgecap caption` + `edgecap eval coco` give.
Results are COCO results records [{"image_id", "caption"}], the image id being the Karpathy
cocoid (an int when it is all digits, as COCO's own results files have it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from edgecap.contract.beam import DecodeOptions
from edgecap.data.datasets import FeatureSource, ImageSource
from edgecap.data.karpathy import KarpathyImage
from edgecap.metrics.ciderd import CiderD
from edgecap.models.decoding import generate


def feature_source(features: str | Path, model_cfg, meta: dict | None = None):
    """The features file as the model reads it: padded to its n_regions, and for a model
    imported from the official M2 code every row visible (that code never masked its padding)."""
    source = FeatureSource(features, model_cfg.n_regions, model_cfg.d_in)
    if (meta or {}).get("encoder_mask") == "all-rows":
        source.store.mask_padding = False
    return source


def image_source(images: str | Path, model_cfg):
    return ImageSource(images, model_cfg.visual)


@torch.no_grad()
def caption_images(model, vocab, source, items: list[KarpathyImage], options: DecodeOptions, batch: int,
                   device: torch.device | str = "cpu", extra_inputs=None,
                   on_batch: Callable[[list[KarpathyImage], list[str]], None] | None = None) -> list[str]:
    """The model's caption of every item, decoded `batch` images at a time; `extra_inputs`
    (training hooks) feed the encoder's extra inputs (RA-T's retrieved captions)."""
    was_training = model.training
    model.eval()
    captions: list[str] = []
    try:
        for start in range(0, len(items), batch):
            chunk = items[start:start + batch]
            loaded = [source.load(item, None) for item in chunk]
            inputs = torch.stack([x for x, _ in loaded]).to(device)
            mask = None if loaded[0][1] is None else torch.stack([m for _, m in loaded]).to(device)
            feats, fmask = model.visual(inputs, mask)
            extra = extra_inputs.for_features(feats, fmask) if extra_inputs is not None else ()
            hyps = generate(model, feats, fmask, options, extra=extra)
            got = [" ".join(vocab.decode(row)) for row in hyps.best()]
            captions += got
            if on_batch is not None:
                on_batch(chunk, got)
    finally:
        model.train(was_training)
    return captions


def results(items: list[KarpathyImage], captions: list[str]) -> list[dict]:
    """COCO results records, in the split's order."""
    return [{"image_id": int(item.image_id) if item.image_id.isdigit() else item.image_id, "caption": caption}
            for item, caption in zip(items, captions, strict=True)]


def ciderd(items: list[KarpathyImage], captions: list[str]) -> float:
    """CIDEr-D of the captions against the items' references, document frequencies from them
    (as the COCO evaluation computes it over a split)."""
    refs = [item.caption_strings() for item in items]
    score, _ = CiderD(refs).score(captions, refs)
    return float(score)
