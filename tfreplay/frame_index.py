"""Index math of frame replay, shared by `TFFrameReplayBuffer` and its NumPy twin.

Rows follow the core ring (`ring.py`): segment `s` holds the local ids
`[min_id, num_adds)`, id `i` at row `(i % max_length) * num_segments + s`.
Each row keeps one frame and `pos`, the frame's step index in its episode
(0 for an episode's first frame). The transition of row `t` (`pos[t] >= 1`)
shows the frames `t - history_len .. t - 1` as its observation and
`t - history_len + 1 .. t` as its next observation; frames older than its
episode's first frame (id `t - pos[t]`) are shown as zeros.

A window of `num_steps` transitions starting at row `t` ends at
`end = t + num_steps - 1` and is valid when

* `pos[end] >= num_steps`: rows `t .. end` are steps of one episode, so no
  window joins two episodes, and
* every frame it shows is live: either the whole history is
  (`t - history_len >= min_id`), or the episode starts inside the live range
  (`end - pos[end] >= min_id`), so every older frame is a zero anyway.

A transition whose own-episode history was overwritten is thus never drawn,
and nothing is ever read across the write head: the frames are all older
than the newest row, and the oldest shown frame is live.

The functions take an `ops` namespace, as `ring.py` does, so the same
arithmetic runs on NumPy arrays and on tensors.
"""

from __future__ import annotations

import math
import types
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay import ring

# pos saturates here, so a never-ending episode cannot overflow int32.
POS_CAP = 2**30
# Live rows are counted per segment by `pos`, the last bin holding every
# `pos >= POS_BINS - 1`: windows of fewer than POS_BINS steps are counted from
# these counts, longer ones by a scan of every row.
POS_BINS = 64


NUMPY_OPS = types.SimpleNamespace(
    **vars(ring.NUMPY_OPS),
    gather=lambda x, i: np.take(x, i, axis=0),
    where=np.where,
    cumsum=np.cumsum,
    searchsorted=lambda a, v: np.searchsorted(a, v, side="right").astype(np.int64),
    sum=np.sum,
    all=np.all,
    any0=lambda x: np.any(x, axis=0),
    argmax0=lambda x: np.argmax(x, axis=0).astype(np.int64),
    to_int64=lambda x: np.asarray(x, np.int64),
    reshape=np.reshape,
    zeros_like=np.zeros_like,
    flatnonzero=lambda x: np.flatnonzero(x).astype(np.int64),
)
TF_OPS = types.SimpleNamespace(
    **vars(ring.TF_OPS),
    gather=tf.gather,
    where=tf.where,
    cumsum=tf.cumsum,
    searchsorted=lambda a, v: tf.searchsorted(a, v, side="right", out_type=tf.int64),
    sum=tf.reduce_sum,
    all=tf.reduce_all,
    any0=lambda x: tf.reduce_any(x, axis=0),
    argmax0=lambda x: tf.argmax(tf.cast(x, tf.int32), axis=0, output_type=tf.int64),
    to_int64=lambda x: tf.cast(x, tf.int64),
    reshape=tf.reshape,
    zeros_like=tf.zeros_like,
    flatnonzero=lambda x: tf.where(x)[:, 0],
)


def draw_range(num_adds: Any, max_length: int, num_steps: int, ops: Any) -> tuple[Any, Any]:
    """Per segment, the first window start worth drawing and how many follow.

    Starts run over `[min_id + 1, num_adds - num_steps]`: the start needs a live
    frame before it, the window's end must already be stored.
    """
    min_id, num_live = ring.live_range(num_adds, max_length, ops)
    return min_id + 1, ops.maximum(num_live - num_steps, 0)


def locate(draws: Any, counts: Any, ops: Any) -> tuple[Any, Any]:
    """Maps draws in `[0, sum(counts))` to `(segment, offset in that segment)`."""
    ends = ops.cumsum(counts)
    segment = ops.searchsorted(ends, draws)
    return segment, draws - ops.gather(ends - counts, segment)


def is_valid(t: Any, end_pos: Any, min_id: Any, history_len: int, num_steps: int) -> Any:
    """Whether the window starting at `t` is valid (see the module docstring)."""
    end = t + (num_steps - 1)
    shown_live = (t - history_len >= min_id) | (end - end_pos >= min_id)
    return (end_pos >= num_steps) & shown_live


def rows_of(local: Any, segment: Any, max_length: int, num_segments: int) -> tuple[Any, Any]:
    """`(storage rows, global ids)`, as `ring.local_to_rows`."""
    return ring.local_to_rows(local, segment, max_length, num_segments)


def pos_bin(pos: Any, ops: Any) -> Any:
    """The bin of `pos` in the per-segment counts of live rows (`POS_BINS`)."""
    return ops.minimum(pos, POS_BINS - 1)


def count_valid_windows(
    num_adds: Any,
    pos_counts: Any,
    pos_at: Callable[[Any], Any],
    max_length: int,
    history_len: int,
    num_steps: int,
    ops: Any,
) -> Any:
    """Valid windows of `num_steps < POS_BINS` transitions, without a scan.

    A window is counted at its end row `e`, which needs `pos[e] >= num_steps`:
    `pos_counts` (live rows per segment and `pos_bin`, kept as rows are
    written) gives how many rows have that. Of these, only the oldest
    `history_len + num_steps - 1` rows of a segment can end an invalid window
    (one showing frames older than `min_id`), so reading their `pos` corrects
    the count: `history_len + num_steps - 1` reads per segment.
    """
    num_segments = num_adds.shape[0]
    min_id, num_live = ring.live_range(num_adds, max_length, ops)
    k = ops.arange(history_len + num_steps - 1)[None, :]
    end = min_id[:, None] + k
    pos = pos_at(rows_of(end, ops.arange(num_segments)[:, None], max_length, num_segments)[0])
    start = end - (num_steps - 1)
    bad = (k < num_live[:, None]) & (pos >= num_steps) & ~is_valid(start, pos, min_id[:, None], history_len, num_steps)
    return ops.sum(pos_counts[:, num_steps:]) - ops.sum(ops.to_int64(bad))


def valid_grid(
    num_adds: Any,
    pos_at: Callable[[Any], Any],
    max_length: int,
    history_len: int,
    num_steps: int,
    aligned: bool,
    ops: Any,
) -> tuple[Any, Any]:
    """`(mask, t)`, both `[num_segments, max_length]`: every valid window start.

    With `aligned`, only windows whose end is a multiple of `num_steps` steps
    into its episode: consecutive windows of an episode do not overlap.
    """
    num_segments = num_adds.shape[0]
    min_id, num_live = ring.live_range(num_adds, max_length, ops)
    k = ops.arange(max_length)[None, :]
    t = min_id[:, None] + k
    end_pos = pos_at(rows_of(t + (num_steps - 1), ops.arange(num_segments)[:, None], max_length, num_segments)[0])
    mask = (k + num_steps <= num_live[:, None]) & is_valid(t, end_pos, min_id[:, None], history_len, num_steps)
    if aligned:
        mask = mask & (end_pos % num_steps == 0)
    return mask, t


def frame_ids(t: Any, history_len: int, num_steps: int, ops: Any) -> Any:
    """Local ids of the `history_len + num_steps` frames the windows at `t` show."""
    return t[:, None] - history_len + ops.arange(history_len + num_steps)[None, :]


def frame_rows(
    t: Any,
    segment: Any,
    episode_start: Any,
    zero_row: int,
    history_len: int,
    num_steps: int,
    max_length: int,
    num_segments: int,
    ops: Any,
) -> Any:
    """Storage rows of the frames the windows at `t` show, `[B, history_len + num_steps]`.

    A frame older than its window's episode start reads `zero_row`, a row that
    is never written: zero-filling costs no pass over the pixels.
    """
    ids = frame_ids(t, history_len, num_steps, ops)
    rows = rows_of(ids, segment[:, None], max_length, num_segments)[0]
    return ops.where(ids >= episode_start[:, None], rows, ops.zeros_like(rows) + zero_row)


def np_stacks(
    frames: np.ndarray, rows: np.ndarray, history_len: int, num_steps: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Observation and next-observation stacks of windows, from a frame array.

    When one pixel's stack fills a 2-, 4- or 8-byte word (4 uint8 frames do), it
    is built as that word (`_word_stacks`, about twice as fast); else slot by
    slot. Both stacks share one allocation and temporaries stay small: with
    glibc, freeing that block raises the heap's trim threshold above a call's
    footprint, so later calls reuse its pages instead of returning them to the
    OS and faulting them back in (3-5 times slower).

    Args:
      frames: `[num_rows, *frame_shape]`; `rows`: `[B, history_len + n]`, as
        `frame_rows` returns.
      num_steps: `n`, or `None` for single transitions (no time axis).

    Returns:
      `(observation, next_observation)`, each `[B, (n,) *frame_shape, history_len]`.
    """
    word_size = history_len * frames.dtype.itemsize
    if history_len > 1 and word_size in (2, 4, 8) and not frames.dtype.hasobject:
        obs, nxt = _word_stacks(frames, rows, history_len, np.dtype(f"<u{word_size}"))
    else:
        obs, nxt = _slot_stacks(frames, rows, history_len)
    outer = rows.shape[:1] + (() if num_steps is None else (num_steps,))
    shape = outer + frames.shape[1:] + (history_len,)
    return obs.view(frames.dtype).reshape(shape), nxt.view(frames.dtype).reshape(shape)


def _slot_stacks(frames: np.ndarray, rows: np.ndarray, history_len: int) -> tuple[np.ndarray, np.ndarray]:
    """`[B, n, pixels, history_len]` stacks, filled one slot at a time.

    Strided writes of one slot beat copying a transposed view.
    """
    size, n, pixels = rows.shape[0], rows.shape[1] - history_len, math.prod(frames.shape[1:])
    windows = frames.take(rows.reshape(-1), axis=0).reshape(rows.shape + (pixels,))
    obs, nxt = np.empty((2, size, n, pixels, history_len), frames.dtype)
    for j in range(n):
        for k in range(history_len):
            obs[:, j, :, k] = windows[:, j + k]
            nxt[:, j, :, k] = windows[:, j + k + 1]
    return obs, nxt


def _word_stacks(
    frames: np.ndarray, rows: np.ndarray, history_len: int, word: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """`[B, n, pixels]` stacks, each pixel's stack one `word` with slot `k` in bits `[k * lane, (k + 1) * lane)`.

    The words are little-endian, so their bytes are the stack's. Whole-frame
    shifts and ors build them, newest first: an observation is its next
    observation shifted up one lane with the older frame in lane 0, and that
    next observation is the following step's observation. Frames are gathered
    one slot at a time, to keep temporaries small.
    """
    size, n, pixels = rows.shape[0], rows.shape[1] - history_len, math.prod(frames.shape[1:])
    lane = 8 * frames.dtype.itemsize

    def frame(k: int) -> np.ndarray:  # frame `k` of every window, its bits as little-endian unsigned integers
        return frames.take(rows[:, k], axis=0).reshape(size, pixels).view(f"<u{frames.dtype.itemsize}")

    obs, nxt = np.empty((2, size, n, pixels), word)
    for j in reversed(range(n)):
        stack, following = obs[:, j], nxt[:, j]  # views: in-place operators on them write obs and nxt
        if j == n - 1:
            following[...] = frame(j + history_len)
            for k in reversed(range(j + 1, j + history_len)):
                following <<= lane
                following |= frame(k)
        else:
            following[...] = obs[:, j + 1]
        np.left_shift(following, lane, out=stack)
        stack |= frame(j)
    return obs, nxt


@tf.function(jit_compile=True)
def tf_stacks(
    frames: tf.Variable, rows: tf.Tensor, history_len: int, num_steps: int | None
) -> tuple[tf.Tensor, tf.Tensor]:
    """`np_stacks` for a frame variable: one compiled gather-and-transpose.

    XLA fuses the gather with the move to the last axis, several times faster
    than TF's own transpose kernel on uint8.
    """
    flat = tf.reshape(rows, [-1])
    windows = tf.reshape(tf.gather(frames, flat), tf.concat([tf.shape(rows), tf.shape(frames)[1:]], 0))
    rank = len(frames.shape)
    stacked = tf.transpose(windows, [0] + list(range(2, rank + 1)) + [1])
    if num_steps is None:
        return stacked[..., :history_len], stacked[..., 1:]
    obs = [stacked[..., k : k + history_len] for k in range(num_steps)]
    nxt = [stacked[..., k + 1 : k + 1 + history_len] for k in range(num_steps)]
    return tf.stack(obs, 1), tf.stack(nxt, 1)
