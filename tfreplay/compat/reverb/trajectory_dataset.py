"""`TrajectoryDataset`: a `tf.data.Dataset` of a table's samples, `ReplaySample(info, data)`.

Each iterator draws items one at a time from the table (in tf.data's own
threads, through `tf.data.Dataset.from_generator`), waiting for the rate
limiter as a sample would: a call waits for one item, then takes up to
`max_in_flight_samples_per_worker` more that the rate limiter admits at once
(Reverb's samples in flight; items of varying shape come one per call), and
hands them to tf.data as one batch, unbatched. A wait returns to tf.data
every `POLL` seconds with an empty batch, so that an iterator deleted while
its threads wait (the table empty) is not held up by them. With `rate_limiter_timeout_ms >= 0` the first
wait that runs out ends the iterator (end of sequence), as does
`max_samples` draws or a stopped server. A drawn item whose columns do not
match `dtypes` / `shapes` stops the iterator with `InvalidArgumentError`.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops

from tfreplay.compat.reverb.errors import DeadlineExceededError, ServerStoppedError, SignatureError
from tfreplay.compat.reverb.replay_sample import ReplaySample, SampleInfo
from tfreplay.compat.reverb.transport import routing

POLL = 0.1  # seconds a draw waits before handing tf.data a placeholder (see the module doc)


def _tuples(structure: Any) -> Any:
    """Lists become tuples (tf.data's nests hold no lists), as Reverb's dataset does."""
    if isinstance(structure, list):
        return tuple(_tuples(x) for x in structure)
    if isinstance(structure, dict):
        return type(structure)((k, _tuples(v)) for k, v in structure.items())
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        return type(structure)(*[_tuples(x) for x in structure])
    if isinstance(structure, tuple):
        return tuple(_tuples(x) for x in structure)
    return structure


def _check_count(name: str, value: Any, allow_auto: bool = True) -> int:
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not ok or not (value >= 1 or (allow_auto and value == -1)):
        rule = "a positive integer or -1" if allow_auto else "a positive integer"
        raise ValueError(f"TrajectoryDataset: {name} ({value!r}) must be {rule}.")
    return int(value)


class TrajectoryDataset(dataset_ops.DatasetSource):
    """Samples of `table` on the server at `server_address`, with data of `dtypes` and `shapes` (nests).

    Args:
      server_address: `"<host>:<port>"` of a `Server` (a string or a string tensor).
      table: the table's name (a string or a string tensor: a graph tensor, inside `interleave` say, is looked up
        when the dataset is iterated; a string now, NotFoundError if the server has no such table).
      dtypes, shapes: the data's nest of dtypes and of shapes (a time axis first for sequence columns).
      max_in_flight_samples_per_worker: a positive integer (validated; items are drawn as the iterator asks).
      num_workers_per_iterator, max_samples_per_stream: a positive integer or -1 (validated, not used).
      rate_limiter_timeout_ms: -1 waits for the rate limiter without end; else the iterator ends after a wait
        of this many milliseconds.
      max_samples: the iterator ends after this many samples (-1: never).
    """

    def __init__(
        self,
        server_address: Any,
        table: Any,
        dtypes: Any,
        shapes: Any,
        max_in_flight_samples_per_worker: int,
        num_workers_per_iterator: int = -1,
        max_samples_per_stream: int = -1,
        rate_limiter_timeout_ms: int = -1,
        max_samples: int = -1,
    ):
        try:
            tf.nest.assert_same_structure(dtypes, shapes, check_types=False)
        except (ValueError, TypeError) as e:
            raise ValueError(f"TrajectoryDataset: dtypes and shapes must have the same structure; {e}") from None
        _check_count("max_in_flight_samples_per_worker", max_in_flight_samples_per_worker, allow_auto=False)
        _check_count("num_workers_per_iterator", num_workers_per_iterator)
        _check_count("max_samples_per_stream", max_samples_per_stream)
        max_samples = _check_count("max_samples", max_samples)
        if not isinstance(rate_limiter_timeout_ms, (int, np.integer)) or rate_limiter_timeout_ms < -1:
            raise ValueError(
                f"TrajectoryDataset: rate_limiter_timeout_ms ({rate_limiter_timeout_ms!r}) must be an integer >= -1."
            )
        address = routing.text("TrajectoryDataset", "server_address", server_address)
        name = routing.text("TrajectoryDataset", "table", table)
        if isinstance(address, str) and isinstance(name, str):  # graph tensors: found when iterated
            routing.find_table("TrajectoryDataset", address, name)  # a wrong address or table fails here
        specs = tf.nest.map_structure(
            lambda d, s: tf.TensorSpec(tf.TensorShape(s), tf.as_dtype(d)), _tuples(dtypes), _tuples(shapes)
        )
        info = SampleInfo(*[tf.TensorSpec([], d) for d in SampleInfo.tf_dtypes()])
        timeout = None if rate_limiter_timeout_ms < 0 else rate_limiter_timeout_ms / 1000.0
        fixed = all(s.shape.is_fully_defined() for s in tf.nest.flatten(specs))
        per_call = int(max_in_flight_samples_per_worker) if fixed else 1  # items of varying shape: one at a time
        draw = _Draws(specs, timeout, max_samples, per_call)
        batched = tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape], s.dtype), ReplaySample(info, specs))
        self._inner = tf.data.Dataset.from_generator(draw, output_signature=batched, args=(address, name)).unbatch()
        self._element_spec = self._inner.element_spec
        super().__init__(self._inner._variant_tensor)

    @property
    def element_spec(self) -> Any:
        return self._element_spec

    @classmethod
    def from_table_signature(
        cls,
        server_address: str,
        table: str,
        max_in_flight_samples_per_worker: int,
        num_workers_per_iterator: int = -1,
        max_samples_per_stream: int = -1,
        rate_limiter_timeout_ms: int = -1,
        get_signature_timeout_secs: Any = None,
        max_samples: int = -1,
    ) -> TrajectoryDataset:
        """A dataset whose dtypes and shapes are the table's signature (which it must have)."""
        signature = routing.find_table("TrajectoryDataset.from_table_signature", server_address, table).signature
        if signature is None:
            raise ValueError(
                f"TrajectoryDataset.from_table_signature: table ({table!r}) has no signature; give the Table a "
                "signature= or build the dataset with explicit dtypes and shapes."
            )
        dtypes = tf.nest.map_structure(lambda s: s.dtype, signature)
        shapes = tf.nest.map_structure(lambda s: s.shape, signature)
        return cls(
            server_address,
            table,
            dtypes,
            shapes,
            max_in_flight_samples_per_worker,
            num_workers_per_iterator,
            max_samples_per_stream,
            rate_limiter_timeout_ms,
            max_samples,
        )


class _Draws:
    """The generator function: each call (one per iterator) draws batches from the table until an end."""

    def __init__(self, specs: Any, timeout: float | None, max_samples: int, per_call: int):
        self.specs, self.timeout, self.max_samples, self.per_call = specs, timeout, max_samples, per_call
        self.checked: set = set()  # the (dtype, shape)s of each column of items that matched the specs

    def __call__(self, address: bytes, name: bytes) -> Iterator[ReplaySample]:
        try:
            table = routing.find_table("TrajectoryDataset", address, name)
        except ServerStoppedError:
            return  # the server was stopped before this iterator began
        self.table = table.name
        flat_specs = tf.nest.flatten(self.specs)
        empty = self._batch([], flat_specs)
        count, deadline = 0, None if self.timeout is None else time.monotonic() + self.timeout
        while self.max_samples < 0 or count < self.max_samples:
            left = None if deadline is None else deadline - time.monotonic()
            n = self.per_call if self.max_samples < 0 else min(self.per_call, self.max_samples - count)
            try:
                draws = table.sample_many(n, POLL if left is None else max(min(POLL, left), 0.0))
            except ServerStoppedError:
                return
            except DeadlineExceededError:
                if left is not None and left <= POLL:
                    return  # the user's timeout ran out: the end of the sequence, as Reverb
                yield empty
                continue
            count += len(draws)
            deadline = None if self.timeout is None else time.monotonic() + self.timeout
            yield self._batch(draws, flat_specs)

    def _batch(self, draws: list, specs: list) -> ReplaySample:
        for item, _ in draws:
            self._check(item, specs)
        columns = []
        stacked = getattr(draws, "stacked", None)  # a remote table's answer: one array per column already
        for i, spec in enumerate(specs):  # the draws' columns agree in shape: several draws need fixed shapes
            if not draws:
                columns.append(np.zeros([0] + [d or 0 for d in spec.shape.as_list()], spec.dtype.as_numpy_dtype))
            elif stacked is not None:
                columns.append(stacked[i])
            else:
                cells = [cell for item, _ in draws for cell in item.columns[i].cells]
                columns.append(np.stack(cells).reshape((len(draws),) + draws[0][0].columns[i].shape()))
        infos = [info for _, info in draws]
        fields = [np.array([x[j] for x in infos], d.as_numpy_dtype) for j, d in enumerate(SampleInfo.tf_dtypes())]
        return ReplaySample(SampleInfo(*fields), tf.nest.pack_sequence_as(self.specs, columns))

    def _check(self, item: Any, specs: list) -> None:
        kind = tuple((c.cells[0].dtype, c.shape()) for c in item.columns)
        if kind in self.checked:  # the same dtypes and shapes as an item that passed: it passes
            return
        if len(item.columns) != len(specs):
            raise SignatureError(
                f"TrajectoryDataset: an item of table {self.table!r} has {len(item.columns)} columns; the dataset's "
                f"dtypes have {len(specs)}."
            )
        for i, (column, spec) in enumerate(zip(item.columns, specs)):
            dtype, shape = column.cells[0].dtype, column.shape()
            if tf.as_dtype(dtype) != spec.dtype or not spec.shape.is_compatible_with(shape):
                raise SignatureError(
                    f"TrajectoryDataset: column {i} of an item of table {self.table!r} has (dtype, shape) "
                    f"({dtype}, {list(shape)}); the dataset expects ({spec.dtype.name}, {spec.shape.as_list()})."
                )
        self.checked.add(kind)
