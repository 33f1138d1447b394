"""The insert stream's items: each step cell crosses a stream once, and items name their cells by number.

A writer's items share cells (an item of the last two steps holds a cell
its neighbour holds too), as Reverb's chunks do. On each insert stream the
client (`CellsOut`) numbers a cell the first time an item holds it, sends
its value in that request only (the new cells of one dtype and shape
stacked into one array, beside an array of their numbers) and, in every
later item, only its number. It holds cells weakly: once the writer and the
queued items let one go, its number is in the next request's `forget` list
and the server (`CellsIn`) drops it from its map; the items in the tables
keep the cells they hold.

A request is one `wire` message whose header lists the `tables` it names,
the `blocks` of new cells (`[numbers array, values array]`), the `runs` of
items and the numbers to `forget`. A run is items in a row whose columns
agree in layout (`[[squeeze, cells], ...]`), as five arrays with a row per
item: table index, priority, cell numbers (every column's, in order), the
count of episodes and, flat, the episodes. A number must be new when it
comes and held when an item names it; anything else ends the stream, whose
unacknowledged items then fail on the client.
"""

from __future__ import annotations

import collections
import functools
import weakref
from typing import Any, Sequence

import numpy as np

from tfreplay.compat.reverb.engine.items import Column, Item
from tfreplay.compat.reverb.transport import wire

MAX_HELD = 1 << 22  # numbers a server holds for one stream: a client past it is refused


class CellsOut:
    """A client stream's cell numbers: `encode` turns queued items into one request."""

    def __init__(self) -> None:
        self._numbers: dict[int, tuple[int, Any]] = {}  # id(cell) -> (number, weak reference to the cell)
        self._next = 0
        self._gone: collections.deque = collections.deque()  # (id, number) of cells let go, from weakref callbacks

    def encode(self, entries: Sequence[tuple[str, Item]]) -> bytes:
        """The request for `entries` (table name, item): their new cells, their items, the numbers to forget."""
        forget = self._forgotten()
        tables: dict[str, int] = {}
        new: dict[tuple, tuple[list, list]] = {}  # (dtype, shape) -> (numbers, cells)
        runs: list = []  # [layout, table indices, priorities, cell numbers, episode counts, episodes]
        for name, item in entries:
            layout = [[column.squeeze, len(column.cells)] for column in item.columns]
            if not runs or runs[-1][0] != layout:
                runs.append([layout, [], [], [], [], []])
            run = runs[-1]
            run[1].append(tables.setdefault(name, len(tables)))
            run[2].append(item.priority)
            run[3].append([self._number(cell, new) for column in item.columns for cell in column.cells])
            run[4].append(len(item.episodes))
            run[5].extend(item.episodes)
        arrays: list = []
        blocks = []
        for numbers, cells in new.values():
            blocks.append([len(arrays), len(arrays) + 1])
            arrays += [np.array(numbers, np.int64), np.stack(cells)]
        described = []
        for layout, *values in runs:
            described.append([layout, len(arrays)])
            arrays += [np.array(v, t) for v, t in zip(values, (np.int32, np.float64, np.int64, np.int32, np.uint64))]
        header = {"tables": list(tables), "blocks": blocks, "runs": described, "forget": forget}
        return wire.encode(header, arrays)

    def _number(self, cell: np.ndarray, new: dict) -> int:
        held = self._numbers.get(id(cell))
        if held is not None and held[1]() is cell:
            return held[0]
        number, self._next = self._next, self._next + 1
        try:
            ref = weakref.ref(cell, functools.partial(_let_go, self._gone, id(cell), number))
        except TypeError:  # not an array that takes weak references: sent now, forgotten with the next request
            self._gone.append((None, number))
        else:
            self._numbers[id(cell)] = (number, ref)
        numbers, cells = new.setdefault((cell.dtype.str, cell.shape), ([], []))
        numbers.append(number)
        cells.append(cell)
        return number

    def _forgotten(self) -> list:
        out = []
        while self._gone:
            key, number = self._gone.popleft()
            if key is not None and self._numbers.get(key, (None,))[0] == number:
                del self._numbers[key]
            out.append(number)
        return out


def _let_go(gone: collections.deque, key: int, number: int, ref: Any) -> None:
    """A weak reference's callback: the cell `key` (numbered `number`) is gone (from any thread; appends only)."""
    gone.append((key, number))


class CellsIn:
    """A server stream's cells by number: `read` turns a request into its items."""

    def __init__(self) -> None:
        self._cells: dict[int, np.ndarray] = {}

    def read(self, request: bytes, where: str) -> list:
        """The request's items as `(table name, priority, episodes, columns)`; `WireError` for anything out of the
        format (the stream ends)."""
        header, arrays = wire.decode(request)
        tables = wire.field(header, "tables", list, where)
        if not all(isinstance(t, str) for t in tables):
            raise wire.WireError(f"{where}: tables ({tables!r}) must be a list of names.")
        for entry in wire.field(header, "blocks", list, where):
            self._hold(entry, arrays, where)
        items = []
        for run in wire.field(header, "runs", list, where):
            items += self._run(run, arrays, tables, where)
        for number in wire.keys(header.get("forget"), where, "forget"):
            self._cells.pop(number, None)
        return items

    def _hold(self, entry: Any, arrays: list, where: str) -> None:
        ok = isinstance(entry, list) and len(entry) == 2 and all(isinstance(i, int) for i in entry)
        if not ok or not all(0 <= i < len(arrays) for i in entry):
            raise wire.WireError(f"{where}: a block ({entry!r}) must be [numbers array, values array].")
        numbers, values = arrays[entry[0]], arrays[entry[1]]
        if numbers.dtype != np.int64 or numbers.ndim != 1 or values.ndim == 0 or len(values) != len(numbers):
            shapes = f"{numbers.dtype}{list(numbers.shape)}, {values.dtype}{list(values.shape)}"
            raise wire.WireError(f"{where}: a block needs int64[n] numbers and n values; got {shapes}.")
        if len(self._cells) + len(numbers) > MAX_HELD:
            raise wire.WireError(f"{where}: a stream may hold at most {MAX_HELD} cells; forget the ones let go.")
        for i, number in enumerate(numbers.tolist()):
            if number in self._cells:
                raise wire.WireError(f"{where}: cell number {number} is already held; a new cell needs a new number.")
            self._cells[number] = values[i, ...]  # a 0-d array for a scalar cell, not a NumPy scalar

    def _run(self, run: Any, arrays: list, tables: list, where: str) -> list:
        ok = isinstance(run, list) and len(run) == 2 and isinstance(run[0], list) and bool(run[0])
        if not ok or not isinstance(run[1], int) or not 0 <= run[1] <= len(arrays) - 5:
            raise wire.WireError(f"{where}: a run ({run!r}) must be [layout, index of its five arrays].")
        layout = run[0]
        for column in layout:
            fits = isinstance(column, list) and len(column) == 2 and isinstance(column[0], bool)
            if not fits or not isinstance(column[1], int) or column[1] < 1 or (column[0] and column[1] != 1):
                rule = "must be [squeeze, cells >= 1], with 1 cell if squeezed"
                raise wire.WireError(f"{where}: a column layout ({column!r}) {rule}.")
        index, priority, numbers, counts, episodes = arrays[run[1] : run[1] + 5]
        n, cells = len(index) if index.ndim == 1 else 0, sum(k for _, k in layout)
        kinds: list[tuple[np.ndarray, Any, tuple]] = [(index, np.int32, (n,)), (priority, np.float64, (n,))]
        kinds += [(counts, np.int32, (n,)), (numbers, np.int64, (n, cells))]
        if n < 1 or any(a.dtype != dtype or a.shape != shape for a, dtype, shape in kinds) or counts.min() < 0:
            rule = "must be i4[n], f8[n], i8[n, cells], i4[n] >= 0 and u8[episodes], n >= 1"
            raise wire.WireError(f"{where}: a run's arrays {rule}.")
        if episodes.dtype != np.uint64 or episodes.shape != (int(counts.sum()),):
            got = f"{episodes.dtype}{list(episodes.shape)}"
            raise wire.WireError(f"{where}: a run's episodes ({got}) must be u8[the sum of its counts].")
        if index.min() < 0 or index.max() >= len(tables):
            raise wire.WireError(f"{where}: a run's table indices must name one of its {len(tables)} tables.")
        items, start, ends = [], 0, np.cumsum(counts).tolist()
        episode_list = episodes.tolist()
        held = self._cells
        for t, p, row, end in zip(index.tolist(), priority.tolist(), numbers.tolist(), ends):
            columns, offset = [], 0
            for squeeze, k in layout:
                try:
                    columns.append(Column(tuple([held[c] for c in row[offset : offset + k]]), squeeze))
                except KeyError as e:
                    rule = "the stream does not hold it"
                    raise wire.WireError(f"{where}: an item names cell {e.args[0]}; {rule}.") from None
                offset += k
            items.append((tables[t], p, episode_list[start:end], tuple(columns)))
            start = end
        return items
