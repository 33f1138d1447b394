"""Item selectors: which item a table samples (`sampler=`) and which it removes when full (`remover=`).

A selector is a setting; `build()` gives the structure one table keeps for
it, over the table's item keys and priorities:

* `Uniform`: every item alike (a key list with swap-removal);
* `Prioritized(priority_exponent)`: in proportion to `priority ** exponent`
  (tfreplay's sum tree over slots, grown by doubling);
* `Fifo` / `Lifo`: the oldest / newest item, probability 1;
* `MinHeap` / `MaxHeap`: the lowest / highest priority, ties to the item
  inserted or updated first.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from typing import Any

import numpy as np

from tfreplay._src.arrays.ops import NUMPY_OPS
from tfreplay._src.samplers.sum_tree import SumTree


@dataclasses.dataclass(frozen=True)
class SelectorOptions:
    """What `TableInfo.sampler_options` / `remover_options` tell about a selector (Reverb's field names)."""

    fifo: bool = False
    lifo: bool = False
    uniform: bool = False
    prioritized: Any = None  # a `PrioritizedOptions` for `Prioritized`
    heap: Any = None  # a `HeapOptions` for the heaps
    is_deterministic: bool = False

    def HasField(self, name: str) -> bool:  # noqa: N802 (the proto accessor Reverb's users call)
        return bool(getattr(self, name, None))


@dataclasses.dataclass(frozen=True)
class PrioritizedOptions:
    priority_exponent: float


@dataclasses.dataclass(frozen=True)
class HeapOptions:
    min_heap: bool


class _Uniform:
    def __init__(self) -> None:
        self.keys: list[int] = []
        self.index: dict[int, int] = {}

    def insert(self, key: int, priority: float) -> None:
        self.index[key] = len(self.keys)
        self.keys.append(key)

    def update(self, key: int, priority: float) -> None:
        pass

    def delete(self, key: int) -> None:
        i = self.index.pop(key)
        last = self.keys.pop()
        if last != key:  # the last key fills the hole
            self.keys[i], self.index[last] = last, i

    def select(self, rng: np.random.Generator) -> tuple[int, float]:
        return self.keys[int(rng.integers(len(self.keys)))], 1.0 / len(self.keys)


class _Ordered:
    """Fifo (`last=False`) or Lifo: a dict keeps insertion order."""

    def __init__(self, last: bool) -> None:
        self.keys: dict[int, None] = {}
        self.last = last

    def insert(self, key: int, priority: float) -> None:
        self.keys[key] = None

    def update(self, key: int, priority: float) -> None:
        pass

    def delete(self, key: int) -> None:
        del self.keys[key]

    def select(self, rng: np.random.Generator) -> tuple[int, float]:
        return (next(reversed(self.keys)) if self.last else next(iter(self.keys))), 1.0


class _Heap:
    """A binary heap with lazy deletion: an entry is live while its stamp is the key's current one."""

    def __init__(self, min_heap: bool) -> None:
        self.sign = 1.0 if min_heap else -1.0
        self.heap: list[tuple[float, int, int]] = []
        self.stamp: dict[int, int] = {}
        self.counter = itertools.count()

    def insert(self, key: int, priority: float) -> None:
        stamp = next(self.counter)
        self.stamp[key] = stamp
        heapq.heappush(self.heap, (self.sign * priority, stamp, key))
        if len(self.heap) > 2 * len(self.stamp) + 16:  # too many dead entries: rebuild
            self.heap = [e for e in self.heap if self.stamp.get(e[2]) == e[1]]
            heapq.heapify(self.heap)

    update = insert

    def delete(self, key: int) -> None:
        del self.stamp[key]

    def select(self, rng: np.random.Generator) -> tuple[int, float]:
        while self.stamp.get(self.heap[0][2]) != self.heap[0][1]:
            heapq.heappop(self.heap)
        return self.heap[0][2], 1.0


class _Prioritized:
    """Keys in slots of a sum tree whose leaves hold `priority ** exponent`."""

    def __init__(self, exponent: float) -> None:
        self.exponent = exponent
        self.slot: dict[int, int] = {}
        self.free: list[int] = []
        self.keys: list[int] = []
        self.tree = _tree(16)

    def _mass(self, priority: float) -> float:
        return mass(priority, self.exponent)

    def insert(self, key: int, priority: float) -> None:
        if not self.free:
            self._grow()
        slot = self.free.pop()
        self.slot[key], self.keys[slot] = slot, key
        self._set(slot, self._mass(priority))

    def update(self, key: int, priority: float) -> None:
        self._set(self.slot[key], self._mass(priority))

    def delete(self, key: int) -> None:
        slot = self.slot.pop(key)
        self._set(slot, 0.0)
        self.free.append(slot)

    def select(self, rng: np.random.Generator) -> tuple[int, float]:
        total = float(self.tree.total(NUMPY_OPS))
        if total <= 0:  # every priority 0: uniform, as Reverb
            keys = list(self.slot)
            return keys[int(rng.integers(len(keys)))], 1.0 / len(keys)
        target = np.array([rng.random() * total])
        rows, leaves = self.tree.descend(NUMPY_OPS, target)
        slot = int(rows[0])
        if slot >= len(self.keys) or self.keys[slot] not in self.slot or leaves[0] <= 0:  # float edge: the last mass
            slot = max(self.slot.values(), key=lambda s: float(self.tree.leaf(NUMPY_OPS, np.array([s]))[0]))
            leaves = self.tree.leaf(NUMPY_OPS, np.array([slot]))
        return self.keys[slot], float(leaves[0]) / total

    def _set(self, slot: int, mass: float) -> None:
        self.tree.set(NUMPY_OPS, np.array([slot], np.int64), np.array([mass]))

    def _grow(self) -> None:
        old = len(self.keys)
        size = max(16, 2 * old)
        tree = _tree(size)
        if old:
            leaves = np.zeros(tree.leaves)
            leaves[:old] = self.tree.array[self.tree.leaves : self.tree.leaves + old]
            tree.array[:] = tree.rebuilt(leaves)
        self.tree = tree
        self.keys.extend([0] * (size - old))
        self.free.extend(range(size - 1, old - 1, -1))


def mass(priority: float, exponent: float) -> float:
    """`priority ** exponent`, `inf` where the power overflows; a priority of 0 weighs 0 whatever the exponent
    (as Reverb: with exponent 0, the positive priorities are drawn alike and zero ones not at all)."""
    if priority <= 0:
        return 0.0
    try:
        return float(priority) ** exponent
    except OverflowError:
        return math.inf


def _tree(num_rows: int) -> SumTree:
    return SumTree(lambda name, shape, dtype: np.zeros(shape, np.float64), num_rows)


class Selector:
    """The base of the selectors; `build()` makes one table's structure."""

    def build(self) -> Any:
        raise NotImplementedError

    @property
    def options(self) -> SelectorOptions:
        raise NotImplementedError

    def _priority_rule(self, priority: float) -> str | None:
        """Why `priority` (finite, >= 0) cannot be held by this selector, or None."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Uniform(Selector):
    """Every item with the same probability."""

    def build(self) -> _Uniform:
        return _Uniform()

    @property
    def options(self) -> SelectorOptions:
        return SelectorOptions(uniform=True)


class Fifo(Selector):
    """The oldest item (first in, first out)."""

    def build(self) -> _Ordered:
        return _Ordered(last=False)

    @property
    def options(self) -> SelectorOptions:
        return SelectorOptions(fifo=True, is_deterministic=True)


class Lifo(Selector):
    """The newest item (last in, first out)."""

    def build(self) -> _Ordered:
        return _Ordered(last=True)

    @property
    def options(self) -> SelectorOptions:
        return SelectorOptions(lifo=True, is_deterministic=True)


class Prioritized(Selector):
    """Each item with probability `priority ** priority_exponent / sum`; all priorities 0: uniform.

    Args:
      priority_exponent: a non-negative number (0: uniform; 1: in proportion to the priority).
    """

    def __init__(self, priority_exponent: float):
        ok = isinstance(priority_exponent, (int, float, np.number)) and not isinstance(priority_exponent, bool)
        if not ok or not math.isfinite(priority_exponent) or priority_exponent < 0:
            raise ValueError(f"Prioritized: priority_exponent ({priority_exponent!r}) must be a non-negative number.")
        self.priority_exponent = float(priority_exponent)

    def build(self) -> _Prioritized:
        return _Prioritized(self.priority_exponent)

    @property
    def options(self) -> SelectorOptions:
        return SelectorOptions(prioritized=PrioritizedOptions(self.priority_exponent))

    def _priority_rule(self, priority: float) -> str | None:
        if math.isfinite(mass(priority, self.priority_exponent)):
            return None
        return f"small enough that priority ** priority_exponent ({self.priority_exponent:g}) is finite"

    def __repr__(self) -> str:
        return f"Prioritized(priority_exponent={self.priority_exponent:g})"


class MinHeap(Selector):
    """The item of the lowest priority (ties: the one inserted or updated first)."""

    min_heap = True

    def build(self) -> _Heap:
        return _Heap(self.min_heap)

    @property
    def options(self) -> SelectorOptions:
        return SelectorOptions(heap=HeapOptions(self.min_heap), is_deterministic=True)


class MaxHeap(MinHeap):
    """The item of the highest priority (ties: the one inserted or updated first)."""

    min_heap = False


def check(where: str, name: str, value: Any) -> Selector:
    if not isinstance(value, Selector):
        raise TypeError(
            f"{where}: {name} ({value!r}) must be one of reverb.selectors' Uniform, Prioritized, Fifo, Lifo, "
            "MinHeap or MaxHeap."
        )
    return value
