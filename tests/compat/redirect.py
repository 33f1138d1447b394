"""A pytest plugin (`-p redirect`, `tests/compat` on the path): TF-Agents' replay-buffer modules become ours.

Loaded before collection, it puts `tfreplay.compat.tf_agents.replay_buffers.*`
in `sys.modules` (and on the `tf_agents.replay_buffers` package) under
TF-Agents' names, so TF-Agents' own test modules, run from the installed
wheel, import tfreplay's buffers without a line of theirs changed. A test
tfreplay failed on purpose would be marked strict xfail here, with its reason;
today there is none.
"""

from __future__ import annotations

import importlib
import sys

import pytest

REDIRECTED = ("replay_buffer", "tf_uniform_replay_buffer", "py_uniform_replay_buffer")

# Test id (class::method) -> why tfreplay fails it. Only TF-Agents private attributes, or a behaviour fixed on purpose.
EXPECTED_FAILURES: dict = {}  # every one of TF-Agents' replay-buffer tests passes on tfreplay.compat


ORIGINALS: dict = {}


def original(name: str):
    """TF-Agents' own module `tf_agents.replay_buffers.<name>`, redirected or not (the interop tests compare)."""
    return ORIGINALS.get(name) or importlib.import_module(f"tf_agents.replay_buffers.{name}")


def redirect() -> None:
    package = importlib.import_module("tf_agents.replay_buffers")
    for name in REDIRECTED:
        ORIGINALS[name] = importlib.import_module(f"tf_agents.replay_buffers.{name}")
        module = importlib.import_module(f"tfreplay.compat.tf_agents.replay_buffers.{name}")
        sys.modules[f"tf_agents.replay_buffers.{name}"] = module
        setattr(package, name, module)
    package.TFUniformReplayBuffer = package.tf_uniform_replay_buffer.TFUniformReplayBuffer


redirect()


def pytest_collection_modifyitems(items: list) -> None:
    for item in items:
        name = item.nodeid.split("::", 1)[-1]
        if name in EXPECTED_FAILURES:
            item.add_marker(pytest.mark.xfail(strict=True, reason=EXPECTED_FAILURES[name]))
