"""`tf_agents.specs.array_spec.ArraySpec`: the shape and dtype of a NumPy array, as a NumPy buffer's spec leaf."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["ArraySpec", "is_array_spec"]


class ArraySpec:
    """The shape and dtype of a NumPy array, with an optional name.

    Two specs are equal when their shapes and dtypes are (names aside), as in TF-Agents. tfreplay's buffers take
    nests of them wherever they take `tf.TensorSpec`s.

    Args:
      shape: the array's dimensions, each a known non-negative integer.
      dtype: anything `np.dtype` takes (`np.float32`, `"int64"`).
      name: an optional name.

    Raises:
      ValueError: a dimension is unknown (None) or negative.
    """

    __slots__ = ("_shape", "_dtype", "_name")

    def __init__(self, shape: Sequence[int], dtype: Any, name: str | None = None):
        dims = tuple(shape)
        if any(d is None or int(d) < 0 for d in dims):
            raise ValueError(f"ArraySpec: shape ({dims}) must have known, non-negative dimensions.")
        self._shape = tuple(int(d) for d in dims)
        self._dtype = np.dtype(dtype)
        self._name = name

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def name(self) -> str | None:
        return self._name

    def __repr__(self) -> str:
        return f"ArraySpec(shape={self._shape}, dtype={self._dtype!r}, name={self._name!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ArraySpec):
            return NotImplemented
        return self._shape == other._shape and self._dtype == other._dtype

    def __hash__(self) -> int:
        return hash((self._shape, self._dtype))

    def check_array(self, array: Any) -> bool:
        """Whether `array` (a NumPy array or scalar) has this spec's shape and dtype."""
        return isinstance(array, (np.ndarray, np.generic)) and array.shape == self._shape and array.dtype == self._dtype

    @classmethod
    def from_array(cls, array: Any, name: str | None = None) -> ArraySpec:
        """The spec of `array` (anything `np.asarray` takes)."""
        array = np.asarray(array)
        return cls(array.shape, array.dtype, name)

    @classmethod
    def from_spec(cls, spec: Any) -> ArraySpec:
        """An `ArraySpec` of any spec with `shape`, `dtype` and `name` (an `ArraySpec`, a `tf.TensorSpec`)."""
        dtype = getattr(spec.dtype, "as_numpy_dtype", spec.dtype)  # a tf.DType, or a NumPy one
        return cls(tuple(spec.shape), dtype, getattr(spec, "name", None))


def is_array_spec(spec: Any) -> bool:
    """Whether `spec` is an `ArraySpec`."""
    return isinstance(spec, ArraySpec)
