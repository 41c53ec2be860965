"""The caption log `edgecap run --jsonl` writes, as its readers see it (torch-free): runs
split at their markers, and the summary file beside the log. The runtime writes it
(runtime/records.py) and `edgecap eval coverage --records` reads it, so it sits below both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgecap.jsonio import read_bytes, read_objects

# `kind` of the lines that are not captions: with --append each run opens with RUN_START and
# closes with RUN_END (its summary); readers skip both
RUN_START, RUN_END = "run_start", "run_end"


def summary_path(jsonl: str | os.PathLike) -> Path:
    """FILE.summary.json beside --jsonl FILE.jsonl."""
    path = Path(jsonl)
    return path.with_name(path.stem + ".summary.json")


@dataclass
class RecordedRun:
    """One run of a caption log (`--jsonl`): its caption records, between its run markers when
    the log was written with --append."""

    number: int                                   # 1, 2, ... in file order
    start: dict | None = None                     # its run_start line (None: no --append)
    end: dict | None = None                       # its run_end line, the run's summary (None: killed)
    records: list[dict] = field(default_factory=list)

    def recorded_coverage(self, summary: tuple[str, dict] | None = None) -> dict | None:
        """The coverage the run itself reported: {"from", "rule", "thresholds": {label: {"mean",
        "n_images"}}}, from its summary (its run_end line, or `summary`: (where, the summary
        file of a log written without --append)), what it printed at exit; for a run without
        one (killed), the mean of its records' own per-frame coverage, which is how the summary
        averages it; None when the run scored no coverage."""
        where, end = ("run_end", self.end) if self.end is not None else summary or ("", {})
        means, frames = end.get("coverage_mean"), end.get("coverage_frames")
        if isinstance(means, dict) and isinstance(frames, dict) and means:
            thresholds = {label: {"mean": mean, "n_images": frames.get(label)} for label, mean in means.items()
                          if _is_number(mean)}
            return {"from": where, "rule": end.get("coverage_rule"), "thresholds": thresholds}
        values: dict[str, list[float]] = {}
        for rec in self.records:
            coverage = rec.get("coverage")
            for label, value in (coverage.items() if isinstance(coverage, dict) else ()):
                if _is_number(value):
                    values.setdefault(label, []).append(value)
        if not values:
            return None
        return {"from": "records", "rule": end.get("coverage_rule", (self.start or {}).get("coverage_rule")),
                "thresholds": {label: {"mean": float(np.mean(v)), "n_images": len(v)} for label, v in values.items()}}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_runs(path: str | os.PathLike) -> tuple[list[RecordedRun], int]:
    """(the runs of a caption log, in order; lines that are not JSON objects, skipped). Caption
    records before any run_start form a run of their own; a run_start always opens a new run,
    so a killed run (no run_end) ends where the next one starts."""
    lines = read_objects(read_bytes(path, "caption log"))
    runs: list[RecordedRun] = []
    current: RecordedRun | None = None
    for rec in lines.objects:
        kind = rec.get("kind")
        if kind == RUN_START or current is None:
            current = RecordedRun(len(runs) + 1, start=rec if kind == RUN_START else None)
            runs.append(current)
            if kind == RUN_START:
                continue
        if kind == RUN_END:
            current.end = rec
            current = None
        elif kind is None:
            current.records.append(rec)
    return [r for r in runs if r.records or r.start is not None], lines.malformed + lines.non_objects
