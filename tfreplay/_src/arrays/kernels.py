"""The compiled sum tree behind one interface per twin: ctypes calls on NumPy arrays, TF ops on a variable.

A sum tree (`samplers/sum_tree.py`) picks its finder when its sampler is bound
(`sum_tree_finder`), which gives one of these, or None where no compiled code
runs (no library, a variable off the CPU, inside XLA); the tree then runs the
same arithmetic in array ops. Both adapters take and return the same things,
so the tree is written once.

`lock_free`: the TF ring update reads the buffer's `num_adds` variable under
the tree's own lock (see `native/kernels/sum_tree_ops.cc`), so it needs no
buffer lock; the NumPy one reads counter values the caller passes, under
the buffer's lock.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay import native
from tfreplay._src.arrays import stacks
from tfreplay._src.arrays.ops import under_xla
from tfreplay.native import address


def _c(array: Any, dtype: Any) -> np.ndarray:
    """A C-contiguous array of `dtype` (no copy when it already is one)."""
    return np.ascontiguousarray(array, dtype)


class NumpySumTree:
    """The ctypes functions of `native/kernels/sum_tree.cc` on one tree array (which is never replaced)."""

    lock_free = False

    def __init__(self, library: Any, array: np.ndarray):
        self._lib, self._tree, self._leaves = library, address(array), array.shape[0] // 2
        self._held: dict[str, tuple] = {}  # role -> (an array the buffer keeps, its address)

    def _held_address(self, role: str, array: np.ndarray) -> int:
        """The address of `array`, taken once while the same array comes for `role`: the buffer's `num_adds` and
        the sampler's largest priority are kept and assigned in place (a restore copies into them too)."""
        held = self._held.get(role)
        if held is None or held[0] is not array:
            held = self._held[role] = (array, address(array))
        return held[1]

    def set(self, rows: Any, values: Any) -> list:
        rows, values = _c(rows, np.int64), _c(values, np.float64)
        self._lib.tfreplay_sum_tree_set(self._tree, self._leaves, address(rows), address(values), rows.size)
        return []

    def descend(self, targets: Any) -> tuple[np.ndarray, np.ndarray]:
        targets = _c(targets, np.float64)
        rows, mass = np.empty(targets.shape, np.int64), np.empty(targets.shape, np.float64)
        self._lib.tfreplay_sum_tree_descend(
            self._tree, self._leaves, address(targets), targets.size, address(rows), address(mass)
        )
        return rows, mass

    def ring_draw(self, num_adds: Any, uniform: Any, max_length: int, n: int, stratified: bool) -> tuple:
        adds, uniform = _c(num_adds, np.int64), _c(uniform, np.float64)
        size = uniform.size
        out = np.empty([4, size], np.int64)  # segment, t, leaf (float64), ok (bool): one allocation, one address
        at = address(out)
        all_ok = self._lib.tfreplay_ring_draw(
            self._tree,
            self._leaves,
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

    def ring_sample(self, num_adds: Any, uniform: Any, max_length: int) -> tuple:
        adds, uniform = _c(num_adds, np.int64), _c(uniform, np.float64)
        size = uniform.size
        out = np.empty([5, size], np.int64)  # segment, t, leaf (float64), ok (bool), probabilities (float32)
        at = address(out)
        code = self._lib.tfreplay_ring_sample(
            self._tree,
            self._leaves,
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
        self, num_adds: Any, ids: Any, priorities: Any, alpha: float, max_priority: Any, max_length: int
    ) -> tuple[list, Any]:
        """`(updates, stale count)`; stale count -1: a bad priority, nothing written (the caller raises)."""
        adds, ids, priorities = _c(num_adds, np.int64), _c(ids, np.int64), _c(priorities, np.float64)
        values = np.power(np.abs(priorities), alpha)  # the same for good priorities; no warning for bad ones
        stale = self._lib.tfreplay_ring_update(
            self._tree,
            self._leaves,
            self._held_address("num_adds", adds),
            adds.size,
            max_length,
            address(ids),
            address(values),
            address(priorities),
            ids.size,
            self._held_address("max_priority", max_priority),
        )
        return [], np.int64(stale)


class TFSumTree:
    """The TF ops of `native/kernels/sum_tree_ops.cc` on one tree variable (CPU, outside XLA)."""

    lock_free = True

    def __init__(self, module: Any, variable: tf.Variable):
        self._ops, self._tree = module, variable

    def set(self, rows: Any, values: Any) -> list:
        return [self._ops.tfreplay_sum_tree_set(self._tree.handle, tf.reshape(rows, [-1]), tf.reshape(values, [-1]))]

    def descend(self, targets: Any) -> tuple:
        return self._ops.tfreplay_sum_tree_descend(self._tree.handle, targets)

    def ring_draw(self, num_adds: Any, uniform: Any, max_length: int, n: int, stratified: bool) -> tuple:
        return self._ops.tfreplay_ring_draw(
            self._tree.handle, num_adds, uniform, max_length=max_length, num_steps=n, stratified=stratified
        )

    def ring_sample(self, num_adds: Any, uniform: Any, max_length: int) -> tuple:
        return self._ops.tfreplay_ring_sample(self._tree.handle, num_adds, uniform, max_length=max_length)

    def ring_update(
        self, num_adds: Any, ids: Any, priorities: Any, alpha: float, max_priority: Any, max_length: int
    ) -> tuple[list, Any]:
        """`num_adds` is the counters' variable, read by the op under the tree's lock; a bad priority raises
        `InvalidArgumentError` when the op runs and changes nothing."""
        values = tf.ones_like(priorities) if alpha == 0 else tf.exp(alpha * tf.math.log(priorities))
        stale = self._ops.tfreplay_ring_update(
            self._tree.handle, max_priority.handle, num_adds.handle, ids, values, priorities, max_length=max_length
        )
        return [stale], stale


def numpy_sum_tree(array: np.ndarray) -> NumpySumTree | None:
    library = native.sum_tree_library()
    return None if library is None else NumpySumTree(library, array)


def tf_sum_tree(variable: tf.Variable, under_xla: bool, on_cpu: bool) -> TFSumTree | None:
    if under_xla or not on_cpu:
        return None
    module = native.sum_tree_ops()
    return None if module is None else TFSumTree(module, variable)


def sum_tree_finder(array: Any) -> Callable[[], NumpySumTree | TFSumTree | None]:
    """How the sum tree in `array` finds its compiled loops. A NumPy array's never change (the tree array is never
    replaced): looked up on first use, then kept. A variable's are decided at each trace: the TF ops need the
    variable on the CPU and a trace outside XLA."""
    if isinstance(array, np.ndarray):
        return functools.cache(lambda: numpy_sum_tree(array))
    return lambda: tf_sum_tree(array, under_xla(), stacks.on_cpu(array))
