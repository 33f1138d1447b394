"""Fixtures only; the shared helpers live in `helpers.py` (which also quiets TF logs before TF loads)."""

from __future__ import annotations

import os
import re

import pytest
import tensorflow as tf
from helpers import KINDS, MODES, VARIANTS, Api, make_buffer

from tfreplay import PyUniformReplayBuffer, TFUniformReplayBuffer

# Reverb servers the tests start (and their subprocesses') listen on the loopback interface only.
os.environ.setdefault("TFREPLAY_REVERB_HOST", "127.0.0.1")

# Grappler, TensorFlow's graph optimizer, rewrites each function graph the first time it runs. The suite traces
# thousands of small functions, and without it they run 10-18% sooner (measured on two cores). It must not change
# what a graph computes: `make test-compat` (TF 2.15) keeps it on for the contract suite in every mode, and
# `TFREPLAY_TEST_GRAPPLER=1` keeps it on in any run. Processes the tests start (notebooks, examples) keep it.
if os.environ.get("TFREPLAY_TEST_GRAPPLER") != "1":
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


# The text that shows a test file may hold tests a mark selects: its name, or for `slow` also `helpers.quick`, which
# marks the cases a matrix leaves out of `make test`.
MARK_EVIDENCE = {"keras": ("keras",), "slow": ("slow", "quick(")}


def pytest_ignore_collect(collection_path, config):
    """Under a mark expression that only requires marks (`-m slow`, `-m keras`, `-m "keras and not slow"`, ...: the
    two passes of `make test-slow`), a test file whose text shows none of a required mark holds no test the expression
    selects: it is not imported, which spares the pass most of its collection."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    terms = [t.strip() for t in (config.getoption("markexpr") or "").split(" and ")]
    required = [t for t in terms if t in MARK_EVIDENCE]
    if not required or any(not re.fullmatch(r"(not )?\w+", t) for t in terms):
        return None  # no mark required, or an expression this reading does not follow (or, parentheses)
    text = collection_path.read_text(encoding="utf-8")
    return any(not any(e in text for e in MARK_EVIDENCE[mark]) for mark in required) or None


@pytest.fixture(params=sorted(VARIANTS))
def variant(request) -> str:
    """Each uniform buffer class, and the TF one both eagerly and inside tf.function."""
    return request.param


@pytest.fixture(params=["tf", "py"])
def buffer_cls(request):
    """Each uniform buffer class."""
    return {"tf": TFUniformReplayBuffer, "py": PyUniformReplayBuffer}[request.param]


@pytest.fixture
def make_api(variant):
    """`make_api(batch_size, max_length, seed=0, **kwargs)` -> an `Api` for this variant."""

    def make(batch_size: int, max_length: int, seed: int | None = 0, **kwargs) -> Api:
        return Api(make_buffer(variant, batch_size, max_length, seed, **kwargs), VARIANTS[variant][1])

    return make


@pytest.fixture(params=list(KINDS))
def kind(request):
    """Each of the four buffers, as a `helpers.Kind` adapter."""
    return KINDS[request.param]


@pytest.fixture(params=MODES)
def mode(request) -> str:
    """Eagerly, inside tf.function, and through as_dataset (see `helpers.Api`)."""
    return request.param


@pytest.fixture
def set_global_seed():
    """`tf.random.set_seed`, reset to no global seed afterwards."""
    yield tf.random.set_seed
    tf.random.set_seed(None)
