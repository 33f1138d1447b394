"""The main of every py_test in BUILD: pytest on the test file Bazel passes, run inside the test's runfiles.

Bazel starts each test in its runfiles tree, which holds only the files BUILD
declares, so a module or data file missing there fails under Bazel as it would
for anyone using the targets. The suite's pytest settings (pyproject.toml) apply
as under `make test`, whatever folder the test file is in.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest


def pytest_args(test_files: list[str], environ: dict[str, str]) -> list[str]:
    """pytest's arguments for the test files, with Bazel's report and scratch folder where Bazel names them."""
    # No cache folder: the runfiles tree is Bazel's, and Bazel keeps its own record of what ran.
    args = ["-c", "pyproject.toml", "--rootdir", ".", "-p", "no:cacheprovider", *test_files]
    if "XML_OUTPUT_FILE" in environ:  # Bazel then lists each test case, not only the file
        args.append(f"--junitxml={environ['XML_OUTPUT_FILE']}")
    if "TEST_TMPDIR" in environ:  # Bazel empties it between runs
        args.append(f"--basetemp={os.path.join(environ['TEST_TMPDIR'], 'pytest')}")
    return args


def without_editable_installs(meta_path: list[Any]) -> list[Any]:
    """`sys.meta_path` less the finders of editable installs (`pip install -e .`, as the Makefile's venv has).

    Such a finder imports a module of tfreplay that the runfiles lack from the
    source tree, which would hide a module missing from BUILD.
    """
    return [finder for finder in meta_path if not getattr(finder, "__module__", "").startswith("__editable__")]


def exit_status(code: int) -> int:
    """The test's exit status for pytest's: a file with nothing to run passes, as within the whole suite.

    Its tests may all skip (the TF-Agents tests, where TF-Agents is not
    installed) or all be deselected (`--test_arg=-m --test_arg='not slow'`).
    """
    return 0 if code == pytest.ExitCode.NO_TESTS_COLLECTED else int(code)


if __name__ == "__main__":
    sys.meta_path[:] = without_editable_installs(sys.meta_path)
    sys.exit(exit_status(pytest.main(pytest_args(sys.argv[1:], dict(os.environ)))))
