"""Policies for drivers: callables from a batch of observations to a batch of actions.

Any such callable works with a driver; these two cover the usual needs: a
uniform random policy for initial collection and an epsilon-greedy policy
around a Keras Q-network for DQN.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Union

import gymnasium as gym
import numpy as np
import tensorflow as tf

Nest = Any  # a tf.nest structure of arrays or tensors
Epsilon = Union[float, Callable[[], float]]


def _batch_size(observation: Nest) -> int:
    return int(np.shape(tf.nest.flatten(observation)[0])[0])


class RandomPolicy:
    """Samples each action uniformly from a (single-environment) action space.

    The policy samples from its own copy of the space, so the caller's space
    (often the env's own `action_space`) keeps its random state: seeding or
    drawing here never changes what the caller's `sample()` returns.

    Args:
      action_space: the space of one action (`env.single_action_space` for a
        vector env); copied, not modified.
      seed: seed of the sampling; `None` for a fresh one.
    """

    def __init__(self, action_space: gym.Space, seed: int | None = None):
        if not isinstance(action_space, gym.Space):
            raise TypeError(f"RandomPolicy: action_space ({action_space!r}) must be a gymnasium.Space.")
        self.action_space = copy.deepcopy(action_space)
        self.action_space.seed(seed)

    def __call__(self, observation: Nest) -> Nest:
        samples = [self.action_space.sample() for _ in range(_batch_size(observation))]
        return tf.nest.map_structure(lambda *rows: np.stack(rows), *samples)


class EpsilonGreedyPolicy:
    """The greedy action of a Q-network, or a random one with probability epsilon.

    Args:
      q_network: a Keras model mapping a batch of observations to `[batch,
        num_actions]` Q-values.
      action_space: a `gymnasium.spaces.Discrete` (its `start` is honored), or
        the number of actions (int64 actions from 0).
      epsilon: the exploration rate, or a callable returning it (read at
        every call, for a decaying schedule). `0` is the greedy policy.
      seed: seed of the exploration draws.
    """

    def __init__(
        self, q_network: Any, action_space: gym.spaces.Discrete | int, epsilon: Epsilon = 0.1, seed: int | None = None
    ):
        if isinstance(action_space, (int, np.integer)) and not isinstance(action_space, bool):
            action_space = gym.spaces.Discrete(int(action_space))
        if not isinstance(action_space, gym.spaces.Discrete):
            raise TypeError(f"EpsilonGreedyPolicy: action_space ({action_space!r}) must be a Discrete space or an int.")
        if not callable(epsilon) and not 0.0 <= float(epsilon) <= 1.0:
            raise ValueError(f"EpsilonGreedyPolicy: epsilon ({epsilon!r}) must be in [0, 1] or a callable.")
        self.q_network = q_network
        self.num_actions = int(action_space.n)
        self._start = int(action_space.start)
        self._dtype = action_space.dtype
        self.epsilon = epsilon
        self._rng = np.random.default_rng(seed)
        self._greedy = tf.function(self._greedy_actions)

    def _greedy_actions(self, observation: Nest) -> tf.Tensor:
        return tf.argmax(self.q_network(observation, training=False), axis=-1, output_type=tf.int64)

    def __call__(self, observation: Nest) -> np.ndarray:
        greedy = self._greedy(observation).numpy()
        epsilon = float(self.epsilon() if callable(self.epsilon) else self.epsilon)
        if epsilon > 0:
            explore = self._rng.random(greedy.shape) < epsilon
            greedy = np.where(explore, self._rng.integers(0, self.num_actions, greedy.shape), greedy)
        return (greedy + self._start).astype(self._dtype)
