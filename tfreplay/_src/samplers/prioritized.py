"""Proportional prioritized sampling (Schaul et al. 2016) from a sum tree.

Each storage row has a priority `p`; a window is drawn with probability
`p^alpha / sum`, where `p` is the priority of its first item and the sum runs
over the windows that can be drawn now. The sum tree (`sum_tree.py`) keeps
`p^alpha` in its leaves, one per row, so a draw descends `log2(rows)` levels
and an update climbs them, both vectorised over the whole batch.

Which rows cannot start a window:

* rows that never can (a frame buffer's first frames: a transition needs the
  frame before it) get leaf 0 when written and keep it;
* a bounded set that moves with the ring (`excluded_mass`): the newest
  `num_steps - 1` items of each segment (a window would cross the write
  head) and, with frames, the oldest `history_len` of each segment whose
  stack would show an overwritten frame. Their mass is subtracted from the
  sum, and a draw that lands on one is drawn again, so each window's chance is
  exactly its share of the drawable mass.

Padded windows (a transform's, e.g. `NStepReturns`, that may run past an
episode's end) start at any item drawable alone except each segment's newest
`episodes.young_starts`: the same bounded set, so they stay exact. Strict
windows of `num_steps > 1` that must stay inside one episode (frames, or
`within_episodes=True`) are refused: every episode's last steps would be an
unbounded set of exceptions, and the probabilities would no longer be exact.

New items enter at the largest priority given so far (1 before any update).
A priority of 0 is never drawn until raised; when the drawable mass is 0 (or
below 1e-12 of the tree's sum, where the subtraction's rounding could hide
it) the buffer counts as empty. Ids name an item, not a row: an
update for an item since overwritten is ignored (and counted). The TF twin's
compiled update of ring windows takes no buffer lock (`unlocked_update`); an
add running beside it may let its items enter at the largest priority from
just before that update, and a sample of windows of several items running
beside it (read in several ops) may take its sum and its leaves on either
side of it. A sample of single items reads the tree once.
"""

from __future__ import annotations

import copy
import math
import sys
from typing import Any

import numpy as np
import tensorflow as tf

from tfreplay._src.index import episodes, ring
from tfreplay._src.samplers import Make, SamplerBase, View, refuse
from tfreplay._src.samplers.sum_tree import LAYOUT, SumTree

# Rounds of redraws for draws that land on a row that cannot start a window; the rest come from an exact scan.
_ROUNDS = 16
# The drawable mass counts as none below this share of the tree's sum: subtracting the excluded mass rounds.
_EMPTY_SHARE = 1e-12


class PrioritizedSampler(SamplerBase):
    """Draws windows in proportion to `priority ** alpha` of their first item.

    Args:
      alpha: how much priorities count (0: uniform over written rows).
      within_episodes: windows never cross an episode boundary (then only
        single items, `num_steps` None or 1, can be drawn exactly).
      use_native: run the sum tree's loops in compiled code where available
        (`tfreplay.native`); off, the same draws come from array ops.
    """

    padded_windows = True
    checkpoint_record = {"sum_tree": LAYOUT}  # how the tree's nodes are laid out
    tree: SumTree
    max_priority: Any
    most_value: float  # the largest leaf that keeps every leaf summed finite

    def __init__(self, alpha: float = 0.6, within_episodes: bool = False, use_native: bool = True):
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 <= alpha or math.isnan(alpha):
            raise ValueError(f"PrioritizedSampler: alpha ({alpha!r}) must be a non-negative number.")
        self.alpha = float(alpha)
        self.within_episodes = bool(within_episodes)
        self.use_native = bool(use_native)

    def bind(self, make: Make, num_rows: int) -> PrioritizedSampler:
        """A copy holding the sum tree of `num_rows` leaves and the largest priority given so far."""
        bound = copy.copy(self)
        bound.tree = SumTree(make, num_rows, self.use_native)
        bound.max_priority = make("sampler/max_priority", [], tf.float64)
        # The largest value a leaf may hold so that every leaf summed stays finite, and the priority that gives it.
        bound.most_value = sys.float_info.max / (2 * bound.tree.leaves)
        bound.priority_limit = _root(bound.most_value, self.alpha)
        return bound

    def on_write(self, ops: Any, rows: Any, startable: Any = None) -> list:
        start = ops.power(ops.maximum(ops.read(self.max_priority), 1.0), self.alpha) if self.alpha else 1.0
        value = ops.zeros_like(ops.to_float64(rows)) + start
        if startable is not None:  # rows that can never start a window are never drawn
            value = ops.where(startable, value, ops.zeros_like(value))
        return self.tree.set(ops, rows, value)

    def clear(self, ops: Any) -> list:
        return self.tree.clear(ops) + [ops.assign(self.max_priority, ops.zeros_like(ops.read(self.max_priority)))]

    def update(self, view: View, ids: Any, priorities: Any) -> tuple[list, Any]:
        """Sets the priorities of live items; returns the updates and how many ids were stale."""
        ops, length, segments = view.ops, view.max_length, view.num_segments
        if view.window is None:  # ring windows: one compiled call where built
            fused = self.tree.ring_update(ops, view.num_adds, ids, priorities, self.alpha, self.max_priority, length)
            if fused is not None:
                return fused
        segment, local = ids % segments, ids // segments
        adds = ops.gather(view.num_adds, segment)
        live = (local >= adds - ops.minimum(adds, length)) & (local < adds)
        rows = ring.local_to_rows(local, segment, length, segments)[0]
        # A bad priority rewrites nothing and makes the stale count -1, which the twin refuses: every row keeps its
        # value and the largest priority stays.
        power = ops.power(ops.maximum(priorities, 0.0), self.alpha)
        good = ops.all((priorities < math.inf) & ~ops.negative(priorities) & (power <= self.most_value))
        allowed = live & good
        if view.window is not None and view.window.lead:  # a row that can never start a window keeps leaf 0
            assert view.pos_at is not None  # a window goes with the episode index
            allowed = allowed & (view.pos_at(rows) >= view.window.lead)
        values = ops.where(allowed, power, self.tree.leaf(ops, rows))
        largest = ops.max(ops.where(allowed, priorities, ops.zeros_like(priorities)))
        raised = self._raise(ops, largest)
        stale = ops.where(good, ops.sum(ops.to_int64(~live)), -ops.ones_like(ops.sum(ops.to_int64(~live))))

        # A stale id may share its row with a live one; it rewrites the row's value, so it goes first: of
        # duplicate rows the last write wins, and the last live id's priority is the one kept.
        def stale_first() -> tuple[Any, Any]:
            order = ops.argsort_stable(ops.to_int32(live))
            return ops.gather(rows, order), ops.gather(values, order)

        rows, values = ops.cond(stale > 0, stale_first, lambda: (rows, values))
        return self.tree.set(ops, rows, values) + [raised], stale

    def unlocked_update(self, view: View, ids: Any, priorities: Any) -> Any:
        """An update of ring windows without the buffer's lock where the compiled one allows it (TF):
        `(updates, stale count)`, else None (then `update`, locked). One compiled op (the check, stale ids,
        the write, the raise) reads the counters' variable (`view.num_adds`) under the tree's own lock, and
        writers move the counters before they set new rows' leaves: an update never lands on an item that
        overwrote its own (see `native/kernels/sum_tree_ops.cc`)."""
        if view.window is not None or not self.tree.lock_free(view.ops):
            return None
        return self.tree.ring_update(
            view.ops, view.num_adds, ids, priorities, self.alpha, self.max_priority, view.max_length
        )

    def checks_priorities(self, view: View) -> bool:
        """Whether `update` refuses a bad priority itself: the compiled ring update does (`view.window` None)."""
        return view.window is None and self.tree.kernel() is not None

    def check_state(self, values: dict, live: Any, startable: Any) -> None:
        """A saved tree: every leaf finite, non-negative, at most `most_value`, zero on rows that hold no item or
        can never start a window; every inner node the sum of its children as the tree adds them; the largest
        priority finite and non-negative."""
        tree, most = np.asarray(values["sampler/sum_tree"], np.float64), values["sampler/max_priority"]
        leaves = tree[self.tree.leaves :]
        rows = live.shape[0]
        empty = ~live if startable is None else ~(live & startable)
        bad = ~np.isfinite(leaves) | (leaves.view(np.int64) < 0) | (leaves > self.most_value)
        bad[:rows] |= empty & (leaves[:rows] != 0)
        bad[rows:] |= leaves[rows:] != 0  # padding past the rows is never drawn
        if bad.any():
            raise refuse(
                "sampler/sum_tree leaves", leaves[bad], "finite priority ** alpha of stored items (0 elsewhere)"
            )
        if not np.array_equal(tree, self.tree.rebuilt(leaves)):
            raise refuse("sampler/sum_tree", tree[: self.tree.leaves], "the sums of its leaves, as the tree adds them")
        most = np.asarray(most, np.float64)
        if not (np.isfinite(most) and most.view(np.int64) >= 0 and most <= self.priority_limit):
            rule = f"a finite, non-negative priority at most {self.priority_limit:.4g} (new items enter at it)"
            raise refuse("sampler/max_priority", most, rule)

    def _raise(self, ops: Any, largest: Any) -> Any:
        """New items enter at the largest priority given so far."""
        return ops.assign(self.max_priority, ops.maximum(ops.read(self.max_priority), largest))

    def mass(self, view: View, num_steps: int | None) -> Any:
        """The summed `priority ** alpha` of the windows `sample` draws from (0 when it counts as empty)."""
        ops, n = view.ops, num_steps or 1
        mass = self.tree.total(ops)
        excluded = excluded_mass(view, self.tree, n)
        total = mass if excluded is None else mass - excluded
        return ops.where(total > mass * _EMPTY_SHARE, total, ops.zeros_like(total))

    def sample(self, view: View, size: int, num_steps: int | None) -> tuple[Any, Any, Any, Any]:
        ops, n = view.ops, num_steps or 1
        uniform = view.uniform([size])
        if view.window is None and n == 1:  # single items of ring windows: one native call, where built
            fused = self.tree.ring_sample(ops, view.num_adds, uniform, view.max_length)
            if fused is not None:
                segment, t, leaf, ok, all_ok, probs, count = fused
                first = (segment, t, leaf, ok, all_ok)
                return ops.rare(
                    all_ok, lambda: (segment, t, probs, count), lambda: self._drawn(view, size, n, uniform, first)
                )
        return self._drawn(view, size, n, uniform)

    def _drawn(self, view: View, size: int, n: int, uniform: Any, first: tuple | None = None) -> tuple:
        """`sample` from its first uniform draws (or, `first`, what the stratified draw at them found)."""
        ops = view.ops
        mass = self.tree.total(ops)
        excluded = excluded_mass(view, self.tree, n)
        total = mass if excluded is None else mass - excluded
        count = ops.to_int64(total > mass * _EMPTY_SHARE)
        # Stratified over all the mass; draws that land on a row that cannot start a window are drawn again.
        drawn = self._draw(view, uniform, mass, n, stratified=True) if first is None else first
        segment, t, leaf, ok, all_ok = drawn

        def round_(found: Any, segment: Any, t: Any, leaf: Any) -> tuple:
            seg, start, value, good, _ = self._draw(view, view.uniform([size]), mass, n, stratified=False)
            take = good & ~found
            return found | good, ops.where(take, seg, segment), ops.where(take, start, t), ops.where(take, value, leaf)

        def redraw() -> tuple[Any, Any, Any]:  # rare: a sample that hit pays nothing for it
            found, seg, start, value = ops.loop(
                lambda found, *_: ~ops.all(found), round_, (ok, segment, t, leaf), _ROUNDS
            )

            def exact() -> tuple[Any, Any, Any]:
                s, st, v = self._scan(view, size, n)
                return ops.where(found, seg, s), ops.where(found, start, st), ops.where(found, value, v)

            return ops.cond(ops.all(found) | (count <= 0), lambda: (seg, start, value), exact)

        segment, t, leaf = ops.rare(all_ok, lambda: (segment, t, leaf), redraw)
        # An empty buffer's sample is refused: dividing by 1 more only keeps its probabilities finite.
        probs = ops.to_float32(leaf / (total + ops.to_float64(count <= 0)))
        return segment, t, probs, count

    def _draw(self, view: View, uniform: Any, mass: Any, n: int, stratified: bool) -> tuple:
        """Leaves at masses `(i + uniform_i) / size * mass` (stratified) or `uniform_i * mass`:
        `(segment, local id, leaf value, whether a window starts there, whether all do)`; ring windows in one
        native call."""
        ops = view.ops
        if view.window is None:
            drawn = self.tree.ring_draw(ops, view.num_adds, uniform, view.max_length, n, stratified)
            if drawn is not None:
                return drawn
        size = uniform.shape[0]
        u = (ops.to_float64(ops.arange(size)) + uniform) / size * mass if stratified else uniform * mass
        rows, leaf = self.tree.descend(ops, u)
        rows = ops.minimum(rows, view.max_length * view.num_segments - 1)  # past the rows: leaf 0, not drawn
        segment, slot = rows % view.num_segments, rows // view.num_segments
        newest = ops.gather(view.num_adds, segment) - 1
        t = newest - (newest - slot) % view.max_length  # the live id stored in that slot
        ok = startable(view, segment, t, n) & (leaf > 0)
        return segment, t, leaf, ok, ops.all(ok)

    def _scan(self, view: View, size: int, n: int) -> tuple[Any, Any, Any]:
        """Exact draws over every row (the rare samples that kept missing): `(segment, t, leaf value)`."""
        ops = view.ops
        k = ops.arange(view.max_length)[None, :]
        segments = ops.arange(view.num_segments)[:, None] + ops.zeros_like(k)
        t = ops.reshape(view.num_adds, [-1, 1]) - 1 - k  # every slot's newest id, newest first
        rows = ring.local_to_rows(t, segments, view.max_length, view.num_segments)[0]
        leaf = self.tree.leaf(ops, rows)
        weight = ops.reshape(ops.where(startable(view, segments, t, n), leaf, ops.zeros_like(leaf)), [-1])
        running = ops.cumsum(weight)
        pick = ops.searchsorted(running, view.uniform([size]) * running[-1])
        pick = ops.minimum(pick, view.num_segments * view.max_length - 1)
        seg, t = pick // view.max_length, ops.gather(ops.reshape(t, [-1]), pick)
        return seg, t, ops.gather(weight, pick)


def _root(value: float, alpha: float) -> float:
    """`value ** (1 / alpha)`, inf where that overflows (or alpha is 0: every priority gives 1)."""
    try:
        return value ** (1 / alpha) if alpha else math.inf
    except OverflowError:
        return math.inf


def young(view: View, n: int) -> Any:
    """Per segment, how many of its newest items cannot start a window of `n` (the write head, or for
    padded windows an unfinished episode)."""
    window = view.window if view.padded else None
    return episodes.young_starts(view.num_adds, view.max_length, n, window, view.newest, view.ops)


def startable(view: View, segment: Any, t: Any, n: int) -> Any:
    """Whether a window of `n` items can start at local id `t` of `segment` now.

    It must lie inside the live range, short of the segment's `young` newest
    items and, when windows go through the episode index, pass the window
    shape's rule (for a padded window, the rule of its first item alone).
    """
    ops = view.ops
    adds = ops.gather(view.num_adds, segment)
    min_id = adds - ops.minimum(adds, view.max_length)
    ok = (t >= min_id) & (t < adds - ops.gather(young(view, n), segment))
    if view.window is None:
        return ok
    assert view.pos_at is not None  # a window goes with the episode index
    m = 1 if view.padded else n
    end = ops.maximum(t + (m - 1), 0)
    end_pos = view.pos_at(ring.local_to_rows(end, segment, view.max_length, view.num_segments)[0])
    return ok & view.window.is_valid(t, end_pos, min_id, m)


def excluded_mass(view: View, tree: SumTree, n: int) -> Any:
    """The mass of live rows that cannot start a window of `n` now (`startable` is false), or None when no such
    row can exist (single items without frame history).

    Besides rows of leaf 0, only a bounded set of each segment can hold such
    rows: its `young` newest items (at most `n - 1`) and, through the episode
    index, its oldest `history` items (their stack may show an overwritten
    frame); a row in both counts once, as young.
    """
    ops = view.ops
    history = view.window.history if view.window is not None else 0
    if n == 1 and not history:  # no young items (`young` is at most n - 1) and no history to lose
        return None
    adds = ops.reshape(view.num_adds, [-1, 1])
    min_id = adds - ops.minimum(adds, view.max_length)
    first_young = adds - ops.reshape(young(view, n), [-1, 1])

    def mass(t: Any, bad: Any) -> Any:
        segment = ops.arange(view.num_segments)[:, None] + ops.zeros_like(t)
        rows = ring.local_to_rows(ops.maximum(t, 0), segment, view.max_length, view.num_segments)[0]
        leaf = tree.leaf(ops, rows)
        return ops.sum(ops.where(bad & (t >= min_id) & (t < adds), leaf, ops.zeros_like(leaf)))

    total = 0.0
    if n > 1:
        t = adds - 1 - ops.arange(n - 1)[None, :]
        total = total + mass(t, t >= first_young)
    if history:
        t = min_id + ops.arange(history)[None, :]
        segment = ops.arange(view.num_segments)[:, None] + ops.zeros_like(t)
        total = total + mass(t, (t < first_young) & ~startable(view, segment, t, n))
    return total
