"""What a missing TF op costs: `python -m benchmarks.fallbacks [ROUNDS]`.

One process builds each buffer twice, once with the op and once traced under
`tfreplay.native.disabled` (the array-op or XLA fallback), and times the pairs in
interleaved rounds of one 100-iteration graph loop each. The slowdown is taken
within each round; the figures quoted in the missing-kernel warnings come from it.

* prioritized: `TFPrioritizedReplayBuffer`, 100,000 items (1,000 x 100), a loop
  of `get_next(256)` then `update_priorities` of the drawn ids;
* frames: `TFFrameReplayBuffer`, 4 x 5,000 rows of 84x84 frames, history 4, a
  loop of `get_next(32)`.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from typing import Any, Callable

import tensorflow as tf

import tfreplay
from tfreplay import native


def _loop(body: Callable[[], Any], n: int) -> Callable[[], Any]:
    @tf.function
    def run() -> Any:
        for _ in tf.range(n):
            body()
        return 0

    return run


def prioritized() -> Callable[[], Any]:
    spec = {"obs": tf.TensorSpec([4], tf.float32), "r": tf.TensorSpec([], tf.float32)}
    rb = tfreplay.TFPrioritizedReplayBuffer(spec, batch_size=1000, max_length=100, seed=0)
    _loop(lambda: rb.add_batch({"obs": tf.random.normal([1000, 4]), "r": tf.ones([1000])}), 100)()

    def pair() -> None:
        items, info = rb.get_next(256)
        rb.update_priorities(info.ids, tf.abs(tf.cast(items["obs"][:, 0], tf.float64)) + 0.1)

    return _loop(pair, 100)


def frames() -> Callable[[], Any]:
    rb = tfreplay.TFFrameReplayBuffer(tfreplay.frame_data_spec((84, 84)), 4, 5000, 4, seed=0)
    row = {
        "frame": tf.zeros([4, 84, 84], tf.uint8),
        "first": tf.zeros([4], tf.bool),
        "action": tf.zeros([4], tf.int32),
        "reward": tf.zeros([4]),
        "terminated": tf.zeros([4], tf.bool),
        "truncated": tf.zeros([4], tf.bool),
    }
    _loop(lambda: rb.add_batch(row), 5000)()
    return _loop(lambda: rb.get_next(32), 100)


def main(rounds: int = 9) -> None:
    loops = {}
    for name, make, kernel in [("prioritized", prioritized, "sum_tree_ops"), ("frames", frames, "frame_stack")]:
        for side in ("op", "fallback"):
            with native.disabled(kernel) if side == "fallback" else contextlib.nullcontext():
                loops[name, side] = make()
                loops[name, side]()  # traced here, under the same choice of kernel
    seconds: dict = {key: [] for key in loops}
    for _ in range(rounds):
        for key, run in loops.items():
            start = time.perf_counter()
            run()
            seconds[key].append(time.perf_counter() - start)
    print(f"{rounds} interleaved rounds; µs per iteration (median), fallback / op within each round")
    for name in ("prioritized", "frames"):
        op, slow = seconds[name, "op"], seconds[name, "fallback"]
        ratios = [b / a for a, b in zip(op, slow)]
        print(
            f"{name:12} op {statistics.median(op) * 1e4:7.0f}  fallback {statistics.median(slow) * 1e4:7.0f}  "
            f"slowdown {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
