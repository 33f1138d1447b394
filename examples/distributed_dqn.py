"""Double DQN on CartPole-v1 with collectors in Ray actors and a sharded replay service.

    python -m examples.distributed_dqn --num_collectors 4 --num_shards 2          # a local Ray (loopback)
    python -m examples.distributed_dqn --apex                                     # Ape-X: prioritized
    python -m examples.distributed_dqn --address auto                             # a cluster (ray start --head)

Topology: `num_collectors` `Collector` actors each run a vector env with an
epsilon-greedy copy of the Q-network (Ape-X epsilons, `0.4 ** (1 + 7 i / (N-1))`)
and pull the learner's weights every `--pull_every` steps; their transitions
go to `num_shards` shard actors (`tfreplay.distributed`), collector `i` to
shard `i % num_shards`. The learner (this process) reads
`as_dataset(128, num_parallel_calls=4)`; one rate limiter over the service
(`SampleToInsertRatio(128 * train_ratio, 1000, ...)`) keeps about
`--train_ratio` train steps per collected transition. With `--apex`, shards are prioritized, collectors
compute each transition's initial priority from their own network's TD
error, and the learner sends `|TD error|` back after each step.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import ray  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import flags, logging  # noqa: E402

import tfreplay  # noqa: E402
from examples import cli  # noqa: E402
from tfreplay import distributed  # noqa: E402
from tfreplay.keras import keras_module  # noqa: E402
from tfreplay.rl import collectors  # noqa: E402
from tfreplay.rl.agents import DqnAgent, make_q_network  # noqa: E402
from tfreplay.rl.drivers import make_vector_env, space_spec, transition_spec  # noqa: E402
from tfreplay.rl.policies import EpsilonGreedyPolicy  # noqa: E402
from tfreplay.rl.training import evaluate  # noqa: E402

flags.DEFINE_integer("num_collectors", 4, "Collector actors.")
flags.DEFINE_integer("num_shards", 2, "Replay shard actors.")
flags.DEFINE_boolean("apex", False, "Distributed prioritized replay (Ape-X): collectors compute initial priorities.")
flags.DEFINE_string("address", None, "Ray cluster address (e.g. auto, or host:6379); default: a local Ray on loopback.")
flags.DEFINE_string("env_id", "CartPole-v1", "Gymnasium environment id (discrete actions).")
flags.DEFINE_integer("steps", 150_000, "Environment steps to collect over all collectors (at most).")
flags.DEFINE_integer("num_envs", 2, "Environments per collector.")
flags.DEFINE_integer("buffer_size", 50_000, "Replay capacity over all shards.")
flags.DEFINE_integer("batch_size", 128, "Transitions per train step.")
flags.DEFINE_float("train_ratio", 1.0, "Train steps per collected transition.")
flags.DEFINE_integer("pull_every", 200, "Env steps between a collector's weight pulls.")
flags.DEFINE_integer("publish_every", 200, "Train steps between weight publications.")
flags.DEFINE_integer("eval_interval", 5_000, "Train steps between greedy evaluations (early stop at the threshold).")
flags.DEFINE_string("checkpoint_dir", None, "Shard checkpoints go here (default: none).")
flags.DEFINE_integer("seed", 0, "Seed of networks, environments and sampling.")
FLAGS = flags.FLAGS
_FC = (256, 256)
_CHUNK = 500  # env steps per collector run() call
_SEND_ROWS = 16  # rows per send to a shard


class ActorPolicy:
    """A collector's epsilon-greedy Q-network; `set_weights` takes the learner's."""

    def __init__(self, env: Any, collector_id: int, num_collectors: int, seed: int):
        space = env.single_action_space
        self.q_network = make_q_network(space_spec(env.single_observation_space), int(space.n), _FC, seed)
        epsilon = 0.4 ** (1 + 7 * collector_id / max(num_collectors - 1, 1))
        self._policy = EpsilonGreedyPolicy(self.q_network, space, epsilon=epsilon, seed=seed + collector_id)

    def __call__(self, observation: Any) -> np.ndarray:
        return self._policy(observation)

    def set_weights(self, weights: list) -> None:
        self.q_network.set_weights(weights)


def td_errors(online: Any, target: Any, transitions: Any, gamma: float = 0.99) -> np.ndarray:
    """`|r + gamma * discount * Q_target(s', argmax Q(s')) - Q(s, a)|` of a batch (Double DQN)."""
    next_q = online(transitions.next_observation)
    best = tf.argmax(next_q, axis=-1, output_type=tf.int32)
    value = tf.gather(target(transitions.next_observation), best, batch_dims=1)
    q = tf.gather(online(transitions.observation), tf.cast(transitions.action, tf.int32), batch_dims=1)
    return np.abs((transitions.reward + gamma * transitions.discount * value - q).numpy())


def initial_priorities(policy: ActorPolicy, transitions: Any) -> np.ndarray:
    """Ape-X: a collector's own TD error (its network as online and target), plus a floor."""
    return td_errors(policy.q_network, policy.q_network, transitions) + 1e-3


def _connect() -> None:
    env_vars = {k: os.environ[k] for k in ("TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS")}
    if FLAGS.address:
        ray.init(address=FLAGS.address, runtime_env={"env_vars": env_vars}, logging_level="WARNING")
    else:  # this machine only: Ray's processes listen on loopback
        ray.init(
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            runtime_env={"env_vars": env_vars},
            logging_level="WARNING",
        )


class Learner:
    """The learner's loop. One rate limiter over the service keeps about `train_ratio` train steps per
    collected transition: collectors wait when the learner is behind, the learner when it is ahead."""

    def __init__(self) -> None:
        env = make_vector_env(FLAGS.env_id, FLAGS.num_envs)
        spec = transition_spec(env.single_observation_space, env.single_action_space)
        self.threshold = env.spec.reward_threshold if env.spec is not None else None
        num_actions = int(env.single_action_space.n)
        env.close()
        buffer = tfreplay.PyPrioritizedReplayBuffer if FLAGS.apex else tfreplay.PyUniformReplayBuffer
        length = FLAGS.buffer_size // (FLAGS.num_shards * FLAGS.num_envs)
        spi = FLAGS.batch_size * FLAGS.train_ratio  # samples per inserted transition
        room = FLAGS.batch_size + spi * _SEND_ROWS  # a sample request plus a collector's send must fit the range
        limiter = tfreplay.SampleToInsertRatio(spi, 1_000, 4 * room)
        self.rb = distributed.start_service(
            buffer, spec, num_shards=FLAGS.num_shards, batch_size=FLAGS.num_envs, max_length=length,
            seed=FLAGS.seed, checkpoint_dir=FLAGS.checkpoint_dir, checkpoint_interval=30.0, rate_limiter=limiter,
            client_options={"send_batch_size": _SEND_ROWS},
        )  # fmt: skip
        net = make_q_network(spec.observation, num_actions, _FC, FLAGS.seed)
        self.agent = DqnAgent(
            spec.observation, num_actions, q_network=net, optimizer=keras_module(net).optimizers.Adam(5e-4),
            target_update_period=500, gradient_clipping=10.0,
        )  # fmt: skip
        self.store = ray.remote(collectors.WeightStore).options(num_cpus=0).remote()
        self.store.set.remote(self.agent.q_network.get_weights(), 0)
        self.collectors = collectors.start_collectors(
            self.rb.shards, FLAGS.num_collectors, functools.partial(make_vector_env, FLAGS.env_id, FLAGS.num_envs),
            functools.partial(ActorPolicy, num_collectors=FLAGS.num_collectors, seed=FLAGS.seed),
            weights=self.store, pull_every=FLAGS.pull_every, seed=FLAGS.seed,
            priority_fn=initial_priorities if FLAGS.apex else None,
            client_options={"send_batch_size": _SEND_ROWS},
        )  # fmt: skip
        self.env_steps = self.train_steps = 0
        self.best = (-np.inf, self.agent.q_network.get_weights())
        self.running = {c.run.remote(_CHUNK): c for c in self.collectors}

    def _harvest(self) -> None:
        done, _ = ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
        for ref in done:
            collector = self.running.pop(ref)
            ray.get(ref)
            self.env_steps += _CHUNK
            self.running[collector.run.remote(_CHUNK)] = collector

    def _train(self, experience: Any) -> None:
        self.agent.train(experience)
        self.train_steps += 1
        if FLAGS.apex:
            items, info = experience
            errors = td_errors(self.agent.q_network, self.agent.target_q_network, items) + 1e-3
            self.rb.update_priorities(info.ids, errors, wait=False)
        if self.train_steps % FLAGS.publish_every == 0:
            self.store.set.remote(self.agent.q_network.get_weights(), self.train_steps)

    def _evaluate(self) -> bool:
        returns = evaluate(FLAGS.env_id, self.agent.policy(), num_episodes=10, seed=FLAGS.seed + 10_000)
        mean = float(np.mean(returns))
        if mean >= self.best[0]:
            self.best = (mean, self.agent.q_network.get_weights())
        print(f"env steps {self.env_steps:>7} | train steps {self.train_steps:>7} | greedy return {mean:6.1f}")
        return self.threshold is not None and mean >= self.threshold

    def loop(self) -> None:
        """Trains until `--steps` transitions were collected or an evaluation reaches the env's threshold."""
        experience = iter(self.rb.as_dataset(FLAGS.batch_size, num_parallel_calls=4))
        while self.env_steps < FLAGS.steps:
            self._train(next(experience))  # waits for the limiter: 1,000 transitions first, then the ratio
            self._harvest()
            if self.train_steps % FLAGS.eval_interval == 0 and self._evaluate():
                break

    def close(self) -> None:
        for collector in self.collectors:  # collectors may be waiting for the limiter: stop them, then the service
            ray.kill(collector)
        self.rb.close()


def main(argv: Sequence[str]) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)
    _connect()
    start = time.perf_counter()
    learner = Learner()
    try:
        learner.loop()
        wall = time.perf_counter() - start
        stats = learner.rb.stats()
        learner.agent.q_network.set_weights(learner.best[1])
        returns = evaluate(FLAGS.env_id, learner.agent.policy(), num_episodes=20, seed=FLAGS.seed + 20_000)
    finally:
        learner.close()
        ray.shutdown()
    kind = "Ape-X prioritized" if FLAGS.apex else "uniform"
    print(f"Greedy evaluation over 20 episodes: {', '.join(f'{r:.0f}' for r in returns)}")
    print(
        f"{FLAGS.env_id} ({kind}, {FLAGS.num_collectors} collectors, {FLAGS.num_shards} shards): average return "
        f"{np.mean(returns):.1f} | env steps {learner.env_steps} | train steps {learner.train_steps} | wall time "
        f"{wall:.0f} s | {learner.env_steps / wall:.0f} env steps/s | {learner.train_steps / wall:.0f} train steps/s"
    )
    print(f"Replay: {stats['num_frames']} items in {FLAGS.num_shards} shards, lost {stats['lost']}, "
          f"restarts {stats['restarts']}, stale priority updates {stats['stale_updates']}")  # fmt: skip


if __name__ == "__main__":
    cli.run(main)
