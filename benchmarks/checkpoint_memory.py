"""Peak memory and time of saving and restoring a filled NumPy buffer with `tf.train.Checkpoint`.

Run: `python -m benchmarks.checkpoint_memory [--gb 1.0] [--kind uniform|frames|all]`.
Each case runs in a fresh subprocess, which builds and fills a buffer of about
`--gb` GB (`PyUniformReplayBuffer` of Atari-sized rows `{obs: u8[84,84,4],
action: i32}`, or `PyFrameReplayBuffer` of `u8[84,84]` frames), then:

  save     `tf.train.Checkpoint(buffer=rb).write(path)`
  restore  `tf.train.Checkpoint(buffer=rb).restore(path)` into the same buffer

Before each step the kernel's peak-RSS counter is reset (`/proc/self/clear_refs`,
Linux), and `VmHWM` is read after it. Columns: the buffer's bytes; RSS of the
process before the buffer was built (TF loaded); the peak during the step;
`extra`, the peak's excess over the RSS just before the step; and `ratio`,
(peak - RSS before the buffer) / buffer bytes: what the buffer plus the step
cost, in buffer sizes (1.0 = no copy at all). Uses only the public API, so it
also measures older code: `PYTHONPATH=<other checkout> python -m benchmarks.checkpoint_memory`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

_GB = 2**30


def _status(field: str) -> int:
    """A `/proc/self/status` memory field, in bytes."""
    with open("/proc/self/status") as f:
        match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    assert match, field
    return int(match.group(1)) * 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def _filled_buffer(kind: str, gb: float):  # noqa: ANN202 (imports TF lazily, in the child only)
    import numpy as np
    import tensorflow as tf

    import tfreplay

    if kind == "uniform":
        spec = {"obs": tf.TensorSpec([84, 84, 4], tf.uint8), "action": tf.TensorSpec([], tf.int32)}
        rows = int(gb * _GB) // (84 * 84 * 4 + 4)
        rb = tfreplay.PyUniformReplayBuffer(spec, rows, seed=0)
        chunk = 2048
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            obs = np.full([n, 84, 84, 4], start % 251 + 1, np.uint8)
            rb.add_batch({"obs": obs, "action": np.arange(start, start + n, dtype=np.int32)})
    else:
        rows = int(gb * _GB) // (84 * 84 + 4 + 13)  # frame, pos and the step's entries
        rb = tfreplay.PyFrameReplayBuffer(tfreplay.frame_data_spec((84, 84)), rows, history_len=4, seed=0)
        chunk = 8192
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            local = np.arange(start, start + n)
            rb.add_batch(
                {
                    "frame": np.full([n, 84, 84], start % 251 + 1, np.uint8),
                    "first": local % 50 == 0,
                    "action": (local % 6).astype(np.int32),
                    "reward": np.ones([n], np.float32),
                    "terminated": local % 50 == 49,
                    "truncated": np.zeros([n], bool),
                }
            )
    return rb


def child(kind: str, gb: float) -> dict:
    """One case, in this process: fill, save, restore; returns the figures."""
    import tensorflow as tf

    baseline = _status("VmRSS")
    rb = _filled_buffer(kind, gb)
    out = {"kind": kind, "buffer_bytes": rb.nbytes, "baseline_rss": baseline}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt")
        for step in ("save", "restore"):
            before = _status("VmRSS")
            _reset_peak()
            start = time.perf_counter()
            if step == "save":
                tf.train.Checkpoint(buffer=rb).write(path)
            else:
                tf.train.Checkpoint(buffer=rb).restore(path)
            seconds = time.perf_counter() - start
            peak = _status("VmHWM")
            out[step] = {"seconds": seconds, "before_rss": before, "peak_rss": peak}
    return out


def _row(case: dict, step: str) -> str:
    s, size = case[step], case["buffer_bytes"]
    extra = (s["peak_rss"] - s["before_rss"]) / size
    ratio = (s["peak_rss"] - case["baseline_rss"]) / size
    return (
        f"| {case['kind']:8s} | {step:8s} | {size / _GB:6.2f} | {case['baseline_rss'] / _GB:6.2f} | "
        f"{s['peak_rss'] / _GB:6.2f} | {extra:5.2f}x | {ratio:5.2f}x | {s['seconds']:6.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--kind", choices=["uniform", "frames", "all"], default="all")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.kind, args.gb)))
        return
    print("| buffer   | step     | GB     | base   | peak   | extra  | ratio  | s      |")
    print("|----------|----------|--------|--------|--------|--------|--------|--------|")
    for kind in ["uniform", "frames"] if args.kind == "all" else [args.kind]:
        cmd = [sys.executable, "-m", "benchmarks.checkpoint_memory", "--child", "--kind", kind, "--gb", str(args.gb)]
        result = subprocess.run(cmd, check=True, capture_output=True, text=True)
        case = json.loads(result.stdout.strip().splitlines()[-1])
        for step in ("save", "restore"):
            print(_row(case, step))


if __name__ == "__main__":
    main()
