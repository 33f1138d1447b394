"""Reverb's Python API over tables of its own, for TensorFlow versions Reverb does not install on.

`import tfreplay.compat.reverb as reverb` gives `Server`, `Table`, `Client`,
`TFClient`, `TrajectoryWriter`, `TrajectoryDataset`, `selectors`,
`rate_limiters` and `checkpointers` under Reverb's names. Libraries that
`import reverb` themselves (TF-Agents) get this module after `install()`,
and each Reverb module name (`reverb.server`, `reverb.trajectory_dataset`,
...) the shim's module of that part. A server listens on its port: clients in its process call its tables
directly, clients in other processes and machines reach it over gRPC; `serve` runs one from a JSON config
(`tfreplay-reverb-server`).

The package has three layers, each importing only the ones below it:

- Reverb's API, one module per Reverb module name (`client`, `server`, `tf_client`, `trajectory_writer`,
  `trajectory_dataset`, `replay_sample`, `selectors`, `rate_limiters`, `checkpointers`, `errors`) and `serve`;
- `transport`: which endpoint an address reaches, and gRPC between processes;
- `engine`: the tables themselves (items, selectors, rate limiters, checkpoints), and the interface the API
  calls on a server and a table, answered in process by the engine and across processes by the transport.
"""

from __future__ import annotations

import sys
import types

from tfreplay.compat.reverb import checkpointers, errors, rate_limiters, selectors
from tfreplay.compat.reverb.client import Client, Writer
from tfreplay.compat.reverb.engine.table import Table, TableInfo
from tfreplay.compat.reverb.errors import DeadlineExceededError, ReverbError
from tfreplay.compat.reverb.replay_sample import ReplaySample, SampleInfo
from tfreplay.compat.reverb.server import Server
from tfreplay.compat.reverb.tf_client import TFClient
from tfreplay.compat.reverb.trajectory_dataset import TrajectoryDataset
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

_PLATFORM = types.ModuleType("reverb.platform", "Reverb's platform package: its checkpointers.")
_PLATFORM.checkpointers_lib = checkpointers  # type: ignore[attr-defined]


def _modules() -> dict[str, types.ModuleType]:
    """Each Reverb module name and the shim's module under it: one module per name, so that `import reverb.server`
    gives the server module the shim's clients use, never a second copy."""
    from tfreplay.compat.reverb import client, replay_sample, server, tf_client, trajectory_dataset, trajectory_writer
    from tfreplay.compat.reverb.engine import table

    return {
        "reverb": sys.modules[__name__],
        "reverb.client": client,
        "reverb.server": server,
        "reverb.tf_client": tf_client,
        "reverb.trajectory_writer": trajectory_writer,
        "reverb.trajectory_dataset": trajectory_dataset,
        "reverb.replay_sample": replay_sample,
        "reverb.reverb_types": table,
        "reverb.selectors": selectors,
        "reverb.item_selectors": selectors,
        "reverb.rate_limiters": rate_limiters,
        "reverb.errors": errors,
        "reverb.checkpointers": checkpointers,
        "reverb.platform": _PLATFORM,
        "reverb.platform.checkpointers_lib": checkpointers,
    }


def install() -> types.ModuleType:
    """Makes `import reverb` (and `reverb.server`, `reverb.trajectory_dataset`, ...) give this package's modules
    in this process; returns this module.

    A `reverb` imported before (the real one) is replaced in `sys.modules`; modules that hold it keep it.
    """
    parts = _modules()
    sys.modules.update(parts)
    this = parts["reverb"]
    for name, module in parts.items():
        if name.count(".") == 1 and not hasattr(this, name.split(".")[1]):
            setattr(this, name.split(".")[1], module)  # `reverb.trajectory_dataset` after `import reverb`
    return this


def uninstall() -> None:
    """Undoes `install()`: `import reverb` finds the installed package again (if any)."""
    for name, module in _modules().items():
        if sys.modules.get(name) is module:
            del sys.modules[name]
