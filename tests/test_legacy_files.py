"""Files the code before issue 38's refactor wrote (tests/data/legacy/, made by its make.py at
commit c3d6027, and the shipped demo asset) still read, resume and open with today's code."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from edgecap.models.checkpoint import load_checkpoint, read_payload

LEGACY = Path(__file__).parent / "data" / "legacy"
DEMO = Path(__file__).resolve().parents[1] / "edgecap" / "assets" / "demo-smart.pt"


@pytest.mark.parametrize("path", [DEMO, LEGACY / "rat.pt", LEGACY / "pma-run" / "last.pt"],
                         ids=["demo-smart", "rat", "pma"])
def test_an_older_checkpoint_loads_and_its_config_reads_back_as_stored(path):
    stored = read_payload(path)
    ckpt = load_checkpoint(path)
    # every field and section where it was; the demo asset predates visual.crop, which reads as "none"
    assert _within(stored["config"], ckpt.config.to_dict())
    assert ckpt.config.to_dict().keys() == stored["config"].keys()
    state = ckpt.model.state_dict()
    assert all(torch.equal(state[k], v.float() if v.is_floating_point() else v) for k, v in stored["state_dict"].items())


def _within(old, new) -> bool:
    """Every key of `old` has its value in `new` (tables compared key by key, lists as tuples)."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and _within(v, new[k]) for k, v in old.items())
    return (tuple(old) == tuple(new)) if isinstance(old, (list, tuple)) else old == new


def test_an_older_pma_run_resumes_with_its_prototype_banks(tmp_path, run_cli):
    from edgecap.train.loop import Trainer
    from edgecap.train.overrides import load_config

    run = tmp_path / "pma-run"
    shutil.copytree(LEGACY / "pma-run", run)
    saved = torch.load(run / "last.state.pt", map_location="cpu", weights_only=True)
    torch.set_num_threads(1)
    trainer = Trainer(load_config(run / "config.toml"), out=run, resume=True, progress=False)
    trainer.setup()  # the synthetic world is generated into the run directory again
    (hook,) = trainer.hooks
    banks = hook.state_dict()["banks"]
    assert [[s for s, _, _ in bank] for bank in banks] == [[s for s, _, _ in bank] for bank in saved["memory"]["banks"]]
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for bank, bank0 in zip(banks, saved["memory"]["banks"], strict=True)
               for (_, k, v), (_, k0, v0) in zip(bank, bank0, strict=True))
    assert trainer.state.step == 5 and hook.memory.refreshes == 1
    trainer.hooks.close()

    code, _, err = run_cli("train", "--resume", run, "--quiet")
    assert code == 0, err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "prototypes"] == [4, 8, 12, 16][: sum(r["kind"] == "prototypes" for r in records)]
    assert sum(r["kind"] == "prototypes" for r in records) >= 2  # refreshes went on after the resume
    assert json.loads((run / "summary.json").read_text())["done"] is True
    after = torch.load(run / "last.state.pt", map_location="cpu", weights_only=True)
    assert after["memory"]["refreshes"] > 1 and after["state"]["step"] > 5
    load_checkpoint(run / "best.pt")


def test_an_older_config_toml_reads_with_the_hooks_sections():
    from edgecap.train.overrides import load_config

    cfg = load_config(LEGACY / "pma-run" / "config.toml")
    assert (cfg.prototypes.stride, cfg.prototypes.max_bank, cfg.retrieval.kind) == (4, 64, "auto")


@pytest.mark.parametrize("name", ["bundle-smart", "bundle-rat"])
def test_an_older_bundle_opens_and_captions(name):
    from edgecap.contract.beam import DecodeOptions
    from edgecap.contract.manifest import MANIFEST_NAME, Manifest, load_manifest
    from edgecap.runtime.session import Bundle

    root = LEGACY / name
    written = json.loads((root / MANIFEST_NAME).read_text())
    manifest = load_manifest(root)  # every listed file checked against its sha256
    assert manifest.to_dict() == written  # read and written back field for field
    assert Manifest.from_dict(manifest.to_dict()).to_dict() == written
    bundle = Bundle.load(root)
    g = np.random.default_rng(0)
    features = next(t for t in manifest.graph("encoder").inputs if t.name == "features")
    feats = g.standard_normal(features.shape).astype(np.float32)
    mask = np.ones(feats.shape[:2], dtype=bool)
    hyp = bundle.decode(bundle.encode(feats, mask), DecodeOptions(beam_size=2, max_len=manifest.max_len))
    assert hyp.tokens.shape[0] == feats.shape[0] and int(hyp.tokens.max()) < len(manifest.vocab.itos)


def test_an_older_front_end_manifest_reads_back_as_written():
    from edgecap.contract.manifest import Manifest

    written = json.loads((LEGACY / "manifest-frontend.json").read_text())
    manifest = Manifest.from_dict(written)
    assert manifest.to_dict() == written
    assert manifest.input == "images" and manifest.preprocessing.crop == "center"
