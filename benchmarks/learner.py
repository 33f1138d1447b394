"""The learner at full speed: replay-to-update pipelines side by side, against the constant-batch floor.

Run: `python -m benchmarks.learner [--rounds N] [--block SECONDS] [--only WORKLOAD ...]`, or
`make bench-learner` (a few minutes on two cores; manual, not a test).

Workloads, each from a full 50k-item buffer (4 segments of 12,500 random transitions):

* dqn: Double DQN (`tfreplay.rl.agents.DqnAgent`, Huber loss, Adam) on the
  demo's 256x256 ReLU MLP Q-network, CartPole shapes (observation f32[4], 2
  actions), batch 128, `TFUniformReplayBuffer`;
* dqn-prioritized: the same from a `TFPrioritizedReplayBuffer` (alpha 0.6):
  importance weights of beta 0.4 in the step and `update_priorities(|TD
  error| + 1e-6)` after it;
* ddpg: the update of `examples/keras_ddpg.py` (critic, actor and soft target
  updates; 256x256 actor and critic), Pendulum shapes (observation f32[3],
  action f32[1]), batch 64, `TFUniformReplayBuffer`.

Rows, per train step (the same update in every row):

* floor: the update fed one fixed batch (sampled once, constant tensors), 64
  updates in one `tf.function` while loop, each after the previous one: the
  cost of the update alone, no buffer, no call;
* numpy + convert_to_tensor: the common Keras pattern: the transitions in
  NumPy arrays, indices drawn with NumPy, the batch turned into tensors
  (`tf.convert_to_tensor`, every field) and the update's `tf.function` called,
  once per step (uniform workloads);
* as_dataset + tf.function: `as_dataset(sample_batch_size).prefetch(AUTOTUNE)`
  read by Python, one call of the update's `tf.function` per batch (uniform
  workloads);
* get_next in tf.function: one `tf.function` per step that samples
  (`get_next`) and updates (and gives priorities), called from Python;
* TrainLoop K: `tfreplay.TrainLoop(buffer, step, K, batch)`, one call per K
  steps, K = 1, 4, 16, 64;
* TrainLoop K + XLA: the same with `jit_compile=True` (K = 16, 64); a
  prioritized buffer's sum tree then runs as array ops, not its compiled op.

Each row's time is the median over `--rounds` rounds, each round timing one
block of every row in turn (so load from other processes hits all rows
alike); "x floor" is the row over the floor.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfreplay import TFPrioritizedReplayBuffer, TFUniformReplayBuffer, TrainLoop, importance_weights  # noqa: E402
from tfreplay.keras import keras_module  # noqa: E402
from tfreplay.rl.agents import DqnAgent, make_q_network  # noqa: E402
from tfreplay.rl.drivers import Transition  # noqa: E402

SEGMENTS, ITEMS, FLOOR_STEPS = 4, 50_000, 64
WORKLOADS = ("dqn", "dqn-prioritized", "ddpg")


def spec(num_observations: int, action: tf.TensorSpec) -> Transition:
    scalar, flag = tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.bool)
    observation = tf.TensorSpec([num_observations], tf.float32)
    return Transition(observation, action, scalar, scalar, observation, tf.TensorSpec([], tf.int32), flag, flag)


def random_steps(transition_spec: Transition) -> Transition:
    """`ITEMS` random transitions as NumPy arrays shaped `[ITEMS // SEGMENTS, SEGMENTS, ...]`."""
    rng, shape = np.random.default_rng(0), (ITEMS // SEGMENTS, SEGMENTS)
    continuous = transition_spec.action.dtype == tf.float32
    action_shape = shape + tuple(transition_spec.action.shape)
    num_observations = transition_spec.observation.shape[0]
    return Transition(
        observation=rng.normal(size=shape + (num_observations,)).astype(np.float32),
        action=rng.uniform(-2, 2, action_shape).astype(np.float32) if continuous else rng.integers(0, 2, shape),
        reward=rng.normal(size=shape).astype(np.float32),
        discount=(rng.random(shape) > 0.02).astype(np.float32),
        next_observation=rng.normal(size=shape + (num_observations,)).astype(np.float32),
        step_type=np.ones(shape, np.int32),
        terminated=np.zeros(shape, bool),
        truncated=np.zeros(shape, bool),
    )


def filled(transition_spec: Transition, steps: Transition, prioritized: bool) -> Any:
    """A full buffer of `steps` (one `add_batch` per step of the 4 segments)."""
    length = ITEMS // SEGMENTS
    if prioritized:
        rb = TFPrioritizedReplayBuffer(transition_spec, SEGMENTS, length, alpha=0.6, seed=0)
    else:
        rb = TFUniformReplayBuffer(transition_spec, batch_size=SEGMENTS, max_length=length, seed=0)
    for t in range(length):
        rb.add_batch(tf.nest.map_structure(lambda x, t=t: x[t], steps))
    assert int(rb.num_frames()) == ITEMS
    return rb


@dataclasses.dataclass
class Workload:
    """A learner's update and its replay: `update(items, info) -> (loss, priorities or None)`."""

    title: str
    batch: int
    buffer: Any
    steps: Transition  # the stored transitions, in NumPy
    update: Callable[[Any, Any], tuple]


def dqn(prioritized: bool) -> Workload:
    transition_spec = spec(4, tf.TensorSpec([], tf.int64))
    steps = random_steps(transition_spec)
    rb = filled(transition_spec, steps, prioritized)
    network = make_q_network(transition_spec.observation, 2, (256, 256), seed=0)
    optimizer = keras_module(network).optimizers.Adam(5e-4)
    agent = DqnAgent(
        transition_spec.observation, 2, network, optimizer, target_update_period=500, gradient_clipping=10.0
    )

    def update(items: Any, info: Any) -> tuple:
        if not prioritized:
            return agent.train(items).loss, None
        loss_info = agent.train(items, importance_weights(info.probabilities, rb.num_frames(), 0.4))
        return loss_info.loss, tf.cast(loss_info.abs_td_errors, tf.float64) + 1e-6

    replay = "prioritized" if prioritized else "uniform"
    return Workload(f"Double DQN, 256x256 MLP, batch 128, {replay}", 128, rb, steps, update)


def ddpg() -> Workload:
    from examples.keras_ddpg import Ddpg

    transition_spec = spec(3, tf.TensorSpec([1], tf.float32))
    steps = random_steps(transition_spec)
    rb = filled(transition_spec, steps, prioritized=False)
    agent = Ddpg(3, 1, 2.0)
    return Workload(
        "DDPG (examples/keras_ddpg.py), 256x256 actor and critic, batch 64, uniform",
        64,
        rb,
        steps,
        lambda items, info: (agent.train_step(items)["critic_loss"], None),
    )


def rows(w: Workload) -> dict:
    """`name -> (call, train steps per call)`, each traced (and compiled) before it is timed."""
    rb, batch, prioritized = w.buffer, w.batch, isinstance(w.buffer, TFPrioritizedReplayBuffer)
    items, info = rb.get_next(batch)
    fixed = tf.nest.map_structure(tf.identity, (items, info))  # one fixed batch, as constants

    @tf.function
    def floor():
        def body(i, loss):
            with tf.control_dependencies([loss]):
                return i + 1, w.update(*fixed)[0]

        return tf.while_loop(lambda i, _: i < FLOOR_STEPS, body, (0, 0.0), parallel_iterations=1)[1]

    update = tf.function(lambda items: w.update(items, None)[0])
    flat = [np.reshape(x, (ITEMS,) + x.shape[2:]) for x in w.steps]  # the NumPy buffer
    rng = np.random.default_rng(0)

    def numpy_buffer():
        ids = rng.integers(0, ITEMS, batch)
        return update(Transition(*(tf.convert_to_tensor(x[ids]) for x in flat)))

    dataset = iter(rb.as_dataset(sample_batch_size=batch).prefetch(tf.data.AUTOTUNE))

    @tf.function
    def get_next():
        items, info = rb.get_next(batch)
        loss, priorities = w.update(items, info)
        if priorities is not None:
            rb.update_priorities(info.ids, priorities)
        return loss

    step = (lambda items, info: w.update(items, info)) if prioritized else (lambda i, f: w.update(i, f)[0])
    out: dict = {"floor (fixed batch)": (floor, FLOOR_STEPS)}
    if not prioritized:  # a NumPy buffer, and a dataset read without priorities, are uniform replay
        out["numpy + convert_to_tensor"] = (numpy_buffer, 1)
        out["as_dataset + tf.function"] = (lambda: update(next(dataset)[0]), 1)
    out["get_next in tf.function"] = (get_next, 1)
    for k in (1, 4, 16, 64):
        out[f"TrainLoop K={k}"] = (TrainLoop(rb, step, k, batch), k)
    for k in (16, 64):
        out[f"TrainLoop K={k} + XLA"] = (TrainLoop(rb, step, k, batch, jit_compile=True), k)
    for call, _ in out.values():  # trace and compile now, not in a timed block
        call()
        call()
    return out


def block(call: Callable, steps: int, seconds: float) -> float:
    """Seconds per train step over about `seconds` of calls."""
    calls, start = 0, time.perf_counter()
    while True:
        np.asarray(tf.nest.flatten(call())[0])  # the result read back: the call has finished
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / (calls * steps)


def table(name: str, rounds: int, seconds: float) -> None:
    w = ddpg() if name == "ddpg" else dqn(prioritized=name == "dqn-prioritized")
    cases = rows(w)
    times: dict = {row: [] for row in cases}
    for _ in range(rounds):
        for row, (call, steps) in cases.items():
            times[row].append(block(call, steps, seconds))
    floor = statistics.median(times["floor (fixed batch)"])
    print(f"\n{name}: {w.title}, {ITEMS:,}-item buffer")
    print(f"| {'row':<25} | steps/s | ms/step | spread | x floor |")
    print(f"|{'-' * 27}|---------|---------|--------|---------|")
    for row, values in times.items():
        median = statistics.median(values)
        spread = (max(values) - min(values)) / median
        print(f"| {row:<25} | {1 / median:7.0f} | {1e3 * median:7.3f} | {spread:6.0%} | {median / floor:7.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of one block per row (median over them)")
    parser.add_argument("--block", type=float, default=0.5, help="seconds per block")
    parser.add_argument("--only", choices=WORKLOADS, nargs="+", default=WORKLOADS, help="the workloads to time")
    args = parser.parse_args()
    print(
        f"TensorFlow {tf.__version__}, {keras_module().__name__} {keras_module().__version__}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    )
    for name in WORKLOADS:
        if name in args.only:
            table(name, args.rounds, args.block)


if __name__ == "__main__":
    main()
