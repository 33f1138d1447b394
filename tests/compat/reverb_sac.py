"""TF-Agents' distributed SAC example, unmodified, as separate processes over tfreplay.compat.reverb.

Run by `make reverb-sac TFA_SRC=/path/to/agents` on current TensorFlow. The example's files
(`tf_agents/experimental/distributed/examples/sac/sac_{reverb_server,collect,train}.py` and, with `--eval`,
`examples/eval_job.py`) come from a TF-Agents source checkout, since the wheel leaves them out; each runs in a
process of its own after `reverb.install()`, configured only through its flags and gin bindings (Pendulum-v1
from gym instead of MuJoCo, fewer steps, a smaller table). The server listens on a free port of 127.0.0.1.

The launcher reads the collect job's TensorBoard summaries (`<root>/train/0`: the average return of its last 10
episodes, its environment steps) and its log (`Collecting with policy at step: N`, the train step of the
weights it last pulled from the variable container), and the eval job's summaries when there is one. It stops
every process when the average return exceeds `--target` (exit 0), or when `--max-seconds` pass, a job exits
or the run is interrupted (exit 1, with each job's log).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLONE = "git clone --branch v0.19.0 --depth 1 https://github.com/tensorflow/agents"
EXAMPLES = "tf_agents/experimental/distributed/examples"
# Each job's process: the shim in place of `import reverb`, then the example file as `__main__`.
BOOT = (
    "import runpy, sys; import tfreplay.compat.reverb as r; r.install(); "
    "path = sys.argv[1]; sys.argv = sys.argv[1:]; runpy.run_path(path, run_name='__main__')"
)
POLICY_STEP = re.compile(r"Collecting with policy at step: (\d+)")


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_args(args: argparse.Namespace, root: str, port: int) -> dict[str, list[str]]:
    """Each job's example file and flags: the environment and sizes through flags and gin bindings only."""
    examples = Path(args.tfa_src, EXAMPLES)
    address = f"127.0.0.1:{port}"
    clients = [f"--replay_buffer_server_address={address}", f"--variable_container_server_address={address}"]
    common = [f"--root_dir={root}", "--alsologtostderr"]
    gym = "@suite_gym.load"
    ratio = args.batch_size if args.samples_per_insert is None else args.samples_per_insert
    jobs = {
        "server": [
            str(examples / "sac/sac_reverb_server.py"),
            *common,
            f"--port={port}",
            f"--replay_buffer_capacity={args.capacity}",
            f"--min_table_size_before_sampling={args.initial_steps}",
            *([f"--samples_per_insert={ratio}"] if ratio else []),
        ],
        "collect": [
            str(examples / "sac/sac_collect.py"),
            *common,
            *clients,
            f"--env_name={args.env}",
            f"--gin_bindings=collect.suite_load_fn={gym}",
            f"--gin_bindings=collect.initial_collect_steps={args.initial_steps}",
            f"--gin_bindings=collect.max_train_steps={args.train_steps}",
        ],
        "train": [
            str(examples / "sac/sac_train.py"),
            *common,
            *clients,
            f"--env_name={args.env}",
            f"--gin_bindings=train.suite_load_fn={gym}",
            f"--gin_bindings=train.num_iterations={args.train_steps}",
            f"--gin_bindings=train.batch_size={args.batch_size}",
            f"--gin_bindings=train.learner_iterations_per_call={args.iterations_per_call}",
        ],
    }
    if args.eval:
        jobs["eval"] = [
            str(examples / "eval_job.py"),
            *common,
            f"--variable_container_server_address={address}",
            f'--gin_bindings=evaluate.environment_name="{args.env}"',
            f"--gin_bindings=evaluate.suite_load_fn={gym}",
            f"--gin_bindings=evaluate.eval_interval={args.eval_interval}",
            f"--gin_bindings=evaluate.eval_episodes={args.eval_episodes}",
        ]
    return jobs


def start(jobs: dict[str, list[str]], logs: str) -> dict[str, subprocess.Popen]:
    """Starts each job in a session of its own (so that ending it ends its children), its output in a log file."""
    env = dict(os.environ, TFREPLAY_REVERB_HOST="127.0.0.1", TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    procs = {}
    for name, argv in jobs.items():
        with open(os.path.join(logs, f"{name}.log"), "wb") as log:
            command = [sys.executable, "-c", BOOT, *argv]
            procs[name] = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
    return procs


def signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass  # the job and its children are gone already


def stop(procs: dict[str, subprocess.Popen]) -> None:
    """Ends every job and its children: SIGTERM to each process group, SIGKILL after 10 seconds to what is left."""
    for proc in procs.values():
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in procs.values():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        signal_group(proc, signal.SIGKILL)
        proc.wait()


def scalars(directory: str) -> dict[str, list[tuple[int, float, float]]]:
    """The scalar summaries written so far in one directory (not its subdirectories): tag -> [(step, value, time)]."""
    import tensorflow as tf

    found: dict[str, list[tuple[int, float, float]]] = {}
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                for value in event.summary.value:
                    number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                    found.setdefault(value.tag, []).append((int(event.step), number, event.wall_time))
        except tf.errors.DataLossError:
            pass  # the writer's last record is still being written
    return found


def tagged(found: dict[str, list[tuple[int, float, float]]], name: str) -> list[tuple[int, float, float]]:
    return next((points for tag, points in found.items() if tag.endswith("/" + name)), [])


def policy_steps(log: str) -> list[int]:
    """The distinct train steps of the weights the collect job acted with, in order."""
    with open(log, errors="replace") as f:
        steps = [int(m.group(1)) for m in POLICY_STEP.finditer(f.read())]
    return [s for i, s in enumerate(steps) if i == 0 or s != steps[i - 1]]


def tail(path: str, lines: int = 40) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def train_rate(log: str) -> str:
    """The train job's last `Step: N, R steps/sec` line (its learner logs one every 1000 steps), as `R`."""
    with open(log, errors="replace") as f:
        rates = re.findall(r"Step: \d+, ([\d.]+) steps/sec", f.read())
    return f", {float(rates[-1]):.1f} steps/s" if rates else ""


def points(values: list[tuple[int, float, float]], started: float) -> str:
    return ", ".join(f"{step}: {value:.0f} ({when - started:.0f} s)" for step, value, when in values)


def report(root: str, logs: str, started: float, args: argparse.Namespace) -> float:
    """Prints the figures so far; returns the collect job's latest average return (-inf: none yet)."""
    collect = scalars(os.path.join(root, "train", "0"))
    episodes = {step: value for step, value, _ in tagged(collect, "NumberOfEpisodes")}
    # A return counts once the collect policy's own last 10 episodes are all in it (the random ones are not).
    returns = [p for p in tagged(collect, "AverageReturn") if episodes.get(p[0], 0) >= 10]
    env_steps = tagged(collect, "EnvironmentSteps")
    seen = policy_steps(os.path.join(logs, "collect.log"))
    learner = [p[0] for found in scalars(os.path.join(root, "train")).values() for p in found]
    print(f"reverb-sac: {time.time() - started:.0f} s", flush=True)
    print(f"  collect return (its last 10 episodes) by train step: {points(returns, started)}")
    if env_steps:
        print(f"  env steps (collect): {env_steps[-1][1] + args.initial_steps:.0f} ({args.initial_steps} random first)")
    print(f"  train steps: {max(learner, default=0)}{train_rate(os.path.join(logs, 'train.log'))}")
    if seen:
        shown = seen if len(seen) <= 12 else [*seen[:6], "...", *seen[-5:]]
        print(f"  collect policy pulled at {len(seen)} train steps: {', '.join(map(str, shown))}")
    if args.eval:
        evals = tagged(scalars(os.path.join(root, "train", "eval", "0")), "AverageReturn")
        print(f"  eval return (greedy, {args.eval_episodes} episodes) by train step: {points(evals, started)}")
    sys.stdout.flush()
    return returns[-1][1] if returns else float("-inf")


def run(args: argparse.Namespace) -> int:
    work = tempfile.mkdtemp(prefix="reverb-sac-")
    root, logs = os.path.join(work, "root"), os.path.join(work, "logs")
    os.makedirs(logs)
    started, last, ok = time.time(), 0.0, False
    procs = start(job_args(args, root, free_port()), logs)
    try:
        while True:
            time.sleep(5)
            seconds = time.time() - started
            ended = {name: p.returncode for name, p in procs.items() if p.poll() is not None}
            if seconds - last >= args.report_every or ended or seconds > args.max_seconds:
                last = seconds
                value = report(root, logs, started, args)
                if value > args.target:
                    ok = True
                    print(f"reverb-sac: average return {value:.1f} above {args.target} in {seconds:.0f} s")
                    return 0
                if ended or seconds > args.max_seconds:
                    why = f"jobs ended: {ended}" if ended else f"{args.max_seconds:g} s passed"
                    print(f"reverb-sac: the return stayed below {args.target} ({why})")
                    return 1
    except KeyboardInterrupt:
        print("reverb-sac: interrupted")
        return 1
    finally:
        stop(procs)
        if not ok:
            for name in procs:
                print(f"----- {name} log (last lines; all in {logs}) -----\n{tail(os.path.join(logs, name + '.log'))}")
        elif args.keep:
            print(f"reverb-sac: root directory and logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def interrupted(signum: int, frame: object) -> None:
    """SIGTERM ends the run as Ctrl-C does: through `run`'s cleanup."""
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tfa_src", nargs="?", default=os.environ.get("TFA_SRC"), help="TF-Agents checkout ($TFA_SRC)")
    parser.add_argument("--target", type=float, default=-400.0)
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--train-steps", type=int, default=40000, help="the train and collect jobs stop there")
    parser.add_argument("--initial-steps", type=int, default=1000, help="random steps before sampling starts")
    parser.add_argument("--capacity", type=int, default=100000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--samples-per-insert",
        type=int,
        default=None,
        help="the server's rate limiter: items sampled per item inserted (default: the batch size, one env step "
        "per train step as in SAC's own loop; 0: no limit, the collect job runs ahead)",
    )
    parser.add_argument("--iterations-per-call", type=int, default=50, help="train steps between weight pushes")
    parser.add_argument("--eval", action="store_true", help="run the example's eval job too (greedy policy)")
    parser.add_argument("--eval-interval", type=int, default=1000)
    parser.add_argument("--eval-episodes", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=1800.0)
    parser.add_argument("--report-every", type=float, default=60.0)
    parser.add_argument("--keep", action="store_true", help="keep the root directory and logs after a success")
    args = parser.parse_args()
    script = Path(args.tfa_src or "", EXAMPLES, "sac/sac_train.py")
    if not args.tfa_src or not script.is_file():
        raise SystemExit(
            f"reverb-sac: no TF-Agents source checkout at {args.tfa_src!r} (the distributed SAC example is not in "
            f"the wheel); get one with `{CLONE}` and pass its path (TFA_SRC=... or the first argument)."
        )
    signal.signal(signal.SIGTERM, interrupted)
    sys.exit(run(args))


if __name__ == "__main__":
    main()
