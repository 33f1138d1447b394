"""A sum tree in one float64 array or variable, with a native and an array-op path.

`tree[2 * leaves]` (`leaves`, a power of two, at least the number of rows):
node 1 is the root, node `k` has children `2k` and `2k + 1`, row `r`'s leaf is
node `leaves + r`. A descent maps masses to rows, an update writes leaves and
repairs their ancestors; both go level by level over the whole batch.

Both loops run in compiled code when they can (`tfreplay.native`: ctypes for
NumPy arrays, TF ops for a variable on the CPU outside XLA), else in array
ops (`core.ops`). The two paths do the same float operations in the same
order, so they build bit-identical trees and draw the same rows.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay import native
from tfreplay.core import stacks
from tfreplay.core.twin_tf import under_xla


class SumTree:
    """The tree of one sampler, made through the twin's `make` (so checkpoints include it).

    Args:
      use_native: use the compiled loops where available (tests turn them off
        to compare both paths).
    """

    def __init__(self, make: Callable, num_rows: int, use_native: bool = True):
        self.leaves = 1 << max(num_rows - 1, 0).bit_length()
        self.depth = self.leaves.bit_length() - 1
        self.array = make("sampler/sum_tree", [2 * self.leaves], tf.float64)
        self.use_native = use_native

    def _kernel(self) -> Any:
        """The ctypes library (NumPy), the TF op module (a CPU variable outside XLA), or None."""
        if not self.use_native:
            return None
        if isinstance(self.array, np.ndarray):
            return native.sum_tree_library()
        if under_xla() or not stacks.on_cpu(self.array):
            return None
        return native.sum_tree_ops()

    def total(self, ops: Any) -> Any:
        """The sum of every leaf."""
        return ops.gather(self.array, 1)

    def leaf(self, ops: Any, rows: Any) -> Any:
        return ops.gather(self.array, rows + self.leaves)

    def clear(self, ops: Any) -> list:
        return [ops.assign(self.array, ops.zeros_like(ops.read(self.array)))]

    def set(self, ops: Any, rows: Any, values: Any) -> list:
        """Writes `values` into the leaves of `rows` (of duplicates, the last wins) and repairs their sums."""
        kernel = self._kernel()
        if kernel is None:
            return self._set_ops(ops, rows, values)
        if isinstance(self.array, np.ndarray):
            rows, values = _c(rows, np.int64), _c(values, np.float64)
            kernel.tfreplay_sum_tree_set(
                self.array.ctypes.data, self.leaves, rows.ctypes.data, values.ctypes.data, rows.size
            )
            return []
        return [kernel.tfreplay_sum_tree_set(self.array.handle, tf.reshape(rows, [-1]), tf.reshape(values, [-1]))]

    def _set_ops(self, ops: Any, rows: Any, values: Any) -> list:
        node = rows + self.leaves
        updates = [ops.scatter(self.array, node, values)]
        for _ in range(self.depth):  # each level after the one below
            node = node // 2

            def climb(node: Any = node) -> Any:
                sums = ops.gather(self.array, 2 * node) + ops.gather(self.array, 2 * node + 1)
                return ops.scatter(self.array, node, sums)

            updates = [ops.after(updates, climb)]
        return updates

    def descend(self, ops: Any, targets: Any) -> tuple[Any, Any]:
        """`(rows, leaf values)`: the row whose leaf holds each target mass (in `[0, total)`; past it, a padding
        row of value 0 or the last row)."""
        kernel = self._kernel()
        if kernel is None:
            return self._descend_ops(ops, targets)
        if isinstance(self.array, np.ndarray):
            targets = _c(targets, np.float64)
            rows, mass = np.empty(targets.shape, np.int64), np.empty(targets.shape, np.float64)
            data = self.array.ctypes.data
            kernel.tfreplay_sum_tree_descend(
                data, self.leaves, targets.ctypes.data, targets.size, rows.ctypes.data, mass.ctypes.data
            )
            return rows, mass
        return kernel.tfreplay_sum_tree_descend(self.array.handle, targets)

    def _descend_ops(self, ops: Any, u: Any) -> tuple[Any, Any]:
        node = ops.ones_like(ops.to_int64(u))
        for _ in range(self.depth):
            left = ops.gather(self.array, 2 * node)
            right = u >= left
            u = ops.where(right, u - left, u)
            node = 2 * node + ops.to_int64(right)
        return node - self.leaves, ops.gather(self.array, node)

    # Ring windows (no episode index) in one native call each; None without the kernel.
    def ring_draw(self, ops: Any, num_adds: Any, uniform: Any, max_length: int, n: int, stratified: bool) -> Any:
        """`(segment, t, leaf, ok)` as `PrioritizedSampler._draw` computes them, or None."""
        kernel = self._kernel()
        if kernel is None:
            return None
        if not isinstance(self.array, np.ndarray):
            return kernel.tfreplay_ring_draw(
                self.array.handle, num_adds, uniform, max_length=max_length, num_steps=n, stratified=stratified
            )
        adds, uniform = _c(num_adds, np.int64), _c(uniform, np.float64)
        segment, t = np.empty(uniform.shape, np.int64), np.empty(uniform.shape, np.int64)
        leaf, ok = np.empty(uniform.shape, np.float64), np.empty(uniform.shape, np.bool_)
        kernel.tfreplay_ring_draw(
            self.array.ctypes.data,
            self.leaves,
            adds.ctypes.data,
            adds.size,
            max_length,
            n,
            uniform.ctypes.data,
            uniform.size,
            stratified,
            segment.ctypes.data,
            t.ctypes.data,
            leaf.ctypes.data,
            ok.ctypes.data,
        )
        return segment, t, leaf, ok

    def ring_update(self, ops: Any, num_adds: Any, ids: Any, values: Any, priorities: Any, max_length: int) -> Any:
        """Sets live ids' leaves (stale ones change nothing): `(updates, stale count, largest live priority)`, or
        None."""
        kernel = self._kernel()
        if kernel is None:
            return None
        if not isinstance(self.array, np.ndarray):
            stale, largest = kernel.tfreplay_ring_update(
                self.array.handle, num_adds, ids, values, priorities, max_length=max_length
            )
            return [stale, largest], stale, largest
        adds, ids = _c(num_adds, np.int64), _c(ids, np.int64)
        values, priorities = _c(values, np.float64), _c(priorities, np.float64)
        out = np.empty(2, np.float64)
        kernel.tfreplay_ring_update(
            self.array.ctypes.data,
            self.leaves,
            adds.ctypes.data,
            adds.size,
            max_length,
            ids.ctypes.data,
            values.ctypes.data,
            priorities.ctypes.data,
            ids.size,
            out.ctypes.data,
        )
        return [], np.int64(out[0]), out[1]


def _c(array: Any, dtype: Any) -> np.ndarray:
    """A C-contiguous array of `dtype` (no copy when it already is one)."""
    return np.ascontiguousarray(array, dtype)
