"""Proportional prioritized replay: the sum-tree sampler on both twins.

A Python model keeps each live item's priority; samples must follow
`p ** alpha / sum` over the items that can start a window (chi-square, for
any seed), report exactly that probability, never draw priority 0, and
ignore updates for items overwritten since.
"""

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPEC, decode, make_items
from scipy import stats

from tfreplay.buffers import PyPrioritizedReplayBuffer, TFPrioritizedReplayBuffer, importance_weights

CLASSES = {"tf": TFPrioritizedReplayBuffer, "py": PyPrioritizedReplayBuffer}
B, L, ALPHA = 2, 6, 0.7


def filled(kind, steps=9, seed=0):
    rb = CLASSES[kind](SPEC, batch_size=B, max_length=L, alpha=ALPHA, seed=seed)
    for step in range(steps):
        rb.add_batch(make_items(step * B + np.arange(B)))
    return rb


def live_ids(steps):
    return np.arange(max(steps - L, 0) * B, steps * B)


def expected(priorities: dict, steps: int, num_steps: int):
    """Window starts and their exact probabilities from the model."""
    newest = steps - 1
    starts = [i for i in live_ids(steps) if i // B + num_steps - 1 <= newest]
    weights = np.array([priorities[i] ** ALPHA for i in starts])
    return np.array(starts), weights / weights.sum()


@pytest.mark.parametrize("kind", sorted(CLASSES))
@pytest.mark.parametrize("num_steps", [None, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_samples_follow_the_priorities_exactly(kind, num_steps, seed):
    rng = np.random.default_rng(seed)
    rb = filled(kind, seed=seed)
    priorities = {i: 1.0 for i in live_ids(9)}  # new items enter at the largest priority so far: 1
    ids = live_ids(9)
    new = rng.uniform(0.1, 5.0, size=len(ids))
    new[3] = 0.0  # never drawn
    rb.update_priorities(ids, new)
    priorities.update(zip(ids.tolist(), new.tolist()))
    starts, probs = expected(priorities, 9, num_steps or 1)
    items, info = rb.get_next(sample_batch_size=6000, num_steps=num_steps)
    drawn = decode(items)
    first = drawn if num_steps is None else drawn[:, 0]
    np.testing.assert_array_equal(np.asarray(info.ids), drawn)
    assert ids[3] not in first and set(first) <= set(starts.tolist())
    counts = np.array([np.sum(first == s) for s in starts])
    keep = probs > 0
    assert stats.chisquare(counts[keep], probs[keep] * len(first)).pvalue > 1e-6
    lookup = dict(zip(starts.tolist(), probs))
    np.testing.assert_allclose(np.asarray(info.probabilities), [lookup[s] for s in first], rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_updates_for_overwritten_items_are_ignored_and_counted(kind):
    rb = filled(kind, steps=4)
    _, info = rb.get_next(sample_batch_size=8)
    for step in range(4, 4 + L):  # every sampled item is overwritten
        rb.add_batch(make_items(step * B + np.arange(B)))
    before = rb.get_next(sample_batch_size=4000)[1].probabilities
    stale = rb.update_priorities(np.asarray(info.ids), np.full([8], 50.0))
    assert int(stale) == 8
    np.testing.assert_allclose(np.asarray(rb.get_next(sample_batch_size=4000)[1].probabilities), before)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_new_items_enter_at_the_largest_priority(kind):
    rb = filled(kind, steps=2)
    rb.update_priorities(live_ids(2), np.array([4.0, 1.0, 1.0, 1.0]))
    rb.add_batch(make_items(4 + np.arange(B)))
    items, info = rb.get_next(sample_batch_size=2000)
    drawn, probs = decode(items), np.asarray(info.probabilities)
    weights = np.array([4.0, 1, 1, 1, 4.0, 4.0]) ** ALPHA
    np.testing.assert_allclose(probs[drawn == 4], weights[4] / weights.sum(), rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(CLASSES))
@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf])
def test_bad_priorities_are_refused_and_change_nothing(kind, bad):
    rb = filled(kind)
    before = np.asarray(rb.get_next(sample_batch_size=50)[1].probabilities)
    with pytest.raises(ValueError, match=r"update_priorities: priorities \(\[.*\] among them\) must be finite"):
        rb.update_priorities(live_ids(9)[:2], np.array([2.0, bad]))
    with pytest.raises(ValueError, match=r"priorities \(shape \(3,\)\) must have the shape of ids \(\(2,\)\)"):
        rb.update_priorities(live_ids(9)[:2], np.ones(3))
    np.testing.assert_array_equal(np.asarray(rb.get_next(sample_batch_size=50)[1].probabilities), before)


def test_tf_updates_and_samples_inside_a_function_and_a_dataset():
    rb = filled("tf")

    @tf.function
    def step(ids):
        return rb.update_priorities(ids, tf.zeros_like(ids, tf.float64))

    step(tf.constant(live_ids(9)[:4], tf.int64))  # four items never drawn again
    items, info = next(iter(rb.as_dataset(sample_batch_size=500)))
    assert not set(decode(items).tolist()) & set(live_ids(9)[:4].tolist())
    bad = tf.function(lambda: rb.update_priorities(tf.constant([6], tf.int64), tf.constant([-1.0], tf.float64)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="every priority must be finite and non-negative"):
        bad()


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_the_sum_tree_is_checkpointed(kind, tmp_path):
    rb = filled(kind, seed=3)
    rb.update_priorities(live_ids(9), np.arange(1, 13, dtype=np.float64))
    path = tf.train.Checkpoint(buffer=rb).write(str(tmp_path / "ckpt"))
    expected_sample = rb.get_next(sample_batch_size=30)
    rb.update_priorities(live_ids(9), np.ones(12))
    tf.train.Checkpoint(buffer=rb).restore(path)
    got = rb.get_next(sample_batch_size=30)
    np.testing.assert_array_equal(decode(got[0]), decode(expected_sample[0]))
    np.testing.assert_allclose(np.asarray(got[1].probabilities), np.asarray(expected_sample[1].probabilities))


def test_importance_weights_follow_the_formula():
    probs = np.array([0.5, 0.25, 0.125], np.float32)
    got = importance_weights(probs, 8, beta=0.5).numpy()
    raw = (8 * probs) ** -0.5
    np.testing.assert_allclose(got, raw / raw.max(), rtol=1e-6)
