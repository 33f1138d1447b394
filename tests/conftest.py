"""Fixtures only; the shared helpers live in `helpers.py` (which also quiets TF logs before TF loads)."""

from __future__ import annotations

import os

import pytest
import tensorflow as tf
from helpers import KINDS, MODES, VARIANTS, Api, make_buffer

from tfreplay import PyUniformReplayBuffer, TFUniformReplayBuffer

# Reverb servers the tests start (and their subprocesses') listen on the loopback interface only.
os.environ.setdefault("TFREPLAY_REVERB_HOST", "127.0.0.1")


def pytest_ignore_collect(collection_path, config):
    """Under `-m "keras ..."` (the Keras 3 passes of `make test` and `make test-slow`) a test file that never names
    Keras holds no test the mark selects: it is not imported, which spares the pass most of its collection."""
    if not (config.getoption("markexpr") or "").lstrip().startswith("keras "):
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return "keras" not in collection_path.read_text(encoding="utf-8") or None
    return None


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
