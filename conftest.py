"""Runs every ```python block of README.md and docs/**/*.md as a test (Sybil), in `make test-slow`.

The blocks of one page share a namespace and run top to bottom, as a reader
would paste them. Each is marked `slow`: `make test-slow` runs them (the page
whose blocks start a Ray cluster in its Ray pass), `make test` leaves them
out. `<!-- skip: next -->` before a block marks a fragment that is shown but
not run. Each page runs in its own temporary working directory, so a block
that writes a relative path leaves nothing in the checkout.
"""

from __future__ import annotations

import os
import tempfile

import pytest
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


def _enter_with_a_patient_ray(namespace: dict) -> None:
    """As `_enter_temporary_directory`, and `ray.init` tries a second time when Ray's node does not start within
    Ray's fixed 30 s (a test machine busy with other tests can take longer); the page's code is unchanged."""
    _enter_temporary_directory(namespace)
    import ray

    first_try = ray.init

    def init(*args, **kwargs):
        try:
            return first_try(*args, **kwargs)
        except Exception as e:
            if "timed out during startup" not in str(e):
                raise
            ray.shutdown()
            return first_try(*args, **kwargs)

    ray.init, namespace["__ray_init__"] = init, first_try


def _leave_with_ray_as_it_was(namespace: dict) -> None:
    import ray

    ray.init = namespace.pop("__ray_init__")
    _leave_temporary_directory(namespace)


RAY_PAGES = ["docs/guides/distributed.md"]
PARSERS = [PythonCodeBlockParser(), SkipParser()]
pytest_collect_file = (
    Sybil(
        parsers=PARSERS,
        patterns=["README.md", "docs/*.md", "docs/*/*.md"],
        excludes=RAY_PAGES,
        setup=_enter_temporary_directory,
        teardown=_leave_temporary_directory,
    )
    + Sybil(
        parsers=PARSERS,
        patterns=RAY_PAGES,
        setup=_enter_with_a_patient_ray,
        teardown=_leave_with_ray_as_it_was,
        name="ray pages",
    )
).pytest()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """The docs' blocks are `make test-slow`'s: each page runs as a reader pastes it, a few seconds a page."""
    for item in items:
        if item.path.suffix == ".md":
            item.add_marker(pytest.mark.slow)
