"""Where a training config's relative paths point.

A training config names its data (`[data].karpathy / images / features`, `[data.synth].dir`),
`[retrieval].index / visual_from` and `[model].visual.weights`. A relative path there is
relative to the directory the run STARTED in: the working directory of the first
`edgecap train`, which every checkpoint records as `train_cwd`. `edgecap train --resume` and
`edgecap export`, run from anywhere, read the same files the run was started with. The one
exception is a checkpoint or run copied to another machine (or another checkout): when the path
does not exist under `train_cwd` but does from the current directory, the current directory's
copy is taken.

Not relative to the config file, unlike `edgecap run --config` (docs/training.md says why):
a training config names data shared by many configs and runs (`configs/*.toml` name
`data/coco/...` from the repository root, and a run keeps a copy of its config in its run
directory, which must mean what the original meant). A file that exists only beside the config
is named in the error, not taken.

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


def existing_from_run_start(value: str, started_in: str | os.PathLike | None, key: str,
                            config: str | os.PathLike | None = None, source: str = "") -> Path:
    """`from_run_start`, or a one-line error naming the config key and where it was looked for;
    when the file is there relative to the `config` file instead, the error says so (a config
    written next to its data), rather than taking it: the rule stays one rule. `source` says
    where such a file comes from, for a reader who has never had it."""
    path = from_run_start(value, started_in)
    if path.exists():
        return path
    where = ""
    if not Path(value).expanduser().is_absolute():
        base = Path(started_in) if started_in else Path.cwd()
        where = f" (relative paths are relative to the directory the run started in, {base}, not to the config's folder)"
        beside = Path(config).parent / value if config else None
        if beside is not None and beside.exists():
            where += (f"; {beside} exists beside the config: write that path, or start the run in "
                      f"{Path(config).parent}")
    raise EdgecapError(f"{key} = {value!r}: {path} does not exist{where}" + (f"; {source}" if source else ""))
