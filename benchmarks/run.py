"""Benchmarks of tfreplay's uniform buffers against plain NumPy (issue 2).

Run: `python -m benchmarks.run [--quick] [--repeats N] [--workload cartpole|atari|all] [--markdown] [--overlap]`
(`make bench`). A full run takes about two minutes, `--quick` about half a minute.

Workloads
  cartpole  {observation: f32[4], action: i64[], reward: f32[], discount: f32[]} (32 B);
            16 segments (envs) x 4,096 rows; samples of 256 windows x 2 steps.
  atari     {observation: u8[84,84,4], action: i64[]} (28,232 B);
            4 segments x 5,000 rows (564 MB); samples of 32 windows x 2 steps.
Both buffers are filled to capacity before anything is timed.

What is timed, per workload (one "call" is one operation; items are rows:
`batch_size` for an add, `sample_batch_size * num_steps` for a sample)
  add_batch   TF buffer called inside a tf.function, per call of that function
              (also with jit_compile=True); TF in-graph: 200 add_batch calls in
              one tf.function's while loop, per call; TF eagerly; Py buffer.
  get_next    TF eagerly, per call; TF in-graph: 200 get_next calls in one
              tf.function's while loop (items as loop variables), per call, also
              with jit_compile=True; Py.
In-graph figures are per call with each call waiting for the previous one's
outputs, as in a training step (`cases.graph_loop`). `--overlap` times the
earlier loop (calls independent of the previous one's outputs, up to 10
iterations in flight) to reproduce figures from before (same for the graph floor).
  as_dataset  `iter(as_dataset(B, num_steps=2, num_parallel_calls=p).prefetch(AUTOTUNE))`
              for both buffers, p in (AUTOTUNE, None); per `next()` at steady
              state (before each block the iterator is drained for a quarter of
              a block, so no block is served from a backlog).
"XLA" rows: under XLA the TF buffer skips its lock (XLA has no mutex), so that
mode is only safe when nothing writes or samples concurrently.

Baseline (the "NumPy µs" column and the ratio = ours / NumPy), timed in the
same run on plain preallocated NumPy arrays, one per leaf, filled:
  add_batch   `array[pos:pos + batch_size] = leaf` per leaf, pos going round the ring;
  get_next, as_dataset
              `array.take(rows, axis=0)` per leaf, for random `[B, num_steps]`
              window rows in the buffers' layout, drawn beforehand (drawing
              rows is not timed, gathering them is).

Floors (`floors.py`): the same NumPy baselines beside the cheapest call of each
kind a buffer is built on (a tf.function call taking the add batch, random rows
+ tf.gather in a graph loop, `next()` on a dataset repeating a ready element,
NumPy drawing rows + take). A ratio target below a floor's ratio cannot be met
by any buffer that makes that kind of call.

Method: each subject and its baseline are warmed up, then timed in alternating
blocks of about `--block` seconds (baseline first on even repeats, subject
first on odd ones) so that load from other processes on a shared machine hits
both; a figure is the median over `--repeats` blocks of the time per call, and
"noise" is half the range of the subject's blocks relative to that median. A
block stops early past twice its length, so a starved run still ends on time.
The heap is `gc.freeze()`-d after setup so the `gc.collect()` before each
block is cheap. The header prints the 1-minute load average: above the CPU
count, other processes took part of the run; prefer the ratios then (both
sides share the load) and rerun for absolute figures.

Memory, per buffer: `buffer.nbytes / capacity` against the spec's bytes per
item, and the process's RSS growth while the buffer is created (after, and the
peak sampled every millisecond during construction) and once every row has
been written (NumPy's zeroed pages only become resident when written). The
RSS limit is the items' spec bytes + 1/16 (TensorFlow's allocator alone keeps
that much extra for a huge tensor) + 32 MiB (see `report.py`).

Targets (issue 2; absolute ones on CartPole only, ratios on both workloads, see
`report.py`): TF add_batch in a tf.function <= 0.15 ms per call; TF get_next
and as_dataset (both buffers) <= 2x NumPy, as_dataset >= 1M items/s; Py
get_next <= 1.5x NumPy; storage = capacity x spec bytes + O(1).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import List, Sequence  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import cases, floors, report, timing  # noqa: E402
from benchmarks.workloads import WORKLOADS  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short blocks and 3 repeats (about 30 s)")
    parser.add_argument("--repeats", type=int, default=None, help="timed blocks per side (default 9, quick 3)")
    parser.add_argument("--block", type=float, default=None, help="seconds per block (default 0.12, quick 0.05)")
    parser.add_argument("--workload", choices=["all"] + sorted(WORKLOADS), default="all")
    parser.add_argument("--markdown", action="store_true", help="print README-ready Markdown tables")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="print each case's wall time to stderr")
    cases.add_overlap_flag(parser)
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 9
    if args.block is None:
        args.block = 0.05 if args.quick else 0.12
    if args.repeats < 1 or args.block <= 0:
        parser.error(f"--repeats ({args.repeats}) must be >= 1 and --block ({args.block}) > 0.")
    return args


def _load() -> str:
    """The 1-minute load average: above the CPU count, other processes share the timings."""
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"


def machine_facts() -> str:
    """CPU, core count and library versions: the context every figure needs."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{os.cpu_count()} CPUs ({cpu}); Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}, NumPy {np.__version__}"
    )


def _freeze_heap() -> None:
    """Moves every live object out of the collector's reach.

    With TensorFlow loaded a full `gc.collect()` takes ~0.15 s; after
    `gc.freeze()` the collection before each timed block only scans new objects.
    """
    gc.collect()
    gc.freeze()


def run_workload(name: str, args: argparse.Namespace) -> tuple:
    """Sets up one workload, times all its cases; returns `(rows, memory)`."""
    started = time.perf_counter()
    subjects = cases.setup(WORKLOADS[name], seed=args.seed)
    if args.verbose:
        print(f"# {name} setup: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    _freeze_heap()
    rows: List[report.Row] = []
    for case in cases.cases(subjects) + floors.floor_cases(subjects):
        case_started = time.perf_counter()
        subject, baseline = case.build()
        times = timing.compare(subject, baseline, args.repeats, args.block)
        target = report.timing_target(name, case.op, case.variant)
        rows.append(report.Row(name, case.op, case.variant, case.items, *times, target=target))
        del subject, baseline  # stop a dataset's prefetch threads before the next case
        gc.collect()
        if args.verbose:
            print(f"#   {case.op} {case.variant}: {time.perf_counter() - case_started:.1f} s", file=sys.stderr)
    memory = [(name, buffer, m) for buffer, m in subjects.memory.items()]
    del subjects
    gc.unfreeze()  # let the next workload's collections free this one's buffers
    gc.collect()
    print(f"# {name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return rows, memory


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    cases.set_overlap(args.overlap)
    _freeze_heap()
    names = sorted(WORKLOADS, reverse=True) if args.workload == "all" else [args.workload]
    rows: List[report.Row] = []
    memory: List[tuple] = []
    started, load = time.perf_counter(), _load()
    for name in names:
        workload_rows, workload_memory = run_workload(name, args)
        rows += workload_rows
        memory += workload_memory
    command = "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv)
    fence = "" if args.markdown else "# "
    print(
        f"{fence}{command.strip()}: {args.repeats} repeats x {args.block} s blocks, "
        f"{time.perf_counter() - started:.0f} s; 1-min load average {load} at the start, {_load()} at the end"
    )
    print(f"{fence}{machine_facts()}\n")
    print(report.timing_table(rows, args.markdown) + "\n")
    print(report.memory_table(memory, args.markdown))


if __name__ == "__main__":
    main()
