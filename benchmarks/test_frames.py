"""Frame replay: sampling from frame buffers against uniform buffers that store pre-stacked observations.

Baseline of each group: `TFUniformReplayBuffer` / `PyUniformReplayBuffer` of
`{observation: u8[84,84,4], next_observation: u8[84,84,4], action, reward,
terminated, truncated}`, 4 segments x 5,000 rows, full; the case: the frame
buffer of `frame_data_spec((84, 84))`, `history_len=4`, the same rows (episodes
of 500 steps). Samples of 32 transitions. The floor group is NumPy's random
reads alone: the 160 frames a batch of 32 shows (history_len + 1 each) against
the 64 stacks the uniform buffer reads, from arrays of the buffers' size.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.common import drained, measure, size
from tfreplay import (
    PyFrameReplayBuffer,
    PyUniformReplayBuffer,
    TFFrameReplayBuffer,
    TFUniformReplayBuffer,
    frame_data_spec,
)

SEGMENTS, ROWS, BATCH, HISTORY, EPISODE = 4, size(5_000, 40), size(32, 4), 4, size(500, 10)


def _stacked_spec() -> dict:
    stack = tf.TensorSpec([84, 84, HISTORY], tf.uint8)
    rest = {k: v for k, v in frame_data_spec().items() if k not in ("frame", "first")}
    return {"observation": stack, "next_observation": stack, **rest}


def _rows(i: int, stacked: bool, pool: np.ndarray) -> dict:
    """Row `i` of every segment: a frame (or two stacks) from a small random pool, and the step's entries."""
    rows = {
        "action": np.full(SEGMENTS, i % 6, np.int32),
        "reward": np.ones(SEGMENTS, np.float32),
        "terminated": np.full(SEGMENTS, i % EPISODE == EPISODE - 1),
        "truncated": np.zeros(SEGMENTS, bool),
    }
    if stacked:
        stacks = pool[i % len(pool)]
        return {"observation": stacks, "next_observation": stacks, **rows}
    return {"frame": pool[i % len(pool)][..., 0], "first": np.full(SEGMENTS, i % EPISODE == 0), **rows}


@pytest.fixture(scope="module")
def buffers() -> dict:
    pool = np.random.default_rng(0).integers(0, 256, (16, SEGMENTS, 84, 84, HISTORY), dtype=np.uint8)
    makers = {
        ("TF", "frames"): lambda: TFFrameReplayBuffer(frame_data_spec(), SEGMENTS, ROWS, HISTORY, seed=0),
        ("TF", "stacked"): lambda: TFUniformReplayBuffer(_stacked_spec(), SEGMENTS, ROWS, seed=0),
        ("Py", "frames"): lambda: PyFrameReplayBuffer(
            frame_data_spec(), batch_size=SEGMENTS, max_length=ROWS, history_len=HISTORY, seed=0
        ),
        ("Py", "stacked"): lambda: PyUniformReplayBuffer(_stacked_spec(), batch_size=SEGMENTS, max_length=ROWS, seed=0),
    }
    out = {}
    for key, make in makers.items():
        rb = out[key] = make()
        for i in range(ROWS):
            rb.add_batch(_rows(i, key[1] == "stacked", pool))
    return out


CASES = ["TF get_next", "TF get_next num_steps=2", "TF dataset next()", "Py get_next"]


@pytest.mark.parametrize("kind", ["stacked", "frames"])
@pytest.mark.parametrize("case", CASES)
def test_sample(benchmark, buffers, case, kind):
    rb = buffers[case[:2], kind]
    if case == "TF dataset next()":
        fn = drained(iter(rb.as_dataset(BATCH).prefetch(tf.data.AUTOTUNE)))
    elif case.endswith("num_steps=2"):
        fn = lambda: rb.get_next(BATCH, num_steps=2)  # noqa: E731
    else:
        fn = lambda: rb.get_next(BATCH)  # noqa: E731
    label = "uniform, pre-stacked" if kind == "stacked" else "frames"
    role = "baseline" if kind == "stacked" else None
    measure(benchmark, fn, group=f"frames {case}({BATCH})", case=label, role=role, items=BATCH)


@pytest.mark.parametrize("kind", ["stacks", "frames"])
def test_floor_numpy_reads(benchmark, kind):
    rng = np.random.default_rng(1)
    if kind == "frames":
        source, rows = rng.integers(0, 256, (SEGMENTS * ROWS + 1, 84, 84), dtype=np.uint8), BATCH * (HISTORY + 1)
    else:
        source, rows = rng.integers(0, 256, (SEGMENTS * ROWS, 84, 84, HISTORY), dtype=np.uint8), 2 * BATCH
    draws: Any = itertools.cycle([rng.integers(0, len(source), rows) for _ in range(64)])
    fn = lambda: source.take(next(draws), axis=0)  # noqa: E731
    role = "baseline" if kind == "stacks" else None
    measure(benchmark, fn, group="frames floor: NumPy take", case=f"{rows} {kind}", role=role, items=BATCH)
