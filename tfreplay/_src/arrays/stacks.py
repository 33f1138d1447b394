"""Frame stacks: observation and next-observation stacks of windows, from frame rows.

The frame storage (`storage.FrameStorage`) keeps each frame once; a sample
names, per window, the rows of the `history_len + n` frames it shows
(`FrameStorage.frame_rows`), and these functions stack them on a new last
axis. NumPy stacks as packed words; TF stacks with the native kernel
(`tfreplay.native`) or, without it, with one XLA program.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf


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


def kernel_stacks(
    op: Any, frames: tf.Variable, rows: tf.Tensor, history_len: int, num_steps: int | None
) -> tuple[tf.Tensor, tf.Tensor]:
    """`tf_stacks` through the native kernel, with the static shapes the kernel cannot infer."""
    obs, nxt = op(frames.handle, rows, T=frames.dtype, history_len=history_len, time_axis=num_steps is not None)
    shape = rows.shape[:1].concatenate([] if num_steps is None else [num_steps])
    shape = shape.concatenate(frames.shape[1:]).concatenate([history_len])
    obs.set_shape(shape)
    nxt.set_shape(shape)
    return obs, nxt


def on_cpu(variable: tf.Variable) -> bool:
    """Whether a variable lives on the CPU, the only device the native kernel runs on."""
    return tf.DeviceSpec.from_string(variable.device or "/cpu:0").device_type in (None, "CPU")
