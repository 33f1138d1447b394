"""The transport's client side: a server in another process (or machine) seen as tables of this one.

`RemoteServer` and `RemoteTable` are the engine's `Endpoint` and
`TableEndpoint` for a server elsewhere: they answer the calls `Client`,
`TFClient`, the writers and `TrajectoryDataset` make, by carrying them to
the server at `host:port` (`transport.server`). A process holds one
`RemoteServer` (one channel) per address.

- Samples go over lockstep streams (one request, then its answer), taken
  from a pool, one per concurrent caller: a dataset's draws in flight are
  the `n` of one request.
- A writer's items go over one insert stream per server, several to a
  request: a request leaves once `SEND_ITEMS` items wait, `LINGER`
  seconds after the first of them, or at once when a `flush` waits for
  them (one request and one wake-up of gRPC's threads per item would
  cost more than the item). At most `INSERT_WINDOW` items are sent and
  not yet acknowledged, and `create_item` waits for room beyond that.
  `flush` waits for the acknowledgements.
- The first call waits for the server up to its timeout (`CONNECT_TIMEOUT`
  seconds when it has none), then raises `DeadlineExceededError`, as Reverb
  does for an address nothing answers. A server that goes away fails the
  calls in progress with `UnavailableError` (keepalive pings find a machine
  that vanished).
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any, Iterator, Sequence

import grpc
import tensorflow as tf

from tfreplay.compat.reverb import errors
from tfreplay.compat.reverb.engine.items import Item
from tfreplay.compat.reverb.engine.table import MAX_DRAWS_PER_CALL, checked_priority
from tfreplay.compat.reverb.transport import cells, wire

CONNECT_TIMEOUT = 60.0
INSERT_WINDOW = 128
BATCH_BYTES = 4 << 20  # a request of queued items stops growing past this
SEND_ITEMS = 32  # a request leaves once this many items wait...
LINGER = 0.002  # ...or this many seconds after the first of them
OPTIONS = [
    *wire.MESSAGE_LIMITS,
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]
_LOCK = threading.Lock()
_SERVERS: dict[str, RemoteServer] = {}


def remote(address: str) -> RemoteServer:
    """The process's `RemoteServer` for `address`."""
    with _LOCK:
        if address not in _SERVERS:
            _SERVERS[address] = RemoteServer(address)
        return _SERVERS[address]


def rpc_error(error: grpc.RpcError, address: str) -> Exception:
    """Reverb's error for a failed call."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    message = f"the Reverb server at {address}: {details}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.DeadlineExceededError(message)
    if code == grpc.StatusCode.CANCELLED:
        return errors.ServerStoppedError(message)
    if code == grpc.StatusCode.UNAVAILABLE:
        return errors.UnavailableError(message)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return tf.errors.ResourceExhaustedError(None, None, message)
    return tf.errors.InternalError(None, None, message)


class RemoteServer:
    """The server at `address` (`host:port`), reached over gRPC."""

    def __init__(self, address: str):
        self.address = address
        self._channel = grpc.insecure_channel(address, options=OPTIONS)
        self._unary = self._channel.unary_unary(f"/{wire.SERVICE}/Call")
        self._sample = self._channel.stream_stream(f"/{wire.SERVICE}/Sample")
        self._insert = self._channel.stream_stream(f"/{wire.SERVICE}/Insert")
        self._lock = threading.Lock()
        self._tables: dict[str, RemoteTable] = {}
        self._idle: list[_Lockstep] = []
        self._inserts: _InsertStream | None = None
        self._ready = False

    def __repr__(self) -> str:
        return f"RemoteServer({self.address!r})"

    def connect(self, timeout: float | None) -> None:
        """Waits for the server (`DeadlineExceededError` after `timeout`, None: `CONNECT_TIMEOUT` seconds)."""
        if self._ready:
            return
        timeout = CONNECT_TIMEOUT if timeout is None else timeout
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise errors.DeadlineExceededError(
                f"Client: no Reverb server answered at {self.address} within {timeout:g} s; start one there "
                "(reverb.Server(tables, port) or tfreplay-reverb-server) or check the address."
            ) from None
        self._ready = True

    def request(self, header: dict, arrays: Sequence[Any] = (), timeout: float | None = None) -> tuple:
        """One `Call`: the answer's header and arrays (its error raised)."""
        message, stale = wire.encode(header, arrays), self._ready
        self.connect(timeout)
        try:
            reply = self._unary(message, timeout=timeout)
        except grpc.RpcError as e:
            self._ready = False
            if not (stale and e.code() == grpc.StatusCode.UNAVAILABLE):
                raise rpc_error(e, self.address) from None
            self.connect(timeout)  # the server went away since the last call: wait for it (or one in its place)
            try:
                reply = self._unary(message, timeout=timeout)
            except grpc.RpcError as again:
                raise rpc_error(again, self.address) from None
        answer, out = wire.decode(reply)
        wire.raise_error(answer)
        return answer, out

    def server_info(self, timeout: Any = None) -> dict:
        answer, arrays = self.request({"op": "info"}, timeout=timeout)
        infos = {d["name"]: wire.info_in(d, arrays) for d in answer["tables"]}
        with self._lock:
            self._tables = {name: RemoteTable(self, info) for name, info in infos.items()}
        return infos

    def table(self, where: str, name: str) -> RemoteTable:
        if name not in self._tables:
            self.server_info()
        if name not in self._tables:
            raise errors.NotFoundError(
                f"{where}: table ({name!r}) is not on the server at {self.address}; its tables: {sorted(self._tables)}."
            )
        return self._tables[name]

    def checkpoint(self) -> str:
        return self.request({"op": "checkpoint"})[0]["path"]

    def insert_step(self, where: str, targets: Sequence[tuple[str, Any]], values: Sequence[Any]) -> None:
        """One step into each `(table name, priority)` of `targets`, under one key (waits for rate limiters)."""
        pairs = [[name, float(p) if isinstance(p, (int, float)) else p] for name, p in targets]
        self.request({"op": "insert", "targets": pairs}, list(values))

    def sample(self, table: str, n: int, timeout: float | None) -> list:
        self.connect(None)
        with self._lock:
            while self._idle and self._idle[-1].ended():
                self._idle.pop()  # its server stopped or went away since it was last used
            stream = self._idle.pop() if self._idle else _Lockstep(self._sample, self.address)
        try:
            answer, arrays = stream.ask(wire.encode({"table": table, "n": int(n), "timeout": timeout}))
        except BaseException:
            stream.close()
            self._ready = False
            raise
        with self._lock:
            self._idle.append(stream)
        wire.raise_error(answer)
        return wire.draws_in(answer, arrays, "Client.sample")

    def enqueue(self, table: str, item: Item) -> _Ticket:
        for column in item.columns:
            for cell in column.cells:
                wire.check_sendable(cell.dtype)
        self.connect(None)
        with self._lock:
            if self._inserts is None or self._inserts.error is not None:
                self._inserts = _InsertStream(self._insert, self.address)
            stream = self._inserts
        return stream.send(table, item)


class RemoteTable:
    """A table of a `RemoteServer`: its settings as of the last `server_info`, its calls carried there."""

    def __init__(self, server: RemoteServer, info: Any):
        self._server, self.name, self.signature, self.max_size = server, info.name, info.signature, info.max_size
        self._settings = [wire.selector_in(wire.selector_out(o)) for o in (info.sampler_options, info.remover_options)]

    @property
    def info(self) -> Any:
        return self._server.server_info()[self.name]

    def checked_priority(self, where: str, priority: Any, name: str = "priority") -> float:
        return checked_priority(where, priority, name, self.name, self._settings)

    def sample(self, timeout: float | None = None) -> tuple:
        return self.sample_many(1, timeout)[0]

    def sample_many(self, n: int, timeout: float | None = None) -> list:
        """As the engine's: one draw, then up to `n - 1` more the rate limiter admits, at most
        `MAX_DRAWS_PER_CALL` in all (one request)."""
        return self._server.sample(self.name, min(n, MAX_DRAWS_PER_CALL), timeout)

    def enqueue(self, item: Item) -> _Ticket:
        return self._server.enqueue(self.name, item)

    def wait_for(self, ticket: _Ticket, timeout: float | None, what: str = "insert") -> None:
        ticket.wait(timeout)

    def mutate(self, updates: dict, deletes: Sequence[int]) -> None:
        pairs = [[int(k), float(p) if isinstance(p, (int, float)) else p] for k, p in updates.items()]
        self._server.request(
            {"op": "mutate", "table": self.name, "updates": pairs, "deletes": [int(k) for k in deletes]}
        )

    def reset(self) -> None:
        self._server.request({"op": "reset", "table": self.name})


class _Lockstep:
    """A stream each way, one request then its answer."""

    def __init__(self, method: Any, address: str):
        self._address = address
        self._requests: queue.Queue = queue.Queue(maxsize=1)
        self._call = method(iter(self._requests.get, None))

    def ask(self, message: bytes) -> tuple:
        self._requests.put(message)
        try:
            reply = next(self._call)
        except grpc.RpcError as e:
            raise rpc_error(e, self._address) from None
        except StopIteration:
            raise errors.UnavailableError(f"the Reverb server at {self._address} ended the stream.") from None
        return wire.decode(reply)

    def ended(self) -> bool:
        return self._call.done()

    def close(self) -> None:
        self._call.cancel()
        try:
            self._requests.put_nowait(None)  # ends the request iterator gRPC's thread reads
        except queue.Full:
            pass


class _Ticket:
    """An item sent on an insert stream: `done` once its table took it in."""

    __slots__ = ("_stream", "finished", "error")

    def __init__(self, stream: _InsertStream):
        self._stream, self.finished = stream, False
        self.error: Exception | None = None

    @property
    def done(self) -> bool:
        return self.finished and self.error is None

    def wait(self, timeout: float | None) -> None:
        self._stream.wait(self, timeout)


class _InsertStream:
    """The insert stream of a `RemoteServer`: items out, acknowledgements back, oldest first."""

    def __init__(self, method: Any, address: str):
        self._address = address
        self._pending: list[tuple[str, Item]] = []  # items not sent yet, bounded by the window: send() waits for room
        self._cells = cells.CellsOut()  # used by the request iterator's thread only
        self._urgent = False  # a caller waits for the pending items: send them without lingering
        self._ended = False
        self._tickets: collections.deque[_Ticket] = collections.deque()
        self._cond = threading.Condition()
        self.error: Exception | None = None
        self._call = method(self._batches())
        threading.Thread(target=self._read, args=(self._call,), daemon=True, name="reverb-acks").start()

    def _batches(self) -> Iterator[bytes]:
        """The pending items, up to `BATCH_BYTES` a request, each request once it is due (see the module doc)."""
        full = lambda: len(self._pending) >= SEND_ITEMS or self._urgent or self._ended  # noqa: E731
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._ended)
                if self._ended:
                    return
                self._cond.wait_for(full, LINGER)
                if self._ended:
                    return
                count, size = 0, 0
                while count < len(self._pending) and size < BATCH_BYTES:
                    size += sum(c.nbytes for column in self._pending[count][1].columns for c in column.cells)
                    count += 1
                entries, self._pending = self._pending[:count], self._pending[count:]
                self._urgent = bool(self._pending) and self._urgent
            yield self._cells.encode(entries)

    def send(self, table: str, item: Item) -> _Ticket:
        with self._cond:
            while len(self._tickets) >= INSERT_WINDOW and self.error is None:
                self._urgent = True
                self._cond.notify_all()
                self._cond.wait()
            if self.error is not None:
                raise self.error
            ticket = _Ticket(self)
            self._tickets.append(ticket)
            self._pending.append((table, item))
            if len(self._pending) in (1, SEND_ITEMS):  # wakes the sender: to linger, then to send
                self._cond.notify_all()
            return ticket

    def wait(self, ticket: _Ticket, timeout: float | None) -> None:
        with self._cond:
            if not ticket.finished and self._pending:
                self._urgent = True
                self._cond.notify_all()
            if not self._cond.wait_for(lambda: ticket.finished, timeout):
                raise errors.DeadlineExceededError(
                    f"the Reverb server at {self._address} did not take the item in within {timeout:g} s."
                )
        if ticket.error is not None:
            raise ticket.error

    def _read(self, replies: Iterator[bytes]) -> None:
        try:
            for reply in replies:
                answer, _ = wire.decode(reply)
                with self._cond:
                    n = answer.get("n")
                    if not isinstance(n, int) or not 1 <= n <= len(self._tickets):
                        raise wire.WireError(f"the Reverb server at {self._address} acknowledged {n!r} items.")
                    for _ in range(n):
                        ticket = self._tickets.popleft()
                        try:
                            wire.raise_error(answer)
                        except Exception as e:
                            ticket.error = e
                        ticket.finished = True
                    self._cond.notify_all()
            failure: Exception = errors.UnavailableError(f"the Reverb server at {self._address} ended the stream.")
        except grpc.RpcError as e:
            failure = rpc_error(e, self._address)
        except Exception as e:  # an answer out of the format
            failure = e
            self._call.cancel()
        with self._cond:
            self._ended = True  # ends the request iterator gRPC's thread reads
            self.error = failure
            for ticket in self._tickets:
                ticket.error, ticket.finished = failure, True
            self._tickets.clear()
            self._cond.notify_all()
