"""Freshness first: a capture thread that keeps only the newest frame.

The thread reads the source and overwrites a one-slot buffer under a lock, stamping each frame
with a frame id and its capture time. The consumer takes whatever is newest; a frame it never
took is counted as dropped. So a slow captioner never works on a stale frame: the frame it
takes was published before the next one existed, and its caption is ready at most one
inference period plus one capture interval after capture (tests/test_runtime_camera.py).

Pacing (`pace`):
    "live"    the device sets the rate (cameras, streams): read as fast as it delivers
    "native"  release file / folder / synth frames at the source's fps, as a camera would; a
              timed source (a robot log) releases each frame at its recorded time instead
    "every"   hand over every frame: the reader waits until the consumer took the last one,
              so nothing is dropped and a file is read as fast as it can be captioned

A stream that drops is closed and reopened with exponential back-off (bounded delay, and a
bounded total time before giving up); nothing is published meanwhile, never a black or
repeated frame. An undecodable frame is skipped and counted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgecap.errors import EdgecapError

from .sources import (
    ACVRSource,
    BadFrame,
    EndOfStream,
    FolderSource,
    KnownObject,
    LogStamp,
    Source,
    StreamLost,
)

PACES = ("native", "every", "live")


def default_pace(source: Source) -> str:
    """Cameras run live; folders and ACVR caption every frame; videos, synth and robot logs
    play at their own rate."""
    if source.live:
        return "live"
    return "every" if isinstance(source, (ACVRSource, FolderSource)) else "native"


@dataclass
class Frame:
    image: np.ndarray                     # HxWx3 uint8 BGR
    frame_id: int                         # source position when it has one, else capture count
    t_capture: float                      # time.monotonic() when the frame was published
    wall_time: float                      # time.time() at the same moment
    objects: list[KnownObject] | None = None
    image_id: str | None = None
    t_taken: float | None = None          # time.monotonic() when the consumer took it
    stamp: LogStamp | None = None         # logged images: header stamp, log time, camera frame


@dataclass(frozen=True)
class Backoff:
    """Reopen delays: first, first*2, ... capped at `max_delay`; give up after `give_up` s."""

    first: float = 0.1
    max_delay: float = 5.0
    give_up: float = 60.0

    def delays(self):
        delay = self.first
        while True:
            yield delay
            delay = min(delay * 2.0, self.max_delay)


@dataclass
class GrabberStats:
    captured: int = 0      # frames published to the slot
    taken: int = 0         # frames the consumer took
    dropped: int = 0       # published, then overwritten (or left at close) before being taken
    skipped: int = 0       # undecodable frames
    reopens: int = 0       # successful reopens after a lost stream
    last_skip: str = ""

    def to_json(self) -> dict:
        return {"captured": self.captured, "taken": self.taken, "dropped": self.dropped,
                "skipped": self.skipped, "reopens": self.reopens}

    @classmethod
    def total(cls, parts) -> GrabberStats:
        """Several cameras' counts added up (a run of several sources, the ROS node's topics)."""
        total = cls()
        for part in parts:
            for name in ("captured", "taken", "dropped", "skipped", "reopens"):
                setattr(total, name, getattr(total, name) + getattr(part, name))
        return total


class FrameGrabber:
    """Runs `source` on a thread; `get()` returns the newest frame not yet taken.

    `source` must be open before `start()` (so a source that cannot open fails before any
    thread exists); `close()` releases it. `on_publish(frame)` is called under the lock for
    every published frame (tests and diagnostics).
    """

    def __init__(self, source: Source, pace: str = "native", backoff: Backoff = Backoff(),
                 on_publish: Callable[[Frame], None] | None = None, log=None):
        if pace not in PACES:
            raise EdgecapError(f"pace {pace!r}; expected one of {', '.join(PACES)}")
        if pace != "live" and source.live:
            raise EdgecapError(f"--pace {pace} needs a file, folder, ACVR or synth source; "
                               f"{source.name} is live and runs at its own rate")
        if pace == "native" and not (source.fps or source.timed):
            raise EdgecapError(f"--pace native: {source.name} has no frame rate; "
                               "give --source-fps or use --pace every")
        self.source = source
        self.pace = pace
        self.backoff = backoff
        self.on_publish = on_publish
        self.log = log or (lambda msg: None)
        self.stats = GrabberStats()
        self.error: Exception | None = None   # why the stream ended, if not end of file
        self.last_publish: float | None = None  # time.monotonic() of the newest frame (or start)
        self._cond = threading.Condition()
        self._slot: Frame | None = None
        self._ended = False
        self._stop = threading.Event()
        self._count = 0
        self._thread = threading.Thread(target=self._run, name="edgecap-capture", daemon=True)
        self._released = False

    # -- consumer side -------------------------------------------------------------------
    def start(self) -> FrameGrabber:
        self.last_publish = time.monotonic()
        self._thread.start()
        return self

    def get(self, timeout: float | None = None) -> Frame | None:
        """The newest untaken frame; None on timeout or when the stream is over."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._slot is not None or self._ended, timeout):
                return None
            frame, self._slot = self._slot, None
            if frame is None:
                return None
            frame.t_taken = time.monotonic()
            self.stats.taken += 1
            self._cond.notify_all()
            return frame

    @property
    def finished(self) -> bool:
        """The stream is over and its last frame was taken (or dropped)."""
        with self._cond:
            return self._ended and self._slot is None

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread, join it and release the device. Idempotent."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        with self._cond:
            if self._slot is not None:
                if self.pace == "every":
                    # read ahead while the last caption was made; the run ended before it was
                    # due, so it was never part of it: neither captured nor dropped
                    self.stats.captured -= 1
                else:
                    self.stats.dropped += 1
                self._slot = None
            self._ended = True
        if self._thread.is_alive():
            # Blocked inside the device read; releasing under it would crash OpenCV. The
            # thread is a daemon and exits with the process.
            self.log(f"capture thread did not stop within {timeout:g} s; leaving {self.source.name} open")
            return
        if not self._released:
            self._released = True
            self.source.close()

    def __enter__(self) -> FrameGrabber:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- capture thread ------------------------------------------------------------------
    def _run(self) -> None:
        start = None  # when the first frame was read: opening a log can take a while
        reads = 0
        try:
            while not self._stop.is_set():
                try:
                    captured = self.source.read()
                except EndOfStream:
                    break
                except BadFrame as exc:
                    reads += 1
                    self.stats.skipped += 1
                    self.stats.last_skip = str(exc)
                    self.log(f"skipped: {exc}")
                    continue
                except StreamLost as exc:
                    if not self._reopen(exc):
                        break
                    continue
                reads += 1
                if self.pace == "native":
                    # Frame k is due k / fps after the first. A reader that fell behind
                    # publishes without sleeping until it is back on schedule, so the file
                    # position follows the wall clock, as a camera's would.
                    offset = captured.due if captured.due is not None \
                        else (reads - 1) / float(self.source.fps)
                    if start is None:
                        start = time.monotonic() - offset
                    due = start + offset
                    if self._stop.wait(max(0.0, due - time.monotonic())):
                        break
                self._publish(captured)
        except Exception as exc:  # a source bug must end the run visibly, not hang it
            self.error = exc
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def _publish(self, captured) -> None:
        with self._cond:
            if self.pace == "every":
                self._cond.wait_for(lambda: self._slot is None or self._stop.is_set())
                if self._stop.is_set():
                    return
            if self._slot is not None:
                self.stats.dropped += 1
            frame_id = captured.index if captured.index is not None else self._count
            self._count += 1
            frame = Frame(captured.image, int(frame_id), time.monotonic(), time.time(),
                          captured.objects, captured.image_id, stamp=captured.stamp)
            self._slot = frame
            self.last_publish = frame.t_capture
            self.stats.captured += 1
            if self.on_publish is not None:
                self.on_publish(frame)
            self._cond.notify_all()

    def _reopen(self, reason: Exception) -> bool:
        self.log(f"{self.source.name}: stream lost ({reason}); reopening")
        began = time.monotonic()
        last: Exception = reason
        for attempt, delay in enumerate(self.backoff.delays(), 1):
            self.source.close()
            if time.monotonic() - began + delay > self.backoff.give_up:
                self.error = EdgecapError(
                    f"source {self.source.name} lost and not back after {attempt - 1} "
                    f"reopen attempts over {time.monotonic() - began:.1f} s: {last}")
                return False
            if self._stop.wait(delay):
                return False
            try:
                self.source.open()
            except Exception as exc:  # still down: wait longer
                last = exc
                continue
            self.stats.reopens += 1
            self.log(f"{self.source.name}: reopened after {attempt} attempt(s)")
            return True
        return False  # pragma: no cover - delays() never ends
