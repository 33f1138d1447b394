"""The learner and the buffer's add/sample on the GPU and on the CPU, side by side, as one Markdown table.

    python -m benchmarks.gpu                 # needs a GPU; a few minutes
    python -m benchmarks.gpu --cpu-only      # the same cases, the "GPU" side on CPU:0 (checks the script)

Each case runs twice, once with everything on the CPU and once with the buffer
built with `device="GPU:0"` and the network's variables and the call placed on
the GPU: add_batch and get_next of the CartPole and Atari workloads
(`benchmarks.common`), 200 calls in one serialized graph loop, per call, and
TensorFlow's floor for the add (its `scatter_update` of the same rows); the
DQN learner (`benchmarks.learners`: 256x256 Q-network, batch 128, a 50,000-item
uniform buffer) with `get_next` in the step's `tf.function`, and fused by
`tfreplay.TrainLoop` at K=64, without XLA and at its default (XLA, unless
the buffer keeps fields in host memory, which XLA on the device cannot
read). A figure is the median over `--blocks` blocks of about `--seconds`
each, the result read back after every call (so the device's queue is
included); "GPU / CPU" is the ratio of the two.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any, Callable, Dict, List, Sequence


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-only", action="store_true", help="no GPU: run the GPU side on CPU:0")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per block (default 0.5)")
    parser.add_argument("--blocks", type=int, default=5, help="blocks per case and device (default 5)")
    parser.add_argument("--tiny", action="store_true", help="tiny buffers and loops: checks, not figures")
    return parser.parse_args(argv)


def per_call(call: Callable[[], Any], ops: int, seconds: float, blocks: int) -> float:
    """Median seconds per operation over `blocks` blocks of about `seconds`, after two warm-up calls."""
    import numpy as np
    import tensorflow as tf

    def run() -> None:
        np.asarray(tf.nest.flatten(call())[0])  # read back: the call and what it queued have finished

    run(), run()
    times = []
    for _ in range(blocks):
        calls, start = 0, time.perf_counter()
        while True:
            run()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        times.append(elapsed / (calls * ops))
    return statistics.median(times)


USED_XLA: Dict[str, bool] = {}  # device -> whether the default TrainLoop compiled with XLA


def cases(device: str) -> Dict[str, tuple]:
    """`case -> (call, operations per call)`, everything built on `device`."""
    import numpy as np
    import tensorflow as tf

    import tfreplay
    from benchmarks import learners
    from benchmarks.common import ATARI, CARTPOLE, GraphLoop, fill_in_graph

    out: Dict[str, tuple] = {}
    with tf.device(device):
        for w in (CARTPOLE, ATARI):
            batch = tf.nest.map_structure(tf.constant, w.make_batch(np.random.default_rng(0)))
            rb = tfreplay.TFUniformReplayBuffer(w.spec, w.batch_size, w.max_length, device=device, seed=0)
            fill_in_graph(rb.add_batch, batch, w.max_length)
            b, t = w.sample_batch_size, w.num_steps
            add, sample = (
                GraphLoop(lambda rb=rb, x=batch: rb.add_batch(x)),
                GraphLoop(lambda rb=rb, b=b, t=t: rb.get_next(b, num_steps=t)[0]),
            )
            out[f"{w.name} add_batch({w.batch_size} rows), in-graph"] = (add, add.ops)
            floor = GraphLoop(scatter_floor(w.spec, w.max_length * w.batch_size, batch))
            out[f"{w.name} TF floor: scatter_update of those rows"] = (floor, floor.ops)
            out[f"{w.name} get_next({b}, num_steps={t}), in-graph"] = (sample, sample.ops)
        learner = learners.dqn(device=device)

        @tf.function
        def get_next_step() -> tf.Tensor:
            return learner.update(*learner.buffer.get_next(learner.batch))[0]

        step = lambda items, info: learner.update(items, info)[0]  # noqa: E731
        k = 64 if learners.ITEMS == 50_000 else 2
        out["DQN: get_next in the step's tf.function"] = (get_next_step, 1)
        plain = tfreplay.TrainLoop(learner.buffer, step, k, learner.batch, jit_compile=False)
        out[f"DQN: TrainLoop K={k}"] = (plain, k)
        # The default: XLA, unless the buffer keeps fields in host memory (a GPU's int32 and bool rows), which
        # XLA on the device cannot read; `TrainLoop.jit_compile` says which ran.
        auto = tfreplay.TrainLoop(learner.buffer, step, k, learner.batch)
        out[f"DQN: TrainLoop K={k}, default jit_compile"] = (auto, k)
        USED_XLA[device] = auto.jit_compile
    return out


def scatter_floor(spec: Any, capacity: int, batch: Any) -> Callable[[], Any]:
    """TensorFlow's own write of `batch`'s rows: one `scatter_update` per field into a plain variable of
    `capacity` rows, at the next rows each call (what `add_batch` does, without its index and checks)."""
    import tensorflow as tf

    store = [tf.Variable(tf.zeros([capacity, *s.shape], s.dtype)) for s in tf.nest.flatten(spec)]
    rows = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
    at = tf.Variable(tf.constant(0, tf.int64))

    def write() -> Any:
        ids = (at + tf.range(rows)) % capacity
        ops = [v.scatter_update(tf.IndexedSlices(x, ids)) for v, x in zip(store, tf.nest.flatten(batch))]
        with tf.control_dependencies(ops):
            return at.assign_add(rows)

    return write


def timed(device: str, seconds: float, blocks: int) -> Dict[str, float]:
    import tensorflow as tf

    out = {}
    for name, (call, ops) in cases(device).items():
        with tf.device(device):
            out[name] = per_call(call, ops, seconds, blocks)
    return out


def table(cpu: Dict[str, float], gpu: Dict[str, float], gpu_label: str) -> str:
    lines = [f"| case | CPU ms | {gpu_label} ms | {gpu_label} / CPU |", "| --- | ---: | ---: | ---: |"]
    for name, seconds in cpu.items():
        lines.append(f"| {name} | {seconds * 1e3:.3f} | {gpu[name] * 1e3:.3f} | {gpu[name] / seconds:.2f}x |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> List[str]:
    args = parse_args(argv)
    if args.tiny:
        os.environ["TFREPLAY_BENCH_TINY"] = "1"  # read when benchmarks.common is imported, below
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and not args.cpu_only:
        raise SystemExit("benchmarks.gpu: TensorFlow sees no GPU here; pass --cpu-only to run both sides on the CPU.")
    gpu_device, gpu_label = ("CPU:0", "CPU:0 (--cpu-only)") if args.cpu_only else ("GPU:0", "GPU")
    started = time.perf_counter()
    cpu = timed("CPU:0", args.seconds, args.blocks)
    gpu = timed(gpu_device, args.seconds, args.blocks)
    name = "none" if not gpus else tf.config.experimental.get_device_details(gpus[0]).get("device_name", "a GPU")
    lines = [
        f"`python -m benchmarks.gpu{' --cpu-only' if args.cpu_only else ''}`: {args.blocks} blocks x "
        f"{args.seconds} s per case and device, {time.perf_counter() - started:.0f} s; TensorFlow {tf.__version__}, "
        f"{os.cpu_count()} CPUs ({platform.machine()}), GPU: {name}",
        "",
        table(cpu, gpu, gpu_label),
        "",
        f"The default TrainLoop compiled with XLA: CPU {USED_XLA['CPU:0']}, {gpu_label} {USED_XLA[gpu_device]}.",
    ]
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
