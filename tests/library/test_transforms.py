"""Transforms (n-step returns, sequences) over the four uniform and frame buffers.

Every sample is checked by value against a plain Python model of the
streams written: which window starts may be drawn (strict: inside one
episode; padded: complete, or ended at a stored item, never past the write
head of an unfinished episode), with which probability, and what the
transform makes of them. Eagerly, inside `tf.function` and through
`as_dataset`.
"""

from __future__ import annotations

import dataclasses
import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf
from helpers import FRAME, Reference, make_stream, quick, row
from scipy import stats

from tfreplay import (
    NStepReturns,
    PyFrameReplayBuffer,
    PyPrioritizedFrameReplayBuffer,
    PyPrioritizedReplayBuffer,
    PyUniformReplayBuffer,
    Sequences,
    TFFrameReplayBuffer,
    TFPrioritizedFrameReplayBuffer,
    TFPrioritizedReplayBuffer,
    TFUniformReplayBuffer,
    frame_data_spec,
    sequence_priorities,
)
from tfreplay.rl.drivers import Transition
from tfreplay.transforms import Transform, Window

GAMMA = 0.9
SPEC = Transition(
    observation=tf.TensorSpec([2], tf.float32),  # [global id, 0]
    action=tf.TensorSpec([], tf.int32),
    reward=tf.TensorSpec([], tf.float32),
    discount=tf.TensorSpec([], tf.float32),
    next_observation=tf.TensorSpec([2], tf.float32),  # [global id, 1]
    step_type=tf.TensorSpec([], tf.int32),
    terminated=tf.TensorSpec([], tf.bool),
    truncated=tf.TensorSpec([], tf.bool),
)
ROWS = {"tf": TFUniformReplayBuffer, "py": PyUniformReplayBuffer}
FRAMES = {"tf": TFFrameReplayBuffer, "py": PyFrameReplayBuffer}
PRIORITIZED = {"tf": TFPrioritizedReplayBuffer, "py": PyPrioritizedReplayBuffer}
PRIORITIZED_FRAMES = {"tf": TFPrioritizedFrameReplayBuffer, "py": PyPrioritizedFrameReplayBuffer}
MODES = ("eager", "function", "dataset")


# --- the model ----------------------------------------------------------------------------


def episode_stream(rng, length: int, max_episode: int) -> dict:
    """One environment's steps: episodes of random length ending terminated or truncated; the last may run on."""
    episode, first, terminated, truncated = [], [], [], []
    current, left, kind = -1, 0, ""
    for _ in range(length):
        if left == 0:
            current, left, kind = current + 1, int(rng.integers(1, max_episode + 1)), rng.choice(["term", "trunc"])
            first.append(True)
        else:
            first.append(False)
        left -= 1
        episode.append(current)
        terminated.append(left == 0 and kind == "term")
        truncated.append(left == 0 and kind == "trunc")
    return {
        "episode": np.array(episode),
        "first": np.array(first),
        "terminated": np.array(terminated),
        "truncated": np.array(truncated),
        "reward": rng.normal(size=length).astype(np.float32),
    }


def transition_batch(streams: list, t: int) -> Transition:
    num = len(streams)
    gid = (t * num + np.arange(num)).astype(np.float32)
    pick = lambda key: np.array([s[key][t] for s in streams])  # noqa: E731
    return Transition(
        observation=np.stack([gid, np.zeros(num, np.float32)], 1),
        action=(t * num + np.arange(num)).astype(np.int32) % 7,
        reward=pick("reward"),
        discount=(~pick("terminated")).astype(np.float32),
        next_observation=np.stack([gid, np.ones(num, np.float32)], 1),
        step_type=np.where(pick("first"), 0, np.where(pick("terminated") | pick("truncated"), 2, 1)).astype(np.int32),
        terminated=pick("terminated"),
        truncated=pick("truncated"),
    )


def fill_rows(kind: str, streams: list, max_length: int, seed: int = 0, classes: dict = ROWS, **kwargs):
    rb = classes[kind](SPEC, batch_size=len(streams), max_length=max_length, seed=seed, **kwargs)
    for t in range(len(streams[0]["first"])):
        rb.add_batch(transition_batch(streams, t))
    return rb


class Model:
    """Which windows of `n` may be drawn from streams written into a ring of `max_length` rows.

    `single(s, t)`: whether item `t` of segment `s` can be drawn alone;
    `same(s, t, k)`: whether item `t + k` is a step of `t`'s episode;
    `ended(s, t)`: whether the index knows item `t` ends its episode.
    """

    def __init__(self, streams: list, max_length: int, frames: Reference | None = None):
        self.streams, self.num = streams, len(streams)
        self.newest = len(streams[0]["first"]) - 1
        self.oldest = max(0, self.newest + 1 - max_length)
        self.frames = frames
        self.live_single = frames.valid(1) if frames else None

    def single(self, s, t):
        if self.frames:
            return t * self.num + s in self.live_single
        return self.oldest <= t <= self.newest

    def same(self, s, t, k):
        stream = self.streams[s]
        if t + k > self.newest:
            return False
        if self.frames:
            return not stream["first"][t + 1 : t + k + 1].any()
        return stream["episode"][t + k] == stream["episode"][t]

    def real_steps(self, s, t, n):
        m = 1
        while m < n and self.same(s, t, m):
            m += 1
        return m

    def drawable(self, s, t, n, padded):
        if not self.single(s, t):
            return False
        m = self.real_steps(s, t, n)
        if m == n or not padded:
            return m == n
        if t + m <= self.newest:
            return True  # the next item is stored and starts another episode
        stream = self.streams[s]
        return not self.frames and bool(stream["terminated"][t + m - 1] | stream["truncated"][t + m - 1])

    def starts(self, n, padded):
        return {
            t * self.num + s
            for s in range(self.num)
            for t in range(self.oldest, self.newest + 1)
            if self.drawable(s, t, n, padded)
        }

    def n_step(self, gid: int, n: int, gamma: float) -> dict:
        s, t = gid % self.num, gid // self.num
        stream, m = self.streams[s], self.real_steps(s, t, n)
        discount = 1.0 - stream["terminated"][t : t + m].astype(np.float64)
        return {
            "m": m,
            "last": (t + m - 1) * self.num + s,
            "reward": sum(gamma**k * float(stream["reward"][t + k]) for k in range(m)),
            "discount": gamma**m * float(np.prod(discount)),
            "terminated": bool(stream["terminated"][t + m - 1]),
            "truncated": bool(stream["truncated"][t + m - 1]),
        }


def draw(rb, mode: str, size: int, transform):
    """`(outputs, ids, probabilities)` as NumPy, from get_next eagerly, in tf.function, or from as_dataset."""
    tf_twin = type(rb).__name__.startswith("TF")
    if mode == "eager":
        out, info = rb.get_next(sample_batch_size=size, transform=transform)
    elif mode == "function" and tf_twin:
        out, info = tf.function(lambda: rb.get_next(sample_batch_size=size, transform=transform))()
    else:  # the NumPy twins reach a graph through as_dataset
        ds = rb.as_dataset(sample_batch_size=size, transform=transform)
        read = (lambda: next(iter(ds))) if mode == "dataset" else tf.function(lambda: next(iter(ds)))
        out, info = read()
    numpy = lambda x: np.asarray(x)  # noqa: E731
    return tf.nest.map_structure(numpy, out), numpy(info.ids), numpy(info.probabilities)


# --- n-step returns -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", quick(MODES, "eager", "dataset"))
@pytest.mark.parametrize("kind", sorted(ROWS))
def test_n_step_equals_a_direct_computation_over_wrapped_episodes(kind, mode):
    rng = np.random.default_rng(5)
    streams = [episode_stream(rng, 47, max_episode=6) for _ in range(3)]
    rb = fill_rows(kind, streams, max_length=16, seed=1)
    model = Model(streams, 16)
    starts = model.starts(3, padded=True)
    out, ids, probs = draw(rb, mode, 400, NStepReturns(n=3, gamma=GAMMA))
    assert isinstance(out, Transition) and ids.shape == (400,)
    np.testing.assert_allclose(probs, 1 / len(starts), rtol=1e-6)
    assert set(ids.tolist()) <= starts, "a window past the write head of an unfinished episode was drawn"
    ended_inside = 0
    for i, gid in enumerate(ids.tolist()):
        want = model.n_step(gid, 3, GAMMA)
        ended_inside += want["m"] < 3
        np.testing.assert_array_equal(out.observation[i], [gid, 0])
        np.testing.assert_array_equal(out.next_observation[i], [want["last"], 1])
        assert out.action[i] == gid % 7
        np.testing.assert_allclose(out.reward[i], want["reward"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out.discount[i], want["discount"], rtol=1e-6, atol=1e-7)
        assert (out.terminated[i], out.truncated[i]) == (want["terminated"], want["truncated"])
    assert ended_inside > 20, "the streams should end many episodes inside windows"


@pytest.mark.parametrize("mode", quick(["eager", "function"], "function"))
@pytest.mark.parametrize("kind", sorted(FRAMES))
def test_n_step_over_frames_equals_a_direct_computation(kind, mode):
    rng = np.random.default_rng(9)
    streams = [make_stream(rng, s, 40) for s in range(2)]
    spec = frame_data_spec(FRAME)
    if kind == "tf":
        rb = TFFrameReplayBuffer(spec, 2, 15, history_len=3, seed=2)
    else:
        rb = PyFrameReplayBuffer(spec, batch_size=2, max_length=15, history_len=3, seed=2)
    for i in range(40):
        rb.add_batch(row(streams, i))
    ref = Reference(streams, 15, 3)
    model = Model(streams, 15, frames=ref)
    starts = model.starts(3, padded=True)
    out, ids, probs = draw(rb, mode, 300, NStepReturns(n=3, gamma=GAMMA))
    np.testing.assert_allclose(probs, 1 / len(starts), rtol=1e-6)
    assert set(ids.tolist()) <= starts
    for i, gid in enumerate(ids.tolist()):
        m = model.real_steps(gid % 2, gid // 2, 3)
        steps = [ref.transitions[gid + 2 * k] for k in range(m)]
        np.testing.assert_array_equal(out["observation"][i], steps[0]["observation"])
        np.testing.assert_array_equal(out["next_observation"][i], steps[-1]["next_observation"])
        want = sum(GAMMA**k * float(step["reward"]) for k, step in enumerate(steps))
        np.testing.assert_allclose(out["reward"][i], want, rtol=1e-5, atol=1e-6)
        not_terminated = np.prod([1.0 - step["terminated"] for step in steps])
        np.testing.assert_allclose(out["discount"][i], GAMMA**m * not_terminated, rtol=1e-6)
        assert out["terminated"][i] == steps[-1]["terminated"] and out["action"][i] == steps[0]["action"]


def test_the_twins_agree_on_every_window():
    rng = np.random.default_rng(11)
    streams = [episode_stream(rng, 35, max_episode=5) for _ in range(2)]
    by_twin = {}
    for kind in ROWS:
        rb = fill_rows(kind, streams, max_length=12, seed=3)
        out, ids, probs = draw(rb, "eager", 600, NStepReturns(n=4, gamma=0.5))
        by_twin[kind] = ({gid: tf.nest.map_structure(lambda x, i=i: x[i], out) for i, gid in enumerate(ids)}, probs[0])
    (tf_out, tf_prob), (py_out, py_prob) = by_twin["tf"], by_twin["py"]
    assert tf_prob == pytest.approx(py_prob, rel=1e-6)
    assert set(tf_out) == set(py_out), "each twin should reach every start in 600 draws"
    for gid in tf_out:
        for a, b in zip(tf.nest.flatten(tf_out[gid]), tf.nest.flatten(py_out[gid])):
            np.testing.assert_allclose(a, b, rtol=1e-6)


@dataclasses.dataclass(frozen=True)
class Ends(Transform):
    """Windows of 3 with some fields at their first or last real step: declared (`steps`, read there by the
    buffer) or picked here from the whole window."""

    picks: tuple  # (field, "first" or "last") pairs
    declared: bool
    num_steps = 3
    padded = True

    def steps(self, item_spec):
        return dict(self.picks) if self.declared else {}

    def output_spec(self, item_spec):
        return item_spec

    def __call__(self, items, mask, ops):
        if self.declared:
            return items, mask
        numpy = isinstance(mask, np.ndarray)  # the NumPy twins pass arrays, the TF twins tensors
        count = mask.sum(1) if numpy else tf.reduce_sum(tf.cast(mask, tf.int64), 1)
        last = lambda x: x[np.arange(len(x)), count - 1] if numpy else tf.gather(x, count - 1, batch_dims=1)  # noqa: E731
        picked = {f: (lambda x: x[:, 0]) if step == "first" else last for f, step in self.picks}
        fields = dict(items) if isinstance(items, dict) else items._asdict()
        out = {f: tf.nest.map_structure(picked[f], x) if f in picked else x for f, x in fields.items()}
        return (out if isinstance(items, dict) else type(items)(**out)), mask


ENDS = {
    "rows": (("observation", "first"), ("action", "first"), ("next_observation", "last"), ("truncated", "last")),
    "frames": (("observation", "first"), ("action", "first"), ("next_observation", "last"), ("terminated", "last")),
}


@pytest.mark.parametrize(
    "kind", quick(["tf-rows", "py-rows", "tf-frames", "py-frames"], "tf-rows", "py-rows", "py-frames")
)
def test_fields_read_at_one_step_equal_those_picked_from_the_whole_window(kind):
    # Random wrapped episodes ending terminated or truncated (rows), or at resets (frames): the buffer reads
    # declared fields at the first or last real step only (rows: at those rows; frames: picked after the read).
    rng = np.random.default_rng(4)
    seed = int(rng.integers(2**31))
    picks = ENDS[kind.split("-")[1]]
    outs = []
    for declared in (True, False):
        rb, _ = filled(kind, np.random.default_rng(seed), 3, ROWS, FRAMES)
        outs.append(draw(rb, "eager", 300, Ends(picks, declared)))
    (fast, fast_mask), fast_ids, _ = outs[0]
    (slow, slow_mask), slow_ids, _ = outs[1]
    np.testing.assert_array_equal(fast_ids, slow_ids)  # the same draws
    np.testing.assert_array_equal(fast_mask, slow_mask)
    assert 0 < fast_mask.sum(1).min() < 3, "some windows should end early"
    for a, b in zip(tf.nest.flatten(fast), tf.nest.flatten(slow)):
        np.testing.assert_array_equal(a, b)  # shapes too: a declared field comes without its time axis


# --- sequences ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", quick(MODES, "eager", "dataset"))
@pytest.mark.parametrize("pad", [False, True], ids=["strict", "padded"])
@pytest.mark.parametrize("kind", sorted(ROWS))
def test_sequences_follow_episodes_with_mask_and_zero_padding(kind, pad, mode):
    rng = np.random.default_rng(4)
    streams = [episode_stream(rng, 60, max_episode=9) for _ in range(3)]
    rb = fill_rows(kind, streams, max_length=25, seed=6)
    model = Model(streams, 25)
    transform = Sequences(length=3, burn_in=2, pad=pad)
    starts = model.starts(5, padded=pad)
    window, ids, probs = draw(rb, mode, 200, transform)
    assert isinstance(window, Window) and window.mask.shape == (200, 5) and window.mask.dtype == bool
    np.testing.assert_allclose(probs, 1 / len(starts), rtol=1e-6)
    assert set(ids.tolist()) <= starts
    gid = window.items.observation[..., 0].astype(np.int64)
    for i, first in enumerate(ids.tolist()):
        m = model.real_steps(first % 3, first // 3, 5)
        np.testing.assert_array_equal(window.mask[i], np.arange(5) < m)
        np.testing.assert_array_equal(gid[i, :m], first + 3 * np.arange(m))  # one segment, consecutive
        for leaf in tf.nest.flatten(window.items):
            assert not leaf[i, m:].any(), "padding must be zeros"
    if pad:
        assert (~window.mask).any(), "some padded sequences should end early"
    else:
        assert window.mask.all()


@pytest.mark.parametrize("kind", sorted(ROWS))
def test_a_stored_recurrent_state_is_read_like_any_field(kind):
    spec = {"state": tf.TensorSpec([2, 3], tf.float32), "step_type": tf.TensorSpec([], tf.int32)}
    rb = ROWS[kind](spec, batch_size=2, max_length=10, seed=0)
    for t in range(14):
        state = np.full([2, 2, 3], t, np.float32) + np.arange(2, dtype=np.float32)[:, None, None] / 10
        rb.add_batch({"state": state, "step_type": np.full([2], 0 if t % 6 == 0 else 1, np.int32)})
    window, info = rb.get_next(sample_batch_size=30, transform=Sequences(length=2, burn_in=1))
    state = np.asarray(window.items["state"])
    assert state.shape == (30, 3, 2, 3)
    first = np.asarray(info.ids)
    t, segment = first // 2, first % 2
    np.testing.assert_allclose(state[:, :, 0, 0], t[:, None] + np.arange(3) + segment[:, None] / 10, rtol=1e-6)
    assert ((t % 6) <= 3).all(), "a strict sequence of 3 never crosses an episode start"


@pytest.mark.parametrize("kind", sorted(ROWS))
def test_a_new_transform_per_call_is_not_kept_alive(kind):
    # A loop that builds its transform in every call must not make the buffer hold every one of them.
    rb = fill_rows(kind, [episode_stream(np.random.default_rng(s), 40, 9) for s in range(2)], max_length=16)
    first = NStepReturns(n=3, gamma=0.9)
    rb.get_next(sample_batch_size=4, transform=first)
    kept = weakref.ref(first)
    del first
    for _ in range(200):
        rb.get_next(sample_batch_size=4, transform=NStepReturns(n=3, gamma=0.9))
    gc.collect()
    assert kept() is None


def filled(kind: str, rng, seed: int, rows: dict, frames: dict, **kwargs):
    """`(buffer, model)`: 30 steps of two random streams written into a ring of 14 rows (history 2 for frames)."""
    twin, storage = kind.split("-")
    if storage == "rows":
        streams = [episode_stream(rng, 30, max_episode=5) for _ in range(2)]
        return fill_rows(twin, streams, 14, seed, rows, **kwargs), Model(streams, 14)
    streams = [make_stream(rng, s, 30) for s in range(2)]
    rb = frames[twin](frame_data_spec(FRAME), batch_size=2, max_length=14, history_len=2, seed=seed, **kwargs)
    for i in range(30):
        rb.add_batch(row(streams, i))
    return rb, Model(streams, 14, frames=Reference(streams, 14, 2))


@pytest.mark.parametrize(
    "kind", quick(["tf-rows", "py-rows", "tf-frames", "py-frames"], "tf-rows", "py-rows", "py-frames")
)
def test_padded_window_starts_are_uniform(kind):
    # Each start's count is binomial: for any seed the chi-square p-value is below 1e-6 with probability 1e-6;
    # a fixed one keeps the run reproducible.
    rng = np.random.default_rng(2024)
    seed = int(rng.integers(2**31))
    rb, model = filled(kind, rng, seed, ROWS, FRAMES)
    starts = sorted(model.starts(4, padded=True))
    assert len(starts) >= 5
    ids = np.concatenate([draw(rb, "eager", 2000, Sequences(4, pad=True))[1] for _ in range(5)])
    counts = np.array([np.sum(ids == s) for s in starts])
    assert counts.sum() == len(ids), "a start outside the drawable set was drawn"
    assert stats.chisquare(counts).pvalue > 1e-6, seed


@pytest.mark.parametrize("kind", sorted(FRAMES))
@pytest.mark.parametrize("n", quick([80, 150], 80))
def test_long_strict_windows_are_counted_exactly(kind, n):
    # Windows longer than the old 63 bins were counted by a scan; they now come from the bins.
    rng = np.random.default_rng(n)
    streams = [make_stream(rng, s, 700, max_episode=260) for s in range(2)]
    spec = frame_data_spec(FRAME)
    cls = FRAMES[kind]
    rb = (
        cls(spec, 2, 300, history_len=2, seed=1)
        if kind == "tf"
        else cls(spec, batch_size=2, max_length=300, history_len=2, seed=1)
    )
    for i in range(700):
        rb.add_batch(row(streams, i))
    starts = Reference(streams, 300, 2).valid(n)
    assert len(starts) > 10
    window, ids, probs = draw(rb, "eager", 16, Sequences(n))
    np.testing.assert_allclose(probs, 1 / len(starts), rtol=1e-6)
    assert set(ids.tolist()) <= starts


def test_sequence_priorities_mix_max_and_mean_over_valid_steps():
    td = np.array([[1.0, -3.0, 100.0], [-2.0, 2.0, 0.0]])
    mask = np.array([[True, True, False], [True, True, True]])
    want = np.array([0.9 * 3 + 0.1 * 2, 0.9 * 2 + 0.1 * 4 / 3])
    np.testing.assert_allclose(sequence_priorities(td, mask), want)
    np.testing.assert_allclose(sequence_priorities(tf.constant(td), tf.constant(mask)).numpy(), want)
    np.testing.assert_allclose(sequence_priorities(td, mask, eta=0.0), [2.0, 4 / 3])


def test_sequence_priorities_go_to_a_prioritized_buffer_by_first_item():
    spec = {"x": tf.TensorSpec([], tf.float32)}  # no episode fields: a segment is one endless episode
    rb = PyPrioritizedReplayBuffer(spec, batch_size=1, max_length=20, alpha=1.0, seed=0)
    for t in range(20):
        rb.add_batch({"x": np.array([t], np.float32)})
    window, info = rb.get_next(sample_batch_size=4, transform=Sequences(5))
    np.testing.assert_array_equal(np.asarray(window.items["x"])[:, 0], np.asarray(info.ids))
    assert (np.asarray(info.ids) <= 15).all()
    priorities = np.zeros(20)
    priorities[3] = 1.0
    rb.update_priorities(np.arange(20), priorities)
    window, info = rb.get_next(sample_batch_size=8, transform=Sequences(5))
    np.testing.assert_array_equal(np.asarray(info.ids), 3)
    np.testing.assert_array_equal(np.asarray(window.items["x"])[0], [3, 4, 5, 6, 7])


# --- arguments and errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: NStepReturns(n=0, gamma=0.9), ValueError, r"NStepReturns: n \(0\) must be a positive integer"),
        (lambda: NStepReturns(n=2.0, gamma=0.9), ValueError, r"NStepReturns: n \(2.0\) must be a positive integer"),
        (lambda: NStepReturns(n=3, gamma=1.5), ValueError, r"NStepReturns: gamma \(1.5\) must be a number in \[0, 1\]"),
        (lambda: NStepReturns(n=3, gamma=0.9, reward=1), TypeError, r"reward \(1\) must be a field name"),
        (lambda: Sequences(length=0), ValueError, r"Sequences: length \(0\) must be a positive integer"),
        (lambda: Sequences(4, burn_in=-1), ValueError, r"Sequences: burn_in \(-1\) must be an integer >= 0"),
        (lambda: Sequences(4, pad="yes"), TypeError, r"Sequences: pad \('yes'\) must be a bool"),
        (
            lambda: sequence_priorities(np.ones([2, 3]), np.ones([2, 3], bool), eta=2),
            ValueError,
            r"sequence_priorities: eta \(2\) must be a number in \[0, 1\]",
        ),
        (
            lambda: sequence_priorities(np.ones([2, 3]), np.ones([3], bool)),
            ValueError,
            r"td_errors \(shape \(2, 3\)\) and mask \(shape \(3,\)\) must both be \[batch, time\]",
        ),
    ],
)
def test_bad_transform_arguments_raise(make, error, match):
    with pytest.raises(error, match=match):
        make()


BAD_CALLS = [
    (lambda rb: rb.get_next(4, transform="n-step"), TypeError, r"get_next: transform \('n-step'\) must be a tfreplay"),
    (
        lambda rb: rb.get_next(4, num_steps=3, transform=Sequences(3)),
        ValueError,
        r"get_next: num_steps \(3\) must be None with a transform",
    ),
    (
        lambda rb: rb.get_next(4, transform=Sequences(20)),
        ValueError,
        r"get_next: the window of Sequences\(length=20.*\(20 items\) must be at most 12 items",
    ),
    (
        lambda rb: rb.get_next(4, transform=Sequences(2), time_stacked=False),
        ValueError,
        r"get_next: time_stacked \(False\) must be True with a transform",
    ),
    (
        lambda rb: rb.as_dataset(4, transform=Sequences(2), single_deterministic_pass=True),
        ValueError,
        r"as_dataset: transform must be None with single_deterministic_pass",
    ),
    (
        lambda rb: rb.get_next(4, transform=NStepReturns(2, 0.9, reward="prize")),
        ValueError,
        r"NStepReturns: the sampled item \(\[.*\]\) must have a 'prize' field",
    ),
    (
        lambda rb: rb.get_next(4, transform=NStepReturns(2, 0.9, reward="step_type")),
        TypeError,
        r"NStepReturns: field 'step_type' .* must be a floating-point tf.TensorSpec",
    ),
    (
        lambda rb: rb.get_next(4, transform=Ends((("prize", "first"), ("reward", "middle")), True)),
        ValueError,
        r"Ends.steps: \{'prize': 'first', 'reward': 'middle'\} must map fields of the sampled item \(\[.*\]\) "
        "to 'first' or 'last'",
    ),
]


# Every refusal on the NumPy twin; on the TF twin (a trace per buffer, seconds each) one of the request's checks and
# one of a transform's against the spec: the checks are the same code for both.
BAD_CALL_CASES = [(*case, "py") for case in BAD_CALLS] + [
    pytest.param(*BAD_CALLS[i], "tf", marks=pytest.mark.slow) for i in (0, 5)
]


@pytest.mark.parametrize("call, error, match, kind", BAD_CALL_CASES)
def test_bad_calls_raise_and_change_nothing(call, error, match, kind):
    rng = np.random.default_rng(1)
    streams = [episode_stream(rng, 20, max_episode=5) for _ in range(2)]
    rb, twin = (fill_rows(kind, streams, max_length=12, seed=8) for _ in range(2))
    with pytest.raises(error, match=match):
        call(rb)
    assert int(rb.num_frames()) == int(twin.num_frames())
    a, b = (np.asarray(x.get_next(6, transform=Sequences(2))[1].ids) for x in (rb, twin))
    np.testing.assert_array_equal(a, b)  # the random source did not move


@pytest.mark.parametrize("kind", sorted(ROWS))
def test_nothing_to_draw_is_a_clear_error(kind):
    rb = ROWS[kind](SPEC, batch_size=2, max_length=8, seed=0)
    running = {
        "episode": np.zeros(2, int),
        "first": np.array([True, False]),
        "terminated": np.zeros(2, bool),
        "truncated": np.zeros(2, bool),
        "reward": np.ones(2, np.float32),
    }
    streams = [running, running]
    for t in range(2):  # one unfinished episode of 2 steps per segment: no padded window of 3 yet
        rb.add_batch(transition_batch(streams, t))
    with pytest.raises(ValueError, match=r"get_next: the buffer holds no window NStepReturns\(n=3.* can read yet"):
        rb.get_next(2, transform=NStepReturns(3, 0.9))
    assert np.asarray(rb.get_next(2, transform=NStepReturns(2, 0.9))[0].reward).shape == (2,)


def test_prioritized_replay_refuses_strict_episode_windows():
    rb = PyPrioritizedReplayBuffer(SPEC, batch_size=1, max_length=8, seed=0)
    with pytest.raises(ValueError, match=r"needs episode-aware windows, which PrioritizedSampler does not draw"):
        rb.get_next(2, transform=Sequences(3))


@pytest.mark.parametrize("kind", ["tf-rows", "py-rows", "tf-frames", "py-frames"])
def test_prioritized_padded_windows_are_drawn_in_proportion_to_priority(kind):
    # Each start's count is binomial: for any seed the chi-square p-value is below 1e-6 with probability 1e-6;
    # a fixed one keeps the run reproducible.
    rng = np.random.default_rng(2025)
    seed = int(rng.integers(2**31))
    rb, model = filled(kind, rng, seed, PRIORITIZED, PRIORITIZED_FRAMES, alpha=1.0)
    transform = NStepReturns(3, GAMMA) if kind.endswith("rows") else Sequences(3, pad=True)
    live = np.array([t * 2 + s for s in range(2) for t in range(model.oldest, model.newest + 1)])
    priority = dict(zip(live.tolist(), rng.uniform(0.2, 2.0, size=len(live)) * (rng.random(len(live)) > 0.2)))
    rb.update_priorities(live, np.array([priority[i] for i in live.tolist()]))
    starts = sorted(i for i in model.starts(3, padded=True) if priority[i] > 0)
    assert len(starts) >= 5
    total = sum(priority[i] for i in starts)
    ids, probs = [], []
    for _ in range(5):
        _, drawn, p = draw(rb, "eager", 2000, transform)
        ids.append(drawn)
        probs.append(p)
    ids, probs = np.concatenate(ids), np.concatenate(probs)
    np.testing.assert_allclose(probs, [priority[i] / total for i in ids.tolist()], rtol=1e-5)
    counts = np.array([np.sum(ids == s) for s in starts])
    assert counts.sum() == len(ids), "a start outside the drawable set, or of priority 0, was drawn"
    expected = np.array([priority[i] / total for i in starts]) * len(ids)
    assert stats.chisquare(counts, expected).pvalue > 1e-6, seed


@pytest.mark.parametrize("kind", sorted(ROWS))
def test_padded_counts_follow_the_newest_items_through_wrap_clear_and_restore(kind, tmp_path):
    # The index keeps each segment's newest pos and end flag: after any writes, a clear, a refill and a restore
    # the padded window count (1 / probability) and the drawable starts must match the model of the streams.
    rng = np.random.default_rng(11)
    rb = fill_rows(kind, [episode_stream(rng, 9, max_episode=4) for _ in range(3)], 7, seed=1)

    def check(buffer, model: Model) -> None:
        for n in (2, 4):
            starts = set(model.starts(n, padded=True))
            if not starts:
                with pytest.raises(ValueError, match=r"get_next: the buffer holds no window Sequences"):
                    draw(buffer, "eager", 64, Sequences(n, pad=True))
                continue
            _, ids, probs = draw(buffer, "eager", 64, Sequences(n, pad=True))
            assert set(ids.tolist()) <= starts, "a start outside the drawable set was drawn"
            np.testing.assert_allclose(probs, 1 / len(starts), rtol=1e-6)

    for length in (3, 6, 11, 17, 20):  # within the ring, then wrapping it once and more
        rb.clear()
        streams = [episode_stream(rng, length, max_episode=4) for _ in range(3)]
        for t in range(length):
            rb.add_batch(transition_batch(streams, t))
        check(rb, Model(streams, 7))
    path = tf.train.Checkpoint(buffer=rb).write(str(tmp_path / "ckpt"))
    restored = ROWS[kind](SPEC, batch_size=3, max_length=7, seed=2)
    tf.train.Checkpoint(buffer=restored).read(path).assert_consumed()
    check(restored, Model(streams, 7))
