"""The captioning loop: the newest frames of one or several sources in, caption records out.

Every way of captioning feeds this one loop: `edgecap run` with one source or several
(runtime/command.py), and the ROS 2 node's image topics (edgecap/ros2/node.py). A source is
anything with a FrameGrabber's consumer side (`get`, `finished`, `error`, `last_publish`,
`stats`): the capture thread over a camera, file, folder, log or the synthetic world
(camera.py), or the node's newest-frame slot that its subscription fills (ros2/frames.py).

    each round takes the newest untaken frame of every source that has one (one source:
        up to --batch consecutive fresh frames, waiting for each)
    captions them as one batch (the Captioner pads the static batch; padding is never reported)
    stamps capture-to-caption latency, attaches known objects (the source's ground truth or
        `annotate_objects`: --detections, --detector, a detections topic) and scores coverage
    hands each Record to the sinks (console, JSONL, video, window, caption log, ROS publishers)

`max_fps` spaces the takes; frames that arrive meanwhile are overwritten (dropped), so the
caption is always of a fresh frame. A round starts as soon as any source has a fresh frame, so
one that stalls or fails never holds the others back; a finished or failed source leaves the
round and is reported in its own summary. A `BeamGovernor` lowers the beam when
capture-to-caption latency runs over a budget and raises it again when there is room.

The options are read at every round, so a caller may change them while the loop runs (the
ROS node's `max_rate`, `beam` and enable switch). `stop` (a threading.Event, set by SIGINT /
SIGTERM) ends the loop between batches; the summary is always returned.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .camera import Frame, FrameGrabber
from .captioner import Captioner
from .records import Record, Summary

PAUSE_SLICE_S = 0.05     # how long a paused or rate-limited loop waits before looking again


@dataclass
class LoopOptions:
    batch: int = 1                          # one source: consecutive fresh frames per batch
    max_fps: float | None = None            # most batches per second
    frames: int | None = None               # stop after this many captions
    latency_budget_ms: float | None = None
    beam: int | None = None                 # None: the captioner's own
    paused: bool = False                    # take nothing (frames meanwhile are dropped)


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

    def request(self, beam: int) -> int:
        """The beam asked for now (a live parameter change): the ceiling, and the beam itself
        when no budget governs it."""
        if beam != self.max_beam:
            self.max_beam = beam
            self.beam = beam if self.budget is None else min(self.beam, beam)
        return self.beam

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


@dataclass
class Camera:
    """One source of a run: its grabber and its own summary (the run's, when it is the only one)."""

    name: int | None                  # its position in --source (records' "camera"); None: the only one
    grabber: FrameGrabber
    summary: Summary
    stalled_since: float | None = None
    reported: bool = False            # its end (or failure) was logged

    @property
    def label(self) -> str:
        return f"{self.name} ({self.summary.source})"


def _take_batch(grabber: FrameGrabber, n: int, stop: threading.Event) -> list[Frame]:
    """Up to `n` fresh frames, waiting for each once the first came; [] when none came within a
    slice (the loop looks at its options again: a pause asked for meanwhile holds)."""
    frames: list[Frame] = []
    while len(frames) < n and not stop.is_set():
        frame = grabber.get(timeout=PAUSE_SLICE_S)
        if frame is not None:
            frames.append(frame)
        elif grabber.finished or not frames:
            break
    return frames


def _take_round(cameras: list[Camera], want: int, start: int, stop: threading.Event
                ) -> list[tuple[Camera, Frame]]:
    """One source: its next `want` fresh frames, waiting for each. Several: the newest untaken
    frame of each that has one, at most `want`, polling from camera `start` on so that a
    --frames limit does not always favour the first camera."""
    if len(cameras) == 1:
        return [(cameras[0], frame) for frame in _take_batch(cameras[0].grabber, want, stop)]
    taken = []
    for k in range(len(cameras)):
        if len(taken) >= want:
            break
        camera = cameras[(start + k) % len(cameras)]
        frame = camera.grabber.get(timeout=0)
        if frame is not None:
            taken.append((camera, frame))
    return taken


def _check_cameras(cameras: list[Camera], now: float, stall_s: float | None, log) -> list[Camera]:
    """The cameras still running; a camera that ended or failed is logged once and its summary
    says why; one that has published nothing for `stall_s` is logged once per stall."""
    running = []
    for camera in cameras:
        grabber = camera.grabber
        if grabber.finished:
            if not camera.reported:
                camera.reported = True
                camera.summary.stopped_by = "source error" if grabber.error is not None else "end of source"
                log(f"camera {camera.label} failed: {grabber.error}; the others go on"
                    if grabber.error is not None else f"camera {camera.label} ended")
            continue
        running.append(camera)
        last = grabber.last_publish
        if stall_s is None or last is None:
            continue
        if now - last > stall_s:
            if camera.stalled_since is None:
                camera.stalled_since = last
                camera.summary.stalls += 1
                log(f"camera {camera.label}: no frame for {now - last:.1f} s; the others go on")
        elif camera.stalled_since is not None and last > camera.stalled_since:
            camera.stalled_since = None
            log(f"camera {camera.label}: frames again")
    return running


def _deliver(taken: list[tuple[Camera, Frame]], captions, summary: Summary, sinks, t_done: float,
             annotate_objects, coverage, governor: BeamGovernor) -> None:
    """Records of one captioned batch: objects, coverage, summaries, sinks, the beam governor."""
    if annotate_objects is not None:  # --detections, --detector, a detections topic: the source's own replaced
        start = time.perf_counter()
        known = annotate_objects([frame for _, frame in taken])  # one call: a detector batches every camera's frame
        elapsed_ms, key = (time.perf_counter() - start) * 1e3, getattr(annotate_objects, "latency_key", None)
        for (_, frame), caption, objects in zip(taken, captions, known, strict=True):
            frame.objects = objects
            if key:
                caption.latency_ms[key] = elapsed_ms
    for (camera, frame), caption in zip(taken, captions, strict=True):
        record = Record(frame, caption, camera.summary.source, t_done, camera=camera.name)
        scored = coverage.score(caption.text, frame.objects) if coverage is not None else None
        if scored is not None:
            record.coverage, record.matches = scored
        for counted in {id(s): s for s in (summary, camera.summary)}.values():
            counted.add(record)
        for sink in sinks:
            sink(record)
        governor.update(record.capture_to_caption_ms)


def _stop_reason(stop: threading.Event, options: LoopOptions, summary: Summary, last_take: float
                 ) -> str | None:
    """Why the loop stops before its next take (None: it goes on). With a rate limit or while
    paused it first waits, in short slices (the options may change meanwhile), a signal
    cutting the wait short."""
    while True:
        if stop.is_set():
            return "signal"
        if options.frames is not None and summary.captioned >= options.frames:
            return f"--frames {options.frames}"
        wait = PAUSE_SLICE_S if options.paused else \
            last_take + (1.0 / options.max_fps if options.max_fps else 0.0) - time.monotonic()
        if wait <= 0:
            return None
        stop.wait(min(wait, PAUSE_SLICE_S))


def run_cameras(captioner: Captioner, cameras: list[Camera], summary: Summary,
                sinks: list[Callable[[Record], None]], options: LoopOptions, stop: threading.Event,
                fresh: threading.Event | None = None, annotate_objects=None, coverage=None,
                stall_s: float | None = 2.0, log=None) -> Summary:
    """Caption the cameras until every one has ended, `options.frames` captions are done (all
    cameras together), or `stop` is set.

    `fresh` is set by the grabbers whenever one publishes a frame (their `on_publish`), so an
    idle loop over several cameras wakes for the first new frame of any (one camera: the loop
    waits on its grabber). `summary` counts every record; each camera's own summary counts its
    records, drops, stalls and why it stopped. annotate_objects(frames) -> [objects | None per
    frame] replaces the round's objects (--detections, --detector, a detections topic); with a
    `latency_key` its time goes into each caption's latency_ms under that key (a detector's
    "detector"). coverage.score(caption, objects) -> (coverage, matches) | None.
    """
    log = log or (lambda msg: None)
    governor = BeamGovernor(options.beam or captioner.beam, options.latency_budget_ms)
    last_take, reason, rounds = float("-inf"), None, 0
    running = list(cameras)
    while reason is None:
        reason = _stop_reason(stop, options, summary, last_take)
        if reason is not None:
            break
        want = options.batch if len(running) == 1 else len(running)
        if options.frames is not None:
            want = min(want, options.frames - summary.captioned)
        if fresh is not None:
            fresh.clear()  # before polling: a frame published after this wakes the wait below
        taken = _take_round(running, want, rounds, stop)
        running = _check_cameras(running, time.monotonic(), stall_s, log)
        if not taken:
            if not running:
                reason = "end of source"
            elif fresh is not None and len(running) > 1:
                fresh.wait(PAUSE_SLICE_S)
            continue
        rounds += 1
        last_take = min(frame.t_taken for _, frame in taken)
        captions = captioner.caption([frame.image for _, frame in taken],
                                     beam=governor.request(options.beam or captioner.beam))
        _deliver(taken, captions, summary, sinks, time.monotonic(), annotate_objects, coverage, governor)
    for camera in running:
        camera.summary.stopped_by = reason
    if reason == "end of source" and all(c.grabber.error is not None for c in cameras):
        reason = "source error"
    summary.stopped_by = reason
    summary.beam_changes = governor.changes
    if len(cameras) > 1:
        summary.rounds = rounds
    return summary


def run_loop(captioner: Captioner, grabber: FrameGrabber, summary: Summary,
             sinks: list[Callable[[Record], None]], options: LoopOptions,
             stop: threading.Event, annotate_objects=None, coverage=None) -> Summary:
    """The loop over one source (`run_cameras` with one camera, whose summary is the run's)."""
    return run_cameras(captioner, [Camera(None, grabber, summary)], summary, sinks, options, stop,
                       annotate_objects=annotate_objects, coverage=coverage, stall_s=None)
