"""`tfreplay.datasets.load_rlds`: import throughput and peak memory, for datasets 1x, 3x and 6x the buffer's size.

Run: `python -m benchmarks.datasets [--items N] [--times 1,3,6] [--episode-len T] [--dir PATH]`.

RLDS directories of Atari-like steps (`observation: u8[84,84]`, envlogger convention, episodes of
`--episode-len` steps) are written once with `save_rlds`, `--times` the buffer's capacity each. Each case runs in a
fresh process: the buffer is built and warmed (a one-episode load), the process's peak RSS is reset
(`/proc/self/clear_refs`), the dataset is loaded four times, and the table shows steps per second (the fastest
load) and how far the peak RSS rose above the resident size before the first load: the buffer's own pages as
they fill, plus what the reading holds. `load_rlds` itself holds one episode and a chunk of steps; the rest is
TFDS's own reading, the floor row: the same directory read with TFDS alone (`as_numpy_iterator` over every
episode's steps, nothing kept), the input pipeline's own speed and memory.

glibc's malloc keeps some of the memory tf.data frees (its mmap threshold grows with the sizes it sees), so
the resident size of a long tf.data read climbs by a few hundred MB before it levels off; the last column
repeats each case with `MALLOC_MMAP_THRESHOLD_=1048576` (a fixed threshold), where it levels off lower.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

OBS = tf.TensorSpec([84, 84], tf.uint8)
SPEC = {
    "observation": OBS,
    "next_observation": OBS,
    "action": tf.TensorSpec([], tf.int32),
    "reward": tf.TensorSpec([], tf.float32),
    "discount": tf.TensorSpec([], tf.float32),
    "step_type": tf.TensorSpec([], tf.int32),
    "terminated": tf.TensorSpec([], tf.bool),
    "truncated": tf.TensorSpec([], tf.bool),
}
KINDS = ("floor", "PyUniformReplayBuffer", "TFUniformReplayBuffer")
REPEATS = 4  # loads per case: the peak rise is the first one's, the speed the fastest one's


def write_dataset(directory: str, num_steps: int, episode_len: int) -> None:
    """`num_steps` steps in episodes of `episode_len`, written through a NumPy buffer, one block at a time."""
    import tfreplay
    from tfreplay import datasets

    rng = np.random.default_rng(0)
    block = 10 * episode_len
    for start in range(0, num_steps, block):
        rb = tfreplay.PyUniformReplayBuffer(SPEC, capacity=block, seed=0)
        t = np.arange(block) % episode_len
        frames = rng.integers(0, 255, [block + 1, 84, 84], np.uint8)
        rb.add_batch(
            {
                "observation": frames[:-1],
                "next_observation": frames[1:],
                "action": (np.arange(block) + start).astype(np.int32),
                "reward": np.ones(block, np.float32),
                "discount": np.ones(block, np.float32),
                "step_type": (t > 0).astype(np.int32),
                "terminated": np.zeros(block, bool),
                "truncated": t == episode_len - 1,
            }
        )
        datasets.save_rlds(rb, directory, append=start > 0)


def rss_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def case(kind: str, directory: str, warm_dir: str, items: int) -> dict:
    """One measurement, in this process (run by `main` in a fresh one)."""
    import tensorflow_datasets as tfds

    import tfreplay
    from tfreplay import datasets

    if kind == "floor":
        buffer, nbytes = None, 0
    elif kind == "PyUniformReplayBuffer":
        buffer = tfreplay.PyUniformReplayBuffer(SPEC, capacity=items, seed=0)
    else:
        buffer = tfreplay.TFUniformReplayBuffer(SPEC, batch_size=4, max_length=items // 4)

    def run(path: str) -> int:
        if buffer is None:
            episodes = tfds.builder_from_directory(path).as_dataset(split="train")
            steps = episodes.flat_map(lambda e: e["steps"].batch(1024))
            return sum(len(s["is_first"]) for s in steps.as_numpy_iterator())
        return datasets.load_rlds(path, buffer).num_items

    run(warm_dir)
    if buffer is not None:
        buffer.clear()
        nbytes = buffer.nbytes
    before = rss_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM, the peak resident size, to the current one
    seconds, peaks = [], []
    for _ in range(REPEATS):
        if buffer is not None:
            buffer.clear()
        began = time.perf_counter()
        num_items = run(directory)
        seconds.append(time.perf_counter() - began)
        peaks.append((rss_kb("VmHWM") - before) / 1024)
    return {
        "items": num_items,
        "seconds": min(seconds),
        "peak_rise_mb": peaks[0],  # the first load's
        "peaks_mb": peaks,
        "buffer_mb": nbytes / 2**20,
    }


def measure(kind: str, directory: str, warm_dir: str, items: int, env: dict | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.datasets", "--case", kind, directory, warm_dir, str(items)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def dir_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=4_000, help="the buffer's capacity in items")
    parser.add_argument("--times", default="1,3,6", help="dataset sizes, in buffer capacities")
    parser.add_argument("--episode-len", type=int, default=200)
    parser.add_argument("--dir", default=None, help="where to write the datasets (default: a temporary folder)")
    parser.add_argument("--case", nargs=4, metavar=("KIND", "DIR", "WARM_DIR", "ITEMS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        kind, directory, warm_dir, items = args.case
        print(json.dumps(case(kind, directory, warm_dir, int(items))))
        return
    began = time.perf_counter()
    root = tempfile.mkdtemp(dir=args.dir, prefix="tfreplay-datasets-")
    try:
        warm = os.path.join(root, "warm")
        write_dataset(warm, args.episode_len, args.episode_len)
        sizes = {int(t): os.path.join(root, f"x{t}") for t in args.times.split(",")}
        for times, path in sizes.items():
            write_dataset(path, times * args.items, args.episode_len)
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, TF {tf.__version__}")
        print(
            f"\nBuffers of {args.items:,} items of {84 * 84 * 2 + 17:,} bytes; episodes of {args.episode_len} "
            f"steps; datasets of {', '.join(f'{t}x' for t in sizes)} the buffer "
            f"({', '.join(f'{dir_mb(p):.0f}' for p in sizes.values())} MB on disk). Peak rise: the peak RSS during "
            "the load above the RSS before it.\n"
        )
        print(
            "| reader | dataset | steps/s | vs floor | buffer MB | peak rise MB | with a fixed mmap threshold |\n"
            "|---|---:|---:|---:|---:|---:|---:|"
        )
        for times, path in sizes.items():
            floor = None
            for kind in KINDS:
                got = measure(kind, path, warm, args.items)
                fixed = measure(kind, path, warm, args.items, {"MALLOC_MMAP_THRESHOLD_": "1048576"})
                rate = got["items"] / got["seconds"]
                floor = floor or rate
                ratio = "1.00" if kind == "floor" else f"{rate / floor:.2f}"
                name = "TFDS alone (floor)" if kind == "floor" else f"`load_rlds` into {kind}"
                buffer_mb = f"{got['buffer_mb']:.0f}" if kind != "floor" else "-"
                print(
                    f"| {name} | {times}x | {rate:,.0f} | {ratio} | {buffer_mb} | {got['peak_rise_mb']:.0f} | "
                    f"{fixed['peak_rise_mb']:.0f} |",
                    flush=True,
                )
            if times == max(sizes):
                last = got, fixed  # the TF buffer's, on the largest dataset
        default, fixed_threshold = (", ".join(f"{mb:.0f}" for mb in run["peaks_mb"]) for run in last)
        print(
            f"\nPeak rise after each of the {REPEATS} loads of the {max(sizes)}x dataset into the TF buffer, MB: "
            f"{default} (default malloc); {fixed_threshold} (fixed mmap threshold)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
