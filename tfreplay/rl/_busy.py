"""The time split of a collector and a learner working on threads: each side's busy seconds, and both at once."""

from __future__ import annotations

import time


class BusyClock:
    """`seconds`: `collect`, `learn` and `overlap` (both at once). The owner calls `tick` under its own lock
    whenever who is busy changes, saying who was busy since the last tick; waits count for neither side."""

    def __init__(self) -> None:
        self.seconds = {"collect": 0.0, "learn": 0.0, "overlap": 0.0}
        self._last = time.perf_counter()

    def restart(self) -> None:
        """Counts from now: what passed before (construction, set-up) is nobody's."""
        self._last = time.perf_counter()

    def tick(self, collecting: bool, learning: bool) -> None:
        """Adds the time since the last tick to the sides that were busy in it."""
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        self.seconds["collect"] += elapsed if collecting else 0.0
        self.seconds["learn"] += elapsed if learning else 0.0
        self.seconds["overlap"] += elapsed if collecting and learning else 0.0
