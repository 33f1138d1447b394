"""A buffer's side of its rate limiter: eager calls, graph ops, dataset ticks, `close()` and checkpoints.

Every buffer has a `Gate`, with a limiter (`limiter.py`) or without
(then it only keeps the closed flag). Whatever the mode, the wait happens in
Python before the buffer's lock is taken, and the call's items settle after
the locked op: eagerly at its end (still under the lock where the twin
passes it, so a NumPy checkpoint holds rows and counts together), in a
graph through `tf.numpy_function` ops ordered before and after it, in
`as_dataset` as a tick per element.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from tfreplay._src.arrays import py_calls
from tfreplay._src.arrays.ops import under_xla
from tfreplay._src.rate_limiting.limiter import BufferClosedError, RateLimiter


def _run(fn: Callable[[], Any]) -> Any:
    return fn()


def _none() -> int:
    return 0


_POLL = 0.1  # seconds a dataset's tick waits before it lets tf.data look again (so an iterator can be deleted)


class Gate:
    """A buffer's side of its limiter (or of none): the closed flag, eager calls, graph ops, dataset ticks.

    Args:
      limiter: the buffer's `rate_limiter` argument (None: nothing waits).
      owner: the buffer's class name, for errors.
      capacity: the buffer's capacity.
      insert_size: items per `add_batch` (1 when it varies).
    """

    def __init__(self, limiter: RateLimiter | None, owner: str, capacity: int, insert_size: int):
        if limiter is not None and not isinstance(limiter, RateLimiter):
            raise TypeError(
                f"{owner}: rate_limiter ({limiter!r}) must be a RateLimiter (MinSize, SampleToInsertRatio) or None."
            )
        if limiter is not None:
            limiter._bind(owner, capacity, insert_size)
        self.limiter, self._closed = limiter, False
        self.idle = limiter is None  # nothing to wait for or refuse: no limiter, not closed

    def close(self) -> None:
        self._closed, self.idle = True, False
        if self.limiter is not None:
            self.limiter._close()

    def check_open(self, where: str) -> None:
        if self._closed:
            raise BufferClosedError(
                f"{where}: the buffer is closed (close() was called); nothing was added or sampled."
            )

    def call(
        self,
        where: str,
        side: str,
        n: int,
        fn: Callable[[], Any],
        exclusive: Callable[[Callable], Any] = _run,
        used: Callable[[], int] = _none,
    ) -> Any:
        """`exclusive(fn)` (one eager call of `n` items; `exclusive` runs it under the buffer's lock), once the
        limiter admits it; its items settle when it ends (`used`: see `settled`)."""
        self.check_open(where)
        if self.limiter is None:
            return exclusive(fn)
        timeout = self.limiter.insert_timeout if side == "insert" else self.limiter.sample_timeout
        self.limiter._admit(where, side, n, timeout)
        return self.settled(side, n, fn, exclusive, used)

    def settled(
        self,
        side: str,
        n: int,
        fn: Callable[[], Any],
        exclusive: Callable[[Callable], Any] = _run,
        used: Callable[[], int] = _none,
    ) -> Any:
        """`exclusive(fn)` for `n` items already admitted (a dataset tick); they settle when it ends. A call
        that succeeds settles inside `exclusive`, so a checkpoint taken under the same lock (the NumPy twin's)
        holds the written rows and their count together. A call that fails gives back its items but `used()`,
        the samples it drew before it failed (a fused loop's finished iterations, whose updates stay)."""
        limiter = self.limiter
        if limiter is None:
            return exclusive(fn)

        def counted() -> Any:
            out = fn()
            limiter._settle(side, n, True)
            return out

        try:
            return exclusive(counted)
        except BaseException:
            limiter._settle(side, n - used(), False)
            raise

    def admit_op(self, where: str, side: str, n: int) -> list:
        """In a graph: the op that waits for the limiter; order the locked op after it."""
        self.check_open(where)
        if self.limiter is None:
            return []
        self._refuse_xla(where)
        limiter = self.limiter
        timeout = limiter.insert_timeout if side == "insert" else limiter.sample_timeout

        def admit() -> Any:
            try:
                limiter._admit(where, side, n, timeout)
            except BufferClosedError as err:
                raise StopIteration(str(err)) from None  # a py function's StopIteration is OutOfRangeError
            return np.bool_(True)

        return [py_calls.numpy_function(admit, [], tf.bool, name="rate_limiter_wait")]

    def settle_op(self, where: str, side: str, n: int, ok: Any, value: Any) -> Any:
        """In a graph: `value` once the call's items are settled (`ok`: whether the call succeeded)."""
        if self.limiter is None:
            return value
        self._refuse_xla(where)
        limiter = self.limiter

        def settle(good: np.ndarray) -> Any:
            limiter._settle(side, n, bool(good))
            return np.bool_(True)

        def op() -> tf.Tensor:
            return py_calls.numpy_function(settle, [ok], tf.bool, name="rate_limiter_settle")

        # A sample only needs the limiter when it failed; an insert always commits.
        done = op() if side == "insert" else tf.cond(ok, lambda: tf.constant(True), op)
        leaves = tf.nest.flatten(value)
        with tf.control_dependencies([done]):
            leaves[-1] = tf.identity(leaves[-1])
        return tf.nest.pack_sequence_as(value, leaves)

    def ticks(self, counter: tf.data.Dataset, n: int) -> tf.data.Dataset:
        """`counter`, one element per admitted sample of `n` items; it ends when the buffer is closed.

        A tick waits at most `_POLL` seconds per call, so tf.data can delete
        an iterator whose learner stopped reading while it waits.
        """
        if self.limiter is None:
            return counter
        limiter, timeout = self.limiter, self.limiter.sample_timeout
        since: dict[str, float] = {}

        def poll() -> Any:
            start = since.setdefault("start", time.monotonic())  # one dataset's ticks are drawn in order
            try:
                admitted = limiter._admit("as_dataset", "sample", n, timeout, start, _POLL)
            except BufferClosedError:
                return np.int64(-1)
            if admitted:
                since.clear()
            return np.int64(1 if admitted else 0)

        def status(_: Any) -> tf.Tensor:
            return tf.ensure_shape(py_calls.numpy_function(poll, [], tf.int64, name="rate_limiter_tick"), [])

        return counter.map(status).take_while(_open).filter(_admitted)

    def after_clear(self, out: Any) -> Any:
        """`clear()`'s result, once the limiter's counts are reset too."""
        if self.limiter is None:
            return out
        if tf.executing_eagerly():
            self.limiter._reset()
            return out
        limiter = self.limiter

        def reset() -> Any:
            limiter._reset()
            return np.bool_(True)

        with tf.control_dependencies(tf.nest.flatten(out)):
            done = py_calls.numpy_function(reset, [], tf.bool, name="rate_limiter_reset")
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(tf.identity, out)

    def counts(self) -> dict[str, int] | None:
        """The limiter's counts, for a checkpoint (None without a limiter)."""
        return None if self.limiter is None else self.limiter._counts()

    def restored(self, counts: dict[str, int] | None, stored: Callable[[], Any], *, later: bool = False) -> None:
        """After a restore: the checkpoint's (checked) `counts`, or None for one without them; `stored()`
        counts the restored buffer's items, read `later` when they are not in place yet. Wakes every waiter."""
        if self.limiter is None:
            return
        if later:
            self.limiter._restore_later(lambda: int(stored()))
        else:
            self.limiter._restore(counts, int(stored()) if counts is None else 0)

    @contextlib.contextmanager
    def loading(self, stored: Callable[[], Any]) -> Iterator[None]:
        """Eager adds inside pass without the limiter (a migration refilling the buffer, which no learner reads
        yet); after them the limiter's counts follow the rule for a checkpoint without counts."""
        limiter, idle = self.limiter, self.idle
        self.limiter, self.idle = None, not self._closed
        try:
            yield
        finally:
            self.limiter, self.idle = limiter, idle
            self.restored(None, stored)

    def _refuse_xla(self, where: str) -> None:
        if under_xla():
            raise NotImplementedError(
                f"{where}: a buffer with a rate_limiter cannot wait inside an XLA-compiled function "
                "(jit_compile=True): the wait runs in Python. Call it outside the compiled function, "
                "or build the buffer without rate_limiter."
            )


def _open(status: tf.Tensor) -> tf.Tensor:
    return status >= 0


def _admitted(status: tf.Tensor) -> tf.Tensor:
    return status > 0
