"""Metric observers: call them with each batch of transitions a driver makes.

Each is a callable with `result()` and `reset()`, in the spirit of TF-Agents'
`py_metrics`. Episodes are tracked per sub-environment (the batch row), so a
vector env's interleaved episodes are kept apart:

    returns = AverageReturn()
    driver = StepDriver(env, policy, observers=[rb.add_batch, returns])
    driver.run(); returns.result()

`call_observers` is how a driver calls them: every observer gets every batch,
even when one of them raises.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Callable, Sequence

import numpy as np

from tfreplay._src import specs


def observer_name(observer: Callable) -> str:
    """A short name for error messages: `list.append`, `AverageReturn`, `my_fn`."""
    owner = getattr(observer, "__self__", None)
    if owner is not None and not isinstance(owner, type) and hasattr(observer, "__name__"):
        return f"{type(owner).__name__}.{observer.__name__}"
    return getattr(observer, "__qualname__", None) or type(observer).__name__


def call_observers(where: str, observers: Sequence[Callable], batch: Any) -> None:
    """Calls every observer with `batch`, in order, even if some raise.

    A failure cannot be undone in the observers that already took the batch,
    so the others take it too: afterwards only the failing observers miss it.
    The first failure is then re-raised (same exception, same type) with a
    note naming the observers that raised and those that received the batch.

    Raises:
      Exception: the first observer's exception; `BaseException`s that are not
        `Exception`s (KeyboardInterrupt) propagate at once.
    """
    failures: dict[int, Exception] = {}
    for i, observer in enumerate(observers):
        try:
            observer(batch)
        except Exception as raised:  # re-raised below, once the others have the batch
            failures[i] = raised
    if failures:
        first = next(iter(failures.values()))
        _add_note(first, _failure_note(where, observers, failures))
        raise first


def _failure_note(where: str, observers: Sequence[Callable], failures: dict[int, Exception]) -> str:
    label = lambda i: f"{i} ({observer_name(observers[i])})"  # noqa: E731
    first, *others = failures
    lines = [f"{where}: observer {label(first)} raised on this step."]
    lines += [f"Observer {label(i)} raised too: {type(failures[i]).__name__}: {failures[i]}." for i in others]
    received = [label(i) for i in range(len(observers)) if i not in failures]
    if received:
        lines.append(f"Observer{'s' if len(received) > 1 else ''} {', '.join(received)} received the batch.")
    else:
        lines.append("No other observer received the batch.")
    lines.append("The step is counted and the next run() continues with the next step.")
    return " ".join(lines)


def _add_note(error: BaseException, note: str) -> None:
    # BaseException.add_note is Python 3.11+; before, tools such as pytest still read __notes__.
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # pragma: no cover (Python < 3.11)
        error.__notes__ = [*getattr(error, "__notes__", []), note]  # type: ignore[attr-defined]


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
