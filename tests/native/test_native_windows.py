"""The NumPy twin's compiled window plan and strict draw against its array-op path.

Two buffers of each kind are filled alike with the same seed, one planning
padded windows and drawing strict ones in compiled code
(`tfreplay.native.windows_library`), the other with that library
unavailable (array ops, as with `TFREPLAY_NATIVE=0`); every sample must be
the same, value for value, through wrap-around, episodes ending inside
windows, several segments, one ring, the write head inside windows, a
clear, samplers that draw their own starts, and (strict windows) episodes
too short for most windows, so that samples need several rounds of
candidates or the exact draw.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
from helpers import FRAME, make_stream, row

from tfreplay import (
    NStepReturns,
    PyFrameReplayBuffer,
    PyPrioritizedReplayBuffer,
    PyUniformReplayBuffer,
    Sequences,
    frame_data_spec,
    native,
)
from tfreplay._src.index.episodes import POS_BINS
from tfreplay.rl.drivers import Transition

needs_kernel = pytest.mark.skipif(native.windows_library() is None, reason="no compiled window plan here")

SPEC = Transition(
    observation=tf.TensorSpec([2], tf.float32),
    action=tf.TensorSpec([], tf.int32),
    reward=tf.TensorSpec([], tf.float32),
    discount=tf.TensorSpec([], tf.float32),
    next_observation=tf.TensorSpec([2], tf.float32),
    step_type=tf.TensorSpec([], tf.int32),
    terminated=tf.TensorSpec([], tf.bool),
    truncated=tf.TensorSpec([], tf.bool),
)
# No episode fields: a segment is one endless episode (padded windows are plain ring windows).
PLAIN_SPEC = {k: SPEC._asdict()[k] for k in ("observation", "reward", "discount", "next_observation")}
TRANSFORMS = [
    NStepReturns(n=3, gamma=0.9),
    NStepReturns(n=5, gamma=0.7),
    Sequences(4, burn_in=2, pad=True),
    Sequences(11, pad=True),  # as long as a segment: the write head is inside most windows
]


class Counting:
    """A library whose calls are counted, to show the compiled plan ran."""

    def __init__(self, library):
        self.library, self.calls = library, collections.Counter()

    def __getattr__(self, name):
        function = getattr(self.library, name)

        def call(*args, **kwargs):
            self.calls[name] += 1
            return function(*args, **kwargs)

        return call


def steps(rng, num: int, length: int, longest: int = 6, shortest: int = 1) -> list[Transition]:
    """`length` batches of `num` environments' steps: episodes of `shortest` to `longest` steps ending
    terminated or truncated (the last may run on); rewards and observations random."""
    left, batches = np.zeros(num, np.int64), []
    for _ in range(length):
        first = left == 0
        left = np.where(first, rng.integers(shortest, longest + 1, num), left) - 1
        end = left == 0
        kind = rng.random(num) < 0.5
        terminated, truncated = end & kind, end & ~kind
        batches.append(
            Transition(
                observation=rng.normal(size=[num, 2]).astype(np.float32),
                action=rng.integers(0, 7, num).astype(np.int32),
                reward=rng.normal(size=num).astype(np.float32),
                discount=(~terminated).astype(np.float32),
                next_observation=rng.normal(size=[num, 2]).astype(np.float32),
                step_type=np.where(first, 0, np.where(end, 2, 1)).astype(np.int32),
                terminated=terminated,
                truncated=truncated,
            )
        )
    return batches


def on_both(pair, monkeypatch, fn) -> list:
    """`fn(buffer)` on both buffers of `pair` (compiled, array ops), or the `ValueError` it raised."""
    got = []
    for rb, compiled in zip(pair, (True, False)):
        with monkeypatch.context() as patch:
            if not compiled:  # the array-op buffer looks the library up on its first sample and keeps None
                patch.setattr(native, "windows_library", lambda: None)
            try:
                got.append(fn(rb))
            except ValueError as err:
                got.append(err)
    return got


def same_sample(pair, monkeypatch, size: int, transform) -> tuple | None:
    """Samples both buffers of `pair` and checks every output, id and probability (or that both refuse)."""
    return same_draw(pair, monkeypatch, "holds no window", sample_batch_size=size, transform=transform)


def same_draw(pair, monkeypatch, refusal: str, **get_next) -> tuple | None:
    """`get_next(**get_next)` of both buffers of `pair`: the same outputs, ids and probabilities, or the same
    refusal (a message containing `refusal`; then None)."""
    got = on_both(pair, monkeypatch, lambda rb: rb.get_next(**get_next))
    if any(isinstance(x, ValueError) for x in got):
        assert [str(x) for x in got] == [str(got[0])] * 2 and refusal in str(got[0])
        return None
    (out, info), (want, want_info) = got
    assert tf.nest.map_structure(lambda x: x.dtype, out) == tf.nest.map_structure(lambda x: x.dtype, want)
    for a, b in zip(tf.nest.flatten(out), tf.nest.flatten(want)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(tf.nest.flatten(info), tf.nest.flatten(want_info)):  # ids per step without time_stacked
        np.testing.assert_array_equal(a, b)
    return out, info


@pytest.fixture
def counting(monkeypatch):
    library = Counting(native.windows_library())
    monkeypatch.setattr(native, "windows_library", lambda: library)
    return library


def sample_all(pair, monkeypatch, rng, size: int = 32) -> list:
    """A sample of each transform (in a random order) from both buffers: `(transform, (out, info) or None)`."""
    order = [TRANSFORMS[i] for i in rng.permutation(len(TRANSFORMS))]
    return [(t, same_sample(pair, monkeypatch, size, t)) for t in order]


@needs_kernel
@pytest.mark.parametrize("batch_size", [1, 3])
def test_segments_wrap_around_and_a_clear(batch_size, monkeypatch, counting):
    rng = np.random.default_rng(batch_size)
    pair = [PyUniformReplayBuffer(SPEC, batch_size=batch_size, max_length=11, seed=4) for _ in range(2)]
    ended_inside = 0
    for step, batch in enumerate(steps(rng, batch_size, 60)):
        for rb in pair:
            rb.add_batch(batch)
        if step == 35:
            for rb in pair:
                rb.clear()
            continue
        for transform, got in sample_all(pair, monkeypatch, np.random.default_rng(step)):
            if isinstance(transform, Sequences) and got is not None:
                ended_inside += int(np.sum(~got[0].mask[:, -1]))
    assert counting.calls["tfreplay_window_plan"] == 4 * 59, "each sample's plan should be one call"
    assert ended_inside > 200, "windows should often run past their episode's end or the write head"


@needs_kernel
def test_one_ring_of_appended_items(monkeypatch, counting):
    rng = np.random.default_rng(2)
    pair = [PyUniformReplayBuffer(SPEC, capacity=13, seed=8) for _ in range(2)]
    for step, size in enumerate(rng.integers(1, 6, 25)):
        items = tf.nest.map_structure(lambda *x: np.stack(x), *[b for b in steps(rng, 1, int(size))])
        items = tf.nest.map_structure(lambda x: x[:, 0], items)
        for rb in pair:
            rb.add_batch(items)
        sample_all(pair, monkeypatch, np.random.default_rng(step), size=17)
    assert counting.calls["tfreplay_padded_counts"] == 4 * 25


@needs_kernel
def test_items_without_episode_fields_are_ring_windows(monkeypatch, counting):
    rng = np.random.default_rng(3)
    pair = [PyUniformReplayBuffer(PLAIN_SPEC, batch_size=2, max_length=12, seed=1) for _ in range(2)]
    for step, batch in enumerate(steps(rng, 2, 30)):
        plain = {k: getattr(batch, k) for k in PLAIN_SPEC}
        for rb in pair:
            rb.add_batch(plain)
        if step >= 10:  # every segment holds a whole window of 11
            sample_all(pair, monkeypatch, np.random.default_rng(step))
    assert counting.calls["tfreplay_window_plan"] == 4 * 20


@needs_kernel
def test_prioritized_draws_then_the_compiled_plan(monkeypatch, counting):
    rng = np.random.default_rng(4)
    pair = [PyPrioritizedReplayBuffer(SPEC, batch_size=3, max_length=11, seed=6) for _ in range(2)]
    for step, batch in enumerate(steps(rng, 3, 40)):
        for rb in pair:
            rb.add_batch(batch)
        for _, got in sample_all(pair, monkeypatch, np.random.default_rng(step)):
            if got is not None:
                ids, new = got[1].ids, rng.uniform(0, 3, got[1].ids.shape)
                assert [int(rb.update_priorities(ids, new)) for rb in pair] == [0, 0]
    assert counting.calls["tfreplay_window_plan"] == 4 * 40
    assert counting.calls["tfreplay_padded_counts"] == 0  # the sum tree draws the starts


@needs_kernel
def test_frames(monkeypatch, counting):
    rng = np.random.default_rng(5)
    streams = [make_stream(rng, s, 50) for s in range(2)]
    pair = [
        PyFrameReplayBuffer(frame_data_spec(FRAME), batch_size=2, max_length=12, history_len=3, seed=2)
        for _ in range(2)
    ]
    transforms = [NStepReturns(n=3, gamma=0.9), Sequences(5, pad=True)]
    drawn = 0
    for i in range(50):
        for rb in pair:
            rb.add_batch(row(streams, i))
        drawn += sum(same_sample(pair, monkeypatch, 16, transform) is not None for transform in transforms)
    assert drawn > 80 and counting.calls["tfreplay_window_plan"] == 2 * 50


@needs_kernel
def test_datasets_draw_the_same_elements(monkeypatch):
    rng = np.random.default_rng(6)
    pair = [PyUniformReplayBuffer(SPEC, batch_size=2, max_length=16, seed=3) for _ in range(2)]
    for batch in steps(rng, 2, 30):
        for rb in pair:
            rb.add_batch(batch)
    transform = NStepReturns(n=4, gamma=0.8)
    got = []
    for rb, compiled in zip(pair, (True, False)):
        with monkeypatch.context() as patch:
            if not compiled:
                patch.setattr(native, "windows_library", lambda: None)
            got.append([tf.nest.map_structure(np.asarray, x) for x in rb.as_dataset(8, transform=transform).take(20)])
    for a, b in zip(tf.nest.flatten(got[0]), tf.nest.flatten(got[1])):
        np.testing.assert_array_equal(a, b)


@needs_kernel
def test_an_empty_buffer_is_refused_on_both_paths(monkeypatch, counting):
    pair = [PyUniformReplayBuffer(SPEC, batch_size=2, max_length=8, seed=0) for _ in range(2)]
    for rb, compiled in zip(pair, (True, False)):
        with monkeypatch.context() as patch:
            if not compiled:
                patch.setattr(native, "windows_library", lambda: None)
            with pytest.raises(ValueError, match=r"get_next: the buffer holds no window .* can read yet"):
                rb.get_next(sample_batch_size=4, transform=NStepReturns(n=3, gamma=0.9))
    assert counting.calls["tfreplay_window_plan"] == 1


# Strict windows (inside one episode) through the index. Episodes of 1 to 6 steps: a window of 6 fits few
# of them, so its samples often need more rounds of candidates or the exact draw, or find no window at all.
STRICT = [Sequences(3), Sequences(4, burn_in=1), Sequences(6)]
NO_WINDOW = {  # the refusal of each kind of call with nothing to draw
    "transform": "holds no window",
    "rows": "consecutive items yet",
    "frames": "holds no valid",
}


def strict_all(pair, monkeypatch, rng, kind: str = "rows", size: int = 32) -> list:
    """Strict samples from both buffers, in a random order: each transform of `STRICT`, then windows of
    `num_steps` items (and single items) through the index: `(what, (out, info) or None)`."""
    calls = [{"transform": t} for t in STRICT] + [{"num_steps": k} for k in (2, 5)] + [{}]
    got = []
    for i in rng.permutation(len(calls)):
        refusal = NO_WINDOW["transform" if "transform" in calls[i] else kind]
        got.append((calls[i], same_draw(pair, monkeypatch, refusal, sample_batch_size=size, **calls[i])))
    return got


def check_strict_calls(counting, samples: int) -> None:
    """Each strict sample counted once; some needed more rounds, and some the exact draw."""
    calls = counting.calls
    assert calls["tfreplay_strict_counts"] == samples
    assert calls["tfreplay_strict_keep"] > samples, "some samples should need more than one round"
    assert calls["tfreplay_strict_exact"] > 0, "some samples should need the exact draw"


@needs_kernel
@pytest.mark.parametrize("batch_size", [1, 3])
def test_strict_windows_through_segments_wrap_around_and_a_clear(batch_size, monkeypatch, counting):
    rng = np.random.default_rng(10 + batch_size)
    pair = [
        PyUniformReplayBuffer(SPEC, batch_size=batch_size, max_length=23, seed=5, within_episodes=True)
        for _ in range(2)
    ]
    drawn = refused = 0
    for step, batch in enumerate(steps(rng, batch_size, 80)):
        for rb in pair:
            rb.add_batch(batch)
        if step == 50:
            for rb in pair:
                rb.clear()
            continue
        for _, got in strict_all(pair, monkeypatch, np.random.default_rng(step)):
            drawn, refused = drawn + (got is not None), refused + (got is None)
    assert drawn > 300 and refused > 10
    check_strict_calls(counting, 6 * 79)


@needs_kernel
def test_strict_windows_of_one_ring(monkeypatch, counting):
    rng = np.random.default_rng(12)
    pair = [PyUniformReplayBuffer(SPEC, capacity=29, seed=9, within_episodes=True) for _ in range(2)]
    for step, size in enumerate(rng.integers(1, 6, 40)):
        items = tf.nest.map_structure(lambda *x: np.stack(x), *[b for b in steps(rng, 1, int(size))])
        items = tf.nest.map_structure(lambda x: x[:, 0], items)
        for rb in pair:
            rb.add_batch(items)
        strict_all(pair, monkeypatch, np.random.default_rng(step), size=17)
    check_strict_calls(counting, 6 * 40)


@needs_kernel
def test_strict_windows_too_long_for_the_index_counts_are_scanned(monkeypatch, counting):
    # A window of more than POS_BINS items is counted by a scan of every start, not from `pos_counts`.
    length = POS_BINS + 40
    rng = np.random.default_rng(13)
    pair = [PyUniformReplayBuffer(SPEC, batch_size=2, max_length=length, seed=2) for _ in range(2)]
    transform, drawn = Sequences(POS_BINS + 4), 0
    for step, batch in enumerate(steps(rng, 2, 2 * length, longest=POS_BINS + 30, shortest=POS_BINS - 20)):
        for rb in pair:
            rb.add_batch(batch)
        if step % 20 == 19:
            drawn += same_sample(pair, monkeypatch, 8, transform) is not None
    assert drawn > 5 and counting.calls["tfreplay_strict_counts"] == 2 * length // 20


@needs_kernel
def test_strict_windows_of_frames(monkeypatch, counting):
    rng = np.random.default_rng(14)
    streams = [make_stream(rng, s, 50) for s in range(2)]
    pair = [
        PyFrameReplayBuffer(frame_data_spec(FRAME), batch_size=2, max_length=12, history_len=3, seed=3)
        for _ in range(2)
    ]
    drawn = 0
    for i in range(50):
        for rb in pair:
            rb.add_batch(row(streams, i))
        drawn += sum(got is not None for _, got in strict_all(pair, monkeypatch, np.random.default_rng(i), "frames"))
    assert drawn > 150
    check_strict_calls(counting, 6 * 50)


@needs_kernel
def test_strict_datasets_draw_the_same_elements(monkeypatch, counting):
    rng = np.random.default_rng(15)
    pair = [PyUniformReplayBuffer(SPEC, batch_size=2, max_length=16, seed=7, within_episodes=True) for _ in range(2)]
    for batch in steps(rng, 2, 30):
        for rb in pair:
            rb.add_batch(batch)
    got = []
    for rb, compiled in zip(pair, (True, False)):
        with monkeypatch.context() as patch:
            if not compiled:
                patch.setattr(native, "windows_library", lambda: None)
            sequences = rb.as_dataset(8, transform=Sequences(5)).take(10)
            windows = rb.as_dataset(4, num_steps=3).take(10)
            got.append([tf.nest.map_structure(np.asarray, x) for x in [*sequences, *windows]])
    for a, b in zip(tf.nest.flatten(got[0]), tf.nest.flatten(got[1])):
        np.testing.assert_array_equal(a, b)
    assert counting.calls["tfreplay_strict_counts"] > 0


@needs_kernel
def test_no_strict_window_is_refused_alike_and_draws_alike_after(monkeypatch, counting):
    pair = [PyUniformReplayBuffer(SPEC, batch_size=2, max_length=8, seed=1, within_episodes=True) for _ in range(2)]
    for rb, compiled in zip(pair, (True, False)):  # empty
        with monkeypatch.context() as patch:
            if not compiled:
                patch.setattr(native, "windows_library", lambda: None)
            with pytest.raises(ValueError, match=r"get_next: the buffer holds no window Sequences.* can read yet"):
                rb.get_next(sample_batch_size=4, transform=Sequences(3))
            with pytest.raises(ValueError, match=r"get_next: no episode holds 3 consecutive items yet"):
                rb.get_next(sample_batch_size=4, num_steps=3)
    # Episodes of one or two steps: items, but no window of 3; both refuse after drawing the same numbers.
    rng = np.random.default_rng(16)
    for batch in steps(rng, 2, 10, longest=2):
        for rb in pair:
            rb.add_batch(batch)
        assert same_sample(pair, monkeypatch, 4, Sequences(3)) is None
        assert same_draw(pair, monkeypatch, NO_WINDOW["rows"], sample_batch_size=4, num_steps=3) is None
    for batch in steps(rng, 2, 10, longest=5, shortest=4):
        for rb in pair:
            rb.add_batch(batch)
    assert same_sample(pair, monkeypatch, 16, Sequences(3)) is not None
    assert same_draw(pair, monkeypatch, NO_WINDOW["rows"], sample_batch_size=16, num_steps=3) is not None
    assert counting.calls["tfreplay_strict_exact"] == 0  # nothing to count: no exact draw
