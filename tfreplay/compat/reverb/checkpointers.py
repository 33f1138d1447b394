"""Reverb's `checkpointers`: where `Client.checkpoint()` writes a server's tables and a new server reads them.

The engine's checkpoint format (`engine/checkpoints.py`, pickle-free) under Reverb's module name; `load`
reads a checkpoint folder into tables whole or not at all.
"""

from tfreplay.compat.reverb.engine.checkpoints import (
    CheckpointerBase,
    DefaultCheckpointer,
    TempDirCheckpointer,
    default_checkpointer,
    load,
)

__all__ = ["CheckpointerBase", "DefaultCheckpointer", "TempDirCheckpointer", "default_checkpointer", "load"]
