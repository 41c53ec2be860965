"""A run's metrics.jsonl (one JSON object per line) and the curves.png drawn from it."""

from __future__ import annotations

import json
from pathlib import Path

from edgecap.errors import require
from edgecap.io import append_whole, write_text_atomic
from edgecap.jsonio import read_bytes, read_objects
from edgecap.png import save_figure


class MetricsLog:
    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "ab", buffering=0) as fh:  # a whole line or none (a full disk): append_whole
            append_whole(fh, (json.dumps(record) + "\n").encode("utf-8"), self.path)

    def records(self) -> list[dict]:
        if not self.path.is_file():
            return []
        # a killed run can leave a half last line: read_objects skips it (truncate_after drops it on resume)
        return read_objects(read_bytes(self.path, "the run's metrics log")).objects

    def truncate_after(self, step: int) -> None:
        """Drop lines a killed run wrote after its last save, so the resumed log has no gaps or repeats."""
        if not self.enabled or not self.path.is_file():
            return
        keep = [r for r in self.records() if r.get("step", 0) <= step]
        write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in keep))


def plot_curves(records: list[dict], path: Path) -> None:
    matplotlib = require("matplotlib", "train", "training curves")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for phase, key, label in (("xe", "loss", "XE loss"), ("scst", "reward", "SCST reward (CIDEr-D)")):
        rows = [r for r in records if r.get("kind") == "train" and r.get("phase") == phase and key in r]
        if not rows:
            continue
        ax = ax1 if phase == "xe" else ax1.twinx()
        ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=label,
                color="tab:blue" if phase == "xe" else "tab:orange")
        ax.set_ylabel(label)
    ax1.set_xlabel("step")
    ax1.set_title("training")
    for phase, color in (("xe", "tab:blue"), ("scst", "tab:orange")):
        rows = [r for r in records if r.get("kind") == "val" and r.get("phase") == phase]
        if rows:
            ax2.plot([r["step"] for r in rows], [r["cider_d"] for r in rows], "o-", color=color, label=phase)
    ax2.set_xlabel("step")
    ax2.set_ylabel("validation CIDEr-D")
    ax2.set_title("validation (greedy)")
    if ax2.lines:
        ax2.legend()
    fig.tight_layout()

    save_figure(fig, path, dpi=100, checked=True)  # the run directory's own rules guard its files
    plt.close(fig)
