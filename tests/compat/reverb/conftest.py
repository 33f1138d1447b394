"""Fixtures of the shim's own tests: `serve(*tables)` starts a server (stopped after the test) and gives a client."""

from __future__ import annotations

import pytest

from tfreplay.compat import reverb


@pytest.fixture
def serve():
    servers = []

    def start(*tables, **kwargs):
        server = reverb.Server(list(tables), **kwargs)
        servers.append(server)
        return server, server.localhost_client()

    yield start
    for server in servers:
        server.stop()
