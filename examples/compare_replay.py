"""Uniform replay against prioritized replay with 3-step returns: DQN on CartPole-v1, 3 seeds each.

    python -m examples.compare_replay                               # 6 runs, one after another (long)
    python -m examples.compare_replay --results=/tmp/compare.jsonl  # keeps finished runs, runs the rest
    python -m examples.compare_replay --table_only                  # the table of the runs so far

`--steps` (the budget of every run) and `--env_id` are the demo's flags.

Every run is `train_dqn` with the demo's settings and the same budget of
environment steps; only the replay differs. Like the demo, it evaluates the
greedy policy (20 episodes) every 2,500 steps and stops once the mean reaches
the reward threshold (475); "steps to 475" is the step count of that
evaluation. The final greedy return is the mean of 20 fresh episodes with the
best evaluated weights. Runs go one at a time, each appended to `--results`
as a JSON line as soon as it ends, so an interrupted comparison resumes.
"""

from __future__ import annotations

import json
import os
import time
from typing import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from examples import cli, demo  # noqa: E402,F401  (demo: its --steps and --env_id flags)
from tfreplay.rl.training import DqnConfig, train_dqn  # noqa: E402

# What each variant changes in DqnConfig; everything else is the demo's default.
VARIANTS = {
    "uniform": {},
    "PER + 3-step": {"prioritized": True, "n_step": 3},
    "PER": {"prioritized": True},  # each change alone, to tell their effects apart
    "3-step": {"n_step": 3},
}

flags.DEFINE_list("variants", ["uniform", "PER + 3-step"], f"Which replays to run, of {list(VARIANTS)}.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds to run each variant with.")
flags.DEFINE_string("results", "/tmp/compare_replay.jsonl", "JSON lines, one per finished run (kept across calls).")
flags.DEFINE_boolean("table_only", False, "Print the table of the runs in --results without running any.")
FLAGS = flags.FLAGS


def run_one(variant: str, seed: int, steps: int, env_id: str) -> dict:
    """One training run; what the table needs."""
    threshold = gym.spec(env_id).reward_threshold
    config = DqnConfig(
        env_id=env_id, num_env_steps=steps, seed=seed, stop_at_return=threshold, progress=False, **VARIANTS[variant]
    )
    result = train_dqn(config)
    reached = [h["env_steps"] for h in result.history if h.get("eval_return", -np.inf) >= threshold]
    return {
        "variant": variant,
        "seed": seed,
        "budget": steps,
        "threshold": threshold,
        "steps_to_threshold": reached[0] if reached else None,
        "env_steps": result.num_env_steps,
        "final_return": result.average_return,
        "wall_time": result.wall_time,
        "train_steps_per_sec": result.train_steps_per_sec,
        "load_average": os.getloadavg()[0],
        "config": {k: v for k, v in vars(config).items() if isinstance(v, (int, float, str, bool, type(None)))},
    }


def load(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def table(records: list[dict]) -> str:
    """A Markdown table: one row per variant, seeds in order."""
    lines = [
        "| replay | env steps to reach the threshold, per seed | mean | final greedy return, per seed | "
        "train steps/s |",
        "|---|---|---:|---|---:|",
    ]
    for variant in sorted({r["variant"] for r in records}, key=list(VARIANTS).index):
        rows = sorted((r for r in records if r["variant"] == variant), key=lambda r: r["seed"])
        reached = [r["steps_to_threshold"] for r in rows]
        per_seed = ", ".join(f"{s:,}" if s is not None else f"not in {r['budget']:,}" for s, r in zip(reached, rows))
        # A run that never reached it counts as its whole budget: the mean is then a lower bound.
        mean = np.mean([s if s is not None else r["budget"] for s, r in zip(reached, rows)])
        mean_text = f"{mean:,.0f}" if None not in reached else f"> {mean:,.0f}"
        returns = ", ".join(f"{r['final_return']:.1f}" for r in rows)
        rate = np.mean([r["train_steps_per_sec"] for r in rows])
        seeds = ", ".join(str(r["seed"]) for r in rows)
        lines.append(f"| {variant} (seeds {seeds}) | {per_seed} | {mean_text} | {returns} | {rate:.0f} |")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)
    unknown = set(FLAGS.variants) - set(VARIANTS)
    if unknown:
        raise app.UsageError(f"--variants ({sorted(unknown)}) must be among {list(VARIANTS)}.")
    done = {(r["variant"], r["seed"], r["budget"]) for r in load(FLAGS.results)}
    for variant in [] if FLAGS.table_only else FLAGS.variants:
        for seed in map(int, FLAGS.seeds):
            if (variant, seed, FLAGS.steps) in done:
                continue
            start = time.perf_counter()
            record = run_one(variant, seed, FLAGS.steps, FLAGS.env_id)
            with open(FLAGS.results, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(
                f"{variant}, seed {seed}: {record['steps_to_threshold']} steps to the threshold, final return "
                f"{record['final_return']:.1f} ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    records = [r for r in load(FLAGS.results) if r["budget"] == FLAGS.steps and r["variant"] in FLAGS.variants]
    print(table(records))


if __name__ == "__main__":
    cli.run(main)
