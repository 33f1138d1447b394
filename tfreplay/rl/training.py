"""A complete DQN training run: collect driver -> buffer -> `as_dataset` -> agent.

`train_dqn(DqnConfig(...))` is what `tfreplay-demo` runs; tests and
the tutorials call it with small step counts. One vectorised `StepDriver`
feeds a `TFUniformReplayBuffer` through its `add_batch` observer; the learner
reads single transitions, `experience_dataset(buffer, batch_size)`.

`prioritized=True` uses a `TFPrioritizedReplayBuffer` instead: each train
step is one `tf.function` (`prioritized_train_step`) that weighs the
sampled batch by its importance weights (beta annealed from `beta` to 1 over
the run), trains, and gives the sampled items their new priorities,
`|TD error| + priority_eps`. `n_step > 1` reads `NStepReturns(n_step,
gamma)` items, whose `discount` holds the whole bootstrap factor, so the
agent is built with `gamma=1.0` (gamma is applied once, by the transform);
with `n_step=1` the learner reads stored transitions and the agent applies
gamma, the cheapest read. `train_steps_per_call=K > 1` runs the train steps
K at a time through the agent's fused loop (`DqnAgent.train_loop`, a
`tfreplay.TrainLoop`): K samples, gradient steps (and priority updates) in one
graph call, taken once K steps' credit has accumulated. With an
`output_dir` it checkpoints agent, buffer and counters (`resume=True`
continues), writes TensorBoard summaries, `history.json` and a learning-curve
PNG. The same config (seed included) gives the same run: networks,
exploration, environments and sampling are all seeded, and samples are drawn
in order, when the learner asks.

tqdm, TensorBoard and matplotlib (the `examples` extra) are imported only when used; without one, the run
goes on without its bar, summaries or plot and says so in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from tfreplay import ReplayBuffer, TFPrioritizedReplayBuffer, TFUniformReplayBuffer
from tfreplay.keras import keras_module
from tfreplay.rl import _optional
from tfreplay.rl.agents import DqnAgent, LossInfo, make_q_network
from tfreplay.rl.config import DqnConfig
from tfreplay.rl.drivers import StepDriver, make_vector_env, transition_spec
from tfreplay.rl.learner import (
    beta_schedule,
    experience_dataset,
    linear_beta,
    n_step_transform,
    prioritized_train_step,
)
from tfreplay.rl.observers import AverageEpisodeLength, AverageReturn
from tfreplay.rl.pipeline import Pipeline
from tfreplay.rl.policies import EpsilonGreedyPolicy

__all__ = [  # the learner's pieces are re-exported: examples and tests import them from here
    "DqnConfig",
    "TrainResult",
    "beta_schedule",
    "evaluate",
    "experience_dataset",
    "linear_beta",
    "linear_epsilon",
    "n_step_transform",
    "plot_learning_curve",
    "prioritized_train_step",
    "train_dqn",
]


@dataclasses.dataclass
class TrainResult:
    """What a run measured.

    Rates are over the training loop (collection, training and the periodic
    evaluations; not setup, nor the final evaluation). `seconds` says where
    the run's time went: `collect` (the driver, policy included), `learn`
    (the train steps) and `evaluate` (the greedy evaluations, the final one
    included).
    """

    average_return: float
    eval_returns: list
    num_env_steps: int
    num_train_steps: int
    wall_time: float
    env_steps_per_sec: float
    train_steps_per_sec: float
    history: list
    output_dir: str | None
    agent: DqnAgent
    buffer: ReplayBuffer
    seconds: dict = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"average return {self.average_return:.1f} over {len(self.eval_returns)} episodes | "
            f"wall time {self.wall_time:.0f} s | {self.env_steps_per_sec:.0f} env steps/s | "
            f"{self.train_steps_per_sec:.0f} train steps/s"
        )

    def time_breakdown(self) -> str:
        """Where the run's time went, e.g. `collect 12 s, learn 40 s, evaluate 3 s (of 58 s)`."""
        parts = ", ".join(f"{part} {seconds:.1f} s" for part, seconds in self.seconds.items())
        return f"{parts} (of {self.wall_time:.1f} s)"


def linear_epsilon(config: DqnConfig, env_steps: int) -> float:
    """1 during initial collection, then linear from `epsilon_start` to `epsilon_end` over `epsilon_decay_steps`,
    and `epsilon_end` after.

    Plain Python, not a Keras schedule: the collect policy asks for it at every vector step, where an eager
    schedule call would cost more than the environments' step.
    """
    if env_steps < config.initial_collect_steps:
        return 1.0  # random actions while the buffer fills
    steps = max(config.epsilon_decay_steps, 1)
    done = min(env_steps - config.initial_collect_steps, steps) / steps
    return config.epsilon_start + (config.epsilon_end - config.epsilon_start) * done


def evaluate(env_id: str, policy: Callable, num_episodes: int = 20, seed: int | None = None) -> list[float]:
    """Returns of `num_episodes` episodes: one per sub-environment of a vector env, run in parallel."""
    env = make_vector_env(env_id, num_episodes)
    returns, finished = np.zeros(num_episodes), np.zeros(num_episodes, bool)

    def record(transitions: Any) -> None:
        running = ~finished
        returns[running] += transitions.reward[running]
        finished[running] |= transitions.terminated[running] | transitions.truncated[running]

    driver = StepDriver(env, policy, [record], num_steps=num_episodes, seed=seed)
    while not finished.all():
        driver.run()
    env.close()
    return returns.tolist()


def plot_learning_curve(history: list[dict], path: str, eval_returns: list[float] | None = None) -> None:
    """Writes a PNG of the average training return against environment steps."""
    from matplotlib.figure import Figure  # no pyplot: the caller's backend (a notebook's, say) is left alone

    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    points = [(h["env_steps"], h["average_return"]) for h in history if h["average_return"] is not None]
    if points:
        ax.plot(*zip(*points), label="training episodes (average of the last 20)")
    evals = [(h["env_steps"], h["eval_return"]) for h in history if h.get("eval_return") is not None]
    if evals:
        ax.plot(*zip(*evals), "o--", color="C2", label="greedy evaluations during training")
    if eval_returns and history:
        ax.scatter(
            [history[-1]["env_steps"]],
            [np.mean(eval_returns)],
            color="C3",
            zorder=3,
            marker="*",
            s=150,
            label=f"final evaluation ({len(eval_returns)} episodes)",
        )
    ax.set_xlabel("environment steps")
    ax.set_ylabel("return")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _learning_rate(config: DqnConfig) -> Any:
    if config.end_learning_rate is None:
        return config.learning_rate
    num_train_steps = (config.num_env_steps - config.initial_collect_steps) * config.train_steps_per_env_step
    return keras_module().optimizers.schedules.PolynomialDecay(
        config.learning_rate, max(int(num_train_steps), 1), config.end_learning_rate, power=1.0
    )


class _Due:
    """Tells when `interval` env steps have passed since an event last fired."""

    def __init__(self, start: int):
        self._start = start
        self._last: dict = {}

    def __call__(self, name: str, now: int, interval: int) -> bool:
        if interval > 0 and now - self._last.get(name, self._start) >= interval:
            self._last[name] = now
            return True
        return False

    def next(self, name: str, interval: int) -> float:
        """The env step at which `name` is next due (infinity: never)."""
        return self._last.get(name, self._start) + interval if interval > 0 else float("inf")


def _max_length(config: DqnConfig) -> int:
    """Each segment's length: the buffer size over the environments, long enough for one n-step window."""
    return max(config.buffer_size // config.num_envs, config.n_step + 1)


class _Run:
    """The pieces of one run and the loop over them."""

    def __init__(self, config: DqnConfig):
        self.config = c = config
        keras = keras_module()  # the Keras tf.keras is: network, optimizer and schedules all of it
        keras.utils.set_random_seed(c.seed)
        self.env = make_vector_env(c.env_id, c.num_envs)
        self.env_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="env_steps")
        spec = transition_spec(self.env.single_observation_space, self.env.single_action_space)
        num_actions = int(self.env.single_action_space.n)  # type: ignore[attr-defined]
        q_network = make_q_network(spec.observation, num_actions, c.fc_layer_params, seed=c.seed)
        self.agent = DqnAgent(
            spec.observation,
            num_actions,
            q_network,
            keras.optimizers.Adam(_learning_rate(c)),
            gamma=c.gamma if c.n_step == 1 else 1.0,  # n-step items are discounted by the transform
            target_update_period=c.target_update_period,
            target_update_tau=c.target_update_tau,
            gradient_clipping=c.gradient_clipping,
        )
        max_length = _max_length(c)
        self.buffer: ReplayBuffer
        beta = beta_schedule(c)
        if c.prioritized:
            self.buffer = TFPrioritizedReplayBuffer(spec, c.num_envs, max_length, alpha=c.alpha, seed=c.seed)

            def step(experience: Any) -> LossInfo:  # beta comes from env_steps inside the graph: no eager op
                return prioritized_train_step(self.agent, self.buffer, experience, beta(self.env_steps), c.priority_eps)

            self._prioritized_step = tf.function(step)
        else:
            self.buffer = TFUniformReplayBuffer(spec, batch_size=c.num_envs, max_length=max_length, seed=c.seed)
        self.returns, self.lengths = AverageReturn(20), AverageEpisodeLength(20)
        parts = ("collect", "learn", "overlap", "evaluate") if c.concurrent else ("collect", "learn", "evaluate")
        self.seconds = dict.fromkeys(parts, 0.0)
        # The collector acts with its own copy of the Q-network, which takes the learner's weights every
        # pull_every env steps (a Pipeline's pulls), so both modes make the same run.
        self.actor_q_network = keras.models.clone_model(q_network)
        self.actor_q_network.set_weights(q_network.get_weights())
        self.acted_from = 0  # env steps made before this loop (a resumed run's)
        self.loss, self.credit = float("nan"), 0.0  # the last train step's loss, train steps earned not taken
        policy = EpsilonGreedyPolicy(self.actor_q_network, num_actions, epsilon=self.epsilon, seed=c.seed)
        self.driver = StepDriver(self.env, policy, num_steps=c.num_envs, seed=c.seed)
        if c.train_steps_per_call > 1:  # sampled inside the loop's graph: no dataset
            self._train_loop = self.agent.train_loop(
                self.buffer,
                c.batch_size,
                c.train_steps_per_call,
                transform=n_step_transform(c),
                beta=lambda: beta(self.env_steps),  # from env_steps inside the graph, at every step
                priority_eps=c.priority_eps,
            )
        else:
            self.samples = iter(experience_dataset(self.buffer, c.batch_size, n_step_transform(c)))
        self.history: list[dict] = []
        self.best_q_network = keras.models.clone_model(q_network)
        self.best_q_network.set_weights(q_network.get_weights())
        self.best_return = tf.Variable(-np.inf, dtype=tf.float64, trainable=False, name="best_return")
        self.checkpoint = tf.train.Checkpoint(
            agent=self.agent,
            buffer=self.buffer,
            env_steps=self.env_steps,
            best_q_network=self.best_q_network,
            best_return=self.best_return,
        )
        self.manager = None
        if c.output_dir:
            self.manager = tf.train.CheckpointManager(self.checkpoint, os.path.join(c.output_dir, "checkpoints"), 1)
            self.summaries = _optional.Summaries(os.path.join(c.output_dir, "tensorboard"))

    def restore(self) -> None:
        if not (self.manager and self.manager.latest_checkpoint):
            raise FileNotFoundError(
                f"train_dqn: output_dir ({self.config.output_dir}) must hold a checkpoint to resume from."
            )
        self.checkpoint.restore(self.manager.latest_checkpoint).assert_existing_objects_matched()
        path = os.path.join(self.config.output_dir or "", "history.json")
        if os.path.exists(path):
            with open(path) as f:
                self.history = json.load(f)

    def epsilon(self) -> float:
        """The collect policy's epsilon at the collector's own count of env steps."""
        return linear_epsilon(self.config, self.acted_from + self.driver.num_env_steps)

    def learn(self, env_steps: int, new_steps: int) -> None:
        """The learning side of one collect: the train steps its env steps earned, once the random steps are in."""
        c = self.config
        self.env_steps.assign(env_steps)
        if env_steps < c.initial_collect_steps:
            return
        self.credit += c.train_steps_per_env_step * new_steps
        while self.credit >= c.train_steps_per_call:
            self.loss = float(self.train_once().loss)  # read back: the step is done
            self.credit -= c.train_steps_per_call

    @contextlib.contextmanager
    def timed(self, part: str) -> Iterator[None]:
        """Adds the block's seconds to `seconds[part]`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - start

    def train_once(self) -> LossInfo:
        """`train_steps_per_call` train steps (with priorities: weights, train, update, one graph each); the
        last one's `LossInfo`."""
        if self.config.train_steps_per_call > 1:
            return self._train_loop()
        if not self.config.prioritized:
            return self.agent.train(next(self.samples))
        return self._prioritized_step(next(self.samples))

    def log(self, loss: float, elapsed: float) -> dict:
        finite = lambda x: float(x) if np.isfinite(x) else None  # noqa: E731  (JSON has no NaN)
        point = {
            "env_steps": int(self.env_steps.numpy()),
            "train_steps": int(self.agent.train_step_counter.numpy()),
            "average_return": finite(self.returns.result()),
            "episode_length": finite(self.lengths.result()),
            "loss": finite(loss),
            "elapsed": elapsed,
        }
        self.history.append(point)
        if self.manager:
            names = ("average_return", "episode_length", "loss")
            self.summaries.scalars(int(self.env_steps.numpy()), {k: point[k] for k in names})
        return point

    def evaluate_now(self) -> bool:
        """A greedy evaluation during training; keeps the best weights. True: stop early."""
        c = self.config
        steps = int(self.env_steps.numpy())
        seed = c.seed + 20_000 + steps
        with self.timed("evaluate"):
            returns = evaluate(c.env_id, self.agent.policy(), c.num_interval_eval_episodes, seed=seed)
        mean = float(np.mean(returns))
        self.history[-1]["eval_return"] = mean  # loop() logged a point at this step
        if mean >= self.best_return.numpy():
            self.best_return.assign(mean)
            self.best_q_network.set_weights(self.agent.q_network.get_weights())
        if self.manager:
            self.summaries.scalars(steps, {"eval/interval_return": mean})
        return c.stop_at_return is not None and mean >= c.stop_at_return

    def save(self) -> None:
        if self.manager and self.config.output_dir:
            self.manager.save(checkpoint_number=int(self.env_steps.numpy()))
            with open(os.path.join(self.config.output_dir, "history.json"), "w") as f:
                json.dump(self.history, f)

    def loop(self) -> float:
        """Collects and trains until `num_env_steps` (or an early stop); returns the loop's seconds. A
        `Pipeline`: with `concurrent`, the collector runs on a thread of its own, and the run is the same."""
        c = self.config
        first = self.acted_from = int(self.env_steps.numpy())
        start, due = time.perf_counter(), _Due(first)
        self.loss, self.credit, stop, shown = float("nan"), 0.0, False, first
        if first >= c.num_env_steps:
            return self.finish(self.loss, start, False)
        with _optional.progress_bar(c.num_env_steps, first, c.progress) as bar:

            def after(env_steps: int) -> bool:
                nonlocal shown, stop
                stop = self.events(shown, bar, due, start, first)
                shown = env_steps
                return stop

            run = Pipeline(
                self.driver,
                [self.buffer.add_batch, self.returns, self.lengths],
                self.learn,
                after=after,
                weights=self.agent.q_network.get_weights,
                set_weights=self.actor_q_network.set_weights,
                pull_every=c.pull_every,
                num_env_steps=c.num_env_steps,
                env_steps=first,
                concurrent=c.concurrent,
            )
            try:
                run.run()
            finally:
                for part, seconds in run.seconds.items():
                    if part in self.seconds:
                        self.seconds[part] += seconds
        return self.finish(self.loss, start, stop)

    def events(self, steps: int, bar: Any, due: _Due, start: float, first: int) -> bool:
        """What is due after the loop went from `steps` env steps to now: a log point, a greedy evaluation and a
        checkpoint; True: stop early."""
        c, stop = self.config, False
        now = int(self.env_steps.numpy())
        bar.update(now - steps)
        evaluate_now = now >= c.initial_collect_steps and due("eval", now, c.eval_interval)
        if due("log", now, c.log_interval) or evaluate_now:
            elapsed = time.perf_counter() - start
            point = self.log(self.loss, elapsed)
            shown = {"avg_return": (point["average_return"], ".1f"), "loss": (point["loss"], ".3f")}
            bar.set_postfix(  # a figure not measured yet (no episode ended, no train step) is left out
                **{name: format(value, spec) for name, (value, spec) in shown.items() if value is not None},
                env_steps_per_s=f"{(now - first) / max(elapsed, 1e-9):.0f}",
            )
        if evaluate_now:
            stop = self.evaluate_now()
        if due("save", now, c.checkpoint_interval):
            self.save()
        return stop

    def finish(self, loss: float, start: float, stop: bool) -> float:
        """Logs the last point (if not logged yet) and says why the loop stopped early; returns its seconds."""
        c = self.config
        if not self.history or self.history[-1]["env_steps"] != int(self.env_steps.numpy()):
            self.log(loss, time.perf_counter() - start)
        if stop and c.progress:
            reached = self.history[-1].get("eval_return", float("nan"))
            print(
                f"stopped early at {int(self.env_steps.numpy()):,} of {c.num_env_steps:,} environment steps: an "
                f"evaluation's return ({reached:.1f}) reached stop_at_return ({c.stop_at_return:g}).",
                flush=True,
            )
        return time.perf_counter() - start

    def restore_best(self) -> None:
        """Puts the best evaluated weights in the online network (if any evaluation ran)."""
        if self.config.keep_best and np.isfinite(self.best_return.numpy()):
            self.agent.q_network.set_weights(self.best_q_network.get_weights())


def train_dqn(config: DqnConfig | None = None, **overrides: Any) -> TrainResult:
    """Trains a Double DQN agent from a replay buffer; see the module docstring.

    Args:
      config: the run's settings (default `DqnConfig()`).
      **overrides: fields of `DqnConfig` to replace, e.g. `num_env_steps=2000`.

    Returns:
      A `TrainResult` whose `average_return` is the greedy policy's mean
      return over `num_eval_episodes` fresh episodes.
    """
    config = dataclasses.replace(config or DqnConfig(), **overrides)
    wall_start = time.perf_counter()
    if config.output_dir:
        os.makedirs(config.output_dir, exist_ok=True)
    run = _Run(config)
    if config.resume:
        run.restore()
    steps0, train0 = int(run.env_steps.numpy()), int(run.agent.train_step_counter.numpy())
    loop_time = run.loop()
    run.env.close()
    run.restore_best()
    with run.timed("evaluate"):
        eval_returns = evaluate(config.env_id, run.agent.policy(), config.num_eval_episodes, seed=config.seed + 10_000)
    run.save()
    if config.output_dir:
        if _optional.available("matplotlib", "no learning_curve.png is drawn"):
            plot_learning_curve(run.history, os.path.join(config.output_dir, "learning_curve.png"), eval_returns)
        run.summaries.scalars(int(run.env_steps.numpy()), {"eval/average_return": float(np.mean(eval_returns))})
        run.summaries.flush()
    env_steps, train_steps = int(run.env_steps.numpy()), int(run.agent.train_step_counter.numpy())
    rate = lambda n: n / loop_time if loop_time > 0 else 0.0  # noqa: E731
    return TrainResult(
        average_return=float(np.mean(eval_returns)),
        eval_returns=eval_returns,
        num_env_steps=env_steps,
        num_train_steps=train_steps,
        wall_time=time.perf_counter() - wall_start,
        env_steps_per_sec=rate(env_steps - steps0),
        train_steps_per_sec=rate(train_steps - train0),
        history=run.history,
        output_dir=config.output_dir,
        agent=run.agent,
        buffer=run.buffer,
        seconds=dict(run.seconds),
    )
