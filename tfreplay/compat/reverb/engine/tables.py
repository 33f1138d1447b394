"""A server's tables, and what Reverb's API asks of a server and a table wherever it runs.

`Endpoint` and `TableEndpoint` are the engine's interface: `Client`,
`TFClient`, the writers and `TrajectoryDataset` call only these methods.
`Tables` and `Table` answer them in this process; the transport's
`RemoteServer` and `RemoteTable` answer them for a server in another
process, by carrying each call there. The server side of the transport
calls a `Tables` as an in-process client would, so a table behaves the same
however it is reached.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Protocol, Sequence

from tfreplay.compat.reverb.engine.checkpoints import TempDirCheckpointer
from tfreplay.compat.reverb.engine.table import Table, insert_step
from tfreplay.compat.reverb.errors import NotFoundError


class TableEndpoint(Protocol):
    """One table as its clients see it."""

    @property
    def name(self) -> str: ...

    @property
    def signature(self) -> Any: ...

    @property
    def info(self) -> Any: ...

    def checked_priority(self, where: str, priority: Any, name: str = "priority") -> float:
        """`priority` as a float; ValueError unless this table's selectors take it."""

    def sample(self, timeout: float | None = None) -> tuple:
        """One `(item, (key, probability, size, priority, times_sampled))`, waiting for the rate limiter."""

    def sample_many(self, n: int, timeout: float | None = None) -> list:
        """One draw as `sample`, then up to `n - 1` more that the rate limiter admits at once."""

    def enqueue(self, item: Any) -> Any:
        """Queues a writer's item; a ticket `wait_for` waits on."""

    def wait_for(self, ticket: Any, timeout: float | None, what: str = "insert") -> None:
        """Waits until the ticket's item is in (`DeadlineExceededError` after `timeout`)."""

    def mutate(self, updates: dict, deletes: Sequence[int]) -> None:
        """Sets priorities (`key -> priority`) and deletes keys, all or nothing."""

    def reset(self) -> None:
        """Removes every item and resets the rate limiter's counts."""


class Endpoint(Protocol):
    """A server's tables as its clients see them."""

    def table(self, where: str, name: str) -> TableEndpoint:
        """The table `name`; `NotFoundError` (naming `where`) if there is none."""

    def insert_step(self, where: str, targets: Sequence[tuple[str, Any]], values: Sequence[Any]) -> None:
        """One step into each `(table name, priority)` of `targets`, under one key, all checked first."""

    def server_info(self, timeout: Any = None) -> dict:
        """Each table's `TableInfo`, by name."""

    def checkpoint(self) -> str:
        """Writes every table to the server's checkpointer; the checkpoint's path."""


class Tables:
    """The tables one server hosts (an `Endpoint` in this process).

    Args:
      tables: one or more `Table`s of distinct names.
      checkpointer: where `checkpoint()` writes (None: a temporary directory's, made on the first call); its
        latest checkpoint, if any, is loaded into the tables of the same names first.
      where: how errors name the server (e.g. `server at port 8000`).
    """

    def __init__(self, tables: Sequence[Table] | None, checkpointer: Any = None, where: str = "server"):
        tables = list(tables or [])
        if not tables:
            raise ValueError("Server: tables ([]) must hold at least one reverb.Table.")
        for t in tables:
            if not isinstance(t, Table):
                raise TypeError(f"Server: tables holds {t!r}; each must be a reverb.Table.")
        names = collections.Counter(t.name for t in tables)
        duplicates = sorted(n for n, c in names.items() if c > 1)
        if duplicates:
            raise ValueError(f"Server: tables share the names {duplicates}; each table needs its own name.")
        self.tables = {t.name: t for t in tables}
        self.checkpointer, self.where = checkpointer, where
        if checkpointer is not None:
            checkpointer.load_latest(self.tables)

    def table(self, where: str, name: str) -> Table:
        if name not in self.tables:
            raise NotFoundError(
                f"{where}: table ({name!r}) is not on the {self.where}; its tables: {sorted(self.tables)}."
            )
        return self.tables[name]

    def insert_step(
        self, where: str, targets: Sequence[tuple[Any, Any]], values: Sequence[Any], put: Callable | None = None
    ) -> None:
        """As `Endpoint.insert_step`; a target may name its table or be one, and `put(table, item)` replaces
        the table's own waiting insert (the transport's, which notices a client that went away)."""
        resolved = [(self.table(where, t) if isinstance(t, str) else t, p) for t, p in targets]
        insert_step(where, resolved, values, put)

    def server_info(self, timeout: Any = None) -> dict:
        return {name: t.info for name, t in self.tables.items()}

    def checkpoint(self) -> str:
        if self.checkpointer is None:  # as Reverb: a temporary directory unless one was given
            self.checkpointer = TempDirCheckpointer()
        return self.checkpointer.save(self.tables)

    def close(self) -> None:
        """Closes every table: waiting calls raise, queued items are dropped, datasets end."""
        for table in self.tables.values():
            table.close()
