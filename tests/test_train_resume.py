"""A run's saves: exact resume, a kill at any write of a save, the averaged last epochs.

- Exact resume: N steps straight == N/2 steps, stop, --resume, N/2 steps (losses, weights).
- A training run killed (SIGKILL) at every write of a save resumes exactly (issue 28). The kill
  is deterministic: a driver process counts the writes of one save (every torch.save and
  os.replace from the moment `save_last` starts) and kills itself with SIGKILL at the k-th:
  inside torch.save it first writes half of the file, as a kill in the middle of the write would
  leave it. k runs from the first write to just after the save returned.
- [run].average_last = N: the final phase's last N epoch ends are kept and averaged into
  averaged.pt, validated; the same across a --resume."""

import json
import os
import shlex
import subprocess
import sys

import pytest
import torch
from _train_tiny import tiny_config
from conftest import REPO

from edgecap.errors import EdgecapError
from edgecap.models.checkpoint import load_checkpoint
from edgecap.train.config import to_toml
from edgecap.train.loop import Trainer


def losses(run):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["phase"], r["loss"]) for r in lines if r["kind"] == "train"]


def weights(run, name="last.pt"):
    return torch.load(run / name, weights_only=True)["state_dict"]


def test_resumed_run_reproduces_the_uninterrupted_one(world, tmp_path):
    # augmentation, dropout and a stop in the middle of an epoch (9 steps per epoch) and of a
    # logging interval: everything random must come back exactly.
    cfg = tiny_config(world, data={"augment": "shift"}, schedule={"epochs": 2, "warmup": 5},
                      run={"log_every": 2})
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(cfg, out=straight, progress=False).run()
    first = Trainer(cfg, out=split, max_steps=13, progress=False).run()
    assert first["stopped"] and first["step"] == 13
    assert losses(split) == [x for x in losses(straight) if x[0] <= 12]  # 13 waits in the log accumulator
    second = Trainer(cfg, out=split, resume=True, progress=False).run()
    assert second["done"] and second["step"] == 18
    assert losses(split) == losses(straight)
    a, b = weights(straight), weights(split)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_across_the_scst_switch(world, tmp_path):
    cfg = tiny_config(world, schedule={"epochs": 1, "warmup": 5}, scst={"epochs": 1, "beam_size": 2, "lr": 1e-4},
                      data={"val_batch_size": 4})
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(cfg, out=straight, progress=False).run()
    Trainer(cfg, out=split, max_steps=9, progress=False).run()  # the last XE step
    Trainer(cfg, out=split, resume=True, max_steps=12, progress=False).run()
    Trainer(cfg, out=split, resume=True, progress=False).run()
    got, want = losses(split), losses(straight)
    assert [p for _, p, _ in want].count("scst") == 9
    assert got == want
    a, b = weights(straight), weights(split)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_errors(world, tmp_path):
    cfg = tiny_config(world, schedule={"epochs": 1})
    with pytest.raises(EdgecapError, match="has no last.pt"):
        Trainer(cfg, out=tmp_path / "none", resume=True, progress=False).run()
    Trainer(cfg, out=tmp_path / "run", max_steps=2, progress=False).run()
    changed = tiny_config(world, schedule={"epochs": 1}, optim={"lr": 0.5})
    with pytest.raises(EdgecapError, match=r"config differs .* at optim.lr \(0.05 -> 0.5\)"):
        Trainer(changed, out=tmp_path / "run", resume=True, progress=False).run()
    # a run saved by the version-1 layout (weights in last.pt only) whose two files disagree
    state = torch.load(tmp_path / "run" / "last.state.pt", weights_only=True)
    state = {**{k: v for k, v in state.items() if k not in ("weights", "meta")}, "version": 1}
    state["state"]["step"] = 1
    torch.save(state, tmp_path / "run" / "last.state.pt")
    with pytest.raises(EdgecapError, match="a save was interrupted"):
        Trainer(cfg, out=tmp_path / "run", resume=True, progress=False).run()


def test_a_killed_run_resumes_from_its_last_save_without_duplicate_log_lines(world, tmp_path):
    cfg = tiny_config(world, schedule={"epochs": 1}, run={"save_every": 4})
    run = tmp_path / "run"
    Trainer(cfg, out=run, max_steps=6, progress=False).run()
    # simulate a kill after step 6 was logged but before its save: last.* are from step 4
    Trainer(cfg, out=tmp_path / "at4", max_steps=4, progress=False).run()
    for name in ("last.pt", "last.state.pt"):
        (run / name).write_bytes((tmp_path / "at4" / name).read_bytes())
    Trainer(cfg, out=run, resume=True, progress=False).run()
    steps = [s for s, _, _ in losses(run)]
    assert steps == list(range(1, 10))


def test_cli_stop_and_resume(world, tmp_path, run_cli):
    from edgecap.train.config import to_toml

    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(tiny_config(world, schedule={"epochs": 1}).to_dict()))
    out = tmp_path / "run"
    code, stdout, _ = run_cli("train", "--config", config, "--out", out, "--max-steps", 3, "--quiet")
    assert code == 0 and "stopped at step 3" in stdout
    code, _, stderr = run_cli("train", "--config", config, "--out", out, "--quiet")
    assert code == 1 and "pass --resume" in stderr and len(stderr.strip().splitlines()) == 1
    code, stdout, _ = run_cli("train", "--config", config, "--out", out, "--resume", "--quiet")
    assert code == 0 and "finished at step 9" in stdout
    code, _, stderr = run_cli("train", "--config", tmp_path / "missing.toml")
    assert code == 1 and "missing.toml does not exist" in stderr


def test_a_stop_before_any_validation_leaves_a_validated_best_pt_without_changing_the_run(world, tmp_path):
    from edgecap.models.checkpoint import load_checkpoint

    cfg = tiny_config(world, schedule={"epochs": 2, "warmup": 5}, data={"augment": "shift"})
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(cfg, out=straight, progress=False).run()
    first = Trainer(cfg, out=split, max_steps=4, progress=False).run()  # mid epoch 1 (9 steps)
    best = first["best_checkpoint"]
    assert best["path"] == str(split / "best.pt") and best["step"] == 4 and best["validated_at_stop"]
    ck = load_checkpoint(split / "best.pt")  # what the README's next step (export) loads
    assert ck.meta["step"] == 4 and ck.meta["validated_at_stop"] and ck.meta["val_cider_d"] == best["val_cider_d"]
    assert torch.equal(weights(split, "best.pt")["fc.weight"], weights(split)["fc.weight"])
    Trainer(cfg, out=split, resume=True, progress=False).run()
    # the extra validation drew no randomness and moved no best: the runs end identical
    assert losses(split) == losses(straight)
    for name in ("last.pt", "best.pt", "best_xe.pt"):
        a, b = weights(straight, name), weights(split, name)
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert not load_checkpoint(split / "best.pt").meta.get("validated_at_stop")


def test_cli_names_the_checkpoint_to_use_after_a_stop(world, tmp_path, run_cli):
    from edgecap.train.config import to_toml

    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(tiny_config(world, schedule={"epochs": 1}).to_dict()))
    out = tmp_path / "my rün"  # the printed next step must paste into a shell as it is
    code, stdout, err = run_cli("train", "--config", config, "--out", out, "--max-steps", 2, "--quiet")
    assert code == 0, err
    assert f"checkpoint: {out / 'best.pt'} (step 2, xe, validation CIDEr-D" in stdout
    assert "validated when --max-steps stopped the run" in stdout
    next_step = next(line for line in stdout.splitlines() if line.startswith("next: "))
    assert shlex.split(next_step.split("   (")[0])[1:] == ["edgecap", "export", str(out / "best.pt"),
                                                         "--target", "cpu-ort-fp32"]
    assert "--resume" in stdout
    code, stdout, err = run_cli("export", out / "best.pt", "--engine", "onnx", "--samples", 1, "--quiet")
    assert code == 0, err


# -- a run killed at every write of a save ---------------------------------------------------------
DRIVER = r"""
import io, os, signal, sys
from pathlib import Path

import torch

from edgecap.train import loop
from edgecap.train.overrides import load_config

config, out, kill_at, at_step = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
events = {"n": 0, "armed": False}
real_save, real_replace = torch.save, os.replace


def die(what):
    Path(out, "..", "killed.txt").write_text(what)
    os.kill(os.getpid(), signal.SIGKILL)


def event(what):
    if events["armed"]:
        if events["n"] == kill_at:
            return True
        events["n"] += 1
    return False


def save(obj, f, *args, **kwargs):
    if event("save"):
        buffer = io.BytesIO()
        real_save(obj, buffer)
        data = buffer.getvalue()
        if hasattr(f, "write"):  # edgecap saves through a file object (a full disk is then an OSError)
            f.write(data[: len(data) // 2])
            f.flush()
        else:
            Path(f).write_bytes(data[: len(data) // 2])
        die(f"torch.save {Path(getattr(f, 'name', f)).name} (half written)")
    return real_save(obj, f, *args, **kwargs)


def replace(src, dst, *args, **kwargs):
    if event("replace"):
        die(f"os.replace -> {Path(dst).name}")
    return real_replace(src, dst, *args, **kwargs)


torch.save, os.replace = save, replace
save_last = loop.Trainer.save_last


def watched_save_last(self):
    events["armed"] = self.state.step == at_step
    save_last(self)
    if events["armed"]:
        die(f"after the save ({events['n']} writes)")


loop.Trainer.save_last = watched_save_last
loop.Trainer(load_config(config), out=out, progress=False).run()
"""


def _metrics(run):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["kind"], r["step"], r.get("loss"), r.get("cider_d")) for r in lines]


@pytest.mark.slow
def test_a_kill_at_every_write_of_a_save_resumes_exactly(world, tmp_path):
    cfg = tiny_config(world, schedule={"epochs": 1, "warmup": 5}, run={"save_every": 3, "log_every": 2})
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(cfg.to_dict()))
    straight = tmp_path / "straight"
    Trainer(cfg, out=straight, progress=False).run()
    want = torch.load(straight / "last.pt", weights_only=True)["state_dict"]
    kills = []
    for k in range(20):
        case = tmp_path / f"kill{k}"
        case.mkdir()
        proc = subprocess.run([sys.executable, "-c", DRIVER, str(config), str(case / "run"), str(k), "6"],
                              capture_output=True, text=True, timeout=300, cwd=case,
                              env={**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == -9, proc.stderr[-2000:]
        killed = (case / "killed.txt").read_text()
        kills.append(killed)
        summary = Trainer(cfg, out=case / "run", resume=True, progress=False).run()
        assert summary["done"] and summary["step"] == 9, killed
        got = torch.load(case / "run" / "last.pt", weights_only=True)["state_dict"]
        assert all(torch.equal(got[n], want[n]) for n in want), killed
        assert _metrics(case / "run") == _metrics(straight), killed
        assert not list((case / "run").glob(".*edgecap-tmp")), killed
        if killed.startswith("after the save"):
            break
    # every write of the save was a kill point: both files, half written and before each rename
    assert any("torch.save" in k and "last.state.pt" in k for k in kills), kills
    assert any("os.replace -> last.state.pt" in k for k in kills), kills
    assert any("torch.save" in k and "last.pt" in k and "state" not in k for k in kills), kills
    assert any("os.replace -> last.pt" in k for k in kills), kills
    assert kills[-1].startswith("after the save")


def test_a_kill_leaves_work_folders_that_the_next_run_removes(world, tmp_path):
    run = tmp_path / "run"
    cfg = tiny_config(world, schedule={"epochs": 1})
    Trainer(cfg, out=run, max_steps=2, progress=False).run()
    orphan = run / ".last.state.pt.abc123.edgecap-tmp"  # as a SIGKILL leaves it: lock file, no holder
    (orphan / "new").mkdir(parents=True)
    (orphan / "lock").write_text("{}")
    (orphan / "new" / "last.state.pt").write_bytes(b"half")
    Trainer(cfg, out=run, resume=True, progress=False).run()
    assert not orphan.exists()


# -- the averaged last epochs ----------------------------------------------------------------------
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
