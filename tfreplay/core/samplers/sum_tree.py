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
            rows = np.ascontiguousarray(rows, np.int64).reshape(-1)
            values = np.ascontiguousarray(values, np.float64).reshape(-1)
            kernel.tfreplay_sum_tree_set(self.array, self.leaves, rows, values, rows.size)
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
            targets = np.ascontiguousarray(targets, np.float64)
            rows, mass = np.empty(targets.shape, np.int64), np.empty(targets.shape, np.float64)
            kernel.tfreplay_sum_tree_descend(self.array, self.leaves, targets, targets.size, rows, mass)
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
