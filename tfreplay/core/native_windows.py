"""The NumPy twin's compiled plan of padded windows (`kernels/windows.cc`, through ctypes).

A transform's padded windows (`NStepReturns`, `Sequences(pad=True)`) take
about 40 small array calls to plan (`SamplePath._sample_plan`, with
`UniformSampler.sample` and `episodes`): the young rule and segment pick of
a uniform draw, the window rows, the mask, each window's last step and its
row. In NumPy each call costs a few microseconds,
so the NumPy twin makes the same plan in two compiled calls where the kernel
is built (`tfreplay.native.windows_library`): one counts the starts to draw
from, NumPy draws the same random numbers as the array-op path, and the other
locates them and plans the windows. Other samplers draw as usual and only the
plan is compiled. Both paths give the same samples for the same seed.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tfreplay.core.ops import NUMPY_OPS
from tfreplay.core.samplers import View
from tfreplay.core.samplers.uniform import UniformSampler
from tfreplay.native import address


class WindowPlanner:
    """Plans padded windows of one NumPy buffer in compiled code.

    Args:
      library: `tfreplay.native.windows_library()`.
      num_adds: the ring's counters (`[num_segments]` int64); this and the index's arrays are read in place
        (under the buffer's lock) and never replaced (a restore copies into them).
      max_length: rows per segment.
      index: the episode index's `(pos, newest)` (see `core/episodes.py`), or None without one.
      sampler: the buffer's sampler; a `UniformSampler`'s padded draw over rows (`rows`: the storage
        shows no lead or history) is compiled too.
    """

    def __init__(
        self,
        library: Any,
        num_adds: np.ndarray,
        max_length: int,
        index: tuple | None,
        sampler: Any,
        rows: bool,
    ):
        self._counts, self._plan = library.tfreplay_padded_counts, library.tfreplay_window_plan
        self._layout = (max_length, int(num_adds.shape[0]))
        self._num_adds = address(num_adds)
        self._pos: int | None = None if index is None else address(index[0])
        self._newest: int | None = None if index is None else address(index[1])
        self._draws = type(sampler) is UniformSampler and index is not None and rows
        self._sampler = sampler

    def sample(
        self, size: int, n: int, draw: Callable[[list, Any], Any], view: Callable[[], View]
    ) -> tuple[tuple, Any, Any, Any, Any, Any]:
        """`((step rows, mask, last, first rows, last rows), segment, t, ids, probabilities, count)` of `size`
        padded windows of `n` items, drawn as the sampler draws them: `draw` is the twin's random draw (`_draw`),
        `view()` what the sampler draws from. The rows and mask are `[size, n]`, laid out time-major (`[n, size]`
        in memory) as the array-op path lays them out."""
        length, segments = self._layout
        # The int64 outputs and scratch in one block (an allocation costs more than the kernel's work on it):
        # segment, t, ids, last, last rows, then the rows `[n, size]`, then per segment `start` and `counts`.
        block = np.empty((5 + n) * size + 2 * segments, np.int64)
        base, mask = address(block), np.empty([n, size], np.bool_)
        rows_at, start_at = base + 8 * 5 * size, base + 8 * (5 + n) * size
        segment, t, ids, last, last_rows = block[: 5 * size].reshape(5, size)
        located: list[int | None] = [None, None, None]  # with draws: where they are, counts, start
        if self._draws:  # uniform over every live item but each segment's young ones (`episodes.young_starts`)
            counts_at = start_at + 8 * segments
            count = self._counts(self._num_adds, segments, length, n, self._newest, start_at, counts_at)
            draws = np.ascontiguousarray(draw([size], count), np.int64)  # the array-op path's random numbers
            probs, count = NUMPY_OPS.probability([size], count), np.int64(count)
            located = [address(draws), counts_at, start_at]
        else:  # the sampler draws the starts
            drawn_segment, drawn_t, probs, count = self._sampler.sample(view(), size, n)
            segment[:], t[:] = drawn_segment, drawn_t
        at = [base + 8 * size * i for i in range(5)]  # segment, t, ids, last, last rows
        shape = (size, n, length, segments)
        self._plan(*located, *at[:2], *shape, self._num_adds, self._pos, rows_at, at[2], address(mask), *at[3:])
        rows = block[5 * size : (5 + n) * size].reshape(n, size)
        return (rows.T, mask.T, last, rows[0], last_rows), segment, t, ids, probs, count
