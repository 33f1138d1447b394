"""Bit flipping: a goal-conditioned DQN fails on 15 bits without hindsight experience replay and solves them with it.

    python -m examples.her_bitflip --compare --out=runs/her_bitflip   # both runs, the curves side by side
    python -m examples.her_bitflip --no-her --bits=8 --episodes=4000   # one run, without HER
    TF_USE_LEGACY_KERAS=1 python -m examples.her_bitflip --bits=8      # the same under tf-keras

The environment (Andrychowicz et al., 2017) holds `n` bits and a goal of `n`
bits, both random; an action flips one bit; the reward is -1 on every step
until the state equals the goal, 0 on the step that reaches it, which ends
the episode; an episode lasts at most `n` steps. From a random start a random
policy almost never sees a reward of 0 (a chance of about `2**-n` a step),
so a DQN learns that every action is as bad as the others. HER replays each
transition with a goal its episode reached later (`strategy="future"`, 4
relabeled goals per stored one), whose reward of 0 is common: the network
learns to reach any state it has reached, and the true goals with them.

`num_envs` environments step together (NumPy, auto-reset). Their transitions
go into a `TFUniformReplayBuffer`, one segment per environment, as they
happened. After each collect round one `tf.function` call runs several
updates, each drawing its batch with `buffer.get_next(transform=her)`: the
goals are relabeled and the rewards recomputed by a TF function inside the
update's graph. The network is an MLP on (state, goal) with a target
network, the Huber loss and Adam, from the Keras TensorFlow routes `tf.keras`
to (`tfreplay.keras.keras_module()`).

Progress lines give the episodes so far, the success rate of the greedy
policy over a fixed batch of evaluation episodes, and the seconds. With
`--out`, `her_bitflip.csv` (run, episodes, env steps, success rate, seconds)
and `her_bitflip.png` (the learning curves, with matplotlib) go there. The
other settings are the fields of `Config`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from typing import Any, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfreplay  # noqa: E402
from tfreplay.keras import keras_module  # noqa: E402
from tfreplay.rl import _optional  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Config:
    """One run. The defaults solve 15 bits with HER (see docs/guides/her.md for the measured curves)."""

    num_bits: int = 15
    num_episodes: int = 10_000  # training episodes, over all environments
    her: bool = True
    seed: int = 0
    num_envs: int = 16
    hidden: tuple[int, ...] = (256,)
    learning_rate: float = 1e-3
    batch_size: int = 128
    gamma: float = 0.98
    updates_per_round: int = 16  # updates after every round of `num_bits` vector steps
    tau: float = 0.05  # the target network moves this far to the online one after every round
    epsilon: tuple[float, float] = (0.5, 0.05)  # exploration, linear from the first to the second over the run
    relabel_ratio: float = 0.8  # HER's k = 4
    buffer_size: int = 200_000  # transitions, over all environments
    num_evals: int = 20  # evaluations over the run
    num_eval_episodes: int = 256


class BitFlip:
    """`num_envs` bit-flipping environments stepped together; each resets itself when its episode ends."""

    def __init__(self, num_bits: int, num_envs: int, seed: int):
        self.num_bits, self.rng = num_bits, np.random.default_rng(seed)
        self.state = np.zeros([num_envs, num_bits], np.float32)
        self.goal = np.zeros([num_envs, num_bits], np.float32)
        self.t = np.zeros(num_envs, np.int64)
        self.reset(np.ones(num_envs, bool))

    def reset(self, which: np.ndarray) -> None:
        """New random starts and goals for the environments `which`, a goal never equal to its start."""
        self.t[which] = 0
        while which.any():
            size = [int(which.sum()), self.num_bits]
            self.state[which] = self.rng.integers(0, 2, size)
            self.goal[which] = self.rng.integers(0, 2, size)
            which = which & (self.state == self.goal).all(axis=-1)

    def step(self, action: np.ndarray) -> dict:
        """Flips bit `action[i]` of environment `i`: the transitions, then the ended environments are reset."""
        first = self.t == 0
        observation, goal = self.state.copy(), self.goal.copy()
        rows = np.arange(len(action))
        self.state[rows, action] = 1 - self.state[rows, action]
        self.t += 1
        terminated = (self.state == self.goal).all(axis=-1)
        truncated = ~terminated & (self.t >= self.num_bits)
        transition = {
            "observation": observation,
            "next_observation": self.state.copy(),
            "desired_goal": goal,
            "action": action.astype(np.int32),
            "reward": terminated.astype(np.float32) - 1,
            "first": first,
            "terminated": terminated,
            "truncated": truncated,
        }
        self.reset(terminated | truncated)
        return transition


def transition_spec(num_bits: int) -> dict:
    bits = tf.TensorSpec([num_bits], tf.float32)
    scalar = lambda dtype: tf.TensorSpec([], dtype)  # noqa: E731
    return {
        "observation": bits,
        "next_observation": bits,  # the state the step reached: the goal it achieved
        "desired_goal": bits,
        "action": scalar(tf.int32),
        "reward": scalar(tf.float32),
        "first": scalar(tf.bool),
        "terminated": scalar(tf.bool),
        "truncated": scalar(tf.bool),
    }


def reached(achieved: tf.Tensor, desired: tf.Tensor) -> tf.Tensor:
    """The environment's reward, in TF ops (HER calls it inside the sample's graph): 0 at the goal, else -1."""
    return tf.cast(tf.reduce_all(achieved == desired, axis=-1), tf.float32) - 1


class GoalDqn(tf.Module):
    """DQN on (state, goal) with a target network; `train` runs several sample-and-update steps in one graph."""

    def __init__(self, config: Config, buffer: Any):
        super().__init__()
        keras = keras_module()
        self.config, self.buffer = config, buffer
        self.online = self._mlp(keras, config)
        self.target = self._mlp(keras, config)
        for target, online in zip(self.target.variables, self.online.variables):
            target.assign(online)
        self.optimizer = keras.optimizers.Adam(config.learning_rate)
        self.optimizer.build(self.online.trainable_variables)  # its slots exist before the loop's graph is traced
        self.huber = keras.losses.Huber()
        self.her = None
        if config.her:
            self.her = tfreplay.HindsightRelabel(
                reached, "future", config.relabel_ratio, achieved_goal="next_observation"
            )

    @staticmethod
    def _mlp(keras: Any, config: Config) -> Any:
        layers = [keras.layers.Dense(width, "relu") for width in config.hidden]
        return keras.Sequential([keras.Input([2 * config.num_bits]), *layers, keras.layers.Dense(config.num_bits)])

    @tf.function(reduce_retracing=True)
    def greedy(self, state: tf.Tensor, goal: tf.Tensor) -> tf.Tensor:
        return tf.argmax(self.online(tf.concat([state, goal], -1)), axis=-1, output_type=tf.int32)

    @tf.function
    def train(self, num_updates: tf.Tensor) -> tf.Tensor:
        loss = tf.constant(0.0)
        for _ in tf.range(num_updates):
            loss = self._update()
        tau = self.config.tau
        for target, online in zip(self.target.variables, self.online.variables):
            target.assign((1 - tau) * target + tau * online)
        return loss

    def _update(self) -> tf.Tensor:
        config = self.config
        items, _ = self.buffer.get_next(sample_batch_size=config.batch_size, transform=self.her)
        goal = items["desired_goal"]
        next_q = tf.reduce_max(self.target(tf.concat([items["next_observation"], goal], -1)), axis=-1)
        # A reward of 0 is the goal reached, which ends the episode; HER's rewards say so of their new goals too
        # (the stored `terminated` is the original goal's). A time limit cuts an episode without ending it.
        continues = tf.cast(items["reward"] < 0, tf.float32)
        targets = items["reward"] + config.gamma * continues * next_q
        targets = tf.stop_gradient(tf.clip_by_value(targets, -1 / (1 - config.gamma), 0.0))  # the returns' range
        with tf.GradientTape() as tape:
            q_values = self.online(tf.concat([items["observation"], goal], -1), training=True)
            chosen = tf.gather(q_values, items["action"], batch_dims=1)
            loss = self.huber(targets[:, None], chosen[:, None])
        variables = self.online.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss


def success_rate(agent: GoalDqn, env: BitFlip) -> float:
    """The greedy policy's share of `env`'s episodes (all at their first step) that reach their goal."""
    ended, success = np.zeros(len(env.t), bool), np.zeros(len(env.t), bool)
    while not ended.all():
        step = env.step(agent.greedy(env.state, env.goal).numpy())
        success |= step["terminated"] & ~ended
        ended |= step["terminated"] | step["truncated"]
    return float(success.mean())


def train(config: Config, label: str = "") -> list[dict]:
    """One run; returns its evaluations, `{"episodes", "env_steps", "success_rate", "seconds"}` each, the
    first before training, the last at the end. Progress lines start with `label`."""
    keras_module().utils.set_random_seed(config.seed)
    start = time.perf_counter()
    n, num_envs = config.num_bits, config.num_envs
    env = BitFlip(n, num_envs, config.seed)
    buffer = tfreplay.TFUniformReplayBuffer(
        transition_spec(n), num_envs, max_length=max(config.buffer_size // num_envs, n), seed=config.seed
    )
    agent = GoalDqn(config, buffer)
    rng = np.random.default_rng(config.seed + 1)
    eval_seed = config.seed + 10_000  # every evaluation plays the same episodes
    every = max(config.num_episodes // config.num_evals, 1)
    history: list[dict] = []
    episodes = env_steps = num_updates = next_eval = 0
    while True:
        if episodes >= next_eval:
            evaluation = BitFlip(n, config.num_eval_episodes, eval_seed)
            rate = success_rate(agent, evaluation)
            seconds = time.perf_counter() - start
            history.append({"episodes": episodes, "env_steps": env_steps, "success_rate": rate, "seconds": seconds})
            print(f"{label}episodes {episodes:6d} | success rate {rate:.3f} | {seconds:6.1f} s", flush=True)
            next_eval = (episodes // every + 1) * every
            if episodes >= config.num_episodes:
                print(f"{label}{env_steps} env steps, {num_updates} updates of {config.batch_size}", flush=True)
                return history
        low, high = config.epsilon
        epsilon = high + (low - high) * max(0.0, 1 - episodes / config.num_episodes)
        for _ in range(n):
            action = agent.greedy(env.state, env.goal).numpy()
            explore = rng.random(num_envs) < epsilon
            action[explore] = rng.integers(0, n, int(explore.sum()))
            step = env.step(action)
            buffer.add_batch(step)
            episodes += int((step["terminated"] | step["truncated"]).sum())
            env_steps += num_envs
        agent.train(tf.constant(config.updates_per_round))
        num_updates += config.updates_per_round


RUNS = {True: "her", False: "no_her"}  # the CSV's names of the runs
TITLES = {True: "DQN + HER", False: "DQN without HER"}


def write_csv(histories: dict, path: str) -> None:
    """One row per evaluation: run, episodes, env steps, success rate, seconds."""
    with open(path, "w") as f:
        f.write("run,episodes,env_steps,success_rate,seconds\n")
        for her, history in histories.items():
            for h in history:
                f.write(f"{RUNS[her]},{h['episodes']},{h['env_steps']},{h['success_rate']:.4f},{h['seconds']:.1f}\n")


def plot(histories: dict, num_bits: int, path: str, caption: str) -> None:
    """The runs' learning curves side by side (without HER on the left), the command and machine below."""
    from matplotlib.figure import Figure  # no pyplot: the caller's backend (a notebook's, say) is left alone

    runs = sorted(histories, key=int)  # False (no HER) first
    fig = Figure(figsize=(4.2 * len(runs), 3.6))
    axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)[0]
    for ax, her, color in zip(axes, runs, ["C3", "C0"] if len(runs) == 2 else ["C0" if runs[0] else "C3"]):
        history = histories[her]
        ax.plot([h["episodes"] for h in history], [h["success_rate"] for h in history], "o-", color=color, ms=3)
        ax.set_title(f"{TITLES[her]}: final success {history[-1]['success_rate']:.2f}", fontsize=10)
        ax.set_xlabel("training episodes")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"greedy success rate, {num_bits} bits")
    fig.text(0.5, 0.01, caption, ha="center", va="bottom", fontsize=7, color="0.35", wrap=True)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=90)


def machine() -> str:
    """The machine in a few words: architecture, the cores the run may use, TensorFlow and Keras."""
    total = os.cpu_count() or 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    used = f"{cores} of {total} cores" if cores < total else f"{total} cores"
    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    keras = keras_module()
    return f"{platform.machine()}, {used}, TF {tf.__version__} {device}, {keras.__name__} {keras.__version__}"


def main(argv: Sequence[str] | None = None) -> dict:
    """Runs the command line's runs; returns `{"histories": {her: history}, "seconds", "csv", "png"}`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    defaults = Config()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, default=defaults.num_bits, help="the environment's n")
    parser.add_argument("--episodes", type=int, default=defaults.num_episodes, help="training episodes per run")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--her", action=argparse.BooleanOptionalAction, default=True, help="relabel with HER")
    parser.add_argument("--compare", action="store_true", help="run without and with HER, same seed and budget")
    parser.add_argument("--out", default=None, help="a folder for her_bitflip.csv and her_bitflip.png")
    args = parser.parse_args(argv)
    if args.bits < 2:
        parser.error(f"--bits ({args.bits}) must be at least 2")
    if args.episodes < 1:
        parser.error(f"--episodes ({args.episodes}) must be positive")

    start = time.perf_counter()
    print(f"{args.bits} bits, {args.episodes} episodes per run, seed {args.seed} | {machine()}", flush=True)
    histories = {}
    for her in [False, True] if args.compare else [args.her]:
        config = dataclasses.replace(defaults, num_bits=args.bits, num_episodes=args.episodes, her=her, seed=args.seed)
        histories[her] = train(config, label=f"[{RUNS[her]}] ")
    seconds = time.perf_counter() - start
    finals = ", ".join(f"{RUNS[her]} {history[-1]['success_rate']:.3f}" for her, history in histories.items())
    print(f"final success rate: {finals} | {seconds:.0f} s", flush=True)

    csv_path = png_path = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        csv_path = os.path.join(args.out, "her_bitflip.csv")
        write_csv(histories, csv_path)
        if _optional.available("matplotlib", "no her_bitflip.png is drawn"):
            png_path = os.path.join(args.out, "her_bitflip.png")
            command = " ".join(["python -m examples.her_bitflip", *argv])
            plot(histories, args.bits, png_path, f"{command}  |  {machine()}  |  {seconds:.0f} s")
        print(f"wrote {', '.join(p for p in (csv_path, png_path) if p)}", flush=True)
    return {"histories": histories, "seconds": seconds, "csv": csv_path, "png": png_path}


if __name__ == "__main__":
    main()
