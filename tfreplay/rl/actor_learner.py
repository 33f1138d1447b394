"""Collect and learn at once: collector threads and a learner thread around one rate-limited buffer.

    limiter = tfreplay.SampleToInsertRatio(samples_per_insert, min_size_to_sample, error_buffer)
    rb = tfreplay.TFUniformReplayBuffer(spec, batch_size=4, max_length=10_000, rate_limiter=limiter)
    run = ActorLearner(rb, limiter, learn, samples_per_call, [Actor(collect, 4, actor_net.set_weights)],
                       weights=agent.q_network.get_weights, pull_every=100, num_env_steps=50_000)
    with run:
        while run.wait_for(run.env_steps + 1_000) < 50_000:
            with run.paused():
                evaluate()                          # both sides between calls: the weights hold still

The learner thread calls `learn()` (a `tfreplay.TrainLoop`, say) over and
over; each `Actor` thread calls its `collect()` (a `StepDriver.run` whose
observer is the buffer's `add_batch`), which returns the env steps it made.
The buffer's rate limiter keeps the samples per inserted item at its ratio,
within its error range: the learner waits for the collectors and the
collectors for the learner. Every `pull_every` env steps an actor asks for
the learner's weights; the learner reads `weights()` after the call it is
in, and the actor takes them (`set_weights`) before its next collect call.
So an actor acts with weights at most `pull_every` of its steps, plus the
steps of the collect calls during one learner call, old; and the learner
reads its weights only as often as actors pull (a read is eager ops that
wait for the GIL, which a collector thread holds while it steps).

Each side checks the limiter's counts before a call and waits for room on
this object's condition, not inside the buffer: so `close()` and
`paused()` find both sides between calls, and the time split (`seconds`)
leaves the waits out. For that an actor declares its `inserts_per_call`
(the items one `collect()` adds) and the learner its `samples_per_call`.

Threads overlap where the work releases the GIL: TensorFlow ops do (the
learner's graph call, the policy's forward pass, `add_batch`), while a
Python environment's step holds it. An environment whose step is heavy
Python should run in processes instead: `tfreplay.rl.collectors` runs
drivers in Ray actors feeding `tfreplay.distributed`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf

from tfreplay import RateLimiter
from tfreplay._src import specs
from tfreplay.rl._busy import BusyClock

__all__ = ["Actor", "ActorLearner"]

_GRACE = 10.0  # seconds close() waits for a call to end before it closes the buffer to wake it


@dataclasses.dataclass
class Actor:
    """One collector thread's work.

    Attributes:
      collect: `collect() -> int`: steps environments, adds the transitions
        to the buffer and returns the env steps it made.
      inserts_per_call: items one `collect()` adds to the buffer (a driver of
        `num_steps` transitions over a buffer of `batch_size` segments adds
        `num_steps`).
      set_weights: takes the learner's published weights; None: the actor
        never pulls (it acts with the learner's own network, say).
    """

    collect: Callable[[], int]
    inserts_per_call: int
    set_weights: Callable[[Any], None] | None = None


class ActorLearner:
    """Runs a learner and its collectors at once, on threads; see the module docstring.

    Args:
      buffer: the buffer the actors add to and the learner samples; closed only
        by `close()` when a call cannot end otherwise (see there).
      limiter: the buffer's rate limiter (e.g. a `SampleToInsertRatio`).
      learn: one learner call; what it returns is kept as `last_result`.
      samples_per_call: samples one `learn()` draws (`steps_per_call *
        sample_batch_size` for a `TrainLoop`).
      actors: one `Actor` per collector thread.
      weights: `weights() -> weights`, read on the learner thread after a
        call when an actor asked, and handed to the actors' `set_weights`;
        None: no pulls.
      pull_every: env steps of an actor between its asks for weights.
      num_env_steps: the actors stop once this many env steps are made (all
        actors together); None: they run until `close()`.

    Raises:
      TypeError: a limiter that is no `tfreplay.RateLimiter`.
      ValueError: no actors, or a count that is not a positive integer.
    """

    def __init__(
        self,
        buffer: Any,
        limiter: RateLimiter,
        learn: Callable[[], Any],
        samples_per_call: int,
        actors: Sequence[Actor],
        *,
        weights: Callable[[], Any] | None = None,
        pull_every: int = 1_000,
        num_env_steps: int | None = None,
    ):
        if not isinstance(limiter, RateLimiter):
            raise TypeError(f"ActorLearner: limiter ({limiter!r}) must be a tfreplay.RateLimiter, the buffer's own.")
        if not actors:
            raise ValueError("ActorLearner: actors (empty) must hold at least one Actor.")
        specs.check_positive_int("ActorLearner", "samples_per_call", samples_per_call)
        specs.check_positive_int("ActorLearner", "pull_every", pull_every)
        for i, actor in enumerate(actors):
            specs.check_positive_int("ActorLearner", f"actors[{i}].inserts_per_call", actor.inserts_per_call)
        if num_env_steps is not None:
            specs.check_positive_int("ActorLearner", "num_env_steps", num_env_steps)
        self._buffer, self._limiter, self._learn, self._samples = buffer, limiter, learn, int(samples_per_call)
        self._actors, self._weights, self._pull_every = list(actors), weights, int(pull_every)
        self._limit = num_env_steps
        self._cond = threading.Condition()
        self._stop = self._paused = self._learning = self._raised = self._asked = False
        self._collecting = self._reserved = self._env_steps = self._calls = self._done = 0
        self._error: BaseException | None = None
        self._published: tuple[int, Any] = (0, None)
        self.last_result: Any = None
        self._clock = BusyClock()
        self.seconds = self._clock.seconds
        self._threads: list[threading.Thread] = []

    @property
    def env_steps(self) -> int:
        """Env steps the actors made so far."""
        return self._env_steps

    @property
    def learner_calls(self) -> int:
        """`learn()` calls finished so far."""
        return self._calls

    def start(self) -> ActorLearner:
        """Starts the learner thread and one thread per actor."""
        if self._threads:
            raise ValueError("ActorLearner.start: the threads (started) must be started once.")
        self._clock.restart()
        self._threads = [threading.Thread(target=self._guard, args=(self._learner,), name="learner", daemon=True)]
        for i, actor in enumerate(self._actors):
            args = (self._collector, actor)
            self._threads.append(threading.Thread(target=self._guard, args=args, name=f"actor-{i}", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def __enter__(self) -> ActorLearner:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def wait_for(self, env_steps: int, timeout: float | None = None) -> int:
        """Waits until the actors made `env_steps` env steps (or all stopped at `num_env_steps`, or `timeout`
        seconds passed); returns the env steps made.

        Raises:
          Exception: what `learn()`, a `collect()` or a `set_weights()` raised; both sides are stopped then.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._env_steps < env_steps and self._done < len(self._actors) and self._error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            self._raise()
            return self._env_steps

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Holds both sides between calls for the block (an evaluation, a checkpoint): no call runs in it."""
        with self._cond:
            self._paused = True
            while (self._collecting or self._learning) and self._error is None:
                self._cond.wait()
            self._tick()
        try:
            yield
        finally:
            with self._cond:
                self._paused = False
                self._tick()
                self._cond.notify_all()

    def close(self) -> None:
        """Stops both sides once their current calls end and joins the threads; idempotent.

        A call still running after a grace period (one waiting inside the buffer for a side that has
        stopped: an actor adding more than its `inserts_per_call`) is woken by closing the buffer.

        Raises:
          Exception: what a side raised, unless `wait_for` raised it already.
        """
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        deadline = time.monotonic() + _GRACE
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        if any(thread.is_alive() for thread in self._threads):
            self._buffer.close()  # wakes a wait inside the buffer: it raises BufferClosedError
            for thread in self._threads:
                thread.join()
        with self._cond:
            self._tick()
            self._raise()

    def weights(self) -> tuple[int, Any]:
        """The learner's newest published weights and their version (the calls made when they were read; `(0, None)`
        before an actor first asked)."""
        return self._published

    # The threads.
    def _guard(self, body: Callable[..., None], *args: Any) -> None:
        """Runs a side; its first error (not one of stopping) is kept, and both sides stop."""
        try:
            body(*args)
        except BaseException as error:  # noqa: BLE001  (re-raised on the caller's thread)
            with self._cond:
                closing = self._stop and isinstance(error, tf.errors.OutOfRangeError)  # BufferClosedError
                if self._error is None and not closing:
                    self._error = error
                self._stop = True
                self._cond.notify_all()

    def _learner(self) -> None:
        while self._enter("learn", 0):
            try:
                result = self._learn()
                with self._cond:  # read only when an actor asked: reading weights costs eager ops and the GIL
                    asked, self._asked = self._asked, False
                weights = self._weights
                published = (self._calls + 1, weights()) if asked and weights is not None else self._published
            finally:
                self._leave("learn", 0)
            with self._cond:
                self.last_result, self._published = result, published
                self._calls += 1

    def _collector(self, actor: Actor) -> None:
        since_pull, asked = 0, None  # asked: the learner's calls when this actor asked for its weights
        try:
            while True:
                if actor.set_weights is not None and since_pull >= self._pull_every:
                    newest, weights = self._published
                    if asked is not None and newest > asked:  # read after a call that ended after the ask
                        actor.set_weights(weights)
                        since_pull, asked = 0, None
                    elif asked is None:
                        with self._cond:
                            self._asked, asked = True, self._calls
                if not self._enter("collect", actor.inserts_per_call):
                    return
                steps = 0
                try:
                    steps = int(actor.collect())
                finally:
                    self._leave("collect", actor.inserts_per_call, steps)
                since_pull += steps
        finally:
            with self._cond:
                self._done += 1
                self._cond.notify_all()

    def _enter(self, side: str, inserts: int) -> bool:
        """Waits until the side's next call fits the limiter (and no pause holds it); False: stop."""
        with self._cond:
            while True:
                if self._stop or (side == "collect" and self._limit is not None and self._env_steps >= self._limit):
                    return False
                if not self._paused and self._fits(side, inserts):
                    break
                self._cond.wait(0.05)  # the counts may move without a notice (a restore, a caller's own call)
            self._tick()
            if side == "learn":
                self._learning = True
            else:
                self._collecting += 1
                self._reserved += inserts
            return True

    def _leave(self, side: str, inserts: int, steps: int = 0) -> None:
        with self._cond:
            self._tick()
            if side == "learn":
                self._learning = False
            else:
                self._collecting -= 1
                self._reserved -= inserts
                self._env_steps += steps
            self._cond.notify_all()

    def _fits(self, side: str, inserts: int) -> bool:
        """Whether the limiter admits the call now, counting the inserts of the actors' calls in flight (so a
        call that starts is admitted without waiting inside the buffer)."""
        info, limiter = self._limiter.info(), self._limiter
        if info.closed:
            return True  # the call raises BufferClosedError at once
        if side == "learn":
            return info.size >= limiter.min_size_to_sample and info.error - self._samples >= info.min_diff
        coming = info.pending_inserts + self._reserved
        if info.size + coming < limiter.min_size_to_sample:
            return True
        return (info.inserts + coming + inserts) * limiter.samples_per_insert - info.samples <= info.max_diff

    def _tick(self) -> None:
        """Adds the time since the last change of who is busy to `seconds` (under the condition's lock)."""
        self._clock.tick(self._collecting > 0, self._learning)

    def _raise(self) -> None:
        if self._error is not None and not self._raised:
            self._raised = True
            raise self._error
