"""The episode index and the episode-aware window option of the uniform sampler.

Items carry `step_type` (TF-Agents' FIRST = 0) or `terminated`/`truncated`;
with `within_episodes=True` a window of `num_steps` items never joins two
episodes, and every valid window is equally likely.
"""

import numpy as np
import pytest
import tensorflow as tf
from helpers import quick
from scipy import stats

from tfreplay import (
    EpisodeRule,
    PyPrioritizedReplayBuffer,
    PyUniformReplayBuffer,
    TFPrioritizedReplayBuffer,
    TFUniformReplayBuffer,
)

SPEC = {"id": tf.TensorSpec([], tf.int64), "step_type": tf.TensorSpec([], tf.int32)}
ENDS_SPEC = {"id": tf.TensorSpec([], tf.int64), "terminated": tf.TensorSpec([], tf.bool)}
CLASSES = {"tf": TFUniformReplayBuffer, "py": PyUniformReplayBuffer}


def episodes_stream(rng, length, max_episode):
    """`(step_type, episode number)` of a stream of random-length episodes."""
    step_type, episode, current, left = [], [], -1, 0
    for _ in range(length):
        if left == 0:
            current, left = current + 1, int(rng.integers(1, max_episode + 1))
            step_type.append(0)
        else:
            step_type.append(1)
        episode.append(current)
        left -= 1
    return np.array(step_type, np.int32), np.array(episode)


def fill(kind, rng, batch_size=3, max_length=12, steps=30, max_episode=5, **kwargs):
    rb = CLASSES[kind](SPEC, batch_size=batch_size, max_length=max_length, within_episodes=True, **kwargs)
    streams = [episodes_stream(rng, steps, max_episode) for _ in range(batch_size)]
    for t in range(steps):
        ids = t * batch_size + np.arange(batch_size)
        rb.add_batch({"id": ids, "step_type": np.array([s[0][t] for s in streams], np.int32)})
    return rb, streams


def valid_windows(streams, batch_size, max_length, steps, n):
    """Every valid window start (global id), from the plain streams."""
    starts = []
    for s, (_, episode) in enumerate(streams):
        live = range(max(steps - max_length, 0), steps)
        for t in live:
            if t + n - 1 in live and episode[t] == episode[t + n - 1]:
                starts.append(t * batch_size + s)
    return starts


@pytest.mark.parametrize("kind", sorted(CLASSES))
@pytest.mark.parametrize("n", quick([2, 3, 5], 3))
def test_windows_stay_inside_one_episode_and_are_uniform(kind, n):
    rng = np.random.default_rng(n)
    rb, streams = fill(kind, rng, max_episode=9, seed=n)
    valid = valid_windows(streams, 3, 12, 30, n)
    assert len(valid) >= 5
    items, info = rb.get_next(sample_batch_size=4000, num_steps=n)
    ids = np.asarray(items["id"])
    np.testing.assert_array_equal(ids, np.asarray(info.ids))
    np.testing.assert_array_equal(ids[:, 1:] - ids[:, :-1], 3)  # consecutive items of one segment
    episode = np.array([streams[i % 3][1][i // 3] for i in ids.ravel()]).reshape(ids.shape)
    assert (episode == episode[:, :1]).all(), "a window joined two episodes"
    np.testing.assert_allclose(np.asarray(info.probabilities), 1 / len(valid), rtol=1e-6)
    counts = np.array([np.sum(ids[:, 0] == v) for v in valid])
    assert counts.sum() == len(ids), "a window outside the valid set was drawn"
    assert stats.chisquare(counts).pvalue > 1e-6


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_without_the_option_windows_cross_episodes_as_before(kind):
    rb = CLASSES[kind](SPEC, batch_size=1, max_length=8, seed=0)
    for t in range(8):
        rb.add_batch({"id": np.array([t]), "step_type": np.array([0], np.int32)})  # every item its own episode
    items, _ = rb.get_next(sample_batch_size=50, num_steps=2)
    assert np.asarray(items["id"]).shape == (50, 2)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_no_window_inside_an_episode_is_a_clear_error(kind):
    rb = CLASSES[kind](SPEC, batch_size=1, max_length=8, within_episodes=True, seed=0)
    for t in range(8):
        rb.add_batch({"id": np.array([t]), "step_type": np.array([0], np.int32)})
    with pytest.raises(ValueError, match=r"no episode holds 2 consecutive items yet \(num_steps=2\)"):
        rb.get_next(sample_batch_size=2, num_steps=2)
    assert int(rb.num_frames()) == 8


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_terminated_items_end_their_episode(kind):
    rb = CLASSES[kind](ENDS_SPEC, batch_size=1, max_length=10, within_episodes=True, seed=1)
    ends = [False, True, False, False, True, False, False, False, True, False]  # episodes 0-1, 2-4, 5-8, 9
    for t, end in enumerate(ends):
        rb.add_batch({"id": np.array([t]), "terminated": np.array([end])})
    items, _ = rb.get_next(sample_batch_size=2000, num_steps=3)
    starts = set(np.asarray(items["id"])[:, 0].tolist())
    assert starts == {2, 5, 6}


def test_a_spec_without_boundaries_refuses_the_option():
    spec = {"id": tf.TensorSpec([], tf.int64)}
    with pytest.raises(ValueError, match=r"within_episodes \(True\) needs items that mark episode boundaries"):
        TFUniformReplayBuffer(spec, batch_size=2, max_length=4, within_episodes=True)
    rule = EpisodeRule(start="id")  # a step_type-like integer field: 0 starts an episode
    rb = PyUniformReplayBuffer(spec, batch_size=1, max_length=4, within_episodes=True, episode_rule=rule, seed=0)
    for value in (5, 0, 3, 4):  # episodes [5] and [0, 3, 4]
        rb.add_batch({"id": np.array([value])})
    items, _ = rb.get_next(sample_batch_size=200, num_steps=2)
    assert {tuple(w) for w in np.asarray(items["id"]).tolist()} == {(0, 3), (3, 4)}
    with pytest.raises(TypeError, match="episode end field 'id' \\(int64\\) must be tf.bool"):
        PyUniformReplayBuffer(spec, batch_size=1, max_length=4, episode_rule=EpisodeRule(ends=("id",)))


@pytest.mark.parametrize(
    "cls", [TFUniformReplayBuffer, PyUniformReplayBuffer, TFPrioritizedReplayBuffer, PyPrioritizedReplayBuffer]
)
def test_gather_all_is_batch_size_by_time_as_without_the_option(cls):
    """`within_episodes` changes which windows are drawn, not what is stored: `gather_all` is every stored item,
    `[batch_size, time, ...]`, oldest first, through wrap-around too."""
    rng = np.random.default_rng(4)
    streams = [episodes_stream(rng, 17, 5) for _ in range(3)]
    within = cls(SPEC, batch_size=3, max_length=12, within_episodes=True)
    plain = cls(SPEC, batch_size=3, max_length=12)
    for t in range(17):
        for rb in (within, plain):
            rb.add_batch({"id": t * 3 + np.arange(3), "step_type": np.array([s[0][t] for s in streams], np.int32)})
    everything = tf.nest.map_structure(np.asarray, within.gather_all())
    assert everything["id"].shape == (3, 12) and everything["step_type"].shape == (3, 12)
    np.testing.assert_array_equal(everything["id"], np.arange(5, 17)[None, :] * 3 + np.arange(3)[:, None])
    tf.nest.map_structure(np.testing.assert_array_equal, everything, plain.gather_all())


@pytest.mark.slow  # hundreds of adds on both twins
def test_the_twins_agree_on_the_index_through_wrap_around():
    rng = np.random.default_rng(7)
    tf_rb, streams = fill("tf", rng, steps=41, max_episode=7, seed=3)
    py_rb = PyUniformReplayBuffer(SPEC, batch_size=3, max_length=12, within_episodes=True, seed=3)
    for t in range(41):
        py_rb.add_batch({"id": t * 3 + np.arange(3), "step_type": np.array([s[0][t] for s in streams], np.int32)})
    for n in (1, 2, 4):
        _, tf_info = tf_rb.get_next(sample_batch_size=3, num_steps=n)
        _, py_info = py_rb.get_next(sample_batch_size=3, num_steps=n)
        np.testing.assert_allclose(np.asarray(tf_info.probabilities), py_info.probabilities)
