"""The transport's server side: a server's `Tables` served over gRPC to clients in other processes.

Three methods of one service, `tfreplay.reverb.Tables`, all carrying
`wire` messages (no generated code, no pickle):

- `Call` (unary): `info`, `insert` (one step into several tables),
  `mutate`, `reset` and `checkpoint`.
- `Sample` (a stream each way): each request asks a table for up to `n`
  draws; the answer comes before the next request is read, so one batch is
  in flight per stream.
- `Insert` (a stream each way): each request is a batch of writer items
  (`cells`: those queued when it left, each step cell sent once); each
  answer acknowledges the oldest `n` items once their tables took them in
  (or says why the oldest was refused). A stream holds at most `INSERT_WINDOW` items that are not yet
  acknowledged; beyond that it reads no more, and gRPC's flow control holds
  the writer back.

The tables run here: rate limiters, selectors and `max_times_sampled` act
as in process. A wait with no deadline wakes every `POLL` seconds to see
whether its client is still there, so a client that went away frees its
thread. Every request is checked before anything changes; a refused one
gets an error answer of its kind, which the client raises as Reverb would.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent import futures
from typing import Any, Callable, Iterator

import grpc

from tfreplay.compat.reverb.engine.items import Item, check_key, new_key
from tfreplay.compat.reverb.engine.table import MAX_DRAWS_PER_CALL, Table
from tfreplay.compat.reverb.engine.tables import Tables
from tfreplay.compat.reverb.errors import DeadlineExceededError
from tfreplay.compat.reverb.transport import cells, wire

POLL = 1.0
INSERT_WINDOW = 64
WORKERS = 256
OPTIONS = [
    *wire.MESSAGE_LIMITS,
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ("grpc.so_reuseport", 0),
]


def start(tables: Tables, host: str, port: int) -> tuple[grpc.Server, int]:
    """Serves `tables` on `host:port` (0: a free port); returns the gRPC server and the port."""
    service = _Service(tables)
    raw = {"request_deserializer": None, "response_serializer": None}
    handlers = {
        "Call": grpc.unary_unary_rpc_method_handler(service.call, **raw),
        "Sample": grpc.stream_stream_rpc_method_handler(service.sample, **raw),
        "Insert": grpc.stream_stream_rpc_method_handler(service.insert, **raw),
    }
    rpc = grpc.server(
        futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="reverb-server"),
        options=OPTIONS,
        maximum_concurrent_rpcs=WORKERS,
    )
    rpc.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(wire.SERVICE, handlers),))
    try:
        bound = rpc.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        bound = 0
    if not bound:
        rpc.stop(None)
        raise ValueError(f"Server: port ({port}) must be free on {host}; another process listens on it.")
    rpc.start()
    return rpc, bound


class _Service:
    def __init__(self, tables: Tables):
        self._tables = tables
        self._ops: dict[str, Callable] = {
            "info": self._info,
            "insert": self._insert,
            "mutate": self._mutate,
            "reset": self._reset,
            "checkpoint": self._checkpoint,
        }

    def _table(self, header: dict) -> Table:
        return self._tables.table("Server", wire.field(header, "table", str))

    def call(self, request: bytes, context: Any) -> bytes:
        try:
            header, arrays = wire.decode(request)
            op = self._ops.get(wire.field(header, "op", str))
            if op is None:
                raise wire.WireError(f"Server: op ({header['op']!r}) must be one of {sorted(self._ops)}.")
            return wire.encode(*op(header, arrays, context))
        except Exception as e:  # the boundary: every failure goes back to the client as its kind
            return wire.encode(wire.error_header(e))

    def _info(self, header: dict, arrays: list, context: Any) -> tuple:
        out: list = []
        tables = [wire.info_out(t.info, out) for t in self._tables.tables.values()]
        return {"tables": tables}, out

    def _insert(self, header: dict, arrays: list, context: Any) -> tuple:
        targets = wire.field(header, "targets", list)
        if not targets or not all(isinstance(t, list) and len(t) == 2 for t in targets):
            raise wire.WireError(f"Server: insert targets ({targets!r}) must be a non-empty list of [table, priority].")
        if not arrays:
            raise wire.WireError("Server: an insert must carry at least one array (a column).")
        tables = [(self._table({"table": name}), priority) for name, priority in targets]
        self._tables.insert_step("Client.insert", tables, arrays, lambda t, item: _patient(context, t.insert, item))
        return {}, []

    def _mutate(self, header: dict, arrays: list, context: Any) -> tuple:
        updates = wire.field(header, "updates", list)
        if not all(isinstance(u, list) and len(u) == 2 for u in updates):
            raise wire.WireError(f"Server: updates ({updates!r}) must be a list of [key, priority].")
        deletes = wire.keys(header.get("deletes"), "Server", "deletes")
        self._table(header).mutate({check_key("Server", k): p for k, p in updates}, deletes)
        return {}, []

    def _reset(self, header: dict, arrays: list, context: Any) -> tuple:
        self._table(header).reset()
        return {}, []

    def _checkpoint(self, header: dict, arrays: list, context: Any) -> tuple:
        return {"path": self._tables.checkpoint()}, []

    def sample(self, requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        for request in requests:
            try:
                draws = self._draws(request, context)
                if draws is None:
                    return  # the client went away
                out: list = []
                yield wire.encode(wire.draws_out(draws, out), out)
            except Exception as e:
                yield wire.encode(wire.error_header(e))

    def _draws(self, request: bytes, context: Any) -> list | None:
        header, _ = wire.decode(request)
        table = self._table(header)
        n, timeout = wire.field(header, "n", int), header.get("timeout")
        if not 1 <= n <= MAX_DRAWS_PER_CALL:
            raise ValueError(f"Server: n ({n}) must be in [1, {MAX_DRAWS_PER_CALL}].")
        if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0):
            raise ValueError(f"Server: timeout ({timeout!r}) must be None or a number >= 0 (seconds).")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                return table.sample_many(n, POLL if left is None else min(left, POLL))
            except DeadlineExceededError:
                if left is not None and left <= POLL:
                    raise
                if not context.is_active():
                    return None

    def insert(self, requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        window = _Window()
        threading.Thread(target=self._read_items, args=(requests, window), daemon=True).start()
        try:
            while True:
                entry = window.head(context)
                if entry is None:
                    return
                table, ticket, error = entry
                if error is None:
                    try:
                        if _patient(context, table.wait_for, ticket) is None:
                            return
                    except Exception as e:
                        error = e
                window.pop()
                done = 1 + (window.pop_done() if error is None else 0)  # the items after it already in, too
                yield wire.encode({"n": done} if error is None else dict(wire.error_header(error), n=1))
        finally:
            window.close()

    def _read_items(self, requests: Iterator[bytes], window: _Window) -> None:
        held = cells.CellsIn()
        try:
            for request in requests:
                try:
                    items = held.read(request, "Server")
                except wire.WireError:
                    return  # not a request of this format: the stream ends (its items unacknowledged fail)
                for item in items:
                    if not window.wait_room():
                        return
                    try:
                        window.put(self._enqueue(*item))
                    except Exception as e:
                        window.put((None, None, e))
        except Exception:  # the client went away mid-stream
            pass
        finally:
            window.close()

    def _enqueue(self, name: str, priority: Any, episodes: list, columns: tuple) -> tuple:
        table = self._tables.table("Server", name)
        weight = table.checked_priority(f"TrajectoryWriter.create_item (table {table.name!r})", priority)
        return table, table.enqueue(Item(new_key(), weight, columns, episodes=tuple(episodes))), None


def _patient(context: Any, wait: Callable, *args: Any) -> Any:
    """Runs `wait(*args, timeout)` again while it times out and the client is there; None once it left."""
    while True:
        try:
            wait(*args, POLL)
            return True
        except DeadlineExceededError:
            if not context.is_active():
                return None


class _Window:
    """An insert stream's items on the server, oldest first, at most `INSERT_WINDOW`."""

    def __init__(self) -> None:
        self._entries: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closed = False

    def wait_room(self) -> bool:
        with self._cond:
            while len(self._entries) >= INSERT_WINDOW and not self._closed:
                self._cond.wait()
            return not self._closed

    def put(self, entry: tuple) -> None:
        with self._cond:
            self._entries.append(entry)
            self._cond.notify_all()

    def head(self, context: Any) -> tuple | None:
        with self._cond:
            while not self._entries:
                if self._closed or not context.is_active():
                    return None
                self._cond.wait(POLL)
            return self._entries[0]

    def pop(self) -> None:
        with self._cond:
            self._entries.popleft()
            self._cond.notify_all()

    def pop_done(self) -> int:
        """Pops the oldest entries whose items are in (no error); how many."""
        with self._cond:
            n = 0
            while self._entries and self._entries[0][2] is None and self._entries[0][1].done:
                self._entries.popleft()
                n += 1
            self._cond.notify_all()
            return n

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
