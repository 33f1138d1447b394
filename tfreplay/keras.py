"""Keras and tfreplay: `model.fit` straight from a buffer, under Keras 3 or tf-keras.

A buffer's `as_dataset` yields `(items, BufferInfo)`; `model.fit` reads
`(x, y)` or `(x, y, sample_weight)`. `fit_dataset` is the dataset Keras
reads, `fit_map` the function between the two (for a dataset you build):

    import tfreplay.keras

    dataset = tfreplay.keras.fit_dataset(buffer, 64, x="observation", y="reward")
    model.fit(dataset, steps_per_epoch=100, shuffle=False)

With `beta`, the third element is each sample's importance weight, the
correction of prioritized replay (Schaul et al., 2016): `(N * P(i)) ** -beta`
over the batch's largest weight, where `P(i)` is `BufferInfo.probabilities`,
the same weights as `tfreplay.importance_weights`.

Nothing here imports Keras: the dataset is plain `tf.data`, so the same code
serves Keras 3 and tf-keras. `keras_module()` names the Keras that TensorFlow
routes `tf.keras` to (Keras 3, unless `TF_USE_LEGACY_KERAS` is `1` or `true`),
or the Keras a model or optimizer belongs to.
"""

from __future__ import annotations

import importlib
import numbers
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Callable

import tensorflow as tf

from tfreplay._src import checked_dataset, specs
from tfreplay._src.api import BufferInfo

__all__ = ["fit_dataset", "fit_map", "keras_module"]

Nest = Any  # a tf.nest structure of tensors
Key = Any  # a path "a/b", a sequence or dict of paths, or a callable of the items
_KERAS = ("keras", "tf_keras")


def keras_module(like: Any = None) -> ModuleType:
    """The Keras package to build with: `keras` (Keras 3) or `tf_keras`.

    Args:
      like: a Keras model, layer, optimizer or loss; `None` for the Keras
        `tf.keras` is (Keras 3, or tf-keras when the environment variable
        `TF_USE_LEGACY_KERAS` is `1` or `true` as TensorFlow starts).

    Returns:
      The top-level module, e.g. to make an optimizer of a model's Keras:
      `keras_module(model).optimizers.Adam(1e-3)`.

    Raises:
      TypeError: `like` is not an object of either Keras.
    """
    if like is None:
        root = tf.keras.Model.__module__.split(".")[0]
    else:
        roots = [c.__module__.split(".")[0] for c in type(like).__mro__]
        found = [r for r in roots if r in _KERAS]
        if not found:
            raise TypeError(
                f"keras_module: like ({type(like).__name__}) must be an object of Keras 3 (keras) or tf-keras "
                "(a model, layer, optimizer or loss)."
            )
        root = found[0]
    return importlib.import_module(root)


def fit_dataset(
    buffer: Any,
    sample_batch_size: int,
    x: Key,
    y: Key = None,
    *,
    beta: Any = None,
    num_steps: int | None = None,
    transform: Any = None,
) -> tf.data.Dataset:
    """An endless dataset of fresh samples for `model.fit`: `(x, y)`, or `(x, y, sample_weight)` with `beta`.

    Each element is one `buffer.as_dataset(sample_batch_size, num_steps,
    transform=transform)` sample, drawn when Keras asks for it, mapped by
    `fit_map(x, y, beta=beta)`. The dataset never ends: give `model.fit` its
    `steps_per_epoch`.

    Args:
      buffer: any tfreplay buffer (uniform, prioritized, frame; TF or Py).
      sample_batch_size: samples per batch.
      x: the model's inputs: a field path (`"observation"`,
        `"observation/pixels"`), a tuple or list of paths (several inputs), a
        dict of input name to path, or a callable of the items.
      y: the targets, as `x`; `None` for a model whose `train_step` or
        `add_loss` needs none.
      beta: the importance-weight exponent, 0 (none) to 1 (full correction):
        a float, or a `tf.Variable` to anneal it during training. `None`: no
        sample weights.
      num_steps: `None` for single items, `N` for windows of `N` steps.
      transform: applied at sample time, e.g. `tfreplay.NStepReturns`.

    Returns:
      A `tf.data.Dataset` of `(x, y)`, `(x, y, sample_weight)` or `(x,)`.

    Raises:
      ValueError: `sample_batch_size` not a positive integer, a path naming no
        field of the buffer's items, `beta` outside [0, 1] or without `y`.
      TypeError: a key that is neither a path, a sequence or dict of paths,
        nor a callable.
    """
    specs.check_positive_int("fit_dataset", "sample_batch_size", sample_batch_size)
    fn = _fit_fn("fit_dataset", x, y, beta)
    dataset = buffer.as_dataset(sample_batch_size=sample_batch_size, num_steps=num_steps, transform=transform)
    item_spec = dataset.element_spec[0]
    _check_paths("fit_dataset", "x", item_spec, x)  # a wrong path fails here, naming the item's fields
    _check_paths("fit_dataset", "y", item_spec, y)
    return checked_dataset.like(dataset, dataset.map(fn))  # an empty buffer refused as Keras starts iterating


def fit_map(x: Key, y: Key = None, *, beta: Any = None) -> Callable[[Nest, BufferInfo], tuple]:
    """The function from an `as_dataset` element `(items, BufferInfo)` to what `model.fit` reads.

    For a dataset built by hand (windows, `sequence_preprocess_fn`, a
    deterministic pass without `beta`): `buffer.as_dataset(...).map(fit_map(x, y))`.

    Args:
      x, y, beta: as `fit_dataset`. The weights are `(min(P) / P(i)) ** beta`
        over the batch, which equals `tfreplay.importance_weights(P, N, beta)`:
        scaling by the largest weight cancels `N`.

    Returns:
      A function of `(items, info)` returning `(x, y)`, `(x, y, sample_weight)`
      or `(x,)`. A path naming no field raises `ValueError` when the function
      first meets the items (at `dataset.map`).

    Raises:
      ValueError: `beta` outside [0, 1], or `beta` without `y`.
      TypeError: a key that is neither a path, a sequence or dict of paths,
        nor a callable.
    """
    return _fit_fn("fit_map", x, y, beta)


def _fit_fn(where: str, x: Key, y: Key, beta: Any) -> Callable[[Nest, BufferInfo], tuple]:
    _check_key(where, "x", x)
    if y is not None:
        _check_key(where, "y", y)
    if beta is not None:
        if isinstance(beta, numbers.Real) and not 0.0 <= float(beta) <= 1.0:
            raise ValueError(f"{where}: beta ({beta!r}) must be in [0, 1] (0: no correction, 1: full).")
        if y is None:
            raise ValueError(
                f"{where}: beta ({beta!r}) needs y: Keras reads sample weights as the third element of "
                "(x, y, sample_weight)."
            )

    def fn(items: Nest, info: BufferInfo) -> tuple:
        inputs = _select(where, "x", items, x)
        if y is None:
            return (inputs,)  # a 1-tuple: Keras reads it as x alone (a bare tuple of inputs would read as (x, y))
        targets = _select(where, "y", items, y)
        if beta is None:
            return inputs, targets
        return inputs, targets, _weights(where, info, beta)

    return tf.autograph.experimental.do_not_convert(fn)  # plain Python: errors come out as raised


def _weights(where: str, info: BufferInfo, beta: Any) -> tf.Tensor:
    if not tf.nest.flatten(info.probabilities):
        raise ValueError(
            f"{where}: beta ({beta!r}) needs the probabilities of a sample; a single deterministic pass draws "
            "nothing (leave beta None)."
        )
    p = tf.cast(info.probabilities, tf.float32)
    # (N p_i)^-beta / max_j (N p_j)^-beta = (min p / p_i)^beta: N cancels and nothing overflows.
    return (tf.reduce_min(p) / p) ** tf.cast(beta, tf.float32)


def _check_key(where: str, name: str, key: Key) -> None:
    if callable(key):
        return
    if isinstance(key, str):
        if not key.strip("/"):
            raise ValueError(f"{where}: {name} ({key!r}) must name a field, e.g. 'observation'.")
        return
    parts = list(key.values()) if isinstance(key, Mapping) else key if isinstance(key, (list, tuple)) else None
    if parts is None or not parts:
        raise TypeError(
            f"{where}: {name} ({key!r}) must be a field path such as 'observation', a non-empty tuple, list or "
            "dict of paths, or a callable of the items."
        )
    for part in parts:
        _check_key(where, name, part)


def _check_paths(where: str, name: str, item_spec: Nest, key: Key) -> None:
    """Walks every path of `key` through the items' spec (a callable is left to meet the items themselves)."""
    if isinstance(key, str):
        _walk(where, name, item_spec, key)
    elif isinstance(key, (Mapping, list, tuple)):
        for part in key.values() if isinstance(key, Mapping) else key:
            _check_paths(where, name, item_spec, part)


def _select(where: str, name: str, items: Nest, key: Key) -> Nest:
    """What `key` names in `items`."""
    if key is None:
        return None
    if callable(key):
        return key(items)
    if isinstance(key, str):
        return _walk(where, name, items, key)
    if isinstance(key, Mapping):
        return {k: _select(where, name, items, v) for k, v in key.items()}
    return tuple(_select(where, name, items, k) for k in key)


def _fields(node: Any) -> list[str] | None:
    if isinstance(node, Mapping):
        return [str(k) for k in node]
    if hasattr(node, "_fields"):  # a namedtuple
        return list(node._fields)
    if hasattr(type(node), "__attrs_attrs__"):
        return [a.name for a in type(node).__attrs_attrs__]
    return None


def _walk(where: str, name: str, items: Nest, path: str) -> Nest:
    node: Nest = items
    seen: list[str] = []
    for part in [p for p in path.split("/") if p]:
        fields = _fields(node)
        under = f" under '{'/'.join(seen)}'" if seen else ""
        if fields is None:
            raise ValueError(
                f"{where}: {name} ({path!r}) names no field: '{'/'.join(seen)}' is a leaf (a tensor), with no fields."
            )
        if part not in fields:
            raise ValueError(
                f"{where}: {name} ({path!r}) names no field: '{part}' is not one of {', '.join(fields)}{under}."
            )
        node = node[part] if isinstance(node, Mapping) else getattr(node, part)
        seen.append(part)
    return node
