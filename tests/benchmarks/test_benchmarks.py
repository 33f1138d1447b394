"""The benchmarks run: their serialized graph loop, the interleaved rounds' order and statistics (on a fake clock),
the report over both kinds of JSON, and, on tiny sizes in subprocesses, a few cases of each timed file, the same
interleaved, and the GPU script's CPU-only mode."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import charts, common, gpu, interleave, report

ROOT = pathlib.Path(__file__).resolve().parents[2]
CALLS = 300
# A few cases of every benchmark file, each at least once with its fixtures (built at TFREPLAY_BENCH_TINY sizes);
# the learner's file runs in the interleaved test below.
SELECTED = (
    "(test_buffers and cartpole and (numpy or Py or in-graph or AUTOTUNE))"
    " or (test_prioritized and numpy and uniform)"
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


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_interleaved_order_puts_every_case_in_every_place_and_each_pair_both_ways(count):
    turns = [interleave.order(count, r) for r in range(2 * count)]
    assert all(sorted(turn) == list(range(count)) for turn in turns)
    for place in range(count):
        assert sorted(turn[place] for turn in turns) == sorted(2 * list(range(count)))
    before = [(a, b) for turn in turns for a, b in zip(turn, turn[1:])]
    assert all(before.count((a, b)) == before.count((b, a)) for a, b in before)


def test_interleaved_rounds_time_a_groups_cases_together_and_every_case_once():
    groups = ["a", "b", "a", "c", "b", "a"]
    for r in range(6):
        turn = interleave.schedule(groups, r)
        assert sorted(turn) == list(range(len(groups)))
        runs = [g for i, g in enumerate(groups[j] for j in turn) if i == 0 or g != groups[turn[i - 1]]]
        assert sorted(runs) == ["a", "b", "c"]  # each group one run of its cases
    assert len({tuple(interleave.schedule(groups, r)) for r in range(6)}) == 6


class FakeClock:
    """Time that moves only when a case runs: a case costs its own seconds times the round's load."""

    def __init__(self, loads):
        self.now, self.loads, self.round = 0.0, loads, 0

    def __call__(self):
        return self.now

    def case(self, seconds):
        def fn():
            self.now += seconds * self.loads[self.round]

        return fn

    def next_round(self, _message):
        self.round += 1


def test_interleaved_ratios_are_taken_within_each_round():
    clock = FakeClock(loads=[1.0, 3.0, 2.0])  # the machine's load moves between rounds
    cases = [
        interleave.Case("g", "base", clock.case(1e-6), role="baseline", items=10, calls=4),
        interleave.Case("g", "twice", clock.case(2e-6), calls=2),
        interleave.Case("g", "loop", clock.case(5e-6), ops=10, calls=3),  # 0.5 µs per operation
    ]
    result = interleave.run(cases, rounds=3, clock=clock, progress=clock.next_round)
    seconds = {c["case"]: c["seconds"] for c in result["cases"]}
    assert seconds["base"] == pytest.approx([1e-6, 3e-6, 2e-6])
    assert seconds["loop"] == pytest.approx([0.5e-6, 1.5e-6, 1e-6])
    assert len(result["loads"]) == 4 and result["rounds"] == 3
    # Each case spreads 3x over the rounds; its ratio to the baseline, taken per round, does not move.
    twice = interleave.ratio(result["cases"][1], result["cases"][0])
    assert (twice.median, twice.low, twice.high) == pytest.approx((2.0, 2.0, 2.0))
    assert not twice.parity
    text = interleave.table(result, "g")
    assert "| base (baseline) | 2.00 (1.00-3.00) | 5.00M | 1.00x |" in text
    assert "| twice | 4.00 (2.00-6.00) | - | 2.00x (2.00-2.00) |" in text
    assert "| loop | 1.00 (0.50-1.50) | - | 0.50x (0.50-0.50) |" in text


def test_a_ratio_whose_spread_holds_one_is_parity():
    base = {"group": "g", "case": "base", "role": "baseline", "seconds": [1.0, 1.0, 1.0, 1.0, 1.0]}
    near = {"group": "g", "case": "near", "seconds": [0.9, 1.02, 0.95, 1.1, 0.97]}
    apart = {"group": "g", "case": "apart", "seconds": [1.05, 1.2, 1.1, 1.3, 1.15]}
    assert interleave.ratio(near, base).parity and not interleave.ratio(apart, base).parity
    text = interleave.table({"cases": [base, near, apart]}, "g")
    assert "| near | " in text and "0.97x (0.90-1.10) parity |" in text
    assert "1.15x (1.05-1.30) |" in text and "1.30) parity" not in text
    with pytest.raises(ValueError, match="at least one round"):
        interleave.Spread.of([])


def test_interleaved_cases_set_beside_another_group_and_the_report_prints_them(tmp_path, capsys):
    def case(group, name, seconds, **extra):
        return {"group": group, "case": name, "ops": 1, "calls": 1, "seconds": seconds, **extra}

    result = {
        "rounds": 2,
        "seconds": 0.25,
        "loads": [1.25, 2.5, 1.75],
        "about": "`test_x.py`, 2026-12-02",
        "cases": [
            case("u", "floor", [1.0, 2.0], role="floor"),
            case("u", "K=16", [2.0, 4.0]),
            case("p", "floor", [1.0, 2.0], role="floor"),
            case("p", "K=16", [3.0, 4.0], versus=["u", "K=16"]),
        ],
    }
    path = tmp_path / "interleaved.json"
    path.write_text(json.dumps({"runs": [result]}))
    report.main([str(path)])
    text = capsys.readouterr().out
    assert text.startswith("`test_x.py`, 2026-12-02; 2 interleaved rounds of about 0.25 s per case; ")
    assert "1-minute load average 1.2 at the start, 2.5 at most" in text
    assert "| case | µs/op | items/s | x base | x u |" in text
    assert "| K=16 | 3,500,000 (3,000,000-4,000,000) | - | 2.50x (2.00-3.00) | 1.25x (1.00-1.50) parity |" in text


def _case(group: str, name: str, seconds: list, **extra) -> dict:
    """One case of an interleaved run's result, as `interleave.run` records it."""
    return {"group": group, "case": name, "ops": 1, "calls": 1, "seconds": seconds, **extra}


def _interleaved(about: str, cases: list, loads: tuple = (0.5, 0.75)) -> dict:
    return {"rounds": len(cases[0]["seconds"]), "seconds": 0.25, "loads": list(loads), "about": about, "cases": cases}


def test_charts_draw_each_group_against_its_reference_with_the_runs_line(tmp_path):
    pytest.importorskip("matplotlib")
    case = _case
    result = _interleaved(
        "`test_x.py`, 2026-12-03; 2 CPUs",
        [
            case("learner", "K=16", [1.1, 1.3, 1.2]),
            case("learner", "floor", [1.0, 1.0, 1.0], role="floor"),
            case("learner", "K=64", [0.9, 1.1, 1.0]),
            case("other", "only", [1.0, 1.0, 1.0]),
            case("prio", "floor", [1.0, 1.0, 1.0], role="floor"),
            case("prio", "K=16", [2.2, 2.6, 3.6], versus=["learner", "K=16"]),
        ],
    )
    rows = {r["case"]: r for r in charts.bars(result, "learner")}
    assert rows["floor"]["reference"] and not rows["floor"]["parity"]
    assert (rows["K=16"]["median"], rows["K=16"]["low"], rows["K=16"]["high"]) == pytest.approx((1.2, 1.1, 1.3))
    assert not rows["K=16"]["parity"] and rows["K=64"]["parity"]  # 0.9-1.1 holds 1.0
    assert charts.caption(result).startswith("`test_x.py`, 2026-12-03; 2 CPUs; 3 interleaved rounds")
    with pytest.raises(ValueError, match=r"charts: group 'other' has no baseline or floor case"):
        charts.bars(result, "other")
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"runs": [result]}))
    (over,) = charts.bars(result, "prio", versus=True)  # K=16 over the learner's K=16, round by round
    assert (over["median"], over["low"], over["high"], over["parity"]) == pytest.approx((2.0, 2.0, 3.0, False))
    written = charts.main([str(path), "--out", str(tmp_path / "png"), "--groups", "learner", "prio"])
    assert [p.name for p in written] == ["run-learner.png", "run-prio.png", "run-prio-versus.png"]
    assert written[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_chart_sets_every_group_beside_its_baseline_its_versus_case_or_a_peer(tmp_path):
    pytest.importorskip("matplotlib")
    case = _case
    result = _interleaved(
        "`test_peers.py`, 2026-12-03",
        [
            case("peers add Py", "NumPy", [1.0, 1.0], role="baseline"),
            case("peers add Py", "tfreplay", [2.0, 4.0], versus=["peers add Py", "TF-Agents"]),
            case("peers add Py", "TF-Agents", [200.0, 400.0]),
            case("peers add Py", "cpprb", [1.0, 2.0]),
            case("peers dataset", "NumPy", [1.0, 1.0], role="baseline"),
            case("peers dataset", "tfreplay TF", [3.0, 3.0]),
            case("peers dataset", "tfreplay Py", [5.0, 5.0]),
            case("peers dataset", "reverb", [10.0, 20.0]),
        ],
    )
    baselines = {r["case"]: r["median"] for r in charts.every_group(result)}
    assert baselines == {
        "peers add Py: tfreplay": 3.0,
        "peers add Py: TF-Agents": 300.0,
        "peers add Py: cpprb": 1.5,
        "peers dataset: tfreplay TF": 3.0,
        "peers dataset: tfreplay Py": 5.0,
        "peers dataset: reverb": 15.0,
    }
    (versus,) = charts.every_group(result, versus=True)
    assert versus["case"] == "peers add Py: tfreplay" and versus["median"] == pytest.approx(0.01)
    beside = {r["case"]: (r["low"], r["high"]) for r in charts.every_group(result, beside=["cpprb", "reverb"])}
    assert beside == {"peers add Py: tfreplay / cpprb": (2.0, 2.0), "peers dataset: tfreplay Py / reverb": (0.25, 0.5)}
    path = tmp_path / "peers.json"
    path.write_text(json.dumps({"runs": [result]}))
    out = str(tmp_path / "png")
    (written,) = charts.main([str(path), "--out", out, "--one-chart", "beside peers", "--beside", "cpprb", "reverb"])
    assert written.name == "peers.png" and written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=r"charts: nothing to draw for 'none' \(no group or case matches\)"):
        charts.main([str(path), "--out", out, "--one-chart", "none", "--beside", "nobody"])


def test_interleaved_run_refuses_no_rounds_and_two_cases_of_one_name():
    case = interleave.Case("g", "c", lambda: None, calls=1)
    with pytest.raises(ValueError, match=r"run: rounds \(0\) must be at least 1"):
        interleave.run([case], rounds=0)
    with pytest.raises(ValueError, match=r"unique by \(group, name\); repeated: \[\('g', 'c'\)\]"):
        interleave.run([case, interleave.Case("g", "c", lambda: None, calls=1)], rounds=1)


class FakeBenchmark:
    """pytest-benchmark's fixture as `measure` sees it under --interleaved (turned off, a collector beside it)."""

    disabled = True

    def __init__(self):
        self.interleaved, self.cases, self.group, self.extra_info = self, [], None, {}
        self.called = 0

    def add(self, case):
        self.cases.append(case)

    def __call__(self, fn):
        self.called += 1


def test_measure_hands_its_case_to_the_interleaved_rounds_warmed_up():
    calls, bench = [], FakeBenchmark()
    loop = common.GraphLoop(lambda: tf.constant(1), calls=3)
    common.measure(bench, lambda: calls.append(1), group="g", case="c", items=5, role="baseline")
    common.measure(bench, loop, group="g", case="loop", versus="c")
    common.measure(bench, lambda: None, group="h", case="cold", ops=7, setup=lambda: None)
    assert len(calls) == 2 and bench.called == 3  # warmed up twice; the fixture counts as used, nothing timed
    first, second, cold = bench.cases
    assert (first.group, first.name, first.items, first.role, first.calls) == ("g", "c", 5, "baseline", 0)
    assert (second.ops, second.versus) == (3, ("g", "c"))
    assert (cold.ops, cold.calls, cold.setup is not None) == (7, 1, True)  # one call a round, after its setup


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
    assert {"test_buffers.py", "test_prioritized.py", "test_windows.py", "test_frames.py", "test_memmap.py"} <= files
    assert all(b["group"] and b["extra_info"]["case"] for b in benchmarks)
    text = report.render(json.loads(out.read_text()))
    assert "**cartpole get_next**" in text and "**memmap" in text


@pytest.mark.slow  # about 40 s: a subprocess importing TensorFlow, building two learners and the memmap buffers
def test_the_benchmark_files_run_interleaved_and_the_report_reads_their_json(tmp_path):
    pytest.importorskip("pytest_benchmark")
    out = tmp_path / "interleaved.json"
    done = _run(
        [
            *("-m", "pytest", "-c", str(ROOT / "benchmarks/pytest.ini"), "--rootdir", str(ROOT / "benchmarks")),
            *("-q", "-k", "(test_memmap and hot and 32) or (test_learner and dqn and (floor or K4) and not xla)"),
            *("--interleaved=2", "--interleaved-seconds=0", f"--interleaved-json={out}"),
            *(str(ROOT / "benchmarks/test_learner.py"), str(ROOT / "benchmarks/test_memmap.py")),
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["about"].split(",")[0] for r in runs] == ["`test_learner.py`", "`test_memmap.py`"]
    assert all(len(case["seconds"]) == 2 for r in runs for case in r["cases"])
    text = "\n\n".join(interleave.render(r) for r in runs)
    assert "| case | µs/op | items/s | x base | x learner dqn |" in text
    assert "**memmap hot prioritized get_next(32)**" in text and "| memmap | " in text


@pytest.mark.slow
@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="checks the CPU-only mode")
def test_the_gpu_script_runs_without_a_gpu_with_its_flag(gpu_script):
    with pytest.raises(SystemExit, match="pass --cpu-only"):
        gpu.main([])
    stdout, stderr = gpu_script.communicate(timeout=300)
    assert gpu_script.returncode == 0, stdout[-4000:] + stderr[-4000:]
    rows = [line for line in stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 9  # the header, then every case on both sides
    assert sum("TF floor" in row for row in rows) == 2  # beside each workload's add
    assert "The default TrainLoop compiled with XLA: CPU True, CPU:0 (--cpu-only) True." in stdout


@pytest.mark.slow  # about 25 s: two subprocesses importing TensorFlow, each a short demo run
def test_the_demo_modes_script_times_both_modes_on_the_same_env_steps():
    pytest.importorskip("gymnasium")
    done = _run(["-m", "benchmarks.demo_modes", "1", "1100"], ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "1 interleaved rounds of 1,100 env steps" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| sequential |", "| concurrent |"))]
    assert [row.split(" | ")[0] for row in rows] == ["| sequential", "| concurrent"]
    assert rows[0].endswith("| 1.00x |") and re.search(r"\| \d\.\d\dx \(\d\.\d\d-\d\.\d\d\)( parity)? \|$", rows[1])


@pytest.mark.slow  # about 25 s: two subprocesses importing TensorFlow, each building the demo's run
def test_the_cores_script_times_the_learner_and_collector_under_both_thread_settings():
    pytest.importorskip("gymnasium")
    done = _run(["-m", "benchmarks.cores", "1", "2"], ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| default |", "| 1 thread |"))]
    assert len(rows) == 2 and all(len(row.split(" | ")) == 6 for row in rows)
    bounds = re.findall(r"\| (\d+\.\d\d)x \|$", done.stdout, re.M)
    assert len(bounds) == 3 and bounds[0] == "1.00" and all(0 < float(b) <= 1.0 for b in bounds[1:])
