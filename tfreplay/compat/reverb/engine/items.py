"""An item and the checks of what goes into a table.

An item is a key, a priority, a draw count, the episodes it covers and its
columns. A column is a run of step cells (NumPy arrays the trajectory
writer made, shared by every item that covers them, never copied) or,
squeezed, one cell. Item keys come from a generator of this module's own,
seeded from the operating system's entropy (`secrets`) in every process,
never from Python's global `random`, which user code may seed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import secrets
from typing import Any, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from tfreplay.compat.reverb.errors import SignatureError


class Column(NamedTuple):
    """One column of an item: its step cells, and whether it is one step without a time axis (`squeeze`)."""

    cells: tuple
    squeeze: bool

    def value(self) -> np.ndarray:
        return self.cells[0] if self.squeeze else np.stack(self.cells)

    def shape(self) -> tuple:
        step = tuple(self.cells[0].shape)
        return step if self.squeeze else (len(self.cells),) + step


@dataclasses.dataclass
class Item:
    key: int
    priority: float
    columns: tuple
    times_sampled: int = 0
    episodes: tuple = ()  # the episode ids (writer episodes) of the steps it covers


class Ticket:
    """An item on its way into a table (`enqueue`); `done` once it is in."""

    __slots__ = ("item", "done")

    def __init__(self, item: Item):
        self.item, self.done = item, False


# Keys come from a generator of this module's own, seeded from the operating system's entropy in each process
# (again in a forked child): never Python's global `random`, which user code may seed, and no system call per key.
_KEYS = random.Random(secrets.randbits(128))
os.register_at_fork(after_in_child=lambda: _KEYS.seed(secrets.randbits(128)))


def new_key() -> int:
    """A fresh 64-bit item key."""
    return _KEYS.getrandbits(64)


def check_key(where: str, key: Any) -> int:
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool) and 0 <= key < 2**64:
        return int(key)
    raise ValueError(f"{where}: key ({key!r}) must be an integer in [0, 2**64).")


def check_priority(where: str, priority: Any, name: str = "priority") -> None:
    ok = isinstance(priority, (int, float, np.number)) and not isinstance(priority, bool)
    if not ok or not math.isfinite(priority) or priority < 0:
        raise ValueError(f"{where}: {name} ({priority!r}) must be a finite number >= 0.")


def check_columns(where: str, signature: Any, columns: Sequence[Column], step_shapes: bool = False) -> None:
    """Raises `SignatureError` unless `columns` match the flattened `signature` in number, dtype and shape
    (`step_shapes`: a column may also match by its step's shape, as Reverb's legacy writer and TF client read
    the signature of items whose every column has a time axis)."""
    if signature is None:
        return
    kinds = tuple((c.cells[0].dtype, c.cells[0].shape, None if c.squeeze else len(c.cells)) for c in columns)
    held = _SIGNATURES.get(id(signature))
    if held is None or held[0] is not signature:  # a writer's items repeat a few kinds: their verdicts are kept
        if len(_SIGNATURES) >= 256:
            _SIGNATURES.clear()
        held = _SIGNATURES[id(signature)] = (signature, tuple(tf.nest.flatten(signature)), {}, {})
    verdicts = held[3 if step_shapes else 2]
    rule = verdicts.get(kinds, _UNSEEN)
    if rule is _UNSEEN:
        rule = verdicts[kinds] = _mismatch(held[1], kinds, step_shapes)
    if rule is not None:
        raise SignatureError(f"{where}: {rule}")


_SIGNATURES: dict[int, tuple] = {}  # id(signature) -> (signature, its specs, verdicts by column kinds, ... by steps)
_UNSEEN = object()


def _mismatch(specs: tuple, kinds: tuple, step_shapes: bool) -> str | None:
    """Why columns of these `(dtype, step shape, steps or None if squeezed)` kinds do not match `specs`; None if
    they do (`step_shapes`: a column's step shape may match too)."""
    if len(specs) != len(kinds):
        return f"the item has {len(kinds)} columns; the table's signature has {len(specs)}."
    for i, (spec, (np_dtype, step, steps)) in enumerate(zip(specs, kinds)):
        dtype, shape = tf.as_dtype(np_dtype), tuple(step) if steps is None else (steps, *step)
        if dtype != spec.dtype:
            return f"column {i} has dtype {dtype.name}; the signature expects {spec.dtype.name}."
        if not any(spec.shape.is_compatible_with(s) for s in ([shape, tuple(step)] if step_shapes else [shape])):
            return f"column {i} has shape {shape}; the signature expects {spec.shape.as_list()}."
    return None
