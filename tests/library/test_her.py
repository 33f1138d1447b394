"""Hindsight relabeling (`HindsightRelabel`) over the uniform and prioritized row buffers, TF and NumPy.

Every item's achieved goal is its global id, and every stored desired goal is
-1, so a relabeled sample names the item its goal came from. A plain Python
model of the streams written (episodes, segments, the ring's live range)
says which goals each strategy may take; the relabel ratio is checked with a
binomial bound and the `future`/`episode` goal steps with a chi-square test
against uniform, each with a false-failure probability of at most 1e-6 for any seed.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import quick
from scipy import stats

from tfreplay import (
    HindsightRelabel,
    PyPrioritizedReplayBuffer,
    PyUniformReplayBuffer,
    TFPrioritizedReplayBuffer,
    TFUniformReplayBuffer,
    Transform,
)

ALPHA = 1e-6  # the false-failure probability of each statistical check
STORED_REWARD = 0.5
SPEC = {
    "observation": tf.TensorSpec([2], tf.float32),
    "achieved_goal": tf.TensorSpec([1], tf.int64),
    "desired_goal": tf.TensorSpec([1], tf.int64),
    "reward": tf.TensorSpec([], tf.float32),
    "first": tf.TensorSpec([], tf.bool),
    "terminated": tf.TensorSpec([], tf.bool),
    "truncated": tf.TensorSpec([], tf.bool),
    "id": tf.TensorSpec([], tf.int64),
}
CLASSES = {
    "tf-uniform": TFUniformReplayBuffer,
    "py-uniform": PyUniformReplayBuffer,
    "tf-prioritized": TFPrioritizedReplayBuffer,
    "py-prioritized": PyPrioritizedReplayBuffer,
}


def reached(achieved, desired):
    """1 where the goals are equal: the reward of both twins (NumPy arrays in, or tensors)."""
    if isinstance(achieved, np.ndarray):
        return (achieved == desired).all(-1).astype(np.float32)
    return tf.cast(tf.reduce_all(achieved == desired, -1), tf.float32)


def her(strategy: str = "future", ratio: float = 0.8) -> HindsightRelabel:
    return HindsightRelabel(reached, strategy=strategy, relabel_ratio=ratio)


# --- the model ----------------------------------------------------------------------------


class Streams:
    """Episodes of random length in `num` segments, written in lockstep into rings of `max_length` rows.

    Episodes end terminated, truncated or (the last one of a segment, sometimes) not yet.
    """

    def __init__(self, rng, num: int, length: int, max_episode: int, max_length: int):
        self.num, self.length, self.max_length = num, length, max_length
        self.episode = np.zeros([num, length], np.int64)
        self.first = np.zeros([num, length], bool)
        self.end = np.zeros([num, length], bool)
        for s in range(num):
            t, e = 0, 0
            while t < length:
                n = int(rng.integers(1, max_episode + 1))
                self.first[s, t] = True
                self.episode[s, t : t + n] = e
                if t + n <= length and (t + n < length or rng.random() < 0.5):
                    self.end[s, t + n - 1] = True
                t, e = t + n, e + 1
        self.kind = rng.integers(0, 2, size=[num, length]).astype(bool)  # terminated or truncated

    def items(self, t: int) -> dict:
        gid = t * self.num + np.arange(self.num)
        return {
            "observation": np.stack([gid, np.zeros(self.num)], 1).astype(np.float32),
            "achieved_goal": gid[:, None],
            "desired_goal": np.full([self.num, 1], -1, np.int64),
            "reward": np.full(self.num, STORED_REWARD, np.float32),
            "first": self.first[:, t],
            "terminated": self.end[:, t] & self.kind[:, t],
            "truncated": self.end[:, t] & ~self.kind[:, t],
            "id": gid,
        }

    def fill(self, cls, seed: int = 0, upto: int | None = None, rb=None):
        rb = rb or cls(SPEC, batch_size=self.num, max_length=self.max_length, seed=seed)
        for t in range(self.length if upto is None else upto):
            rb.add_batch(self.items(t))
        return rb

    def stored(self, s: int, t: int, written: int) -> list[int]:
        """Local ids of the stored items of the episode of item `t` of segment `s`, oldest first."""
        oldest = max(0, written - self.max_length)
        return [u for u in range(oldest, written) if self.episode[s, u] == self.episode[s, t]]

    def ended(self, s: int, t: int, written: int) -> bool:
        last = self.stored(s, t, written)[-1]
        return bool(self.end[s, last]) or last + 1 < written


def draw(rb, transform, size: int, mode: str = "eager"):
    """`(items, ids, probabilities)` as NumPy, from get_next eagerly, in tf.function, or from as_dataset."""
    if mode == "eager":
        out, info = rb.get_next(sample_batch_size=size, transform=transform)
    elif mode == "function":
        out, info = tf.function(lambda: rb.get_next(sample_batch_size=size, transform=transform))()
    else:
        out, info = next(iter(rb.as_dataset(sample_batch_size=size, transform=transform)))
    return tf.nest.map_structure(np.asarray, out), np.asarray(info.ids), np.asarray(info.probabilities)


def check_goals(streams: Streams, written: int, strategy: str, items: dict, ids) -> np.ndarray:
    """Asserts every sample holds a goal `strategy` may take (or is as stored); returns which were relabeled."""
    num = streams.num
    np.testing.assert_array_equal(items["id"], ids)
    np.testing.assert_array_equal(items["achieved_goal"][:, 0], ids)
    goals = items["desired_goal"][:, 0]
    relabeled = goals != -1
    for gid, goal, reward, new in zip(ids, goals, items["reward"], relabeled):
        s, t = int(gid % num), int(gid // num)
        if not new:
            assert reward == STORED_REWARD
            continue
        assert goal % num == s, f"item {gid}: goal {goal} is from another segment"
        u = int(goal // num)
        episode = streams.stored(s, t, written)
        assert u in episode, f"item {gid}: goal {goal} is not a stored step of its episode {episode}"
        if strategy == "future":
            assert u >= t
        if strategy == "final":
            assert u == episode[-1] and streams.ended(s, t, written)
        assert reward == float(u == t), f"item {gid} with goal {goal}: reward {reward}"
    return relabeled


# --- goals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
@pytest.mark.parametrize("name", quick(sorted(CLASSES), "tf-uniform", "py-uniform", "py-prioritized"))
def test_goals_come_from_the_items_episode_after_wrap_around(name, strategy):
    streams = Streams(np.random.default_rng(3), num=3, length=70, max_episode=9, max_length=25)
    rb = streams.fill(CLASSES[name])
    relabeled = []
    for _ in range(4):
        items, ids, _ = draw(rb, her(strategy), 256)
        relabeled.append(check_goals(streams, streams.length, strategy, items, ids))
    assert np.concatenate(relabeled).any()


# Each mode on the uniform twins; the prioritized TF buffer (the same relabeling after its own draw) in a graph.
RELABEL_CASES = [(name, mode) for name in ("tf-uniform", "py-uniform") for mode in ("eager", "function", "dataset")]
RELABEL_CASES.append(pytest.param("tf-prioritized", "function", marks=pytest.mark.slow))


@pytest.mark.parametrize("name, mode", RELABEL_CASES)
def test_relabeling_in_graphs_and_datasets(name, mode):
    if mode == "function" and name.startswith("py"):
        pytest.skip("a NumPy buffer reaches graphs through as_dataset")
    streams = Streams(np.random.default_rng(4), num=2, length=40, max_episode=6, max_length=16)
    rb = streams.fill(CLASSES[name])
    for strategy in ("future", "final"):
        items, ids, _ = draw(rb, her(strategy), 128, mode)
        assert check_goals(streams, streams.length, strategy, items, ids).any()


@pytest.mark.parametrize("name", quick(sorted(CLASSES), "tf-uniform", "py-uniform", "py-prioritized"))
def test_before_any_episode_ends(name):
    """`future` relabels with the steps stored so far; `final` leaves every item of an unfinished episode alone."""
    streams = Streams(np.random.default_rng(5), num=2, length=30, max_episode=30, max_length=40)
    streams.first[:, 0], streams.first[:, 1:], streams.end[:] = True, False, False
    streams.episode[:] = 0
    rb = streams.fill(CLASSES[name], upto=7)
    items, ids, _ = draw(rb, her("future", 1.0), 256)
    assert check_goals(streams, 7, "future", items, ids).all()
    items, ids, _ = draw(rb, her("final", 1.0), 256)
    assert not check_goals(streams, 7, "final", items, ids).any()
    streams.end[0, 7], streams.kind[0, 7] = True, True  # segment 0's episode ends at its next item
    rb.add_batch(streams.items(7))
    items, ids, _ = draw(rb, her("final", 1.0), 256)
    np.testing.assert_array_equal(check_goals(streams, 8, "final", items, ids), ids % 2 == 0)


@pytest.mark.parametrize("name", ["tf-uniform", "py-prioritized"])
def test_restored_buffer_relabels_as_the_saved_one(name, tmp_path):
    streams = Streams(np.random.default_rng(6), num=2, length=50, max_episode=8, max_length=20)
    saved = streams.fill(CLASSES[name], seed=1)
    path = tf.train.Checkpoint(buffer=saved).save(str(tmp_path / "ckpt"))
    fresh = CLASSES[name](SPEC, batch_size=2, max_length=20, seed=9)
    tf.train.Checkpoint(buffer=fresh).restore(path).assert_existing_objects_matched()
    transform = her("future")
    expected, expected_ids, _ = draw(saved, transform, 128)
    items, ids, _ = draw(fresh, transform, 128)
    np.testing.assert_array_equal(ids, expected_ids)
    tf.nest.map_structure(np.testing.assert_array_equal, items, expected)
    assert check_goals(streams, streams.length, "future", items, ids).any()


def test_probabilities_are_the_samplers():
    """Relabeling never changes which item is drawn: probabilities are the sampler's, as without it."""
    streams = Streams(np.random.default_rng(7), num=2, length=30, max_episode=5, max_length=30)
    uniform = streams.fill(PyUniformReplayBuffer)
    _, _, probs = draw(uniform, her(), 64)
    np.testing.assert_allclose(probs, 1 / 60)
    prioritized = streams.fill(PyPrioritizedReplayBuffer)
    all_ids = np.arange(60)
    prioritized.update_priorities(all_ids, all_ids + 1.0)
    _, ids, probs = draw(prioritized, her(), 64)
    weights = (all_ids + 1.0) ** 0.6
    np.testing.assert_allclose(probs, weights[ids] / weights.sum(), rtol=1e-5)


# --- distributions ----------------------------------------------------------------------------


def binomial_ok(hits: int, n: int, p: float) -> bool:
    """Whether `hits` of `n` lies inside the two-sided binomial interval of probability 1 - ALPHA."""
    low, high = stats.binom.ppf(ALPHA / 2, n, p), stats.binom.isf(ALPHA / 2, n, p)
    return low <= hits <= high


@pytest.mark.parametrize("ratio", quick([0.0, 0.3, 0.8, 1.0], 0.3, 1.0))
@pytest.mark.parametrize("name", ["tf-uniform", "py-uniform", "py-prioritized"])
def test_relabel_ratio(name, ratio):
    streams = Streams(np.random.default_rng(8), num=2, length=40, max_episode=6, max_length=30)
    rb = streams.fill(CLASSES[name], seed=11)
    n, hits = 0, 0
    for _ in range(5):
        items, ids, _ = draw(rb, her("future", ratio), 1000)
        hits, n = hits + int(check_goals(streams, streams.length, "future", items, ids).sum()), n + len(ids)
    assert binomial_ok(hits, n, ratio), (hits, n, ratio)


@pytest.mark.parametrize("name", ["tf-uniform", "py-uniform"])
def test_final_relabels_only_ended_episodes_at_the_ratio(name):
    streams = Streams(np.random.default_rng(9), num=3, length=40, max_episode=12, max_length=40)
    rb = streams.fill(CLASSES[name], seed=12)
    ended = np.array([streams.ended(int(g % 3), int(g // 3), streams.length) for g in range(3 * streams.length)])
    assert not ended.all()  # some episode runs on
    relabeled, drawn = [], []
    for _ in range(5):
        items, ids, _ = draw(rb, her("final", 0.8), 1000)
        relabeled.append(check_goals(streams, streams.length, "final", items, ids))
        drawn.append(ids)
    relabeled, drawn = np.concatenate(relabeled), np.concatenate(drawn)
    assert not relabeled[~ended[drawn]].any()
    assert binomial_ok(int(relabeled[ended[drawn]].sum()), int(ended[drawn].sum()), 0.8)


@pytest.mark.parametrize("strategy", ["future", "episode"])
@pytest.mark.parametrize("name", quick(["tf-uniform", "py-uniform", "tf-prioritized"], "tf-uniform", "py-uniform"))
def test_goal_steps_are_uniform(name, strategy):
    """Per drawn item, its goal's step is uniform over the stored steps the strategy allows (chi-square)."""
    streams = Streams(np.random.default_rng(10), num=2, length=45, max_episode=10, max_length=20)
    rb = streams.fill(CLASSES[name], seed=13)
    counts: dict[tuple, int] = {}
    for _ in range(20):
        items, ids, _ = draw(rb, her(strategy, 1.0), 1000)
        check_goals(streams, streams.length, strategy, items, ids)
        for gid, goal in zip(ids, items["desired_goal"][:, 0]):
            counts[int(gid), int(goal)] = counts.get((int(gid), int(goal)), 0) + 1
    statistic, dof = 0.0, 0
    for gid in {g for g, _ in counts}:
        s, t = gid % 2, gid // 2
        allowed = [u for u in streams.stored(s, t, streams.length) if strategy == "episode" or u >= t]
        observed = np.array([counts.get((gid, u * 2 + s), 0) for u in allowed])
        assert observed.sum() == sum(v for (g, _), v in counts.items() if g == gid)  # nothing outside `allowed`
        expected = observed.sum() / len(allowed)
        statistic += float(((observed - expected) ** 2 / expected).sum())
        dof += len(allowed) - 1
    assert dof > 50
    assert stats.chi2.sf(statistic, dof) > ALPHA, (statistic, dof)


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"strategy": "later"}, ValueError, r"strategy \('later'\) must be one of future, final, episode"),
        ({"relabel_ratio": 1.5}, ValueError, r"relabel_ratio \(1.5\) must be a number in \[0, 1\]"),
        ({"relabel_ratio": -0.1}, ValueError, r"relabel_ratio \(-0.1\) must be a number in \[0, 1\]"),
        ({"reward_fn": 3}, TypeError, r"reward_fn \(3\) must be callable"),
        ({"desired_goal": ()}, TypeError, r"desired_goal \(\(\)\) must be a path or a tuple of paths"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        HindsightRelabel(**{"reward_fn": reached, **kwargs})


# Each NumPy type on the NumPy twin; the TF twin, which reads the same number, with one.
PY_RATIOS = [("py-uniform", r) for r in (np.float32(0.5), np.float64(0.5), np.int64(1), np.float16(0.0))]


@pytest.mark.parametrize("name, ratio", quick([*PY_RATIOS, ("tf-uniform", np.float32(0.5))], *PY_RATIOS, unpack=True))
def test_numpy_numbers_are_relabel_ratios(name, ratio):
    """A NumPy scalar is a number, as `NStepReturns` takes for `gamma`: it draws as the same Python number."""
    streams = Streams(np.random.default_rng(3), num=2, length=20, max_episode=5, max_length=20)
    samples = [draw(streams.fill(CLASSES[name], seed=4), her("future", r), 200) for r in (ratio, ratio.item())]
    tf.nest.map_structure(np.testing.assert_array_equal, samples[0], samples[1])
    bad = np.float32(1.5)  # NumPy 2 prints it as np.float32(1.5), NumPy 1 as 1.5
    with pytest.raises(ValueError, match=rf"relabel_ratio \({re.escape(repr(bad))}\) must be a number in \[0, 1\]"):
        her("future", bad)


@pytest.mark.parametrize("name", ["tf-uniform", "py-uniform"])
def test_bad_buffers_are_refused_when_asked(name):
    cls = CLASSES[name]
    streams = Streams(np.random.default_rng(0), num=1, length=5, max_episode=3, max_length=10)
    rb = streams.fill(cls)
    before = rb.num_frames()
    missing = HindsightRelabel(reached, achieved_goal="goal")
    with pytest.raises(ValueError, match=r"achieved_goal \('goal'\) must be a leaf of the sampled item"):
        rb.get_next(sample_batch_size=2, transform=missing)
    with pytest.raises(ValueError, match=r"desired_goal 'observation' \(float32\[2\]\) must have the achieved"):
        rb.get_next(sample_batch_size=2, transform=HindsightRelabel(reached, desired_goal="observation"))
    assert int(rb.num_frames()) == int(before)
    plain_spec = {k: v for k, v in SPEC.items() if k not in ("first", "terminated", "truncated")}
    plain = cls(plain_spec, batch_size=1, max_length=10, seed=0)
    with pytest.raises(ValueError, match=r"must mark episode boundaries"):
        plain.get_next(sample_batch_size=2, transform=her())


def test_is_a_transform_of_single_items():
    transform = her()
    assert isinstance(transform, Transform) and transform.num_steps == 1
    assert transform.output_spec(SPEC) == SPEC
