"""NumPy buffers with `storage_dir` (items in memory-mapped files) against the same buffers in RAM.

Run: `python -m benchmarks.memmap [--repeats N] [--block SECONDS] [--cold-gb GB] [--dir PATH]`.

Hot cache (`--repeats` alternating blocks, `benchmarks.timing.compare`; ratio = memmap / RAM, 1.0 = the same)
  Atari-like rows `{obs: u8[84,84], action: i32, reward: f32}` (7,064 bytes), a full 20,000-row buffer:
  `get_next(32)`, `get_next(1024)`, `add_batch` of 32 rows into the full ring (the memmap side also appends
  the overwritten rows' flushed contents to its undo log), and `PyPrioritizedReplayBuffer.get_next(32)`.
  Floor: NumPy's fancy index of 32 random rows from an in-RAM `u8[20000, 84, 84]` array.

Cold cache (`--cold-gb`, default 2; 0 skips it)
  A buffer of `--cold-gb` GB of the same rows is filled, flushed, closed, and its files dropped from the page
  cache (`posix_fadvise(DONTNEED)`); reopened, its first `get_next(32)` calls read from disk. Then the whole
  file is read once (hot) and the same calls are timed again. On a machine with more RAM than the file this
  approximates a buffer larger than RAM: each sampled row the cache does not hold costs a page read.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfreplay  # noqa: E402
from benchmarks.timing import Bench, compare  # noqa: E402

SPEC = {
    "obs": tf.TensorSpec([84, 84], tf.uint8),
    "action": tf.TensorSpec([], tf.int32),
    "reward": tf.TensorSpec([], tf.float32),
}
ROWS = 20_000
ROW_BYTES = 84 * 84 + 8


def rows(n: int, start: int = 0) -> dict:
    rng = np.random.default_rng(start)
    return {
        "obs": rng.integers(0, 255, [n, 84, 84], np.uint8),
        "action": np.arange(start, start + n, dtype=np.int32),
        "reward": np.ones([n], np.float32),
    }


def filled(cls: type, capacity: int, storage_dir: str | None) -> tfreplay.compose.Buffer:
    rb = cls(SPEC, capacity, seed=0, storage_dir=storage_dir)
    chunk = rows(min(capacity, 10_000))
    for start in range(0, capacity, len(chunk["action"])):
        n = min(len(chunk["action"]), capacity - start)
        rb.add_batch({k: v[:n] for k, v in chunk.items()})
    return rb


def hot(root: str, repeats: int, block: float) -> list[tuple[str, float, float]]:
    """`(case, memmap µs, RAM µs)` per case."""
    out = []
    for cls, cases in (
        (tfreplay.PyUniformReplayBuffer, ("get_next(32)", "get_next(1024)", "add_batch(32 rows)")),
        (tfreplay.PyPrioritizedReplayBuffer, ("get_next(32)",)),
    ):
        disk = filled(cls, ROWS, os.path.join(root, cls.__name__))
        ram = filled(cls, ROWS, None)
        batch = rows(32, 7)
        for case in cases:
            if case.startswith("add_batch"):
                calls = [Bench(lambda rb=rb, batch=batch: rb.add_batch(batch)) for rb in (disk, ram)]
            else:
                size = int(case[len("get_next(") : -1])
                calls = [Bench(lambda rb=rb, size=size: rb.get_next(size)) for rb in (disk, ram)]
            subject, baseline = compare(calls[0], calls[1], repeats, block)
            name = case if cls is tfreplay.PyUniformReplayBuffer else f"prioritized {case}"
            out.append((name, subject.median * 1e6, baseline.median * 1e6))
        disk.close()
    frames = rows(ROWS)["obs"]
    rng = np.random.default_rng(0)
    floor = Bench(lambda: frames[rng.integers(0, ROWS, 32)])
    subject, _ = compare(floor, floor, repeats, block)
    out.append(("NumPy floor: `a[idx]` of 32 rows, in RAM", subject.median * 1e6, float("nan")))
    return out


def drop_cache(path: str) -> None:
    for name in os.listdir(path):
        if name.startswith("storage-"):
            fd = os.open(os.path.join(path, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def cold(root: str, gigabytes: float, calls: int = 300) -> tuple[int, float, float, float]:
    """`(rows, cold µs, hot µs, seconds to fill)` of `get_next(32)` on a `gigabytes` buffer."""
    capacity = int(gigabytes * 1e9 / ROW_BYTES)
    path = os.path.join(root, "cold")
    start = time.perf_counter()
    rb = filled(tfreplay.PyUniformReplayBuffer, capacity, path)
    rb.close()
    fill = time.perf_counter() - start
    del rb
    gc.collect()
    drop_cache(path)
    rb = tfreplay.PyUniformReplayBuffer(SPEC, capacity, seed=1, storage_dir=path)
    start = time.perf_counter()
    for _ in range(calls):
        rb.get_next(32)
    cold_us = (time.perf_counter() - start) / calls * 1e6
    rb._twin.arrays["storage/obs"].sum(dtype=np.uint64)  # every page read once: the file is now cached
    start = time.perf_counter()
    for _ in range(calls):
        rb.get_next(32)
    hot_us = (time.perf_counter() - start) / calls * 1e6
    rb.close()
    return capacity, cold_us, hot_us, fill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--block", type=float, default=0.1)
    parser.add_argument("--cold-gb", type=float, default=2.0)
    parser.add_argument("--dir", default=None, help="where the buffers' files go (default: a temporary folder)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="tfreplay-memmap-", dir=args.dir)
    began = time.perf_counter()
    try:
        table = hot(root, args.repeats, args.block)
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, NumPy {np.__version__}")
        print(f"\nHot cache, {ROWS:,} rows of {ROW_BYTES:,} bytes; ratio = memmap / RAM\n")
        print("| case | memmap µs | RAM µs | ratio |\n|---|---:|---:|---:|")
        for name, disk, ram in table:
            ratio = "" if ram != ram else f"{disk / ram:.2f}"
            ram_text = "" if ram != ram else f"{ram:.0f}"
            print(f"| {name} | {disk:.0f} | {ram_text} | {ratio} |")
        if args.cold_gb > 0:
            capacity, cold_us, hot_us, fill = cold(root, args.cold_gb)
            print(f"\nCold cache: {capacity:,} rows ({capacity * ROW_BYTES / 1e9:.1f} GB, filled in {fill:.0f} s)\n")
            print("| `get_next(32)`, first 300 calls | µs per call |\n|---|---:|")
            print(f"| after `posix_fadvise(DONTNEED)` (from disk) | {cold_us:.0f} |")
            print(f"| file cached | {hot_us:.0f} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
