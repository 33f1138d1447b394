"""The uniform buffers' own rules, beyond the contract every buffer keeps (test_contract.py).

TF-Agents' order of the single deterministic pass (windows, shifts, batches
of segments), construction errors, the NumPy twin's one-ring form, every kind
of spec nest, and XLA. Items carry their global id in every leaf (see helpers).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPEC, Api, assert_nest_equal, decode, make_items, quick, to_numpy
from tensorflow.python.framework import tensor_spec  # BoundedTensorSpec has no public alias

from tfreplay import PyUniformReplayBuffer, TFUniformReplayBuffer


def live_ids(batch_size: int, max_length: int, num_adds: int) -> np.ndarray:
    """The model: global ids stored after `num_adds` adds, `[batch_size, time]`."""
    local = np.arange(max(0, num_adds - max_length), num_adds)
    return local[None, :] * batch_size + np.arange(batch_size)[:, None]


def check_windows(ids: np.ndarray, batch_size: int, max_length: int, num_adds: int) -> None:
    """Each window (last axis) is consecutive in one segment and entirely live."""
    segment, local = ids % batch_size, ids // batch_size
    assert (segment == segment[..., :1]).all(), "a window mixes segments"
    assert (np.diff(local, axis=-1) == 1).all(), "a window is not consecutive"
    assert (local >= max(0, num_adds - max_length)).all() and (local < num_adds).all(), "a window holds a dead item"


# --- construction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0, max_length=3), r"batch_size \(0\) must be a positive integer"),
        (dict(batch_size=2, max_length=0), r"max_length \(0\) must be a positive integer"),
        (dict(batch_size=2, max_length=-1), r"max_length \(-1\) must be a positive integer"),
        (dict(batch_size=2, max_length=3, dataset_window_shift=0), r"dataset_window_shift \(0\) must be a positive"),
    ],
    ids=["batch_size", "max_length-zero", "max_length-negative", "window_shift"],
)
def test_non_positive_construction_sizes_are_rejected(buffer_cls, kwargs, message):
    with pytest.raises(ValueError, match=f"{buffer_cls.__name__}: {message}"):
        buffer_cls(SPEC, **kwargs)


# --- single deterministic pass ----------------------------------------------------------


def single_pass_model(batch_size, max_length, num_adds, sample_batch_size, num_steps, shift, drop):
    """Expected ids per element: TF-Agents' order, computed by hand.

    Unbatched: each segment in turn, its live items in windows of `num_steps`
    every `shift` (a short last window unless `drop`). Batched: groups of
    `sample_batch_size` segments (a short last group unless `drop`), each
    yielding its windows side by side; as in TF-Agents, a short last window is
    dropped there (a batch cannot mix window lengths).
    """
    live = live_ids(batch_size, max_length, num_adds).tolist()

    def windows(seq, drop_short):
        if num_steps is None:
            return list(seq)
        out = [seq[i : i + num_steps] for i in range(0, len(seq), shift or num_steps)]
        return [w for w in out if len(w) == num_steps or not drop_short]

    if sample_batch_size is None:
        return [w for segment in live for w in windows(segment, drop)]
    groups = [list(range(g, min(g + sample_batch_size, batch_size))) for g in range(0, batch_size, sample_batch_size)]
    groups = [g for g in groups if len(g) == sample_batch_size or not drop]
    times = list(range(len(live[0])))

    def element(group, window):  # [segments, time] or, without num_steps, [segments]
        return [[live[s][t] for t in window] if num_steps else live[s][window] for s in group]

    return [element(g, w) for g in groups for w in windows(times, True)]


SINGLE_PASS_CASES = {
    "items": (None, None, None, False),
    "windows": (None, 2, None, False),
    "windows-short-last": (None, 3, None, False),
    "windows-drop-short": (None, 3, None, True),
    "windows-shift-1": (None, 2, 1, False),
    "windows-shift-1-drop": (None, 3, 1, True),
    "batched-items": (2, None, None, False),
    "batched-items-drop": (2, None, None, True),
    "batched-windows": (2, 2, None, False),
    "batched-windows-all-segments": (3, 2, None, False),
    "batched-windows-short-dropped": (2, 3, None, False),
    "batched-windows-shift-1": (3, 2, 1, False),
}


# Every case on the NumPy twin; on the TF twin, whose windows come from its own storage, the cases that take shift,
# drop and batching once each run in `make test`, the rest in `make test-slow`.
TF_SINGLE_PASS = ("items", "windows-shift-1-drop", "batched-windows-short-dropped", "batched-windows-shift-1")
SINGLE_PASS_MATRIX = [
    pytest.param(
        cls, case, id=f"{name}-{case}", marks=[pytest.mark.slow] * (name == "tf" and case not in TF_SINGLE_PASS)
    )
    for name, cls in (("tf", TFUniformReplayBuffer), ("py", PyUniformReplayBuffer))
    for case in sorted(SINGLE_PASS_CASES)
]


@pytest.mark.parametrize("num_adds", quick([3, 6], 6), ids=["partial", "wrapped"])
@pytest.mark.parametrize("buffer_cls, case", SINGLE_PASS_MATRIX)
def test_single_deterministic_pass(buffer_cls, case, num_adds):
    sample_batch_size, num_steps, shift, drop = SINGLE_PASS_CASES[case]
    rb = buffer_cls(SPEC, batch_size=3, max_length=4, dataset_window_shift=shift, dataset_drop_remainder=drop)
    Api(rb).add_steps(num_adds)
    ds = rb.as_dataset(sample_batch_size, num_steps, num_parallel_calls=2, single_deterministic_pass=True)
    got = []
    for items, info in ds:
        np.testing.assert_array_equal(decode(items), info.ids.numpy())
        assert info.probabilities == ()
        got.append(info.ids.numpy().tolist())
    assert got == single_pass_model(3, 4, num_adds, sample_batch_size, num_steps, shift, drop)


def test_single_pass_with_every_batch_dropped_is_an_error(buffer_cls):
    rb = buffer_cls(SPEC, batch_size=2, max_length=4, dataset_drop_remainder=True)
    with pytest.raises(ValueError, match=r"as_dataset: sample_batch_size \(3\) must be at most batch_size \(2\)"):
        rb.as_dataset(3, single_deterministic_pass=True)


# --- the NumPy twin's TF-Agents construction --------------------------------------------


def test_py_buffer_built_from_capacity_takes_any_batch_size():
    rb = PyUniformReplayBuffer(SPEC, 4, seed=0)
    assert rb.capacity == 4 and rb.batch_size == 1 and rb.max_length == 4
    rb.add_batch(make_items([0, 1, 2]))
    np.testing.assert_array_equal(decode(rb.gather_all()), [[0, 1, 2]])
    rb.add_batch(make_items(np.arange(3, 13)))  # more rows than the capacity: the newest stay
    rb.add_batch(make_items(np.zeros([0], np.int64)))
    assert rb.num_frames() == 4
    np.testing.assert_array_equal(decode(rb.gather_all()), [[9, 10, 11, 12]])
    rb.add_batch(make_items([13]))
    items, info = rb.get_next(sample_batch_size=40, num_steps=4)
    np.testing.assert_array_equal(decode(items), info.ids)
    np.testing.assert_array_equal(info.ids, np.tile([10, 11, 12, 13], (40, 1)))
    with pytest.raises(ValueError, match=r"add_batch: leaves have different batch sizes \(.*action: 2.*id: 1"):
        bad = make_items([20, 21])
        bad["id"] = bad["id"][:1]
        rb.add_batch(bad)
    assert rb.num_frames() == 4


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((0,), {}, r"capacity \(0\) must be a positive integer"),
        ((2.5,), {}, r"capacity \(2.5\) must be a positive integer"),
        ((), {}, r"capacity \(None\) must be given, or batch_size and max_length"),
        ((10,), dict(max_length=5), r"max_length \(5\) must come with batch_size"),
        ((10,), dict(batch_size=3), r"capacity \(10\) must be a multiple of batch_size \(3\)"),
        ((10,), dict(batch_size=2, max_length=4), r"capacity \(10\) must equal batch_size \(2\) \* max_length \(4\)"),
    ],
    ids=["zero", "float", "missing", "max_length-alone", "not-a-multiple", "conflict"],
)
def test_py_buffer_construction_errors(args, kwargs, message):
    with pytest.raises(ValueError, match=f"PyUniformReplayBuffer: {message}"):
        PyUniformReplayBuffer(SPEC, *args, **kwargs)


def test_py_buffer_capacity_and_batch_size_give_the_segments():
    rb = PyUniformReplayBuffer(SPEC, 6, batch_size=2)
    assert (rb.batch_size, rb.max_length, rb.capacity) == (2, 3, 6)
    assert PyUniformReplayBuffer(SPEC, 6, batch_size=2, max_length=3).capacity == 6


def test_py_buffer_in_a_graph_says_to_call_it_eagerly():
    rb = PyUniformReplayBuffer(SPEC, batch_size=2, max_length=3)
    with pytest.raises(TypeError, match="add_batch: action is a graph tensor; a NumPy buffer stores values"):
        tf.function(rb.add_batch)(make_items([0, 1]))


# --- spec kinds ------------------------------------------------------------------------------

Transition = collections.namedtuple("Transition", ["observation", "action", "reward"])


class ArraySpecLike:
    """Like TF-Agents' ArraySpec: a leaf with `shape` and a NumPy `dtype`."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, np.dtype(dtype)


SPEC_KINDS = {
    "bounded-namedtuple": Transition(
        tf.TensorSpec([2], tf.float32),
        tensor_spec.BoundedTensorSpec([], tf.int64, minimum=0, maximum=3),
        tf.TensorSpec([], tf.float32),
    ),
    "tuple": (tf.TensorSpec([2], tf.float32), (tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.float32))),
    "array-spec-like": {"a": ArraySpecLike((2,), np.float32), "b": ArraySpecLike((), np.int64)},
    "single-leaf": tf.TensorSpec([2], tf.float32),
}


def _np_dtype(s):
    return s.dtype.as_numpy_dtype if isinstance(s.dtype, tf.DType) else s.dtype


def _batch_for(spec, values):
    """A batch of `spec`'s structure whose every leaf holds `values`."""
    values = np.asarray(values)

    def leaf(s):
        column = values.reshape((-1,) + (1,) * len(s.shape))
        return np.broadcast_to(column, values.shape + tuple(s.shape)).astype(_np_dtype(s))

    return tf.nest.map_structure(leaf, spec)


@pytest.mark.parametrize("kind", sorted(SPEC_KINDS))
def test_any_nest_of_specs_works(buffer_cls, kind):
    spec = SPEC_KINDS[kind]
    rb = buffer_cls(spec, batch_size=2, max_length=3, seed=0)
    for step in range(4):
        rb.add_batch(_batch_for(spec, [2 * step, 2 * step + 1]))
    tf.nest.assert_same_structure(rb.data_spec, spec)
    assert all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(rb.data_spec))
    everything = rb.gather_all()
    tf.nest.assert_same_structure(everything, spec)  # check_types: the namedtuple stays a namedtuple
    for got in tf.nest.flatten(everything):
        np.testing.assert_array_equal(np.asarray(got).reshape(2, 3, -1)[..., 0], [[2, 4, 6], [3, 5, 7]])
    items, info = rb.get_next(sample_batch_size=5, num_steps=2)
    tf.nest.assert_same_structure(items, spec)
    for got in tf.nest.flatten(items):
        np.testing.assert_array_equal(np.asarray(got).reshape(5, 2, -1)[..., 0], info.ids)


def test_bounded_specs_are_kept_as_they_are(buffer_cls):
    rb = buffer_cls(SPEC_KINDS["bounded-namedtuple"], batch_size=1, max_length=2)
    assert isinstance(rb.data_spec.action, tensor_spec.BoundedTensorSpec)
    assert rb.data_spec.action.maximum == 3


# --- XLA ----------------------------------------------------------------------------------


def test_add_batch_and_get_next_compile_with_xla_and_match_eager():
    eager = TFUniformReplayBuffer(SPEC, batch_size=2, max_length=3, seed=11)
    compiled = TFUniformReplayBuffer(SPEC, batch_size=2, max_length=3, seed=11)
    add = tf.function(compiled.add_batch, jit_compile=True)
    sample = tf.function(lambda: compiled.get_next(sample_batch_size=16, num_steps=2), jit_compile=True)
    sample_one = tf.function(lambda: compiled.get_next(), jit_compile=True)
    for step in range(5):
        items = make_items([2 * step, 2 * step + 1])
        eager.add_batch(items)
        add(items)
    assert_nest_equal(to_numpy(compiled.gather_all()), to_numpy(eager.gather_all()))
    assert int(compiled.num_frames()) == 6
    for _ in range(2):
        assert_nest_equal(to_numpy(sample()), to_numpy(eager.get_next(sample_batch_size=16, num_steps=2)))
        assert_nest_equal(to_numpy(sample_one()), to_numpy(eager.get_next()))
    items, info = to_numpy(sample())
    np.testing.assert_array_equal(decode(items), info.ids)
    check_windows(info.ids, 2, 3, 5)


def test_xla_sampling_of_an_empty_buffer_is_marked_by_zero_probability():
    """XLA drops assertions, so no error can be raised; the sample says it is empty."""
    rb = TFUniformReplayBuffer(SPEC, batch_size=2, max_length=4, seed=0)
    sample = tf.function(lambda: rb.get_next(3, num_steps=2), jit_compile=True)
    _, info = sample()
    np.testing.assert_array_equal(info.probabilities.numpy(), np.zeros(3, np.float32))
    rb.add_batch(make_items([0, 1]))
    rb.add_batch(make_items([2, 3]))
    _, info = sample()
    np.testing.assert_allclose(info.probabilities.numpy(), np.full(3, 0.5, np.float32))


@pytest.mark.parametrize("sample_batch_size", [None, 4])
def test_a_tf_dataset_element_is_drawn_when_read_so_it_sees_the_adds_before_it(sample_batch_size):
    """Without prefetching, `next()` after an add samples a buffer that holds it (TF-Agents' tests rely on
    this): no element is drawn ahead of its read."""
    rb = TFUniformReplayBuffer(SPEC, batch_size=2, max_length=3, seed=0)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    it = iter(rb.as_dataset(sample_batch_size=sample_batch_size).with_options(options))
    for i in range(1, 6):
        rb.add_batch(make_items([2 * i, 2 * i + 1]))
        _, info = next(it)
        np.testing.assert_allclose(info.probabilities, 1 / (2 * min(i, 3)), rtol=1e-6)
