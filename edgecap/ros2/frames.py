"""The frames between the subscription callbacks and the captioning thread.

A KEEP_LAST queue like the subscription's own: `put` appends, dropping (and counting) the oldest
when `depth` frames wait already, so depth 1 is `edgecap run`'s newest-frame slot and a deeper
queue behind a reliable subscription lets a burst be captioned in full at the rate limit. The
queues of one node's cameras share a condition, so `take_batch` waits for whichever has a frame
and takes one from each that has (several cameras captioned as one batch).
"""

from __future__ import annotations

import threading
from collections import deque

from edgecap.runtime.camera import GrabberStats


class FrameQueue:
    def __init__(self, depth: int = 1, cond: threading.Condition | None = None):
        self._items: deque = deque()
        self._cond = cond or threading.Condition()
        self.depth = depth
        self.stats = GrabberStats()                # captured = received, dropped, skipped

    def put(self, item) -> None:
        with self._cond:
            self.stats.captured += 1
            if len(self._items) >= self.depth:
                self._items.popleft()
                self.stats.dropped += 1
            self._items.append(item)
            self._cond.notify_all()

    def take(self, timeout: float):
        """The oldest waiting frame, or None after `timeout` seconds without one."""
        batch = take_batch([self], timeout)
        return batch[0][1] if batch else None


def take_batch(queues: list[FrameQueue], timeout: float) -> list[tuple[int, object]]:
    """[(queue index, its oldest frame)] for every queue holding one, waiting up to `timeout`
    seconds for the first; [] when none came. The queues share one condition."""
    cond = queues[0]._cond
    with cond:
        cond.wait_for(lambda: any(q._items for q in queues), timeout)
        out = []
        for i, queue in enumerate(queues):
            if queue._items:
                queue.stats.taken += 1
                out.append((i, queue._items.popleft()))
        return out
