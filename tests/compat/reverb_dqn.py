"""TF-Agents' DQN example (`tf_agents/examples/dqn/dqn_train_eval.py`, unmodified) over tfreplay.compat.reverb.

Run by `make reverb-dqn` on current TensorFlow: `reverb.install()`, then the example's `train_eval` twice on one
root directory: a first run of `--first` iterations that checkpoints every 1000 train steps, then a second that
restores that checkpoint (its first evaluation is at the restored train step) and trains until an evaluation's
average return reaches `--target`. Prints the time, environment steps, steps per second and the returns.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import signal
import tempfile
import time

import tfreplay.compat.reverb as reverb

reverb.install()
faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: where each thread is

from tf_agents.environments import py_environment  # noqa: E402
from tf_agents.examples.dqn import dqn_train_eval  # noqa: E402
from tf_agents.train import actor, learner  # noqa: E402


class Reached(Exception):
    pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--first", type=int, default=5000)
    parser.add_argument("--most", type=int, default=40000)
    parser.add_argument("--target", type=float, default=195.0)
    args = parser.parse_args()
    evals: list[tuple[int, float, int]] = []
    steps = {"env": 0}
    phase = {"second": False}
    run_and_log, step = actor.Actor.run_and_log, py_environment.PyEnvironment.step

    def counted_step(self, action):  # every environment step, the evaluations' included
        steps["env"] += 1
        return step(self, action)

    def logged(self):
        run_and_log(self)
        value = next(float(m.result()) for m in self._metrics if m.name == "AverageReturn")
        evals.append((int(self._train_step.numpy()), value, steps["env"]))
        print(f"eval: train step {evals[-1][0]}, return {value:.1f}, env steps {steps['env']}", flush=True)
        if phase["second"] and value >= args.target:
            raise Reached

    py_environment.PyEnvironment.step, actor.Actor.run_and_log = counted_step, logged
    learner.Learner = functools.partial(learner.Learner, checkpoint_interval=1000)
    root = tempfile.mkdtemp(prefix="reverb-dqn-")
    start = time.monotonic()
    dqn_train_eval.train_eval(root, num_iterations=args.first, eval_interval=1000)
    phase["second"] = True
    restored_at = len(evals)
    try:
        dqn_train_eval.train_eval(root, num_iterations=args.most - args.first, eval_interval=1000)
    except Reached:
        pass
    seconds = time.monotonic() - start
    best = max(v for _, v, _ in evals)
    print(f"reverb-dqn: restored at train step {evals[restored_at][0]} (checkpoint of the first run)")
    print(
        f"reverb-dqn: return {evals[-1][1]:.1f} (best {best:.1f}) at train step {evals[-1][0]}; "
        f"{steps['env']} env steps (evaluations included) in {seconds:.0f} s, {steps['env'] / seconds:.0f} env steps/s"
    )
    if evals[-1][1] < args.target or evals[restored_at][0] < args.first:
        raise SystemExit(f"reverb-dqn: the return stayed below {args.target} or the checkpoint was not restored")


if __name__ == "__main__":
    main()
