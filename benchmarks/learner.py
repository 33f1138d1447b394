"""The learner at full speed: train steps per graph call (`tfreplay.TrainLoop`) against the constant-batch floor.

Run: `python -m benchmarks.learner [--rounds N] [--block SECONDS] [--only {uniform,prioritized}]`
(a few minutes on two cores; manual, not a test).

Workload: Double DQN (`tfreplay.rl.agents.DqnAgent`, Huber loss, Adam) on a
256x256 ReLU MLP Q-network from CartPole-shaped transitions (observation
f32[4], 2 actions), batches of 128, from a full 50k-item buffer (4 segments
of 12,500), uniform (`TFUniformReplayBuffer`) or prioritized
(`TFPrioritizedReplayBuffer`, alpha 0.6: importance weights of beta 0.4 in
the step and `update_priorities(|TD error| + 1e-6)` after it).

Rows, per train step:

* floor: the same train step fed one fixed batch (sampled once, constant
  tensors), 64 steps in one `tf.function` while loop, each after the
  previous one: the cost of the step alone, no buffer;
* get_next per call: one `tf.function` per step that samples (`get_next`),
  trains (and with priorities weighs and updates), called from Python;
* fused K: `agent.train_loop(rb, 128, steps_per_call=K)`, one call per K
  steps, K = 1, 4, 16, 64;
* fused K + XLA: the same with `jit_compile=True` (K = 16, 64); a
  prioritized buffer's sum tree then runs as array ops, not its compiled op.

Each row's time is the median over `--rounds` rounds, each round timing one
block of every row in turn (so load from other processes hits all rows
alike); "ratio" is the row over the floor.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfreplay import TFPrioritizedReplayBuffer, TFUniformReplayBuffer, importance_weights  # noqa: E402
from tfreplay.keras import keras_module  # noqa: E402
from tfreplay.rl.agents import DqnAgent, make_q_network  # noqa: E402
from tfreplay.rl.drivers import Transition  # noqa: E402

SEGMENTS, ITEMS, BATCH, FLOOR_STEPS = 4, 50_000, 128, 64
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


def filled(prioritized: bool):
    """A full buffer of random transitions (one `add_batch` per step of the 4 segments)."""
    rng = np.random.default_rng(0)
    length = ITEMS // SEGMENTS
    if prioritized:
        rb = TFPrioritizedReplayBuffer(SPEC, SEGMENTS, length, alpha=0.6, seed=0)
    else:
        rb = TFUniformReplayBuffer(SPEC, batch_size=SEGMENTS, max_length=length, seed=0)
    shape = (length, SEGMENTS)
    steps = Transition(
        observation=rng.normal(size=shape + (4,)).astype(np.float32),
        action=rng.integers(0, 2, shape),
        reward=np.ones(shape, np.float32),
        discount=(rng.random(shape) > 0.02).astype(np.float32),
        next_observation=rng.normal(size=shape + (4,)).astype(np.float32),
        step_type=np.ones(shape, np.int32),
        terminated=np.zeros(shape, bool),
        truncated=np.zeros(shape, bool),
    )
    for t in range(length):
        rb.add_batch(tf.nest.map_structure(lambda x, t=t: x[t], steps))
    assert int(rb.num_frames()) == ITEMS
    return rb


def make_agent() -> DqnAgent:
    network = make_q_network(SPEC.observation, 2, (256, 256), seed=0)
    optimizer = keras_module(network).optimizers.Adam(5e-4)
    return DqnAgent(SPEC.observation, 2, network, optimizer, target_update_period=500, gradient_clipping=10.0)


def rows(prioritized: bool) -> dict:
    """`name -> (call, train steps per call)`, each traced (and compiled) before it is timed."""
    rb, agent = filled(prioritized), make_agent()
    items, info = rb.get_next(BATCH)
    items = tf.nest.map_structure(tf.identity, items)  # one fixed batch, as constants
    weights = importance_weights(info.probabilities, rb.num_frames(), 0.4) if prioritized else None

    @tf.function
    def floor():
        def body(i, loss):
            with tf.control_dependencies([loss]):
                return i + 1, agent.train(items, weights).loss

        return tf.while_loop(lambda i, _: i < FLOOR_STEPS, body, (0, 0.0), parallel_iterations=1)[1]

    @tf.function
    def per_call():
        items, info = rb.get_next(BATCH)
        if not prioritized:
            return agent.train(items).loss
        loss_info = agent.train(items, importance_weights(info.probabilities, rb.num_frames(), 0.4))
        rb.update_priorities(info.ids, tf.cast(loss_info.abs_td_errors, tf.float64) + 1e-6)
        return loss_info.loss

    out = {"floor (fixed batch)": (floor, FLOOR_STEPS), "get_next per call": (per_call, 1)}
    for k in (1, 4, 16, 64):
        out[f"fused K={k}"] = (agent.train_loop(rb, BATCH, k, beta=0.4), k)
    for k in (16, 64):
        out[f"fused K={k} + XLA"] = (agent.train_loop(rb, BATCH, k, beta=0.4, jit_compile=True), k)
    for call, _ in out.values():  # trace and compile now, not in a timed block
        call()
        call()
    return out


def block(call, steps: int, seconds: float) -> float:
    """Seconds per train step over about `seconds` of calls."""
    calls, start = 0, time.perf_counter()
    while True:
        np.asarray(tf.nest.flatten(call())[0])  # the result read back: the call has finished
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / (calls * steps)


def table(name: str, prioritized: bool, rounds: int, seconds: float) -> None:
    cases = rows(prioritized)
    times: dict = {row: [] for row in cases}
    for _ in range(rounds):
        for row, (call, steps) in cases.items():
            times[row].append(block(call, steps, seconds))
    floor = statistics.median(times["floor (fixed batch)"])
    print(f"\n{name}: Double DQN, 256x256 MLP, batch {BATCH}, {ITEMS:,}-item buffer")
    print(f"| {'row':<22} | ms/step | spread | ratio vs floor |")
    print(f"|{'-' * 24}|---------|--------|----------------|")
    for row, values in times.items():
        median = statistics.median(values)
        spread = (max(values) - min(values)) / median
        print(f"| {row:<22} | {1e3 * median:7.3f} | {spread:6.0%} | {median / floor:14.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of one block per row (median over them)")
    parser.add_argument("--block", type=float, default=0.5, help="seconds per block")
    parser.add_argument("--only", choices=["uniform", "prioritized"], help="one table")
    args = parser.parse_args()
    print(
        f"TensorFlow {tf.__version__}, {keras_module().__name__} {keras_module().__version__}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    )
    for name, prioritized in (("uniform", False), ("prioritized", True)):
        if args.only in (None, name):
            table(name, prioritized, args.rounds, args.block)


if __name__ == "__main__":
    main()
