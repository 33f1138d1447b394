"""`Server`: tables served at `<host>:<port>` to clients in this and other processes.

A server listens on its port (all interfaces, as Reverb's; the environment
variable `TFREPLAY_REVERB_HOST` names another, e.g. `127.0.0.1`) through
the gRPC transport (`grpc_server`) and registers its tables under the port
in this process. A client given `"localhost:<port>"` (or `127.0.0.1`,
`[::]`, `0.0.0.0`) of a server in its own process calls the tables
directly, never through the network; any other address is reached over
gRPC (`grpc_client`), which is imported only then.
"""

from __future__ import annotations

import atexit
import collections
import os
import socket
import threading
import weakref
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tfreplay.compat.reverb.errors import NotFoundError, ServerStoppedError
from tfreplay.compat.reverb.table import Table, insert_step

_LOCK = threading.Lock()
_SERVERS: weakref.WeakValueDictionary[int, Server] = weakref.WeakValueDictionary()
_STOPPED: set[int] = set()  # ports of this process's stopped servers: their clients get ServerStoppedError
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "[::]", "0.0.0.0", "")


class Server:
    """Hosts `tables` and serves them on `port` (None: a free one) to this and other processes.

    Args:
      tables: one or more `Table`s of distinct names.
      port: the port it listens on and clients name in their address; None picks a free one.
      checkpointer: a `reverb.checkpointers` checkpointer: `Client.checkpoint()` writes to it, and a new server
        loads its latest checkpoint into tables of the same names.
    """

    def __init__(self, tables: Sequence[Table] | None = None, port: int | None = None, checkpointer: Any = None):
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
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
            raise ValueError(f"Server: port ({port!r}) must be None or an integer in [1, 65535].")
        with _LOCK:
            if port is not None and port in _SERVERS:
                raise ValueError(
                    f"Server: port ({port}) is taken by {_SERVERS[port]!r} in this process; stop it first."
                )
            self._tables = {t.name: t for t in tables}
            self._stopped = threading.Event()
            self.checkpointer = checkpointer
            if checkpointer is not None:
                checkpointer.load_latest(self._tables)
            from tfreplay.compat.reverb import grpc_server

            host = os.environ.get("TFREPLAY_REVERB_HOST", "[::]")
            self._rpc, self._port = grpc_server.start(self, host, port or 0)
            _SERVERS[self._port] = self
            _STOPPED.discard(self._port)

    @property
    def port(self) -> int:
        return self._port

    @property
    def tables(self) -> dict[str, Table]:
        return dict(self._tables)

    def localhost_client(self) -> Any:
        from tfreplay.compat.reverb.client import Client

        return Client(f"localhost:{self._port}")

    def _table(self, where: str, name: str) -> Table:
        """The table `name`; NotFoundError if this server has none of that name."""
        if name not in self._tables:
            raise NotFoundError(
                f"{where}: table ({name!r}) is not on the server at port {self._port}; its tables: "
                f"{sorted(self._tables)}."
            )
        return self._tables[name]

    def _server_info(self, timeout: Any = None) -> dict:
        return {name: t.info for name, t in self._tables.items()}

    def _checkpoint(self) -> str:
        """Writes every table to the checkpointer (a temporary directory's unless one was given); its path."""
        if self.checkpointer is None:  # as Reverb: a temporary directory unless one was given
            from tfreplay.compat.reverb.checkpointers import TempDirCheckpointer

            self.checkpointer = TempDirCheckpointer()
        return self.checkpointer.save(self.tables)

    def _insert_step(self, where: str, targets: Sequence[tuple[Any, Any]], values: Sequence[Any], put: Any = None):
        """One step into each `(table or name, priority)` of `targets`, under one key (see `table.insert_step`)."""
        tables = [(self._table(where, t) if isinstance(t, str) else t, p) for t, p in targets]
        insert_step(where, tables, values, put)

    def stop(self) -> None:
        """Closes every table (waiting calls raise, datasets end), stops serving and frees the port."""
        with _LOCK:
            if self._stopped.is_set():
                return
            self._stopped.set()
            if _SERVERS.get(self._port) is self:
                del _SERVERS[self._port]
                _STOPPED.add(self._port)
        for table in self._tables.values():
            table._close()
        self._rpc.stop(grace=1.0).wait(5.0)

    def wait(self) -> None:
        """Blocks until the server stops (`stop()`, from another thread or a signal handler)."""
        while not self._stopped.wait(0.5):
            pass

    def __repr__(self) -> str:
        return f"Server(port={self._port}, tables={sorted(self._tables)})"


def text(where: str, name: str, value: Any) -> Any:
    """`value` as a `str` (bytes, NumPy and eager string tensors decoded), or a graph string tensor as it is (an
    op resolves it when it runs)."""
    if isinstance(value, tf.Tensor) and not tf.executing_eagerly():
        if value.dtype != tf.string or value.shape.rank not in (0, None):
            raise TypeError(f"{where}: {name} ({value!r}) must be a string or a scalar string tensor.")
        return value
    if isinstance(value, (tf.Tensor, np.ndarray, np.generic)):
        value = value.numpy() if isinstance(value, tf.Tensor) else value
        value = value.item() if isinstance(value, (np.ndarray, np.generic)) else value
    if isinstance(value, bytes):
        value = value.decode()
    if not isinstance(value, str):
        raise TypeError(f"{where}: {name} ({value!r}) must be a string or a scalar string tensor.")
    return value


def parse_port(where: str, address: Any) -> int:
    """The port of `host:port`."""
    return split_address(where, address)[1]


def split_address(where: str, address: Any) -> tuple[str, int]:
    """`(host, port)` of `host:port`; ValueError for anything else."""
    address = text(where, "server_address", address)
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not host.strip() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{where}: server_address ({address!r}) must be '<host>:<port>', e.g. 'localhost:8000'.")
    return host, int(port)


def find_server(where: str, address: Any) -> Any:
    """The `Server` of this process at `address` when its host names this machine, else the `RemoteServer`
    that reaches it over gRPC."""
    address = text(where, "server_address", address)
    host, port = split_address(where, address)
    if host.lower() in _LOCAL_HOSTS:
        with _LOCK:
            server = _SERVERS.get(port)
        if server is not None:
            return server
        if port in _STOPPED and not _listened(port):  # else another process serves there now
            raise ServerStoppedError(f"{where}: the reverb.Server on port {port} of this process was stopped.")
    from tfreplay.compat.reverb import grpc_client

    return grpc_client.remote(address)


def find_table(where: str, address: Any, name: Any) -> Any:
    """The table `name` of the server at `address` (strings, bytes or eager tensors); NotFoundError if the server
    has no such table."""
    address, name = text(where, "server_address", address), text(where, "table", name)
    return find_server(where, address)._table(where, name)


def insert(where: str, address: Any, targets: Sequence[tuple[Any, Any]], values: Sequence[Any]) -> None:
    """One step into each `(table name, priority)` of `targets` on the server at `address`, under one key."""
    named = [(text(where, "table", name), priority) for name, priority in targets]
    find_server(where, address)._insert_step(where, named, values)


def _listened(port: int) -> bool:
    """Whether something on this machine accepts connections on `port`."""
    try:
        socket.create_connection(("localhost", port), timeout=1.0).close()
        return True
    except OSError:
        return False


@atexit.register
def _stop_all() -> None:
    """At exit, ends every wait (a dataset's thread blocked on a table would hold the interpreter)."""
    with _LOCK:
        servers = list(_SERVERS.values())
    for server in servers:
        server.stop()
