"""What the node reports: /diagnostics key-values and level, rate-limited warnings with counts,
and the exit summary (edgecap.runtime.records.Summary, the one `edgecap run` prints)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from edgecap.runtime.records import Record, Summary

WINDOW_S = 10.0          # captions/s, latency percentiles and loss cover the last this many seconds
OK, WARN, ERROR = 0, 1, 2  # diagnostic_msgs/DiagnosticStatus levels


class NodeStats:
    """A sink of the loop (`add`): captions/s and latencies over the last WINDOW_S seconds;
    frames lost on the way, in all and over the window.

    Two counts of lost frames, each short of the truth on its own side, are kept per camera:
    gaps in the publishers' sequence numbers (`arrived`: every frame published between two
    that arrived, whether DDS lost it or the reader's history overwrote it, but nothing before
    the first or after the last frame that arrived) and the middleware's message-lost events
    (`middleware_lost`: samples DDS saw and lost, a large frame of which only some fragments
    came among them, the ones after the last arrival included, but not a sample the reader's
    history overwrote). A camera's loss is the larger of the two."""

    def __init__(self, summary: Summary | None = None):
        self.summary = summary                      # set before the first window()
        self.gap_lost: dict[int, int] = {}          # camera -> frames missing between arrivals
        self.middleware_lost: dict[int, int] | None = None   # camera -> rmw's count; None: no such event
        self._recent: deque[tuple[float, float]] = deque()   # (t_done, capture-to-caption ms)
        self._arrivals: deque[tuple[float, int]] = deque()   # (t, frames lost just before this one)
        self._middleware: deque[tuple[float, int]] = deque()  # (t, frames the rmw reported lost)

    @property
    def lost(self) -> int:
        """Frames published that never arrived: per camera the larger of the two counts."""
        mw = self.middleware_lost or {}
        return sum(max(self.gap_lost.get(c, 0), mw.get(c, 0)) for c in {*self.gap_lost, *mw})

    def add(self, record: Record) -> None:
        self._recent.append((record.t_done, record.capture_to_caption_ms))

    def arrived(self, lost_before: int, now: float | None = None, camera: int = 0) -> None:
        """An image arrived, after `lost_before` frames of its publisher that never did."""
        self.gap_lost[camera] = self.gap_lost.get(camera, 0) + lost_before
        self._arrivals.append((time.monotonic() if now is None else now, lost_before))

    def counts_middleware_loss(self) -> None:
        """The rmw reports lost messages (its subscriptions took the message-lost event)."""
        if self.middleware_lost is None:
            self.middleware_lost = {}

    def lost_by_middleware(self, count: int, now: float | None = None, camera: int = 0) -> None:
        """The rmw reported `count` more messages of the camera's topic lost."""
        self.counts_middleware_loss()
        self.middleware_lost[camera] = self.middleware_lost.get(camera, 0) + count
        self._middleware.append((time.monotonic() if now is None else now, count))

    def _trim(self, now: float) -> None:
        for queue in (self._recent, self._arrivals, self._middleware):
            while queue and queue[0][0] < now - WINDOW_S:
                queue.popleft()

    def window(self, now: float | None = None) -> tuple[float, list[float]]:
        """(captions per second, latencies in ms) over the last WINDOW_S seconds."""
        now = time.monotonic() if now is None else now
        self._trim(now)
        span = min(WINDOW_S, now - self.summary.started)
        rate = len(self._recent) / span if span > 0 else 0.0
        return rate, [ms for _, ms in self._recent]

    def loss_share(self, now: float | None = None) -> float | None:
        """Of the frames published in the window (arrived + lost), the share lost; None before any."""
        self._trim(time.monotonic() if now is None else now)
        lost = max(sum(n for _, n in self._arrivals), sum(n for _, n in self._middleware))
        total = len(self._arrivals) + lost
        return lost / total if total else None

    def values(self, extra: dict[str, str]) -> list[tuple[str, str]]:
        """The key-values of the node's DiagnosticStatus."""
        rate, latencies = self.window()
        grabber = self.summary.grabber
        p50, p95 = (float(np.percentile(latencies, q)) if latencies else None for q in (50, 95))
        loss = self.loss_share()
        return [
            ("captions_per_s", f"{rate:.2f}"),
            ("captioned", str(self.summary.captioned)),
            ("received", str(grabber.captured)),
            ("dropped", str(grabber.dropped)),
            ("lost", str(self.lost)),
            ("lost_gaps", str(sum(self.gap_lost.values()))),
            ("lost_middleware", "-" if self.middleware_lost is None else str(sum(self.middleware_lost.values()))),
            ("lost_share_10s", "-" if loss is None else f"{loss:.2f}"),
            ("skipped", str(grabber.skipped)),
            ("latency_p50_ms", "-" if p50 is None else f"{p50:.1f}"),
            ("latency_p95_ms", "-" if p95 is None else f"{p95:.1f}"),
            *extra.items(),
        ]


@dataclass
class CameraHealth:
    """What the diagnostics read of one image topic."""

    topic: str
    age_s: float | None               # since its last image; None: none yet
    period_s: float | None            # its mean frame interval; None: under two images
    rate: float | None                # images/s over the window
    received: int
    refused: int


def health(cameras: list[CameraHealth], captions_per_s: float, loss: float | None, params, waited_s: float,
           paused: bool, detections_waiting: bool = True) -> tuple[int, str]:
    """(level, message) of the node's DiagnosticStatus: ERROR when nothing arrives (no image
    for `no_image_warning` s) or every frame is refused; WARN when a camera's last image is
    older than `stale_periods` of its own periods, a rate falls below `min_rate`, more than
    `max_loss` of the frames were lost on the way, or captions stopped waiting for detections."""
    errors, warnings = [], []
    for cam in cameras:
        if cam.age_s is None:
            (errors if waited_s >= params.no_image_warning else warnings).append(
                f"no image on {cam.topic} {'after' if waited_s >= params.no_image_warning else 'yet,'} "
                f"{waited_s:.1f} s")
        elif cam.age_s >= params.no_image_warning:
            errors.append(f"no image on {cam.topic} for {cam.age_s:.1f} s")
        elif cam.period_s is not None and cam.age_s > params.stale_periods * cam.period_s:
            warnings.append(f"{cam.topic}: last image {cam.age_s:.1f} s old ({cam.period_s:.2f} s apart before)")
        if cam.received and cam.refused == cam.received:
            errors.append(f"every frame on {cam.topic} refused (encoding)")
        if params.min_rate and cam.rate is not None and cam.rate < params.min_rate:
            warnings.append(f"{cam.topic}: {cam.rate:.2f} images/s < min_rate {params.min_rate:g}")
    if params.min_rate and not paused and captions_per_s < params.min_rate and any(c.age_s is not None for c in cameras):
        warnings.append(f"{captions_per_s:.2f} captions/s < min_rate {params.min_rate:g}")
    if loss is not None and loss > params.max_loss:
        warnings.append(f"{100 * loss:.0f}% of the frames lost on the way in the last {WINDOW_S:g} s")
    if not detections_waiting:
        warnings.append("detections stopped matching: captioning without them")
    if errors:
        return ERROR, "; ".join(errors + warnings)
    if warnings:
        return WARN, "; ".join(warnings)
    return OK, "paused" if paused else "captioning"


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
    and nothing else tells). A loss shows when the publisher's next frame arrives; a publisher
    that falls silent is caught by the diagnostics' age thresholds instead."""

    def __init__(self):
        self._last: dict[str, int] = {}
        self.lost = 0

    def note(self, publisher: str, sequence: int | None) -> int:
        """Frames of `publisher` lost just before this one (0 when the rmw does not number them)."""
        if not sequence:
            return 0
        last = self._last.get(publisher)
        lost = sequence - last - 1 if last is not None and sequence > last + 1 else 0
        self.lost += lost
        if last is None or sequence > last:
            self._last[publisher] = sequence
        return lost
