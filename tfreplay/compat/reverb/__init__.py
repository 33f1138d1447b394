"""Reverb's Python API over tables in this process, for TensorFlow versions Reverb does not install on.

`import tfreplay.compat.reverb as reverb` gives `Server`, `Table`, `Client`,
`TFClient`, `TrajectoryWriter`, `TrajectoryDataset`, `selectors`,
`rate_limiters` and `checkpointers` under Reverb's names. Libraries that
`import reverb` themselves (TF-Agents) get this module after `install()`.
A server lives in its process: clients reach it as `localhost:<port>` from
the same process only.
"""

from __future__ import annotations

import sys
import types

from tfreplay.compat.reverb import checkpointers, errors, rate_limiters, selectors
from tfreplay.compat.reverb.client import Client, Writer
from tfreplay.compat.reverb.dataset import TrajectoryDataset
from tfreplay.compat.reverb.errors import DeadlineExceededError, ReverbError
from tfreplay.compat.reverb.replay_sample import ReplaySample, SampleInfo
from tfreplay.compat.reverb.server import Server
from tfreplay.compat.reverb.table import Table, TableInfo
from tfreplay.compat.reverb.tf_client import TFClient
from tfreplay.compat.reverb.trajectory_writer import TrajectoryColumn, TrajectoryWriter

item_selectors = selectors

__all__ = [
    "Client",
    "DeadlineExceededError",
    "ReplaySample",
    "ReverbError",
    "SampleInfo",
    "Server",
    "Table",
    "TableInfo",
    "TFClient",
    "TrajectoryColumn",
    "TrajectoryDataset",
    "TrajectoryWriter",
    "Writer",
    "checkpointers",
    "errors",
    "install",
    "item_selectors",
    "rate_limiters",
    "selectors",
    "uninstall",
]

_NAMES = (
    "reverb",
    "reverb.selectors",
    "reverb.item_selectors",
    "reverb.rate_limiters",
    "reverb.errors",
    "reverb.checkpointers",
    "reverb.platform.checkpointers_lib",
)


def install() -> types.ModuleType:
    """Makes `import reverb` (and `reverb.selectors`, ...) give this module in this process; returns it.

    A `reverb` imported before (the real one) is replaced in `sys.modules`; modules that hold it keep it.
    """
    this = sys.modules[__name__]
    parts = {
        "reverb": this,
        "reverb.selectors": selectors,
        "reverb.item_selectors": selectors,
        "reverb.rate_limiters": rate_limiters,
        "reverb.errors": errors,
        "reverb.checkpointers": checkpointers,
        "reverb.platform.checkpointers_lib": checkpointers,
    }
    sys.modules.update(parts)
    return this


def uninstall() -> None:
    """Undoes `install()`: `import reverb` finds the installed package again (if any)."""
    this = sys.modules[__name__]
    shim = {this, selectors, rate_limiters, errors, checkpointers}
    for name in _NAMES:
        if sys.modules.get(name) in shim:
            del sys.modules[name]
