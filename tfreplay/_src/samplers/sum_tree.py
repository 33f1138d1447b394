"""A sum tree in one float64 array or variable, with a native and an array-op path.

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
from tfreplay._src import stacks
from tfreplay._src.ops import under_xla
from tfreplay.native import address

FANOUT = 8
# The layout, in a prioritized buffer's checkpoint record: a checkpoint of another layout (the binary tree of
# tfreplay before it, with no such field) is refused rather than restored into wrong sums.
LAYOUT = f"fanout {FANOUT}"
_UNSET = object()


def fanouts(leaves: int) -> list[int]:
    """The fanout of each level from the root down: 2, 4 or 8 at the root, 8 below (their product is `leaves`)."""
    bits = leaves.bit_length() - 1
    return [1 << (bits % 3 or 3)] + [FANOUT] * ((bits - 1) // 3) if bits else []


class SumTree:
    """The tree of one sampler, made through the twin's `make` (so checkpoints include it).

    Args:
      use_native: use the compiled loops where available (tests turn them off
        to compare both paths).
    """

    def __init__(self, make: Callable, num_rows: int, use_native: bool = True):
        self.leaves = 1 << max(num_rows - 1, 0).bit_length()
        self.fanouts = fanouts(self.leaves)
        self.array = make("sampler/sum_tree", [2 * self.leaves], tf.float64)
        self.use_native = use_native
        # The NumPy array is never replaced (a restore copies into it): its address is taken once, and so is the
        # library (looked up on first use: a lookup takes a lock).
        self._address = address(self.array) if isinstance(self.array, np.ndarray) else 0
        self._library: Any = _UNSET
        self._held: dict[str, tuple] = {}  # role -> (an array the buffer keeps, its address): see `_held_address`

    def _kernel(self) -> Any:
        """The ctypes library (NumPy), the TF op module (a CPU variable outside XLA), or None."""
        if not self.use_native:
            return None
        if isinstance(self.array, np.ndarray):
            if self._library is _UNSET:
                self._library = native.sum_tree_library()
            return self._library
        if under_xla() or not stacks.on_cpu(self.array):
            return None
        return native.sum_tree_ops()

    def compiled(self) -> bool:
        """Whether the loops run in compiled code here (decided when called: eagerly, or while tracing)."""
        return self._kernel() is not None

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
            kernel.tfreplay_sum_tree_set(self._address, self.leaves, address(rows), address(values), rows.size)
            return []
        return [kernel.tfreplay_sum_tree_set(self.array.handle, tf.reshape(rows, [-1]), tf.reshape(values, [-1]))]

    def _children(self, ops: Any, node: Any, f: int) -> tuple:
        """The values of the `f` children of each node, first to last."""
        return ops.unstack(ops.gather(self.array, ops.arange(f)[:, None] + f * ops.reshape(node, [1, -1])), 0)

    def _set_ops(self, ops: Any, rows: Any, values: Any) -> list:
        node = ops.reshape(rows, [-1]) + self.leaves
        updates = [ops.scatter(self.array, node, ops.reshape(values, [-1]))]
        for f in reversed(self.fanouts):  # each level after the one below
            node = node // f

            def climb(node: Any = node, f: int = f) -> Any:
                if isinstance(self.array, np.ndarray):  # one accumulate: the same additions, in order
                    block = self.array[np.arange(f)[:, None] + f * node]  # [f, n]: each step vectorised over n
                    return ops.scatter(self.array, node, np.add.accumulate(block)[-1])
                children = self._children(ops, node, f)
                total = children[0]
                for child in children[1:]:  # first to last (a TF graph may make this one AddN: same order)
                    total = total + child
                return ops.scatter(self.array, node, total)

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
            kernel.tfreplay_sum_tree_descend(
                self._address, self.leaves, address(targets), targets.size, address(rows), address(mass)
            )
            return rows, mass
        return kernel.tfreplay_sum_tree_descend(self.array.handle, targets)

    def _descend_ops(self, ops: Any, u: Any) -> tuple[Any, Any]:
        """The descent in array ops: NumPy, or TF (also under XLA)."""
        if isinstance(self.array, np.ndarray):
            return self._descend_numpy(u)
        node = ops.ones_like(ops.to_int64(u))
        for f in self.fanouts:
            children = self._children(ops, node, f)
            running = [children[0]]
            for child in children[1 : f - 1]:  # first to last
                running.append(running[-1] + child)
            sums = tf.stack(running)  # [f - 1, n]
            past = u >= sums
            u = u - tf.reduce_max(tf.where(past, sums, tf.zeros_like(sums)), 0)  # sums only grow: the last passed
            node = f * node + tf.reduce_sum(tf.cast(past, tf.int64), 0)
        return node - self.leaves, ops.gather(self.array, node)

    def _descend_numpy(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`_descend_ops` over whole child blocks: ufunc.accumulate adds in order, so the running sums are the
        same floats."""
        u = np.asarray(u, np.float64).reshape(-1)
        node = np.ones(u.shape, np.int64)
        for f in self.fanouts:  # [f - 1, n] blocks: each step of the accumulation is vectorised over n
            running = np.add.accumulate(self.array[np.arange(f - 1)[:, None] + f * node])
            past = u >= running
            u = u - np.where(past, running, 0.0).max(axis=0)  # running sums only grow: the last one passed
            node = f * node + past.sum(axis=0)
        return node - self.leaves, self.array[node]

    # Ring windows (no episode index) in one native call each; None without the kernel.
    def ring_draw(self, ops: Any, num_adds: Any, uniform: Any, max_length: int, n: int, stratified: bool) -> Any:
        """`(segment, t, leaf, ok, all ok)` as `PrioritizedSampler._draw` computes them, or None."""
        kernel = self._kernel()
        if kernel is None:
            return None
        if not isinstance(self.array, np.ndarray):
            return kernel.tfreplay_ring_draw(
                self.array.handle, num_adds, uniform, max_length=max_length, num_steps=n, stratified=stratified
            )
        adds, uniform = _c(num_adds, np.int64), _c(uniform, np.float64)
        size = uniform.size
        out = np.empty([4, size], np.int64)  # segment, t, leaf (float64), ok (bool): one allocation, one address
        at = address(out)
        all_ok = kernel.tfreplay_ring_draw(
            self._address,
            self.leaves,
            self._held_address("num_adds", adds),
            adds.size,
            max_length,
            n,
            address(uniform),
            size,
            stratified,
            at,
            at + 8 * size,
            at + 16 * size,
            at + 24 * size,
        )
        return out[0], out[1], out[2].view(np.float64), out[3].view(np.bool_)[:size], all_ok

    def ring_sample(self, ops: Any, num_adds: Any, uniform: Any, max_length: int) -> Any:
        """Single items of ring windows: the first (stratified) draw of `PrioritizedSampler.sample` with its
        probabilities, from one read of the tree: `(segment, t, leaf, ok, all ok, probabilities, count)`, or None
        without the kernel."""
        kernel = self._kernel()
        if kernel is None:
            return None
        if not isinstance(self.array, np.ndarray):
            return kernel.tfreplay_ring_sample(self.array.handle, num_adds, uniform, max_length=max_length)
        adds, uniform = _c(num_adds, np.int64), _c(uniform, np.float64)
        size = uniform.size
        out = np.empty([5, size], np.int64)  # segment, t, leaf (float64), ok (bool), probabilities (float32)
        at = address(out)
        code = kernel.tfreplay_ring_sample(
            self._address,
            self.leaves,
            self._held_address("num_adds", adds),
            adds.size,
            max_length,
            address(uniform),
            size,
            at,
            at + 8 * size,
            at + 16 * size,
            at + 24 * size,
            at + 32 * size,
        )
        probs = out[4].view(np.float32)[:size]
        return out[0], out[1], out[2].view(np.float64), out[3].view(np.bool_)[:size], code & 1, probs, code >> 1

    def ring_update(
        self, ops: Any, num_adds: Any, ids: Any, priorities: Any, alpha: float, max_priority: Any, max_length: int
    ) -> Any:
        """Checks the priorities, sets live ids' leaves to `priority ** alpha` (stale ones change nothing) and
        raises `max_priority`: `(updates, stale count)`, or None without the kernel. A bad priority raises
        (TF: `InvalidArgumentError` when the op runs) and changes nothing. `num_adds`: its values (NumPy), or the
        variable (TF), which the op reads under the tree's lock."""
        kernel = self._kernel()
        if kernel is None:
            return None
        if not isinstance(self.array, np.ndarray):  # `num_adds` the variable: the op reads it under the tree's lock
            stale = kernel.tfreplay_ring_update(
                self.array.handle,
                max_priority.handle,
                num_adds.handle,
                ids,
                ops.power(priorities, alpha),
                priorities,
                max_length=max_length,
            )
            return [stale], stale
        adds, ids, priorities = _c(num_adds, np.int64), _c(ids, np.int64), _c(priorities, np.float64)
        values = ops.power(np.abs(priorities), alpha)  # the same for good priorities; no warning for bad ones
        stale = kernel.tfreplay_ring_update(
            self._address,
            self.leaves,
            self._held_address("num_adds", adds),
            adds.size,
            max_length,
            address(ids),
            address(values),
            address(priorities),
            ids.size,
            self._held_address("max_priority", max_priority),
        )
        if stale < 0:  # a bad priority: nothing was written
            from tfreplay._src.buffer import check_priorities  # here: the buffer module imports the samplers

            check_priorities(ids.shape, priorities.shape, priorities)  # raises, naming the bad values
        return [], np.int64(stale)

    def _held_address(self, role: str, array: np.ndarray) -> int:
        """The address of `array`, taken once while the same array comes for `role`: the buffer's `num_adds` and
        the sampler's largest priority are kept and assigned in place (a restore copies into them too)."""
        held = self._held.get(role)
        if held is None or held[0] is not array:
            held = self._held[role] = (array, address(array))
        return held[1]


def _c(array: Any, dtype: Any) -> np.ndarray:
    """A C-contiguous array of `dtype` (no copy when it already is one)."""
    return np.ascontiguousarray(array, dtype)
