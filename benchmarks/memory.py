"""Memory of the uniform buffers: storage bytes against the spec's, and resident memory while built and filled.

    python -m benchmarks.memory [--workload cartpole|atari|all]

Per workload of `benchmarks/common.py` and buffer (TF, Py): `nbytes / capacity`
against the spec's bytes per item, and the process's RSS growth while the
buffer is created (after, and the peak sampled every millisecond, which shows a
transient copy) and once every row has been written (NumPy's zeroed pages only
become resident when written). The limit on RSS once filled: the items' spec
bytes + 1/16 (TensorFlow's allocator alone keeps that much more for a huge
tensor) + 32 MiB. RSS is read from `/proc/self/statm` (Linux) or `psutil`.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import time
from typing import Any, Callable, Sequence, Tuple

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Current resident set size of this process, in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:  # not Linux
        import psutil

        return psutil.Process().memory_info().rss


class PeakSampler:
    """Context manager: records the highest RSS seen while it is active."""

    def __init__(self, interval: float = 0.001):
        self._interval = interval
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self._interval)

    def __enter__(self) -> PeakSampler:
        self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


@dataclasses.dataclass
class MemoryReport:
    """Memory of one buffer, all in bytes.

    Attributes:
      nbytes: the buffer's item storage (`buffer.nbytes`).
      capacity: items the buffer holds.
      spec_bytes: bytes of one item according to its spec.
      created: RSS growth from before construction to just after it.
      peak: the highest RSS growth seen during construction.
      filled: RSS growth from before construction to after filling every row.
    """

    nbytes: int
    capacity: int
    spec_bytes: int
    created: int
    peak: int
    filled: int

    @property
    def expected(self) -> int:
        """What `capacity` items take at the spec's size."""
        return self.capacity * self.spec_bytes


def build_and_fill(make: Callable[[], Any], fill: Callable[[Any], None]) -> Tuple[Any, int, int, int]:
    """Builds an object and fills it, measuring RSS growth.

    Returns `(obj, created, peak, filled)`; the byte counts are relative to
    the RSS just before `make` ran.
    """
    gc.collect()
    before = rss_bytes()
    with PeakSampler() as sampler:
        obj = make()
    created = rss_bytes() - before
    fill(obj)
    gc.collect()
    return obj, created, sampler.peak - before, rss_bytes() - before


MIB = 1 << 20
SLACK, ALLOCATOR_SLACK = 32 * MIB, 1 / 16


def report(name: str, buffer: str, w: Any) -> MemoryReport:
    """Builds and fills one buffer of workload `w`, measuring it."""
    import numpy as np
    import tensorflow as tf

    import tfreplay
    from benchmarks.common import fill_in_graph

    batch = w.make_batch(np.random.default_rng(0))
    if buffer == "TF":
        make = lambda: tfreplay.TFUniformReplayBuffer(w.spec, w.batch_size, w.max_length, seed=0)  # noqa: E731
        fill = lambda rb: fill_in_graph(rb.add_batch, tf.nest.map_structure(tf.constant, batch), w.max_length)  # noqa: E731
    else:
        make = lambda: tfreplay.PyUniformReplayBuffer(w.spec, batch_size=w.batch_size, max_length=w.max_length)  # noqa: E731

        def fill(rb: Any) -> None:
            for _ in range(w.max_length):
                rb.add_batch(batch)

    rb, created, peak, filled = build_and_fill(make, fill)
    spec_bytes = sum(s.shape.num_elements() * s.dtype.size for s in w.spec.values())
    return MemoryReport(rb.nbytes, rb.capacity, spec_bytes, created, peak, filled)


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks.common import WORKLOADS

    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["all"] + sorted(WORKLOADS), default="all")
    args = parser.parse_args(argv)
    print(
        "| workload | buffer | spec B/item | nbytes/capacity | spec x capacity MiB | RSS created MiB "
        "| RSS peak MiB | RSS filled MiB | limit MiB | met? |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, w in WORKLOADS.items():
        if args.workload not in ("all", name):
            continue
        for buffer in ("TF", "Py"):
            m = report(name, buffer, w)
            limit = m.expected * (1 + ALLOCATOR_SLACK) + SLACK
            met = "yes" if m.nbytes == m.expected and m.filled <= limit else "NO"
            print(
                f"| {name} | {buffer} | {m.spec_bytes} | {m.nbytes / m.capacity:g} | {m.expected / MIB:.1f} | "
                f"{m.created / MIB:.1f} | {m.peak / MIB:.1f} | {m.filled / MIB:.1f} | {limit / MIB:.0f} | {met} |"
            )
            gc.collect()


if __name__ == "__main__":
    main()
