"""Addresses: which endpoint a client's `host:port` reaches.

A server registers its `Tables` under its port here (`host`). A client's
address whose host names this machine (`localhost`, `127.0.0.1`, `[::1]`,
`[::]`, `0.0.0.0`) and whose port a server of this process holds reaches
those tables directly, never through the network; any other address is
reached over gRPC (`transport.client`, imported only then). Table names and
addresses may be strings, bytes or string tensors (`text`).
"""

from __future__ import annotations

import socket
import threading
import weakref
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tfreplay.compat.reverb.engine.tables import Endpoint, TableEndpoint, Tables
from tfreplay.compat.reverb.errors import ServerStoppedError

_LOCK = threading.Lock()
_HOSTED: weakref.WeakValueDictionary[int, Tables] = weakref.WeakValueDictionary()
_STOPPED: set[int] = set()  # ports of this process's stopped servers: their clients get ServerStoppedError
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "[::]", "0.0.0.0", "")


def host(port: int, tables: Tables) -> None:
    """Makes `tables` what this process's clients of `localhost:<port>` reach."""
    with _LOCK:
        _HOSTED[port] = tables
        _STOPPED.discard(port)


def unhost(port: int, tables: Tables) -> None:
    """Ends `host(port, tables)`: this process's clients of that port get `ServerStoppedError` until another
    server (of this or another process) listens there."""
    with _LOCK:
        if _HOSTED.get(port) is tables:
            del _HOSTED[port]
            _STOPPED.add(port)


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


def split_address(where: str, address: Any) -> tuple[str, int]:
    """`(host, port)` of `host:port`; ValueError for anything else."""
    address = text(where, "server_address", address)
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not host.strip() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{where}: server_address ({address!r}) must be '<host>:<port>', e.g. 'localhost:8000'.")
    return host, int(port)


def connect(where: str, address: Any) -> Endpoint:
    """The endpoint `address` reaches: this process's tables at that port, or the `RemoteServer` there."""
    address = text(where, "server_address", address)
    host, port = split_address(where, address)
    if host.lower() in LOCAL_HOSTS:
        with _LOCK:
            tables = _HOSTED.get(port)
        if tables is not None:
            return tables
        if port in _STOPPED and not _listened(port):  # else another process serves there now
            raise ServerStoppedError(f"{where}: the reverb.Server on port {port} of this process was stopped.")
    from tfreplay.compat.reverb.transport import client

    return client.remote(address)


def find_table(where: str, address: Any, name: Any) -> TableEndpoint:
    """The table `name` of the server at `address`; NotFoundError if the server has no such table."""
    address, name = text(where, "server_address", address), text(where, "table", name)
    return connect(where, address).table(where, name)


def insert(where: str, address: Any, targets: Sequence[tuple[Any, Any]], values: Sequence[Any]) -> None:
    """One step into each `(table name, priority)` of `targets` on the server at `address`, under one key."""
    named = [(text(where, "table", name), priority) for name, priority in targets]
    connect(where, address).insert_step(where, named, values)


def _listened(port: int) -> bool:
    """Whether something on this machine accepts connections on `port`."""
    try:
        socket.create_connection(("localhost", port), timeout=1.0).close()
        return True
    except OSError:
        return False
