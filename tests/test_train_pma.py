"""PMA-Net training: prototypes refresh during the run, change the output, and resume exactly."""

import json

import pytest
import torch
from _train_tiny import TINY_PMA, tiny_config

from edgecap.models.attention.prototype import PrototypeAttention
from edgecap.models.checkpoint import load_checkpoint
from edgecap.train.loop import Trainer

PROTOTYPES = {"bank_iterations": 4, "stride": 4, "topk": 2, "kmeans_iterations": 5}


def records(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_prototypes_refresh_and_change_the_output(world, tmp_path):
    cfg = tiny_config(world, model=TINY_PMA, prototypes=PROTOTYPES, schedule={"epochs": 2, "warmup": 5})
    run = tmp_path / "run"
    Trainer(cfg, out=run, progress=False).run()
    refreshes = [r for r in records(run) if r["kind"] == "prototypes"]
    assert [r["step"] for r in refreshes] == [4, 8, 12, 16]
    assert all(r["refresh_seconds"] >= r["kmeans_seconds"] >= 0 and r["prototypes"] == 8 for r in refreshes)

    ck = load_checkpoint(run / "last.pt")
    layers = [m for m in ck.model.modules() if isinstance(m, PrototypeAttention)]
    assert len(layers) == 2 and all(bool(m.proto_valid.all()) for m in layers)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 32, 32, generator=g)
    tokens = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 4, 5]])
    with torch.no_grad():
        feats, mask = ck.model.visual(images)
        with_memory = ck.model(feats, mask, tokens)
        for m in layers:
            m.proto_valid.zero_()
        without = ck.model(feats, mask, tokens)
    assert (with_memory - without).abs().max() > 1e-3


@pytest.mark.slow
def test_pma_run_resumes_exactly_with_its_banks(world, tmp_path):
    cfg = tiny_config(world, model=TINY_PMA, prototypes=PROTOTYPES, schedule={"epochs": 2, "warmup": 5})
    Trainer(cfg, out=tmp_path / "a", progress=False).run()
    Trainer(cfg, out=tmp_path / "b", max_steps=6, progress=False).run()  # banks half full, one refresh done
    Trainer(cfg, out=tmp_path / "b", resume=True, progress=False).run()

    def losses(run):
        return [(r["step"], r["loss"]) for r in records(run) if r["kind"] == "train"]

    assert losses(tmp_path / "b") == losses(tmp_path / "a")
    a = torch.load(tmp_path / "a" / "last.pt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "b" / "last.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
