"""TF-Agents' module paths over tfreplay's buffers: switch by changing the import line.

    # from tf_agents.replay_buffers import tf_uniform_replay_buffer
    from tfreplay.compat.tf_agents.replay_buffers import tf_uniform_replay_buffer

`replay_buffers.{replay_buffer, tf_uniform_replay_buffer,
py_uniform_replay_buffer}` take TF-Agents 0.19's constructor signatures and
return what TF-Agents returns; `specs` has the array specs a NumPy buffer takes
(`specs.tensor_spec.to_nest_array_spec`). `restore_tf_agents_checkpoint(buffer, path)`
moves a TF-Agents `TFUniformReplayBuffer` checkpoint into a tfreplay buffer.
Modules load lazily: `import tfreplay` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["replay_buffers", "restore_tf_agents_checkpoint", "specs"]


def __getattr__(name: str) -> Any:
    if name in ("replay_buffers", "specs"):
        return importlib.import_module(f"{__name__}.{name}")
    if name == "restore_tf_agents_checkpoint":
        return importlib.import_module(f"{__name__}.migrate").restore_tf_agents_checkpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
