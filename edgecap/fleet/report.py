"""What a fleet job tells its user: progress on the terminal while it runs (logs and images
done, captions per second, ETA) and the summary at the end (OUT/summary.json, and its lines).

On a terminal the progress is a bar over the logs (edgecap.progress: tqdm, on stderr); into a
pipe or a file it is one line per finished or failed log. Rates count only this run's captions,
from the first caption the driver received, so Ray's start-up and the actors' bundle loading
are not in them (they are in `seconds`, and in `startup_s`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from edgecap.progress import bar_wanted, progress_bar


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass
class ActorTally:
    captions: int = 0
    busy_s: float = 0.0


@dataclass
class FleetReport:
    """Counts of one run; `line()` and `to_json()` say them."""

    total: int                                   # logs in the job
    pending: int                                 # ... not finished before this run
    started: float = field(default_factory=time.time)
    first_caption: float | None = None
    last_caption: float | None = None
    finished: int = 0
    failed: list[dict] = field(default_factory=list)
    logs: list[dict] = field(default_factory=list)
    images: int = 0
    skipped: int = 0
    actors: dict[str, ActorTally] = field(default_factory=dict)
    stopped_by: str = "end of logs"

    def add_rows(self, table) -> None:
        """Count the caption rows of one batch from the actors (repeats included: they were captioned)."""
        columns = (table.column(name).to_pylist() for name in ("actor", "busy_s", "done_wall"))
        for name, seconds, done in zip(*columns, strict=True):
            if name is None:
                continue
            tally = self.actors.setdefault(name, ActorTally())
            tally.captions += 1
            tally.busy_s += seconds
            self.first_caption = done if self.first_caption is None else min(self.first_caption, done)
            self.last_caption = done if self.last_caption is None else max(self.last_caption, done)

    def log_done(self, key: str, captions: int, end: dict) -> None:
        self.finished += 1
        self.images += captions
        skipped = sum(s["skipped"] for s in end["streams"])
        self.skipped += skipped
        self.logs.append({"log": key, "captions": captions, "frames_skipped": skipped,
                          "streams": end["streams"]})

    def log_failed(self, key: str, end: dict) -> None:
        self.failed.append({"log": key, "error": end["error"], "streams": end["streams"]})

    @property
    def done(self) -> int:
        return self.finished + len(self.failed)

    @property
    def rate(self) -> float | None:
        if self.first_caption is None or self.last_caption is None or self.last_caption <= self.first_caption:
            return None
        return (sum(a.captions for a in self.actors.values()) - 1) / (self.last_caption - self.first_caption)

    def eta(self) -> float | None:
        """Seconds left, from the time each log has taken since the first caption (Ray's start-up
        and the actors' bundle loading are behind by then); logs vary in length."""
        if not self.done or self.done >= self.pending:
            return None
        since = self.first_caption if self.first_caption is not None else self.started
        return max(0.0, time.time() - since) / self.done * (self.pending - self.done)

    def line(self, key: str, what: str) -> str:
        rate, eta = self.rate, self.eta()
        return (f"edgecap fleet: [{self.done}/{self.pending}] {key}: {what}; {self.images} images captioned"
                + (f", {rate:.1f} captions/s" if rate else "") + (f", ETA {_clock(eta)}" if eta is not None else ""))

    def to_json(self, extra: dict) -> dict:
        return {
            **extra,
            "logs": {"in_job": self.total, "finished_before": self.total - self.pending,
                     "captioned": self.finished, "failed": len(self.failed),
                     "left": self.pending - self.done},
            "images_captioned": self.images,
            "frames_skipped": self.skipped,
            "seconds": round(time.time() - self.started, 3),
            "startup_s": None if self.first_caption is None else round(self.first_caption - self.started, 3),
            "captions_per_s": None if self.rate is None else round(self.rate, 3),
            "actors": [{"actor": name, "captions": t.captions, "busy_s": round(t.busy_s, 3),
                        "captions_per_busy_s": round(t.captions / t.busy_s, 3) if t.busy_s > 0 else None}
                       for name, t in sorted(self.actors.items())],
            "failures": self.failed,
            "stopped_by": self.stopped_by,
            "per_log": self.logs,
        }


def summary_lines(summary: dict) -> list[str]:
    logs = summary["logs"]
    lines = [f"summary: {logs['captioned']} logs captioned, {logs['failed']} failed, {logs['finished_before']} "
             f"finished before, {logs['left']} left; {summary['images_captioned']} images, "
             f"{summary['frames_skipped']} frames skipped; stopped by {summary['stopped_by']}"]
    rate = summary["captions_per_s"]
    startup = summary["startup_s"]
    lines.append(f"  {summary['seconds']:.1f} s in all" + (f" ({startup:.1f} s to the first caption)" if startup else "")
                 + (f"; {rate:.2f} captions/s" if rate else ""))
    for actor in summary["actors"]:
        per = actor["captions_per_busy_s"]
        lines.append(f"  actor {actor['actor']}: {actor['captions']} captions, {actor['busy_s']:.1f} s busy"
                     + (f", {per:.2f} captions per busy second" if per else ""))
    for failure in summary["failures"]:
        lines.append(f"  failed: {failure['log']}: {failure['error']}")
    return lines


class Progress:
    """A bar on a terminal, lines elsewhere (none with --quiet)."""

    def __init__(self, report: FleetReport, quiet: bool = False):
        self.report = report
        self.quiet = quiet
        self.bar = progress_bar(total=report.pending, unit="log", desc="edgecap fleet", quiet=quiet) \
            if bar_wanted(quiet) else None

    def update(self, key: str, what: str) -> None:
        if self.bar is not None:
            rate = self.report.rate
            self.bar.set_postfix_str(f"{self.report.images} images" + (f", {rate:.1f} captions/s" if rate else ""))
            self.bar.update(1)
        elif not self.quiet:
            print(self.report.line(key, what), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
