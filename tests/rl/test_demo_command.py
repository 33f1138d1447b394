"""The demo's command line: `--help` and a bad argument answer before TensorFlow loads (no start-up lines, no
wait), and only a run imports it."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Starts the demo as `python -m tfreplay.rl.demo` (runpy) or as the `tfreplay-demo` script (`run`) with the given
# arguments, and reports how it exited and whether TensorFlow was imported by then.
PROBE = """
import json, runpy, sys
how, args = sys.argv[1], sys.argv[2:]
sys.argv = ["tfreplay-demo", *args]
try:
    if how == "module":
        runpy.run_module("tfreplay.rl.demo", run_name="__main__", alter_sys=True)
    else:
        from tfreplay.rl.demo import run
        run()
    code = "returned"
except SystemExit as stop:
    code = stop.code
print(json.dumps([code, "tensorflow" in sys.modules]))
"""


def start(how: str, *args: str) -> tuple[object, bool, subprocess.CompletedProcess]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, how, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    code, imported = json.loads(done.stdout.splitlines()[-1])
    return code, imported, done


@pytest.mark.parametrize("how", ["module", "script"])
def test_the_demo_help_exits_0_without_importing_tensorflow(how):
    code, imported, done = start(how, "--help")
    assert code == 0 and not imported
    assert "--steps: Total environment steps" in done.stdout
    assert done.stderr == ""  # none of TensorFlow's start-up lines


def test_a_bad_demo_argument_is_refused_without_importing_tensorflow():
    code, imported, done = start("module", "--steps=many")
    assert code == 1 and not imported
    assert "--steps" in done.stderr and "many" in done.stderr
