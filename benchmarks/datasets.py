"""`tfreplay.datasets.load_rlds`: import throughput and peak memory, for datasets 1x and 3x the buffer's size.

Run: `python -m benchmarks.datasets [--items N] [--episode-len T] [--dir PATH]`.

An RLDS directory of Atari-like steps (`observation: u8[84,84]`, envlogger convention, episodes of
`--episode-len` steps) is written once with `save_rlds`, `3 * --items` steps in all. Each case then runs in a
fresh process: the buffer is built and warmed (a one-episode load), the process's peak RSS is reset
(`/proc/self/clear_refs`), the dataset is loaded, and the table shows steps per second and how far the peak
RSS rose above the resident size before the load. With streaming, that rise is about the buffer's own size
whatever the dataset's size. The floor row reads the same directory with TFDS alone (`as_numpy_iterator`
over every episode's steps, nothing kept): the input pipeline's own speed.

glibc's malloc keeps some of the memory tf.data frees (its mmap threshold grows with the sizes it sees), so
the resident size of any long tf.data read climbs by a few hundred MB before it levels off; the last column
repeats each case with `MALLOC_MMAP_THRESHOLD_=1048576` (a fixed threshold), where it does not.
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
    began = time.perf_counter()
    num_items = run(directory)
    seconds = time.perf_counter() - began
    return {
        "items": num_items,
        "seconds": seconds,
        "peak_rise_mb": (rss_kb("VmHWM") - before) / 1024,
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
    parser.add_argument("--items", type=int, default=8_000, help="the buffer's capacity in items")
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
        sizes = {1: os.path.join(root, "x1"), 3: os.path.join(root, "x3")}
        for times, path in sizes.items():
            write_dataset(path, times * args.items, args.episode_len)
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, TF {tf.__version__}")
        print(
            f"\nBuffers of {args.items:,} items of {84 * 84 * 2 + 17:,} bytes; episodes of {args.episode_len} "
            f"steps; datasets of 1x and 3x the buffer ({dir_mb(sizes[1]):.0f} and {dir_mb(sizes[3]):.0f} MB "
            "on disk). Peak rise: the peak RSS during the load above the RSS before it.\n"
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
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
