"""Prioritized replay: sample + update against uniform sampling and cpprb (issue 9).

Run: `python -m benchmarks.prioritized [--quick] [--repeats N] [--block S] [--markdown] [--overlap]`
(`make bench-prioritized` installs the `bench` extra, with cpprb, first).

Buffers: CartPole items {observation: f32[4], action: i64[], reward: f32[],
discount: f32[]}, 16 segments x 65,536 rows (1M rows), filled, then every
item given a random priority in [0.1, 10) (alpha 0.6).

Each row times a subject beside a baseline in the same process, in
alternating blocks (`timing.compare`): medians over blocks, ratio = subject /
baseline.
  PER pair    `get_next(256)` then `update_priorities(ids, new priorities)`
              of the drawn ids, against uniform `get_next(256)` of the same
              buffer kind: NumPy twins, and TF in-graph (200 calls in one
              tf.function's while loop, per call, each call waiting for the
              previous one's outputs, as in a training step; `--overlap`
              times the earlier loop of independent calls, up to 10
              iterations in flight, to reproduce older figures). Target: <= 1.5x.
  cpprb       the NumPy PER pair against cpprb's PrioritizedReplayBuffer
              (same items and capacity): `sample(256, beta=0.4)` then
              `update_priorities(indexes, new priorities)`. Target: <= 2x.
  fallback    the same PER pairs with the compiled sum tree off (array ops).
  floor       TF's in-graph floor beside the uniform in-graph sample: random
              rows + one `tf.gather` per leaf in the same loop.
  kernels     the compiled ring sample and ring update of a pair, called
              directly on the PER buffer's tree (no sampler or buffer code,
              no item read), against the uniform `get_next`: the share of
              a pair that is the sum tree's own work (a 16 MB tree: its
              descent and update miss the cache at every level).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any, List, Sequence  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import report, timing  # noqa: E402
from benchmarks.cases import add_overlap_flag, graph_loop, repeat, set_overlap  # noqa: E402
from benchmarks.run import _freeze_heap, _load, machine_facts  # noqa: E402
from tfreplay import PrioritizedSampler, PyUniformReplayBuffer, TFUniformReplayBuffer, compose  # noqa: E402

SEGMENTS, LENGTH, SAMPLE, ALPHA = 16, 65536, 256, 0.6
SPEC = {
    "observation": tf.TensorSpec([4], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "reward": tf.TensorSpec([], tf.float32),
    "discount": tf.TensorSpec([], tf.float32),
}


def _batch(rng: np.random.Generator) -> dict:
    return {
        "observation": rng.normal(size=(SEGMENTS, 4)).astype(np.float32),
        "action": rng.integers(0, 2, SEGMENTS),
        "reward": np.ones(SEGMENTS, np.float32),
        "discount": np.ones(SEGMENTS, np.float32),
    }


class _Assembled(compose.Buffer):
    """TFPrioritizedReplayBuffer / PyPrioritizedReplayBuffer assembled with a sampler whose compiled sum tree can be
    turned off (`tfreplay.compose`)."""

    update_priorities = compose.update_priorities


def _tf_buffer(sampler: Any, seed: int) -> Any:
    if sampler is None:
        return TFUniformReplayBuffer(SPEC, SEGMENTS, LENGTH, seed=seed)
    twin = compose.TFTwin("per", seed=seed)
    return _Assembled(SPEC, twin, batch_size=SEGMENTS, max_length=LENGTH, sampler=sampler, episode_rule=None)


def _py_buffer(sampler: Any, seed: int) -> Any:
    if sampler is None:
        return PyUniformReplayBuffer(SPEC, batch_size=SEGMENTS, max_length=LENGTH, seed=seed)
    twin = compose.NumpyTwin(seed)
    return _Assembled(SPEC, twin, batch_size=SEGMENTS, max_length=LENGTH, sampler=sampler, episode_rule=None)


def _fill(buffer: Any, batch: dict, priorities: np.ndarray | None) -> Any:
    if isinstance(buffer, tf.Module) and buffer.variables():
        tf_batch = tf.nest.map_structure(tf.constant, batch)

        @tf.function
        def fill(count: tf.Tensor) -> None:
            repeat(lambda: buffer.add_batch(tf_batch), count)

        fill(tf.constant(LENGTH))
    else:
        for _ in range(LENGTH):
            buffer.add_batch(batch)
    if priorities is not None:
        buffer.update_priorities(np.arange(SEGMENTS * LENGTH), priorities)
    return buffer


def _py_pair(buffer: Any, rng: np.random.Generator) -> timing.Bench:
    new = rng.uniform(0.1, 10.0, SAMPLE)

    def pair() -> None:
        _, info = buffer.get_next(SAMPLE)
        buffer.update_priorities(info.ids, new)

    return timing.Bench(pair)


def _tf_pair(buffer: Any) -> timing.Bench:
    def step() -> Any:
        items, info = buffer.get_next(SAMPLE)
        new = tf.cast(tf.abs(items["observation"][:, 0]), tf.float64) + 0.1
        return items, buffer.update_priorities(info.ids, new)

    return graph_loop(step)


def _tf_sample(buffer: Any) -> timing.Bench:
    return graph_loop(lambda: buffer.get_next(SAMPLE))


def _tf_floor(buffer: Any) -> timing.Bench:
    leaves = [v for v in buffer.variables() if v.shape.rank and v.shape[0] == SEGMENTS * LENGTH]
    rows = lambda: tf.random.uniform([SAMPLE], 0, SEGMENTS * LENGTH, tf.int64)  # noqa: E731
    return graph_loop(lambda: [tf.gather(v, rows()) for v in leaves])


def _kernels_floor(per: Any, rng: np.random.Generator) -> timing.Bench:
    """The compiled ring sample and ring update of a PER pair, called directly on `per`'s tree (no sampler or
    buffer code around them, no item read): TF in-graph, or NumPy."""
    parts = per._parts  # the buffer's parts (private: this row times them without the buffer)
    sampler, adds, ops = parts.sampler, parts.num_adds, parts.ops
    tree, numpy = sampler.tree, ops.name == "numpy"

    def pair(u: Any, new: Any) -> Any:
        segment, t, *_ = tree.ring_sample(ops, adds if numpy else adds.read_value(), u, LENGTH)
        return tree.ring_update(ops, adds, t * SEGMENTS + segment, new, ALPHA, sampler.max_priority, LENGTH)[1]

    if numpy:
        new = rng.uniform(0.1, 10.0, SAMPLE)
        return timing.Bench(lambda: pair(rng.uniform(size=SAMPLE), new))
    draws = lambda: tf.random.uniform([SAMPLE], dtype=tf.float64)  # noqa: E731
    return graph_loop(lambda: pair(draws(), draws() * 9.9 + 0.1))


def _cpprb(batch: dict, priorities: np.ndarray, rng: np.random.Generator) -> timing.Bench | None:
    try:
        import cpprb
    except ImportError:
        print("# cpprb is not installed (pip install -e '.[bench]'): its row is left out", file=sys.stderr)
        return None
    env = {"obs": {"shape": 4}, "act": {"dtype": np.int64}, "rew": {}, "done": {}}
    buffer = cpprb.PrioritizedReplayBuffer(SEGMENTS * LENGTH, env, alpha=ALPHA)
    rows = {"obs": batch["observation"], "act": batch["action"], "rew": batch["reward"], "done": batch["discount"]}
    for _ in range(LENGTH):
        buffer.add(**rows)
    buffer.update_priorities(np.arange(SEGMENTS * LENGTH), priorities)
    new = rng.uniform(0.1, 10.0, SAMPLE)

    def pair() -> None:
        sample = buffer.sample(SAMPLE, beta=0.4)
        buffer.update_priorities(sample["indexes"], new)

    return timing.Bench(pair)


def rows_to_time(seed: int) -> List[tuple]:
    """`(case, subject bench, baseline bench, target ratio)`, building and filling every buffer."""
    rng = np.random.default_rng(seed)
    batch, priorities = _batch(rng), rng.uniform(0.1, 10.0, SEGMENTS * LENGTH)
    started = time.perf_counter()
    py_uniform = _fill(_py_buffer(None, seed), batch, None)
    py_per = _fill(_py_buffer(PrioritizedSampler(ALPHA), seed), batch, priorities)
    py_slow = _fill(_py_buffer(PrioritizedSampler(ALPHA, use_native=False), seed), batch, priorities)
    tf_uniform = _fill(_tf_buffer(None, seed), batch, None)
    tf_per = _fill(_tf_buffer(PrioritizedSampler(ALPHA), seed), batch, priorities)
    tf_slow = _fill(_tf_buffer(PrioritizedSampler(ALPHA, use_native=False), seed), batch, priorities)
    cpprb_pair = _cpprb(batch, priorities, rng)
    print(f"# setup: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    py_base = timing.Bench(lambda: py_uniform.get_next(SAMPLE))
    lazy: List[tuple] = [
        ("NumPy: PER pair / uniform get_next", lambda: _py_pair(py_per, rng), lambda: py_base, 1.5),
        ("NumPy: PER pair, no native / uniform", lambda: _py_pair(py_slow, rng), lambda: py_base, None),
        ("TF in-graph: PER pair / uniform get_next", lambda: _tf_pair(tf_per), lambda: _tf_sample(tf_uniform), 1.5),
        ("TF in-graph: PER pair, no native / uniform", lambda: _tf_pair(tf_slow), lambda: _tf_sample(tf_uniform), None),
        ("TF in-graph: floor / uniform get_next", lambda: _tf_floor(tf_uniform), lambda: _tf_sample(tf_uniform), None),
        (
            "NumPy: PER kernels alone / uniform get_next",
            lambda: _kernels_floor(py_per, rng),
            lambda: py_base,
            None,
        ),
        (
            "TF in-graph: PER kernels alone / uniform get_next",
            lambda: _kernels_floor(tf_per, rng),
            lambda: _tf_sample(tf_uniform),
            None,
        ),
    ]
    if cpprb_pair is not None:
        lazy.insert(1, ("NumPy: PER pair / cpprb PER pair", lambda: _py_pair(py_per, rng), lambda: cpprb_pair, 2.0))
    return lazy


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prioritized", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats of 0.05 s blocks")
    parser.add_argument("--repeats", type=int, default=None, help="timed blocks per side (default 9, quick 3)")
    parser.add_argument("--block", type=float, default=None, help="seconds per block (default 0.2, quick 0.05)")
    parser.add_argument("--markdown", action="store_true", help="print a README-ready Markdown table")
    parser.add_argument("--seed", type=int, default=0)
    add_overlap_flag(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    set_overlap(args.overlap)
    repeats = args.repeats or (3 if args.quick else 9)
    block = args.block or (0.05 if args.quick else 0.2)
    load, started = _load(), time.perf_counter()
    lazy = rows_to_time(args.seed)
    _freeze_heap()
    body = []
    for name, subject, baseline, target in lazy:
        times = timing.compare(subject(), baseline(), repeats, block)
        ratio = times[0].median / times[1].median
        met = "-" if target is None else ("yes" if ratio <= target else "NO")
        body.append(
            [
                name,
                f"{1e6 * times[0].median:.1f}",
                f"±{50 * times[0].spread:.0f}%",
                f"{1e6 * times[1].median:.1f}",
                f"{ratio:.2f}x",
                "-" if target is None else f"<= {target}x",
                met,
            ]
        )
        gc.collect()
    fence = "" if args.markdown else "# "
    command = "python -m benchmarks.prioritized " + " ".join(sys.argv[1:] if argv is None else argv)
    print(
        f"{fence}{command.strip()}: {repeats} repeats x {block} s blocks, {time.perf_counter() - started:.0f} s; "
        f"1-min load average {load} at the start, {_load()} at the end"
    )
    print(f"{fence}{machine_facts()}; 1M rows (16 x 65,536), samples of {SAMPLE}, alpha {ALPHA}\n")
    head = ["case (subject / baseline)", "subject µs", "noise", "baseline µs", "ratio", "target", "met?"]
    print(report.format_table(head, body, args.markdown, numeric=range(1, 5)))


if __name__ == "__main__":
    main()
