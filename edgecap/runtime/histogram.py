"""Percentiles of a run's latencies in bounded memory.

A robot runs for weeks: keeping every capture-to-caption latency for the summary's p50/p95/p99
grew the process by about 32 bytes a frame (a float in a list), 3 MB per 100k frames, without
end. `LogHistogram` counts values in bins whose edges grow by 1% (2,315 bins from 1 us to
10,000 s: 18 kB whatever the run's length); a percentile is read off the cumulative counts and
interpolated inside its bin, so it is within 1% of numpy's exact `percentile` (the bin's width),
and exact at the extremes (the smallest and largest value are kept).
"""

from __future__ import annotations

import math

import numpy as np


class LogHistogram:
    def __init__(self, low: float = 1e-3, high: float = 1e7, growth: float = 0.01):
        self.low, self.log_growth = low, math.log1p(growth)
        self.bins = int(math.ceil(math.log(high / low) / self.log_growth))
        self.counts = np.zeros(self.bins, np.int64)
        self.n = 0
        self.smallest, self.largest = math.inf, -math.inf

    def _bin(self, value: float) -> int:
        if value <= self.low:
            return 0
        return min(self.bins - 1, int(math.log(value / self.low) / self.log_growth))

    def add(self, value: float) -> None:
        self.counts[self._bin(value)] += 1
        self.n += 1
        self.smallest, self.largest = min(self.smallest, value), max(self.largest, value)

    def __len__(self) -> int:
        return self.n

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0..100), as numpy's linear rule would place it: None when empty."""
        if not self.n:
            return None
        rank = q / 100.0 * (self.n - 1)             # 0-based position among the sorted values
        if rank <= 0:
            return self.smallest
        if rank >= self.n - 1:
            return self.largest
        cumulative = np.cumsum(self.counts)
        b = int(np.searchsorted(cumulative, rank, side="right"))
        before = cumulative[b] - self.counts[b]
        inside = (rank - before + 0.5) / self.counts[b]  # where in the bin, its values spread evenly
        lo = self.low * math.exp(b * self.log_growth)
        value = lo * math.exp(min(max(inside, 0.0), 1.0) * self.log_growth)
        return min(max(value, self.smallest), self.largest)
