"""Runs every ```python block of README.md and docs/**/*.md as a test (Sybil).

The blocks of one page share a namespace and run top to bottom, as a reader
would paste them. `<!-- skip: next -->` before a block marks a fragment that is
shown but not run. Each page runs in its own temporary working directory, so a
block that writes a relative path leaves nothing in the checkout.
"""

from __future__ import annotations

import os
import tempfile

from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _enter_temporary_directory(namespace: dict) -> None:
    namespace["__docs_cwd__"] = os.getcwd()
    namespace["__docs_tmp__"] = tempfile.TemporaryDirectory(prefix="tfreplay-docs-")
    os.chdir(namespace["__docs_tmp__"].name)


def _leave_temporary_directory(namespace: dict) -> None:
    os.chdir(namespace.pop("__docs_cwd__"))
    namespace.pop("__docs_tmp__").cleanup()


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    patterns=["README.md", "docs/*.md", "docs/*/*.md"],
    setup=_enter_temporary_directory,
    teardown=_leave_temporary_directory,
).pytest()
