"""Fixtures of the benchmark files: full buffers of each workload, their NumPy baseline, the serialized graph loop.

Run with `pytest -c benchmarks/pytest.ini benchmarks` (`make bench`): the main
suite's `pytest tests` does not collect this folder.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from typing import Any, Dict

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfreplay  # noqa: E402
from benchmarks.common import TINY, WORKLOADS, GraphLoop, NumpyRing, Workload, fill_in_graph  # noqa: E402


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
