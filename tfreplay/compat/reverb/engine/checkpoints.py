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

from tfreplay.compat.reverb.engine.items import Column, Item
from tfreplay.compat.reverb.engine.table import Table

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
    items, counts = table.snapshot()

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
            "episodes": list(it.episodes),
            "columns": [[[number(c) for c in col.cells], col.squeeze] for col in it.columns],
        }
        for it in items
    ]
    return {"name": table.name, "settings": _settings(table), "counts": counts, "items": rows}


def load(folder: str | os.PathLike, tables: dict[str, Table]) -> None:
    """Puts the checkpoint in `folder` into `tables` (by name), whole or not at all: the format, each table's
    settings, and every item, count and cell number are checked (ValueError) before any table changes."""
    folder = pathlib.Path(folder)
    record = json.loads((folder / "tables.json").read_text())
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(
            f"checkpoint {folder}: format ({record.get('format') if isinstance(record, dict) else record!r}) must "
            f"be {FORMAT!r}; Reverb's own checkpoints cannot be read by tfreplay.compat.reverb."
        )
    matched = [(tables[t["name"]], t) for t in record["tables"] if t.get("name") in tables]
    for table, saved in matched:
        if saved["settings"] != _settings(table):
            raise ValueError(
                f"checkpoint {folder}: table {table.name!r} was saved with settings {saved['settings']}; "
                f"the server's table has {_settings(table)}."
            )
    with np.load(folder / "cells.npz", allow_pickle=False) as npz:
        reader = _Cells(f"checkpoint {folder}", npz)
        restored = [
            (table, *_read_table(f"checkpoint {folder}: table {table.name!r}", table, saved, reader))
            for table, saved in matched
        ]
    for table, items, counts in restored:
        table.restore(items, counts)


class _Cells:
    """The checkpoint's cells by number, each read once (items that share a step share its array)."""

    def __init__(self, where: str, npz: Any):
        self.where, self.npz, self.count = where, npz, len(npz.files)
        self.arrays: dict[int, np.ndarray] = {}

    def __call__(self, n: Any) -> np.ndarray:
        if not _is_count(n) or f"c{n}" not in self.npz.files:
            raise ValueError(f"{self.where}: cell ({n!r}) must be one of the checkpoint's {self.count} cells.")
        if n not in self.arrays:
            self.arrays[n] = self.npz[f"c{n}"]
        return self.arrays[n]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_table(where: str, table: Table, saved: dict, cell: _Cells) -> tuple[list[Item], dict]:
    """A table's checked items and counts."""
    counts = saved.get("counts")
    required = ("inserts", "samples", "deletes")
    if (
        not isinstance(counts, dict)
        or any(k not in counts for k in required)
        or not all(map(_is_count, counts.values()))
    ):
        raise ValueError(f"{where}: counts ({counts!r}) must be integers >= 0 for {', '.join(required)}.")
    items, keys = [], set()
    for i, row in enumerate(saved["items"]):
        item = _read_item(f"{where}, item {i}", table, row, cell)
        if item.key in keys:
            raise ValueError(f"{where}, item {i}: key ({item.key}) must be unique in the table.")
        keys.add(item.key)
        items.append(item)
    return items, counts


def _read_item(where: str, table: Table, row: dict, cell: _Cells) -> Item:
    key = row.get("key")
    if not isinstance(key, str) or not key.isdigit() or int(key) >= 2**64:
        raise ValueError(f"{where}: key ({key!r}) must be a decimal integer in [0, 2**64).")
    priority = table.checked_priority(where, row.get("priority"))
    times_sampled: Any = row.get("times_sampled")
    episodes: Any = row.get("episodes", [])
    if not _is_count(times_sampled):
        raise ValueError(f"{where}: times_sampled ({times_sampled!r}) must be an integer >= 0.")
    if not isinstance(episodes, list) or not all(map(_is_count, episodes)):
        raise ValueError(f"{where}: episodes ({episodes!r}) must be a list of integers >= 0.")
    columns = []
    for numbers, squeeze in row.get("columns", []):
        if not isinstance(numbers, list) or not numbers or (squeeze and len(numbers) != 1):
            raise ValueError(f"{where}: a column ({numbers!r}) must list its cells (one when squeezed).")
        columns.append(Column(tuple(cell(n) for n in numbers), bool(squeeze)))
    return Item(int(key), priority, tuple(columns), int(times_sampled), tuple(episodes))
