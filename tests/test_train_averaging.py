"""[run].average_last = N: the final phase's last N epoch ends are kept and averaged into
averaged.pt, validated; the same across a --resume."""

import json

import torch
from _train_tiny import tiny_config

from edgecap.models.checkpoint import load_checkpoint
from edgecap.train.loop import Trainer


def _cfg(world):
    return tiny_config(world, schedule={"epochs": 3, "warmup": 5}, run={"average_last": 2})


def test_averaged_pt_is_the_mean_of_the_last_epochs_and_is_validated(world, tmp_path):
    run = tmp_path / "run"
    summary = Trainer(_cfg(world), out=run, progress=False).run()
    kept = sorted(p.name for p in (run / "epochs").iterdir())
    assert kept == ["xe-0002.pt", "xe-0003.pt"]  # epoch 1 dropped: the newest 2 only
    a = torch.load(run / "epochs" / "xe-0002.pt", weights_only=True)["state_dict"]
    b = torch.load(run / "epochs" / "xe-0003.pt", weights_only=True)["state_dict"]
    averaged = torch.load(run / "averaged.pt", weights_only=True)["state_dict"]
    for name, tensor in averaged.items():
        if tensor.is_floating_point():
            want = ((a[name].double() + b[name].double()) / 2).float()
            assert torch.allclose(tensor, want, atol=1e-7, rtol=0), name
    # the epoch-3 weights are the run's last ones, so the files are what they say
    last = torch.load(run / "last.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(b[k], last[k]) for k in last)
    line = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"averaged"' in x]
    assert len(line) == 1 and line[0]["epochs"] == ["xe-0002", "xe-0003"]
    assert summary["averaged_val_cider_d"] == line[0]["cider_d"]
    ck = load_checkpoint(run / "averaged.pt")  # a checkpoint like any other: export, caption
    assert ck.meta["val_cider_d"] == line[0]["cider_d"]
    from edgecap.train.command import report

    said = next(x for x in report(summary) if x.startswith("averaged: "))
    assert f"{run / 'averaged.pt'}" in said and f"validation CIDEr-D {line[0]['cider_d']:.3f}" in said


def test_averaging_is_the_same_across_a_resume(world, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(_cfg(world), out=straight, progress=False).run()
    Trainer(_cfg(world), out=split, max_steps=13, progress=False).run()
    Trainer(_cfg(world), out=split, resume=True, progress=False).run()
    a = torch.load(straight / "averaged.pt", weights_only=True)["state_dict"]
    b = torch.load(split / "averaged.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    lines = [x for x in (split / "metrics.jsonl").read_text().splitlines() if '"averaged"' in x]
    assert len(lines) == 1
