"""Reads at one more step of each sampled item's episode, for transforms that name `lookups` (hindsight goals).

Under the lock (or inside a TF versioned read), after the sampler has drawn
the windows, `plan` locates each window's first item in its episode through
the index (`episodes.span`), asks the transform which step to read
(`Transform.choose`) and turns it into a storage row; `read` gathers the named
leaves there. A goal therefore never comes from another episode or segment,
an overwritten row, or past the write head. Which window is drawn, and its
probability, are the sampler's alone.
"""

from __future__ import annotations

from typing import Any

from tfreplay._src.index import episodes, ring
from tfreplay._src.parts import Parts, Request
from tfreplay._src.samplers import View
from tfreplay._src.transforms.base import Lookup, Span


def check(parts: Parts, where: str, transform: Any, paths: tuple) -> None:
    """Refuses a transform with `lookups` on a buffer that cannot serve them (no index, no such leaves)."""
    if parts.rule is None:
        raise ValueError(
            f"{where}: transform ({transform!r}) reads other steps of each item's episode, so the buffer's items "
            "must mark episode boundaries: a scalar 'step_type' or bool 'first', 'terminated' or 'truncated' "
            "field, or an EpisodeRule naming them."
        )
    by_path = parts.storage.by_path
    if by_path is None:
        raise ValueError(f"{where}: transform ({transform!r}) reads stored rows by path; use a row buffer.")
    missing = [p for p in paths if p not in by_path]
    if missing:
        raise ValueError(
            f"{where}: transform ({transform!r}) looks up {missing[0]!r}, which must be a leaf of the stored item "
            f"({sorted(by_path)})."
        )


def plan(parts: Parts, view: View, req: Request, ids: Any) -> tuple[Any, Any, Any]:
    """`(rows, use, end rows)`: the rows to read at for windows whose first items have global `ids`, the
    transform's `use`, and the rows whose end fields were read (checked with the sample's rows)."""
    ops, length, num_segments = parts.ops, parts.max_length, parts.num_segments
    segment, t = ids % num_segments, ids // num_segments  # as `ring.local_to_rows` made them
    before, after, ended = episodes.span(segment, t, view.num_adds, parts.pos_at, length, ops)
    end_rows = ring.rows_of(t + after, segment, length, num_segments)
    assert parts.rule is not None  # `check` refused buffers without an index
    for path in parts.rule.ends:
        ended = ended | ops.gather(parts.storage.by_path[path], end_rows)
    offset, use = req.transform.choose(Span(before, after, ended), view.uniform, ops)
    return ring.rows_of(t + ops.to_int64(offset), segment, length, num_segments), use, end_rows


def read(parts: Parts, at: tuple, req: Request) -> Lookup:
    """The looked-up leaves at the planned rows."""
    rows, use, _ = at
    by_path = parts.storage.by_path
    return Lookup(values={p: parts.ops.gather(by_path[p], rows) for p in req.lookups}, use=use)
