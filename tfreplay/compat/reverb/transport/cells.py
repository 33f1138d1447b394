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
the `blocks` of new cells (`[numbers array, values array]`), the `items`
(`[table index, priority, episodes, [[squeeze, [numbers]], ...]]`) and the
numbers to `forget`. A number must be new when it comes and held when an
item names it; anything else ends the stream, whose unacknowledged items
then fail on the client.
"""

from __future__ import annotations

import collections
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
        items = []
        for name, item in entries:
            columns = [[column.squeeze, [self._number(cell, new) for cell in column.cells]] for column in item.columns]
            items.append([tables.setdefault(name, len(tables)), item.priority, list(item.episodes), columns])
        arrays: list = []
        blocks = []
        for numbers, cells in new.values():
            blocks.append([len(arrays), len(arrays) + 1])
            arrays += [np.array(numbers, np.int64), np.stack(cells)]
        header = {"tables": list(tables), "blocks": blocks, "items": items, "forget": forget}
        return wire.encode(header, arrays)

    def _number(self, cell: np.ndarray, new: dict) -> int:
        held = self._numbers.get(id(cell))
        if held is not None and held[1]() is cell:
            return held[0]
        number, self._next = self._next, self._next + 1
        gone = self._gone
        try:
            ref = weakref.ref(cell, lambda _, key=id(cell), n=number: gone.append((key, n)))
        except TypeError:  # not an array that takes weak references: sent now, forgotten with the next request
            gone.append((None, number))
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


class CellsIn:
    """A server stream's cells by number: `read` turns a request into its items."""

    def __init__(self) -> None:
        self._cells: dict[int, np.ndarray] = {}

    def read(self, request: bytes, where: str) -> list:
        """The request's items as `(table name, priority, episodes, columns)`; `WireError` for anything out of the
        format (the stream ends)."""
        header, arrays = wire.decode(request)
        tables = wire.field(header, "tables", list, where)
        for entry in wire.field(header, "blocks", list, where):
            self._hold(entry, arrays, where)
        items = [self._item(entry, tables, where) for entry in wire.field(header, "items", list, where)]
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

    def _item(self, entry: Any, tables: list, where: str) -> tuple:
        ok = isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], int) and isinstance(entry[3], list)
        if not ok or not 0 <= entry[0] < len(tables) or not isinstance(tables[entry[0]], str) or not entry[3]:
            raise wire.WireError(f"{where}: an item ({entry!r}) must be [table index, priority, episodes, columns].")
        columns = []
        for column in entry[3]:
            if not (isinstance(column, list) and len(column) == 2 and isinstance(column[1], list) and column[1]):
                raise wire.WireError(f"{where}: a column ({column!r}) must be [squeeze, [cell numbers]].")
            squeeze, numbers = column
            if not isinstance(squeeze, bool) or (squeeze and len(numbers) != 1):
                raise wire.WireError(f"{where}: a column ({column!r}) is squeezed (true) only with one cell.")
            try:
                columns.append(Column(tuple(self._cells[n] for n in numbers), squeeze))
            except (KeyError, TypeError):
                raise wire.WireError(f"{where}: a column ({column!r}) names a cell the stream does not hold.") from None
        return tables[entry[0]], entry[1], wire.keys(entry[2], where, "episodes"), tuple(columns)
