"""Spec handling: normalising a `data_spec`, naming leaves, validating batches.

Every check happens here, once, at a buffer's entry point. Messages follow
`<where>: <field> (<value>) must be <rule>` and name a leaf by its path in the
nest (`observation/pixels`), so a user sees which field is wrong.
"""

from __future__ import annotations

import collections.abc
import math
import warnings
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tfreplay._src import tracebacks

Nest = Any


def leaf_paths(structure: Nest, field_names: bool = True) -> list[str]:
    """Returns one `a/b/0`-style path per leaf, in `tf.nest.flatten` order.

    With `field_names=False` a namedtuple's fields are named by index, as a
    plain tuple's are (so the two compare equal).
    """
    paths: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, collections.abc.Mapping):
            children = [(str(k), node[k]) for k in sorted(node)]
        elif field_names and isinstance(node, tuple) and hasattr(node, "_fields"):
            children = [(f, getattr(node, f)) for f in node._fields]
        elif isinstance(node, (list, tuple)):
            children = [(str(i), v) for i, v in enumerate(node)]
        else:
            paths.append(prefix or "<item>")
            return
        for name, child in children:
            walk(child, f"{prefix}/{name}" if prefix else name)

    walk(structure, "")
    if len(paths) != len(tf.nest.flatten(structure)):
        # A nest type we do not walk the way tf.nest does: fall back to indices.
        return [f"leaf{i}" for i in range(len(tf.nest.flatten(structure)))]
    return paths


def normalize_spec(data_spec: Nest) -> Nest:
    """Returns `data_spec` with every leaf a fully defined `tf.TensorSpec`.

    Leaves may be `tf.TensorSpec`/`BoundedTensorSpec` (kept as they are) or any
    object with `shape` and `dtype` (a TF-Agents `ArraySpec`, say), converted.
    """
    if data_spec is None or not tf.nest.flatten(data_spec):
        raise TypeError("data_spec (None or empty) must be a nest of tf.TensorSpec.")
    data_spec = lists_to_tuples(data_spec)
    leaves = tf.nest.flatten(data_spec)
    out = []
    for path, leaf in zip(leaf_paths(data_spec), leaves):
        if not isinstance(leaf, tf.TensorSpec):
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
                raise TypeError(
                    f"data_spec: {path} ({leaf!r}) must be a tf.TensorSpec or an object with `shape` and `dtype`."
                )
            leaf = tf.TensorSpec(tuple(leaf.shape), tf.as_dtype(leaf.dtype), path)
        if not leaf.shape.is_fully_defined():
            raise ValueError(
                f"data_spec: {path} has shape {tuple(leaf.shape)}; every "
                "dimension must be known to preallocate storage."
            )
        out.append(leaf)
    return tf.nest.pack_sequence_as(data_spec, out)


def lists_to_tuples(structure: Nest) -> Nest:
    """`structure` with every list a tuple: tf.data treats a list as one tensor, not a nest."""
    if isinstance(structure, list):
        return tuple(lists_to_tuples(x) for x in structure)
    if isinstance(structure, collections.abc.Mapping):
        return type(structure)((k, lists_to_tuples(v)) for k, v in structure.items())  # type: ignore[call-arg]
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        return type(structure)(*[lists_to_tuples(x) for x in structure])
    if isinstance(structure, tuple):
        return tuple(lists_to_tuples(x) for x in structure)
    return structure


def check_positive_int(where: str, name: str, value: Any, allow_none: bool = False) -> None:
    """Raises `ValueError` unless `value` is a positive Python/NumPy integer."""
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0
    if not ok:
        raise ValueError(f"{where}: {name} ({value!r}) must be a positive integer.")


def check_unit(where: str, name: str, value: Any) -> None:
    """Raises `ValueError` unless `value` is a Python or NumPy real number in [0, 1] (a probability, a discount)."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 <= value <= 1:
        raise ValueError(f"{where}: {name} ({value!r}) must be a number in [0, 1].")


def static_int(where: str, name: str, value: Any) -> Any:
    """`value` as a Python int when it is an integer scalar tensor or NumPy integer (as TF-Agents accepts).

    Sample shapes are fixed when a sample is traced, so a tensor's value must
    be known then: an eager tensor or a graph constant.
    """
    if value is None or type(value) is int:  # the common case, before tf.is_tensor's slower checks
        return value
    if isinstance(value, np.integer):
        return int(value)
    if not tf.is_tensor(value):
        return value
    if not value.dtype.is_integer or value.shape.rank != 0:
        raise ValueError(f"{where}: {name} ({value!r}) must be an integer scalar; got {value.dtype.name}{value.shape}.")
    static = tf.get_static_value(value)
    if static is None:
        raise ValueError(
            f"{where}: {name} ({value!r}) must have a value known when the sample is traced (a Python int, "
            "an eager tensor or a constant); sample shapes are fixed then. Pass the size as a Python int."
        )
    return int(static)


def flatten_items(where: str, data_spec: Nest, items: Nest) -> list[Any]:
    """Flattens `items` against the spec's structure, or raises `TypeError`.

    Sequence types may differ (a list or tuple for a namedtuple), but every
    dict key must match: tf.nest alone, without type checks, would pair leaves
    of different keys by position and store a field under another's name.
    """
    try:
        tf.nest.assert_same_structure(data_spec, items)  # same types and keys: the common, fast case
        return tf.nest.flatten(items)
    except (ValueError, TypeError):
        pass
    try:
        tf.nest.assert_same_structure(data_spec, items, check_types=False)
        reason = None if leaf_paths(data_spec, False) == leaf_paths(items, False) else "keys differ"
    except (ValueError, TypeError) as err:
        reason = str(err)
    if reason is not None:
        _refuse_python_lists(where, data_spec, items)
        want, got = leaf_paths(data_spec), leaf_paths(items)
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        detail = f"missing {missing}, unexpected {extra}" if missing or extra else reason
        raise TypeError(
            f"{where}: items ({detail}) must have the structure of data_spec "
            f"{tf.nest.map_structure(lambda s: s.dtype.name, data_spec)}."
        )
    return tf.nest.flatten(items)


def _refuse_python_lists(where: str, data_spec: Nest, items: Nest) -> None:
    """Raises `TypeError` for the commonest wrong structure: Python lists where the spec has arrays.

    tf.nest reads a list as a nest of leaves, so without this a list of shape
    `(8, 4)` would read as 32 unexpected fields. Two cases are named: a leaf
    given as a (nested) list, and a list of single items instead of one batch.
    """
    found = _lists_at_leaves(data_spec, items, "")
    if found:
        path, value, spec = found[0]
        shape = _list_shape(value)
        kind = "list" if isinstance(value, list) else "tuple"
        got = f"a ragged Python {kind} of length {len(value)}" if shape is None else f"a Python {kind} of shape {shape}"
        inner = tuple(spec.shape.as_list())
        shaped = f"(batch, {', '.join(map(str, inner))})" if inner else "(batch,)"
        name = spec.dtype.name
        make = f"np.asarray(..., dtype=np.{name})" if hasattr(np, name) else f"tf.constant(..., tf.{name})"
        others = [p for p, _, _ in found[1:]]
        also = f" ({', '.join(others)} also given as lists.)" if others else ""
        raise TypeError(
            f"{where}: {path} ({got}) must be an array or tensor of dtype {name} shaped {shaped}; pass arrays "
            f"or tensors shaped like the spec, e.g. {make} of shape {shaped}.{also}"
        )
    if isinstance(items, (list, tuple)) and items and not isinstance(data_spec, (list, tuple)):
        if all(_lists_at_leaves(data_spec, item, "") is not None for item in items):
            raise TypeError(
                f"{where}: items (a Python {type(items).__name__} of {len(items)} items, each a nest like data_spec) "
                "must be one nest like data_spec with a batch dimension on every leaf; stack them first, e.g. "
                "tf.nest.map_structure(lambda *xs: np.stack(xs), *items)."
            )


def _lists_at_leaves(spec: Nest, items: Nest, path: str) -> list[tuple[str, Any, tf.TensorSpec]] | None:
    """`(path, value, leaf spec)` wherever `items` holds a list or tuple in place of a spec leaf; `None` when
    `items` differs from the spec anywhere else (a key missing, a leaf where the spec nests)."""
    if isinstance(spec, collections.abc.Mapping):
        if not isinstance(items, collections.abc.Mapping) or sorted(map(str, items)) != sorted(map(str, spec)):
            return None
        keyed = {str(k): v for k, v in items.items()}
        children = [(str(k), spec[k], keyed[str(k)]) for k in sorted(spec, key=str)]
    elif isinstance(spec, (list, tuple)):
        if not isinstance(items, (list, tuple)) or len(items) != len(spec):
            return None
        names = spec._fields if hasattr(spec, "_fields") else range(len(spec))
        children = [(str(n), s, v) for n, s, v in zip(names, spec, items)]
    elif isinstance(items, (list, tuple)):
        return [(path or "items", items, spec)]
    else:
        return None if isinstance(items, collections.abc.Mapping) else []
    found: list[tuple[str, Any, tf.TensorSpec]] = []
    for name, child_spec, child in children:
        below = _lists_at_leaves(child_spec, child, f"{path}/{name}" if path else name)
        if below is None:
            return None
        found += below
    return found


def _list_shape(value: Any) -> tuple[int, ...] | None:
    """The shape NumPy would give a nested list, or `None` if it is ragged."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tuple(np.shape(value))
    except ValueError:
        return None


def check_leaf(
    where: str,
    path: str,
    dtype: tf.DType,
    shape: Sequence[int | None],
    spec: tf.TensorSpec,
    batch_size: int | None,
) -> None:
    """Checks one leaf's dtype and `[batch, *spec.shape]` shape (None = unknown)."""
    if dtype != spec.dtype:
        raise TypeError(
            f"{where}: {path} has dtype {dtype.name}; the spec expects "
            f"{spec.dtype.name} (tfreplay never casts silently)."
        )
    inner = tuple(spec.shape.as_list())
    shape = tuple(shape)
    if len(shape) != len(inner) + 1:
        raise ValueError(
            f"{where}: {path} has shape {shape}; it must be [batch] + {list(inner)} "
            "(an outer batch dimension, then the spec's shape)."
        )
    if any(got is not None and got != want for got, want in zip(shape[1:], inner)):
        raise ValueError(f"{where}: {path} has shape {shape[1:]}; the spec expects {inner} after the batch dimension.")
    if batch_size is not None and shape[0] is not None and shape[0] != batch_size:
        raise ValueError(
            f"{where}: {path} has outer (batch) dimension {shape[0]}; it must equal "
            f"the buffer's batch_size ({batch_size}), one row per segment."
        )


def check_same_outer(where: str, paths: Sequence[str], shapes: Sequence[Sequence]) -> None:
    """All leaves of one batch must share the outer dimension."""
    known = {(p, s[0]) for p, s in zip(paths, shapes) if s[0] is not None}
    if len({n for _, n in known}) > 1:
        listing = ", ".join(f"{p}: {n}" for p, n in sorted(known))
        raise ValueError(f"{where}: leaves have different batch sizes ({listing}); they must agree.")


def to_numpy_leaf(where: str, path: str, value: Any, spec: tf.TensorSpec) -> np.ndarray:
    """Converts one item leaf to NumPy without silent casts.

    Arrays and tensors keep their dtype (checked later); plain Python numbers
    and lists take the spec's dtype only when that conversion is exact.
    """
    if isinstance(value, (tf.Tensor, tf.Variable)):
        if not tf.executing_eagerly():
            raise TypeError(
                f"{where}: {path} is a graph tensor; a NumPy buffer stores values, so call it eagerly "
                "(inside tf.function, use TFUniformReplayBuffer)."
            )
        return value.numpy()
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        return np.asarray(value)
    want = spec.dtype.as_numpy_dtype
    raw = np.asarray(value)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. ComplexWarning: lossy casts are rejected below
            cast = raw.astype(want)
    except (TypeError, ValueError):
        cast = None
    if cast is None or cast.shape != raw.shape or not np.array_equal(cast, raw):
        raise TypeError(
            f"{where}: {path} ({raw.dtype.name} values) cannot be stored exactly as "
            f"{spec.dtype.name}; pass an array of dtype {spec.dtype.name}."
        )
    return cast


def validate_numpy_batch(
    where: str,
    data_spec: Nest,
    paths: Sequence[str],
    items: Nest,
    batch_size: int | None,
) -> list[np.ndarray]:
    """Validates a batch for a NumPy buffer; returns its leaves as arrays."""
    specs = tf.nest.flatten(data_spec)
    values = flatten_items(where, data_spec, items)
    arrays = [to_numpy_leaf(where, p, v, s) for p, v, s in zip(paths, values, specs)]
    for path, array, spec in zip(paths, arrays, specs):
        check_leaf(where, path, tf.as_dtype(array.dtype), array.shape, spec, batch_size)
    check_same_outer(where, paths, [a.shape for a in arrays])
    return arrays


def validate_tensor_batch(
    where: str,
    data_spec: Nest,
    paths: Sequence[str],
    items: Nest,
    batch_size: int,
) -> tuple[list[tf.Tensor], list[tf.Operation]]:
    """Validates a batch for a TF buffer.

    Returns the leaves as tensors and the runtime assertions (for dimensions
    that are only known when a graph runs); writes must depend on them.
    """
    specs = tf.nest.flatten(data_spec)
    values = flatten_items(where, data_spec, items)
    tensors = []
    for path, value, spec in zip(paths, values, specs):
        if not isinstance(value, (tf.Tensor, tf.Variable, np.ndarray, np.generic)):
            value = to_numpy_leaf(where, path, value, spec)
        elif isinstance(value, (np.ndarray, np.generic)):
            check_leaf(where, path, tf.as_dtype(value.dtype), np.shape(value), spec, batch_size)
        tensors.append(tf.convert_to_tensor(value))
    shapes = [tuple(t.shape.as_list()) if t.shape.rank is not None else () for t in tensors]
    for path, tensor, shape, spec in zip(paths, tensors, shapes, specs):
        if tensor.shape.rank is None:
            raise ValueError(f"{where}: {path} has unknown rank; its rank must be known.")
        check_leaf(where, path, tensor.dtype, shape, spec, batch_size)
    check_same_outer(where, paths, shapes)
    asserts = []
    for i, (path, shape, spec) in enumerate(zip(paths, shapes, specs)):
        if None in shape:
            tensors[i], check = _checked_at_runtime(where, path, tensors[i], [batch_size] + spec.shape.as_list())
            asserts.append(check)
    return tensors, asserts


def _checked_at_runtime(where: str, path: str, tensor: tf.Tensor, expected: list[int]) -> tuple[tf.Tensor, Any]:
    """An assertion that `tensor` has shape `expected`, and the tensor to write.

    The write gets a slice of exactly `expected` shape rather than `tensor`
    itself: a scatter consuming `tensor` would let Grappler infer its shape
    *from the scatter* and constant-fold this assertion to true, and the
    scatter of a well-shaped leaf would then run while another leaf fails,
    tearing the item.
    """
    with tracebacks.hidden():  # a failure shows the caller's frames, not tfreplay's
        check = tf.debugging.assert_equal(
            tf.shape(tensor, out_type=tf.int64),
            tf.constant(expected, tf.int64),
            message=f"{where}: {path} must have shape {expected} ([batch_size] + the spec's shape).",
        )
    with tf.control_dependencies([check]):  # so the assertion, not the slice, reports a bad shape
        return tf.slice(tensor, [0] * len(expected), expected), check
