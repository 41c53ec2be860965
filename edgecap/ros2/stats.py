"""What the node reports: /diagnostics key-values, rate-limited warnings with counts, and the
exit summary (edgecap.runtime.records.Summary, the one `edgecap run` prints)."""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from edgecap.runtime.records import Record, Summary

WINDOW_S = 10.0          # captions/s and latency percentiles cover the last this many seconds


class NodeStats:
    def __init__(self, summary: Summary):
        self.summary = summary
        self.refused = 0                           # frames in an encoding the node will not caption
        self.lost = 0                              # frames published that never arrived
        self._recent: deque[tuple[float, float]] = deque()   # (t_done, capture-to-caption ms)

    def add(self, record: Record) -> None:
        self.summary.add(record)
        self._recent.append((record.t_done, record.capture_to_caption_ms))

    def window(self, now: float | None = None) -> tuple[float, list[float]]:
        """(captions per second, latencies in ms) over the last WINDOW_S seconds."""
        now = time.monotonic() if now is None else now
        while self._recent and self._recent[0][0] < now - WINDOW_S:
            self._recent.popleft()
        span = min(WINDOW_S, now - self.summary.started)
        rate = len(self._recent) / span if span > 0 else 0.0
        return rate, [ms for _, ms in self._recent]

    def values(self, extra: dict[str, str]) -> list[tuple[str, str]]:
        """The key-values of the node's DiagnosticStatus."""
        rate, latencies = self.window()
        grabber = self.summary.grabber
        p50, p95 = (float(np.percentile(latencies, q)) if latencies else None for q in (50, 95))
        return [
            ("captions_per_s", f"{rate:.2f}"),
            ("captioned", str(self.summary.captioned)),
            ("received", str(grabber.captured)),
            ("dropped", str(grabber.dropped)),
            ("lost", str(self.lost)),
            ("skipped", str(grabber.skipped)),
            ("refused", str(self.refused)),
            ("latency_p50_ms", "-" if p50 is None else f"{p50:.1f}"),
            ("latency_p95_ms", "-" if p95 is None else f"{p95:.1f}"),
            *extra.items(),
        ]


class CountedWarning:
    """At most one line per `period` seconds for a repeating problem, with how many times it
    happened since the last line: `note(reason)` returns the line to log, or None."""

    def __init__(self, what: str, period: float = 10.0, clock=time.monotonic):
        self.what = what
        self.period = period
        self.clock = clock
        self.total = 0
        self._since = 0
        self._last: float | None = None

    def note(self, reason: str) -> str | None:
        self.total += 1
        self._since += 1
        now = self.clock()
        if self._last is not None and now - self._last < self.period:
            return None
        count, self._since, self._last = self._since, 0, now
        return f"{self.what} {count} frame{'s' if count != 1 else ''} ({self.total} in all): {reason}"


class SequenceGaps:
    """Frames lost on the way, from gaps in each publisher's publication sequence numbers (what
    rmw reports with every message; a best-effort subscription to large raw frames loses many,
    and nothing else tells)."""

    def __init__(self):
        self._last: dict[str, int] = {}
        self.lost = 0

    def note(self, publisher: str, sequence: int | None) -> None:
        if not sequence:                       # the rmw does not number publications
            return
        last = self._last.get(publisher)
        if last is not None and sequence > last + 1:
            self.lost += sequence - last - 1
        if last is None or sequence > last:
            self._last[publisher] = sequence
