"""The episode index: where each stored item stands in its episode.

Any buffer whose items carry episode boundaries keeps, beside the ring, `pos`
(per storage row: the item's step index in its episode, 0 at an episode's
first item), `pos_counts` (per segment: how many live rows have each
`pos`, the last bin holding every `pos >= POS_BINS - 1`) and `newest` (per
segment: its newest item's `[pos, ended]`). All are updated on every write,
including the rows a write overwrites, so samplers can count and draw
windows that stay inside one episode without scanning.

A window of `n` items starting at local id `t` ends at `e = t + n - 1`. For
a storage with `lead` and `history` (rows: 0 and 0; frames: an item is the
transition into its row, so `lead = 1`, and it shows `history` frames before
it) the window is valid when

* `pos[e] >= n - 1 + lead`: items `t - lead .. e` are steps of one episode, and
* everything it shows is live: `t - history >= min_id` (all of it), or the
  episode starts inside the live range (`e - pos[e] >= min_id`), so anything
  older is shown as zeros (frames) or not at all (rows).

So no window joins two episodes, and nothing is read across the write head.

*Padded* windows (`young_starts`, `window_mask`) may run past their
episode's end: item `t + k` is real when it is stored and one step further
into `t`'s episode (`pos[t + k] == pos[t] + k`); the rest is padding. A
start is drawable when it is drawable as a single item and its window is
complete or its episode ended inside it at a stored item (the next item is
stored and starts another episode, or an end field marks it), never when
the window runs past the write head of an unfinished episode. Those are
only the newest `min(n - 1, drawable items of the newest episode)` items of
a segment, so padded windows are counted and drawn without a scan.
The functions take an `ops` namespace (`arrays/ops.py`).
"""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Callable

import tensorflow as tf

from tfreplay._src.index import ring

# pos saturates here, so a never-ending episode cannot overflow int32.
POS_CAP = 2**30
# Windows of fewer than POS_BINS - lead items are counted from `pos_counts`;
# longer ones by a scan of every row. A checkpoint records it (`checkpoint.layout`).
POS_BINS = 256
STEP_TYPE_FIRST = 0


@dataclasses.dataclass(frozen=True)
class EpisodeRule:
    """Which fields mark episode boundaries.

    Attributes:
      start: path of a field marking an episode's first item: a bool
        (`first`, True there) or an integer `step_type` (TF-Agents' `FIRST`, 0).
      ends: paths of bool fields marking an episode's last item (e.g.
        `terminated`, `truncated`): the next item starts a new episode.
    """

    start: str | None = None
    ends: tuple[str, ...] = ()

    @staticmethod
    def detect(data_spec: Any, paths: list[str]) -> EpisodeRule | None:
        """The rule of a spec with top-level `step_type` or `first` (and `terminated`/`truncated`), else None."""
        if not isinstance(data_spec, collections.abc.Mapping) and not hasattr(data_spec, "_fields"):
            return None
        by_path = dict(zip(paths, tf.nest.flatten(data_spec)))
        scalar = {p: s for p, s in by_path.items() if s.shape.rank == 0}
        start = next((p for p in ("step_type", "first") if p in scalar), None)
        if start == "first" and scalar["first"].dtype != tf.bool:
            start = None
        ends = tuple(p for p in ("terminated", "truncated") if p in scalar and scalar[p].dtype == tf.bool)
        return EpisodeRule(start, ends) if start or ends else None

    def check(self, where: str, paths: list[str], leaf_specs: list) -> None:
        by_path = dict(zip(paths, leaf_specs))
        for path in ([self.start] if self.start else []) + list(self.ends):
            spec = by_path.get(path)
            if spec is None or spec.shape.rank != 0:
                raise ValueError(f"{where}: episode field {path!r} must be a scalar leaf of data_spec; got {spec!r}.")
            if path in self.ends and spec.dtype != tf.bool:
                raise TypeError(f"{where}: episode end field {path!r} ({spec.dtype.name}) must be tf.bool.")

    def flags(self, leaves_by_path: dict, ops: Any) -> tuple[Any, Any]:
        """`(starts, ends)` of a batch: whether each item starts / ends an episode (None if no such field)."""
        starts = ends = None
        if self.start:
            value = leaves_by_path[self.start]
            starts = value if value.dtype == bool or value.dtype == tf.bool else value == STEP_TYPE_FIRST
        for path in self.ends:
            ends = leaves_by_path[path] if ends is None else ends | leaves_by_path[path]
        return starts, ends


def new_pos(prev_pos: Any, has_prev: Any, starts: Any, ops: Any) -> Any:
    """`pos` of `T` new items per segment (`starts`: `[T, S]`), after items with `prev_pos` (`[S]`).

    An item starts an episode when flagged or when its segment held nothing
    before; otherwise it is one step after the item before it.
    """
    starts = starts | (ops.arange(starts.shape[0])[:, None] == 0) & ~has_prev[None, :]
    step = ops.arange(starts.shape[0])[:, None] + ops.zeros_like(ops.to_int64(starts))
    last_start = ops.cummax0(ops.where(starts, step, -ops.ones_like(step)))
    running = ops.minimum(prev_pos[None, :] + 1 + step, POS_CAP)
    return ops.where(last_start >= 0, step - last_start, running)


def pos_bin(pos: Any, ops: Any) -> Any:
    """The bin of `pos` in `pos_counts`."""
    return ops.minimum(pos, POS_BINS - 1)


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a window needs of the index: see the module docstring."""

    lead: int = 0
    history: int = 0

    def need(self, n: int) -> int:
        return n - 1 + self.lead

    def is_valid(self, t: Any, end_pos: Any, min_id: Any, n: int) -> Any:
        end = t + (n - 1)
        shown_live = (t - self.history >= min_id) | (end - end_pos >= min_id)
        return (end_pos >= self.need(n)) & shown_live

    def draw_range(self, num_adds: Any, max_length: int, n: int, ops: Any) -> tuple[Any, Any]:
        """Per segment, the first start worth drawing and how many follow (ends already stored)."""
        min_id, num_live = ring.live_range(num_adds, max_length, ops)
        return min_id + self.lead, ops.maximum(num_live - n - self.lead + 1, 0)

    def counted(self, n: int) -> bool:
        """Whether windows of `n` are counted from `pos_counts` (else by a scan)."""
        return self.need(n) <= POS_BINS - 1

    def count(self, num_adds: Any, pos_counts: Any, pos_at: Callable, max_length: int, n: int, ops: Any) -> Any:
        """Valid windows of `n` items in the whole buffer.

        A window is counted at its end row `e`, which needs `pos[e] >= need`:
        `pos_counts` gives how many live rows have that. Of these, only the
        oldest `history + n - 1` rows of a segment (`edge_rows`) can end a
        window that shows something older than `min_id`; reading their `pos`
        corrects the count (`count_from`). Past `POS_BINS`, every row's `pos` is scanned.
        """
        if not self.counted(n):
            mask, _ = self.grid(num_adds, pos_at, max_length, n, False, ops)
            return ops.sum(ops.to_int64(mask))
        edge_pos = pos_at(self.edge_rows(num_adds, max_length, n, ops))
        return self.count_from(num_adds, pos_counts, edge_pos, max_length, n, ops)

    def edge_rows(self, num_adds: Any, max_length: int, n: int, ops: Any) -> Any:
        """`[num_segments, history + n - 1]`: the rows of each segment's oldest items, which correct `count`."""
        num_segments = num_adds.shape[0]
        min_id, _ = ring.live_range(num_adds, max_length, ops)
        end = min_id[:, None] + ops.arange(self.history + n - 1)[None, :]
        return ring.local_to_rows(end, ops.arange(num_segments)[:, None], max_length, num_segments)[0]

    def count_from(self, num_adds: Any, pos_counts: Any, edge_pos: Any, max_length: int, n: int, ops: Any) -> Any:
        """`count` of windows of `n` (when `counted(n)`), given `edge_pos`, the `pos` of `edge_rows`."""
        min_id, num_live = ring.live_range(num_adds, max_length, ops)
        k = ops.arange(self.history + n - 1)[None, :]
        start = min_id[:, None] + k - (n - 1)
        edge = (k < num_live[:, None]) & (edge_pos >= self.need(n))
        bad = edge & ~self.is_valid(start, edge_pos, min_id[:, None], n)
        return ops.sum(pos_counts[:, self.need(n) :]) - ops.sum(ops.to_int64(bad))

    def grid(
        self, num_adds: Any, pos_at: Callable, max_length: int, n: int, aligned: bool, ops: Any
    ) -> tuple[Any, Any]:
        """`(mask, t)`, both `[num_segments, max_length]`: every valid window start.

        With `aligned`, only windows whose end is a multiple of `n` steps into
        its episode (counted from its first window): an episode's windows do not overlap.
        """
        num_segments = num_adds.shape[0]
        min_id, num_live = ring.live_range(num_adds, max_length, ops)
        k = ops.arange(max_length)[None, :]
        t = min_id[:, None] + k
        ends = ring.local_to_rows(t + (n - 1), ops.arange(num_segments)[:, None], max_length, num_segments)[0]
        end_pos = pos_at(ends)
        mask = (k + n <= num_live[:, None]) & self.is_valid(t, end_pos, min_id[:, None], n)
        if aligned:
            mask = mask & ((end_pos - self.need(n)) % n == 0)
        return mask, t


def young_starts(num_adds: Any, max_length: int, n: int, window: Shape | None, newest: Any, ops: Any) -> Any:
    """Per segment, how many of its newest items cannot start a padded window of `n`.

    The rule every sampler shares (see the module docstring): the newest
    `min(n - 1, u)` items, where `u` counts the items of the newest episode
    that are drawable as single items, or 0 when that episode has ended.
    `newest` (`[num_segments, 2]`) is the index's `[pos, ended]` of each
    segment's newest item. Without an index (`window` None) a segment is
    one endless episode, so this is the plain ring rule: the newest `n - 1`
    live items.
    """
    _, num_live = ring.live_range(num_adds, max_length, ops)
    if window is None or newest is None:
        return ops.minimum(num_live, n - 1)
    pos = ops.to_int64(newest[:, 0])
    # The newest episode's items are drawable alone from its first transition on when it began inside the
    # live range (pos < num_live), else from the first whose history is live; an empty segment has none.
    drawable = ops.where(pos < num_live, pos + (1 - window.lead), num_live - max(window.history, window.lead))
    young = ops.minimum(ops.maximum(drawable, 0), n - 1)
    return ops.where(newest[:, 1] > 0, ops.zeros_like(young), young)


def window_mask(segment: Any, local: Any, num_adds: Any, ops: Any) -> Any:
    """`[B, n]` bool: which items of windows (local ids `local`, `[B, n]`, of `segment`) are stored: at most
    their segment's newest id. The mask keeps the layout of `local`."""
    return local < ops.gather(num_adds, segment)[:, None]


def same_episode(pos: Any, ops: Any) -> Any:
    """`[B, n]` bool: which items of windows (their `pos`, `[B, n]`) are steps of their first item's episode.

    Item `t + k` is one when it is `k` steps further into the episode (`pos`
    grows by one per step and restarts at 0 with each episode); with
    `window_mask`, a padded window's mask.
    """
    return pos - pos[:, :1] == ops.arange(pos.shape[1])[None, :]


def span(segment: Any, t: Any, num_adds: Any, pos_at: Callable, max_length: int, ops: Any) -> tuple[Any, Any, Any]:
    """`(before, after, next_stored)` of items at local id `t` of `segment` (`[B]` each): how many stored items
    of each one's episode come before it and after it, and whether an item after its episode's stored end is
    stored (so it starts another episode: the episode has ended).

    Items `t + k` of `t`'s episode are those with `pos[t + k] == pos[t] + k`, which holds for every `k` up to
    the episode's last stored item and for none after it, so `after` is found by bisection over the stored
    items after `t`: `log2(max_length)` gathers of `pos`, never a scan and never past the write head.
    """
    num_segments = num_adds.shape[0]
    adds = ops.gather(num_adds, segment)
    min_id = adds - ops.minimum(adds, max_length)
    pos = pos_at(ring.rows_of(t, segment, max_length, num_segments))
    before = ops.minimum(pos, t - min_id)
    newest = adds - 1 - t  # the most items after `t` that can be stored
    lo, hi = ops.zeros_like(newest), newest
    for _ in range((max_length - 1).bit_length()):  # each round at least halves hi - lo
        mid = (lo + hi + 1) // 2
        same = pos_at(ring.rows_of(t + mid, segment, max_length, num_segments)) == pos + mid
        lo, hi = ops.where(same, mid, lo), ops.where(same, hi, mid - 1)
    return before, lo, lo < newest
