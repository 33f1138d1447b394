"""DDPG on Pendulum-v1 in Keras: actor and critic learn many steps per graph call from a tfreplay buffer.

    python -m examples.keras_ddpg                               # 20,000 env steps: about a minute on 2 cores
    python -m examples.keras_ddpg --steps=4000 --train-steps-per-call=1
    TF_USE_LEGACY_KERAS=1 python -m examples.keras_ddpg         # the same with tf-keras

The common Keras DDPG keeps its replay in NumPy arrays: every train step
draws indices with NumPy, turns the batch into tensors with
`tf.convert_to_tensor` and calls the update's `tf.function`, paying a copy and
a trip through Python per step. Here a collect driver adds the transitions of
a vector env to a `TFUniformReplayBuffer`, and `tfreplay.TrainLoop` draws each
batch inside the graph: one call runs `--train-steps-per-call` updates
(critic, actor and the soft target updates), each on a fresh sample.

After `--initial-steps` random actions, the collector acts with its own copy
of the actor plus Gaussian exploration noise; the copy takes the learner's
weights every `--pull-every` env steps (those of the pull before). The
learner takes one update per environment step, `K` at a time once `K` steps'
credit has accumulated. Every `--log-interval` env steps the greedy actor is
evaluated over a vector env, one episode per sub-environment, and a line says
where the time went: collect, learn, evaluate.

`--concurrent` collects and learns at once (`tfreplay.rl.pipeline`): the
collector steps the environments on a thread of its own, ahead of the
learner, while the main thread adds its transitions to the buffer in order
and runs the `TrainLoop`. The time line then adds `overlap`, the seconds both
sides worked at once. Every update draws from the same buffer contents and
the collector acts with the same weights as without `--concurrent`, so the
same seed gives the same run in both modes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any, Iterator, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfreplay  # noqa: E402
from tfreplay.keras import keras_module  # noqa: E402
from tfreplay.rl.drivers import StepDriver, make_vector_env, transition_spec  # noqa: E402
from tfreplay.rl.observers import AverageReturn  # noqa: E402
from tfreplay.rl.pipeline import Pipeline  # noqa: E402
from tfreplay.rl.policies import RandomPolicy  # noqa: E402
from tfreplay.rl.training import evaluate  # noqa: E402

ENV_ID = "Pendulum-v1"
keras = keras_module()  # Keras 3, or tf-keras with TF_USE_LEGACY_KERAS=1


def mlp(num_inputs: int, num_outputs: int, hidden: Sequence[int], output_activation: str | None = None) -> Any:
    """Dense ReLU layers; the last layer starts small, so the first actions and Q-values are near 0."""
    last = keras.layers.Dense(
        num_outputs, output_activation, kernel_initializer=keras.initializers.RandomUniform(-3e-3, 3e-3)
    )
    return keras.Sequential([keras.Input((num_inputs,))] + [keras.layers.Dense(w, "relu") for w in hidden] + [last])


class Ddpg(tf.Module):
    """DDPG (Lillicrap et al., 2016): a deterministic actor, a Q critic, and slowly following target copies.

    Args:
      num_observations: the observation's length (Pendulum: 3).
      num_actions: the action's length (Pendulum: 1).
      max_action: actions lie in `[-max_action, max_action]` (Pendulum: 2).
      hidden: widths of the hidden layers of actor and critic.
      gamma: the discount.
      tau: how far each train step moves the targets towards the online networks.
      actor_learning_rate, critic_learning_rate: Adam's step sizes.
    """

    def __init__(
        self,
        num_observations: int,
        num_actions: int,
        max_action: float,
        hidden: Sequence[int] = (256, 256),
        gamma: float = 0.99,
        tau: float = 0.005,
        actor_learning_rate: float = 1e-3,
        critic_learning_rate: float = 2e-3,
    ):
        super().__init__()
        self.max_action, self.gamma, self.tau = max_action, gamma, tau
        self.actor = mlp(num_observations, num_actions, hidden, "tanh")
        self.critic = mlp(num_observations + num_actions, 1, hidden)
        self.target_actor = mlp(num_observations, num_actions, hidden, "tanh")
        self.target_critic = mlp(num_observations + num_actions, 1, hidden)
        for target, online in ((self.target_actor, self.actor), (self.target_critic, self.critic)):
            target.set_weights(online.get_weights())
        self.actor_optimizer = keras.optimizers.Adam(actor_learning_rate)
        self.critic_optimizer = keras.optimizers.Adam(critic_learning_rate)
        self.actor_optimizer.build(self.actor.trainable_variables)  # slots made now, not inside the traced loop
        self.critic_optimizer.build(self.critic.trainable_variables)
        spec = tf.TensorSpec([None, num_observations], tf.float32)
        self.act = tf.function(self._act, input_signature=[spec])  # one trace for every batch size

    def _act(self, observation: tf.Tensor) -> tf.Tensor:
        return self.max_action * self.actor(observation)

    def q(self, critic: Any, observation: tf.Tensor, action: tf.Tensor) -> tf.Tensor:
        return critic(tf.concat([observation, action / self.max_action], axis=-1))[:, 0]

    def train_step(self, items: Any, info: Any = None) -> dict:
        """One update from a batch of `Transition`s: critic, then actor, then both targets (a `TrainLoop` step)."""
        del info  # uniform replay: no weights, no priorities
        next_action = self.max_action * self.target_actor(items.next_observation)
        next_q = self.q(self.target_critic, items.next_observation, next_action)
        target = tf.stop_gradient(items.reward + self.gamma * items.discount * next_q)
        with tf.GradientTape() as tape:
            critic_loss = tf.reduce_mean((self.q(self.critic, items.observation, items.action) - target) ** 2)
        variables = self.critic.trainable_variables
        self.critic_optimizer.apply_gradients(zip(tape.gradient(critic_loss, variables), variables))
        with tf.GradientTape() as tape:
            actor_loss = -tf.reduce_mean(self.q(self.critic, items.observation, self._act(items.observation)))
        variables = self.actor.trainable_variables
        self.actor_optimizer.apply_gradients(zip(tape.gradient(actor_loss, variables), variables))
        for target, online in ((self.target_actor, self.actor), (self.target_critic, self.critic)):
            for t, o in zip(target.trainable_variables, online.trainable_variables):
                t.assign(self.tau * o + (1.0 - self.tau) * t)
        return {"critic_loss": critic_loss, "actor_loss": actor_loss}


class NoisyPolicy:
    """The actor's action plus Gaussian noise of standard deviation `noise`, clipped to the action bounds.

    `actor`: a copy of the agent's actor to act with (the collector's, pulled from the learner's now and then);
    default the agent's own.
    """

    def __init__(self, agent: Ddpg, noise: float, seed: int, actor: Any = None):
        self.agent, self.noise = agent, noise
        self.rng = np.random.default_rng(seed)
        self.act = agent.act
        if actor is not None:
            spec = tf.TensorSpec([None, actor.input_shape[-1]], tf.float32)
            self.act = tf.function(lambda observation: agent.max_action * actor(observation), input_signature=[spec])

    def __call__(self, observation: Any) -> np.ndarray:
        action = self.act(tf.convert_to_tensor(observation, tf.float32)).numpy()
        if self.noise:
            action = action + self.rng.normal(0.0, self.noise, action.shape)
        return np.clip(action, -self.agent.max_action, self.agent.max_action).astype(np.float32)


class Clock:
    """Seconds spent per part of the run (`overlap`: both collect and learn at once, in a concurrent run)."""

    def __init__(self, parts: Sequence[str] = ("collect", "learn", "evaluate")) -> None:
        self.seconds = {part: 0.0 for part in parts}
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, part: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - start

    def take(self, seconds: dict) -> None:
        """The pipeline's time split (`collect`, `learn`, `overlap`), for the parts this clock shows."""
        self.seconds.update({part: s for part, s in seconds.items() if part in self.seconds})

    def line(self) -> str:
        parts = ", ".join(f"{part} {s:.1f} s" for part, s in self.seconds.items())
        return f"{time.perf_counter() - self.start:.1f} s ({parts})"


def train(
    steps: int = 20_000,
    seed: int = 0,
    num_envs: int = 4,
    train_steps_per_call: int = 16,
    initial_steps: int = 1_000,
    batch_size: int = 64,
    buffer_size: int = 50_000,
    noise: float = 0.2,
    log_interval: int = 2_000,
    eval_episodes: int = 10,
    jit_compile: bool | None = None,
    concurrent: bool = False,
    pull_every: int = 100,
) -> dict:
    """Collects `steps` env steps and learns from them, one update per env step; see the module docstring."""
    keras.utils.set_random_seed(seed)
    env = make_vector_env(ENV_ID, num_envs)
    spec = transition_spec(env.single_observation_space, env.single_action_space)
    max_action = float(env.single_action_space.high[0])  # type: ignore[attr-defined]
    agent = Ddpg(spec.observation.shape[0], spec.action.shape[0], max_action)
    buffer = tfreplay.TFUniformReplayBuffer(spec, batch_size=num_envs, max_length=buffer_size // num_envs, seed=seed)
    learn = tfreplay.TrainLoop(
        buffer, agent.train_step, train_steps_per_call, batch_size, metrics="mean", jit_compile=jit_compile
    )
    parts = ("collect", "learn", "overlap", "evaluate") if concurrent else ("collect", "learn", "evaluate")
    returns, clock = AverageReturn(10), Clock(parts)
    acting = keras.models.clone_model(agent.actor)  # the collector's copy, pulled from the learner's
    acting.set_weights(agent.actor.get_weights())
    random, noisy = RandomPolicy(env.single_action_space, seed=seed), NoisyPolicy(agent, noise, seed, actor=acting)
    driver = StepDriver(env, random, num_steps=num_envs, seed=seed)  # seeded resets: the same seed, the same run
    first = max(initial_steps, batch_size)  # random actions until then; the first sample needs a batch stored
    driver.policy = lambda observation: (random if driver.num_env_steps < first else noisy)(observation)
    state: dict = {"credit": 0, "logged": first, "greedy": float("nan"), "metrics": {"critic_loss": float("nan")}}

    def learn_side(env_steps: int, new_steps: int) -> None:  # one update per env step once the random ones are in
        if env_steps < first:
            return
        state["credit"] += new_steps
        while state["credit"] >= train_steps_per_call:
            state["metrics"] = {name: float(value) for name, value in learn().items()}  # read back: the call is done
            state["credit"] -= train_steps_per_call

    def after(env_steps: int) -> bool:  # a greedy evaluation and a line every log_interval env steps
        if env_steps - state["logged"] >= log_interval or env_steps >= steps:
            state["logged"] = env_steps
            with clock("evaluate"):
                policy = NoisyPolicy(agent, 0.0, seed)
                state["greedy"] = float(np.mean(evaluate(ENV_ID, policy, eval_episodes, seed=seed + 1_000 + env_steps)))
            clock.take(run.seconds)
            print(
                f"env steps {env_steps:6d} | episodes {driver.num_episodes:4d} | "
                f"return {returns.result():7.1f} | greedy {state['greedy']:7.1f} | "
                f"critic loss {state['metrics']['critic_loss']:.3f} | {clock.line()}"
            )
        return False

    run = Pipeline(
        driver,
        [buffer.add_batch, returns],
        learn_side,
        after=after,
        weights=agent.actor.get_weights,
        set_weights=acting.set_weights,
        pull_every=pull_every,
        num_env_steps=steps,
        concurrent=concurrent,
    )
    run.run()
    clock.take(run.seconds)
    greedy = state["greedy"]
    env.close()
    num_train_steps = int(agent.critic_optimizer.iterations)
    rate = num_train_steps / max(clock.seconds["learn"], 1e-9)
    print(f"greedy return {greedy:.1f} over {eval_episodes} episodes | {num_train_steps} train steps, {rate:.0f}/s")
    print(f"time: {clock.line()}")
    return {
        "num_env_steps": run.env_steps,
        "num_train_steps": num_train_steps,
        "greedy_return": greedy,
        "seconds": dict(clock.seconds),
        "agent": agent,
        "buffer": buffer,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--steps", type=int, default=20_000, help="environment steps to collect, over all envs")
    add("--seed", type=int, default=0)
    add("--num-envs", "--num_envs", type=int, default=4, help="sub-environments of the collect vector env")
    add("--train-steps-per-call", "--train_steps_per_call", type=int, default=16, help="K updates per graph call")
    add("--initial-steps", "--initial_steps", type=int, default=1_000, help="random actions before learning")
    add("--batch-size", "--batch_size", type=int, default=64)
    add("--noise", type=float, default=0.2, help="standard deviation of the exploration noise")
    add("--log-interval", "--log_interval", type=int, default=2_000, help="env steps between progress lines")
    add("--eval-episodes", "--eval_episodes", type=int, default=10, help="greedy episodes per evaluation")
    xla = "compile the train loop with XLA (default: as TrainLoop's jit_compile=None, XLA for this uniform buffer)"
    add("--jit-compile", "--jit_compile", dest="jit_compile", action="store_const", const=True, default=None, help=xla)
    add("--no-jit-compile", "--no_jit_compile", dest="jit_compile", action="store_const", const=False, help="no XLA")
    add("--concurrent", action="store_true", help="collect and learn at once, on two threads (the same run)")
    add("--pull-every", "--pull_every", type=int, default=100, help="env steps between the collector's weight pulls")
    args = parser.parse_args(argv)
    names = ("steps", "num_envs", "train_steps_per_call", "batch_size", "log_interval", "eval_episodes", "pull_every")
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} ({getattr(args, name)}) must be a positive integer")
    return train(
        args.steps, args.seed, args.num_envs, args.train_steps_per_call, args.initial_steps, args.batch_size,
        noise=args.noise, log_interval=args.log_interval, eval_episodes=args.eval_episodes,
        jit_compile=args.jit_compile, concurrent=args.concurrent, pull_every=args.pull_every,
    )  # fmt: skip


if __name__ == "__main__":
    main()
