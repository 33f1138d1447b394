"""Ring arithmetic: where items live and which ones are live.

A buffer has `num_segments` segments of `max_length` rows. The ring's only
state is `num_adds[s]`, how many items segment `s` has received since the
last clear. Item `i` of segment `s` (its *local id*) lives in storage row
`(i % max_length) * num_segments + s`: time-major, so one lockstep add writes
`num_segments` contiguous rows. Its *global id*, reported in
`BufferInfo.ids`, is `i * num_segments + s`: the insertion order across the
whole buffer when segments advance together.

The functions take an `ops` namespace (`arrays/ops.py`), so the same arithmetic
runs on NumPy arrays and on tensors (in graphs and under XLA).
"""

from __future__ import annotations

from typing import Any


def live_range(num_adds: Any, max_length: int, ops: Any) -> tuple[Any, Any]:
    """Returns `(min_id, num_live)`: the oldest live local id and how many live."""
    num_live = ops.minimum(num_adds, max_length)
    return num_adds - num_live, num_live


def num_windows(num_adds: Any, max_length: int, num_steps: int, ops: Any) -> Any:
    """Valid window starts per segment when episodes do not matter.

    A window of `num_steps` consecutive ids must lie inside the live range, so
    it never crosses the write head (never joins the newest item to the oldest).
    """
    _, num_live = live_range(num_adds, max_length, ops)
    return ops.maximum(num_live - num_steps + 1, 0)


def locate(draws: Any, counts: Any, ops: Any) -> tuple[Any, Any]:
    """Maps draws in `[0, sum(counts))` to `(segment, offset in that segment)`.

    With nothing to draw (`sum(counts) == 0`) draws still map to a segment.
    """
    ends = ops.cumsum(counts)
    segment = ops.minimum(ops.searchsorted(ends, draws), counts.shape[0] - 1)
    return segment, draws - ops.gather(ends - counts, segment)


def local_to_rows(local: Any, segment: Any, max_length: int, num_segments: int) -> tuple[Any, Any]:
    """Returns `(storage rows, global ids)` of local ids in their segments."""
    return rows_of(local, segment, max_length, num_segments), local * num_segments + segment


def rows_of(local: Any, segment: Any, max_length: int, num_segments: int) -> Any:
    """The storage rows of local ids in their segments (`local_to_rows` without the ids)."""
    return (local % max_length) * num_segments + segment


def window_rows(
    segment: Any, t: Any, num_steps: int | None, max_length: int, num_segments: int, ops: Any
) -> tuple[Any, Any]:
    """Rows and ids of windows starting at local id `t`: `[B, num_steps]`, or `[B]` without steps."""
    if num_steps is not None:
        t, segment = t[:, None] + ops.arange(num_steps)[None, :], segment[:, None]
    return (t % max_length) * num_segments + segment, t * num_segments + segment  # as `local_to_rows`


def all_rows(num_adds: Any, max_length: int, num_segments: int, ops: Any) -> tuple[Any, Any]:
    """Rows and ids of every live item, `[num_segments, num_live]` (segments advance together)."""
    min_id, num_live = live_range(num_adds[0], max_length, ops)
    local = (min_id + ops.arange(num_live))[None, :]
    segment = ops.arange(num_segments)[:, None]
    return local_to_rows(local, segment, max_length, num_segments)
