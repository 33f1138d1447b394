"""A sum tree in one float64 array or variable, with a compiled and an array-op path.

`tree[2 * leaves]` (`leaves`, a power of two, at least the number of rows):
node 1 is the root, a node `k` of fanout `f` has children `f * k` to
`f * k + f - 1`, row `r`'s leaf is node `leaves + r`. Every node has 8
children (one cache line) except the root, which has 2, 4 or 8; a level of
`n` nodes is `[n, 2n)`. A node holds the sum of its children added first to
last; a descent passes child `j` while its target is at least the running sum
of children `0..j` and goes on with the target minus the last sum it passed.
An update writes leaves and repairs their ancestors; both go level by level
over the whole batch. (A binary tree's 1M-row descent missed the cache at each
of 20 levels; this one has 7.)

Both loops run in compiled code where a kernel for the tree runs here (the
finder `arrays/kernels.py` gives the tree as it is made), else in array ops.
The two paths do the same float operations in the same order, so they build
bit-identical trees and draw the same rows.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay._src.arrays import kernels

FANOUT = 8
# The layout, in a prioritized buffer's checkpoint record: a checkpoint of another layout (the binary tree of
# tfreplay before it, with no such field) is refused rather than restored into wrong sums.
LAYOUT = f"fanout {FANOUT}"


def fanouts(leaves: int) -> list[int]:
    """The fanout of each level from the root down: 2, 4 or 8 at the root, 8 below (their product is `leaves`)."""
    bits = leaves.bit_length() - 1
    return [1 << (bits % 3 or 3)] + [FANOUT] * ((bits - 1) // 3) if bits else []


def _no_kernel() -> None:
    return None


class SumTree:
    """The tree of one sampler, made through the twin's `make` (so checkpoints include it).

    Args:
      use_native: use the compiled loops where available (off: the array-op path, which tests compare).
    """

    def __init__(self, make: Callable, num_rows: int, use_native: bool = True):
        self.leaves = 1 << max(num_rows - 1, 0).bit_length()
        self.fanouts = fanouts(self.leaves)
        self.array = make("sampler/sum_tree", [2 * self.leaves], tf.float64)
        self.use_native = use_native
        # `kernel()`: the compiled loops on this tree here (`kernels.NumpySumTree` or `TFSumTree`), or None.
        self.kernel = kernels.sum_tree_finder(self.array) if use_native else _no_kernel

    def rebuilt(self, leaves: Any) -> np.ndarray:
        """The whole tree over `leaves` (NumPy), every node its children's sum added first to last, as `set`
        leaves it: what a saved tree must equal."""
        tree = np.zeros(2 * self.leaves)
        tree[self.leaves :] = leaves
        n = self.leaves
        for f in reversed(self.fanouts):
            tree[n // f : 2 * n // f] = np.add.accumulate(tree[n : 2 * n].reshape(-1, f), axis=1)[:, -1]
            n //= f
        return tree

    def total(self, ops: Any) -> Any:
        """The sum of every leaf."""
        return ops.gather(self.array, 1)

    def leaf(self, ops: Any, rows: Any) -> Any:
        return ops.gather(self.array, rows + self.leaves)

    def clear(self, ops: Any) -> list:
        return [ops.assign(self.array, ops.zeros_like(ops.read(self.array)))]

    def set(self, ops: Any, rows: Any, values: Any) -> list:
        """Writes `values` into the leaves of `rows` (of duplicates, the last wins) and repairs their sums."""
        kernel = self.kernel()
        if kernel is not None:
            return kernel.set(rows, values)
        node = ops.reshape(rows, [-1]) + self.leaves
        updates = [ops.scatter(self.array, node, ops.reshape(values, [-1]))]
        for f in reversed(self.fanouts):  # each level after the one below
            node = node // f

            def climb(node: Any = node, f: int = f) -> Any:
                children = ops.gather(self.array, ops.arange(f)[:, None] + f * node[None, :])  # [f, n]
                return ops.scatter(self.array, node, ops.running_sum0(children)[-1])  # added first to last

            updates = [ops.after(updates, climb)]
        return updates

    def descend(self, ops: Any, targets: Any) -> tuple[Any, Any]:
        """`(rows, leaf values)`: the row whose leaf holds each target mass (in `[0, total)`; past it, a padding
        row of value 0 or the last row)."""
        kernel = self.kernel()
        if kernel is not None:
            return kernel.descend(targets)
        u = ops.reshape(ops.to_float64(targets), [-1])
        node = ops.ones_like(ops.to_int64(u))
        for f in self.fanouts:  # [f - 1, n] running sums of each node's children, first to last
            running = ops.running_sum0(ops.gather(self.array, ops.arange(f - 1)[:, None] + f * node[None, :]))
            past = u >= running
            u = u - ops.max0(ops.where(past, running, ops.zeros_like(running)))  # sums only grow: the last passed
            node = f * node + ops.sum0(ops.to_int64(past))
        return node - self.leaves, ops.gather(self.array, node)

    # Ring windows (no episode index) in one compiled call each; None without the kernel.
    def ring_draw(self, ops: Any, num_adds: Any, uniform: Any, max_length: int, n: int, stratified: bool) -> Any:
        """`(segment, t, leaf, ok, all ok)` as `PrioritizedSampler._draw` computes them, or None."""
        kernel = self.kernel()
        return None if kernel is None else kernel.ring_draw(num_adds, uniform, max_length, n, stratified)

    def ring_sample(self, ops: Any, num_adds: Any, uniform: Any, max_length: int) -> Any:
        """Single items of ring windows: the first (stratified) draw of `PrioritizedSampler.sample` with its
        probabilities, from one read of the tree: `(segment, t, leaf, ok, all ok, probabilities, count)`, or None
        without the kernel."""
        kernel = self.kernel()
        return None if kernel is None else kernel.ring_sample(num_adds, uniform, max_length)

    def ring_update(
        self, ops: Any, num_adds: Any, ids: Any, priorities: Any, alpha: float, max_priority: Any, max_length: int
    ) -> Any:
        """Checks the priorities, sets live ids' leaves to `priority ** alpha` (stale ones change nothing) and
        raises `max_priority`: `(updates, stale count)`, or None without the kernel. A bad priority changes
        nothing: NumPy returns a stale count of -1, TF raises `InvalidArgumentError` when the op runs."""
        kernel = self.kernel()
        return (
            None if kernel is None else kernel.ring_update(num_adds, ids, priorities, alpha, max_priority, max_length)
        )

    def lock_free(self, ops: Any) -> bool:
        """Whether the compiled ring update here needs no buffer lock (see `arrays/kernels.py`)."""
        kernel = self.kernel()
        return kernel is not None and kernel.lock_free
