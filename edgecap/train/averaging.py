"""Checkpoint averaging: the mean of the weights of the last N epoch ends of a phase.

With `[run].average_last = N` every epoch end also keeps its weights in
`<run dir>/epochs/<phase>-<epoch>.pt` (the newest N of each phase; older ones are removed,
they are the run's own files), and the finished run writes `averaged.pt`, the element-wise
mean of the final phase's kept weights, validated like any epoch. Averaging (Vaswani et al.
2017 average the last 5 or 20 checkpoints) smooths the noise of the last updates: it helps
when validation CIDEr-D wobbles from epoch to epoch around a plateau (XE at a constant or
slowly decaying lr), and helps little after SCST at a tiny lr, whose last epochs barely differ.
It never replaces best.pt: compare the two scores in metrics.jsonl and choose.
"""

from __future__ import annotations

from pathlib import Path

import torch

from edgecap.models.checkpoint import read_payload, save_checkpoint

EPOCHS_DIR = "epochs"


def epoch_files(out: Path, phase: str) -> list[Path]:
    folder = out / EPOCHS_DIR
    return sorted(folder.glob(f"{phase}-[0-9][0-9][0-9][0-9].pt")) if folder.is_dir() else []


def keep_epoch(out: Path, model, vocab, meta: dict, phase: str, epoch: int, keep: int) -> None:
    """Save this epoch end's weights and drop the phase's older ones beyond the newest `keep`."""
    save_checkpoint(out / EPOCHS_DIR / f"{phase}-{epoch:04d}.pt", model, vocab, meta)
    for old in epoch_files(out, phase)[:-keep]:
        old.unlink()


def average_weights(files: list[Path]) -> dict:
    """Element-wise mean of the floating tensors (in float64, then back); other tensors (counts,
    indices) are the newest file's."""
    states = [read_payload(f)["state_dict"] for f in files]
    out = {}
    for name, newest in states[-1].items():
        if newest.is_floating_point():
            total = sum(s[name].to(torch.float64) for s in states)
            out[name] = (total / len(states)).to(newest.dtype)
        else:
            out[name] = newest
    return out
