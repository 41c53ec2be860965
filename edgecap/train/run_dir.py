"""The run directory (`--out`) before a run starts: what it may hold, what a --resume reads
back, and whether the config given now is the run's.

A new run may share --out with anything but the files it writes (RUN_FILES), which are
accepted only as the leftovers of a run of this same config that never saved. A --resume
needs last.state.pt (the save commits with its one rename; it carries the weights, the
optimizer, the RNG states, the counters and the training hooks' states) and a config that
differs from the run's config.toml at most in where / how fast it runs and in the phases'
lengths.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

from edgecap.errors import EdgecapError
from edgecap.io import probe_writable
from edgecap.jsonio import read_toml
from edgecap.models.checkpoint import read_payload
from edgecap.train.config import TrainConfig, parse_config

STATE_VERSION = 2  # 2: the state file carries the weights, so one rename commits a save
READABLE_STATE_VERSIONS = (1, 2)
# the files a run writes into --out (edgecap.train.loop describes each); its data/ and index/
# directories are guarded by their own kinds (edgecap.io), like any --out of theirs
RUN_FILES = ("config.toml", "vocab.json", "metrics.jsonl", "curves.png", "last.pt", "last.state.pt", "best.pt",
             "best_xe.pt", "summary.json", "test_captions.json", "averaged.pt", "epochs")
RESUME_FREE = frozenset({"run.out", "run.device", "run.threads"})  # where and how fast, not what
# how long the phases run may change on resume (extend a finished run, stop one earlier)
PHASE_LENGTHS = frozenset({"schedule.epochs", "schedule.patience", "scst.epochs", "scst.patience"})


@dataclass
class RunDirectory:
    """What --out holds for the run about to start."""

    saved: dict | None = None  # --resume: last.state.pt, read
    started_in: str | None = None  # --resume: the directory the run started in (its relative paths)
    lengths_changed: str | None = None  # --resume with other phase lengths: the first one changed
    restarted: bool = False  # a new run over the leftovers of a same-config run that never saved


def check_run_dir(out: Path, resume: bool, written: TrainConfig) -> RunDirectory:
    """Refuse, in one line and before any data is read, an --out this run may not use."""
    if out.exists() and not out.is_dir():
        raise EdgecapError(f"--out {out} exists and is not a directory; name a run directory")
    if not resume:
        probe_writable(out)  # a parent that is a file, a read-only place: one line, before the data
    if resume:
        if not (out / "last.state.pt").is_file():
            raise EdgecapError(f"--resume: {out} has no last.pt / last.state.pt to resume from")
        saved = read_state(out)
        found = RunDirectory(saved, saved["meta"].get("train_cwd"))
        stored = out / "config.toml"
        if stored.is_file():
            old = stored_config(stored)
            diff = first_difference(old.to_dict(), written.to_dict(), ignore=RESUME_FREE | PHASE_LENGTHS)
            if diff:
                raise EdgecapError(
                    f"--resume: the config differs from the run's {stored} at {diff}; resume with --config "
                    f"{shlex.quote(str(stored))} (it includes any --set / --data changes the run started with; only "
                    f"{', '.join(sorted(PHASE_LENGTHS))} may change on resume)"
                )
            found.lengths_changed = first_difference(old.to_dict(), written.to_dict(), ignore=RESUME_FREE)
        return found
    if (out / "last.pt").is_file() or (out / "last.state.pt").is_file():
        raise EdgecapError(
            f"run directory {out} already holds a run (last.pt); pass --resume to continue it or choose another --out"
        )
    return RunDirectory(restarted=_same_config_leftovers(out, written))


def _same_config_leftovers(out: Path, written: TrainConfig) -> bool:
    """A new run may share --out with anything but files it would overwrite. Those are
    accepted only as the leftovers of a run of this same config that never saved (its
    config.toml is this one): nothing of the user's is overwritten. -> whether there are any."""
    present = sorted(n for n in RUN_FILES if (out / n).exists())
    if not present:
        return False
    stored = out / "config.toml"
    same = False
    if stored.is_file():
        try:
            same = not first_difference(stored_config(stored).to_dict(), written.to_dict(), ignore=RESUME_FREE)
        except EdgecapError:
            same = False
    if not same:
        raise EdgecapError(f"--out {out} already holds {', '.join(present)}, which this run would "
                           f"overwrite, and they are not from an earlier run of this config; choose another --out")
    return True


def stored_config(path: Path) -> TrainConfig:
    """The run's config.toml, read."""
    return parse_config(read_toml(path), source=str(path))


def read_state(out: Path) -> dict:
    """last.state.pt of the run in `out` (a version-1 state with its weights from last.pt)."""
    path = out / "last.state.pt"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise EdgecapError(f"{path}: unreadable training state ({exc})") from exc
    if not isinstance(saved, dict) or saved.get("version") not in READABLE_STATE_VERSIONS:
        version = saved.get("version") if isinstance(saved, dict) else None
        raise EdgecapError(f"{path}: version {version!r}, expected one of "
                           f"{', '.join(map(str, READABLE_STATE_VERSIONS))}")
    if saved["version"] == 1:  # weights in last.pt only: the two files must be of one save
        last = out / "last.pt"
        payload = read_payload(last)
        if payload.get("meta", {}).get("step") != saved["state"]["step"]:
            raise EdgecapError(
                f"--resume: {last} is at step {payload.get('meta', {}).get('step')} but last.state.pt at "
                f"step {saved['state']['step']} (a save was interrupted); cannot resume exactly"
            )
        saved["weights"], saved["meta"] = payload["state_dict"], payload.get("meta", {})
    return saved


def last_is_behind(out: Path, step: int) -> bool:
    """Whether last.pt is absent, unreadable or of another save than last.state.pt (a kill
    between the two writes of a save)."""
    try:
        return read_payload(out / "last.pt").get("meta", {}).get("step") != step
    except EdgecapError:
        return True


def first_difference(a, b, prefix: str = "", ignore=frozenset()) -> str | None:
    """The first dotted key where two config tables differ, with both values; None if equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            name = f"{prefix}.{key}" if prefix else key
            if name in ignore:
                continue
            diff = first_difference(a.get(key), b.get(key), name, ignore)
            if diff:
                return diff
        return None
    if a != b:
        return f"{prefix} ({a!r} -> {b!r})"
    return None
