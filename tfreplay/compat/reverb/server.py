"""`Server`: tables served at `<host>:<port>` to clients in this and other processes.

A server holds its tables (the engine's `Tables`), listens on its port
through the transport's gRPC server, and registers the tables under the port
in this process: a client of `localhost:<port>` in the same process calls
them directly, any other reaches them over gRPC (`transport.routing`). It
listens on every interface, as Reverb's, unless `host` (or the environment
variable `TFREPLAY_REVERB_HOST`) names one, e.g. `127.0.0.1`.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Any, Sequence

from tfreplay.compat.reverb.client import Client
from tfreplay.compat.reverb.engine.table import Table
from tfreplay.compat.reverb.engine.tables import Tables
from tfreplay.compat.reverb.transport import routing

_LOCK = threading.Lock()
_SERVERS: weakref.WeakValueDictionary[int, Server] = weakref.WeakValueDictionary()


class Server:
    """Hosts `tables` and serves them on `port` (None: a free one) to this and other processes.

    Args:
      tables: one or more `Table`s of distinct names.
      port: the port it listens on and clients name in their address; None picks a free one.
      checkpointer: a `reverb.checkpointers` checkpointer: `Client.checkpoint()` writes to it, and a new server
        loads its latest checkpoint into tables of the same names.
      host: the interface it listens on (keyword only, not Reverb's): None listens on every interface unless
        the environment variable `TFREPLAY_REVERB_HOST` names one; `"127.0.0.1"` serves this machine only.
    """

    def __init__(
        self,
        tables: Sequence[Table] | None = None,
        port: int | None = None,
        checkpointer: Any = None,
        *,
        host: str | None = None,
    ):
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
            raise ValueError(f"Server: port ({port!r}) must be None or an integer in [1, 65535].")
        if host is not None and (not isinstance(host, str) or not host.strip()):
            raise ValueError(f"Server: host ({host!r}) must be None or an interface's address, e.g. '127.0.0.1'.")
        with _LOCK:
            if port is not None and port in _SERVERS:
                raise ValueError(
                    f"Server: port ({port}) is taken by {_SERVERS[port]!r} in this process; stop it first."
                )
            self._tables = Tables(tables, checkpointer)
            self._stopped = threading.Event()
            from tfreplay.compat.reverb.transport import server as rpc_server

            host = host or os.environ.get("TFREPLAY_REVERB_HOST", "[::]")
            self._rpc, self._port = rpc_server.start(self._tables, host, port or 0)
            self._tables.where = f"server at port {self._port}"
            _SERVERS[self._port] = self
            routing.host(self._port, self._tables)

    @property
    def port(self) -> int:
        return self._port

    @property
    def tables(self) -> dict[str, Table]:
        return dict(self._tables.tables)

    @property
    def checkpointer(self) -> Any:
        return self._tables.checkpointer

    def localhost_client(self) -> Client:
        return Client(f"localhost:{self._port}")

    def stop(self) -> None:
        """Closes every table (waiting calls raise, datasets end), stops serving and frees the port."""
        with _LOCK:
            if self._stopped.is_set():
                return
            self._stopped.set()
            if _SERVERS.get(self._port) is self:
                del _SERVERS[self._port]
            routing.unhost(self._port, self._tables)
        self._tables.close()
        self._rpc.stop(grace=1.0).wait(5.0)

    def wait(self) -> None:
        """Blocks until the server stops (`stop()`, from another thread or a signal handler)."""
        while not self._stopped.wait(0.5):
            pass

    def __repr__(self) -> str:
        return f"Server(port={self._port}, tables={sorted(self._tables.tables)})"


@atexit.register
def _stop_all() -> None:
    """At exit, ends every wait (a dataset's thread blocked on a table would hold the interpreter)."""
    with _LOCK:
        servers = list(_SERVERS.values())
    for server in servers:
        server.stop()
