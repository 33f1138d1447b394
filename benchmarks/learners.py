"""The learners the learner benchmarks feed: an update, its full replay buffer, and the same transitions in NumPy.

* dqn: Double DQN (`tfreplay.rl.agents.DqnAgent`, Huber loss, Adam) on a
  256x256 ReLU Q-network (the demo's is 64x64), CartPole shapes (observation f32[4], 2
  actions), batch 128, `TFUniformReplayBuffer`;
* dqn-prioritized: the same from a `TFPrioritizedReplayBuffer` (alpha 0.6),
  importance weights of beta 0.4 in the step, priorities `|TD error| + 1e-6`;
* ddpg: the update of `examples/keras_ddpg.py` (critic, actor, soft target
  updates; 256x256 actor and critic), Pendulum shapes, batch 64, uniform.

Each buffer holds 50,000 random transitions (4 segments of 12,500), full.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from benchmarks.common import size
from tfreplay import TFPrioritizedReplayBuffer, TFUniformReplayBuffer, importance_weights
from tfreplay.keras import keras_module
from tfreplay.rl.agents import DqnAgent, make_q_network
from tfreplay.rl.drivers import Transition

SEGMENTS = 4
ITEMS = size(50_000, 512)
NAMES = ("dqn", "dqn-prioritized", "ddpg")


@dataclasses.dataclass
class Learner:
    """A learner's update and its replay: `update(items, info) -> (loss, priorities or None)`."""

    name: str
    batch: int
    buffer: Any
    steps: Transition  # the stored transitions, NumPy arrays shaped [ITEMS // SEGMENTS, SEGMENTS, ...]
    update: Callable[[Any, Any], tuple]

    @property
    def prioritized(self) -> bool:
        return isinstance(self.buffer, TFPrioritizedReplayBuffer)


def spec(num_observations: int, action: tf.TensorSpec) -> Transition:
    scalar, flag = tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.bool)
    observation = tf.TensorSpec([num_observations], tf.float32)
    return Transition(observation, action, scalar, scalar, observation, tf.TensorSpec([], tf.int32), flag, flag)


def random_steps(transition_spec: Transition) -> Transition:
    """`ITEMS` random transitions."""
    rng, shape = np.random.default_rng(0), (ITEMS // SEGMENTS, SEGMENTS)
    action_shape = shape + tuple(transition_spec.action.shape)
    num_observations = transition_spec.observation.shape[0]
    continuous = transition_spec.action.dtype == tf.float32
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


def fill(rb: Any, steps: Any) -> Any:
    """Adds `steps` (a nest of `[T, SEGMENTS, ...]` arrays) one time step per `add_batch`, in one graph call."""
    tensors = tf.nest.map_structure(tf.constant, steps)

    @tf.function
    def add_all() -> None:
        for t in tf.range(tf.shape(tf.nest.flatten(tensors)[0])[0]):
            rb.add_batch(tf.nest.map_structure(lambda x, t=t: x[t], tensors))

    add_all()
    return rb


def filled(transition_spec: Transition, steps: Transition, prioritized: bool, device: str = "cpu:*") -> Any:
    length = ITEMS // SEGMENTS
    if prioritized:
        rb = TFPrioritizedReplayBuffer(transition_spec, SEGMENTS, length, alpha=0.6, device=device, seed=0)
    else:
        rb = TFUniformReplayBuffer(transition_spec, batch_size=SEGMENTS, max_length=length, device=device, seed=0)
    return fill(rb, steps)


def dqn(prioritized: bool = False, device: str = "cpu:*") -> Learner:
    transition_spec = spec(4, tf.TensorSpec([], tf.int64))
    steps = random_steps(transition_spec)
    rb = filled(transition_spec, steps, prioritized, device)
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

    return Learner("dqn-prioritized" if prioritized else "dqn", 128, rb, steps, update)


def ddpg() -> Learner:
    from examples.keras_ddpg import Ddpg

    transition_spec = spec(3, tf.TensorSpec([1], tf.float32))
    steps = random_steps(transition_spec)
    rb = filled(transition_spec, steps, prioritized=False)
    agent = Ddpg(3, 1, 2.0)
    return Learner("ddpg", 64, rb, steps, lambda items, info: (agent.train_step(items)["critic_loss"], None))


def learner(name: str) -> Learner:
    return ddpg() if name == "ddpg" else dqn(prioritized=name == "dqn-prioritized")
