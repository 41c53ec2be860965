"""The official M² code's beam search (benchmarks/_official_m2.py), the reference of issue 12's
"x the official code" ratios: it must caption exactly as edgecap's decoding does on the same
weights, or the ratio compares different work."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edgecap.contract.beam import DecodeOptions
from edgecap.models.decoding import generate
from tests._export_util import tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _official_m2 import OfficialM2Decoding, supports  # noqa: E402


def cut(tokens: np.ndarray, eos: int) -> list[list[int]]:
    """Each caption up to and including its first EOS (the official code continues a finished
    beam with token 0, edgecap with padding)."""
    out = []
    for row in tokens.tolist():
        out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


def never_padding(model):
    """A trained captioner does not predict padding, a random tiny one does (and the official
    decoder masks a padding token where edgecap's does not): the last layer's output carries a
    constant 10 in channel 0, which every word's logit gets with weight 1 (the same shift for
    all, so their order is the model's) and padding's with weight -1."""
    with torch.no_grad():
        norm = model.layers[-1].ff.norm
        norm.weight[0], norm.bias[0] = 0.0, 10.0
        model.fc.weight[:, 0] = 1.0
        model.fc.weight[model.cfg.pad_id, 0] = -1.0
    return model


@pytest.mark.parametrize("beam", [1, 3, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_official_decoding_captions_as_edgecap_does(beam, seed):
    model = never_padding(tiny_model("m2", vocab_size=60, max_len=10))
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(4, cfg.n_regions, cfg.d_in, generator=g)
    mask = torch.ones(4, cfg.n_regions, dtype=torch.bool)
    mask[1, -2:] = False  # one image with padded regions: the encoder mask must reach every step
    official = OfficialM2Decoding(model, beam, cfg.max_len)
    official.encode(feats, mask)
    theirs = official.decode().numpy()
    ours = generate(model, feats, mask, DecodeOptions(beam_size=beam, max_len=cfg.max_len))
    assert theirs.shape == (4, cfg.max_len)
    assert cut(theirs, cfg.eos_id) == cut(ours.best(), cfg.eos_id)


def test_official_decoding_sees_the_encoder_mask():
    model = never_padding(tiny_model("m2", vocab_size=60, max_len=10))
    cfg = model.cfg
    feats = torch.randn(2, cfg.n_regions, cfg.d_in, generator=torch.Generator().manual_seed(5))
    full = torch.ones(2, cfg.n_regions, dtype=torch.bool)
    half = full.clone()
    half[:, cfg.n_regions // 2:] = False
    captions = []
    for mask in (full, half):
        official = OfficialM2Decoding(model, 3, cfg.max_len)
        official.encode(feats, mask)
        captions.append(official.decode().numpy())
    assert not np.array_equal(*captions)


@pytest.mark.parametrize("name", ["smart", "pma", "updown"])
def test_other_families_are_refused_in_one_line(name):
    model = tiny_model(name)
    reason = supports(model.cfg)
    assert reason and "\n" not in reason and name in reason
    with pytest.raises(ValueError, match="meshed cross-attention"):
        OfficialM2Decoding(model, 3, model.cfg.max_len)


def test_check_against_the_official_code_refuses_a_folder_that_is_not_its_checkout(tmp_path):
    # benchmarks/official_m2_check.py reads a user's checkout of the official code (none is in
    # this repository); a wrong folder is one line and exit 2, and nothing is written
    import subprocess

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "benchmarks" / "official_m2_check.py"),
                          "--code", str(tmp_path), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip() == (f"error: --code {tmp_path}: no utils/__init__.py; expected a checkout of "
                                  "aimagelab/meshed-memory-transformer")
    assert not out.exists()
