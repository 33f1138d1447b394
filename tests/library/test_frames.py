"""Frame replay against a naive reference that stores every full stack.

Each frame encodes its segment and local id, so a stack can be checked by
value. The reference stacks frames from the whole stream (not from a ring)
and decides which transitions may be drawn from the frames they show, not
from `pos`: the buffers must return exactly its stacks for the ids they draw.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from helpers import FRAME, Reference, XlaStacks, frame_of, make_stream, quick, row, run_threads

from tfreplay import PyFrameReplayBuffer, Sequences, TFFrameReplayBuffer, frame_data_spec, native

TWINS = ["tf", "tf-xla", "py"]  # tf: stacks from the native kernel; tf-xla: from XLA
# `make test` stacks under XLA in the tests that say so by name; the rest of the XLA cases run in `make test-slow`.
TWINS_QUICK = quick(TWINS, "tf", "py")
# Tests of what is drawn, counted or kept, not of the stacked frames, run on the two twins only: XLA changes the stacks.
BACKENDS = ["tf", "py"]
# Of those, the refusals, counts and kept state run on the NumPy twin in `make test` and on the TF twin in
# `make test-slow`: the contract suite already drives the TF frame buffers through each of them in every mode.
BACKENDS_QUICK = quick(BACKENDS, "py")


def make_buffer(twin: str, num_segments: int, max_length: int, history_len: int, seed: int = 0):
    spec = frame_data_spec(FRAME)
    if twin.startswith("tf"):
        rb = TFFrameReplayBuffer(spec, num_segments, max_length, history_len=history_len, seed=seed)
        return rb if twin == "tf" else XlaStacks(rb)
    return PyFrameReplayBuffer(spec, batch_size=num_segments, max_length=max_length, history_len=history_len, seed=seed)


def filled(twin: str, num_segments: int, max_length: int, history_len: int, num_rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    streams = [make_stream(rng, s, num_rows) for s in range(num_segments)]
    rb = make_buffer(twin, num_segments, max_length, history_len, seed)
    for i in range(num_rows):
        rb.add_batch(row(streams, i))
    return rb, Reference(streams, max_length, history_len)


# (segments, max_length, history_len, rows): no wrap, wrap, a ring barely longer than a stack.
SCENARIOS = [(1, 30, 2, 25), (3, 12, 4, 40), (2, 6, 4, 30)]


@pytest.mark.parametrize("twin", TWINS_QUICK)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=["no_wrap", "wrap", "short_ring"])
def test_samples_equal_the_reference_for_their_ids(twin, scenario):
    rb, ref = filled(twin, *scenario)
    seen = []
    for _ in range(15):
        items, info = rb.get_next(sample_batch_size=64)
        ids = np.asarray(info.ids)
        ref.check(items, ids)
        seen.extend(ids.tolist())
    valid = ref.valid()
    assert set(seen) == valid  # every valid transition drawn; nothing else
    np.testing.assert_allclose(np.asarray(info.probabilities), np.full(64, 1 / len(valid)), rtol=1e-6)
    assert int(rb.num_transitions()) == len(valid)
    assert int(rb.num_frames()) == scenario[0] * min(scenario[1], scenario[3])


@pytest.mark.parametrize("twin", TWINS_QUICK)
@pytest.mark.parametrize("num_steps", quick([2, 3], 3))
def test_windows_are_consecutive_steps_of_one_episode(twin, num_steps):
    rb, ref = filled(twin, 3, 12, 4, 40)
    items, info = rb.get_next(sample_batch_size=200, num_steps=num_steps)
    ids = np.asarray(info.ids)
    assert ids.shape == (200, num_steps)
    np.testing.assert_array_equal(np.diff(ids, axis=1), 3)  # one segment, consecutive
    ref.check(items, ids)
    assert set(ids[:, 0].tolist()) == ref.valid(num_steps)
    np.testing.assert_allclose(np.asarray(info.probabilities), 1 / len(ref.valid(num_steps)), rtol=1e-6)
    steps, step_info = rb.get_next(sample_batch_size=5, num_steps=num_steps, time_stacked=False)
    assert isinstance(steps, tuple) and len(steps) == num_steps
    for k, step in enumerate(steps):
        ref.check(step, np.asarray(step_info.ids[k]))


@pytest.mark.slow  # a window length is a compiled function each: six of them
@pytest.mark.parametrize("twin", BACKENDS)
def test_window_counts_match_the_reference_across_the_scan_threshold(twin):
    # Episodes up to 150 steps in a wrapped ring: windows shorter than
    # POS_BINS (64) are counted from the per-position row counts, longer
    # ones by the scan; both must give the reference's count.
    rng = np.random.default_rng(3)
    streams = [make_stream(rng, s, 500, max_episode=150) for s in range(2)]
    rb = make_buffer(twin, 2, 200, 4, seed=4)
    for i in range(500):
        rb.add_batch(row(streams, i))
    ref = Reference(streams, 200, 4)
    for n in (1, 2, 5, 63, 64, 70):
        valid = ref.valid(n)
        items, info = rb.get_next(sample_batch_size=8, num_steps=n)
        ids = np.asarray(info.ids).reshape(8, n)
        assert set(ids[:, 0].tolist()) <= valid, n
        np.testing.assert_allclose(np.asarray(info.probabilities), 1 / len(valid), rtol=1e-6, err_msg=str(n))
    assert int(rb.num_transitions()) == len(ref.valid())


def test_counts_follow_sequences_longer_than_the_ring():
    rng = np.random.default_rng(6)
    streams = [make_stream(rng, s, 300, max_episode=90) for s in range(2)]
    rb = PyFrameReplayBuffer(frame_data_spec(FRAME), batch_size=2, max_length=70, history_len=3, seed=1)
    for lo, hi in [(0, 20), (20, 110), (110, 111), (111, 300)]:
        for s in range(2):
            rb.add_sequence({k: v[lo:hi] for k, v in streams[s].items()}, segment=s)
    ref = Reference(streams, 70, 3)
    for n in (1, 3, 30):
        _, info = rb.get_next(sample_batch_size=4, num_steps=n)
        np.testing.assert_allclose(info.probabilities, 1 / len(ref.valid(n)), rtol=1e-6, err_msg=str(n))


@pytest.mark.parametrize("twin", BACKENDS_QUICK)
def test_gather_all_and_single_pass_list_every_valid_transition_in_order(twin):
    rb, ref = filled(twin, 3, 12, 4, 40)
    order = sorted(ref.valid(), key=lambda gid: (gid % 3, gid // 3))  # segment by segment, oldest first
    everything = rb.gather_all()
    ref.check(everything, np.array(order))
    ids = [np.asarray(info.ids) for _, info in rb.as_dataset(sample_batch_size=7, single_deterministic_pass=True)]
    assert np.concatenate(ids).tolist() == order
    one = [int(info.ids) for _, info in rb.as_dataset(single_deterministic_pass=True)]
    assert one == order


@pytest.mark.parametrize("twin", TWINS_QUICK)
def test_dataset_samples_equal_the_reference(twin):
    rb, ref = filled(twin, 3, 12, 4, 40)
    for items, info in rb.as_dataset(sample_batch_size=16, num_steps=2).take(3):
        ref.check(items, info.ids.numpy())
    items, info = next(iter(rb.as_dataset()))
    ref.check(items, info.ids.numpy())


def test_get_next_inside_tf_function_matches_the_reference():
    rb, ref = filled("tf", 3, 12, 4, 40)
    items, info = tf.function(lambda: rb.get_next(sample_batch_size=64))()
    ref.check(items, info.ids.numpy())


@pytest.mark.slow  # a compile of each sample; `make test` compiles frame stacks in the fused loop's tests
def test_get_next_under_xla_matches_the_reference_and_an_empty_buffer_gives_zeros():
    rb, ref = filled("tf", 3, 12, 4, 40)
    for num_steps in (None, 2):
        items, info = tf.function(lambda n=num_steps: rb.get_next(16, num_steps=n), jit_compile=True)()
        ref.check(items, info.ids.numpy())
    empty = make_buffer("tf", 2, 8, 4)
    items, info = tf.function(lambda: empty.get_next(4), jit_compile=True)()  # XLA cannot raise
    assert not any(np.asarray(x).any() for x in tf.nest.flatten(items))
    np.testing.assert_array_equal(info.probabilities, 0)


@pytest.mark.slow  # the contract suite adds to the TF frame buffers inside tf.function in `make test`
def test_add_batch_inside_tf_function():
    rng = np.random.default_rng(3)
    streams = [make_stream(rng, s, 20) for s in range(2)]
    rb = make_buffer("tf", 2, 10, 3)
    add = tf.function(rb.add_batch)
    for i in range(20):
        add(tf.nest.map_structure(tf.constant, row(streams, i)))
    ref = Reference(streams, 10, 3)
    items, info = rb.get_next(sample_batch_size=100)
    ref.check(items, info.ids.numpy())


def test_truncated_episode_keeps_its_final_frame_and_the_next_episode_starts_with_zeros():
    spec = frame_data_spec(FRAME)
    rb = PyFrameReplayBuffer(spec, 20, history_len=4)
    first = np.array([True, False, False, True, False])
    truncated = np.array([False, False, True, False, False])
    rb.add_sequence(
        {
            "frame": frame_of(0, np.arange(5)),
            "first": first,
            "action": np.arange(5, dtype=np.int32),
            "reward": np.zeros(5, np.float32),
            "terminated": np.zeros(5, bool),
            "truncated": truncated,
        }
    )
    everything = rb.gather_all()  # transitions at rows 1, 2 and 4
    np.testing.assert_array_equal(everything["truncated"], [False, True, False])
    final = everything["next_observation"][1]  # the truncated step's next stack ends with its final frame
    np.testing.assert_array_equal(np.moveaxis(final, -1, 0), [np.zeros(FRAME), *frame_of(0, np.arange(3))])
    after = everything["observation"][2]  # the next episode's first stack: zeros, then its reset frame
    np.testing.assert_array_equal(np.moveaxis(after, -1, 0), [*np.zeros((3, *FRAME)), frame_of(0, 3)])


@pytest.mark.parametrize("twin", TWINS_QUICK)
def test_a_lone_valid_transition_among_first_frames_is_found(twin):
    # 60 first frames and one step: the four uniform candidates almost always
    # miss, so this exercises the exact fallback.
    first = np.ones(64, bool)
    first[40] = False
    stream = {
        "frame": frame_of(0, np.arange(64)),
        "first": first,
        "action": np.arange(64, dtype=np.int32),
        "reward": np.zeros(64, np.float32),
        "terminated": np.zeros(64, bool),
        "truncated": np.zeros(64, bool),
    }
    rb = make_buffer(twin, 1, 64, 4)
    for i in range(64):
        rb.add_batch({k: v[i : i + 1] for k, v in stream.items()})
    items, info = rb.get_next(sample_batch_size=50)
    np.testing.assert_array_equal(np.asarray(info.ids), 40)
    Reference([stream], 64, 4).check(items, np.asarray(info.ids))


@pytest.mark.parametrize("twin", BACKENDS_QUICK)
@pytest.mark.parametrize("num_steps", [None, 2])
def test_draws_are_uniform_over_valid_windows(twin, num_steps):
    # Short episodes (a third of the rows are first frames): the candidates
    # often all miss, so draws mix rejection and the exact fallback.
    rng = np.random.default_rng(5)
    streams = [make_stream(rng, s, 45, max_episode=3) for s in range(2)]
    rb = make_buffer(twin, 2, 40, 3, seed=11)
    for i in range(45):
        rb.add_batch(row(streams, i))
    valid = sorted(Reference(streams, 40, 3).valid(num_steps or 1))
    counts = dict.fromkeys(valid, 0)
    for _ in range(20):
        ids = np.asarray(rb.get_next(sample_batch_size=1000, num_steps=num_steps)[1].ids)
        for gid in ids.reshape(1000, -1)[:, 0].tolist():
            counts[gid] += 1  # a KeyError would be an invalid draw
    assert scipy.stats.chisquare(list(counts.values())).pvalue > 1e-3


@pytest.mark.parametrize("seed", quick([0, 1], 0))
@pytest.mark.parametrize("twin", BACKENDS_QUICK)
def test_long_windows_among_short_episodes_are_drawn_exactly_uniformly(twin, seed):
    """Windows of 5 steps among episodes of 0-8 steps: few candidates are valid,
    so most samples miss and are redrawn. However they are redrawn (today by a
    scan of every row; issue 8 fix 11 avoids it), each valid window must keep
    probability exactly `1 / count`: a chi-square test on 20,000 draws, whose
    threshold a correct sampler misses with probability 1e-6, for any seed.
    """
    rng = np.random.default_rng(21)
    streams = [make_stream(rng, s, 130, max_episode=8) for s in range(3)]
    rb = make_buffer(twin, 3, 100, 4, seed=seed)
    for i in range(130):
        rb.add_batch(row(streams, i))
    ref = Reference(streams, 100, 4)
    valid = sorted(ref.valid(5))
    assert 20 <= len(valid) <= 0.2 * 3 * 100  # valid windows are rare among the window starts
    counts = dict.fromkeys(valid, 0)
    for _ in range(20):
        items, info = rb.get_next(sample_batch_size=1000, num_steps=5)
        np.testing.assert_allclose(np.asarray(info.probabilities), 1 / len(valid), rtol=1e-6)
        for gid in np.asarray(info.ids)[:, 0].tolist():
            counts[gid] += 1  # a KeyError would be an invalid draw
    ref.check(items, np.asarray(info.ids))
    assert scipy.stats.chisquare(list(counts.values())).pvalue > 1e-6, counts


@pytest.mark.parametrize("twin", quick(TWINS, "py"))  # the TF race, seconds of threads, in the slow lane
def test_readers_racing_a_writer_through_wrap_around_get_whole_stacks(twin):
    # A ring of 12 rows: the writer keeps overwriting the oldest frames that
    # readers may be stacking. Every sample must equal the reference stack
    # for its ids: a frame overwritten mid-read would not.
    rng = np.random.default_rng(12)
    streams = [make_stream(rng, s, 400) for s in range(3)]
    ref = Reference(streams, 10**9, 4)  # the whole stream: every id's true stacks
    rb = make_buffer(twin, 3, 12, 4, seed=3)
    for i in range(12):
        rb.add_batch(row(streams, i))
    draws = [lambda: rb.get_next(16), lambda: rb.get_next(8, num_steps=2), iter(rb.as_dataset(8, 2, 2)).__next__]
    if twin.startswith("tf"):
        draws.append(tf.function(lambda: rb.get_next(16)))
    for draw in draws:
        draw()  # trace and compile before the threads start
    done, samples = threading.Event(), []
    start = threading.Barrier(1 + len(draws))  # the writer starts once every reader is running

    def write():
        start.wait()
        for i in range(12, 400):
            rb.add_batch(row(streams, i))
        done.set()

    def reader(draw):
        def read():
            start.wait()
            reads = 0
            while not done.is_set() or reads < 2:  # a fast writer may finish first: still read twice
                reads += 1
                items, info = draw()
                samples.append((tf.nest.map_structure(np.asarray, items), np.asarray(info.ids)))

        return read

    run_threads([write] + [reader(d) for d in draws])
    assert len(samples) >= 2 * len(draws)
    for items, ids in samples:
        ref.check(items, ids)


def test_segments_advancing_at_their_own_pace():
    rng = np.random.default_rng(8)
    lengths = [50, 17, 33]
    streams = [make_stream(rng, s, n) for s, n in enumerate(lengths)]
    rb = PyFrameReplayBuffer(frame_data_spec(FRAME), batch_size=3, max_length=20, history_len=4, seed=2)
    cursors = [0, 0, 0]
    while cursors != lengths:
        s = int(rng.integers(3))
        size = min(int(rng.integers(1, 25)), lengths[s] - cursors[s])
        rb.add_sequence({k: v[cursors[s] : cursors[s] + size] for k, v in streams[s].items()}, segment=s)
        cursors[s] += size
    ref = Reference(streams, 20, 4)
    items, info = rb.get_next(sample_batch_size=500)
    ref.check(items, info.ids)
    assert set(info.ids.tolist()) == ref.valid()
    assert rb.num_frames() == 20 + 17 + 20


def test_one_ring_form_appends_any_number_of_rows():
    rng = np.random.default_rng(9)
    stream = make_stream(rng, 0, 70)
    rb = PyFrameReplayBuffer(frame_data_spec(FRAME), 25, history_len=2, seed=1)
    rb.add_batch({k: v[:10] for k, v in stream.items()})
    rb.add_batch({k: v[10:] for k, v in stream.items()})  # longer than the ring: only the newest 25 stay
    ref = Reference([stream], 25, 2)
    items, info = rb.get_next(sample_batch_size=300)
    ref.check(items, info.ids)
    assert set(info.ids.tolist()) == ref.valid()


@pytest.mark.parametrize("twin", BACKENDS_QUICK)
def test_checkpoint_restores_rows_counters_and_generator(twin, tmp_path):
    rb, _ = filled(twin, 3, 12, 4, 40)
    checkpoint = tf.train.Checkpoint(buffer=getattr(rb, "rb", rb))  # the buffer itself, not its XLA-stacks proxy
    path = checkpoint.save(str(tmp_path / "ckpt"))
    before = rb.gather_all()
    sample = rb.get_next(sample_batch_size=8)
    rng = np.random.default_rng(1)
    more = [make_stream(rng, s, 9) for s in range(3)]
    for i in range(9):
        rb.add_batch(row(more, i))
    checkpoint.restore(path)
    tf.nest.map_structure(np.testing.assert_array_equal, rb.gather_all(), before)
    tf.nest.map_structure(np.testing.assert_array_equal, rb.get_next(sample_batch_size=8), sample)


@pytest.mark.parametrize("twin", BACKENDS_QUICK)
def test_clear_empties_and_the_next_row_starts_an_episode(twin):
    rb, _ = filled(twin, 2, 12, 4, 30)
    rb.clear()
    assert int(rb.num_frames()) == 0 and int(rb.num_transitions()) == 0
    with pytest.raises(ValueError, match="get_next: the buffer holds no valid transition yet"):
        rb.get_next(sample_batch_size=2)
    rng = np.random.default_rng(4)
    streams = [make_stream(rng, s, 12) for s in range(2)]
    for stream in streams:
        stream["first"][0] = False  # mid-episode rows after a clear: the first has no past
    for i in range(12):
        rb.add_batch(row(streams, i))
    items, info = rb.get_next(sample_batch_size=100)
    Reference(streams, 12, 4).check(items, np.asarray(info.ids))


@pytest.mark.parametrize("twin", BACKENDS_QUICK)
def test_empty_or_firsts_only_or_too_short_episodes_cannot_be_sampled(twin):
    rb = make_buffer(twin, 1, 10, 2)
    with pytest.raises(ValueError, match="holds no valid transition yet; add steps after each"):
        rb.get_next()
    one = {
        "frame": frame_of(0, np.zeros(1)),
        "first": np.ones(1, bool),
        "action": np.zeros(1, np.int32),
        "reward": np.zeros(1, np.float32),
        "terminated": np.zeros(1, bool),
        "truncated": np.zeros(1, bool),
    }
    rb.add_batch(one)
    rb.add_batch(one)
    with pytest.raises(ValueError, match="no valid transition yet"):
        rb.get_next(sample_batch_size=3)
    rb.add_batch({**one, "first": np.zeros(1, bool)})
    assert np.asarray(rb.get_next()[1].ids) == 2
    with pytest.raises(ValueError, match="no valid window of 2 transitions of one episode yet"):
        rb.get_next(sample_batch_size=3, num_steps=2)
    if twin.startswith("tf"):
        with pytest.raises(tf.errors.InvalidArgumentError, match="no valid window of 2 transitions"):
            tf.function(lambda: rb.get_next(sample_batch_size=3, num_steps=2))()


def bad_rows() -> list:
    good = row([make_stream(np.random.default_rng(0), s, 1) for s in range(2)], 0)
    return [
        (
            {**good, "frame": np.zeros((2, 3, 2), np.uint8)},
            ValueError,
            r"add_batch: frame has shape \(3, 2\); the spec expects \(2, 3\)",
        ),
        (
            {**good, "frame": np.zeros((2, *FRAME), np.float32)},
            TypeError,
            "add_batch: frame has dtype float32; the spec expects uint8",
        ),
        (
            {**good, "first": np.zeros(2, np.int32)},
            TypeError,
            "add_batch: first has dtype int32; the spec expects bool",
        ),
        ({k: v for k, v in good.items() if k != "reward"}, TypeError, r"add_batch: items \(missing \['reward'\]"),
        (
            {k: v[:1] for k, v in good.items()},
            ValueError,
            r"add_batch: .* has outer \(batch\) dimension 1; it must equal",
        ),
    ]


@pytest.mark.parametrize("twin", BACKENDS_QUICK)
@pytest.mark.parametrize("case", range(5))
def test_a_rejected_batch_names_the_field_and_changes_nothing(twin, case):
    rb, _ = filled(twin, 2, 8, 2, 11)
    before = (rb.gather_all(), int(rb.num_frames()), int(rb.num_transitions()))
    items, error, message = bad_rows()[case]
    with pytest.raises(error, match=message):
        rb.add_batch(items)
    after = (rb.gather_all(), int(rb.num_frames()), int(rb.num_transitions()))
    tf.nest.map_structure(np.testing.assert_array_equal, after, before)


@pytest.mark.parametrize("twin", BACKENDS_QUICK)
def test_bad_construction_and_sampling_arguments(twin):
    cls = TFFrameReplayBuffer if twin.startswith("tf") else PyFrameReplayBuffer
    where = cls.__name__
    spec = frame_data_spec(FRAME)

    def build(data_spec=spec, history_len=4, max_length=10):
        if twin.startswith("tf"):
            return cls(data_spec, 1, max_length, history_len=history_len)
        return cls(data_spec, batch_size=1, max_length=max_length, history_len=history_len)

    with pytest.raises(ValueError, match=rf"{where}: history_len \(0\) must be a positive integer"):
        build(history_len=0)
    with pytest.raises(ValueError, match=rf"{where}: max_length \(4\) must be greater than history_len \(4\)"):
        build(max_length=4)
    with pytest.raises(TypeError, match=rf"{where}: data_spec \(\['first'\]\) must be a mapping with 'frame'"):
        build({"first": spec["first"]})
    with pytest.raises(TypeError, match=r"data_spec\['first'\] .* must be a scalar tf.bool spec"):
        build({**spec, "first": tf.TensorSpec([], tf.int32)})
    with pytest.raises(ValueError, match="data_spec entry 'observation' must be renamed"):
        build({**spec, "observation": tf.TensorSpec([], tf.int32)})
    rb = build()
    with pytest.raises(ValueError, match=r"get_next: num_steps \(10\) must be at most max_length - 1 \(9\)"):
        rb.get_next(num_steps=10)
    with pytest.raises(ValueError, match=r"get_next: sample_batch_size \(0\) must be a positive integer"):
        rb.get_next(sample_batch_size=0)


def test_add_sequence_checks_the_segment():
    rb = PyFrameReplayBuffer(frame_data_spec(FRAME), batch_size=2, max_length=8, history_len=2)
    stream = make_stream(np.random.default_rng(0), 0, 3)
    for bad in (2, -1, 1.0, True):
        with pytest.raises(ValueError, match=rf"add_sequence: segment \({bad!r}\) must be an integer in \[0, 2\)"):
            rb.add_sequence(stream, segment=bad)
    assert rb.num_frames() == 0


def test_storage_keeps_each_frame_once():
    rb = PyFrameReplayBuffer(frame_data_spec((84, 84)), 1000, history_len=4)
    per_row = rb.nbytes / rb.capacity
    assert 84 * 84 < per_row < 84 * 84 + 30  # one frame, the step's entries and `pos`
    stacked = TFFrameReplayBuffer(frame_data_spec((84, 84)), 1, 1000, history_len=4).nbytes / 1000
    assert stacked == pytest.approx(per_row, rel=1e-3)


def naive_stacks(frames: np.ndarray, rows: np.ndarray, history_len: int, num_steps: int | None) -> tuple:
    """Observation and next-observation stacks of `frames` at `rows` (`[samples, history_len + steps]`), one
    slot at a time: `[samples, (steps,) *frame, history_len]`."""
    windows = frames[rows]
    out = []
    for first in (0, 1):
        steps = [np.stack([windows[:, j + k + first] for k in range(history_len)], -1) for j in range(num_steps or 1)]
        out.append(steps[0] if num_steps is None else np.stack(steps, 1))
    return tuple(out)


def random_bits(rng: np.random.Generator, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """Frames of any bits of `dtype` (NaNs and negative zeros included), bools 0 or 1."""
    raw = rng.integers(0, 2 if dtype.kind == "b" else 256, shape[:-1] + (shape[-1] * dtype.itemsize,), dtype=np.uint8)
    return raw.view(dtype)


@pytest.mark.parametrize("dtype", [np.uint8, bool, np.uint16, np.float32])
@pytest.mark.parametrize("history_len", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("num_steps", [None, 1, 3])
def test_numpy_twin_stacks_have_the_bits_of_naive_stacks(dtype, history_len, num_steps):
    """Whatever the frame dtype and stack length (a pixel's stack packed in one word of 2, 4 or 8 bytes, or
    copied slot by slot), every sampled stack has exactly the bits of the frames it shows, zeros before the
    episode's first frame."""
    rng = np.random.default_rng(0)
    dtype = np.dtype(dtype)
    length = 20
    frames = random_bits(rng, (length, *FRAME), dtype)
    spec = frame_data_spec(FRAME, frame_dtype=tf.as_dtype(dtype))
    rb = PyFrameReplayBuffer(spec, 2 * length, history_len=history_len, seed=0)
    rb.add_batch(
        {
            "frame": frames,
            "first": np.arange(length) == 0,  # one episode
            "action": np.arange(length, dtype=np.int32),
            "reward": np.zeros(length, np.float32),
            "terminated": np.zeros(length, bool),
            "truncated": np.zeros(length, bool),
        }
    )
    items, info = rb.get_next(sample_batch_size=64, num_steps=num_steps)
    ids = np.asarray(info.ids).reshape(64, -1)
    padded = np.concatenate([np.zeros((history_len, *FRAME), dtype), frames])  # zeros before the first frame
    # Transition t shows frames t - history_len .. t (through its last step), rows t .. of `padded`.
    rows = ids[:, :1] + np.arange(history_len + (num_steps or 1))
    for got, want in zip(
        (items["observation"], items["next_observation"]), naive_stacks(padded, rows, history_len, num_steps)
    ):
        assert got.dtype == dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


@pytest.mark.slow  # a first build compiles for about 25 s
def test_the_native_kernel_is_built_where_a_compiler_is(monkeypatch):
    if shutil.which(os.environ.get("CXX") or "g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler: the buffer stacks frames with XLA")
    monkeypatch.delenv("TFREPLAY_NATIVE", raising=False)
    [result] = native.build(["frame_stack"])
    assert result.state in ("built", "cached"), result.output
    assert native.frame_stack() is not None


@pytest.mark.parametrize("dtype", [np.uint8, np.bool_, np.uint16, np.float32])
@pytest.mark.parametrize("history_len", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("num_steps", [None, 1, 3])
def test_native_stacks_equal_numpy_stacks(dtype, history_len, num_steps):
    stack = native.frame_stack()
    if stack is None:
        pytest.skip("native kernel not built")
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 2, (20, 2, 3)).astype(dtype) if dtype is np.bool_ else rng.normal(size=(20, 2, 3)) * 300
    frames = np.asarray(frames).astype(dtype)
    rows = rng.integers(0, 20, (7, history_len + (num_steps or 1)))
    variable = tf.Variable(frames)
    got = stack(variable.handle, rows, T=variable.dtype, history_len=history_len, time_axis=num_steps is not None)
    for g, w in zip(got, naive_stacks(frames, rows, history_len, num_steps)):
        assert g.dtype == variable.dtype and g.shape == w.shape
        assert g.numpy().tobytes() == w.tobytes()


def test_native_kernel_rejects_rows_outside_the_frames():
    stack = native.frame_stack()
    if stack is None:
        pytest.skip("native kernel not built")
    variable = tf.Variable(np.zeros((5, 2, 2), np.uint8))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows\[1, 2\] = 5 is not in \[0, 5\)"):
        stack(variable.handle, [[0, 1, 2], [0, 1, 5]], T=tf.uint8, history_len=2, time_axis=False)


def test_native_kernel_falls_back_to_xla_when_it_cannot_be_built(monkeypatch, tmp_path, caplog):
    """A failing compiler: the build says so and leaves nothing to load; TFREPLAY_NATIVE=0: no kernel, no warning."""
    monkeypatch.setenv("TFREPLAY_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", shutil.which("false") or "false")  # a "compiler" that always fails
    [result] = native.build(["frame_stack"])
    assert (result.state, result.path) == ("failed", None)
    assert result.reason.startswith("false failed: ")
    assert list(tmp_path.glob("*.so")) == []  # nothing half-built is left to load later
    monkeypatch.setenv("TFREPLAY_NATIVE", "0")
    caplog.clear()
    assert native.frame_stack() is None
    assert caplog.records == []


def test_sampling_in_a_function_keeps_static_shapes_and_autograph_quiet(caplog):
    """The kernel's outputs carry their static shapes, and tracing does not make AutoGraph convert the loader."""
    rb, _ = filled("tf", 2, 12, 3, 12)
    with caplog.at_level(logging.WARNING):
        by_step = tf.function(lambda: rb.get_next(4, num_steps=2, time_stacked=False))()
    assert not [r for r in caplog.records if "AutoGraph could not transform" in r.getMessage()]
    assert len(by_step[0]) == 2 and by_step[0][0]["observation"].shape == (4, *FRAME, 3)
    spec = rb.as_dataset(4).element_spec[0]["observation"]
    assert spec.shape == (4, *FRAME, 3)


def test_sequences_of_any_length_leave_the_index_as_lockstep_adds_do():
    """Padded windows (which read each segment's newest item from the index) drawn after `add_sequence` chunks
    of uneven sizes, including one longer than the ring, equal those drawn after the same rows added in lockstep."""
    rng = np.random.default_rng(8)
    streams = [make_stream(rng, s, 120, max_episode=9) for s in range(2)]
    chunked = PyFrameReplayBuffer(frame_data_spec(FRAME), batch_size=2, max_length=40, history_len=2, seed=3)
    lockstep = PyFrameReplayBuffer(frame_data_spec(FRAME), batch_size=2, max_length=40, history_len=2, seed=3)
    for lo, hi in [(0, 7), (7, 8), (8, 61), (61, 117)]:
        for s in range(2):
            chunked.add_sequence({k: v[lo:hi] for k, v in streams[s].items()}, segment=s)
    for i in range(117):
        lockstep.add_batch(row(streams, i))
    for rb in (chunked, lockstep):
        rb.add_batch(row(streams, 117))
    window = Sequences(5, pad=True)
    a, b = (rb.get_next(sample_batch_size=64, transform=window) for rb in (chunked, lockstep))
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        np.testing.assert_array_equal(x, y)
