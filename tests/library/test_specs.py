"""Specs as users meet them: what a `data_spec` may be, how a leaf is named, and every check `add_batch` makes.

Each rule is tested through the public buffers (both uniform twins, via the
`buffer_cls` fixture): a spec is accepted or refused at construction, and a
batch is stored or refused by `add_batch` with a message naming the leaf by
its path in the nest (`obs/pixels`), in `tf.nest.flatten` order.
"""

import collections
import re

import attr
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import tensor_spec  # BoundedTensorSpec has no public alias

from tfreplay import PyUniformReplayBuffer, TFUniformReplayBuffer

Pair = collections.namedtuple("Pair", ["first", "second"])
INT32 = tf.TensorSpec([], tf.int32)
FLOAT32 = tf.TensorSpec([], tf.float32)


@attr.s
class AttrsPair:
    x = attr.ib()
    y = attr.ib()


def build(buffer_cls, spec, batch_size=1, max_length=3):
    return buffer_cls(spec, batch_size=batch_size, max_length=max_length, seed=0)


def batch_of(spec, batch_size=1, dtype=None):
    """A batch of zeros for `spec` (each leaf `[batch_size] + shape`), in `dtype` if given."""
    return tf.nest.map_structure(
        lambda s: np.zeros([batch_size] + s.shape.as_list(), dtype or s.dtype.as_numpy_dtype), spec
    )


# --- leaf paths: how messages name a leaf ---------------------------------------------------

# spec -> the path of each leaf, in tf.nest.flatten order (the order in which add_batch checks them)
NESTS = {
    "dict-sorted-like-tf-nest": ({"b": INT32, "a": {"z": INT32, "y": INT32}}, ["a/y", "a/z", "b"]),
    "ordered-dict": (collections.OrderedDict([("b", INT32), ("a", INT32)]), ["a", "b"]),
    "namedtuple": (Pair(INT32, Pair(INT32, INT32)), ["first", "second/first", "second/second"]),
    "tuple-and-list": ((INT32, [INT32, (INT32,)]), ["0", "1/0", "1/1/0"]),
    "single-leaf": (INT32, ["<item>"]),
    "attrs-by-index": (AttrsPair(INT32, INT32), ["leaf0", "leaf1"]),  # a nest the paths do not walk
}


@pytest.mark.parametrize("name", sorted(NESTS))
def test_a_bad_leaf_is_named_by_its_path_and_checked_in_tf_nest_order(buffer_cls, name):
    """Every leaf of the wrong dtype but one, in turn: the message names the first bad leaf in flatten order."""
    spec, paths = NESTS[name]
    rb = build(buffer_cls, spec)
    good = tf.nest.flatten(batch_of(spec))
    for i, path in enumerate(paths):
        leaves = good[:i] + [np.zeros(1, np.int64) for _ in good[i:]]  # this leaf and every later one are bad
        items = tf.nest.pack_sequence_as(rb.data_spec, leaves)
        with pytest.raises(TypeError, match=rf"^add_batch: {re.escape(path)} has dtype int64; the spec expects"):
            rb.add_batch(items)
    assert int(rb.num_frames()) == 0
    rb.add_batch(tf.nest.pack_sequence_as(rb.data_spec, good))
    assert int(rb.num_frames()) == 1


# --- what a data_spec may be -------------------------------------------------------------------


class ArraySpecLike:
    """Like TF-Agents' ArraySpec: a leaf with `shape` and a NumPy `dtype`."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, np.dtype(dtype)


def test_tensor_specs_are_kept_and_array_specs_become_tensor_specs_named_by_path(buffer_cls):
    bounded = tensor_spec.BoundedTensorSpec([], tf.int32, minimum=0, maximum=5)
    plain = tf.TensorSpec([3], tf.float32)
    rb = build(buffer_cls, {"obs": {"pixels": ArraySpecLike((2, 2), np.uint8)}, "a": bounded, "v": plain})
    assert rb.data_spec["a"] is bounded and rb.data_spec["v"] is plain
    assert rb.data_spec["obs"]["pixels"] == tf.TensorSpec([2, 2], tf.uint8, name="obs/pixels")
    rb.add_batch(
        {"obs": {"pixels": np.ones((1, 2, 2), np.uint8)}, "a": np.int32([4]), "v": np.ones((1, 3), np.float32)}
    )
    np.testing.assert_array_equal(rb.gather_all()["obs"]["pixels"], np.ones((1, 1, 2, 2), np.uint8))


@pytest.mark.parametrize(
    "spec, error, message",
    [
        (None, TypeError, r"data_spec \(None or empty\) must be a nest of tf.TensorSpec"),
        ({}, TypeError, r"data_spec \(None or empty\) must be a nest of tf.TensorSpec"),
        ({"obs": {"bad": 3}}, TypeError, r"data_spec: obs/bad \(3\) must be a tf.TensorSpec or an object with `shape`"),
        ({"a": None, "b": INT32}, TypeError, r"data_spec: a \(None\) must be a tf.TensorSpec or an object with"),
        (
            {"obs": tf.TensorSpec([None, 3], tf.float32)},
            ValueError,
            r"data_spec: obs has shape \(None, 3\); every dimension must be known to preallocate storage",
        ),
    ],
    ids=["none", "empty", "not-a-spec", "none-leaf", "unknown-dimension"],
)
def test_a_bad_data_spec_is_refused_naming_the_leaf(buffer_cls, spec, error, message):
    with pytest.raises(error, match=message):
        build(buffer_cls, spec)


# --- positive integers ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 7, np.int64(3), np.int32(1)], ids=repr)
def test_python_and_numpy_integers_are_sizes(buffer_cls, value):
    rb = build(buffer_cls, {"a": INT32}, batch_size=value, max_length=value)
    assert (rb.batch_size, rb.max_length) == (value, value)
    rb.add_batch({"a": np.arange(value, dtype=np.int32)})
    items, info = rb.get_next(sample_batch_size=value)
    assert np.asarray(info.ids).shape == (value,)


@pytest.mark.parametrize("value", [0, -1, True, 1.0, "3", np.float32(2)], ids=repr)
def test_everything_else_is_not_a_positive_integer(buffer_cls, value):
    shown = re.escape(repr(value))
    with pytest.raises(ValueError, match=rf"{buffer_cls.__name__}: max_length \({shown}\) must be a positive integer"):
        build(buffer_cls, {"a": INT32}, max_length=value)
    rb = build(buffer_cls, {"a": INT32})
    rb.add_batch({"a": np.int32([1])})
    with pytest.raises(ValueError, match=rf"^get_next: sample_batch_size \({shown}\) must be a positive integer\.$"):
        rb.get_next(sample_batch_size=value)


def test_none_is_a_size_only_where_it_means_something():
    """A sample batch size of None is one sample without a batch dimension; a TF buffer's max_length is not
    optional."""
    with pytest.raises(ValueError, match=r"TFUniformReplayBuffer: max_length \(None\) must be a positive integer"):
        TFUniformReplayBuffer({"a": INT32}, batch_size=1, max_length=None)
    for rb in (build(TFUniformReplayBuffer, {"a": INT32}), build(PyUniformReplayBuffer, {"a": INT32})):
        rb.add_batch({"a": np.int32([1])})
        items, info = rb.get_next(sample_batch_size=None)
        assert np.asarray(info.ids).shape == () and np.asarray(items["a"]).shape == ()


# --- Python values: exact or refused --------------------------------------------------------------


@pytest.mark.parametrize(
    "value, dtype",
    [(1, tf.int32), (-2.0, tf.int32), (0.25, tf.float32), (True, tf.bool), (0, tf.bool), (1, tf.bool)],
    ids=["int", "integral-float", "float32-exact", "bool", "zero-as-bool", "one-as-bool"],
)
def test_a_python_number_that_converts_exactly_passes_the_dtype_check(buffer_cls, value, dtype):
    """A Python leaf takes the spec's dtype when that is exact; it then meets the shape check (it has no batch)."""
    rb = build(buffer_cls, {"a": tf.TensorSpec([], dtype)})
    with pytest.raises(ValueError, match=r"add_batch: a has shape \(\); it must be \[batch\] \+ \[\]"):
        rb.add_batch({"a": value})


@pytest.mark.parametrize(
    "value, dtype, shown",
    [
        (1.5, tf.int32, "float64"),
        (0.1, tf.float32, "float64"),  # 0.1 has no exact float32
        (2**40, tf.int32, "int64"),
        (2, tf.bool, "int64"),
        ("a", tf.int32, "str32"),
    ],
    ids=["fraction-to-int", "float64-to-float32", "overflow", "two-as-bool", "string"],
)
def test_a_python_number_that_would_change_is_refused(buffer_cls, value, dtype, shown):
    rb = build(buffer_cls, {"a": tf.TensorSpec([], dtype)})
    message = rf"add_batch: a \({shown} values\) cannot be stored exactly as {dtype.name}; pass an array of dtype"
    with pytest.raises(TypeError, match=message):
        rb.add_batch({"a": value})
    assert int(rb.num_frames()) == 0


@pytest.mark.parametrize(
    "value",
    [np.zeros(1, np.float64), tf.zeros([1], tf.float64), np.float64(0)],
    ids=["array", "tensor", "numpy-scalar"],
)
def test_arrays_and_tensors_keep_their_dtype_and_are_never_cast(buffer_cls, value):
    rb = build(buffer_cls, {"a": FLOAT32})
    message = r"^add_batch: a has dtype float64; the spec expects float32 \(tfreplay never casts silently\)\.$"
    with pytest.raises(TypeError, match=message):
        rb.add_batch({"a": value})


# --- shapes ---------------------------------------------------------------------------------------

SHAPED = tf.TensorSpec([2, 3], tf.float32)


@pytest.mark.parametrize(
    "shape, error, message",
    [
        ((2, 3), ValueError, r"^add_batch: obs has shape \(2, 3\); it must be \[batch\] \+ \[2, 3\] \(an outer batch "),
        ((4, 3, 2), ValueError, r"^add_batch: obs has shape \(3, 2\); the spec expects \(2, 3\) after the batch dim"),
        ((5, 2, 3), ValueError, r"^add_batch: obs has outer \(batch\) dimension 5; it must equal the buffer's batch_s"),
        ((4, 2, 3, 1), ValueError, r"^add_batch: obs has shape \(4, 2, 3, 1\); it must be \[batch\] \+ \[2, 3\]"),
    ],
    ids=["rank", "inner", "batch", "extra-dimension"],
)
def test_a_leaf_of_another_shape_is_refused(buffer_cls, shape, error, message):
    rb = build(buffer_cls, {"obs": SHAPED}, batch_size=4)
    with pytest.raises(error, match=message):
        rb.add_batch({"obs": np.zeros(shape, np.float32)})
    assert int(rb.num_frames()) == 0


def test_a_one_ring_numpy_buffer_takes_any_batch_but_its_leaves_must_agree():
    rb = PyUniformReplayBuffer({"a": INT32, "b": SHAPED}, 20)
    rb.add_batch({"a": np.arange(9, dtype=np.int32), "b": np.zeros((9, 2, 3), np.float32)})
    assert rb.num_frames() == 9
    message = r"^add_batch: leaves have different batch sizes \(a: 3, b: 2\); they must agree\.$"
    with pytest.raises(ValueError, match=message):
        rb.add_batch({"a": np.arange(3, dtype=np.int32), "b": np.zeros((2, 2, 3), np.float32)})
    assert rb.num_frames() == 9


@pytest.mark.parametrize("outer, inner", [([None], [2, 3]), ([4], [None, 3]), ([None], [None, None])])
def test_unknown_dimensions_in_a_graph_are_checked_when_it_runs(outer, inner):
    """A TF buffer checks what a trace cannot know when the graph runs, naming the leaf and the shape."""
    rb = TFUniformReplayBuffer({"a": INT32, "obs": SHAPED}, batch_size=4, max_length=3)
    signature = {"a": tf.TensorSpec(outer, tf.int32), "obs": tf.TensorSpec(outer + inner, tf.float32)}
    add = tf.function(rb.add_batch, input_signature=[signature])
    add({"a": np.arange(4, dtype=np.int32), "obs": np.ones((4, 2, 3), np.float32)})
    assert int(rb.num_frames()) == 4
    bad = {"a": np.arange(4, dtype=np.int32), "obs": np.ones((4, 3, 3), np.float32)}
    if outer == [None]:
        bad = {"a": np.arange(5, dtype=np.int32), "obs": np.ones((5, 2, 3), np.float32)}
    # `spec.{1,2}s`: the graph's assertion text escapes the apostrophe.
    message = r"add_batch: (a|obs) must have shape \[4(, 2, 3)?\] \(\[batch_size\] \+ the spec.{1,2}s shape\)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        add(bad)
    np.testing.assert_array_equal(rb.gather_all()["a"], [[0], [1], [2], [3]])


def test_a_leaf_of_unknown_rank_is_refused_when_traced():
    rb = TFUniformReplayBuffer({"a": INT32, "b": SHAPED}, batch_size=2, max_length=3)
    signature = {"a": tf.TensorSpec(None, tf.int32), "b": tf.TensorSpec([2, 2, 3], tf.float32)}
    add = tf.function(rb.add_batch, input_signature=[signature])
    with pytest.raises(ValueError, match=r"add_batch: a has unknown rank; its rank must be known\."):
        add.get_concrete_function()


# --- structure ------------------------------------------------------------------------------------

NEST_SPEC = {"a": INT32, "b": tf.TensorSpec([2], tf.float32)}


@pytest.mark.parametrize(
    "spec, items, message",
    [
        (NEST_SPEC, {"a": 1, "c": 2}, r"add_batch: items \(missing \['b'\], unexpected \['c'\]\) must have the struc"),
        (
            {"a": INT32, "b": (INT32, INT32)},
            {"a": 1, "b": (2,)},
            r"add_batch: items \(missing \['b/1'\], unexpected \[\]\) must have the structure",
        ),
        (NEST_SPEC, [1, 2], r"add_batch: items \(.*\) must have the structure of data_spec \{'a': 'int32', 'b': 'f"),
    ],
    ids=["other-key", "short-tuple", "list-for-dict"],
)
def test_items_of_another_structure_list_missing_and_unexpected_leaves(buffer_cls, spec, items, message):
    """As many leaves as the spec, under other keys, are refused too: tf.nest alone would pair them by position."""
    rb = build(buffer_cls, spec)
    with pytest.raises(TypeError, match=message):
        rb.add_batch(items)
    assert int(rb.num_frames()) == 0


def test_sequence_types_may_differ(buffer_cls):
    """A list or a tuple for a namedtuple: sequences pair by position; the stored nest is the spec's."""
    rb = build(buffer_cls, {"p": Pair(INT32, (INT32, tf.TensorSpec([], tf.bool)))})
    rb.add_batch({"p": [np.int32([4]), [np.int32([5]), np.array([True])]]})
    rb.add_batch({"p": (np.int32([6]), (np.int32([7]), np.array([False])))})
    everything = rb.gather_all()
    assert isinstance(everything["p"], Pair)
    np.testing.assert_array_equal(everything["p"].first, [[4, 6]])
    np.testing.assert_array_equal(everything["p"].second[0], [[5, 7]])
    np.testing.assert_array_equal(everything["p"].second[1], [[True, False]])
