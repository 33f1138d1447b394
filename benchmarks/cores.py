"""How the demo's learner and collector use the CPU's cores: `python -m benchmarks.cores [ROUNDS] [CALLS]`.

The demo's training is one learner call (`TrainLoop`, 16 updates) per collect
call (the driver's 16 env steps, one vector step). For each of two TensorFlow
thread settings, TensorFlow's default and one inter-op and one intra-op
thread, a fresh process builds the demo's run (its default config, the buffer
filled by random steps) and times, in interleaved rounds (cases inside, rounds
outside, medians and the spread across rounds):

* the learner call alone, and its CPU use (process CPU seconds over wall
  seconds: 1.0 is one core busy);
* the learner call while another process keeps one core busy (a Python loop);
* the collect call alone, and its CPU use.

The last table turns the medians into what collecting and learning at once
can save: the sequential loop pays learner + collector per vector step. With
each side on a core of its own, a concurrent loop pays the longer of the two,
the learner on one thread; it can never beat the learner alone. Where the
learner alone keeps both cores busy, as TensorFlow's default lets it, the
second core has little left to give.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

from benchmarks import interleave

SETTINGS = {"default": {}, "1 thread": {"TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1"}}
CASES = ("learner", "learner, a core busy", "collector")
_BUSY = "while True: pass"


def _timed(call: Callable[[], Any], calls: int) -> tuple[float, float]:
    """(ms per call, cores used) over `calls` calls."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall / calls * 1e3, cpu / wall


def one_setting(rounds: int, calls: int) -> Dict[str, List[List[float]]]:
    """This process's rounds: `case -> [[ms, cores], ...]`, one pair per round."""
    from tfreplay.rl import demo  # sets TensorFlow's log level and TF_USE_LEGACY_KERAS as the demo does
    from tfreplay.rl.training import _Run

    demo.FLAGS(["demo", "--noearly_stop", "--noconcurrent"])
    run = _Run(demo.config_from_flags())
    run.driver.add_observer(run.buffer.add_batch)  # a collect call: the vector step and its add, as taking turns pays
    while int(run.env_steps.numpy()) < run.config.initial_collect_steps:
        run.env_steps.assign_add(run.driver.run())
    learn = lambda: float(run._train_loop().loss)  # noqa: E731  (read back: the call is done)
    collect = run.driver.run
    for _ in range(3):  # traced, compiled and warm
        learn(), collect()
    out: Dict[str, List[List[float]]] = {case: [] for case in CASES}
    for index in range(rounds):
        for case in (CASES[i] for i in interleave.order(len(CASES), index)):
            busy = subprocess.Popen([sys.executable, "-c", _BUSY]) if "busy" in case else None
            try:
                if busy is not None:
                    time.sleep(0.2)  # the loop is running
                out[case].append(list(_timed(collect if case == "collector" else learn, calls)))
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
    return out


def _median(pairs: List[List[float]], i: int) -> float:
    return statistics.median(pair[i] for pair in pairs)


def main(rounds: int = 5, calls: int = 200) -> Dict[str, Any]:
    start_load = interleave.load()
    results: Dict[str, Any] = {}
    for name, env in SETTINGS.items():
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.cores", "--one", str(rounds), str(calls)],
            capture_output=True, text=True, check=False, env={**os.environ, **env},
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"benchmarks.cores: the {name} run failed:\n{done.stderr[-3000:]}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    loads = ", ".join("?" if load is None else f"{load:.1f}" for load in (start_load, interleave.load()))
    print(
        f"{rounds} interleaved rounds of {calls} calls per case, {os.cpu_count()} CPUs; load at the start, end: {loads}"
    )
    print("| TF threads | learner ms | learner cores | learner ms, a core busy | collector ms | collector cores |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        cells = [interleave.cell(interleave.Spread.of([ms for ms, _ in runs[case]])) for case in CASES]
        cores = [interleave.num(_median(runs[case], 1)) for case in ("learner", "collector")]
        print(f"| {name} | {cells[0]} | {cores[0]} | {cells[1]} | {cells[2]} | {cores[1]} |")
    default, single = results["default"], results["1 thread"]
    learner, collector = _median(default["learner"], 0), _median(default["collector"], 0)
    one_core = _median(single["learner"], 0)  # the learner with one thread: what it takes on a core of its own
    sequential = learner + collector
    rows = [
        ("sequential: learner + collector", sequential),
        ("concurrent, each side on a core of its own: the longer of learner (1 thread) and collector",
         max(one_core, collector)),
        ("concurrent, collection free: the learner alone", learner),
    ]  # fmt: skip
    print()
    print("| per vector step (16 env steps, 16 updates) | ms | over sequential |")
    print("|---|---:|---:|")
    for label, ms in rows:
        print(f"| {label} | {interleave.num(ms)} | {ms / sequential:.2f}x |")
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(one_setting(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        main(*(int(arg) for arg in sys.argv[1:3]))
