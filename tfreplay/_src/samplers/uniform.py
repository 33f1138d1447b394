"""Uniform sampling over every valid window."""

from __future__ import annotations

from typing import Any

from tfreplay._src.index import episodes, ring
from tfreplay._src.samplers import SamplerBase, View

# Candidates per sample and round, and rounds before the exact (scanning) draw.
_CANDIDATES = 4
_ROUNDS = 16


class UniformSampler(SamplerBase):
    """Draws windows uniformly among the valid ones.

    Args:
      within_episodes: windows never cross an episode boundary (needs a
        buffer whose items carry boundaries; frame buffers always do).

    Without episodes a window is any `num_steps` consecutive live items of
    a segment (segments advance together), drawn exactly in one step. Through the episode index, each
    sample takes the first valid one of uniform candidates over window starts
    (rejection: uniform over the valid ones); only samples that keep missing
    are redrawn, and after `_ROUNDS` rounds the rest come from an exact scan.

    Padded windows (`view.padded`) start at any item drawable alone except
    each segment's newest `episodes.young_starts`: for rows every item of
    that range, drawn exactly in one step; for frames, candidates from it.
    """

    episode_windows = True
    padded_windows = True
    draws_uniformly = True

    def __init__(self, within_episodes: bool = False):
        self.within_episodes = bool(within_episodes)

    def mass(self, view: View, num_steps: int | None) -> Any:
        """How many windows `sample` draws from now (each with probability `1 / mass`); its count, drawing nothing."""
        n, ops = num_steps or 1, view.ops
        if view.window is None:
            _, num_live = ring.live_range(view.num_adds[0], view.max_length, ops)
            return ops.maximum(num_live - n + 1, 0) * view.num_segments
        assert view.pos_at is not None  # a window goes with the episode index
        window, pos_at = view.window, view.pos_at
        if not view.padded:
            return window.count(view.num_adds, view.pos_counts, pos_at, view.max_length, n, ops)
        young = episodes.young_starts(view.num_adds, view.max_length, n, window, view.newest, ops)
        if window.lead == 0 and window.history == 0:
            _, counts = window.draw_range(view.num_adds, view.max_length, 1, ops)
            return ops.sum(ops.maximum(counts - young, 0))
        return window.count(view.num_adds, view.pos_counts, pos_at, view.max_length, 1, ops) - ops.sum(young)

    def sample(self, view: View, size: int, num_steps: int | None) -> tuple[Any, Any, Any, Any]:
        n, ops = num_steps or 1, view.ops
        if view.window is None:  # ring windows: segments advance together, so each has `per` starts
            adds = view.num_adds[0]
            num_live = ops.minimum(adds, view.max_length)  # as `ring.live_range`
            min_id, per = adds - num_live, ops.maximum(num_live - n + 1, 0)
            count = per * view.num_segments
            draws, probs = view.pick([size], count)
            per = ops.maximum(per, 1)  # an empty buffer still maps draws to rows
            return draws // per, min_id + draws % per, probs, count
        assert view.pos_at is not None  # a window goes with the episode index
        window = view.window
        start, counts = window.draw_range(view.num_adds, view.max_length, 1 if view.padded else n, ops)
        if view.padded:  # single items, less each segment's newest that cannot start a padded window
            young = episodes.young_starts(view.num_adds, view.max_length, n, window, view.newest, ops)
            counts = ops.maximum(counts - young, 0)
            if window.lead == 0 and window.history == 0:  # rows: every item in range starts a window
                count = ops.sum(counts)
                draws, probs = view.pick([size], count)
                seg, offset = ring.locate(draws, counts, ops)
                return seg, ops.gather(start, seg) + offset, probs, count
            m, last, less = 1, view.num_adds - 1 - young, ops.sum(young)  # last: the newest start drawable
        else:
            m, last, less = n, None, 0  # m: the window length whose validity a start needs
        segment, t, count = self._draw_valid(view, start, counts, m, last, size, less)
        return segment, t, ops.probability([size], count), count

    def _draw_valid(
        self, view: View, start: Any, counts: Any, n: int, last: Any, size: int, less: Any
    ) -> tuple[Any, Any, Any]:
        """`(segment, t, count)`: uniform starts among the `count` valid windows of `n` at
        `start[s] + [0, counts[s])` (and at most `last[s]`); `less` is taken off the index's count."""
        ops, window, pos_at = view.ops, view.window, view.pos_at
        assert window is not None and pos_at is not None
        total = ops.sum(counts)

        def candidates() -> tuple[Any, Any, Any, Any]:
            seg, offset = ring.locate(view.draw([_CANDIDATES * size], total), counts, ops)
            first = ops.gather(start, seg)
            cand = first + offset
            return seg, cand, first, ring.local_to_rows(cand + (n - 1), seg, view.max_length, view.num_segments)[0]

        def keep(state: tuple, drawn: tuple, end_pos: Any) -> tuple[Any, Any, Any]:
            """Each sample still missing takes its first valid candidate."""
            found, segment, t = state
            seg, cand, first, _ = drawn
            ok = ops.reshape(window.is_valid(cand, end_pos, first - window.lead, n), [_CANDIDATES, size])
            pick = ops.argmax0(ok) * size + ops.arange(size)
            hit, take = ops.any0(ok), ops.any0(ok) & ~found
            return (
                found | hit,
                ops.where(take, ops.gather(seg, pick), segment),
                ops.where(take, ops.gather(cand, pick), t),
            )

        def round_(*state: Any) -> tuple[Any, Any, Any]:
            drawn = candidates()
            return keep(state, drawn, pos_at(drawn[3]))

        drawn = candidates()
        if window.counted(n):
            # One read of `pos` for the count's edge rows and the first candidates' ends: XLA on CPU splits
            # each gather from an array of 512 KB or more across two threads, a hand-off per read.
            edge = window.edge_rows(view.num_adds, view.max_length, n, ops)
            shape = [int(d) for d in edge.shape]
            pos = pos_at(ops.concat([ops.reshape(edge, [-1]), drawn[3]]))
            edge_pos = ops.reshape(pos[: shape[0] * shape[1]], shape)
            count = window.count_from(view.num_adds, view.pos_counts, edge_pos, view.max_length, n, ops) - less
            end_pos = pos[shape[0] * shape[1] :]
        else:
            count = window.count(view.num_adds, view.pos_counts, pos_at, view.max_length, n, ops) - less
            end_pos = pos_at(drawn[3])
        zeros = ops.zeros_like(ops.arange(size))
        state = keep((zeros < 0, zeros, zeros), drawn, end_pos)
        found, segment, t = ops.loop(lambda found, *_: ~ops.all(found), round_, state, _ROUNDS - 1)

        def exact() -> tuple[Any, Any]:
            mask, starts = window.grid(view.num_adds, pos_at, view.max_length, n, False, ops)
            if last is not None:
                mask = mask & (starts <= last[:, None])
            # The u-th valid window is where the running count of valid ones first exceeds u.
            flat = ops.cumsum(ops.to_int64(ops.reshape(mask, [-1])))
            pick = ops.minimum(
                ops.searchsorted(flat, view.draw([size], count)), view.num_segments * view.max_length - 1
            )
            seg, st = pick // view.max_length, ops.gather(ops.reshape(starts, [-1]), pick)
            return ops.where(found, segment, seg), ops.where(found, t, st)

        segment, t = ops.cond(ops.all(found) | (count <= 0), lambda: (segment, t), exact)
        return segment, t, count
