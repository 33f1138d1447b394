"""The NumPy twin's compiled window plan and strict draw (`native/kernels/windows.cc`, through ctypes).

A transform's padded windows (`NStepReturns`, `Sequences(pad=True)`) take
about 40 small array calls to plan (`sample.plan`, with
`UniformSampler.sample` and `episodes`): the young rule and segment pick of
a uniform draw, the window rows, the mask, each window's last step and its
row. Strict windows through the episode index (`Sequences(pad=False)`, or
`num_steps` windows of a buffer that keeps them inside episodes) take about
30 to draw (`UniformSampler._draw_valid`): the count, then rounds of
candidates kept where valid, then an exact scan for samples still missing.
In NumPy each call costs a few microseconds, so the NumPy twin does the
same in a few compiled calls where the kernel is built
(`tfreplay.native.windows_library`): one counts, NumPy draws the same random
numbers as the array-op path in the same order, and each round or the plan
is one more call. Only a sampler that draws as `UniformSampler` does
(`draws_uniformly`) is drawn for; other samplers draw as usual and only the
plan is compiled. Both paths give the same samples for the same seed.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from tfreplay import native
from tfreplay._src import sample
from tfreplay._src.arrays.ops import NUMPY_OPS
from tfreplay._src.index import ring
from tfreplay._src.index.episodes import POS_BINS, Shape
from tfreplay._src.parts import Parts, Request
from tfreplay._src.samplers import View
from tfreplay._src.samplers.uniform import _CANDIDATES, _ROUNDS
from tfreplay.native import address


class WindowPlanner:
    """Plans windows of one NumPy buffer in compiled code.

    Args:
      library: `tfreplay.native.windows_library()` (see `planner`).
      num_adds: the ring's counters (`[num_segments]` int64); this and the index's arrays are read in place
        (under the buffer's lock) and never replaced (a restore copies into them).
      max_length: rows per segment.
      index: the episode index's `(pos, newest, pos_counts)` (see `index/episodes.py`), or None without one.
      sampler: the buffer's bound sampler; if it `draws_uniformly`, its draws through the index are compiled too.
      window: the storage's window shape (`Shape()` for rows: no lead, no history).
    """

    def __init__(
        self, library: Any, num_adds: np.ndarray, max_length: int, index: tuple | None, sampler: Any, window: Shape
    ):
        self._counts, self._plan = library.tfreplay_padded_counts, library.tfreplay_window_plan
        self._strict = library.tfreplay_strict_counts, library.tfreplay_strict_keep, library.tfreplay_strict_exact
        self._layout = (max_length, int(num_adds.shape[0]))
        self._shape = (window.lead, window.history)
        self._num_adds = address(num_adds)
        pos, newest, pos_counts = [None] * 3 if index is None else [address(a) for a in index]
        self._pos: int | None = pos
        self._newest: int | None = newest
        self._pos_counts: int | None = pos_counts
        # A uniform sampler through the index: strict windows drawn here; padded ones too, counted in one call
        # for rows (every start in range is valid), by candidates as strict ones otherwise.
        self.draws_strict = bool(sampler.draws_uniformly) and index is not None
        self._draws = self.draws_strict and window == Shape()
        self._sampler = sampler
        # The strict draw's scratch, used under the buffer's lock: per segment the first start, how many follow
        # and the newest start drawable; then the count.
        self._scratch = np.empty(3 * self._layout[1] + 1, np.int64)
        self._scratch_at = [address(self._scratch) + 8 * self._layout[1] * i for i in range(4)]

    def sample(
        self, size: int, n: int, draw: Callable[[list, Any], Any], view: Callable[[], View], padded: bool = True
    ) -> tuple[tuple, Any, Any, Any, Any, Any]:
        """`((step rows, mask, last, last rows), segment, t, ids, probabilities, count)` of `size` windows of
        `n` items (padded, or strict: `draws_strict` must hold), drawn as the sampler draws them: `draw` is the
        twin's random draw (`_draw`), `view()` what the sampler draws from. The rows and mask are `[n, size]`
        (time-major, as `sample.compiled_plan` takes them)."""
        length, segments = self._layout
        # The int64 outputs and scratch in one block (an allocation costs more than the kernel's work on it):
        # segment, t, ids, last, last rows, then the rows `[n, size]`, then per segment `start` and `counts`.
        block = np.empty((5 + n) * size + 2 * segments, np.int64)
        base, mask = address(block), np.empty([n, size], np.bool_)
        rows_at, start_at = base + 8 * 5 * size, base + 8 * (5 + n) * size
        segment, t, ids, last, last_rows = block[: 5 * size].reshape(5, size)
        located: list[int | None] = [None, None, None]  # with draws: where they are, counts, start
        if padded and self._draws:  # uniform over every live item but each segment's young ones
            counts_at = start_at + 8 * segments
            count = self._counts(self._num_adds, segments, length, n, self._newest, start_at, counts_at)
            draws = np.ascontiguousarray(draw([size], count), np.int64)  # the array-op path's random numbers
            probs, count = NUMPY_OPS.probability([size], count), np.int64(count)
            located = [address(draws), counts_at, start_at]
        elif self.draws_strict:  # candidates of strict windows, or of padded windows' first items
            probs, count = self._draw_valid(block[: 2 * size], size, 1 if padded else n, n, draw, padded)
        else:  # the sampler draws the starts
            drawn_segment, drawn_t, probs, count = self._sampler.sample(view(), size, n)
            segment[:], t[:] = drawn_segment, drawn_t
        at = [base + 8 * size * i for i in range(5)]  # segment, t, ids, last, last rows
        shape = (size, n, length, segments)
        pos = self._pos if padded else None  # a strict window is one episode's: only the stored check is left
        self._plan(*located, *at[:2], *shape, self._num_adds, pos, rows_at, at[2], address(mask), *at[3:])
        rows = block[5 * size : (5 + n) * size].reshape(n, size)
        return (rows, mask, last, last_rows), segment, t, ids, probs, count

    def starts(self, size: int, n: int, draw: Callable[[list, Any], Any]) -> tuple[Any, Any, Any, Any]:
        """`(segment, t, probabilities, count)` of `size` strict windows of `n` items, as
        `UniformSampler.sample` draws them (`draws_strict` must hold)."""
        out = np.empty([2, size], np.int64)
        probs, count = self._draw_valid(out, size, n, n, draw, False)
        return out[0], out[1], probs, count

    def _draw_valid(
        self, out: np.ndarray, size: int, m: int, n: int, draw: Callable[[list, Any], Any], padded: bool
    ) -> tuple[Any, Any]:
        """`UniformSampler._draw_valid` in compiled calls, with the same random draws in the same order:
        starts of valid windows of `m` items into `out` (`[2, size]`: segment, t; contiguous), and
        `(probabilities, count)`. `padded`: windows of `n` items padded past their episode's end, whose first
        items are drawn (`m` 1) less each segment's `episodes.young_starts`."""
        counts, keep, exact = self._strict
        (length, segments), (lead, history) = self._layout, self._shape
        (start_at, counts_at, last_at, _), out_at, found = self._scratch_at, address(out), np.zeros(size, np.bool_)
        out.fill(0)  # as the array-op path starts: what a sample missing from every draw keeps
        shape, state = (length, lead, history, m), (address(found), out_at, out_at + 8 * size)
        index = (self._pos, self._pos_counts, POS_BINS, self._newest if padded else None)
        total = counts(self._num_adds, segments, *shape, n, *index, *self._scratch_at)
        count = self._scratch[3 * segments]
        for _ in range(_ROUNDS):  # each round: `_CANDIDATES` per sample, kept where valid
            draws = np.ascontiguousarray(draw([_CANDIDATES * size], total), np.int64)
            if not keep(address(draws), _CANDIDATES, size, start_at, counts_at, segments, *shape, self._pos, *state):
                break
        else:
            if count > 0:  # the samples still missing: the exact draw
                draws = np.ascontiguousarray(draw([size], count), np.int64)
                exact(address(draws), size, self._num_adds, segments, *shape, self._pos, last_at, *state)
        return NUMPY_OPS.probability([size], count), count

    def plan(self, parts: Parts, req: Request, draw: Callable, view: Callable[[], View]) -> tuple | None:
        """What `sample.plan` returns for `req`, planned here; None where only the array-op path plans it
        (ring windows, or strict windows of a sampler that does not draw uniformly)."""
        if not (req.padded or (req.window is not None and self.draws_strict)):
            return None
        if req.transform is None:  # strict windows of `num_steps` items (or single items) through the index
            segment, t, probs, count = self.starts(req.size, req.n, draw)
            step_rows, ids = ring.window_rows(
                segment, t, req.num_steps, parts.max_length, parts.num_segments, NUMPY_OPS
            )
            return parts.storage.plan(segment, t, step_rows, req.num_steps, parts.pos_at, NUMPY_OPS), ids, probs, count
        (rows, mask, last, last_rows), segment, t, ids, probs, count = self.sample(
            req.size, req.n, draw, view, req.padded
        )
        read_plan = sample.compiled_plan(parts, segment, t, rows, mask, last, last_rows, req)
        return sample.with_lookups(parts, view(), req, read_plan, ids), ids, probs, count


def planner(parts: Parts) -> WindowPlanner | None:
    """The compiled window plan of a NumPy buffer's parts, or None without the library."""
    library = native.windows_library()
    if library is None:
        return None
    index = (parts.pos, parts.newest, parts.pos_counts) if parts.rule is not None else None
    return WindowPlanner(library, parts.num_adds, parts.max_length, index, parts.sampler, parts.storage.window)


def finder(parts: Parts) -> Callable[..., tuple | None]:
    """`plan(parts, req, draw, view)` of a NumPy buffer: its compiled plan (`WindowPlanner.plan`, the library
    looked up on the first windowed sample), or None where only the array-op path plans (or without the library)."""
    compiled = functools.cache(lambda: planner(parts))

    def plan(parts: Parts, req: Request, draw: Callable, view: View) -> tuple | None:
        found = compiled()
        return None if found is None else found.plan(parts, req, draw, lambda: view)

    return plan
