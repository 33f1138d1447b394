"""`tf_agents.replay_buffers`' uniform buffers and base class, over tfreplay (modules load on first use)."""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = ("replay_buffer", "tf_uniform_replay_buffer", "py_uniform_replay_buffer")
__all__ = list(_MODULES)


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
