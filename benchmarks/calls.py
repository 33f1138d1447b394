"""How many of tfreplay's own Python functions one call runs, and in how many files.

Run: `python -m benchmarks.calls [--trace]`. Each case builds a small buffer,
fills it, warms the call up (traces, kernel loads), then records every Python
function entered inside the `tfreplay` package during one more call
(`sys.setprofile`; C functions and other packages are not counted). A short
path through few files is what a reader follows; `--trace` prints it, indented
by call depth.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfreplay  # noqa: E402

ROOT = pathlib.Path(tfreplay.__file__).parent
SPEC = {"observation": tf.TensorSpec([4], tf.float32), "action": tf.TensorSpec([], tf.int64)}


def _rows(batch: int) -> dict:
    return {"observation": np.zeros([batch, 4], np.float32), "action": np.zeros([batch], np.int64)}


def _frames(batch: int, k: int) -> dict:
    spec = tfreplay.frame_data_spec((8, 8))
    row = {key: np.zeros([batch] + s.shape.as_list(), s.dtype.as_numpy_dtype) for key, s in spec.items()}
    row["first"][:] = k % 10 == 0
    return row


def cases() -> dict[str, Callable[[], Callable[[], Any]]]:
    def py_uniform() -> Callable[[], Any]:
        rb = tfreplay.PyUniformReplayBuffer(SPEC, 1000, seed=0)
        rb.add_batch(_rows(500))
        return lambda: rb.get_next(32)

    def py_prioritized() -> Callable[[], Any]:
        rb = tfreplay.PyPrioritizedReplayBuffer(SPEC, 1000, seed=0)
        rb.add_batch(_rows(500))
        return lambda: rb.get_next(32)

    def tf_uniform() -> Callable[[], Any]:
        rb = tfreplay.TFUniformReplayBuffer(SPEC, 4, 250, seed=0)
        for _ in range(100):
            rb.add_batch(_rows(4))
        return lambda: rb.get_next(32)

    def tf_frames() -> Callable[[], Any]:
        rb = tfreplay.TFFrameReplayBuffer(tfreplay.frame_data_spec((8, 8)), 4, 250, seed=0)
        for k in range(100):
            rb.add_batch(_frames(4, k))
        return lambda: rb.get_next(32)

    return {
        "NumPy uniform get_next(32)": py_uniform,
        "NumPy prioritized get_next(32)": py_prioritized,
        "TF uniform get_next(32), eager": tf_uniform,
        "TF frames get_next(32), eager": tf_frames,
    }


def record(call: Callable[[], Any]) -> list[tuple[int, str, str]]:
    """`(depth, file, function)` of every tfreplay function entered during `call()`."""
    calls: list[tuple[int, str, str]] = []
    depth = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            depth[0] += 1
            path = pathlib.Path(frame.f_code.co_filename)
            if ROOT in path.parents:
                calls.append((depth[0], str(path.relative_to(ROOT)), frame.f_code.co_name))
        elif event == "return":
            depth[0] -= 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="store_true", help="print each call, indented by depth")
    args = parser.parse_args(argv)
    print("| call | tfreplay functions | files |\n|---|---:|---:|")
    traces = {}
    for name, make in cases().items():
        call = make()
        for _ in range(3):
            call()
        traces[name] = record(call)
        print(f"| {name} | {len(traces[name])} | {len({f for _, f, _ in traces[name]})} |")
    if args.trace:
        for name, calls in traces.items():
            print(f"\n{name}:")
            low = min((d for d, _, _ in calls), default=0)
            for d, file, fn in calls:
                print(f"{'  ' * (d - low)}{file}:{fn}")


if __name__ == "__main__":
    main()
