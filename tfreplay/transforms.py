"""Transforms: what a sample becomes, computed from windows of items at sample time.

`NStepReturns`, `Sequences` and `HindsightRelabel` (goal relabeling, HER) are
the library's.

`buffer.get_next(sample_batch_size=B, transform=t)` and
`buffer.as_dataset(sample_batch_size=B, transform=t)` draw windows of
`t.num_steps` items with the buffer's own sampler and storage, then return
`t(items, mask, ops)` with `BufferInfo(ids, probabilities)` of each window's
*first* item (`[B]`: a window's priority is its first item's, so
`update_priorities(info.ids, ...)` works as usual). It runs in the graph (TF
buffers: eagerly, in `tf.function`, in `as_dataset`) or in NumPy (the NumPy
twins), through the same lines.

The interface, all a new transform needs (one class):

* `num_steps`: the window length the sampler draws.
* `padded`: False for *strict* windows, all `num_steps` items real steps of
  one episode; True for *padded* windows, which may run past their episode's
  end (a start is drawable when its window is complete or its episode ended
  inside it at a stored item; never past the write head of an unfinished
  episode). Items after the end are zeros and `mask` is False there.
* `output_spec(item_spec)`: the spec of one output (no batch axis) for a
  buffer whose sampled item has `item_spec`; raises on items it cannot use.
* `__call__(items, mask, ops)`: `items` time-stacked `[B, T, ...]`, `mask`
  `[B, T]` bool (True on the real steps of the first item's episode; always
  True for strict windows), `ops` the twin's array namespace (`core.ops`:
  `NUMPY_OPS` or `TF_OPS`); returns a batch of outputs `[B, ...]`. Steps
  where `mask` is False hold whatever their rows hold (the next episode, or
  stale rows past the write head): `pad(items, mask, ops)` zeroes them, for
  transforms that return them.
* `steps(item_spec)` (optional): the top-level fields `__call__` reads at
  one step only, `"first"` (the window's first item) or `"last"` (its last
  real one): the buffer reads those there alone and passes them `[B, ...]`.
  Reading less is faster; by default every field comes whole.
* `lookups(item_spec)` and `choose(span, uniform, ops)` (optional): leaf
  paths read at one more step of each window's episode (`HindsightRelabel`'s
  achieved goals). `choose` gets a `Span` (stored items of the first item's
  episode before and after it, and whether its last item is stored) and a
  uniform random source, and returns `[B]` offsets from the first item with
  a `[B]` bool `use`; `__call__` then gets a fourth argument, a
  `Lookup(values, use)`. Such transforms need a row buffer with episode
  boundaries.

On a buffer whose items mark episode boundaries (`step_type`, `first`,
`terminated`, `truncated`, or an `EpisodeRule`) windows follow episodes
whatever the buffer's `within_episodes`; without boundaries a segment is one
endless episode, so every window is `num_steps` consecutive items that do not
cross the write head.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
from typing import Any

import numpy as np
import tensorflow as tf

from tfreplay._src import specs
from tfreplay._src.hindsight import HindsightRelabel as HindsightRelabel
from tfreplay._src.specs import Nest
from tfreplay._src.transform import Lookup as Lookup
from tfreplay._src.transform import Span as Span
from tfreplay._src.transform import Transform, Window, _fields, _get, _replace, pad


@functools.lru_cache(maxsize=64)
def _powers(gamma: float, n: int, dtype: Any) -> np.ndarray:
    """`gamma ** [0, ..., n]` in `dtype`, made once per transform and dtype."""
    return np.asarray(gamma ** np.arange(n + 1), dtype)


def _check_int(where: str, name: str, value: Any, least: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
        rule = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ValueError(f"{where}: {name} ({value!r}) must be {rule}.")


@dataclasses.dataclass(frozen=True)
class NStepReturns(Transform):
    """n-step transitions from padded windows of `n` items (Transition-like items).

    For the window starting at item `t`, let `m <= n` be its number of real
    steps (`m < n` when the episode ends inside it). The output is item `t`
    with:

    * `reward = sum_{k<m} gamma**k * reward[t+k]`;
    * `next_observation`, `terminated`, `truncated` of item `t+m-1`;
    * `discount = gamma**m * prod_{k<m} discount[t+k]`: the whole bootstrap
      factor, 0 after a terminated end (its discount is 0), `gamma**m` after a
      truncated end or over a full window.

    So a learner's target is `reward + discount * max_a Q(next_observation, a)`
    with no further `gamma`. Items without a `discount` field (frame buffers)
    use `1 - terminated` per step and gain a `discount` entry. Other fields are
    item `t`'s. Field names are configurable; `terminated` and `truncated` may
    be absent.

    Example:
      `ds = buffer.as_dataset(sample_batch_size=64, transform=NStepReturns(n=3, gamma=0.99))`
    """

    n: int
    gamma: float
    reward: str = "reward"
    discount: str = "discount"
    next_observation: str = "next_observation"
    terminated: str = "terminated"
    truncated: str = "truncated"

    def __post_init__(self) -> None:
        _check_int("NStepReturns", "n", self.n, 1)
        specs.check_unit("NStepReturns", "gamma", self.gamma)
        for name in ("reward", "discount", "next_observation", "terminated", "truncated"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"NStepReturns: {name} ({getattr(self, name)!r}) must be a field name (str).")

    @property
    def num_steps(self) -> int:  # type: ignore[override]
        return int(self.n)

    @property
    def padded(self) -> bool:  # type: ignore[override]
        return True

    def output_spec(self, item_spec: Nest) -> Nest:
        where = "NStepReturns"
        fields = _fields(where, item_spec)
        for name in (self.reward, self.next_observation):
            if name not in fields:
                raise ValueError(f"{where}: the sampled item ({sorted(fields)}) must have a {name!r} field.")
        reward = fields[self.reward]
        if not isinstance(reward, tf.TensorSpec) or not reward.dtype.is_floating:
            raise TypeError(f"{where}: field {self.reward!r} ({reward!r}) must be a floating-point tf.TensorSpec.")
        for name in (self.terminated, self.truncated):
            spec = fields.get(name)
            if spec is not None and (not isinstance(spec, tf.TensorSpec) or spec.dtype != tf.bool):
                raise TypeError(f"{where}: field {name!r} ({spec!r}) must be a tf.bool tf.TensorSpec.")
        discount = fields.get(self.discount)
        if discount is not None:
            if not isinstance(discount, tf.TensorSpec) or not discount.dtype.is_floating or discount.shape.rank != 0:
                raise TypeError(
                    f"{where}: field {self.discount!r} ({discount!r}) must be a scalar floating-point spec."
                )
            return item_spec
        if self.terminated not in fields or not isinstance(item_spec, collections.abc.Mapping):
            raise ValueError(
                f"{where}: the sampled item ({sorted(fields)}) must have a {self.discount!r} field, or be a mapping "
                f"with a {self.terminated!r} field to derive it from."
            )
        return {**item_spec, self.discount: tf.TensorSpec([], reward.dtype)}

    def steps(self, item_spec: Nest) -> dict[str, str]:
        # Only the reward and the per-step discount (or terminated, to derive it from) are read over the window.
        fields = _fields("NStepReturns", item_spec)
        whole = {self.reward, self.discount if self.discount in fields else self.terminated}
        lasts = {self.next_observation, self.terminated, self.truncated}
        return {f: "last" if f in lasts else "first" for f in fields if f not in whole}

    def __call__(self, items: Nest, mask: Any, ops: Any) -> Nest:
        """Items of `steps()`: reward and discount (or terminated) `[B, n]`, other fields at their one step."""
        reward = _get(items, self.reward)
        extra = ops.rank(reward) - 2  # a reward's own axes
        real = ops.count1(mask)  # >= 1: a window's first item is always real
        weights = _powers(self.gamma, self.n, ops.dtype(reward))[: self.n].reshape([self.n] + [1] * extra)
        keep = ops.reshape(mask, list(mask.shape) + [1] * extra) if extra else mask
        values = {self.reward: ops.sum1(ops.where(keep, reward, 0) * weights)}
        fields = items._fields if hasattr(items, "_fields") else list(items)
        if self.discount in fields:
            step_discount = _get(items, self.discount)
        else:  # from terminated, read whole for it: its last step is the output's
            terminated = _get(items, self.terminated)
            step_discount = 1 - ops.cast(terminated, ops.dtype(reward))
            values[self.terminated] = ops.pick(terminated, real - 1)
        bootstrap = ops.gather(_powers(self.gamma, self.n, ops.dtype(step_discount)), real)
        values[self.discount] = bootstrap * ops.prod1(ops.where(mask, step_discount, 1))
        return _replace(items, values)


@dataclasses.dataclass(frozen=True)
class Sequences(Transform):
    """Sequences of `burn_in + length` items for recurrent learners, as a `Window`.

    Args:
      length: steps a learner trains on.
      burn_in: steps before them that only warm up a recurrent state (R2D2).
      pad: False: every sequence lies inside one episode (strict). True: a
        sequence may run past its episode's end; the steps after it are zeros
        and `mask` is False there.

    Returns (per sample) `Window(items, mask)`: `items` the stored item nest
    time-stacked `[B, burn_in + length, ...]` (`items[:, :burn_in]` is the
    burn-in), `mask` `[B, burn_in + length]` bool. A recurrent state stored
    with each item is just another field of the spec, read like the others.
    """

    length: int
    burn_in: int = 0
    pad: bool = False

    def __post_init__(self) -> None:
        _check_int("Sequences", "length", self.length, 1)
        _check_int("Sequences", "burn_in", self.burn_in, 0)
        if not isinstance(self.pad, bool):
            raise TypeError(f"Sequences: pad ({self.pad!r}) must be a bool.")

    @property
    def num_steps(self) -> int:  # type: ignore[override]
        return int(self.burn_in + self.length)

    @property
    def padded(self) -> bool:  # type: ignore[override]
        return self.pad

    def output_spec(self, item_spec: Nest) -> Window:
        steps = self.num_steps
        items = tf.nest.map_structure(lambda s: tf.TensorSpec([steps] + s.shape.as_list(), s.dtype), item_spec)
        return Window(items=items, mask=tf.TensorSpec([steps], tf.bool))

    def __call__(self, items: Nest, mask: Any, ops: Any) -> Window:
        return Window(items=pad(items, mask, ops) if self.pad else items, mask=mask)


def sequence_priorities(td_errors: Any, mask: Any, eta: float = 0.9) -> Any:
    """R2D2's sequence priority: `eta * max + (1 - eta) * mean` of `|td_errors|` over the valid steps.

    Args:
      td_errors: `[B, T]` per-step TD errors of `B` sequences (NumPy or tensors).
      mask: `[B, T]` bool, True on valid steps (e.g. `Window.mask[:, burn_in:]`).
      eta: the weight of the maximum, in [0, 1].

    Returns:
      `[B]` priorities, for `buffer.update_priorities(info.ids, ...)` (ids of
      the sequences' first items); NumPy when both inputs are, else a tensor.
    """
    specs.check_unit("sequence_priorities", "eta", eta)
    if tuple(np.shape(td_errors)) != tuple(np.shape(mask)) or len(np.shape(mask)) != 2:
        raise ValueError(
            f"sequence_priorities: td_errors (shape {tuple(np.shape(td_errors))}) and mask "
            f"(shape {tuple(np.shape(mask))}) must both be [batch, time]."
        )
    if isinstance(td_errors, np.ndarray) and isinstance(mask, np.ndarray):
        err = np.where(mask, np.abs(td_errors), 0)
        mean = err.sum(1) / np.maximum(mask.sum(1), 1)
        return eta * err.max(1) + (1 - eta) * mean
    td_errors = tf.convert_to_tensor(td_errors)
    mask = tf.cast(mask, tf.bool)
    err = tf.where(mask, tf.abs(td_errors), tf.zeros_like(td_errors))
    mean = tf.reduce_sum(err, 1) / tf.maximum(tf.reduce_sum(tf.cast(mask, err.dtype), 1), 1)
    return eta * tf.reduce_max(err, 1) + (1 - eta) * mean
