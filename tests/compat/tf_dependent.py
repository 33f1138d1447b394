"""A pytest plugin (`-p tf_dependent`, `tests/compat` on the path): the TF 2.15 lane runs what TensorFlow's version
can change.

`make test` runs the whole suite on current TensorFlow. The compatibility lane runs the files that cover the paths
TensorFlow's version changes (`COMPAT_TESTS` in the Makefile) on TF 2.15, and within them a test only earns its
minutes if TensorFlow runs inside it: TF buffers, graph modes (`tf.function`, `as_dataset`), checkpoints, Keras,
the TF ops, TF-Agents interop. This plugin deselects the rest, by two rules stated once here and printed in the
run's header:

1. A test parametrized only over NumPy buffers (a kind, variant or class whose id starts with `py`/`Py`) and run
   eagerly (no `mode`, or `mode == "eager"`) stores and samples NumPy arrays; its outcome does not depend on
   TensorFlow's version. The same test's TF and graph-mode cases stay.
2. Whole files whose code under test imports no TensorFlow path that differs between versions (`NUMPY_ONLY`).

Everything else stays, TF-Agents' own tests and the interop tests included.
"""

from __future__ import annotations

import re

import pytest

# Files whose subject is NumPy-only: memory-mapped NumPy storage, the fastrl adapter (NumPy), the Ray service
# (NumPy buffers behind actors), the C kernels' NumPy windows, and the public API snapshot (names, not behaviour).
NUMPY_ONLY = (
    "tests/library/test_memmap.py",
    "tests/compat/test_fastrl.py",
    "tests/distributed/",
    "tests/library/test_public_api.py",
)

# Tokens of a parametrized id that name where a case runs.
_NUMPY = re.compile(r"^(py|Py\w*Buffer)$")
_TF = re.compile(r"^(tf|TF\w*Buffer|function|dataset|xla|graph)$")


def numpy_only(nodeid: str, params: dict) -> bool:
    """Whether a collected test runs only NumPy code (rule 1 or 2 above)."""
    path = nodeid.split("::", 1)[0]
    if any(path.startswith(prefix) for prefix in NUMPY_ONLY):
        return True
    if params.get("mode", "eager") != "eager" or "[" not in nodeid:
        return False
    tokens = re.split(r"[-\[\]]", nodeid[nodeid.index("[") :])
    return any(_NUMPY.match(t) for t in tokens) and not any(_TF.match(t) for t in tokens)


def pytest_report_header(config) -> str:
    return "tf_dependent: NumPy-only tests deselected (tests/compat/tf_dependent.py says which and why)"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items: list) -> None:
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        (dropped if numpy_only(item.nodeid, callspec.params if callspec else {}) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
