"""Interleaved timing of a subject against its NumPy baseline.

Both sides of a comparison are timed in the same process, in alternating
blocks (baseline, subject, subject, baseline, ...), so load from other
processes on a shared machine hits both about equally. Each block runs its
callable enough times to last about `block_seconds`; the result of a side is
the median over blocks of the time per operation.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from typing import Callable, List, Tuple

# A short pause before each block lets background work started by the previous
# block (a dataset refilling its prefetch buffer) finish before the clock starts.
_PAUSE_SECONDS = 0.01


@dataclasses.dataclass
class Bench:
    """A callable that performs `ops` operations per call.

    `prepare`, if given, runs (untimed) before every block with the block's
    length in seconds: a dataset drains what its prefetch buffer stored while
    the other side was timed, so a block sees the steady rate, not the backlog.
    """

    fn: Callable[[], object]
    ops: int = 1
    prepare: Callable[[float], None] | None = None


@dataclasses.dataclass
class Timing:
    """Seconds per operation of each block, and their median."""

    per_op: List[float]

    @property
    def median(self) -> float:
        return statistics.median(self.per_op)

    @property
    def spread(self) -> float:
        """(max - min) / median of the blocks: a rough noise figure."""
        return (max(self.per_op) - min(self.per_op)) / self.median


def run_block(bench: Bench, calls: int, block_seconds: float) -> float:
    """Times one block of `calls` calls; returns seconds per operation.

    The block stops early once it has lasted twice `block_seconds`, so a run
    starved by other processes still finishes in about its usual time.
    """
    gc.collect()  # cheap once the run has called gc.freeze()
    time.sleep(_PAUSE_SECONDS)
    if bench.prepare is not None:
        bench.prepare(block_seconds)
    fn, chunk, done = bench.fn, max(1, calls // 8), 0
    start = time.perf_counter()
    while done < calls:
        for _ in range(chunk):
            fn()
        done += chunk
        if time.perf_counter() - start > 2 * block_seconds:
            break
    return (time.perf_counter() - start) / (done * bench.ops)


def calibrate(bench: Bench, block_seconds: float, warmup_seconds: float) -> int:
    """Warms `bench` up (traces, caches, prefetch buffers); returns calls per block."""
    bench.fn()
    calls, elapsed = 0, 0.0
    start = time.perf_counter()
    while elapsed < warmup_seconds or calls < 3:
        bench.fn()
        calls += 1
        elapsed = time.perf_counter() - start
    per_call = elapsed / calls
    return max(1, int(round(block_seconds / per_call)))


def compare(subject: Bench, baseline: Bench, repeats: int, block_seconds: float) -> Tuple[Timing, Timing]:
    """Times `subject` and `baseline` in `repeats` interleaved blocks each."""
    warmup = min(0.5, block_seconds)
    calls_s = calibrate(subject, block_seconds, warmup)
    calls_b = calibrate(baseline, block_seconds, warmup)
    subject_times, baseline_times = [], []
    for r in range(repeats):
        if r % 2 == 0:
            baseline_times.append(run_block(baseline, calls_b, block_seconds))
            subject_times.append(run_block(subject, calls_s, block_seconds))
        else:
            subject_times.append(run_block(subject, calls_s, block_seconds))
            baseline_times.append(run_block(baseline, calls_b, block_seconds))
    return Timing(subject_times), Timing(baseline_times)
