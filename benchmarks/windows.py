"""Transforms over windows (issue 9): sequences' cost against capacity, n-step against a plain window.

Run: `python -m benchmarks.windows [--repeats N] [--block SECONDS] [--only {sequences,n-step}] [--markdown]
[--overlap]`
(a few minutes; `--only` runs one of the two tables).

Buffers: the drivers' `Transition` of CartPole (`observation`/`next_observation`
f32[4], `action` i64, `reward`, `discount` f32, `step_type` i32, `terminated`,
`truncated` bool), 4 segments, full, episodes of 500 steps that end
terminated. The index is set directly (as if every row had been added: `pos`,
its per-segment counts, the counters; rows' values stay zero except the
episode flags), so a 1M-row buffer needs no million adds.

Sequences: `get_next(32, transform=Sequences(80))` (strict: inside one
episode) and `Sequences(80, pad=True)` (padded past an episode's end, with
the mask) at capacity 100k and 1M, each timed in alternating blocks against
the same call on the 10k buffer (`benchmarks.timing.compare`); "ratio" =
this capacity / 10k. Target: at most 1.2. Beside them, without a target:
the bare gather floor (no library code: 32 random windows of 80 items of
one segment, every field, by `tf.gather` in one function call or NumPy
`take`), whose ratio is what memory alone costs at that capacity, and each
call's draw alone (window starts and read plan, no row read; the NumPy
twin's and the TF twin's padded windows over rows are planned in compiled
code, mask included; the TF twin's strict windows by an XLA-compiled draw).

n-step: `get_next(256, transform=NStepReturns(3, 0.99))` against the plain
`get_next(256, num_steps=4)` of the same 100k buffer, alternating blocks;
"ratio" = n-step / plain. Target: at most 1.3. TF eagerly, TF inside a
`tf.function` loop of 50 calls (per call, each call waiting for the previous
one's outputs, as in a training step; `--overlap` times the earlier loop of
independent calls, up to 10 iterations in flight, to reproduce older figures), and the
NumPy twin.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.cases import add_overlap_flag, graph_loop, set_overlap  # noqa: E402
from benchmarks.report import format_table  # noqa: E402
from benchmarks.timing import Bench, compare  # noqa: E402
from tfreplay import NStepReturns, PyUniformReplayBuffer, Sequences, TFUniformReplayBuffer  # noqa: E402
from tfreplay._src import sample  # noqa: E402
from tfreplay._src.episodes import POS_BINS  # noqa: E402
from tfreplay.rl.drivers import Transition  # noqa: E402

SEGMENTS, EPISODE, LOOP = 4, 500, 50
BATCH, STEPS = 32, 80  # sequences: get_next(BATCH, transform=Sequences(STEPS))
SPEC = Transition(
    observation=tf.TensorSpec([4], tf.float32),
    action=tf.TensorSpec([], tf.int64),
    reward=tf.TensorSpec([], tf.float32),
    discount=tf.TensorSpec([], tf.float32),
    next_observation=tf.TensorSpec([4], tf.float32),
    step_type=tf.TensorSpec([], tf.int32),
    terminated=tf.TensorSpec([], tf.bool),
    truncated=tf.TensorSpec([], tf.bool),
)


def full_buffer(twin: str, capacity: int):
    """A full buffer of `capacity` rows whose index says: episodes of EPISODE steps, all ended terminated."""
    length = capacity // SEGMENTS
    if twin == "tf":
        rb = TFUniformReplayBuffer(SPEC, SEGMENTS, length, seed=0)
        state = rb._state

        def put(name, value):
            state[name].assign(value)
    else:
        rb = PyUniformReplayBuffer(SPEC, batch_size=SEGMENTS, max_length=length, seed=0)
        arrays = rb._twin.arrays
        for array in arrays.values():  # written pages: unwritten np.zeros pages all map the one shared zero page
            array.fill(0)

        def put(name, value):
            arrays[name][...] = value

    local = np.repeat(np.arange(length), SEGMENTS)  # row r holds local id r // SEGMENTS
    pos = (local % EPISODE).astype(np.int32)
    put("index/pos", pos)
    put("index/num_adds", np.full([SEGMENTS], length, np.int64))
    per_segment = np.bincount(np.minimum(pos[::SEGMENTS], POS_BINS - 1), minlength=POS_BINS)
    put("index/pos_counts", np.tile(per_segment, (SEGMENTS, 1)).astype(np.int64))
    newest = pos[-SEGMENTS:]  # each segment's newest item: its pos and whether it ended its episode
    put("index/newest", np.stack([newest, newest == EPISODE - 1], 1).astype(np.int32))
    put("storage/step_type", np.where(pos == 0, 0, 1).astype(np.int32))
    put("storage/terminated", pos == EPISODE - 1)
    put("storage/discount", np.where(pos == EPISODE - 1, 0, 1).astype(np.float32))
    return rb


def in_graph(rb, **kwargs):
    """`LOOP` get_next calls in one tf.function's while loop (`cases.graph_loop`), per call."""
    return graph_loop(lambda: rb.get_next(**kwargs)[0], calls=LOOP)


def sequence_draw(twin: str, rb, transform) -> Bench:
    """The draw alone: window starts and the read plan, no row read, as `get_next` plans them (TF: compiled with
    XLA, or padded windows over rows by the two window-plan ops, which read the mask's `pos` in the draw)."""
    parts, made = rb._parts, rb._twin  # private: this row times the draw without the read
    req = rb._sample_request("get_next", BATCH, None, True, transform)
    if twin == "tf":
        draw = lambda: sample.plan(parts, made.view(parts, req), req)  # noqa: E731
        plan = tf.function(draw, autograph=False, jit_compile=True)
        return Bench(plan.get_concrete_function())
    view = parts.view(req.window, req.padded, made.draw, made.uniform, lambda a: a)

    def numpy_draw():
        with made.lock:
            planned = made._compiled(parts, req, view) if req.window is not None or req.padded else None
            return sample.plan(parts, view, req) if planned is None else planned

    return Bench(numpy_draw)


def gather_floor(twin: str, rb, capacity: int) -> Bench:
    """No library code: `BATCH` random windows of `STEPS` consecutive items of one segment, every field
    gathered (`tf.gather` of each variable in one function call; NumPy `take`)."""
    length = capacity // SEGMENTS
    if twin == "tf":
        leaves = [v for name, v in rb._state.items() if name.startswith("storage/")]
        rng = tf.random.Generator.from_seed(1)

        def read():
            segment = rng.uniform([BATCH, 1], 0, SEGMENTS, dtype=tf.int64)
            t = rng.uniform([BATCH, 1], 0, length - STEPS + 1, dtype=tf.int64)
            rows = (t + tf.range(STEPS, dtype=tf.int64)) * SEGMENTS + segment
            return [tf.gather(v, rows) for v in leaves]

        return Bench(tf.function(read, autograph=False).get_concrete_function())
    arrays = [a for name, a in rb._twin.arrays.items() if name.startswith("storage/")]
    rng, steps = np.random.default_rng(1), np.arange(STEPS) * SEGMENTS

    def take():
        rows = rng.integers(0, length - STEPS + 1, [BATCH, 1]) * SEGMENTS + rng.integers(0, SEGMENTS, [BATCH, 1])
        return [a.take(rows + steps, axis=0) for a in arrays]

    return Bench(take)


def sequence_rows(repeats: int, block: float, capacities: list) -> list:
    """Per twin and larger capacity: the bare gather floor, then per transform the call and its draw alone."""
    rows = []
    for twin in ("tf", "py"):
        small = full_buffer(twin, capacities[0])
        for capacity in capacities[1:]:
            big = full_buffer(twin, capacity)
            versus = f"{capacity:,} vs {capacities[0]:,}"
            floor = [gather_floor(twin, rb, size) for rb, size in ((big, capacity), (small, capacities[0]))]
            label = f"{twin.upper()} floor: bare gather, {BATCH} x {STEPS} rows, every field"
            rows.append((label, versus, *compare(*floor, repeats, block), None))
            for name, transform in [("strict", Sequences(STEPS)), ("padded", Sequences(STEPS, pad=True))]:
                call = [Bench(lambda rb=rb, t=transform: rb.get_next(BATCH, transform=t)) for rb in (big, small)]
                label = f"{twin.upper()} Sequences({STEPS}) {name}, get_next({BATCH})"
                rows.append((label, versus, *compare(*call, repeats, block), 1.2))
                draw = [sequence_draw(twin, rb, transform) for rb in (big, small)]
                label = f"{twin.upper()} {name}: its draw alone (starts, plan)"
                rows.append((label, versus, *compare(*draw, repeats, block), None))
            del big
    return rows


def n_step_rows(repeats: int, block: float, capacity: int) -> list:
    rows = []
    n_step = NStepReturns(n=3, gamma=0.99)
    for twin in ("tf", "py"):
        rb = full_buffer(twin, capacity)
        pairs = [
            (
                "eager" if twin == "tf" else "",
                Bench(lambda rb=rb: rb.get_next(256, transform=n_step)),
                Bench(lambda rb=rb: rb.get_next(256, num_steps=4)),
            )
        ]
        if twin == "tf":
            pairs.append(
                (
                    "in-graph",
                    in_graph(rb, sample_batch_size=256, transform=n_step),
                    in_graph(rb, sample_batch_size=256, num_steps=4),
                )
            )
        for variant, subject, baseline in pairs:
            ours, theirs = compare(subject, baseline, repeats, block)
            label = f"{twin.upper()} {variant} NStepReturns(3) vs num_steps=4, get_next(256)".replace("  ", " ")
            rows.append((label, f"{capacity:,}", ours, theirs, 1.3))
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.windows", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block", type=float, default=0.2)
    parser.add_argument("--only", choices=["sequences", "n-step"], help="run only these rows")
    parser.add_argument("--markdown", action="store_true")
    add_overlap_flag(parser)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    set_overlap(args.overlap)
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    rows = []
    if args.only != "n-step":
        rows += sequence_rows(args.repeats, args.block, [10_000, 100_000, 1_000_000])
    if args.only != "sequences":
        rows += n_step_rows(args.repeats, args.block, 100_000)
    head = ["case", "capacity", "µs", "baseline µs", "ratio", "noise", "target", "met?"]
    body = []
    for case, capacity, ours, theirs, target in rows:
        ratio = ours.median / theirs.median
        body.append(
            [
                case,
                capacity,
                f"{ours.median * 1e6:.0f}",
                f"{theirs.median * 1e6:.0f}",
                f"{ratio:.2f}",
                f"±{ours.spread * 50:.0f}%",
                "" if target is None else f"<= {target}",
                "" if target is None else "yes" if ratio <= target else "NO",
            ]
        )
    print(format_table(head, body, args.markdown, numeric=range(2, 6)))
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
