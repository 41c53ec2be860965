"""Where a training config's relative paths point.

A training config names its data (`[data].karpathy / images / features`, `[data.synth].dir`),
`[retrieval].index / visual_from` and `[model].visual.weights`. A relative path there is
relative to the directory the run STARTED in: the working directory of the first
`edgecap train`, which every checkpoint records as `train_cwd`. `edgecap train --resume` and
`edgecap export`, run from anywhere, read the same files the run was started with. The one
exception is a checkpoint or run copied to another machine (or another checkout): when the path
does not exist under `train_cwd` but does from the current directory, the current directory's
copy is taken.

Paths given on the command line (`--config`, `--out`, `--resume RUN_DIR`, `--data`) are, as
everywhere, relative to the directory the command runs in.
"""

from __future__ import annotations

import os
from pathlib import Path

from edgecap.errors import EdgecapError


def from_run_start(value: str, started_in: str | os.PathLike | None) -> Path:
    """The path a config's `value` names for a run started in `started_in` (None: here)."""
    path = Path(value).expanduser()
    if path.is_absolute() or not started_in:
        return path
    there = Path(started_in) / path
    return path if path.exists() and not there.exists() else there


def existing_from_run_start(value: str, started_in: str | os.PathLike | None, key: str) -> Path:
    """`from_run_start`, or a one-line error naming the config key and where it was looked for."""
    path = from_run_start(value, started_in)
    if path.exists():
        return path
    where = ""
    if not Path(value).expanduser().is_absolute():
        base = Path(started_in) if started_in else Path.cwd()
        where = f" (relative paths are relative to the directory the run started in, {base})"
    raise EdgecapError(f"{key} = {value!r}: {path} does not exist{where}")
