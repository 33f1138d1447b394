"""`Client`: inserts, samples, priority updates, resets and writers on a server of this or another process."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import tensorflow as tf

from tfreplay.compat.reverb.engine.items import check_columns
from tfreplay.compat.reverb.engine.table import TableInfo
from tfreplay.compat.reverb.engine.tables import TableEndpoint
from tfreplay.compat.reverb.replay_sample import ReplaySample, SampleInfo
from tfreplay.compat.reverb.trajectory_writer import TrajectoryWriter
from tfreplay.compat.reverb.transport import routing


class Writer:
    """Reverb's first writer, over a `TrajectoryWriter`: `create_item(table, num_timesteps, priority)` makes an
    item of the last `num_timesteps` appended steps, every column with a time axis."""

    def __init__(self, client: Client, max_sequence_length: int, max_in_flight_items: int | None = None):
        self._writer = client.trajectory_writer(max_sequence_length, validate_items=False)
        self._writer._max_in_flight = max_in_flight_items
        self._client, self._max = client, max_sequence_length

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def append(self, data: Any) -> None:
        self._writer.append(data)

    def append_sequence(self, sequence: Any) -> None:
        """Appends each step of `sequence` (a nest whose leaves share their first dimension)."""
        lengths = {np.shape(x)[0] for x in tf.nest.flatten(sequence)}
        if len(lengths) != 1:
            raise ValueError(f"Writer.append_sequence: the leaves' first dimensions ({sorted(lengths)}) must be equal.")
        for i in range(lengths.pop()):
            self._writer.append(tf.nest.map_structure(lambda x, i=i: np.asarray(x)[i], sequence))

    def create_item(self, table: str, num_timesteps: int, priority: float) -> None:
        steps = self._writer.episode_steps
        if not isinstance(num_timesteps, int) or not 1 <= num_timesteps <= min(steps, self._max):
            raise ValueError(
                f"Writer.create_item: num_timesteps ({num_timesteps!r}) must be an integer in [1, "
                f"{min(steps, self._max)}] (the steps appended in this episode, at most max_sequence_length)."
            )
        flat = tf.nest.flatten(self._writer.history)
        columns = [h[-num_timesteps:] for h in flat]
        target = self._client._table("Writer.create_item", table)
        check_columns(
            f"Writer.create_item (table {table!r})",
            target.signature,
            [c._column("create_item") for c in columns],
            step_shapes=True,
        )
        self._writer.create_item(table, priority, columns)

    def flush(self) -> None:
        self._writer.flush()

    def close(self, retry_on_unavailable: bool = True) -> None:
        self._writer.end_episode()
        self._writer.close()


def _check_int(where: str, name: str, value: Any, low: int, high: int | None = None) -> None:
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        bound = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ValueError(f"{where}: {name} ({value!r}) must be {bound}.")


class Client:
    """A client of the `Server` at `server_address` (`"<host>:<port>"`): one of this process is called directly,
    one elsewhere over gRPC (nothing connects before the first call)."""

    def __init__(self, server_address: str):
        routing.split_address("Client", server_address)
        self._address = server_address

    @property
    def server_address(self) -> str:
        return self._address

    def __repr__(self) -> str:
        return f"Client(server_address={self._address!r})"

    def __reduce__(self) -> Any:
        return Client, (self._address,)

    def _table(self, where: str, name: str) -> TableEndpoint:
        return routing.find_table(where, self._address, name)

    def insert(self, data: Any, priorities: dict) -> None:
        """Inserts `data` (a nest) as one step into each table of `priorities` (name -> priority)."""
        if not isinstance(priorities, dict) or not priorities:
            raise ValueError(f"Client.insert: priorities ({priorities!r}) must be a non-empty dict table -> priority.")
        routing.insert("Client.insert", self._address, list(priorities.items()), tf.nest.flatten(data))

    def writer(
        self,
        max_sequence_length: int,
        delta_encoded: bool = False,
        chunk_length: Any = None,
        max_in_flight_items: Any = None,
    ) -> Writer:
        """The legacy writer (`Writer`): `create_item` waits while `max_in_flight_items` (None: no limit) of its
        items wait for their table's rate limiter. Chunking and delta encoding have no meaning in process, but
        `chunk_length` is checked as Reverb does (in [1, max_sequence_length]; None: min(10, max_sequence_length))."""
        _check_int("Client.writer", "max_sequence_length", max_sequence_length, 1)
        if chunk_length is not None:
            _check_int("Client.writer", "chunk_length", chunk_length, 1, max_sequence_length)
        if max_in_flight_items is not None:
            _check_int("Client.writer", "max_in_flight_items", max_in_flight_items, 1)
        return Writer(self, max_sequence_length, max_in_flight_items)

    def trajectory_writer(
        self, num_keep_alive_refs: int, *, get_signature_timeout_ms: Any = None, validate_items: bool = True
    ) -> TrajectoryWriter:
        """A `TrajectoryWriter` into this server's tables (signatures are read in process: no timeout applies)."""
        return TrajectoryWriter(lambda name: self._table("create_item", name), num_keep_alive_refs, validate_items)

    def structured_writer(self, configs: Sequence[Any]) -> Any:
        raise NotImplementedError(
            "Client.structured_writer is not part of tfreplay.compat.reverb; use trajectory_writer."
        )

    def sample(
        self, table: str, num_samples: int = 1, *, emit_timesteps: bool = True, unpack_as_table_signature: bool = False
    ) -> Iterator[Any]:
        """Yields `num_samples` draws (each waits for the rate limiter): lists of one `ReplaySample` per step
        (`emit_timesteps`), else one `ReplaySample` of whole columns; data flat unless unpacked as the signature."""
        target = self._table("Client.sample", table)
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"Client.sample: num_samples ({num_samples!r}) must be a positive integer.")
        signature = target.signature if unpack_as_table_signature else None
        unflatten = (lambda x: tf.nest.pack_sequence_as(signature, x)) if signature is not None else list
        for item, info in self._draws(target, num_samples):
            info = SampleInfo(*info)
            data = [c.value() for c in item.columns]
            if not emit_timesteps:
                yield ReplaySample(info, unflatten(data))
                continue
            lengths = {1 if c.squeeze else len(c.cells) for c in item.columns}
            if len(lengths) != 1 or any(c.squeeze for c in item.columns):
                raise ValueError("Client.sample: the item's columns differ in length; use emit_timesteps=False.")
            yield [ReplaySample(info, unflatten([col[t] for col in data])) for t in range(lengths.pop())]

    @staticmethod
    def _draws(target: Any, count: int) -> Iterator[tuple]:
        """`count` draws of `target`, as many per call as its rate limiter admits at once (one request to a
        server elsewhere, not one per draw)."""
        while count > 0:
            draws = target.sample_many(count)
            count -= len(draws)
            yield from draws

    def mutate_priorities(self, table: str, updates: dict | None = None, deletes: Sequence[int] | None = None) -> None:
        """Sets priorities (`updates`: key -> priority) and removes items (`deletes`); unknown keys are ignored."""
        self._table("Client.mutate_priorities", table).mutate(dict(updates or {}), list(deletes or []))

    def update_priorities(self, table: str, updates: dict) -> None:
        """`mutate_priorities(table, updates)`."""
        self.mutate_priorities(table, updates)

    def reset(self, table: str) -> None:
        """Removes every item of `table` and starts its rate limiter's counts again."""
        self._table("Client.reset", table).reset()

    def server_info(self, timeout: Any = None) -> dict[str, TableInfo]:
        """Each table's `TableInfo`, by name (`timeout`: seconds to wait for a server elsewhere to answer)."""
        return routing.connect("Client.server_info", self._address).server_info(timeout)

    def checkpoint(self) -> str:
        """Writes every table to the server's checkpointer; returns the checkpoint's path (on the server's machine)."""
        return routing.connect("Client.checkpoint", self._address).checkpoint()
