"""Train a Double-DQN agent on CartPole-v1 from a tfreplay buffer.

    tfreplay-demo                                # or: python -m tfreplay.rl.demo
    tfreplay-demo --steps=2000                   # a short run (seconds)
    tfreplay-demo --steps=80000 --resume         # continue the saved run
    tfreplay-demo --prioritized                  # prioritized replay
    tfreplay-demo --n_step=1                     # learn from single transitions
    tfreplay-demo --train_steps_per_call=1       # one train step per call, from as_dataset
    tfreplay-demo --concurrent                   # collect on a second thread: the same run
    tensorboard --logdir runs/demo/tensorboard

A collect driver over 16 vector environments feeds a `TFUniformReplayBuffer`
through its `add_batch` observer; the learner runs 16 train steps per graph
call (`tfreplay.TrainLoop`), each on 64 three-step returns (`NStepReturns`)
drawn inside that graph; `--train_steps_per_call=1` reads them from
`as_dataset(sample_batch_size=64)` one step per call instead.
Writes checkpoints (agent + buffer), `history.json`, TensorBoard summaries and
`learning_curve.png` under `--output_dir`. `--prioritized` replays from a
`TFPrioritizedReplayBuffer` (importance weights, priorities updated in the
train step); `--n_step=N` learns from N-step returns (1: single transitions).
It takes turns: a vector step, then the train steps it earned. `--concurrent`
collects on a thread of its own, ahead of the learner (`tfreplay.rl.pipeline`),
and makes the same run, step for step; on two CPU cores it saves a few
percent, since collection is a small part of the loop (see the
collect-and-train guide).
The last lines give the greedy evaluation (20 episodes at once, in a vector
env) and where the time went: collect, learn and evaluate seconds (and when
concurrent, overlap: both at once).

Needs the `rl` extra (`pip install ".[rl]"` in a checkout, or `"<wheel>[rl]"`), which brings
matplotlib for the learning curve; the progress bar (tqdm) and the summaries (tensorboard) come with
the `examples` extra, and without them the run says what it leaves out and goes on. The command line
is parsed before TensorFlow loads: `--help` and a bad flag answer at once.
"""

from __future__ import annotations

import dataclasses
import os
import time
import types
from typing import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl import flags, logging  # noqa: E402

from tfreplay.rl import _cli  # noqa: E402
from tfreplay.rl.config import DqnConfig  # noqa: E402  (no TensorFlow: it loads in `main`, once the flags parse)

# The fields' defaults, read without making a config (its checks load TensorFlow).
_DEFAULTS = types.SimpleNamespace(**{field.name: field.default for field in dataclasses.fields(DqnConfig)})

flags.DEFINE_string("env_id", _DEFAULTS.env_id, "Gymnasium environment id (discrete actions, flat observations).")
flags.DEFINE_integer("steps", _DEFAULTS.num_env_steps, "Total environment steps to collect (over all envs).")
flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of networks, exploration, environments and sampling.")
flags.DEFINE_integer("buffer_size", _DEFAULTS.buffer_size, "Replay buffer capacity in transitions.")
flags.DEFINE_integer("num_envs", _DEFAULTS.num_envs, "Parallel environments in the collect driver.")
flags.DEFINE_string("output_dir", "runs/demo", "Where checkpoints, summaries and the learning curve go.")
flags.DEFINE_boolean("resume", False, "Continue from the latest checkpoint in --output_dir.")
flags.DEFINE_boolean("early_stop", True, "Stop once a periodic evaluation reaches the env's reward threshold.")
flags.DEFINE_boolean("progress", True, "Show progress (a tqdm bar; plain lines where tqdm is not installed).")
flags.DEFINE_boolean("prioritized", False, "Prioritized replay (alpha 0.6, beta 0.4 annealed to 1).")
flags.DEFINE_integer("n_step", 3, "Learn from n-step returns (1: single transitions).", lower_bound=1)
flags.DEFINE_integer(
    "train_steps_per_call", 16, "Train steps per graph call, sampled inside it (1: one per call, from as_dataset).",
    lower_bound=1,
)  # fmt: skip
flags.DEFINE_boolean(
    "concurrent", False,
    "Collect on a thread of its own while learning (the default takes turns on one thread); the same seed "
    "gives the same run either way.",
)  # fmt: skip
flags.DEFINE_integer(
    "pull_every", _DEFAULTS.pull_every, "Env steps between the collector's pulls of the learner's weights.",
    lower_bound=1,
)  # fmt: skip
FLAGS = flags.FLAGS


def config_from_flags() -> DqnConfig:
    """The run the parsed flags ask for."""
    import gymnasium as gym

    threshold = gym.spec(FLAGS.env_id).reward_threshold if FLAGS.early_stop else None
    return DqnConfig(
        env_id=FLAGS.env_id,
        num_env_steps=FLAGS.steps,
        seed=FLAGS.seed,
        buffer_size=FLAGS.buffer_size,
        num_envs=FLAGS.num_envs,
        output_dir=FLAGS.output_dir,
        resume=FLAGS.resume,
        progress=FLAGS.progress,
        stop_at_return=threshold,
        prioritized=FLAGS.prioritized,
        n_step=FLAGS.n_step,
        train_steps_per_call=FLAGS.train_steps_per_call,
        concurrent=FLAGS.concurrent,
        pull_every=FLAGS.pull_every,
    )


def _written(output_dir: str) -> str:
    """What the run left under `output_dir`, for the last line."""
    names = [("checkpoints", "checkpoints"), ("history.json", "history.json")]
    names += [("tensorboard", "TensorBoard summaries"), ("learning_curve.png", "learning_curve.png")]
    found = [label for name, label in names if os.path.exists(os.path.join(output_dir, name))]
    return ", ".join(found) or "nothing"


def main(argv: Sequence[str]) -> None:
    """Trains with the parsed flags and prints the evaluation and what was written."""
    del argv
    logging.set_verbosity(logging.WARNING)  # app.run would show TensorFlow's INFO logs
    from tfreplay.rl.training import train_dqn

    config = config_from_flags()
    threshold = config.stop_at_return
    started = time.time()
    result = train_dqn(config)
    returns = ", ".join(f"{r:.0f}" for r in result.eval_returns)
    print(f"Greedy evaluation over {len(result.eval_returns)} episodes: {returns}")
    stopped = ""
    if result.num_env_steps < config.num_env_steps:
        stopped = f" (stopped early: an evaluation reached the reward threshold, {threshold})"
    print(f"Environment steps: {result.num_env_steps}, train steps: {result.num_train_steps}{stopped}")
    print(f"Wrote {_written(FLAGS.output_dir)} under {FLAGS.output_dir}")
    curve = os.path.join(FLAGS.output_dir, "learning_curve.png")
    if os.path.exists(curve) and os.path.getmtime(curve) >= started - 1:  # drawn by this run, not an earlier one
        print(f"Learning curve: {os.path.abspath(curve)}")
    print(f"Time: {result.time_breakdown()}")
    print(f"{config.env_id}: {result.summary()}")


def run(argv: Sequence[str] | None = None) -> None:
    """The `tfreplay-demo` command: parses the command line (`--help` exits 0) and trains."""
    _cli.run(main, argv, module=__name__)


if __name__ == "__main__":
    run()
