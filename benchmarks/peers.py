"""tfreplay beside its peers, one process: TF-Agents' TF and Py buffers, cpprb and dm-reverb.

Run in the compatibility venv (TF 2.15, TF-Agents 0.19): `make bench-peers`,
or `python -m benchmarks.peers [--quick] [--repeats N] [--block S] [--workload cartpole|atari|all]
[--only OP/MODE ...] [--overlap]` (e.g. `--only get_next/in-graph as_dataset/TF`: those groups only).
A library that does not import is skipped with its reason.

Workloads (`workloads.py`): CartPole (16 envs x 4,096 rows, samples of 256
windows x 2 steps) and Atari (4 envs x 5,000 rows of u8[84,84,4], 32 x 2).
Every buffer is full before anything is timed. Modes, per call:
  eager          `add_batch` / `get_next(B, num_steps=2)` called eagerly;
  tf.function    the same call inside the user's `tf.function`, one function call per op; the floor
                 row is a bare `tf.function` with the same inputs and outputs, and "above floor" is
                 what a library adds to it;
  in-graph       200 calls in one `tf.function`'s while loop, per call, each call waiting for the
                 previous one's outputs as in a training step (`cases.graph_loop`, the same loop
                 for every library): the op's own cost; `--overlap` times the earlier loop of
                 independent calls (up to 10 iterations in flight), to reproduce older figures;
  Py             the NumPy buffers (TF-Agents' takes one row per `add_batch`: B calls per batch),
                 cpprb (`add` of the batch; `sample(B * 2)` single items: it has no windows) and
                 reverb (a trajectory writer per env, an item per window, flushed per batch);
  as_dataset     `next()` on `as_dataset(B, num_steps=2).prefetch(AUTOTUNE)` at steady state
                 (reverb: `TrajectoryDataset(...).batch(B)`).
The libraries of one op and mode and their NumPy floor (`cases.numpy_add`:
preallocated assignment; `cases.numpy_gather`: `take` of the window rows) are
timed round-robin, block by block, so every ratio in a group shares the run's
load; a figure is the median over `--repeats` blocks. "vs TF-Agents" = TF-Agents' µs / this
row's µs in the same mode (TF-Agents' TF buffer for TF modes, its Py buffer for
Py and the NumPy datasets): above 1 is faster.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import platform
import time
from typing import Any, Callable, Dict, List

import tensorflow as tf

import tfreplay
from benchmarks import cases
from benchmarks.timing import Bench, Timing, calibrate, run_block
from benchmarks.workloads import ATARI, CARTPOLE, Workload

TARGETS = {("add_batch", "eager"): 2.0, ("get_next", "eager"): 2.0, ("as_dataset", "TF"): 2.0}


@dataclasses.dataclass
class Row:
    workload: str
    op: str
    mode: str
    library: str
    build: Callable[[], Bench]
    baseline: str  # "add" or "gather"


@dataclasses.dataclass
class Result:
    row: Row
    us: float
    numpy_us: float
    noise: float


def _fill_graph(add: Callable[[Any], Any], batch: Any, count: int) -> None:
    @tf.function
    def fill(items: Any, n: tf.Tensor) -> None:
        cases.repeat(lambda: added(add, items), n)

    fill(batch, tf.constant(count))


def tf_agents_buffers(w: Workload, s: cases.Subjects) -> Dict[str, Any]:
    """TF-Agents' TF and Py buffers, full."""
    from tf_agents.replay_buffers import py_uniform_replay_buffer, tf_uniform_replay_buffer
    from tf_agents.specs import tensor_spec

    tf_rb = tf_uniform_replay_buffer.TFUniformReplayBuffer(w.data_spec, w.batch_size, w.max_length)
    _fill_graph(tf_rb.add_batch, s.tf_batch, w.max_length)
    py_rb = py_uniform_replay_buffer.PyUniformReplayBuffer(tensor_spec.to_nest_array_spec(w.data_spec), w.capacity)
    rows = [{k: v[i : i + 1] for k, v in s.batch.items()} for i in range(w.batch_size)]
    for _ in range(w.max_length):
        for row in rows:
            py_rb.add_batch(row)
    return {"tf": tf_rb, "py": py_rb, "rows": rows}


def cpprb_buffer(w: Workload, s: cases.Subjects) -> Any:
    import cpprb

    env_dict = {
        k: {"shape": spec.shape.as_list() or 1, "dtype": spec.dtype.as_numpy_dtype} for k, spec in w.data_spec.items()
    }
    rb = cpprb.ReplayBuffer(w.capacity, env_dict)
    for _ in range(w.max_length):
        rb.add(**s.batch)
    return rb


class Reverb:
    """A uniform reverb table of `num_steps` windows, one trajectory writer per env."""

    def __init__(self, w: Workload, s: cases.Subjects):
        import reverb

        self.w, self.batch = w, s.batch
        signature = {k: tf.TensorSpec([w.num_steps] + sp.shape.as_list(), sp.dtype) for k, sp in w.data_spec.items()}
        table = reverb.Table(
            "t",
            reverb.selectors.Uniform(),
            reverb.selectors.Fifo(),
            w.capacity,
            reverb.rate_limiters.MinSize(1),
            signature=signature,
        )
        self.server = reverb.Server([table])
        self.address = f"localhost:{self.server.port}"
        self.client = reverb.Client(self.address)
        self.writers = [self.client.trajectory_writer(num_keep_alive_refs=w.num_steps) for _ in range(w.batch_size)]
        self.rows = [{k: v[i] for k, v in s.batch.items()} for i in range(w.batch_size)]
        for _ in range(w.max_length):
            self.add()

    def add(self) -> None:
        for writer, row in zip(self.writers, self.rows):
            writer.append(row)
            if writer.episode_steps >= self.w.num_steps:
                writer.create_item("t", 1.0, {k: writer.history[k][-self.w.num_steps :] for k in row})
        for writer in self.writers:
            writer.flush()

    def dataset(self) -> tf.data.Dataset:
        import reverb

        ds = reverb.TrajectoryDataset.from_table_signature(self.address, "t", 4 * self.w.sample_batch_size)
        return ds.batch(self.w.sample_batch_size)


def dataset_bench(ds: tf.data.Dataset) -> Bench:
    iterator = iter(ds.prefetch(tf.data.AUTOTUNE))
    return Bench(lambda: next(iterator), prepare=cases.drain_for(iterator))


def added(add: Callable[[Any], Any], items: Any) -> tf.Tensor:
    """Calls `add`; returns a scalar that depends on it (TF-Agents returns an op, tfreplay a tensor)."""
    with tf.control_dependencies([add(items)]):
        return tf.constant(0, tf.int64)


def sample_floor(s: cases.Subjects) -> Callable[[], Any]:
    """A bare tf.function with no inputs returning tensors shaped like a sample (items, ids, probabilities)."""
    w = s.workload
    items, info = s.tf_buffer.get_next(w.sample_batch_size, w.num_steps)
    out = (dict(items), info.ids, info.probabilities)
    return tf.function(lambda: tf.nest.map_structure(tf.identity, out))


def rows(w: Workload, s: cases.Subjects, peers: Dict[str, Any]) -> List[Row]:
    """Every row of one workload, in table order; peers absent from `peers` are left out."""
    b, t, name = w.sample_batch_size, w.num_steps, w.name
    ours_tf, ours_py = s.tf_buffer, s.py_buffer
    out: List[Row] = []

    def row(op: str, mode: str, library: str, build: Callable[[], Bench], baseline: str) -> None:
        out.append(Row(name, op, mode, library, build, baseline))

    tfa = peers.get("tf_agents")
    add_tf = {"tfreplay": ours_tf.add_batch}
    sample_tf = {"tfreplay": lambda: ours_tf.get_next(b, t)}
    if tfa:
        add_tf["TF-Agents"] = tfa["tf"].add_batch
        sample_tf["TF-Agents"] = lambda: tfa["tf"].get_next(b, t)
    for library, add in add_tf.items():
        row("add_batch", "eager", library, lambda a=add: Bench(lambda: a(s.tf_batch)), "add")
    for library, add in add_tf.items():
        fn = tf.function(lambda items, a=add: added(a, items))  # the same output for both: TF-Agents' is an op
        row("add_batch", "tf.function", library, lambda f=fn: Bench(lambda: f(s.tf_batch)), "add")
    add_floor = tf.function(lambda items: tf.constant(0, tf.int64))
    row("add_batch", "tf.function", "floor: bare tf.function", lambda: Bench(lambda: add_floor(s.tf_batch)), "add")
    for library, add in add_tf.items():
        row("add_batch", "in-graph", library, lambda a=add: cases.graph_loop(lambda: added(a, s.tf_batch)), "add")
    row("add_batch", "Py", "tfreplay", lambda: Bench(lambda: ours_py.add_batch(s.batch)), "add")
    if tfa:
        tfa_py, tfa_rows = tfa["py"], tfa["rows"]
        row("add_batch", "Py", "TF-Agents", lambda: Bench(lambda: [tfa_py.add_batch(r) for r in tfa_rows]), "add")
    if "cpprb" in peers:
        row("add_batch", "Py", "cpprb", lambda: Bench(lambda: peers["cpprb"].add(**s.batch)), "add")
    if "reverb" in peers:
        row("add_batch", "Py", "reverb", lambda: Bench(peers["reverb"].add), "add")

    for library, sample in sample_tf.items():
        row("get_next", "eager", library, lambda f=sample: Bench(f), "gather")
    for library, sample in sample_tf.items():
        fn = tf.function(sample)
        row("get_next", "tf.function", library, lambda f=fn: Bench(f), "gather")
    floor = sample_floor(s)
    row("get_next", "tf.function", "floor: bare tf.function", lambda: Bench(floor), "gather")
    for library, sample in sample_tf.items():
        row("get_next", "in-graph", library, lambda f=sample: cases.graph_loop(lambda: f()[0]), "gather")
    row("get_next", "Py", "tfreplay", lambda: Bench(lambda: ours_py.get_next(b, t)), "gather")
    if tfa:
        row("get_next", "Py", "TF-Agents", lambda: Bench(lambda: tfa["py"].get_next(b, t)), "gather")
    if "cpprb" in peers:
        row("get_next", "Py", "cpprb (single items)", lambda: Bench(lambda: peers["cpprb"].sample(b * t)), "gather")

    def ds(buffer: Any) -> Callable[[], Bench]:
        return lambda: dataset_bench(buffer.as_dataset(b, num_steps=t, num_parallel_calls=tf.data.AUTOTUNE))

    row("as_dataset", "TF", "tfreplay", ds(ours_tf), "gather")
    if tfa:
        row("as_dataset", "TF", "TF-Agents", ds(tfa["tf"]), "gather")
    row("as_dataset", "Py", "tfreplay", ds(ours_py), "gather")
    if tfa:
        py_ds = lambda: dataset_bench(tfa["py"].as_dataset(b, num_steps=t))  # noqa: E731 (no parallel calls there)
        row("as_dataset", "Py", "TF-Agents", py_ds, "gather")
    if "reverb" in peers:
        row("as_dataset", "Py", "reverb", lambda: dataset_bench(peers["reverb"].dataset()), "gather")
    element = tf.data.Dataset.from_tensors(sample_floor(s)()).repeat()
    row("as_dataset", "TF", "floor: next() on a ready element", lambda: dataset_bench(element), "gather")
    return out


def build_peers(w: Workload, s: cases.Subjects, skipped: Dict[str, str]) -> Dict[str, Any]:
    peers: Dict[str, Any] = {}
    makers = {"tf_agents": tf_agents_buffers, "cpprb": cpprb_buffer, "reverb": Reverb}
    for name, make in makers.items():
        try:
            peers[name] = make(w, s)
        except ImportError as err:  # not installed: skipped, with the reason
            skipped[name] = f"{type(err).__name__}: {err}"
    return peers


def round_robin(benches: List[Bench], repeats: int, block: float) -> List[Timing]:
    """Times every bench in turn, `repeats` rounds (each round starting one later), so all share the load."""
    warmup = min(0.5, block)
    calls = [calibrate(b, block, warmup) for b in benches]
    times: List[List[float]] = [[] for _ in benches]
    for r in range(repeats):
        for k in range(len(benches)):
            i = (k + r) % len(benches)
            times[i].append(run_block(benches[i], calls[i], block))
    return [Timing(t) for t in times]


def time_rows(all_rows: List[Row], s: cases.Subjects, repeats: int, block: float) -> List[Result]:
    """Each (op, mode) group's libraries and its NumPy floor, timed round-robin."""
    results = []
    baselines = {"add": lambda: cases.numpy_add(s), "gather": lambda: cases.numpy_gather(s)}
    groups: Dict[tuple, List[Row]] = {}
    for r in all_rows:
        groups.setdefault((r.op, r.mode), []).append(r)
    for group in groups.values():
        benches = [r.build() for r in group] + [baselines[group[0].baseline]()]
        timings = round_robin(benches, repeats, block)
        numpy_us = timings[-1].median * 1e6
        results += [Result(r, t.median * 1e6, numpy_us, t.spread / 2) for r, t in zip(group, timings)]
        del benches
        gc.collect()
    return results


def reference(results: List[Result], r: Result) -> float | None:
    """TF-Agents' µs for the same workload, op and mode (its Py buffer for Py modes)."""
    for other in results:
        same = (other.row.workload, other.row.op, other.row.mode) == (r.row.workload, r.row.op, r.row.mode)
        if same and other.row.library == "TF-Agents":
            return other.us
    return None


def floor_of(results: List[Result], r: Result) -> float | None:
    if r.row.mode != "tf.function" or r.row.library.startswith("floor"):
        return None
    for other in results:
        if (other.row.workload, other.row.op, other.row.mode) == (r.row.workload, r.row.op, r.row.mode):
            if other.row.library.startswith("floor"):
                return r.us - other.us
    return None


def table(results: List[Result]) -> str:
    head = "| workload | op | mode | library | µs/call | noise | NumPy µs | x NumPy | vs TF-Agents | above floor µs |"
    lines = [head, "|" + " --- |" * 4 + " ---: |" * 6]
    for r in results:
        ref, above = reference(results, r), floor_of(results, r)
        mine = r.row.library not in ("TF-Agents",) and not r.row.library.startswith("floor")
        vs = f"{ref / r.us:,.1f}x" if ref is not None and mine else "-"
        lines.append(
            f"| {r.row.workload} | {r.row.op} | {r.row.mode} | {r.row.library} | {r.us:,.1f} | ±{r.noise:.0%} | "
            f"{r.numpy_us:.1f} | {r.us / r.numpy_us:,.1f}x | {vs} | {'-' if above is None else f'{above:,.1f}'} |"
        )
    return "\n".join(lines)


def parse_args(argv: List[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["cartpole", "atari", "all"], default="all")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block", type=float, default=0.1)
    parser.add_argument("--quick", action="store_true", help="1,024-row segments, 3 repeats")
    parser.add_argument("--only", nargs="+", metavar="OP/MODE", help="time only these groups, e.g. get_next/in-graph")
    cases.add_overlap_flag(parser)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    cases.set_overlap(args.overlap)
    chosen = [w for w in (CARTPOLE, ATARI) if args.workload in ("all", w.name)]
    if args.quick:
        chosen = [dataclasses.replace(w, max_length=1024) for w in chosen]
        args.repeats = 3
    versions = [
        f"tensorflow {tf.__version__}",
        f"tfreplay {tfreplay.__version__}",
        f"Python {platform.python_version()}",
    ]
    start, load = time.time(), os.getloadavg()[0]
    results: List[Result] = []
    skipped: Dict[str, str] = {}
    for w in chosen:
        s = cases.setup(w)
        peers = build_peers(w, s, skipped)
        gc.freeze()
        chosen_rows = [r for r in rows(w, s, peers) if not args.only or f"{r.op}/{r.mode}" in args.only]
        results += time_rows(chosen_rows, s, args.repeats, args.block)
        del s, peers
        gc.unfreeze()
        gc.collect()
    try:
        import tf_agents

        versions.append(f"tf-agents {tf_agents.__version__}")
    except ImportError:
        pass
    print(
        f"{', '.join(versions)}; {args.repeats} repeats x {args.block} s blocks; {time.time() - start:.0f} s; "
        f"1-min load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print(table(results))


if __name__ == "__main__":
    main()
