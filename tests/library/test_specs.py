"""specs.py: leaf paths, spec normalisation, and the checks behind every add_batch."""

import collections
import re

import attr
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import tensor_spec  # BoundedTensorSpec has no public alias

from tfreplay._src import specs

Pair = collections.namedtuple("Pair", ["first", "second"])


@attr.s
class AttrsPair:
    x = attr.ib()
    y = attr.ib()


NESTS = {
    "dict-sorted-like-tf-nest": {"b": "b", "a": {"z": "a/z", "y": "a/y"}},
    "ordered-dict": collections.OrderedDict([("b", "b"), ("a", "a")]),
    "namedtuple": Pair("first", Pair("second/first", "second/second")),
    "tuple-and-list": ("0", ["1/0", ("1/1/0",)]),
    "none-leaf": {"a": None, "b": "b"},
    "single-leaf": "<item>",
}


@pytest.mark.parametrize("name", sorted(NESTS))
def test_leaf_paths_follow_tf_nest_flatten_order(name):
    nest = NESTS[name]
    expected = [leaf if leaf is not None else "a" for leaf in tf.nest.flatten(nest)]
    assert specs.leaf_paths(nest) == expected


def test_leaf_paths_fall_back_to_indices_for_nests_they_do_not_walk():
    assert specs.leaf_paths(AttrsPair(1, 2)) == ["leaf0", "leaf1"]


class ArraySpecLike:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, np.dtype(dtype)


def test_normalize_spec_keeps_tensor_specs_and_converts_array_specs():
    bounded = tensor_spec.BoundedTensorSpec([], tf.int32, minimum=0, maximum=5)
    plain = tf.TensorSpec([3], tf.float32)
    spec = specs.normalize_spec({"obs": {"pixels": ArraySpecLike((2, 2), np.uint8)}, "a": bounded, "v": plain})
    assert spec["a"] is bounded and spec["v"] is plain
    assert spec["obs"]["pixels"] == tf.TensorSpec([2, 2], tf.uint8, name="obs/pixels")


@pytest.mark.parametrize(
    "spec, error, message",
    [
        (None, TypeError, r"data_spec \(None or empty\) must be a nest of tf.TensorSpec"),
        ({}, TypeError, r"data_spec \(None or empty\) must be a nest of tf.TensorSpec"),
        ({"obs": {"bad": 3}}, TypeError, r"data_spec: obs/bad \(3\) must be a tf.TensorSpec or an object with `shape`"),
        (
            {"obs": tf.TensorSpec([None, 3], tf.float32)},
            ValueError,
            r"data_spec: obs has shape \(None, 3\); every dimension must be known to preallocate storage",
        ),
    ],
    ids=["none", "empty", "not-a-spec", "unknown-dimension"],
)
def test_normalize_spec_errors_name_the_leaf(spec, error, message):
    with pytest.raises(error, match=message):
        specs.normalize_spec(spec)


@pytest.mark.parametrize("value", [1, 7, np.int64(3), np.int32(1)])
def test_positive_integers_pass(value):
    specs.check_positive_int("where", "size", value)


@pytest.mark.parametrize("value", [0, -1, True, 1.0, "3", None, np.float32(2)])
def test_everything_else_is_not_a_positive_integer(value):
    with pytest.raises(ValueError, match=re.escape(f"where: size ({value!r}) must be a positive integer.")):
        specs.check_positive_int("where", "size", value)


def test_none_passes_only_when_allowed():
    specs.check_positive_int("where", "size", None, allow_none=True)


INT32 = tf.TensorSpec([2], tf.int32)
FLOAT32 = tf.TensorSpec([2], tf.float32)
BOOL = tf.TensorSpec([2], tf.bool)


@pytest.mark.parametrize(
    "value, spec, expected",
    [
        ([1, 2], INT32, np.array([1, 2], np.int32)),
        ([1.0, -2.0], INT32, np.array([1, -2], np.int32)),
        ([0.5, 0.25], FLOAT32, np.array([0.5, 0.25], np.float32)),
        ([True, False], BOOL, np.array([True, False])),
        ([0, 1], BOOL, np.array([False, True])),
    ],
    ids=["ints", "integral-floats", "float32-exact", "bools", "zero-one-as-bool"],
)
def test_python_values_take_the_spec_dtype_when_exact(value, spec, expected):
    out = specs.to_numpy_leaf("add_batch", "leaf", value, spec)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    "value, spec, shown",
    [
        ([1.5, 2.0], INT32, "float64"),
        ([0.1, 0.2], FLOAT32, "float64"),  # 0.1 has no exact float32
        ([2**40, 1], INT32, "int64"),
        ([2, 0], BOOL, "int64"),
        (["a", "b"], INT32, "str32"),
    ],
    ids=["fraction-to-int", "float64-to-float32", "overflow", "two-as-bool", "strings"],
)
def test_python_values_that_would_change_are_rejected(value, spec, shown):
    message = rf"add_batch: leaf \({shown} values\) cannot be stored exactly as {spec.dtype.name}; pass an array"
    with pytest.raises(TypeError, match=message):
        specs.to_numpy_leaf("add_batch", "leaf", value, spec)


def test_arrays_and_tensors_keep_their_dtype_for_the_checks():
    assert specs.to_numpy_leaf("w", "p", np.zeros(2, np.float64), FLOAT32).dtype == np.float64
    assert specs.to_numpy_leaf("w", "p", tf.constant([1, 2], tf.int64), INT32).dtype == np.int64


SPEC = tf.TensorSpec([2, 3], tf.float32)


@pytest.mark.parametrize(
    "dtype, shape, batch_size, error, message",
    [
        (tf.float64, (4, 2, 3), 4, TypeError, r"w: obs has dtype float64; the spec expects float32 \(tfreplay never"),
        (tf.float32, (2, 3), 4, ValueError, r"w: obs has shape \(2, 3\); it must be \[batch\] \+ \[2, 3\]"),
        (tf.float32, (4, 3, 2), 4, ValueError, r"w: obs has shape \(3, 2\); the spec expects \(2, 3\) after the batch"),
        (tf.float32, (5, 2, 3), 4, ValueError, r"w: obs has outer \(batch\) dimension 5; it must equal the buffer's"),
    ],
    ids=["dtype", "rank", "inner", "batch"],
)
def test_check_leaf(dtype, shape, batch_size, error, message):
    with pytest.raises(error, match=message):
        specs.check_leaf("w", "obs", dtype, shape, SPEC, batch_size)


@pytest.mark.parametrize("shape, batch_size", [((None, 2, 3), 4), ((4, None, 3), 4), ((9, 2, 3), None)])
def test_check_leaf_leaves_unknown_dimensions_to_the_runtime(shape, batch_size):
    specs.check_leaf("w", "obs", tf.float32, shape, SPEC, batch_size)


def test_leaves_must_share_their_outer_dimension():
    specs.check_same_outer("w", ["a", "b", "c"], [(3, 1), (3,), (None, 2)])
    with pytest.raises(ValueError, match=r"w: leaves have different batch sizes \(a: 3, b: 2\); they must agree"):
        specs.check_same_outer("w", ["a", "b"], [(3, 1), (2,)])


NEST_SPEC = {"a": tf.TensorSpec([], tf.int32), "b": tf.TensorSpec([2], tf.float32)}


def test_validate_numpy_batch_returns_flat_arrays():
    arrays = specs.validate_numpy_batch(
        "w", NEST_SPEC, ["a", "b"], {"a": np.arange(3, dtype=np.int32), "b": np.zeros((3, 2), np.float32)}, None
    )
    assert [a.shape for a in arrays] == [(3,), (3, 2)]
    with pytest.raises(ValueError, match=r"w: leaves have different batch sizes \(a: 3, b: 2\)"):
        specs.validate_numpy_batch(
            "w", NEST_SPEC, ["a", "b"], {"a": np.arange(3, dtype=np.int32), "b": np.zeros((2, 2), np.float32)}, None
        )


def test_validate_tensor_batch_checks_unknown_dimensions_when_the_graph_runs():
    @tf.function(input_signature=[{"a": tf.TensorSpec([None], tf.int32), "b": tf.TensorSpec([2, 2], tf.float32)}])
    def validate(items):
        tensors, checks = specs.validate_tensor_batch("w", NEST_SPEC, ["a", "b"], items, 2)
        assert len(checks) == 1 and [t.shape.as_list() for t in tensors] == [[2], [2, 2]]
        with tf.control_dependencies(checks):
            return tensors[0] + 0

    np.testing.assert_array_equal(validate({"a": np.int32([4, 5]), "b": np.zeros((2, 2), np.float32)}), [4, 5])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"w: a must have shape \[2\] \(\[batch_size\]"):
        validate({"a": np.int32([4, 5, 6]), "b": np.zeros((2, 2), np.float32)})


def test_validate_tensor_batch_needs_a_known_rank():
    @tf.function(input_signature=[{"a": tf.TensorSpec(None, tf.int32), "b": tf.TensorSpec([2, 2], tf.float32)}])
    def validate(items):
        return specs.validate_tensor_batch("w", NEST_SPEC, ["a", "b"], items, 2)[0][0]

    with pytest.raises(ValueError, match="w: a has unknown rank; its rank must be known"):
        validate.get_concrete_function()


def test_structure_errors_list_missing_and_unexpected_leaves():
    with pytest.raises(TypeError, match=r"w: items \(missing \['b'\], unexpected \['c'\]\) must have the structure"):
        specs.flatten_items("w", NEST_SPEC, {"a": 1, "c": 2})  # as many leaves: tf.nest alone would pair them
    with pytest.raises(TypeError, match=r"w: items \(missing \['b/1'\], unexpected \[\]\) must have the structure"):
        specs.flatten_items("w", {"a": INT32, "b": (INT32, INT32)}, {"a": 1, "b": (2,)})
    with pytest.raises(TypeError, match=r"w: items \(.*\) must have the structure of data_spec \{'a': 'int32'"):
        specs.flatten_items("w", NEST_SPEC, [1, 2])


def test_sequence_types_may_differ():
    assert specs.flatten_items("w", Pair(INT32, (INT32, BOOL)), [4, [5, 6]]) == [4, 5, 6]
    assert specs.flatten_items("w", {"p": Pair(INT32, BOOL)}, {"p": (3, 4)}) == [3, 4]
