"""Where rows live: one preallocated array per spec leaf, `[num_rows, *shape]`.

`TFStorage` keeps a `tf.Variable` per leaf, `NumpyStorage` a NumPy array; both
write and gather whole rows of every leaf, so a buffer never handles leaves
one by one.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tfreplay.specs import Nest


def spec_nbytes(data_spec: Nest) -> int:
    """Bytes one item of `data_spec` takes."""
    return sum(s.shape.num_elements() * s.dtype.size for s in tf.nest.flatten(data_spec))


class TFStorage(tf.Module):
    """A `tf.Variable` of shape `[num_rows, *spec.shape]` per spec leaf."""

    def __init__(self, data_spec: Nest, num_rows: int, paths: Sequence[str], name: str = "storage"):
        super().__init__(name=name)
        self.num_rows = num_rows
        with self.name_scope:
            self.variables_by_leaf = [
                tf.Variable(
                    tf.zeros([num_rows] + s.shape.as_list(), s.dtype),
                    trainable=False,
                    name=path.replace("/", "_"),
                )
                for s, path in zip(tf.nest.flatten(data_spec), paths)
            ]

    def write(self, rows: tf.Tensor, leaves: Sequence[tf.Tensor]) -> list[Any]:
        return [v.scatter_update(tf.IndexedSlices(x, rows)) for v, x in zip(self.variables_by_leaf, leaves)]

    def gather(self, rows: tf.Tensor) -> list[tf.Tensor]:
        return [tf.gather(v, rows) for v in self.variables_by_leaf]

    @property
    def nbytes(self) -> int:
        return sum(v.shape.num_elements() * v.dtype.size for v in self.variables_by_leaf)


class NumpyStorage:
    """A preallocated NumPy array of shape `[num_rows, *spec.shape]` per leaf."""

    def __init__(self, data_spec: Nest, num_rows: int):
        self.num_rows = num_rows
        self.arrays = [
            np.zeros([num_rows] + s.shape.as_list(), s.dtype.as_numpy_dtype) for s in tf.nest.flatten(data_spec)
        ]

    def write(self, rows: np.ndarray, leaves: Sequence[np.ndarray]) -> None:
        # One add usually fills a contiguous run of rows: a slice copy is a memcpy.
        first = int(rows[0])
        if rows[-1] - first == len(rows) - 1:
            for array, x in zip(self.arrays, leaves):
                array[first : first + len(rows)] = x
        else:
            for array, x in zip(self.arrays, leaves):
                array[rows] = x

    def gather(self, rows: np.ndarray) -> list[np.ndarray]:
        return [array.take(rows, axis=0) for array in self.arrays]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)
