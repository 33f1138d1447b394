"""A pytest plugin (`-p reverb_redirect`, `tests/compat` on the path): `import reverb` gives tfreplay.compat.reverb.

Loaded before collection, so TF-Agents' own Reverb tests, run from the
installed wheel, use the shim without a line of theirs changed. A process
with this plugin never sees the real dm-reverb: the differential tests
(tests/compat/reverb/test_differential.py) run in a pytest of their own.
"""

from __future__ import annotations

import sys
import unittest.mock

import pytest

import tfreplay.compat.reverb

tfreplay.compat.reverb.install()
# TF-Agents' tests import the `mock` backport; the standard library's is the same API.
sys.modules.setdefault("mock", unittest.mock)

# Test id (class::method) -> why the shim fails it on purpose. None today.
EXPECTED_FAILURES: dict = {}


def pytest_collection_modifyitems(items: list) -> None:
    for item in items:
        name = item.nodeid.split("::", 1)[-1]
        if name in EXPECTED_FAILURES:
            item.add_marker(pytest.mark.xfail(strict=True, reason=EXPECTED_FAILURES[name]))
