"""`TrajectoryWriter`: steps appended column by column, items made of slices of them.

`append(step)` flattens the step (a nest, fixed by the first append) into
columns and keeps each leaf as one cell (a NumPy copy); `history` is the same
nest of column histories, which index (`h[-1]`: one step, squeezed) and slice
(`h[-3:]`: a time axis) into `TrajectoryColumn`s; `create_item(table,
priority, trajectory)` inserts an item over those cells at once (a table
whose rate limiter holds inserts back makes it wait). Only the last
`num_keep_alive_refs` steps of each column can be referenced; older cells
are let go, freed when no item holds them. `flush` has nothing to send and
returns; `end_episode` starts the history again.
"""

from __future__ import annotations

import random
from typing import Any, Iterator

import numpy as np
import tensorflow as tf
from tensorflow.python.util import nest

from tfreplay.compat.reverb.table import Column, Item, check_columns


class TrajectoryColumn:
    """Cells of one column picked from a history (`squeeze`: one step without a time axis)."""

    def __init__(self, cells: list, *, squeeze: bool = False, path: tuple = ()):
        if squeeze and len(cells) != 1:
            raise ValueError(f"TrajectoryColumn: squeeze needs exactly one cell; got {len(cells)}.")
        self._cells, self._squeeze, self._path = list(cells), squeeze, path

    def __len__(self) -> int:
        return len(self._cells)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cells)

    def __getitem__(self, val: Any) -> TrajectoryColumn:
        if self._squeeze:
            raise TypeError("TrajectoryColumn: a squeezed column (one step, no time axis) cannot be indexed.")
        if isinstance(val, slice):
            return TrajectoryColumn(self._cells[val], path=self._path)
        return TrajectoryColumn([self._cells[val]], squeeze=True, path=self._path)

    @property
    def is_squeezed(self) -> bool:
        return self._squeeze

    @property
    def shape(self) -> tuple:
        return self._column("shape").shape()

    @property
    def dtype(self) -> np.dtype:
        return self._column("dtype").cells[0].dtype

    def numpy(self) -> np.ndarray:
        return self._column("numpy").value()

    def _column(self, where: str) -> Column:
        if not self._cells or any(c is None for c in self._cells):
            raise ValueError(
                f"TrajectoryColumn.{where}: column {'/'.join(map(str, self._path)) or '0'} has "
                f"{'no cells' if not self._cells else 'steps with no value (None)'}; an item needs a value in each."
            )
        return Column(tuple(self._cells), self._squeeze)


class _ColumnHistory:
    """One column's cells in this episode: the last `keep` are held, older ones are let go."""

    def __init__(self, path: tuple, keep: int):
        self._path, self._keep = path, keep
        self._start = 0
        self._cells: list = []

    def _append(self, cell: Any) -> None:
        self._cells.append(cell)
        if len(self._cells) > self._keep:
            del self._cells[0]
            self._start += 1

    def __len__(self) -> int:
        return self._start + len(self._cells)

    def __getitem__(self, val: Any) -> TrajectoryColumn:
        n = len(self)
        if isinstance(val, slice):
            indices = range(n)[val]
            if val.step not in (None, 1):
                raise ValueError(f"history: a slice step ({val.step}) is not supported; use a contiguous slice.")
            return TrajectoryColumn([self._cell(i) for i in indices], path=self._path)
        index = int(val) + n if int(val) < 0 else int(val)
        if not 0 <= index < n:
            raise IndexError(f"history: index ({val}) out of range for a column of {n} steps.")
        return TrajectoryColumn([self._cell(index)], squeeze=True, path=self._path)

    def _cell(self, index: int) -> Any:
        if index < self._start:
            raise ValueError(
                f"history: step {index} of column {'/'.join(map(str, self._path)) or '0'} is older than the last "
                f"num_keep_alive_refs ({self._keep}) steps; raise num_keep_alive_refs to reference it."
            )
        return self._cells[index - self._start]

    def __repr__(self) -> str:
        return f"_ColumnHistory(path={self._path}, steps={len(self)})"


class TrajectoryWriter:
    """Appends steps and makes items of their slices (see the module doc); use as a context manager.

    Args:
      resolve: a function from a table name to its `Table` (the client's).
      num_keep_alive_refs: how many recent steps of each column items may reference.
      validate_items: check each item against its table's signature (shapes include the time axis).
    """

    def __init__(self, resolve: Any, num_keep_alive_refs: int, validate_items: bool = True):
        if not isinstance(num_keep_alive_refs, int) or isinstance(num_keep_alive_refs, bool) or num_keep_alive_refs < 1:
            raise ValueError(
                f"trajectory_writer: num_keep_alive_refs ({num_keep_alive_refs!r}) must be an integer >= 1."
            )
        self._resolve, self._keep, self._validate = resolve, num_keep_alive_refs, validate_items
        self._structure: Any = None
        self._columns: list[_ColumnHistory] = []
        self._partial: list | None = None
        self._steps, self._closed = 0, False

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.flush()
        self.close()

    @property
    def history(self) -> Any:
        """The columns' histories, nested as the appended steps."""
        if self._structure is None:
            raise ValueError("TrajectoryWriter.history: nothing was appended yet, so there are no columns.")
        return tf.nest.pack_sequence_as(self._structure, self._columns)

    @property
    def episode_steps(self) -> int:
        return self._steps

    @property
    def max_sequence_length(self) -> int:
        return self._keep

    def configure(self, path: Any, *, num_keep_alive_refs: int, max_chunk_length: Any = None) -> None:
        """Accepted for Reverb's API: chunking is not needed in process, and a column keeps the writer's refs."""
        del path, num_keep_alive_refs, max_chunk_length

    def append(self, data: Any, *, partial_step: bool = False) -> None:
        """Adds a step (`partial_step`: some columns now, the rest with the next append of the same step)."""
        self._check_open("append")
        flat = self._flatten(data)
        if self._partial is not None:
            for i, (old, new) in enumerate(zip(self._partial, flat)):
                if old is not None and new is not None:
                    raise ValueError(f"TrajectoryWriter.append: column {i} already has a value in this partial step.")
            flat = [old if new is None else new for old, new in zip(self._partial, flat)]
        if partial_step:
            self._partial = flat
            return
        self._partial = None
        for column, cell in zip(self._columns, flat):
            column._append(cell)
        self._steps += 1

    def _flatten(self, data: Any) -> list:
        if self._structure is None:
            self._structure = tf.nest.map_structure(lambda _: 0, data)
            paths = [p for p, _ in nest.flatten_with_joined_string_paths(data)]
            self._columns = [_ColumnHistory((p,), self._keep) for p in paths]
        try:
            tf.nest.assert_same_structure(self._structure, data, check_types=False)
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"TrajectoryWriter.append: data must have the structure of the first step appended "
                f"({self._structure}); {e}"
            ) from None
        return [None if x is None else np.array(x) for x in tf.nest.flatten(data)]

    def create_item(self, table: str, priority: float, trajectory: Any) -> None:
        """Inserts an item of `trajectory` (a nest of `TrajectoryColumn`s from `history`) into `table`."""
        self._check_open("create_item")
        leaves = tf.nest.flatten(trajectory)
        if not leaves or not all(isinstance(x, TrajectoryColumn) for x in leaves):
            raise TypeError(
                f"TrajectoryWriter.create_item: trajectory ({trajectory!r}) must be a non-empty nest of "
                "TrajectoryColumn (slices or indices of writer.history)."
            )
        columns = [leaf._column("create_item") for leaf in leaves]
        target = self._resolve(table)
        if self._validate:
            check_columns(f"TrajectoryWriter.create_item (table {table!r})", target.signature, columns)
        target._insert(Item(random.getrandbits(64), float(priority), tuple(columns)))

    def flush(self, block_until_num_items: int = 0, timeout_ms: Any = None) -> None:
        """Returns at once: every item went into its table in `create_item`."""
        if not isinstance(block_until_num_items, int) or block_until_num_items < 0:
            raise ValueError(f"flush: block_until_num_items ({block_until_num_items!r}) must be an integer >= 0.")

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Any = None) -> None:
        """Ends the episode: the history starts empty (items made so far keep their cells)."""
        self.flush(0, timeout_ms)
        self._partial = None
        self._columns = [_ColumnHistory(c._path, self._keep) for c in self._columns]
        self._steps = 0

    def close(self) -> None:
        self._closed = True

    def _check_open(self, where: str) -> None:
        if self._closed:
            raise RuntimeError(f"TrajectoryWriter.{where}: the writer is closed.")
