"""A training run killed (SIGKILL) at every write of a save resumes exactly (issue 28).

The kill is deterministic: a driver process counts the writes of one save (every torch.save
and os.replace from the moment `save_last` starts) and kills itself with SIGKILL at the k-th:
inside torch.save it first writes half of the file, as a kill in the middle of the write
would leave it. k runs from the first write to just after the save returned.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from _train_tiny import tiny_config
from conftest import REPO

from edgecap.train.config import to_toml
from edgecap.train.loop import Trainer

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
