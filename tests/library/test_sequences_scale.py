"""Strict sequences drawn by rejection: exact and uniform however rare the valid windows are.

The uniform sampler draws a strict window through the episode index: the
first round's candidates are read together with the rows that correct the
count, later rounds redraw only the samples still missing, and after the
last round an exact scan serves the rest. A buffer where valid windows are
rare among the candidates goes through every one of these steps.
"""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tfreplay import PyUniformReplayBuffer, Sequences, TFUniformReplayBuffer

SPEC = {"id": tf.TensorSpec([], tf.int64), "step_type": tf.TensorSpec([], tf.int32)}
CLASSES = {"tf": TFUniformReplayBuffer, "py": PyUniformReplayBuffer}
SEGMENTS, LENGTH, STEPS = 2, 60, 5


def rare_windows(kind, seed):
    """A full, wrapped buffer of 1-step episodes but for a few of STEPS + 1 items (segment 1's first one
    cut by the ring, so none of its windows is live); returns the buffer and every valid start's id."""
    rb = CLASSES[kind](SPEC, batch_size=SEGMENTS, max_length=LENGTH, seed=seed)
    total = LENGTH + 7
    long_starts = {0: [LENGTH - 3], 1: [4, 30]}  # local ids where an episode of STEPS + 1 items starts
    valid = []
    for t in range(total):
        step_type = []
        for s in range(SEGMENTS):
            inside = [a for a in long_starts[s] if 0 < t - a <= STEPS]
            step_type.append(1 if inside else 0)
            if inside and t - inside[0] >= STEPS - 1 and t - STEPS + 1 >= total - LENGTH:
                valid.append((t - STEPS + 1) * SEGMENTS + s)
        rb.add_batch({"id": t * SEGMENTS + np.arange(SEGMENTS), "step_type": np.array(step_type, np.int32)})
    return rb, sorted(valid)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_rare_strict_windows_are_uniform_with_their_exact_probability(kind):
    rb, valid = rare_windows(kind, seed=5)
    assert len(valid) == 4  # 2 in each whole long episode: a candidate is valid 1 time in 28
    window, info = rb.get_next(sample_batch_size=2000, transform=Sequences(STEPS))
    ids = np.asarray(window.items["id"])
    np.testing.assert_array_equal(ids[:, 0], np.asarray(info.ids))
    np.testing.assert_array_equal(ids[:, 1:] - ids[:, :-1], SEGMENTS)  # consecutive items of one segment
    assert np.asarray(window.mask).all()
    np.testing.assert_allclose(np.asarray(info.probabilities), 1 / len(valid), rtol=1e-6)
    counts = np.array([np.sum(ids[:, 0] == v) for v in valid])
    assert counts.sum() == len(ids), "a window outside the valid set was drawn"
    assert stats.chisquare(counts).pvalue > 1e-6
