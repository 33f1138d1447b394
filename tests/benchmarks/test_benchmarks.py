"""The benchmarks run: their serialized graph loop, the report over pytest-benchmark's JSON, and, on tiny sizes
in subprocesses, a few cases of each timed file and the GPU script's CPU-only mode."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import common, gpu, report

ROOT = pathlib.Path(__file__).resolve().parents[2]
CALLS = 300
# A few cases of every benchmark file, each at least once with its fixtures (built at TFREPLAY_BENCH_TINY sizes).
SELECTED = (
    "(test_buffers and cartpole and (numpy or Py or in-graph or AUTOTUNE))"
    " or (test_learner and dqn and not prioritized and (floor or K4) and not xla)"
    " or (test_prioritized and in_graph and compiled)"
    " or (test_windows and 400 and strict)"
    " or (test_frames and get_next and not num_steps)"
    " or (test_memmap and get_next and 32)"
    " or (test_peers and cartpole and get_next_tf and in-graph and tfreplay)"
)


def _counting_step():
    """A step whose increment is a read then a write (not atomic), recording what each call read, in call order."""
    counter = tf.Variable(0, dtype=tf.int64)
    calls = tf.Variable(0, dtype=tf.int64)  # atomic: how many calls ran, whatever their order
    seen = tf.Variable(tf.fill([CALLS], tf.constant(-1, tf.int64)))

    def step() -> tf.Tensor:
        value = counter.read_value()
        order = calls.assign_add(1) - 1
        record = seen.scatter_nd_update(tf.reshape(tf.minimum(order, CALLS - 1), [1, 1]), tf.reshape(value, [1]))
        with tf.control_dependencies([record]):
            return counter.assign(value + 1)

    return step, counter, calls, seen


def test_serialized_loop_runs_each_call_after_the_previous_one():
    step, counter, calls, seen = _counting_step()
    last = tf.function(lambda count: common.repeat(step, count))(tf.constant(CALLS))
    assert calls.numpy() == CALLS
    # Each call read what the previous one wrote: no read overtook a write, no increment was lost.
    np.testing.assert_array_equal(seen.numpy(), np.arange(CALLS))
    assert counter.numpy() == CALLS and last.numpy() == CALLS


def test_graph_loop_runs_the_step_calls_times_per_call():
    step, _, calls, _ = _counting_step()
    loop = common.GraphLoop(step, calls=7)
    loop(), loop()
    assert loop.ops == 7 and calls.numpy() == 14


def _bench(group, case, median, ops=1, role=None, items=None):
    info = {"case": case, "ops": ops, **({"role": role} if role else {}), **({"items": items} if items else {})}
    return {"group": group, "name": case, "stats": {"median": median, "iqr": median / 10}, "extra_info": info}


def test_report_gives_each_case_per_operation_against_its_groups_baseline():
    data = {
        "datetime": "2026-12-01T00:00:00",
        "machine_info": {"cpu_count": 2, "tensorflow": "2.21.0"},
        "benchmarks": [
            _bench("g", "NumPy", 2e-6, role="baseline", items=10),
            _bench("g", "TF in-graph", 2e-3, ops=200, items=10),  # 10 µs per call
            _bench("g", "floor: call", 4e-6, role="floor"),
            _bench("h", "only floor", 1e-6, role="floor"),
            _bench("h", "other", 3e-6),
        ],
    }
    text = report.render(data)
    assert "**g**" in text and "**h**" in text
    assert "| NumPy (baseline) | 2.00 | 5.00M | ±5% | 1.00x |" in text
    assert "| TF in-graph | 10.0 | 1.00M | ±5% | 5.00x |" in text
    assert "| floor: call (floor) | 4.00 | - | ±5% | 2.00x |" in text
    assert "| other | 3.00 | - | ±5% | 3.00x |" in text  # without a baseline: against the group's floor


def _start(args, cwd):
    # Not an xdist worker's variables: pytest-benchmark turns itself off in a session that looks like one.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(TFREPLAY_BENCH_TINY="1", PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _run(args, cwd, timeout=300):
    process = _start(args, cwd)
    stdout, stderr = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def gpu_script():
    """`benchmarks.gpu --cpu-only --tiny`, started by the first test asking for it, so that it runs beside the
    benchmark files' own subprocess."""
    pytest.importorskip("pytest_benchmark")  # `make bench`'s runner: the test extra installs it
    process = _start(["-m", "benchmarks.gpu", "--cpu-only", "--tiny", "--seconds", "0", "--blocks", "1"], ROOT)
    yield process
    process.kill()
    process.communicate()


@pytest.mark.slow  # about a minute: two subprocesses importing TensorFlow and tracing every kind of case
def test_the_benchmark_files_run_on_tiny_sizes_and_the_report_reads_their_json(tmp_path, gpu_script):
    pytest.importorskip("pytest_benchmark")
    out = tmp_path / "bench.json"
    done = _run(
        [
            *("-m", "pytest", "-c", str(ROOT / "benchmarks/pytest.ini"), "--rootdir", str(ROOT / "benchmarks")),
            *("-q", "-k", SELECTED, "--benchmark-json", str(out)),
            *("--benchmark-max-time=0", "--benchmark-min-rounds=1", "--benchmark-storage", str(tmp_path)),
            str(ROOT / "benchmarks"),
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    benchmarks = json.loads(out.read_text())["benchmarks"]
    files = {b["fullname"].split("::")[0].split("/")[-1] for b in benchmarks}
    assert {"test_buffers.py", "test_learner.py", "test_prioritized.py", "test_windows.py"} <= files
    assert {"test_frames.py", "test_memmap.py"} <= files
    assert all(b["group"] and b["extra_info"]["case"] for b in benchmarks)
    text = report.render(json.loads(out.read_text()))
    assert "**cartpole get_next**" in text and "**learner dqn**" in text


@pytest.mark.slow
@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="checks the CPU-only mode")
def test_the_gpu_script_runs_without_a_gpu_with_its_flag(gpu_script):
    with pytest.raises(SystemExit, match="pass --cpu-only"):
        gpu.main([])
    stdout, stderr = gpu_script.communicate(timeout=300)
    assert gpu_script.returncode == 0, stdout[-4000:] + stderr[-4000:]
    rows = [line for line in stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 7  # the header, then every case on both sides
    assert any("TrainLoop" in row and "XLA" in row for row in rows)
