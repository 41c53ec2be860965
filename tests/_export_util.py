"""Shared helpers for the export tests: tiny checkpoints and cached bundles."""

from __future__ import annotations

from pathlib import Path

import torch

from edgecap.contract.vocab import Vocab
from edgecap.export.bundle import export_bundle
from edgecap.export.formats import resolve_settings
from edgecap.models import build
from edgecap.models.checkpoint import save_checkpoint
from tests.conftest import tiny_overrides

BATCH, BEAM, SAMPLES = 2, 2, 2

# a small CNN front end: 16x16 images, two stride-2 blocks -> 4x4 = 16 tokens of 24 channels
CNN = {"visual": {"kind": "cnn", "image_size": 16, "channels": [8, 24]}, "n_regions": 16}


# families whose structure needs more than conftest's tiny sizes (grid width, retrieval)
FAMILY_EXTRAS = {
    "acf": {"n_regions": 16, "enc_layers": 2, "dec_layers": 2, "clustering": {"grid_w": 4, "downsample": 2}},
    "rat": {"retrieval": {"k": 3, "length": 5}},
}


def tiny_vocab(size: int) -> Vocab:
    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(size - 4)]
    return Vocab(words)


def tiny_model(name: str, **extra):
    torch.manual_seed(0)
    model = build(name, **{**tiny_overrides(name), **FAMILY_EXTRAS.get(name, {}), **extra}).eval()
    if model.cfg.decoder_self_attention == "prototype":
        g = torch.Generator().manual_seed(3)
        for layer in model.layers:  # installed prototypes: exported as constant initialisers
            layer.self_attn.set_prototypes(torch.randn(4, model.cfg.d_model, generator=g),
                                           torch.randn(4, model.cfg.d_model, generator=g))
    return model


def save_tiny(path: Path, name: str, meta: dict | None = None, **extra) -> Path:
    model = tiny_model(name, **extra)
    return save_checkpoint(path, model, tiny_vocab(model.cfg.vocab_size), meta or {})


def export(checkpoint: Path, out: Path, **options):
    torch.set_num_threads(1)
    settings = resolve_settings({"engine": "onnx", "batch": BATCH, "beam": BEAM, "samples": SAMPLES,
                                 "out": str(out), **options})
    return export_bundle(checkpoint, settings, progress=False)


def cnn_bundle(root: Path) -> Path:
    """root/bundle: a tiny SMArT with the small CNN front end (camera frames in), batch 2, beam 2."""
    export(save_tiny(root / "tiny.pt", "smart", **CNN), root / "bundle")
    return root / "bundle"
