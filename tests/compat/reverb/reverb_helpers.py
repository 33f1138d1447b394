"""Helpers of the shim's own tests."""

from __future__ import annotations


def insert_ints(client, table: str, values, priorities=None) -> None:
    """One item of one squeezed int64 step per value, with the given priorities (1 each by default)."""
    with client.trajectory_writer(1) as writer:
        for i, v in enumerate(values):
            writer.append(v)
            writer.create_item(table, 1.0 if priorities is None else priorities[i], writer.history[-1])


def draw(client, table: str, n: int) -> list:
    return [int(s.data[0]) for s in client.sample(table, n, emit_timesteps=False)]
