"""Proportional prioritized sampling (Schaul et al. 2016) from a sum tree.

Each storage row has a priority `p`; a window is drawn with probability
`p^alpha / sum`, where `p` is the priority of its first item. The sum tree
keeps `p^alpha` in its leaves (one per row, `size` a power of two) and the
sum of two children in each inner node, so a draw descends `log2(size)`
levels and an update climbs them: both vectorised over the whole batch.

New items enter at the largest priority given so far (1 before any update).
A priority of 0 is never drawn until raised. Ids name an item, not a row: an
update for an item since overwritten is ignored (and counted).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import tensorflow as tf

from tfreplay.core import ring
from tfreplay.core.samplers import View

# Rounds of redraws for the rare draw that lands on a row that cannot start a window.
_ROUNDS = 16


class PrioritizedSampler:
    """Draws windows in proportion to `priority ** alpha` of their first item.

    Args:
      alpha: how much priorities count (0: uniform over written rows).
    """

    within_episodes = False

    def __init__(self, alpha: float = 0.6):
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 <= alpha or math.isnan(alpha):
            raise ValueError(f"PrioritizedSampler: alpha ({alpha!r}) must be a non-negative number.")
        self.alpha = float(alpha)

    def bind(self, make: Callable, num_rows: int) -> PrioritizedSampler:
        self.leaves = 1 << max(num_rows - 1, 0).bit_length()
        self.depth = self.leaves.bit_length() - 1
        self.tree = make("sampler/sum_tree", [2 * self.leaves], tf.float64)
        self.max_priority = make("sampler/max_priority", [], tf.float64)
        return self

    def _set(self, ops: Any, rows: Any, values: Any) -> list:
        """Writes leaves, then each level's sums, bottom up (each level after the one below)."""
        node = rows + self.leaves
        updates = [ops.scatter(self.tree, node, values)]
        for _ in range(self.depth):
            node = node // 2

            def climb(node: Any = node) -> Any:
                sums = ops.gather(self.tree, 2 * node) + ops.gather(self.tree, 2 * node + 1)
                return ops.scatter(self.tree, node, sums)

            updates = [ops.after(updates, climb)]
        return updates

    def on_write(self, ops: Any, rows: Any) -> list:
        start = ops.maximum(ops.read(self.max_priority), 1.0) if self.alpha else 1.0
        value = ops.zeros_like(ops.to_float64(rows)) + start**self.alpha
        return self._set(ops, rows, value)

    def clear(self, ops: Any) -> list:
        zeros = ops.zeros_like(ops.read(self.tree))
        return [ops.assign(self.tree, zeros), ops.assign(self.max_priority, zeros[0])]

    def update(self, view: View, ids: Any, priorities: Any) -> tuple[list, Any]:
        """Sets the priorities of live items; returns the updates and how many ids were stale."""
        ops, length, segments = view.ops, view.max_length, view.num_segments
        segment, local = ids % segments, ids // segments
        adds = ops.gather(view.num_adds, segment)
        live = (local >= adds - ops.minimum(adds, length)) & (local < adds)
        rows = ring.local_to_rows(local, segment, length, segments)[0]
        current = ops.gather(self.tree, rows + self.leaves)
        values = ops.where(live, priorities**self.alpha, current)
        largest = ops.max(ops.where(live, priorities, ops.zeros_like(priorities)))
        raised = ops.assign(self.max_priority, ops.maximum(ops.read(self.max_priority), largest))
        stale = ops.sum(ops.to_int64(~live))
        return self._set(ops, rows, values) + [raised], stale

    def mass(self, view: View, num_steps: int | None) -> Any:
        """The summed `priority ** alpha` of the items that can start a window: what probabilities divide by."""
        ops, n = view.ops, num_steps or 1
        min_id, _ = ring.live_range(view.num_adds, view.max_length, ops)
        # The newest n - 1 items of a segment cannot start a window: their mass is left out.
        young = view.num_adds[:, None] - 1 - ops.arange(n - 1)[None, :]
        segments = ops.arange(view.num_segments)[:, None]
        young_rows = ring.local_to_rows(young, segments, view.max_length, view.num_segments)[0]
        young_mass = ops.where(young >= min_id[:, None], ops.gather(self.tree, young_rows + self.leaves), 0.0)
        return ops.gather(self.tree, 1) - ops.sum(young_mass)

    def sample(self, view: View, size: int, num_steps: int | None) -> tuple[Any, Any, Any, Any]:
        ops, n = view.ops, num_steps or 1
        min_id, _ = ring.live_range(view.num_adds, view.max_length, ops)
        mass = ops.gather(self.tree, 1)
        total = self.mass(view, num_steps)
        # Stratified over all the mass; a draw that lands on a row that cannot start a window is drawn again,
        # so each window's chance is its priority over `total`.
        u = (ops.to_float64(ops.arange(size)) + view.uniform([size])) / size * mass
        segment, t, ok = self._descend(view, u, n, min_id)

        def round_(found: Any, segment: Any, t: Any) -> tuple[Any, Any, Any]:
            seg, start, good = self._descend(view, view.uniform([size]) * mass, n, min_id)
            take = good & ~found
            return found | good, ops.where(take, seg, segment), ops.where(take, start, t)

        _, segment, t = ops.loop(lambda found, *_: ~ops.all(found), round_, (ok, segment, t), _ROUNDS)
        rows = ring.local_to_rows(t, segment, view.max_length, view.num_segments)[0]
        probs = ops.to_float32(ops.gather(self.tree, rows + self.leaves) / ops.maximum(total, 1e-300))
        count = ops.to_int64(total > 0)
        return segment, t, probs, count

    def _descend(self, view: View, u: Any, n: int, min_id: Any) -> tuple[Any, Any, Any]:
        """Leaves holding mass `u`; their `(segment, local id, whether they start a valid window)`."""
        ops = view.ops
        node = ops.ones_like(ops.to_int64(u))
        for _ in range(self.depth):
            left = ops.gather(self.tree, 2 * node)
            right = u >= left
            u = u - ops.where(right, left, ops.zeros_like(left))
            node = 2 * node + ops.to_int64(right)
        row = ops.minimum(node - self.leaves, view.max_length * view.num_segments - 1)
        segment, slot = row % view.num_segments, row // view.num_segments
        newest = ops.gather(view.num_adds, segment) - 1
        t = newest - (newest - slot) % view.max_length  # the live id stored in that slot
        mass = ops.gather(self.tree, node)
        ok = (t >= ops.gather(min_id, segment)) & (t + n - 1 <= newest) & (mass > 0)
        return segment, t, ok
