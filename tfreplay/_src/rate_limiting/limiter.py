"""Rate limiting: Reverb's samples-per-insert, in process.

A limiter keeps the learner's samples and the collectors' inserts near a
ratio. It counts items, not calls: an `add_batch` of B rows is B inserts, a
`get_next(sample_batch_size=S)` is S samples (a `num_steps` window is one
sample). With `error = inserts * samples_per_insert - samples`:

* while the buffer holds fewer than `min_size_to_sample` items, inserts pass
  and samples wait;
* then a sample of n waits until `error - n >= min_diff`, and an insert of n
  waits until `error + n * samples_per_insert <= max_diff`.

A call waits before it takes the buffer's lock (waiting under it would stop
the other side). A sample counts when it is admitted, as in Reverb, and is
given back if the call then fails (no window to draw yet). An insert is
*pending* until its rows are written: it uses room for inserts at once but
is not counted for sampling before it can be drawn, and a failed write gives
its room back. So the counts are what the buffer did, and once sampling has
begun the error stays inside `[min_diff, max_diff]` (a given-back sample may
leave it above `max_diff` by that sample's size, until the learner samples).

Checkpoints carry the counts (`inserts`, `samples`, `size`; pending inserts
are in flight, not state), as Reverb saves its table's limiter with the
items. `tf.train.Checkpoint(buffer=rb)` saves them in the buffer's layout
record (`checkpoint/layout.py`), and a restore puts them back once the items
are back, then wakes every waiter: a learner waiting on an empty buffer goes
on when a restore fills it. The settings (`samples_per_insert`, the range,
the timeouts) are the restoring limiter's own; only the counts come from the
checkpoint, so the error is recomputed from them with those settings. Other
cases:

* restored into a buffer without a limiter: the counts are dropped (its
  next checkpoint has none);
* a checkpoint without counts (saved without a limiter, or by a tfreplay
  before them) into a buffer with one: `size` is the restored buffer's
  stored items and the counts resume as if those items had just been
  inserted, up to `min_size_to_sample`: `inserts = min(size,
  min_size_to_sample)`, `samples = 0`. So a full buffer resumes where the
  warm-up ends (the error at `min_size_to_sample * samples_per_insert`, the
  middle of a `SampleToInsertRatio`'s range): counting every stored item as
  an insert would let the learner draw `size * samples_per_insert` samples
  of old items before a collector may add one, and counting none would
  repeat the warm-up on a full buffer. A TF checkpoint from before the
  counts restores its record before its variables, with no call after them:
  the rule runs when the limiter is next asked (a call, `info()`), so a
  thread already waiting then waits for the next insert or `close()`;
* a restore built in a v1 graph: the counts go in when it is built (the
  session restores the items later); without counts the limiter keeps its
  own, as there are no items yet to count.

`gate.py` is the buffer's side: the eager call, the ops a graph orders
around its locked op, the ticks of a sampling dataset, and the counts a
checkpoint carries.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, NamedTuple

import numpy as np
import tensorflow as tf


class BufferClosedError(tf.errors.OutOfRangeError):
    """`add_batch`/`get_next` on a closed buffer (inside a graph: `tf.errors.OutOfRangeError`, same message)."""

    __module__ = "tfreplay"  # printed and pickled as the name users catch it by

    def __init__(self, message: str):
        super().__init__(None, None, message)


class EmptyBufferError(tf.errors.InvalidArgumentError, ValueError):
    """A sample with nothing to draw yet (an empty buffer, or no window of the asked length).

    Both a `ValueError` (a bad call, as every refusal of tfreplay) and TF's `tf.errors.InvalidArgumentError`,
    what the same refusal raises inside a graph (and what TF-Agents raises): catch either.
    """

    __module__ = "tfreplay"  # printed and pickled as the name users catch it by

    def __init__(self, message: str):
        super().__init__(None, None, message)


class RateLimitTimeoutError(tf.errors.DeadlineExceededError):
    """A call the limiter did not admit in time, or at once with timeout 0.

    Inside a graph it arrives as `tf.errors.UnknownError` with the same message.
    """

    __module__ = "tfreplay"  # printed and pickled as the name users catch it by

    def __init__(self, message: str):
        super().__init__(None, None, message)


class RateLimiterInfo(NamedTuple):
    """A snapshot of a limiter's counts, taken under its lock.

    `inserts` are written items, `pending_inserts` admitted ones not yet
    written, `samples` admitted samples (failed ones given back); `error` is
    `inserts * samples_per_insert - samples`; `size` counts the written items
    still stored (at most the capacity).
    """

    inserts: int
    samples: int
    pending_inserts: int
    size: int
    error: float
    min_diff: float
    max_diff: float
    closed: bool


def _check_timeout(where: str, name: str, value: Any) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise ValueError(f"{where}: {name} ({value!r}) must be None (wait), 0 (never wait) or a number of seconds.")
    return float(value)


class RateLimiter:
    """Reverb's rate limiter rule, for one buffer (pass it as `rate_limiter=`).

    Args:
      samples_per_insert: the target number of samples per inserted item.
      min_size_to_sample: samples wait until the buffer holds this many items.
      min_diff, max_diff: the range the error is kept in (see the module doc).
      insert_timeout: seconds `add_batch` waits: None waits until admitted
        or `close()`, 0 never waits; either way a refused call raises
        `RateLimitTimeoutError` naming the limiter's state.
      sample_timeout: the same for `get_next` and `as_dataset`.
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        min_diff: float,
        max_diff: float,
        *,
        insert_timeout: float | None = None,
        sample_timeout: float | None = None,
    ):
        where = type(self).__name__
        check_rate(where, samples_per_insert, min_size_to_sample)
        if not min_diff < max_diff:
            raise ValueError(f"{where}: min_diff ({min_diff!r}) must be less than max_diff ({max_diff!r}).")
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert):
            raise ValueError(
                f"{where}: the error range (max_diff - min_diff = {max_diff - min_diff:g}) must be at least "
                f"2 * max(1, samples_per_insert) ({2 * max(1.0, samples_per_insert):g}), or inserts and samples "
                "could block each other for ever; widen error_buffer."
            )
        if min_diff > samples_per_insert * min_size_to_sample:
            raise ValueError(
                f"{where}: min_diff ({min_diff:g}) must be at most samples_per_insert * min_size_to_sample "
                f"({samples_per_insert * min_size_to_sample:g}), or no sample is ever admitted."
            )
        self.samples_per_insert, self.min_size_to_sample = float(samples_per_insert), int(min_size_to_sample)
        self.min_diff, self.max_diff = float(min_diff), float(max_diff)
        self.insert_timeout = _check_timeout(where, "insert_timeout", insert_timeout)
        self.sample_timeout = _check_timeout(where, "sample_timeout", sample_timeout)
        self._cond = threading.Condition(threading.Lock())
        self._inserts, self._pending, self._samples = 0, 0, 0
        self._largest = {"insert": 1, "sample": 1}  # the largest call seen on each side (the deadlock check)
        self._size, self._capacity, self._closed = 0, 0, False
        self._owner: str | None = None
        self._stored: Callable[[], int] | None = None  # a restore's item count, read when next needed

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(samples_per_insert={self.samples_per_insert:g}, "
            f"min_size_to_sample={self.min_size_to_sample}, min_diff={self.min_diff:g}, max_diff={self.max_diff:g})"
        )

    def info(self) -> RateLimiterInfo:
        """The counts now, read under the limiter's lock."""
        self._catch_up()
        with self._cond:
            return self._info()

    def _info(self) -> RateLimiterInfo:
        error = self._inserts * self.samples_per_insert - self._samples
        args = (self._inserts, self._samples, self._pending, self._size, error, self.min_diff, self.max_diff)
        return RateLimiterInfo(*args, self._closed)

    def _state(self) -> str:
        i = self._info()
        return (
            f"{self!r}: inserts={i.inserts} (+{i.pending_inserts} pending), samples={i.samples}, "
            f"size={i.size}, error={i.error:g} (kept in [{i.min_diff:g}, {i.max_diff:g}])"
        )

    # The buffer's side (through `Gate`).
    def _bind(self, owner: str, capacity: int, insert_size: int) -> None:
        if self._owner is not None:
            raise ValueError(
                f"{owner}: rate_limiter ({self!r}) must be a new limiter; it already limits a {self._owner}. "
                "Give each buffer its own."
            )
        if self.min_size_to_sample > capacity:
            raise ValueError(
                f"{owner}: min_size_to_sample ({self.min_size_to_sample}) must be at most the capacity "
                f"({capacity}), or no sample is ever admitted."
            )
        self._check_room(owner, "insert", insert_size)
        self._owner, self._capacity, self._largest["insert"] = owner, capacity, insert_size

    def _check_room(self, where: str, side: str, n: int) -> None:
        """Refuses a call so large that it and the other side's largest could each wait for the other for ever."""
        spi = self.samples_per_insert
        inserts = n if side == "insert" else self._largest["insert"]
        samples = n if side == "sample" else self._largest["sample"]
        need = samples + spi * inserts
        if self.max_diff - self.min_diff < need:
            raise ValueError(
                f"{where}: the rate limiter's error range (max_diff - min_diff = {self.max_diff - self.min_diff:g}) "
                f"must be at least the largest sample ({samples}) + samples_per_insert * the largest insert "
                f"({spi:g} * {inserts}) = {need:g}, or collectors and the learner could wait for each other for "
                "ever; widen error_buffer or use smaller batches."
            )

    def _can(self, side: str, n: int) -> bool:
        spi = self.samples_per_insert
        if side == "insert":  # stage 1 (Reverb): inserts pass until min_size_to_sample items are stored
            stored = min(self._size + self._pending, self._capacity)
            return stored < self.min_size_to_sample or (
                (self._inserts + self._pending + n) * spi - self._samples <= self.max_diff
            )
        return self._size >= self.min_size_to_sample and self._inserts * spi - self._samples - n >= self.min_diff

    def _closed_error(self, where: str) -> BufferClosedError:
        return BufferClosedError(f"{where}: the buffer is closed (close() was called); nothing was added or sampled.")

    def _admit(
        self,
        where: str,
        side: str,
        n: int,
        timeout: float | None,
        start: float | None = None,
        poll: float | None = None,
    ) -> bool:
        """Waits until `n` items of `side` may go, then holds them pending; False if `poll` seconds ran out first.

        `timeout` counts from `start` (default: now), so a wait split into polls keeps one deadline.

        Raises:
          BufferClosedError: the buffer is or gets closed.
          RateLimitTimeoutError: `timeout` ran out (at once with 0).
          ValueError: the call could never be admitted (see `_check_room`).
        """
        self._catch_up()
        now = time.monotonic()
        deadline = None if timeout is None else (now if start is None else start) + timeout
        poll_end = None if poll is None else now + poll
        with self._cond:
            self._check_room(where, side, n)
            self._largest[side] = max(self._largest[side], n)
            while True:
                if self._closed:
                    raise self._closed_error(where)
                if self._can(side, n):
                    if side == "insert":
                        self._pending += n
                    else:
                        self._samples += n
                    self._cond.notify_all()  # a sample makes room for inserts; an insert may unblock nothing yet
                    return True
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    what = "would wait" if timeout == 0 else f"waited {timeout:g} s"
                    raise RateLimitTimeoutError(
                        f"{where}: the rate limiter {what} to admit {n} {side}s; {self._state()}."
                    )
                if poll_end is not None and now >= poll_end:
                    return False
                ends = [t for t in (deadline, poll_end) if t is not None]
                self._cond.wait(min(ends) - now if ends else None)

    def _settle(self, side: str, n: int, ok: bool) -> None:
        """Ends an admitted call: commits its `n` inserts, or gives back its items if it failed."""
        with self._cond:
            if side == "sample":
                self._samples = self._samples if ok else max(self._samples - n, 0)
            else:
                self._pending -= n
                if ok:
                    self._inserts += n
                    self._size = min(self._size + n, self._capacity)
            self._cond.notify_all()

    def _close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _reset(self) -> None:
        """After `clear()`: counts start again from zero (as Reverb's table reset); pending inserts stay pending."""
        with self._cond:
            self._inserts, self._samples, self._size, self._stored = 0, 0, 0, None
            self._cond.notify_all()

    def _counts(self) -> dict[str, int]:
        """What a checkpoint saves: the written inserts, the admitted samples and the stored items."""
        with self._cond:
            return {"inserts": self._inserts, "samples": self._samples, "size": self._size}

    def _restore(self, counts: dict[str, int] | None, stored: int) -> None:
        """After a restore: the saved `counts` (checked by the caller), or the module doc's rule for a
        checkpoint without them (`stored`: the restored buffer's items). Pending inserts stay pending."""
        with self._cond:
            self._restore_locked(counts, stored)

    def _restore_locked(self, counts: dict[str, int] | None, stored: int) -> None:
        if counts is None:
            size = min(stored, self._capacity)
            counts = {"inserts": min(size, self.min_size_to_sample), "samples": 0, "size": size}
        self._inserts, self._samples, self._size = counts["inserts"], counts["samples"], counts["size"]
        self._stored = None
        self._cond.notify_all()

    def _restore_later(self, stored: Callable[[], int]) -> None:
        """A restore without counts whose items are not in place yet (a TF checkpoint written before the
        counts restores its record before its variables): the rule runs when the limiter is next asked."""
        with self._cond:
            self._stored = stored

    def _catch_up(self) -> None:
        stored = self._stored
        if stored is None:
            return
        n = stored()  # outside the lock: it may run TF ops
        with self._cond:
            if self._stored is stored:  # no other restore or clear came in between
                self._restore_locked(None, n)


class MinSize(RateLimiter):
    """Samples wait until the buffer holds `min_size_to_sample` items; inserts never wait.

    Args:
      min_size_to_sample: a positive integer, at most the buffer's capacity.
      sample_timeout: as `RateLimiter`.
    """

    def __init__(self, min_size_to_sample: int, *, sample_timeout: float | None = None):
        super().__init__(1.0, min_size_to_sample, -math.inf, math.inf, sample_timeout=sample_timeout)


class SampleToInsertRatio(RateLimiter):
    """Keeps samples near `samples_per_insert` per inserted item (Reverb's `SampleToInsertRatio`).

    Until the buffer holds `min_size_to_sample` items inserts pass and samples
    wait; then the error `inserts * samples_per_insert - samples` is kept in
    `[min_diff, max_diff]`: a number `error_buffer` means
    `min_size_to_sample * samples_per_insert -/+ error_buffer` (the error
    counts from the end of that first stage), a pair `(min_diff, max_diff)`
    is used as given. The range must hold the largest sample plus
    `samples_per_insert` times the largest insert (checked on each call).

    Example:
      `TFUniformReplayBuffer(spec, batch_size=4, max_length=1000,
      rate_limiter=SampleToInsertRatio(8.0, 100, 64.0))`: after 100 items,
      each sampled item is matched by 1/8 inserted one, within 64 samples.
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        error_buffer: float | tuple[float, float],
        *,
        insert_timeout: float | None = None,
        sample_timeout: float | None = None,
    ):
        where = "SampleToInsertRatio"
        check_rate(where, samples_per_insert, min_size_to_sample)
        if isinstance(error_buffer, (tuple, list)) and len(error_buffer) == 2:
            bounds = tuple(error_buffer)
        elif is_number(error_buffer) and error_buffer >= 0:  # counted from the end of the first stage, as Reverb
            offset = samples_per_insert * min_size_to_sample
            bounds = (offset - error_buffer, offset + error_buffer)
        else:
            raise ValueError(f"{where}: error_buffer ({error_buffer!r}) must be a non-negative number or a pair.")
        if not all(is_number(b) and math.isfinite(b) for b in bounds):
            raise ValueError(f"{where}: error_buffer ({error_buffer!r}) must hold finite numbers.")
        super().__init__(
            samples_per_insert,
            min_size_to_sample,
            float(bounds[0]),
            float(bounds[1]),
            insert_timeout=insert_timeout,
            sample_timeout=sample_timeout,
        )


def check_rate(where: str, samples_per_insert: Any, min_size_to_sample: Any) -> None:
    if not is_number(samples_per_insert) or not math.isfinite(samples_per_insert) or samples_per_insert <= 0:
        raise ValueError(f"{where}: samples_per_insert ({samples_per_insert!r}) must be a positive number.")
    integer = isinstance(min_size_to_sample, (int, np.integer)) and not isinstance(min_size_to_sample, bool)
    if not integer or min_size_to_sample < 1:
        raise ValueError(f"{where}: min_size_to_sample ({min_size_to_sample!r}) must be a positive integer.")


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
