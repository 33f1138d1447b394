"""The Ray replay service (issue 11): insert and sample throughput with 1, 2 and 4 shards, against the
in-process NumPy twin measured in the same run, and the overhead of one call.

Run: `python -m benchmarks.distributed [--quick] [--item small|atari|all]` (needs the `ray` extra).
Starts a local Ray on loopback (2 CPUs' worth of scheduling) and takes a few minutes.

Items
  small  {observation: f32[4], action: i64[], reward: f32[], discount: f32[], next_observation: f32[4]} (48 B)
  atari  {observation: u8[84,84,4], action: i64[]} (28,232 B): what a stacked Atari sample weighs

What is timed (one "call" is one client operation)
  insert     `add_batch` of 64 rows, client-side batching to 256 rows per send, 4 sends in flight, round
             robin over shards; until `flush()` returns. Baseline: `PyUniformReplayBuffer.add_batch`.
  get_next   `get_next(256)`: one request to every shard (draws split in proportion to their sizes),
             a reply from each. Baseline: the twin's `get_next(256)`.
  dataset    `next()` of `as_dataset(256, num_parallel_calls=4)` (4 requests in flight).
             Baseline: the twin's `as_dataset(256)`.
  call       a shard's `num_frames`: Ray's round trip with no work, the floor of any call.
All shards and the client run on this machine, so "more shards" adds processes, not cores: the
figures show the per-call overhead and where one client saturates, not a cluster's scaling.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import ray  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfreplay  # noqa: E402
from tfreplay import distributed  # noqa: E402

ITEMS = {
    "small": {
        "observation": tf.TensorSpec([4], tf.float32),
        "action": tf.TensorSpec([], tf.int64),
        "reward": tf.TensorSpec([], tf.float32),
        "discount": tf.TensorSpec([], tf.float32),
        "next_observation": tf.TensorSpec([4], tf.float32),
    },
    "atari": {"observation": tf.TensorSpec([84, 84, 4], tf.uint8), "action": tf.TensorSpec([], tf.int64)},
}
CAPACITY = {"small": 200_000, "atari": 8_000}  # per shard
ADD_ROWS, SAMPLE = 64, 256


def batch(spec: dict, rows: int, rng: np.random.Generator) -> dict:
    return {k: rng.integers(0, 255, [rows] + s.shape.as_list()).astype(s.dtype.as_numpy_dtype) for k, s in spec.items()}


def item_bytes(spec: dict) -> int:
    return sum(s.dtype.size * int(np.prod(s.shape.as_list())) for s in spec.values())


def per_call(fn: Callable[[], Any], seconds: float, finish: Callable[[], Any] = lambda: None) -> float:
    """Seconds per call of `fn`, run for about `seconds` (after two warm-up calls), `finish` included."""
    fn(), fn()
    finish()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    finish()
    return (time.perf_counter() - start) / calls


def measure(rb: Any, spec: dict, seconds: float, rng: np.random.Generator) -> dict:
    rows = [batch(spec, ADD_ROWS, rng) for _ in range(8)]
    i = iter(range(1 << 40))
    flush = getattr(rb, "flush", lambda: None)
    out = {"insert": per_call(lambda: rb.add_batch(rows[next(i) % 8]), seconds, flush)}
    out["get_next"] = per_call(lambda: rb.get_next(SAMPLE), seconds)
    it = iter(rb.as_dataset(SAMPLE, num_parallel_calls=4))
    out["dataset"] = per_call(lambda: next(it), seconds)
    return out


def call_overhead(actor: Any, twin: Any, seconds: float) -> str:
    call = per_call(lambda: ray.get(actor.num_frames.remote()), seconds)
    local = per_call(twin.num_frames, seconds)
    return f"{call * 1e6:.0f} µs per call through Ray against {local * 1e6:.1f} µs in process"


def row(name: str, kind: str, seconds: dict, base: dict, nbytes: int) -> str:
    cells = []
    for op, rows in (("insert", ADD_ROWS), ("get_next", SAMPLE), ("dataset", SAMPLE)):
        t = seconds[op]
        cells.append(
            f"{t * 1e3:8.2f} ms {rows / t:>10,.0f}/s {rows * nbytes / t / 1e6:>8.1f} MB/s {t / base[op]:>6.1f}x"
        )
    return f"| {name:<14} | {kind:<5} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 s per measurement instead of 3")
    parser.add_argument("--item", choices=["small", "atari", "all"], default="all")
    args = parser.parse_args()
    seconds = 1.0 if args.quick else 3.0
    env = {k: os.environ[k] for k in ("TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS")}
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING",
             log_to_driver=False, runtime_env={"env_vars": env})  # fmt: skip
    rng = np.random.default_rng(0)
    print(f"load average before: {os.getloadavg()}")
    print(
        "| case           | item  | insert (64 rows): per call, rows/s, MB/s, x twin | get_next(256) | dataset(256) |"
    )
    print("|---|---|---|---|---|")
    kinds = ["small", "atari"] if args.item == "all" else [args.item]
    overhead = ""
    for kind in kinds:
        spec, nbytes = ITEMS[kind], item_bytes(ITEMS[kind])
        twin = tfreplay.PyUniformReplayBuffer(spec, CAPACITY[kind], seed=0)
        for _ in range(CAPACITY[kind] // ADD_ROWS // 4):
            twin.add_batch(batch(spec, ADD_ROWS, rng))
        base = measure(twin, spec, seconds, rng)
        print(row("NumPy twin", kind, base, base, nbytes))
        for shards in (1, 2, 4):
            rb = distributed.start_service(
                tfreplay.PyUniformReplayBuffer, spec, CAPACITY[kind], num_shards=shards, seed=0,
                client_options={"send_batch_size": 256, "max_in_flight": 4},
            )  # fmt: skip
            for _ in range(CAPACITY[kind] // ADD_ROWS // 4 * shards):
                rb.add_batch(batch(spec, ADD_ROWS, rng))
            rb.flush()
            print(row(f"{shards} shard(s)", kind, measure(rb, spec, seconds, rng), base, nbytes))
            if kind == kinds[0] and shards == 1:
                overhead = call_overhead(rb.shards.actors[0], twin, seconds)
            rb.close()
    sizes = ", ".join(f"{k} {item_bytes(ITEMS[k]) + 12:,} B" for k in kinds)
    print(f"\nOverhead: {overhead}; bytes per sample: {sizes} (item + 8 B id + 4 B probability)")
    print(f"load average after: {os.getloadavg()}")
    ray.shutdown()


if __name__ == "__main__":
    main()
