"""The transport: which endpoint an address reaches, and gRPC between processes.

- `routing`: a client's address to this process's `Tables` or a `RemoteServer`.
- `wire`: the messages (a JSON header and raw arrays; no pickle).
- `server`: a server's `Tables` served over gRPC.
- `client`: `RemoteServer` / `RemoteTable`, the engine's interface for a server elsewhere.

gRPC is imported only when a server starts listening or a client reaches
another process (`import tfreplay` never imports it).
"""
