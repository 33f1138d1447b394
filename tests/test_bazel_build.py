"""BUILD covers the repository: every module in exactly one library target, every test file in its own py_test.

A BUILD file is Starlark, whose syntax here is Python's, so these tests run it
with stand-ins for Bazel's functions (glob evaluated over the source tree) and
need no Bazel; `make bazel-test` also runs them under Bazel.
"""

from __future__ import annotations

import collections
import pathlib
from typing import Any, Sequence

import pytest
from bazel_pytest import exit_status, pytest_args, without_editable_installs

ROOT = pathlib.Path(__file__).resolve().parents[1]  # resolved: under Bazel, the runfiles are links into the tree
LAUNCHER = "tests/bazel_pytest.py"


def _glob(include: Sequence[str], exclude: Sequence[str] = (), **_: Any) -> list[str]:
    """Bazel's glob: the files (not folders) under ROOT that match `include` and not `exclude`, sorted."""

    def files(patterns):
        # A trailing ** means every file below; pathlib (before 3.13) would match only the folders.
        patterns = [p + "/*" if p.endswith("**") else p for p in patterns]
        return {path.relative_to(ROOT).as_posix() for p in patterns for path in ROOT.glob(p) if path.is_file()}

    return sorted(files(include) - files(exclude))


def evaluate(build: str) -> dict[str, list[dict[str, Any]]]:
    """The rules a BUILD file declares, by kind: each call's attributes."""
    rules: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)

    def rule(kind: str):
        return lambda **attrs: rules[kind].append(attrs)

    names: dict[str, Any] = {"glob": _glob, "package": lambda **_: None}
    names.update({kind: rule(kind) for kind in ("filegroup", "py_library", "py_test")})
    exec(compile(build, "BUILD", "exec"), names)
    return rules


def uncovered_modules(rules: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
    """Each module under tfreplay/ that is not in exactly one py_library, with the libraries that list it."""
    owners = {path: [] for path in _glob(["tfreplay/**/*.py"])}
    for library in rules["py_library"]:
        for path in library.get("srcs", []):
            owners.setdefault(path, []).append(library["name"])
    return {path: names for path, names in owners.items() if path.startswith("tfreplay/") and len(names) != 1}


def test_every_module_is_in_exactly_one_library_target():
    assert uncovered_modules(evaluate((ROOT / "BUILD").read_text())) == {}, "fix the globs of BUILD's py_library"


def test_a_module_outside_the_globs_is_reported():
    rules = evaluate('py_library(name = "tfreplay", srcs = glob(["tfreplay/*.py"]))')
    assert uncovered_modules(rules)["tfreplay/_src/specs.py"] == []
    twice = evaluate('[py_library(name = n, srcs = glob(["tfreplay/*.py"])) for n in ["a", "b"]]')
    assert uncovered_modules(twice)["tfreplay/buffers.py"] == ["a", "b"]


def test_the_library_carries_the_kernel_sources_it_compiles():
    (library,) = [r for r in evaluate((ROOT / "BUILD").read_text())["py_library"] if r["name"] == "tfreplay"]
    assert set(_glob(["tfreplay/native/kernels/*"])) <= set(library["data"])


def test_every_test_file_has_a_py_test_that_runs_pytest_on_it():
    tests = evaluate((ROOT / "BUILD").read_text())["py_test"]
    for path in _glob(["tests/**/test_*.py"]):
        runs = [t for t in tests if path in t["srcs"]]
        assert len(runs) == 1, f"BUILD needs one py_test for {path}, has {len(runs)}"
        assert (runs[0]["main"], runs[0]["args"]) == (LAUNCHER, [path])


def test_the_launcher_passes_the_suite_settings_and_bazels_report_and_scratch_folder():
    assert pytest_args(["tests/x/test_a.py"], {}) == [
        *("-c", "pyproject.toml", "--rootdir", ".", "-p", "no:cacheprovider"),
        "tests/x/test_a.py",
    ]
    args = pytest_args(["tests/x/test_a.py"], {"XML_OUTPUT_FILE": "/o/test.xml", "TEST_TMPDIR": "/t"})
    assert args[-2:] == ["--junitxml=/o/test.xml", "--basetemp=/t/pytest"]


def test_the_launcher_drops_the_finders_of_editable_installs():
    class Editable:  # what `pip install -e` puts on sys.meta_path: a class from an __editable__ module
        __module__ = "__editable___tfreplay_0_1_0_finder"

    kept = [object(), Editable(), str]
    assert without_editable_installs(kept) == [kept[0], kept[2]]


@pytest.mark.parametrize(
    "code, status",
    [(pytest.ExitCode.OK, 0), (pytest.ExitCode.TESTS_FAILED, 1), (pytest.ExitCode.NO_TESTS_COLLECTED, 0), (2, 2)],
)
def test_a_file_with_nothing_to_run_passes_and_a_failure_fails(code, status):
    assert exit_status(code) == status
