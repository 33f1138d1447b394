"""`NStepReturns` (public as `tfreplay.transforms.NStepReturns`): n-step transitions from padded windows."""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
from typing import Any

import numpy as np
import tensorflow as tf

from tfreplay._src import specs
from tfreplay._src.specs import Nest
from tfreplay._src.transforms.base import Transform, _check_int, _fields, _get, _replace


@functools.lru_cache(maxsize=64)
def _powers(gamma: float, n: int, dtype: Any) -> np.ndarray:
    """`gamma ** [0, ..., n]` in `dtype`, made once per transform and dtype."""
    return np.asarray(gamma ** np.arange(n + 1), dtype)


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
