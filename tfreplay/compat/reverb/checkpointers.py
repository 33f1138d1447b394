"""Checkpointers: every table's items, priorities and counts in a pickle-free format.

A checkpoint is a folder under the checkpointer's path: `cells.npz` holds
each step cell once (NumPy's format, read with `allow_pickle=False`), and
`tables.json` each table's settings and items (key, priority, draws, and its
columns as cell numbers). A `Server` given a checkpointer loads its latest
checkpoint into the tables of the same names at start; a table of the
checkpoint with no such table is skipped, and a table whose settings differ
is refused. Reverb's own checkpoint files (TFRecord and protos) are not read.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time
from typing import Any

import numpy as np

from tfreplay.compat.reverb.table import Column, Item, Table

FORMAT = "tfreplay.compat.reverb checkpoint 1"


class CheckpointerBase:
    """Writes tables into checkpoints under `path` and reads the latest back."""

    def __init__(self, path: str | os.PathLike, group: str = ""):
        self.path = pathlib.Path(path)
        self._count = 0

    def save(self, tables: dict[str, Table]) -> str:
        """Writes `tables` into a new checkpoint folder; returns its path."""
        cells: dict[int, int] = {}
        arrays: dict[str, np.ndarray] = {}
        record = {"format": FORMAT, "tables": [_table_record(t, cells, arrays) for t in tables.values()]}
        self._count += 1
        folder = self.path / f"{time.strftime('%Y-%m-%dT%H-%M-%S')}-{os.getpid()}-{self._count:04d}"
        partial = folder.with_name(folder.name + ".partial")
        partial.mkdir(parents=True)
        np.savez(partial / "cells.npz", **arrays)  # type: ignore[arg-type]
        (partial / "tables.json").write_text(json.dumps(record))
        partial.rename(folder)  # a folder without the suffix is complete
        return str(folder)

    def latest(self) -> pathlib.Path | None:
        if not self.path.is_dir():
            return None
        done = sorted(p for p in self.path.iterdir() if p.is_dir() and not p.name.endswith(".partial"))
        return done[-1] if done else None

    def load_latest(self, tables: dict[str, Table]) -> None:
        """Loads the latest checkpoint (if any) into the tables of the same names."""
        folder = self.latest()
        if folder is not None:
            load(folder, tables)


class DefaultCheckpointer(CheckpointerBase):
    """Checkpoints under `path`."""


class TempDirCheckpointer(CheckpointerBase):
    """Checkpoints under a new temporary folder."""

    def __init__(self) -> None:
        super().__init__(tempfile.mkdtemp(prefix="reverb-checkpoints-"))


def default_checkpointer(group: str | None = None) -> CheckpointerBase:
    return TempDirCheckpointer()


def _settings(table: Table) -> dict:
    return {
        "max_size": table.max_size,
        "max_times_sampled": table.max_times_sampled,
        "sampler": repr(table._sampler_setting),
        "remover": repr(table._remover_setting),
        "rate_limiter": repr(table._limiter),
    }


def _table_record(table: Table, cells: dict[int, int], arrays: dict[str, np.ndarray]) -> dict:
    items, counts = table._snapshot()

    def number(cell: np.ndarray) -> int:
        if id(cell) not in cells:
            if cell.dtype.hasobject:
                raise TypeError(
                    f"checkpoint: table {table.name!r} holds an object array ({cell.dtype}); only "
                    "numeric, bool and fixed-width string cells can be saved without pickle."
                )
            cells[id(cell)] = len(cells)
            arrays[f"c{cells[id(cell)]}"] = cell
        return cells[id(cell)]

    rows = [
        {
            "key": str(it.key),
            "priority": it.priority,
            "times_sampled": it.times_sampled,
            "columns": [[[number(c) for c in col.cells], col.squeeze] for col in it.columns],
        }
        for it in items
    ]
    return {"name": table.name, "settings": _settings(table), "counts": counts, "items": rows}


def load(folder: str | os.PathLike, tables: dict[str, Table]) -> None:
    """Puts the checkpoint in `folder` into `tables` (by name); raises ValueError before changing any table
    if the format or a table's settings differ."""
    folder = pathlib.Path(folder)
    record = json.loads((folder / "tables.json").read_text())
    if record.get("format") != FORMAT:
        raise ValueError(
            f"checkpoint {folder}: format ({record.get('format')!r}) must be {FORMAT!r}; Reverb's own "
            "checkpoints cannot be read by tfreplay.compat.reverb."
        )
    matched = [(tables[t["name"]], t) for t in record["tables"] if t["name"] in tables]
    for table, saved in matched:
        if saved["settings"] != _settings(table):
            raise ValueError(
                f"checkpoint {folder}: table {table.name!r} was saved with settings {saved['settings']}; "
                f"the server's table has {_settings(table)}."
            )
    with np.load(folder / "cells.npz", allow_pickle=False) as npz:
        arrays: dict[int, Any] = {}

        def cell(n: int) -> np.ndarray:
            if n not in arrays:
                arrays[n] = npz[f"c{n}"]
            return arrays[n]

        restored = [
            (
                table,
                [
                    Item(
                        int(r["key"]),
                        r["priority"],
                        tuple(Column(tuple(cell(n) for n in ns), sq) for ns, sq in r["columns"]),
                        r["times_sampled"],
                    )
                    for r in saved["items"]
                ],
                saved["counts"],
            )
            for table, saved in matched
        ]
    for table, items, counts in restored:
        table._restore(items, counts)
