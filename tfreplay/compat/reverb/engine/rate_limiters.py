"""Rate limiters: when a table lets an insert or a sample go (Reverb's rule, as `tfreplay.rate_limiting`).

With `error = inserts * samples_per_insert - samples` (counts since the last
reset): while the table holds fewer than `min_size_to_sample` items inserts
pass and samples wait; then a sample of n needs `error - n >= min_diff` and
an insert of n needs `error + n * samples_per_insert <= max_diff`. The table
asks under its lock and waits on its own condition variable (`table.py`).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from tfreplay._src.rate_limiting.limiter import check_rate, is_number


@dataclasses.dataclass
class RateLimiterInfo:
    """`TableInfo.rate_limiter_info`: the settings and the counts since the last reset."""

    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float
    inserts: int = 0
    samples: int = 0
    deletes: int = 0


class RateLimiter:
    """Reverb's general limiter: the rule above with these four settings.

    Args:
      samples_per_insert: a positive number.
      min_size_to_sample: a positive integer.
      min_diff, max_diff: the range the error is kept in, `min_diff < max_diff`.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, min_diff: float, max_diff: float):
        where = type(self).__name__
        check_rate(where, samples_per_insert, min_size_to_sample)
        if not (is_number(min_diff) and is_number(max_diff)) or not min_diff < max_diff:
            raise ValueError(f"{where}: min_diff ({min_diff!r}) must be a number less than max_diff ({max_diff!r}).")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = int(min_size_to_sample)
        self.min_diff, self.max_diff = float(min_diff), float(max_diff)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(samples_per_insert={self.samples_per_insert:g}, "
            f"min_size_to_sample={self.min_size_to_sample}, min_diff={self.min_diff:g}, max_diff={self.max_diff:g})"
        )

    def build(self) -> Counts:
        return Counts(self)


class MinSize(RateLimiter):
    """Samples wait until the table holds `min_size_to_sample` items; inserts never wait."""

    def __init__(self, min_size_to_sample: int):
        super().__init__(1.0, min_size_to_sample, -sys.float_info.max, sys.float_info.max)


class SampleToInsertRatio(RateLimiter):
    """Samples near `samples_per_insert` per inserted item, once `min_size_to_sample` items are in.

    `error_buffer` a number: the range is `min_size_to_sample * samples_per_insert -/+ error_buffer`; a pair:
    the range as given. The range must be at least `2 * max(1, samples_per_insert)` wide and its low end at most
    `samples_per_insert * min_size_to_sample` (else inserts or samples could wait for ever).
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, error_buffer: Any):
        where = "SampleToInsertRatio"
        check_rate(where, samples_per_insert, min_size_to_sample)
        if isinstance(error_buffer, (tuple, list)) and len(error_buffer) == 2 and all(map(is_number, error_buffer)):
            low, high = float(error_buffer[0]), float(error_buffer[1])
        elif is_number(error_buffer) and error_buffer >= 0:
            offset = samples_per_insert * min_size_to_sample
            low, high = offset - error_buffer, offset + error_buffer
        else:
            raise ValueError(f"{where}: error_buffer ({error_buffer!r}) must be a non-negative number or a pair.")
        if high - low < 2 * max(1.0, samples_per_insert):
            raise ValueError(
                f"{where}: error_buffer ({error_buffer!r}) gives a range {high - low:g} wide; it must be at least "
                f"2 * max(1, samples_per_insert) = {2 * max(1.0, samples_per_insert):g}, or calls could block for ever."
            )
        if low > samples_per_insert * min_size_to_sample:
            raise ValueError(
                f"{where}: error_buffer ({error_buffer!r}) puts min_diff ({low:g}) above samples_per_insert * "
                f"min_size_to_sample ({samples_per_insert * min_size_to_sample:g}): no sample would ever be admitted."
            )
        super().__init__(samples_per_insert, min_size_to_sample, low, high)


class Queue(RateLimiter):
    """A queue of `size` (for `Table.queue`): an insert waits while `size` items are unsampled, a sample while
    none is."""

    def __init__(self, size: int):
        check_rate("Queue", 1.0, size)
        super().__init__(1.0, 1, 0.0, float(size))


class Stack(Queue):
    """A stack of `size` (for `Table.stack`): the same rule as `Queue`."""


class Counts:
    """One table's counts under the rule of `limiter` (read and changed under the table's lock)."""

    def __init__(self, limiter: RateLimiter):
        self.limiter = limiter
        self.inserts, self.samples, self.deletes = 0, 0, 0

    def error(self) -> float:
        return self.inserts * self.limiter.samples_per_insert - self.samples

    def can_insert(self, size: int, n: int) -> bool:
        lim = self.limiter
        return size < lim.min_size_to_sample or self.error() + n * lim.samples_per_insert <= lim.max_diff

    def can_sample(self, size: int, n: int) -> bool:
        lim = self.limiter
        return size >= lim.min_size_to_sample and self.error() - n >= lim.min_diff

    def reset(self) -> None:
        self.inserts, self.samples, self.deletes = 0, 0, 0

    def info(self) -> RateLimiterInfo:
        lim = self.limiter
        return RateLimiterInfo(
            lim.samples_per_insert,
            lim.min_size_to_sample,
            lim.min_diff,
            lim.max_diff,
            self.inserts,
            self.samples,
            self.deletes,
        )
