"""The transform interface the buffer serves: what a sample becomes, computed from windows of items.

The public transforms (`NStepReturns`, `Sequences`) and the interface's
documentation live in `tfreplay.transforms`; the buffer needs only this:
the base class it checks against, which steps a transform reads alone
(`leaf_steps`) and the padding helper.
"""

from __future__ import annotations

import abc
import collections.abc
from typing import Any, Callable, NamedTuple

import numpy as np
import tensorflow as tf

from tfreplay._src.specs import Nest


class Window(NamedTuple):
    """Time-stacked windows and which of their steps are real.

    Attributes:
      items: the stored items' nest, each leaf `[B, T, ...]` (zeros where `mask` is False).
      mask: `[B, T]` bool: True on real steps of the episode of the window's first item.
    """

    items: Any
    mask: Any


class Span(NamedTuple):
    """Where each window's first item stands in its episode, among the stored items (`Transform.choose`).

    Attributes:
      before: `[B]` int64: stored items of its episode before it (older ones may be overwritten).
      after: `[B]` int64: stored items of its episode after it (never past the write head).
      ended: `[B]` bool: whether its episode's last item is stored (the `after`-th one after it): an end
        field marks it, or the next stored item starts another episode.
    """

    before: Any
    after: Any
    ended: Any


class Lookup(NamedTuple):
    """What a transform read at one more step of each window's episode (`Transform.lookups`).

    Attributes:
      values: `{path: [B, ...]}`: the leaves `lookups` named, at the steps `choose` picked.
      use: `[B]` bool, as `choose` returned it.
    """

    values: dict
    use: Any


class Transform(abc.ABC):
    """Maps sampled windows to what a learner reads; see the module docstring."""

    num_steps: int
    padded: bool

    @abc.abstractmethod
    def output_spec(self, item_spec: Nest) -> Nest:
        """The spec of one output for sampled items of `item_spec`; raises on items it cannot use."""

    @abc.abstractmethod
    def __call__(self, items: Nest, mask: Any, ops: Any) -> Nest:
        """Outputs `[B, ...]` of windows `items` `[B, T, ...]` with their `[B, T]` mask."""

    def steps(self, item_spec: Nest) -> dict[str, str]:
        """Top-level fields read at one step only, `{name: "first" or "last"}`; see the module docstring."""
        return {}

    def lookups(self, item_spec: Nest) -> tuple[str, ...]:
        """Leaf paths read at one more step of each window's episode, which `choose` picks; none by default."""
        return ()

    def choose(self, span: Span, uniform: Callable[[list], Any], ops: Any) -> tuple[Any, Any]:
        """`(offset, use)` for transforms with `lookups`: `[B]` int64 steps from each window's first item, in
        `[-span.before, span.after]`, and `[B]` bool passed on as `Lookup.use`. `uniform(shape)` draws float64
        in `[0, 1)` from the buffer's random source (so a seed and a checkpoint cover it)."""
        raise NotImplementedError(f"{type(self).__name__}: lookups() names fields, so choose() must pick steps.")


def pad(items: Nest, mask: Any, ops: Any) -> Nest:
    """Windows `[B, T, ...]` with zeros wherever `mask` (`[B, T]`) is False."""

    def zero(x: Any) -> Any:
        keep = ops.reshape(mask, list(mask.shape) + [1] * (len(x.shape) - 2))
        return ops.where(keep, x, ops.zeros_like(x))

    return tf.nest.map_structure(zero, items)


def leaf_steps(transform: Transform, item_spec: Nest) -> list:
    """Per leaf of `item_spec` (`tf.nest.flatten` order), the step `transform` reads it at: "first",
    "last" or None (the whole window); empty when it reads every field whole. See `Transform.steps`."""
    steps = transform.steps(item_spec)
    if not steps:
        return []
    fields = _fields(type(transform).__name__, item_spec)
    bad = {f: s for f, s in steps.items() if f not in fields or s not in ("first", "last")}
    if bad:
        raise ValueError(
            f"{type(transform).__name__}.steps: {bad} must map fields of the sampled item ({sorted(fields)}) "
            "to 'first' or 'last'."
        )
    marked = _replace(item_spec, {f: tf.nest.map_structure(lambda _, s=s: s, fields[f]) for f, s in steps.items()})
    return [x if isinstance(x, str) else None for x in tf.nest.flatten(marked)]


def _fields(where: str, item_spec: Nest) -> dict:
    """The top-level fields of a mapping or NamedTuple item spec, by name."""
    if isinstance(item_spec, collections.abc.Mapping):
        return dict(item_spec)
    if hasattr(item_spec, "_fields"):
        return dict(zip(item_spec._fields, item_spec))
    raise TypeError(f"{where}: the sampled item ({type(item_spec).__name__}) must be a mapping or a NamedTuple.")


def _get(items: Any, name: str) -> Any:
    return items[name] if isinstance(items, collections.abc.Mapping) else getattr(items, name)


def _replace(items: Any, values: dict) -> Any:
    if isinstance(items, collections.abc.Mapping):
        return {**items, **values}
    return items._replace(**values)


def _check_int(where: str, name: str, value: Any, least: int) -> None:
    """Raises unless `value` is an int (not a bool) of at least `least`: a transform's count argument."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
        rule = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ValueError(f"{where}: {name} ({value!r}) must be {rule}.")
