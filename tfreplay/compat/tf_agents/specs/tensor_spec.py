"""`tf_agents.specs.tensor_spec`'s conversions between nests of `tf.TensorSpec` and of `ArraySpec`.

A TF buffer takes the `tf.TensorSpec` nest, a NumPy buffer the `ArraySpec` nest of the same items:
`to_nest_array_spec` gives the second from the first, `to_nest_tensor_spec` the way back.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfreplay.compat.tf_agents.specs.array_spec import ArraySpec

__all__ = ["TensorSpec", "is_tensor_spec", "to_array_spec", "to_nest_array_spec", "to_nest_tensor_spec"]

TensorSpec = tf.TensorSpec


def is_tensor_spec(spec: Any) -> bool:
    """Whether `spec` is a `tf.TensorSpec` (a bounded one included)."""
    return isinstance(spec, tf.TensorSpec)


def to_array_spec(spec: Any) -> ArraySpec:
    """The `ArraySpec` of one `tf.TensorSpec` (or `ArraySpec`): same shape, the NumPy dtype, same name.

    Raises:
      ValueError: the shape is not fully defined (a NumPy buffer preallocates its arrays).
      TypeError: `spec` has no `shape` and `dtype`.
    """
    if not (hasattr(spec, "shape") and hasattr(spec, "dtype")):
        raise TypeError(f"to_array_spec: spec ({spec!r}) must be a tf.TensorSpec or an ArraySpec.")
    if isinstance(spec, tf.TensorSpec) and not spec.shape.is_fully_defined():
        raise ValueError(
            f"to_array_spec: shape of {spec.name or 'the spec'} ({spec.shape}) must be fully defined; "
            "give every dimension a size."
        )
    return ArraySpec.from_spec(spec)


def to_nest_array_spec(nest: Any) -> Any:
    """`nest` with every `tf.TensorSpec` leaf an `ArraySpec` (the structure kept)."""
    return tf.nest.map_structure(to_array_spec, nest)


def to_nest_tensor_spec(nest: Any) -> Any:
    """`nest` with every `ArraySpec` leaf a `tf.TensorSpec` of the same shape, dtype and name."""
    return tf.nest.map_structure(
        lambda s: s if isinstance(s, tf.TensorSpec) else tf.TensorSpec(s.shape, tf.as_dtype(s.dtype), s.name), nest
    )
