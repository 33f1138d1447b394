"""Fixtures of the benchmark files: full buffers of each workload, their NumPy baseline, the serialized graph loop.

Run with `pytest -c benchmarks/pytest.ini benchmarks` (`make bench`): the main
suite's `pytest tests` does not collect this folder. With `--interleaved=R`
(`make bench ROUNDS=R`) pytest-benchmark is turned off and each file's cases,
once all of them are set up, are timed in R interleaved rounds
(`benchmarks/interleave.py`), written to `--interleaved-json`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
from typing import Any, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfreplay  # noqa: E402
from benchmarks import interleave  # noqa: E402
from benchmarks.common import TINY, WORKLOADS, GraphLoop, NumpyRing, Workload, fill_in_graph  # noqa: E402

INTERLEAVED = "tfreplay-interleaved"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("interleaved", "interleaved rounds (benchmarks/interleave.py)")
    group.addoption("--interleaved", type=int, default=0, metavar="R", help="time each file's cases in R rounds")
    group.addoption(
        "--interleaved-seconds", type=float, default=0.25, metavar="S", help="seconds per case a round (0.25)"
    )
    group.addoption("--interleaved-json", default=".benchmarks/interleaved.json", help="where the figures go")


def pytest_configure(config: pytest.Config) -> None:
    # Before pytest-benchmark's own (trylast) configure reads the option: under --interleaved its fixture only
    # runs a case's call once, unmeasured.
    if config.getoption("interleaved") > 0:
        config.option.benchmark_disable = True
        config.pluginmanager.register(Interleaved(config), INTERLEAVED)


@pytest.fixture
def benchmark(request: pytest.FixtureRequest) -> Any:
    """pytest-benchmark's fixture; `.interleaved` is the rounds' collector under `--interleaved`, else None."""
    fixture = request.getfixturevalue("benchmark")  # the plugin's fixture of this name
    fixture.interleaved = request.config.pluginmanager.get_plugin(INTERLEAVED)
    return fixture


def _machine() -> str:
    """The date, the CPUs, the libraries and the commit (`(dirty)` with changes not committed) of a run."""
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "?")
    return (
        f"{datetime.date.today()}; {os.cpu_count()} CPUs ({model}), Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}, NumPy {np.__version__}; commit {_commit()}"
    )


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True).stdout
        changes = subprocess.run(["git", "status", "--porcelain", "-uno"], capture_output=True, text=True).stdout
    except OSError:
        return "?"
    return (head.strip() or "?") + (" (dirty)" if changes.strip() else "")


def _cpuinfo() -> List[str]:
    try:
        return pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


class Interleaved:
    """Gathers the cases `measure` hands over, and times a file's cases when its last test ends, before its
    fixtures are torn down (so every buffer a case uses is still there); writes every file's result to JSON."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.pending: List[interleave.Case] = []
        self.results: List[Dict[str, Any]] = []

    def add(self, case: interleave.Case) -> None:
        self.pending.append(case)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        if self.pending and getattr(nextitem, "module", None) is not getattr(item, "module", None):
            self.flush(item.path.name)
        yield

    def flush(self, name: str) -> None:
        cases, self.pending = self.pending, []
        option = self.config.getoption
        self.say(f"{name}: {len(cases)} cases, {option('interleaved')} interleaved rounds")
        result = interleave.run(
            cases, option("interleaved"), option("interleaved_seconds"), progress=lambda s: self.say(f"{name}: {s}")
        )
        result["about"] = f"`{name}`, {_machine()}"
        self.results.append(result)

    def say(self, line: str) -> None:
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        with capture.global_and_fixture_disabled():
            if terminal is not None:
                terminal.write_line(line)
            else:
                print(line, file=sys.stderr, flush=True)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.results:
            path = pathlib.Path(self.config.getoption("interleaved_json"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"runs": self.results}, indent=1))
            self.say(f"interleaved figures of {len(self.results)} file(s): {path} (python -m benchmarks.report {path})")


def pytest_benchmark_update_machine_info(config: Any, machine_info: Dict[str, Any]) -> None:
    """What every figure needs beside it: the libraries and how busy the machine was."""
    machine_info["tensorflow"] = tf.__version__
    machine_info["numpy"] = np.__version__
    machine_info["cpu_count"] = os.cpu_count()
    machine_info["load_average_1min"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    machine_info["tiny"] = TINY
    machine_info["platform"] = platform.platform()


@dataclasses.dataclass
class Subjects:
    """A workload's full TF and NumPy buffers, its baseline arrays and the batch they were filled with."""

    workload: Workload
    tf_buffer: Any
    py_buffer: Any
    numpy: NumpyRing
    batch: Dict[str, np.ndarray]
    tf_batch: Dict[str, tf.Tensor]


def make_subjects(w: Workload, seed: int = 0) -> Subjects:
    rng = np.random.default_rng(seed)
    batch = w.make_batch(rng)
    tf_batch = tf.nest.map_structure(tf.constant, batch)
    tf_buffer = tfreplay.TFUniformReplayBuffer(w.spec, w.batch_size, w.max_length, seed=seed)
    fill_in_graph(tf_buffer.add_batch, tf_batch, w.max_length)
    py_buffer = tfreplay.PyUniformReplayBuffer(w.spec, batch_size=w.batch_size, max_length=w.max_length, seed=seed)
    for _ in range(w.max_length):
        py_buffer.add_batch(batch)
    return Subjects(w, tf_buffer, py_buffer, NumpyRing(w, batch, w.window_rows(rng, 64)), batch, tf_batch)


@pytest.fixture(scope="module", params=sorted(WORKLOADS, reverse=True))
def subjects(request: pytest.FixtureRequest) -> Subjects:
    """Full buffers of the CartPole workload, then of the Atari one (564 MB each, built once per file)."""
    return make_subjects(WORKLOADS[request.param])


@pytest.fixture
def graph_loop() -> type:
    """`graph_loop(step, calls=200, jit_compile=False)`: calls of `step` in one `tf.function`'s while loop, each
    waiting on the previous call's outputs (`benchmarks.common.repeat`); time it with `measure`, per call."""
    return GraphLoop
