"""The demo's loop, sequential against concurrent: `python -m benchmarks.demo_modes [ROUNDS] [ENV_STEPS]`.

Each round runs the demo's training (`train_dqn` with the config the demo's
flags give by default) for a fixed number of env steps
(default 20,000; no periodic evaluation, no early stop), once sequentially and
once with `concurrent=True`, each in a fresh process so that neither inherits
the other's graphs or threads; the order alternates from round to round. The
figure is the training loop's seconds (collection and learning, waits
included), and the ratio concurrent over sequential is taken within each
round. Unlike a run to the reward threshold, both sides do the same work, so
the ratio is the modes' speed alone, not how many env steps a run needed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from benchmarks import interleave

MODES = ("sequential", "concurrent")


def one_run(mode: str, env_steps: int) -> dict:
    """The demo's training for `env_steps` in this process; its loop seconds and time split."""
    from tfreplay.rl import demo  # sets TensorFlow's log level and TF_USE_LEGACY_KERAS as the demo does
    from tfreplay.rl.training import train_dqn

    demo.FLAGS(["demo", f"--steps={env_steps}", "--noearly_stop", f"--concurrent={mode == 'concurrent'}"])
    config = demo.config_from_flags()  # the demo's settings, whatever its flags' defaults are
    result = train_dqn(config, eval_interval=0, num_eval_episodes=4, progress=False, output_dir=None)
    loop = result.num_env_steps / result.env_steps_per_sec
    return {"loop": loop, "env_steps": result.num_env_steps, "train_steps": result.num_train_steps, **result.seconds}


def _median(runs: list, part: str) -> str:
    return interleave.num(statistics.median(run.get(part, 0.0) for run in runs))


def main(rounds: int = 5, env_steps: int = 20_000) -> list:
    runs: dict = {mode: [] for mode in MODES}
    start_load = interleave.load()
    for index in range(rounds):
        for mode in (MODES[i] for i in interleave.order(len(MODES), index)):
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.demo_modes", "--one", mode, str(env_steps)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode:
                raise RuntimeError(f"demo_modes: the {mode} run failed:\n{done.stderr[-3000:]}")
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    seconds = {mode: [run["loop"] for run in runs[mode]] for mode in MODES}
    ratio = interleave.Spread.of([c / s for s, c in zip(seconds["sequential"], seconds["concurrent"])])
    loads = ", ".join("?" if load is None else f"{load:.1f}" for load in (start_load, interleave.load()))
    print(f"{rounds} interleaved rounds of {env_steps:,} env steps; 1-minute load average at the start, end: {loads}")
    print("| mode | loop s | ms per env step | learn s | collect s | overlap s | over sequential |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode in MODES:
        loop = interleave.Spread.of(seconds[mode])
        versus = "1.00x" if mode == "sequential" else interleave.cell(ratio, suffix="x")
        overlap = _median(runs[mode], "overlap") if mode == "concurrent" else "-"
        cells = [interleave.cell(loop), interleave.cell(loop, 1000 / env_steps)]
        cells += [_median(runs[mode], "learn"), _median(runs[mode], "collect"), overlap, versus]
        print(f"| {mode} | " + " | ".join(cells) + " |")
    return [runs[mode] for mode in MODES]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(one_run(sys.argv[2], int(sys.argv[3]))))
    else:
        main(*(int(arg) for arg in sys.argv[1:3]))
