"""Collectors: drivers in Ray actors that feed the replay service and pull policy weights.

    weights = ray.remote(WeightStore).remote()
    collectors = start_collectors(rb.shards, 4, env_fn, policy_fn, weights=weights, pull_every=1_000)
    runs = [c.run.remote(10_000) for c in collectors]        # in the background
    weights.set.remote(agent.q_network.get_weights(), step)  # the learner publishes now and then

Each collector runs a `StepDriver` whose observer is its own `ReplayClient`,
routed to shard `collector_id % num_shards` (its stream stays in one shard,
so `num_steps` windows are real), batched and sent asynchronously. Every
`pull_every` env steps it asks the `WeightStore` for weights newer than the
ones it has (one small call when there are none; the arrays come through
the object store when there are). With a `priority_fn` it computes each
transition's initial priority itself, as Ape-X actors do.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import ray

from tfreplay.distributed.client import ReplayClient, Shards
from tfreplay.rl.drivers import StepDriver
from tfreplay.rl.observers import AverageReturn


class WeightStore:
    """The newest policy weights (a list of NumPy arrays) and their version: a learner sets, collectors pull."""

    def __init__(self) -> None:
        self._version = -1
        self._weights: list | None = None

    def set(self, weights: list, version: int) -> None:
        if version > self._version:
            self._version, self._weights = int(version), weights

    def get(self, newer_than: int) -> tuple[int, list | None] | None:
        """`(version, weights)` if newer than `newer_than`, else None."""
        return (self._version, self._weights) if self._version > newer_than else None


class Collector:
    """A driver in a Ray actor feeding the service.

    Args:
      shards: the service's `Shards`.
      collector_id: routes its inserts (shard `collector_id % num_shards`)
        and seeds its environments (`seed + 1000 * collector_id`).
      env_fn: `() -> env` (a gymnasium env or vector env); it must pickle
        (a module-level function or a `functools.partial` of one).
      policy_fn: `(env, collector_id) -> policy`: a callable from
        observations to actions; pulled weights go to its `set_weights`.
      weights: a `WeightStore` actor, or None (the policy never changes).
      pull_every: env steps between weight pulls.
      priority_fn: `(policy, transitions) -> priorities`, one per transition
        (prioritized shards; Ape-X).
      seed: seed of the environments.
      client_options: keywords of its `ReplayClient`.
    """

    def __init__(
        self,
        shards: Shards,
        collector_id: int,
        env_fn: Callable[[], Any],
        policy_fn: Callable[[Any, int], Any],
        weights: Any = None,
        pull_every: int = 1_000,
        priority_fn: Callable[[Any, Any], Any] | None = None,
        seed: int | None = None,
        client_options: dict | None = None,
    ):
        self._client = ReplayClient(shards, collector_id=collector_id, **(client_options or {}))
        self._env = env_fn()
        self.policy = policy_fn(self._env, collector_id)
        self._weights, self._pull_every, self._version = weights, pull_every, -1
        self._priority_fn = priority_fn
        self._returns = AverageReturn(buffer_size=100)
        env_seed = None if seed is None else seed + 1000 * collector_id
        self._driver = StepDriver(self._env, self.policy, [self._returns, self._observe], seed=env_seed)

    def _observe(self, transitions: Any) -> None:
        priorities = None if self._priority_fn is None else self._priority_fn(self.policy, transitions)
        self._client.add_batch(transitions, priorities=priorities)

    def pull(self) -> int:
        """Takes newer weights from the store, if any; returns the version it acts with (-1: its own)."""
        if self._weights is not None:
            newer = ray.get(self._weights.get.remote(self._version))
            if newer is not None:
                self._version = newer[0]
                self.policy.set_weights([np.asarray(w) for w in newer[1]])
        return self._version

    def run(self, num_steps: int) -> dict:
        """Collects `num_steps` transitions (pulling weights every `pull_every`), then flushes.

        Returns:
          `env_steps` and `episodes` so far, `average_return` of its last 100
          episodes (NaN before one ends), and the `weights_version` it acts with.
        """
        made = 0
        while made < num_steps:
            self.pull()
            made += self._driver.run(min(self._pull_every, num_steps - made))
        self._client.flush()
        return {
            "env_steps": self._driver.num_env_steps,
            "episodes": self._driver.num_episodes,
            "average_return": self._returns.result(),
            "weights_version": self._version,
        }

    def stats(self) -> dict:
        return self._client.stats()

    def close(self) -> None:
        self._client.close()
        self._env.close()


def start_collectors(
    shards: Shards,
    num_collectors: int,
    env_fn: Callable,
    policy_fn: Callable,
    actor_options: dict | None = None,
    **kwargs: Any,
) -> list:
    """Starts `num_collectors` `Collector` actors (ids 0 to n-1); `kwargs` go to each constructor.

    `actor_options` are more `ray.remote` options (default `num_cpus=0`).
    """
    remote = ray.remote(Collector).options(**{"num_cpus": 0, **(actor_options or {})})
    return [remote.remote(shards, i, env_fn, policy_fn, **kwargs) for i in range(num_collectors)]
