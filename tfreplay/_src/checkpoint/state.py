"""What a restored buffer state must satisfy before any of it is put in place (both twins).

The layout record says the state has the buffer's shapes and dtypes; this
checks the values, which a damaged or crafted checkpoint may get wrong in
ways that give silently wrong samples, ids past int64, or an add that writes
rows and then fails:

* the ring's counters: non-negative, small enough that ids stay far from
  int64's end, and equal across segments where segments advance together;
* the episode index: every live item's `pos` in range and one step after the
  item before it or 0 (0 wherever the stored fields start an episode),
  `pos_counts` the live rows' bins exactly, `newest` each segment's newest
  item;
* a frame buffer's zero row (what frames before an episode's first show) zero;
* the sampler's own state (`sampler.check_state`: a sum tree's sums).

Item values themselves are the user's data: any value is kept as saved.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfreplay._src.index import episodes
from tfreplay._src.samplers import refuse

# Local ids stay below this per segment, so global ids (`local * num_segments + segment`) stay far from int64's end.
MAX_ADDS = 1 << 60


def check(parts: Any, values: dict[str, np.ndarray]) -> None:
    """Raises `ValueError` naming the first saved entry of `values` (state name -> restored array) that no
    buffer of `parts`' layout could have written; the buffer is not touched."""
    num_adds = np.asarray(values["index/num_adds"], np.int64)
    segments, length = parts.num_segments, parts.max_length
    if (num_adds < 0).any() or (num_adds > MAX_ADDS // segments).any():
        raise refuse("index/num_adds", num_adds, f"a count of items per segment in [0, {MAX_ADDS // segments}]")
    if parts.window is None and (num_adds != num_adds[0]).any():  # ring windows: segments advance together
        raise refuse("index/num_adds", num_adds, "equal across segments, which every add_batch fills together")
    local, live = live_items(num_adds, length)
    if parts.rule is not None:
        _check_index(parts, values, num_adds, local, live)
    if parts.storage.window.lead:  # frames: the row frames older than an episode's first read
        frames = values["storage/frame"]
        if frames[-1].any():
            raise refuse("storage/frame (its last row)", frames[-1], "zeros: frames before an episode's first")
    startable = None
    if parts.rule is not None and parts.storage.window.lead:
        startable = np.asarray(values["index/pos"], np.int64) >= parts.storage.window.lead
    parts.sampler.check_state(values, live.reshape(-1), startable)


def live_items(num_adds: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """`(local id, live)`, both `[max_length, num_segments]` by storage row (row `k * S + s` at `[k, s]`): the
    local id each row holds now (its newest) and whether that item is still stored."""
    slot = np.arange(length)[:, None]
    newest = num_adds[None, :] - 1
    local = newest - (newest - slot) % length
    return local, (local >= 0) & (local >= num_adds[None, :] - length)


def _check_index(parts: Any, values: dict, num_adds: np.ndarray, local: np.ndarray, live: np.ndarray) -> None:
    """The episode index against the stored items: see the module docstring."""
    segments, length = parts.num_segments, parts.max_length
    pos = np.asarray(values["index/pos"], np.int64).reshape(length, segments)
    if ((pos < 0) | (pos > episodes.POS_CAP)).any():
        raise refuse("index/pos", pos[(pos < 0) | (pos > episodes.POS_CAP)], f"in [0, {episodes.POS_CAP}]")
    starts, ends = _episode_marks(parts, values, length, segments)
    # Where the start field is not stored (a frame buffer's `first`), an episode may start at any item.
    known = parts.rule.start is None or starts is not None
    order = np.argsort(local, axis=0, kind="stable")  # each segment's rows oldest first (dead rows first)
    for s in range(segments):
        rows = order[:, s][live[order[:, s], s]]
        p = pos[rows, s]
        saved = np.asarray(values["index/pos_counts"])[s]
        if not len(rows):  # an empty segment: no item in any bin
            if saved.any():
                raise refuse(f"index/pos_counts of segment {s}", saved, "zeros: the segment holds no item")
            continue
        before = np.concatenate([[-1], p[:-1]])
        fresh = np.zeros(len(rows), bool)
        fresh[0] = local[rows[0], s] == 0  # a segment's first item ever starts an episode
        if starts is not None:
            fresh |= starts[rows, s]
        if ends is not None:
            fresh[1:] |= ends[rows[:-1], s]
        follows = np.minimum(before + 1, episodes.POS_CAP)
        ok = np.where(fresh, p == 0, (p == follows) | (p == 0))
        ok[0] = p[0] == 0 if fresh[0] else True  # the oldest stored item's episode may have begun before
        if known:  # an item that does not start an episode is one step after the item before
            ok[1:] &= np.where(fresh[1:], True, p[1:] == follows[1:])
        if not ok.all():
            raise refuse(f"index/pos of segment {s}", p[~ok], "each item's step in its episode (0 at its first item)")
        counts = np.bincount(np.minimum(p, episodes.POS_BINS - 1), minlength=episodes.POS_BINS)
        if not np.array_equal(saved, counts):
            raise refuse(f"index/pos_counts of segment {s}", saved, "how many stored items have each step")
        if num_adds[s]:
            newest = np.asarray(values["index/newest"])[s]
            ended = bool(ends[rows[-1], s]) if ends is not None else False
            if newest[0] != p[-1] or newest[1] != int(ended):
                raise refuse(f"index/newest of segment {s}", newest, f"[{p[-1]}, {int(ended)}], its newest item's")


def _episode_marks(parts: Any, values: dict, length: int, segments: int) -> tuple[Any, Any]:
    """Per row `[max_length, num_segments]`, whether its stored item starts an episode and whether it ends one
    (None where no stored field says: a frame buffer keeps no `first`)."""
    rule, stored = parts.rule, {f"storage/{p}": p for p in parts.leaf_paths}

    def field(path: str) -> Any:
        name = f"storage/{path}"
        return np.asarray(values[name]).reshape(length, segments) if name in values and name in stored else None

    starts = None
    if rule.start is not None:
        value = field(rule.start)
        if value is not None:
            starts = value if value.dtype == bool else value == episodes.STEP_TYPE_FIRST
    ends = None
    for path in rule.ends:
        value = field(path)
        if value is not None:
            ends = value if ends is None else ends | value
    return starts, ends
