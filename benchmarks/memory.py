"""Resident memory of the process, and its growth while a buffer is built.

RSS is read from `/proc/self/statm` (Linux) or `psutil` elsewhere. While a
buffer is created a thread samples RSS every millisecond, so a transient
copy (an initial value that is freed once the variable holds it) shows up in
the peak even though it is gone afterwards.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import time
from typing import Any, Callable, Tuple

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
