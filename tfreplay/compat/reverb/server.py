"""`Server`: tables in this process, reached by clients at `localhost:<port>`.

A server registers its tables under its port in this process; a `Client`,
`TFClient`, writer or dataset given `"localhost:<port>"` (or `127.0.0.1`,
`[::]`, `0.0.0.0`) finds them there. Nothing listens on the port: a client
in another process cannot reach it. The port is one the system reports free
when the server starts, so addresses look as Reverb's do.
"""

from __future__ import annotations

import atexit
import collections
import socket
import threading
import weakref
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tfreplay.compat.reverb.errors import NotFoundError
from tfreplay.compat.reverb.table import Table

_LOCK = threading.Lock()
_SERVERS: weakref.WeakValueDictionary[int, Server] = weakref.WeakValueDictionary()
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "[::]", "0.0.0.0", "")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


class Server:
    """Hosts `tables` in this process under `port` (None: a free one).

    Args:
      tables: one or more `Table`s of distinct names.
      port: the port clients name in their address; None picks a free one.
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
        with _LOCK:
            if port is None:
                port = _free_port()
                while port in _SERVERS:
                    port = _free_port()
            elif not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
                raise ValueError(f"Server: port ({port!r}) must be None or an integer in [1, 65535].")
            elif port in _SERVERS:
                raise ValueError(
                    f"Server: port ({port}) is taken by {_SERVERS[port]!r} in this process; stop it first."
                )
            self._tables = {t.name: t for t in tables}
            self._port = port
            self._stopped = False
            self.checkpointer = checkpointer
            if checkpointer is not None:
                checkpointer.load_latest(self._tables)
            _SERVERS[port] = self

    @property
    def port(self) -> int:
        return self._port

    @property
    def tables(self) -> dict[str, Table]:
        return dict(self._tables)

    def localhost_client(self) -> Any:
        from tfreplay.compat.reverb.client import Client

        return Client(f"localhost:{self._port}")

    def stop(self) -> None:
        """Closes every table (waiting calls raise, datasets end) and frees the port."""
        with _LOCK:
            if self._stopped:
                return
            self._stopped = True
            if _SERVERS.get(self._port) is self:
                del _SERVERS[self._port]
        for table in self._tables.values():
            table._close()

    def wait(self) -> None:
        """Returns at once: an in-process server has nothing to serve between calls."""

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
    """The port of `host:port`, where host names this machine."""
    address = text(where, "server_address", address)
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"{where}: server_address ({address!r}) must be 'localhost:<port>'.")
    host, _, port = address.rpartition(":")
    if host.lower() not in _LOCAL_HOSTS or not port.isdigit():
        raise ValueError(
            f"{where}: server_address ({address!r}) must be 'localhost:<port>' of a Server in this process; "
            "tfreplay.compat.reverb serves no other process or machine."
        )
    return int(port)


def find_server(where: str, address: Any) -> Server:
    port = parse_port(where, address)
    with _LOCK:
        server = _SERVERS.get(port)
    if server is None:
        raise ValueError(
            f"{where}: no reverb.Server runs on port {port} in this process (server_address {address!r}); "
            "start one with reverb.Server(tables, port) first."
        )
    return server


def find_table(where: str, address: Any, name: Any) -> Table:
    """The table `name` of the server at `address` (strings, bytes or eager tensors); NotFoundError if the server
    has no such table."""
    address, name = text(where, "server_address", address), text(where, "table", name)
    tables = find_server(where, address)._tables
    if name not in tables:
        raise NotFoundError(
            f"{where}: table ({name!r}) is not on the server at {address}; its tables: {sorted(tables)}."
        )
    return tables[name]


@atexit.register
def _stop_all() -> None:
    """At exit, ends every wait (a dataset's thread blocked on a table would hold the interpreter)."""
    with _LOCK:
        servers = list(_SERVERS.values())
    for server in servers:
        server.stop()
