"""NumPy buffers with `storage_dir` (items in memory-mapped files) against the same buffers in RAM.

Rows `{obs: u8[84,84], action: i32, reward: f32}` (7,064 bytes). Hot cache:
full 20,000-row buffers, each group the in-RAM buffer (the baseline) beside the
memmap one: `get_next(32)`, `get_next(1024)`, `add_batch` of 32 rows into the
full ring (the memmap side also logs the overwritten rows), and the
prioritized `get_next(32)`. Cold cache: a buffer of `TFREPLAY_BENCH_COLD_GB`
GB (default 1) filled, flushed and closed; each round drops its files from the
page cache (`posix_fadvise(DONTNEED)`) and times 300 `get_next(32)` calls of
the reopened buffer, against the same calls with the files cached.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.common import TINY, measure, size
from tfreplay import PyPrioritizedReplayBuffer, PyUniformReplayBuffer

SPEC = {
    "obs": tf.TensorSpec([84, 84], tf.uint8),
    "action": tf.TensorSpec([], tf.int32),
    "reward": tf.TensorSpec([], tf.float32),
}
ROWS, ROW_BYTES, COLD_CALLS = size(20_000, 200), 84 * 84 + 8, size(300, 3)
CLASSES = {"uniform": PyUniformReplayBuffer, "prioritized": PyPrioritizedReplayBuffer}


def _rows(n: int, start: int = 0) -> dict:
    rng = np.random.default_rng(start)
    return {
        "obs": rng.integers(0, 255, [n, 84, 84], np.uint8),
        "action": np.arange(start, start + n, dtype=np.int32),
        "reward": np.ones([n], np.float32),
    }


def _filled(cls: type, capacity: int, storage_dir: Any) -> Any:
    rb = cls(SPEC, capacity, seed=0, storage_dir=storage_dir)
    chunk = _rows(min(capacity, 10_000))
    for start in range(0, capacity, 10_000):
        n = min(10_000, capacity - start)
        rb.add_batch({k: v[:n] for k, v in chunk.items()})
    return rb


@pytest.fixture(scope="module")
def buffers(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("memmap")
    out = {}
    for name, cls in CLASSES.items():
        out[name, "RAM"] = _filled(cls, ROWS, None)
        out[name, "memmap"] = _filled(cls, ROWS, root / name)
    yield out
    for name in CLASSES:
        out[name, "memmap"].close()


CASES = [("uniform", "get_next(32)"), ("uniform", "get_next(1024)"), ("uniform", "add_batch(32 rows)")]
CASES.append(("prioritized", "get_next(32)"))


@pytest.mark.parametrize("storage", ["RAM", "memmap"])
@pytest.mark.parametrize("kind, case", CASES)
def test_hot(benchmark, buffers, kind, case, storage):
    rb = buffers[kind, storage]
    if case.startswith("add_batch"):
        batch = _rows(32, 7)
        fn = lambda: rb.add_batch(batch)  # noqa: E731
    else:
        n = int(case[len("get_next(") : -1])
        fn = lambda: rb.get_next(n)  # noqa: E731
    role = "baseline" if storage == "RAM" else None
    measure(benchmark, fn, group=f"memmap hot {kind} {case}", case=storage, role=role)


def _files(path: str) -> list[str]:
    """Every file under the storage folder (its data files, manifest and state folders)."""
    return [os.path.join(top, name) for top, _, names in os.walk(path) for name in names]


def _drop_cache(path: str) -> None:
    for name in _files(path):
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages stay cached: written back first, they can go
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_all(path: str) -> None:
    for name in _files(path):
        with open(name, "rb") as f:
            while f.read(1 << 24):
                pass


@pytest.fixture(scope="module")
def cold_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    gigabytes = 0.002 if TINY else float(os.environ.get("TFREPLAY_BENCH_COLD_GB", "1"))
    capacity = int(gigabytes * 1e9 / ROW_BYTES)
    path = str(tmp_path_factory.mktemp("cold"))
    _filled(PyUniformReplayBuffer, capacity, path).close()
    return path, capacity


@pytest.fixture(scope="module")
def reopened() -> Any:
    """The cold cases' open buffer (one at a time), closed when the file's cases are done."""
    opened: list[Any] = []
    yield opened
    while opened:
        opened.pop().close()


@pytest.mark.parametrize("cache", ["cached", "dropped"])
@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise (Linux)")
def test_cold(benchmark, cold_dir, reopened, cache):
    path, capacity = cold_dir
    evict = _drop_cache if cache == "dropped" else _read_all

    def prepare() -> None:
        # The buffer is closed first: the kernel keeps the pages a live mapping holds, whatever fadvise says.
        while reopened:
            reopened.pop().close()
        gc.collect()  # and unmapped: no reference left to its arrays
        evict(path)
        reopened.append(PyUniformReplayBuffer(SPEC, capacity, seed=1, storage_dir=path))

    def calls() -> None:
        rb = reopened[0]
        for _ in range(COLD_CALLS):
            rb.get_next(32)

    group = f"memmap cold get_next(32), {capacity * ROW_BYTES / 1e9:.1f} GB, first {COLD_CALLS} calls"
    role = "baseline" if cache == "cached" else None
    measure(
        benchmark,
        calls,
        group=group,
        case=f"files {cache}",
        ops=COLD_CALLS,
        role=role,
        setup=prepare,
        rounds=size(5, 1),
    )
