"""`TFClient`: sample, insert and update priorities as TensorFlow ops, eagerly or inside `tf.function`.

Eagerly a call runs at once; in a graph it is a `tf.numpy_function` op (so
a graph using it runs in this process and is not serializable to another)
that finds its server and table when it runs. The server address and table
names may be strings or string tensors. A sampled item of one step comes
without its time axis, as Reverb's TF client emits it. Eagerly, an unknown
table raises `NotFoundError` and data of other dtypes than asked
`InvalidArgumentError`, as Reverb's ops do; inside a graph, TensorFlow
reports an error of a Python op as `UnknownError` (the unknown table) or
`InvalidArgumentError` (the dtypes), with the same message, where Reverb's
ops raise `NotFoundError` and `InternalError`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tfreplay._src.arrays import py_calls
from tfreplay.compat.reverb.engine.items import Column
from tfreplay.compat.reverb.errors import DtypeMismatchError
from tfreplay.compat.reverb.replay_sample import ReplaySample, SampleInfo
from tfreplay.compat.reverb.transport import routing

_INFO_DTYPES = list(SampleInfo.tf_dtypes())


class TFClient:
    """TensorFlow ops on the `Server` at `server_address` (of this process or another)."""

    def __init__(self, server_address: Any, shared_name: str | None = None, name: str = "reverb"):
        address = routing.text("TFClient", "server_address", server_address)
        if isinstance(address, str):
            routing.split_address("TFClient", address)
        self._address, self._name = address, name

    @property
    def server_address(self) -> Any:
        return self._address

    def sample(self, table: str, data_dtypes: Any, name: str | None = None) -> ReplaySample:
        """One item of `table`: `ReplaySample(info, data)`, `data` nested as `data_dtypes`."""
        table = routing.text("TFClient.sample", "table", table)
        dtypes = [tf.as_dtype(d) for d in tf.nest.flatten(data_dtypes)]

        def draw(address: Any, name: Any) -> list:
            item, info = routing.find_table("TFClient.sample", address, name).sample()
            columns = item.columns
            if all(not c.squeeze and len(c.cells) == 1 for c in columns):
                columns = tuple(Column(c.cells, True) for c in columns)  # one step: a timestep, no time axis
            data = [c.value() for c in columns]
            if len(data) != len(dtypes) or any(tf.as_dtype(x.dtype) != d for x, d in zip(data, dtypes)):
                got = [tf.as_dtype(x.dtype).name for x in data]
                raise DtypeMismatchError(
                    f"TFClient.sample: table {routing.text('', '', name)!r} holds dtypes {got}; data_dtypes asks "
                    f"{[d.name for d in dtypes]}."
                )
            fields = [
                np.uint64(info[0]),
                np.float64(info[1]),
                np.int64(info[2]),
                np.float64(info[3]),
                np.int32(info[4]),
            ]
            return fields + data

        if tf.executing_eagerly():
            out = [tf.constant(x) for x in draw(self._address, table)]
        else:
            names = [tf.convert_to_tensor(self._address, tf.string), tf.convert_to_tensor(table, tf.string)]
            out = py_calls.numpy_function(draw, names, _INFO_DTYPES + dtypes, name=name or f"{self._name}_sample")
            for t in out[:5]:
                t.set_shape([])
        return ReplaySample(SampleInfo(*out[:5]), tf.nest.pack_sequence_as(data_dtypes, out[5:]))

    def insert(self, data: Sequence[Any], tables: Any, priorities: Any, name: str | None = None) -> Any:
        """Inserts `data` (tensors: one step, each a column) as an item of one step into `tables[i]` with
        `priorities[i]` (a string and a float64 tensor of rank 1, of one length)."""
        tables, priorities = tf.convert_to_tensor(tables), tf.convert_to_tensor(priorities)
        if tables.dtype != tf.string or tables.shape.rank != 1:
            raise ValueError(f"TFClient.insert: tables ({tables!r}) must be a string tensor of rank 1.")
        if priorities.dtype != tf.float64 or priorities.shape.rank != 1:
            raise ValueError(f"TFClient.insert: priorities ({priorities!r}) must be a float64 tensor of rank 1.")
        if not tables.shape.is_compatible_with(priorities.shape):
            raise ValueError(
                f"TFClient.insert: priorities ({priorities.shape}) and tables ({tables.shape}) must "
                "have the same shape."
            )
        address = self._address

        def put(address: Any, names: np.ndarray, weights: np.ndarray, *values: np.ndarray) -> np.ndarray:
            routing.insert("TFClient.insert", address, list(zip(names, weights)), values)  # as Client.insert
            return np.array(True)

        flat = [tf.convert_to_tensor(x) for x in tf.nest.flatten(data)]
        if tf.executing_eagerly():
            return tf.constant(put(address, tables.numpy(), priorities.numpy(), *[x.numpy() for x in flat]))
        inputs = [tf.convert_to_tensor(address, tf.string), tables, priorities, *flat]
        return py_calls.numpy_function(put, inputs, tf.bool, name=name or f"{self._name}_insert")

    def update_priorities(self, table: str, keys: Any, priorities: Any, name: str | None = None) -> Any:
        """Sets the priorities of `keys` (unknown keys are ignored)."""
        table = routing.text("TFClient.update_priorities", "table", table)
        keys, priorities = tf.convert_to_tensor(keys), tf.convert_to_tensor(priorities)

        def update(address: Any, name: Any, k: np.ndarray, p: np.ndarray) -> np.ndarray:
            target = routing.find_table("TFClient.update_priorities", address, name)
            k, p = np.reshape(k, [-1]), np.reshape(p, [-1])
            if k.shape != p.shape:
                raise ValueError(
                    f"TFClient.update_priorities: keys ({k.shape[0]}) and priorities ({p.shape[0]}) "
                    "must have the same length."
                )
            target.mutate({int(a): float(b) for a, b in zip(k, p)}, [])
            return np.array(True)

        if tf.executing_eagerly():
            return tf.constant(update(self._address, table, keys.numpy(), priorities.numpy()))
        names = [tf.convert_to_tensor(self._address, tf.string), tf.convert_to_tensor(table, tf.string)]
        return py_calls.numpy_function(
            update, [*names, keys, priorities], tf.bool, name=name or f"{self._name}_update_priorities"
        )
