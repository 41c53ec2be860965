"""Between the image subscription and the captioning loop: a newest-frame slot per topic.

The subscription's DDS reader is deep (`qos_depth`), so a transport stall followed by a burst
loses nothing on the way; its callback only drops the message into this slot, which keeps the
newest `depth` messages (default 1) and counts the ones it overwrites as dropped. So captions
stay fresh however deep the reader, and a deeper slot (`queue_depth`) captions a burst in full,
oldest first, when that matters more than freshness.

`ImageSlot` has the consumer side of the runtime's FrameGrabber (`get`, `finished`, `error`,
`last_publish`, `stats`), so the node's topics feed the same loop as `edgecap run`'s cameras
(edgecap.runtime.loop). Messages are converted when taken, on the loop's thread: an image that
is overwritten is never decoded. An undecodable message is skipped and counted; one in an
encoding the node will not caption is refused and counted; both are logged at most once per 10 s.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from edgecap.runtime.camera import Frame, GrabberStats

from .relay import CaptionRelay, ImageDecodeError, Refused
from .stats import CountedWarning


class ImageSlot:
    def __init__(self, relay: CaptionRelay, depth: int = 1, on_publish=None, log=None):
        self.relay = relay
        self.depth = depth
        self.on_publish = on_publish or (lambda item: None)
        self.log = log or (lambda msg: None)
        self.stats = GrabberStats()          # captured = received; dropped; skipped; taken
        self.refused = 0
        self.error: Exception | None = None  # never set: a topic does not end
        self.last_publish: float | None = None
        self.arrivals: deque[float] = deque(maxlen=64)   # monotonic arrival times, for the input rate
        self._items: deque = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._skips = CountedWarning("skipped")
        self._refusals = CountedWarning("refused")

    # -- subscription side (executor thread) -------------------------------------------------
    def put(self, msg, received: float, received_ns: int) -> None:
        with self._cond:
            self.stats.captured += 1
            if len(self._items) >= self.depth:
                self._items.popleft()
                self.stats.dropped += 1
            self._items.append((msg, received, received_ns))
            self.last_publish = received
            self.arrivals.append(received)
            self._cond.notify_all()
        self.on_publish(msg)

    # -- loop side ----------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> Frame | None:
        """The oldest waiting message as a Frame; None after `timeout` without one, or when it
        could not be captioned (skipped or refused, and counted)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._items or self._closed, timeout) or not self._items:
                return None
            msg, received, received_ns = self._items.popleft()
        try:
            frame = self.relay.frame(msg, received, received_ns)
        except ImageDecodeError as exc:
            self.stats.skipped += 1
            self._note(self._skips, str(exc))
            return None
        except Refused as exc:
            self.refused += 1
            self._note(self._refusals, str(exc))
            return None
        frame.t_taken = time.monotonic()
        self.stats.taken += 1
        return frame

    def discard(self) -> None:
        """Drop what waits (frames that came while captioning was paused), counted as dropped."""
        with self._cond:
            self.stats.dropped += len(self._items)
            self._items.clear()

    @property
    def finished(self) -> bool:
        with self._cond:
            return self._closed and not self._items

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self.stats.dropped += len(self._items)
            self._items.clear()
            self._cond.notify_all()

    def input_rate(self, now: float, window: float) -> float | None:
        """Images per second over the last `window` seconds (None before two arrived)."""
        recent = [t for t in list(self.arrivals) if t >= now - window]
        if len(recent) < 2:
            return None
        return (len(recent) - 1) / max(recent[-1] - recent[0], 1e-9)

    def period(self) -> float | None:
        """The mean interval between the last arrivals (None before two arrived)."""
        arrivals = list(self.arrivals)
        if len(arrivals) < 2:
            return None
        return (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)

    def _note(self, warning: CountedWarning, reason: str) -> None:
        line = warning.note(reason)
        if line:
            self.log(line)
