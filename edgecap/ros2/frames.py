"""The frames between the subscription callback and the captioning thread.

A KEEP_LAST queue like the subscription's own: `put` appends, dropping (and counting) the oldest
when `depth` frames wait already, so depth 1 is `edgecap run`'s newest-frame slot and a deeper
queue behind a reliable subscription lets a burst be captioned in full at the rate limit.
"""

from __future__ import annotations

import threading
from collections import deque

from edgecap.runtime.camera import GrabberStats


class FrameQueue:
    def __init__(self, depth: int = 1):
        self._items: deque = deque()
        self._cond = threading.Condition()
        self.depth = depth
        self.stats = GrabberStats()                # captured = received, dropped, skipped

    def put(self, item) -> None:
        with self._cond:
            self.stats.captured += 1
            if len(self._items) >= self.depth:
                self._items.popleft()
                self.stats.dropped += 1
            self._items.append(item)
            self._cond.notify()

    def take(self, timeout: float):
        """The oldest waiting frame, or None after `timeout` seconds without one."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._items, timeout):
                return None
            self.stats.taken += 1
            return self._items.popleft()

    def wake(self) -> None:
        """Let a waiting `take` return at once (shutdown)."""
        with self._cond:
            self._cond.notify_all()
