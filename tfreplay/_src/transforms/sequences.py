"""`Sequences` and `sequence_priorities` (public in `tfreplay.transforms`): windows for recurrent learners."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from tfreplay._src import specs
from tfreplay._src.specs import Nest
from tfreplay._src.transforms.base import Transform, Window, _check_int, pad


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
