"""Collect the next steps while learning from the last ones, and get the run of taking turns.

    driver = StepDriver(env, EpsilonGreedyPolicy(acting, 2, epsilon=0.1, seed=0), num_steps=4, seed=0)
    run = Pipeline(driver, [rb.add_batch, returns], learn, after=evaluate_when_due,
                   weights=agent.q_network.get_weights, set_weights=acting.set_weights,
                   pull_every=100, num_env_steps=50_000, concurrent=True)
    run.run()

A run is a sequence of collects (`driver.run()`: the environments step with
the collector's network, `acting` here). After each collect the learning side
hands its batches of transitions to `observers` (the buffer's `add_batch`,
metrics), in order, then calls `learn(env_steps, new_steps)` (the learner
calls those steps earned) and `after(env_steps)` (logs, evaluations,
checkpoints; True ends the run). Every `pull_every` env steps, before a
collect, the collector's network takes the learner's weights as they were at
the pull before, one pull interval old.

`concurrent=False` runs all of it on the calling thread, a collect and then its
learning. `concurrent=True` runs the collects on a thread of their own, up to
two pull intervals ahead, while the calling thread adds, learns and handles
events in the same order. A pull hands over weights read a whole interval
earlier, so the collector seldom waits for the learner. Each learner call
still finds in the buffer exactly the collects before it, and the collector
acts with the same weights at every step, so a seeded run is the same in both
modes, step for step: collecting and learning at once changes the time, not
the run.

Threads overlap where the work releases the GIL: TensorFlow ops do (the
learner's calls, the policy's forward pass), while a Python environment's
step holds it. `tfreplay.rl.actor_learner` runs several collectors beside a
learner instead, each at its own pace, kept at a ratio by a rate limiter; its
runs differ from run to run.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from tfreplay._src import specs
from tfreplay.rl._busy import BusyClock
from tfreplay.rl.observers import call_observers

__all__ = ["Pipeline"]

_WHERE = "Pipeline"


class Pipeline:
    """Collects and learns in the order of taking turns, on one thread or two; see the module docstring.

    Args:
      driver: a `StepDriver` or `EpisodeDriver` with no observers of its own:
        the pipeline becomes its only one and hands the batches to
        `observers` on the learning side.
      observers: what each batch of transitions goes to, in order (the
        buffer's `add_batch`, metrics such as `AverageReturn`).
      learn: `learn(env_steps, new_steps)`, called after each collect's
        batches are observed: the learner calls those `new_steps` earned.
      after: `after(env_steps) -> bool`, called after `learn`: what is due at
        this step (a log, an evaluation, a checkpoint); True ends the run.
      weights: `weights() -> weights`, the learner's, read on the learning
        side; with `set_weights`, or neither.
      set_weights: `set_weights(weights)`, into the collector's network, on the
        collecting side before a collect.
      pull_every: env steps between pulls; with `concurrent=True` the collector
        runs at most twice this far ahead of the learning side.
      num_env_steps: the run ends once this many env steps are collected
        (counting `env_steps`).
      env_steps: env steps already made (a resumed run's).
      concurrent: collect on a thread of its own while the calling thread
        learns; False: take turns on the calling thread. The run is the same.

    Raises:
      TypeError: a callable argument that is not callable.
      ValueError: a driver with observers of its own, only one of `weights`
        and `set_weights`, or a count that is not a positive integer.
    """

    def __init__(
        self,
        driver: Any,
        observers: Sequence[Callable[[Any], Any]],
        learn: Callable[[int, int], Any],
        *,
        after: Callable[[int], bool] | None = None,
        weights: Callable[[], Any] | None = None,
        set_weights: Callable[[Any], Any] | None = None,
        pull_every: int = 1_000,
        num_env_steps: int,
        env_steps: int = 0,
        concurrent: bool = True,
    ):
        for name, value in (("learn", learn), ("after", after), ("weights", weights), ("set_weights", set_weights)):
            if value is not None and not callable(value):
                raise TypeError(f"{_WHERE}: {name} ({value!r}) must be callable.")
        for i, observer in enumerate(observers):
            if not callable(observer):
                raise TypeError(f"{_WHERE}: observers[{i}] ({observer!r}) must be callable with a batch.")
        if (weights is None) != (set_weights is None):
            raise ValueError(
                f"{_WHERE}: weights ({weights!r}) and set_weights ({set_weights!r}) must be given together (the "
                "collector pulls the learner's weights) or neither (it acts with the learner's own network)."
            )
        specs.check_positive_int(_WHERE, "pull_every", pull_every)
        specs.check_positive_int(_WHERE, "num_env_steps", num_env_steps)
        if isinstance(env_steps, bool) or not isinstance(env_steps, (int, np.integer)) or env_steps < 0:
            raise ValueError(f"{_WHERE}: env_steps ({env_steps!r}) must be a non-negative integer.")
        if driver.observers:
            names = ", ".join(getattr(o, "__qualname__", type(o).__name__) for o in driver.observers)
            raise ValueError(
                f"{_WHERE}: driver has observers of its own ({names}); give them to the Pipeline instead "
                "(observers=[...]), which hands each batch to them on the learning side, in order."
            )
        self._driver, self._observers, self._learn, self._after = driver, list(observers), learn, after
        self._weights, self._set_weights, self._pull_every = weights, set_weights, int(pull_every)
        self._limit, self._concurrent = int(num_env_steps), bool(concurrent)
        self._staged: list = []
        driver.add_observer(self._stage)
        self.env_steps = int(env_steps)
        self._clock = BusyClock()
        self.seconds = self._clock.seconds
        self._cond = threading.Condition()
        self._busy_sides: set = set()
        self._ran = self._stop = self._collector_done = False
        self._error: BaseException | None = None
        self._snapshots: dict[int, Any] = {}

    @property
    def concurrent(self) -> bool:
        """Whether the collects run on a thread of their own."""
        return self._concurrent

    def run(self) -> int:
        """Collects and learns until `num_env_steps` or until `after` returns True; returns the env steps.

        Raises:
          ValueError: the pipeline ran already (a pipeline runs once).
          Exception: what a collect, an observer, `learn` or `after` raised, on the calling thread, once the
            collects before it are learned from (as taking turns would have); the collector thread has ended.
        """
        if self._ran:
            raise ValueError(f"{_WHERE}.run: a pipeline (run already) runs once; make a new one for another run.")
        self._ran = True
        self._clock.restart()
        self._snapshots = {0: self._weights() if self._weights is not None else None}  # the first pull's
        if self._concurrent:
            self._run_threads()
        else:
            self._run_turns()
        return self.env_steps

    # Both modes.
    def _stage(self, batch: Any) -> None:
        """The driver's observer: keeps a copy of the batch (a vector env may write its next step into the
        arrays) for the learning side."""
        self._staged.append(tf.nest.map_structure(lambda x: np.array(x, copy=True), batch))

    def _collect(self) -> tuple[int, list]:
        with self._busy("collect"):
            self._staged = []
            steps = int(self._driver.run())
            return steps, self._staged

    def _pull_due(self, env_steps: int, last: int) -> bool:
        return self._set_weights is not None and env_steps - last >= self._pull_every

    def _learn_from(self, steps: int, batches: list) -> bool:
        """The learning side of one collect; True: the run ends."""
        with self._busy("learn"):
            for batch in batches:
                call_observers(_WHERE, self._observers, batch)
            self.env_steps += steps
            self._learn(self.env_steps, steps)
        stop = bool(self._after(self.env_steps)) if self._after is not None else False
        return stop or self.env_steps >= self._limit

    @contextlib.contextmanager
    def _busy(self, side: str) -> Iterator[None]:
        with self._cond:
            self._tick()
            self._busy_sides.add(side)
        try:
            yield
        finally:
            with self._cond:
                self._tick()
                self._busy_sides.discard(side)

    def _tick(self) -> None:
        """Adds the time since the last change of who is busy to `seconds` (under the condition's lock)."""
        self._clock.tick("collect" in self._busy_sides, "learn" in self._busy_sides)

    # Taking turns.
    def _run_turns(self) -> None:
        last_pull, pulls = self.env_steps, 0
        while self.env_steps < self._limit:
            if self._pull_due(self.env_steps, last_pull):
                pulls, last_pull = pulls + 1, self.env_steps
                self._set_weights(self._snapshots.pop(pulls - 1))  # type: ignore[misc]
                self._snapshots[pulls] = self._weights()  # type: ignore[misc]
            if self._learn_from(*self._collect()):
                return

    # Both at once.
    def _run_threads(self) -> None:
        queue: deque = deque()
        thread = threading.Thread(target=self._collector, args=(queue,), name="pipeline-collector", daemon=True)
        thread.start()
        last_pull, pulls = self.env_steps, 0
        try:
            while self.env_steps < self._limit:
                with self._cond:
                    while not queue and self._error is None and not self._collector_done:
                        self._cond.wait()
                    if not queue:  # the collector failed (or ended: nothing more comes)
                        if self._error is not None:
                            raise self._error
                        return
                    steps, batches = queue.popleft()
                if self._learn_from(steps, batches):
                    return
                weights = None
                if self._pull_due(self.env_steps, last_pull):  # read where taking turns reads them
                    pulls, last_pull = pulls + 1, self.env_steps
                    weights = self._weights()  # type: ignore[misc]
                with self._cond:
                    if pulls not in self._snapshots:
                        self._snapshots[pulls] = weights
                        self._snapshots.pop(pulls - 2, None)  # the collector took it at its pull before
                    self._cond.notify_all()  # room ahead for the collector
        finally:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            thread.join()
            with self._cond:
                self._tick()

    def _collector(self, queue: deque) -> None:
        acted = last_pull = self.env_steps
        pulls = 0
        try:
            while acted < self._limit:
                pull = self._pull_due(acted, last_pull)
                with self._cond:
                    if pull:
                        pulls, last_pull = pulls + 1, acted
                        while pulls - 1 not in self._snapshots and not self._stop:
                            self._cond.wait()  # the learning side has not reached the pull before
                    while acted - self.env_steps >= 2 * self._pull_every and not self._stop:
                        self._cond.wait()  # far enough ahead
                    if self._stop:
                        return
                    weights = self._snapshots.get(pulls - 1) if pull else None
                if pull:
                    self._set_weights(weights)  # type: ignore[misc]
                steps, batches = self._collect()
                acted += steps
                with self._cond:
                    queue.append((steps, batches))
                    self._cond.notify_all()
        except BaseException as error:  # noqa: BLE001  (raised on the learning side, after the collects before it)
            with self._cond:
                self._error = error
        finally:
            with self._cond:
                self._collector_done = True
                self._cond.notify_all()
