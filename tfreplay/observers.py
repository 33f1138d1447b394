"""Metric observers: call them with each batch of transitions a driver makes.

Each is a callable with `result()` and `reset()`, in the spirit of TF-Agents'
`py_metrics`. Episodes are tracked per sub-environment (the batch row), so a
vector env's interleaved episodes are kept apart:

    returns = AverageReturn()
    driver = StepDriver(env, policy, observers=[rb.add_batch, returns])
    driver.run(); returns.result()
"""

from __future__ import annotations

import collections
import time
from typing import Any

import numpy as np

from tfreplay.core import specs


class _EpisodeMetric:
    """Accumulates a per-row value over each episode; averages the last few."""

    def __init__(self, buffer_size: int = 10):
        specs.check_positive_int(type(self).__name__, "buffer_size", buffer_size)
        self._finished: collections.deque = collections.deque(maxlen=buffer_size)
        self._running: np.ndarray | None = None

    def _increment(self, transitions: Any) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, transitions: Any) -> None:
        step = self._increment(transitions)
        if self._running is None or self._running.shape != step.shape:
            self._running = np.zeros(step.shape, np.float64)
        first = np.asarray(transitions.step_type) == 0
        self._running[first] = 0.0  # a new episode starts in this row
        self._running += step
        done = np.logical_or(transitions.terminated, transitions.truncated)
        self._finished.extend(self._running[done].tolist())
        self._running[done] = 0.0

    def result(self) -> float:
        """Mean over the last `buffer_size` finished episodes (nan before any)."""
        return float(np.mean(self._finished)) if self._finished else float("nan")

    @property
    def num_finished(self) -> int:
        """How many finished episodes the mean covers (at most `buffer_size`)."""
        return len(self._finished)

    def reset(self) -> None:
        self._finished.clear()
        self._running = None


class AverageReturn(_EpisodeMetric):
    """Average undiscounted return of the last `buffer_size` finished episodes."""

    def _increment(self, transitions: Any) -> np.ndarray:
        return np.asarray(transitions.reward, np.float64)


class AverageEpisodeLength(_EpisodeMetric):
    """Average length (in steps) of the last `buffer_size` finished episodes."""

    def _increment(self, transitions: Any) -> np.ndarray:
        return np.ones(np.shape(transitions.reward), np.float64)


class StepsPerSecond:
    """Environment steps (transitions) per second since the first call or `reset()`.

    The clock starts at the first batch, so setup time is not counted.
    """

    def __init__(self) -> None:
        self._start: float | None = None
        self._last = 0.0
        self._steps = 0

    def __call__(self, transitions: Any) -> None:
        now = time.perf_counter()
        if self._start is None:
            self._start = now
        else:
            self._steps += int(np.shape(transitions.reward)[0])
        self._last = now

    def result(self) -> float:
        """Steps per second (0 before two batches were seen)."""
        elapsed = 0.0 if self._start is None else self._last - self._start
        return self._steps / elapsed if elapsed > 0 else 0.0

    def reset(self) -> None:
        self._start = None
        self._last = 0.0
        self._steps = 0


class NumSteps:
    """Counts transitions (environment steps over all sub-environments)."""

    def __init__(self) -> None:
        self.reset()

    def __call__(self, transitions: Any) -> None:
        self._count += int(np.shape(transitions.reward)[0])

    def result(self) -> int:
        return self._count

    def reset(self) -> None:
        self._count = 0
