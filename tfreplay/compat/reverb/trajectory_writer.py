"""`TrajectoryWriter`: steps appended column by column, items made of slices of them.

`append(step)` gives each leaf of the step (a nest) a column of its own, by
its path: a field first seen in a later step gets a new column whose earlier
steps are `None`, and a step may leave fields out (`None` there too). A
column keeps the dtype and shape of its first value; another is refused.
`append(..., partial_step=True)` opens a step that later appends fill in,
until one without the flag closes it. `history` is the nest of column
histories, which index (`h[-1]`: one step, squeezed) and slice (`h[-3:]`: a
time axis) into `TrajectoryColumn`s.

`create_item(table, priority, trajectory)` checks the item and queues it on
its table, which takes it in as soon as its rate limiter admits it (at once
when it does): `create_item` does not wait, and `flush` waits until the
writer's items are in (`DeadlineExceededError` after `timeout_ms`; the items
stay queued). Only the last `num_keep_alive_refs` steps of each column can
be referenced; older cells are let go, freed when no item holds them.
`end_episode` starts a new episode (and, with `clear_buffers`, an empty
history) and flushes.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Sequence

import numpy as np
import tensorflow as tf

from tfreplay.compat.reverb.engine import columns as structure
from tfreplay.compat.reverb.engine.columns import path_name
from tfreplay.compat.reverb.engine.items import Column, Item, check_columns, new_key
from tfreplay.compat.reverb.errors import DeadlineExceededError


class TrajectoryColumn:
    """Cells of one column picked from a history (`squeeze`: one step without a time axis)."""

    def __init__(self, cells: list, *, squeeze: bool = False, path: tuple = ()):
        if squeeze and len(cells) != 1:
            raise ValueError(f"TrajectoryColumn: squeeze needs exactly one cell; got {len(cells)}.")
        self._cells, self._squeeze, self._path = list(cells), squeeze, path
        self._episodes: tuple = (None,) * len(self._cells)  # the writer episode of each cell, where known

    @classmethod
    def _of(cls, cells: list, episodes: Sequence, *, squeeze: bool = False, path: tuple = ()) -> TrajectoryColumn:
        column = cls(cells, squeeze=squeeze, path=path)
        column._episodes = tuple(episodes)
        return column

    def __len__(self) -> int:
        return len(self._cells)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cells)

    def __getitem__(self, val: Any) -> TrajectoryColumn:
        if self._squeeze:
            raise TypeError("TrajectoryColumn: a squeezed column (one step, no time axis) cannot be indexed.")
        if isinstance(val, slice):
            return TrajectoryColumn._of(self._cells[val], self._episodes[val], path=self._path)
        return TrajectoryColumn._of([self._cells[val]], [self._episodes[val]], squeeze=True, path=self._path)

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
        if not self._cells or type(None) in map(type, self._cells):
            raise ValueError(
                f"TrajectoryColumn.{where}: column {path_name(self._path)} has "
                f"{'no cells' if not self._cells else 'steps with no value (None)'}; an item needs a value in each."
            )
        return Column(tuple(self._cells), self._squeeze)


class _ColumnHistory:
    """One column's cells since the history was last cleared: the last `keep` are held, older ones let go. The
    column's dtype and shape are its first value's."""

    def __init__(self, path: tuple, keep: int, padding: int = 0):
        self._path, self._keep = path, keep
        self._start = 0
        self._cells: list = []
        self._episodes: list = []
        self._spec: tuple | None = None
        for _ in range(padding):
            self._append(None, None)

    def _check(self, cell: np.ndarray) -> None:
        if self._spec is not None and (cell.dtype, cell.shape) != self._spec:
            raise ValueError(
                f"TrajectoryWriter.append: field {path_name(self._path)} (dtype {cell.dtype}, shape {cell.shape}) "
                f"must keep the dtype ({self._spec[0]}) and shape {self._spec[1]} of its first value; append the "
                "same kind of value in every step."
            )

    def _append(self, cell: Any, episode: Any) -> None:
        if cell is not None and self._spec is None:
            self._spec = (cell.dtype, cell.shape)
        self._cells.append(cell)
        self._episodes.append(None if cell is None else episode)
        if len(self._cells) > self._keep:
            del self._cells[0], self._episodes[0]
            self._start += 1

    def _set_last(self, cell: Any, episode: Any) -> None:
        if self._spec is None:
            self._spec = (cell.dtype, cell.shape)
        self._cells[-1], self._episodes[-1] = cell, episode

    def _last_is_set(self) -> bool:
        return bool(self._cells) and self._cells[-1] is not None

    def _clear(self) -> None:
        self._start, self._cells, self._episodes = 0, [], []

    def __len__(self) -> int:
        return self._start + len(self._cells)

    def __getitem__(self, val: Any) -> TrajectoryColumn:
        n = len(self)
        if isinstance(val, slice):
            if val.step not in (None, 1):
                raise ValueError(f"history: a slice step ({val.step}) is not supported; use a contiguous slice.")
            start, stop, _ = val.indices(n)
            if start < stop:
                self._cell(start)  # held, or the error that says how far back items may reach
            held = slice(max(start - self._start, 0), max(stop - self._start, 0))
            return TrajectoryColumn._of(self._cells[held], self._episodes[held], path=self._path)
        index = int(val) + n if int(val) < 0 else int(val)
        if not 0 <= index < n:
            raise IndexError(f"history: index ({val}) out of range for a column of {n} steps.")
        cell = self._cell(index)
        return TrajectoryColumn._of([cell], [self._episodes[index - self._start]], squeeze=True, path=self._path)

    def _cell(self, index: int) -> Any:
        if index < self._start:
            raise ValueError(
                f"history: step {index} of column {path_name(self._path)} is older than the last "
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
      max_in_flight_items: `create_item` waits while this many of the writer's items wait for their table's rate
        limiter (None: it never waits).
    """

    def __init__(
        self, resolve: Any, num_keep_alive_refs: int, validate_items: bool = True, max_in_flight_items: Any = None
    ):
        if not isinstance(num_keep_alive_refs, int) or isinstance(num_keep_alive_refs, bool) or num_keep_alive_refs < 1:
            raise ValueError(
                f"trajectory_writer: num_keep_alive_refs ({num_keep_alive_refs!r}) must be an integer >= 1."
            )
        self._resolve, self._keep, self._validate = resolve, num_keep_alive_refs, validate_items
        self._max_in_flight = max_in_flight_items
        self._structure: Any = None
        self._index: dict[tuple, int] = {}  # field path -> column number
        self._last: tuple | None = None  # (a step's structure, its leaves' columns): a step alike skips the union
        self._history: Any = None  # `history`, until a column is added
        self._targets: dict[str, Any] = {}  # table name -> the table it resolved to
        self._columns: list[_ColumnHistory] = []
        self._open, self._closed = False, False
        self._steps = 0  # steps closed since the episode began
        self._episode = new_key()
        self._in_flight: list = []  # (table, ticket) of items not yet confirmed in

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.flush()
        self.close()

    @property
    def history(self) -> Any:
        """The columns' histories, nested as the union of the appended steps."""
        if not self._columns:
            raise ValueError("TrajectoryWriter.history: nothing was appended yet, so there are no columns.")
        if self._history is None:
            ordered = [self._columns[self._index[p]] for p in structure.paths(self._structure)]
            self._history = tf.nest.pack_sequence_as(self._structure, ordered)
        return self._history

    @property
    def episode_steps(self) -> int:
        """The steps appended since the episode began (an open partial step not yet counted), as Reverb's."""
        return self._steps

    @property
    def max_sequence_length(self) -> int:
        return self._keep

    def configure(self, path: Any, *, num_keep_alive_refs: int, max_chunk_length: Any = None) -> None:
        """Accepted for Reverb's API: chunking is not needed in process, and a column keeps the writer's refs."""
        del path, num_keep_alive_refs, max_chunk_length

    def append(self, data: Any, *, partial_step: bool = False) -> None:
        """Adds a step (`partial_step`: some fields now, the rest with later appends of the same step)."""
        self._check_open("append")
        alike = self._alike(data)
        if alike:  # the last step's fields again (the common case): no structure work
            grown, added, index = self._structure, list[tuple](), self._index
            cells: list = [None] * len(index)
            for column, x in zip(self._last[1], tf.nest.flatten(data)):  # type: ignore[index]
                cells[column] = None if x is None else np.array(x)
        else:
            grown, added = self._grown(data)
            index = {**self._index, **{path: len(self._index) + i for i, path in enumerate(added)}}
            cells = [None if x is None else np.array(x) for x in structure.flatten_into(index, data)]
        for column, cell in zip(self._columns, cells):  # the new columns take any first value
            if cell is not None:
                self._check_cell(column, cell)
        steps = len(self._columns[0]) if self._columns else 0  # the history's steps, an open one included
        if not alike:
            self._last = (structure.skeleton(data), [index[path] for path in structure.paths(data)])
        if added:
            self._history = None
        self._structure, self._index = grown, index
        self._columns += [_ColumnHistory(path, self._keep, padding=steps) for path in added]
        for column, cell in zip(self._columns, cells):
            if not self._open:
                column._append(cell, self._episode)
            elif cell is not None:
                column._set_last(cell, self._episode)
        self._open = partial_step
        self._steps += not partial_step

    def _alike(self, data: Any) -> bool:
        """Whether `data` has the last step's structure (the same fields, in the same kinds of nests)."""
        if self._last is None:
            return False
        try:
            tf.nest.assert_same_structure(self._last[0], data, check_types=True)
        except (ValueError, TypeError):
            return False
        return True

    def _grown(self, data: Any) -> tuple[Any, list]:
        """The structure grown by `data`'s fields, and the paths of the fields that are new."""
        step = structure.skeleton(data)
        grown = step if not self._index else structure.union("TrajectoryWriter.append", self._structure, step)
        added = [path for path in structure.paths(data) if path not in self._index]
        return grown, added

    def _check_cell(self, column: _ColumnHistory, cell: np.ndarray) -> None:
        if self._open and column._last_is_set():
            raise ValueError(
                f"TrajectoryWriter.append: field {path_name(column._path)} already has a value in this partial "
                "step; leave it out (or None) until the step is closed with partial_step=False."
            )
        column._check(cell)

    def create_item(self, table: str, priority: float, trajectory: Any) -> None:
        """Queues an item of `trajectory` (a nest of `TrajectoryColumn`s from `history`) on `table`; it goes in
        when the table's rate limiter admits it (at once if it does). Checks it first: a refused item changes
        nothing."""
        self._check_open("create_item")
        leaves = tf.nest.flatten(trajectory)
        if not leaves or not all(isinstance(x, TrajectoryColumn) for x in leaves):
            raise TypeError(
                f"TrajectoryWriter.create_item: trajectory ({trajectory!r}) must be a non-empty nest of "
                "TrajectoryColumn (slices or indices of writer.history)."
            )
        columns = [leaf._column("create_item") for leaf in leaves]
        target = self._targets.get(table) if isinstance(table, str) else None
        if target is None:
            target = self._resolve(table)  # found once per table name (a server elsewhere keeps its connection)
            if isinstance(table, str):
                self._targets[table] = target
        weight = target.checked_priority(f"TrajectoryWriter.create_item (table {table!r})", priority)
        if self._validate:
            check_columns(f"TrajectoryWriter.create_item (table {table!r})", target.signature, columns)
        ids: set = set()
        for leaf in leaves:
            ids.update(leaf._episodes)
        ids.discard(None)
        episodes = tuple(sorted(ids))
        ticket = target.enqueue(Item(new_key(), weight, tuple(columns), episodes=episodes))
        self._in_flight.append((target, ticket))
        if self._max_in_flight is not None:
            self._wait_in_flight(self._max_in_flight, None, "create_item")

    def flush(self, block_until_num_items: int = 0, timeout_ms: Any = None) -> None:
        """Waits until at most `block_until_num_items` of this writer's items wait for their table's rate limiter;
        `DeadlineExceededError` after `timeout_ms` milliseconds (None or negative: no limit), the items still
        queued."""
        if not isinstance(block_until_num_items, int) or block_until_num_items < 0:
            raise ValueError(f"flush: block_until_num_items ({block_until_num_items!r}) must be an integer >= 0.")
        if timeout_ms is not None and (not isinstance(timeout_ms, (int, np.integer)) or isinstance(timeout_ms, bool)):
            raise ValueError(f"flush: timeout_ms ({timeout_ms!r}) must be None or an integer (milliseconds).")
        timeout = None if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000.0
        self._wait_in_flight(block_until_num_items, timeout, "flush")

    def _wait_in_flight(self, most: int, timeout: float | None, where: str) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._in_flight = [(table, ticket) for table, ticket in self._in_flight if not ticket.done]
            if len(self._in_flight) <= most:
                return
            table, ticket = self._in_flight[0]
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                table.wait_for(ticket, left, "insert")
            except DeadlineExceededError:
                raise DeadlineExceededError(
                    f"TrajectoryWriter.{where}: {len(self._in_flight)} items were not taken in by their tables' rate "
                    f"limiters within {timeout_ms_text(timeout)}; they stay queued and go in once admitted."
                ) from None

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Any = None) -> None:
        """Starts a new episode (with `clear_buffers`, an empty history; items made keep their cells), then
        flushes (`DeadlineExceededError` after `timeout_ms`, the episode ended all the same)."""
        self._episode, self._steps = new_key(), 0
        if clear_buffers:
            self._open = False
            for column in self._columns:
                column._clear()
        self.flush(0, timeout_ms)

    def close(self) -> None:
        self._closed = True

    def _check_open(self, where: str) -> None:
        if self._closed:
            raise RuntimeError(f"TrajectoryWriter.{where}: the writer is closed.")


def timeout_ms_text(timeout: float | None) -> str:
    return "no limit" if timeout is None else f"{timeout * 1000:g} ms"
