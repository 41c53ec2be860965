"""The captioning loop: newest frames in, caption records out.

    take up to `batch` fresh frames from the FrameGrabber (waiting for each to be newest)
    caption them (Captioner), stamp capture-to-caption latency
    attach known objects (source ground truth or --detections) and score coverage
    hand each Record to the sinks (console, JSONL, video, window)

`max_fps` spaces the takes; frames that arrive meanwhile are overwritten (dropped), so the
caption is always of a fresh frame.

Several cameras (`run_cameras`): each round takes the newest untaken frame of every camera that
has one and captions them together (the Captioner pads the static batch; padding rows are never
reported). A round starts as soon as any camera has a fresh frame, so a camera that stalls or
fails never holds the others back; a finished or failed camera leaves the round and is reported
in its own summary. A `BeamGovernor` lowers the beam when capture-to-caption
latency runs over a budget and raises it again when there is room. `stop` (a threading.Event,
set by SIGINT / SIGTERM in the CLI) ends the loop between batches; the summary is always
returned.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .camera import Frame, FrameGrabber
from .captioner import Captioner
from .records import Record, Summary


@dataclass
class LoopOptions:
    batch: int = 1
    max_fps: float | None = None
    frames: int | None = None               # stop after this many captions
    latency_budget_ms: float | None = None


class BeamGovernor:
    """Beam size under a latency budget.

    Over budget (mean of the last `window` latencies) -> beam - 1, down to 1. Under
    `relax` x budget for `window` frames in a row -> beam + 1, up to the requested beam. After
    every change it waits a full window, so one slow frame cannot make it oscillate.
    """

    def __init__(self, beam: int, budget_ms: float | None, window: int = 4, relax: float = 0.6):
        self.max_beam = beam
        self.beam = beam
        self.budget = budget_ms
        self.window = window
        self.relax = relax
        self._recent: list[float] = []
        self.changes = 0

    def update(self, latency_ms: float) -> int:
        if self.budget is None:
            return self.beam
        self._recent.append(latency_ms)
        if len(self._recent) < self.window:
            return self.beam
        self._recent = self._recent[-self.window:]
        mean = sum(self._recent) / len(self._recent)
        if mean > self.budget and self.beam > 1:
            self.beam -= 1
        elif max(self._recent) < self.relax * self.budget and self.beam < self.max_beam:
            self.beam += 1
        else:
            return self.beam
        self.changes += 1
        self._recent = []
        return self.beam


def _take_batch(grabber: FrameGrabber, n: int, stop: threading.Event) -> list[Frame]:
    frames: list[Frame] = []
    while len(frames) < n and not stop.is_set():
        frame = grabber.get(timeout=0.05)
        if frame is not None:
            frames.append(frame)
        elif grabber.finished:
            break
    return frames


@dataclass
class Camera:
    """One source of a multi-camera run: its grabber and its own summary."""

    name: int                         # its position in --source: its records' "camera" field
    grabber: FrameGrabber
    summary: Summary
    stalled_since: float | None = None
    reported: bool = False            # its end (or failure) was logged

    @property
    def label(self) -> str:
        return f"{self.name} ({self.summary.source})"


def _deliver(frames: list[Frame], captions, summaries, cameras: list[int | None], sinks,
             t_done: float, annotate_objects, coverage, governor: BeamGovernor) -> None:
    """Records of one captioned batch: objects, coverage, summaries, sinks, the beam governor."""
    known = None
    if annotate_objects is not None:  # --detections or --detector replaces the source's own objects
        start = time.perf_counter()
        known = annotate_objects(frames)  # one call per batch: a detector runs every camera's frame at once
        key = getattr(annotate_objects, "latency_key", None)
        for caption in captions if key else ():
            caption.latency_ms[key] = (time.perf_counter() - start) * 1e3
    for i, (frame, caption, counted, camera) in enumerate(zip(frames, captions, summaries, cameras, strict=True)):
        if known is not None:
            frame.objects = known[i]
        record = Record(frame, caption, counted[-1].source, t_done, camera=camera)  # the camera's own
        scored = coverage.score(caption.text, frame.objects) if coverage is not None else None
        if scored is not None:
            record.coverage, record.matches = scored
        for summary in counted:
            summary.add(record)
        for sink in sinks:
            sink(record)
        governor.update(record.capture_to_caption_ms)


def _stop_reason(stop: threading.Event, options: LoopOptions, summary: Summary, period: float,
                 next_take: float) -> str | None:
    """Why the loop stops before its next take (None: it goes on); with --max-fps it first
    waits for the take's time, a signal cutting the wait short."""
    if stop.is_set():
        return "signal"
    if options.frames is not None and summary.captioned >= options.frames:
        return f"--frames {options.frames}"
    if period and stop.wait(max(0.0, next_take - time.monotonic())):
        return "signal"
    return None


def run_loop(captioner: Captioner, grabber: FrameGrabber, summary: Summary,
             sinks: list[Callable[[Record], None]], options: LoopOptions,
             stop: threading.Event, annotate_objects=None, coverage=None,
             beam: int | None = None) -> Summary:
    """Caption until the source ends, `options.frames` captions are done, or `stop` is set.

    annotate_objects(frames) -> [objects | None per frame] replaces the frames' objects (--detections,
    --detector); with a `latency_key` its time goes into each caption's latency_ms under that key;
    coverage.score(caption, objects) -> (coverage, matches) | None.
    """
    governor = BeamGovernor(beam or captioner.beam, options.latency_budget_ms)
    period = 1.0 / options.max_fps if options.max_fps else 0.0
    next_take = time.monotonic()
    reason = None
    while reason is None:
        reason = _stop_reason(stop, options, summary, period, next_take)
        if reason is not None:
            break
        want = options.batch
        if options.frames is not None:
            want = min(want, options.frames - summary.captioned)
        frames = _take_batch(grabber, want, stop)
        if not frames:
            if stop.is_set():
                reason = "signal"
            else:
                reason = "source error" if grabber.error else "end of source"
            break
        next_take = frames[0].t_taken + period
        captions = captioner.caption([f.image for f in frames], beam=governor.beam)
        _deliver(frames, captions, [(summary,)] * len(frames), [None] * len(frames), sinks,
                 time.monotonic(), annotate_objects, coverage, governor)
    summary.stopped_by = reason
    summary.beam_changes = governor.changes
    return summary


def _take_round(cameras: list[Camera], want: int, start: int) -> list[tuple[Camera, Frame]]:
    """The newest untaken frame of each camera that has one, at most `want`, polling from
    camera `start` on so that a --frames limit does not always favour the first camera."""
    taken = []
    for k in range(len(cameras)):
        if len(taken) >= want:
            break
        camera = cameras[(start + k) % len(cameras)]
        frame = camera.grabber.get(timeout=0)
        if frame is not None:
            taken.append((camera, frame))
    return taken


def _check_cameras(cameras: list[Camera], now: float, stall_s: float, log) -> list[Camera]:
    """The cameras still running; a camera that ended or failed is logged once and its summary
    says why; one that has published nothing for `stall_s` is logged once per stall."""
    running = []
    for camera in cameras:
        grabber = camera.grabber
        if grabber.finished:
            if not camera.reported:
                camera.reported = True
                if grabber.error is not None:
                    camera.summary.stopped_by = "source error"
                    log(f"camera {camera.label} failed: {grabber.error}; the others go on")
                else:
                    camera.summary.stopped_by = "end of source"
                    log(f"camera {camera.label} ended")
            continue
        running.append(camera)
        last = grabber.last_publish
        if last is not None and now - last > stall_s:
            if camera.stalled_since is None:
                camera.stalled_since = last
                camera.summary.stalls += 1
                log(f"camera {camera.label}: no frame for {now - last:.1f} s; the others go on")
        elif camera.stalled_since is not None and last is not None and last > camera.stalled_since:
            camera.stalled_since = None
            log(f"camera {camera.label}: frames again")
    return running


def run_cameras(captioner: Captioner, cameras: list[Camera], summary: Summary,
                sinks: list[Callable[[Record], None]], options: LoopOptions, stop: threading.Event,
                fresh: threading.Event, annotate_objects=None, coverage=None, beam: int | None = None,
                stall_s: float = 2.0, log=None) -> Summary:
    """Caption several cameras, one frame of each per round, until every camera has ended,
    `options.frames` captions are done (all cameras together), or `stop` is set.

    `fresh` is set by the grabbers whenever one publishes a frame (their `on_publish`), so an
    idle loop wakes for the first new frame of any camera. `summary` counts every record; each
    camera's own summary counts its records, drops, stalls and why it stopped.
    """
    log = log or (lambda msg: None)
    governor = BeamGovernor(beam or captioner.beam, options.latency_budget_ms)
    period = 1.0 / options.max_fps if options.max_fps else 0.0
    next_take = time.monotonic()
    reason, rounds = None, 0
    running = list(cameras)
    while reason is None:
        reason = _stop_reason(stop, options, summary, period, next_take)
        if reason is not None:
            break
        want = len(running)
        if options.frames is not None:
            want = min(want, options.frames - summary.captioned)
        fresh.clear()  # before polling: a frame published after this wakes the wait below
        taken = _take_round(running, want, rounds)
        running = _check_cameras(running, time.monotonic(), stall_s, log)
        if not taken:
            if not running:
                reason = "end of source"
            else:
                fresh.wait(0.05)
            continue
        rounds += 1
        frames = [frame for _, frame in taken]
        next_take = min(f.t_taken for f in frames) + period
        captions = captioner.caption([f.image for f in frames], beam=governor.beam)
        _deliver(frames, captions, [(summary, camera.summary) for camera, _ in taken],
                 [camera.name for camera, _ in taken], sinks, time.monotonic(), annotate_objects,
                 coverage, governor)
    for camera in running:
        camera.summary.stopped_by = reason
    if reason == "end of source" and all(c.grabber.error is not None for c in cameras):
        reason = "source error"
    summary.stopped_by = reason
    summary.beam_changes = governor.changes
    summary.rounds = rounds
    return summary
