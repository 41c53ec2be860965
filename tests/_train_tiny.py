"""Tiny training configs on a tiny synthetic world, shared by tests/test_train_*.py."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

from conftest import REPO

from edgecap.train.config import parse_config, to_toml

TINY_MODEL = {
    "preset": "smart",
    "d_model": 32,
    "n_heads": 4,
    "d_ff": 64,
    "dropout": 0.1,
    "max_len": 12,
    "n_regions": 16,
    "d_in": 16,
    "memory": {"slots": 4},
    "encoder_positions": "sinusoidal",
    "visual": {"kind": "cnn", "image_size": 32, "channels": [8, 16, 16]},
}

TINY_PMA = {**TINY_MODEL, "preset": "pma-edge", "prototype": {"count": 8}}
TINY_PMA.pop("memory")


def tiny_config(data_dir, model=None, **sections):
    """A TrainConfig over the synthetic world in `data_dir` (generated there on first use)."""
    data = {
        "model": copy.deepcopy(model or TINY_MODEL),
        "data": {"synth": {"images": 40, "seed": 3, "size": 32, "dir": str(data_dir)},
                 "batch_size": 4, "min_count": 1, "val_batch_size": 8},
        "optim": {"lr": 0.05},
        "schedule": {"kind": "noam", "epochs": 2, "warmup": 10},
        "run": {"log_every": 1, "threads": 1, "seed": 0},
    }
    for name, table in sections.items():
        data[name] = {**data.get(name, {}), **table}
    return parse_config(data, source="tiny.toml")


def run_ddp(tmp_path, cfg):
    """`edgecap train` of `cfg` under `torchrun --nproc_per_node=2` (gloo on CPU) into
    tmp_path/run; -> (run directory, the finished process). Fails the test on a non-zero exit."""
    config = tmp_path / "ddp.toml"
    config.write_text(to_toml(cfg.to_dict()))
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "edgecap.cli", "train", "--config", str(config), "--out", str(out), "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc
