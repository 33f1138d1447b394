"""`.ci/lanes.py`: each lane's time and the slowest tests, read back from a CI log."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("ci_lanes", ROOT / ".ci" / "lanes.py")
lanes = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(lanes)

LOG = """\
::lane test
........ [100%]
============================= slowest 20 durations =============================
12.50s call     tests/library/test_fused.py::test_a[tf]
0.40s setup    tests/library/test_contract.py::test_b[py-uniform-eager]
800 passed in 600.00s (0:10:00)
::lane test done in 780 s
::lane test-compat
============================= slowest 20 durations =============================
30.10s call     tests/rl/test_agents.py::test_c
::lane test-compat done in 1700 s
"""


def test_the_log_gives_each_lanes_time_and_every_duration_with_its_lane():
    seconds, durations = lanes.parse(LOG.splitlines(keepends=True))
    assert seconds == {"test": 780, "test-compat": 1700}
    assert durations == [
        (12.5, "call", "tests/library/test_fused.py::test_a[tf]", "test"),
        (0.4, "setup", "tests/library/test_contract.py::test_b[py-uniform-eager]", "test"),
        (30.1, "call", "tests/rl/test_agents.py::test_c", "test-compat"),
    ]


def test_a_log_that_ends_with_its_own_report_is_read_as_before_it():
    first = lanes.parse(LOG.splitlines())
    report = lanes.report(*first, most=2)
    assert report.startswith("| lane | wall")
    assert lanes.parse((LOG + report + "\n").splitlines()) == first


def test_the_report_flags_what_is_over_budget_and_lists_the_slowest_first():
    report = lanes.report(*lanes.parse(LOG.splitlines()), most=2)
    assert "| test | 13:00 | 31% | OVER 12 min |" in report
    assert "| test-compat | 28:20 | 69% |  |" in report
    assert "| **all** | 41:20 | 100% | OVER 40 min |" in report
    slowest = report.split("slowest tests")[1].splitlines()[2:]
    assert [line.split()[0] for line in slowest] == ["30.10s", "12.50s"]


def test_it_runs_as_a_script_on_a_log_file(tmp_path):
    log = tmp_path / "ci.log"
    log.write_text(LOG.replace("780", "700"))
    out = subprocess.run([sys.executable, str(ROOT / ".ci" / "lanes.py"), str(log)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "| test | 11:40 | 29% | ok |" in out.stdout
