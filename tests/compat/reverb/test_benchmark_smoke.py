"""`python -m benchmarks.reverb_service --quick` runs end to end: a server process per library, writer and sampler
processes, every case measured, the table printed and the JSON written; each process stopped cleanly. Shim only where
dm-reverb does not import (both where it does: the compatibility venv). Its figures mean nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from processes import ENV, ROOT

CASES = ["insert x1", "insert x2", "sample", "train"]


@pytest.mark.slow
def test_quick_run_measures_every_case_and_ends_its_processes(tmp_path):
    out = tmp_path / "reverb_service.json"
    command = [sys.executable, "-m", "benchmarks.reverb_service", "--quick", "--rounds", "1", "--writers", "1,2"]
    run = subprocess.run([*command, "--out", str(out)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    libs = report["libs"]
    assert libs[0] == "shim" and set(libs) <= {"shim", "reverb"}
    (figures,) = report["rounds"]
    assert sorted(figures) == sorted(f"{kind} {case}" for kind in ("small", "atari") for case in CASES)
    for case, values in figures.items():
        assert all(values[lib] > 0 for lib in libs), (case, values)
    assert figures["small train"]["floor"] > 0
    assert report["exitcodes"] == [0] * (len(libs) + 2)
    assert "| small insert x1 | items/s |" in run.stdout
    if libs == ["shim"]:
        assert "dm-reverb is not measured" in run.stdout
    else:
        assert "| shim / reverb |" in run.stdout
