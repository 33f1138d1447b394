"""What TF-Agents code relies on in the main buffer classes (TF-Agents 0.19's replay-buffer API).

v1 graphs with any spec path, any name-scope string as `scope`, `variables()`
as a method, the NumPy buffer's `size`, integer scalar tensors as sizes, and a
TF-Agents checkpoint refused with a pointer to the migration. The compat
namespace (`tfreplay.compat.tf_agents`) has its own tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPEC, decode, make_items

from tfreplay import PyUniformReplayBuffer, TFPrioritizedReplayBuffer, TFUniformReplayBuffer

ODD_PATHS = {"my obs": tf.TensorSpec([2], tf.float32), "<a>": tf.TensorSpec([], tf.int64)}


def odd_items(values) -> dict:
    values = np.asarray(values, np.int64)
    return {"my obs": np.stack([values, -values], -1).astype(np.float32), "<a>": values}


@pytest.mark.parametrize(
    "spec, items, read",
    [
        (tf.TensorSpec([], tf.int64), lambda v: np.asarray(v, np.int64), lambda x: x),
        (ODD_PATHS, odd_items, lambda x: x["<a>"]),
    ],
    ids=["bare-spec", "keys-that-are-no-tf-names"],
)
def test_a_v1_graph_buffer_takes_any_spec_path_and_initializes_from_variables(spec, items, read):
    with tf.Graph().as_default():
        rb = TFUniformReplayBuffer(spec, batch_size=2, max_length=4, seed=0)
        add = rb.add_batch(tf.nest.map_structure(tf.constant, items([7, 8])))
        sample, info = rb.get_next(sample_batch_size=16)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.variables_initializer(list(rb.variables())))  # nothing else to initialize
            sess.run(add)
            got, ids = sess.run((sample, info.ids))
    np.testing.assert_array_equal(read(got), ids + 7)
    if isinstance(spec, dict):
        np.testing.assert_array_equal(got["my obs"], odd_items(ids + 7)["my obs"])


@pytest.mark.parametrize("make", [TFUniformReplayBuffer, TFPrioritizedReplayBuffer])
def test_v1_graph_ops_of_add_and_clear_do_their_writes_when_run(make):
    """A v1 session runs only what the fetched op depends on: `add_batch` and `clear` must carry their writes."""
    with tf.Graph().as_default():
        rb = make(SPEC, 2, 4, seed=0)
        add = rb.add_batch(make_items([3, 4]))
        frames, clear = rb.num_frames(), rb.clear()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.variables_initializer(list(rb.variables())))
            sess.run(add)
            sess.run(add)
            assert sess.run(frames) == 4
            sess.run(clear)
            assert sess.run(frames) == 0


@pytest.mark.parametrize("scope", ["agent/replay-buffer", "1st_buffer", "rb.v2"])
def test_scope_may_be_any_name_scope_string(scope):
    rb = TFUniformReplayBuffer(SPEC, 2, 4, scope=scope, seed=0)
    assert rb.scope == scope
    assert all(v.name.startswith(f"{scope}/") for v in rb.variables())
    rb.add_batch(make_items([0, 1]))
    assert sorted(decode(rb.get_next(32)[0]).tolist())[-1] <= 1
    assert decode(tf.function(lambda: rb.get_next(4)[0])()).shape == (4,)


def test_variables_is_a_method_and_the_module_properties_still_work():
    rb = TFUniformReplayBuffer(SPEC, 2, 4, seed=0)
    variables = rb.variables()
    assert isinstance(variables, tuple) and variables
    assert all(isinstance(v, tf.Variable) and not v.trainable for v in variables)
    assert rb.trainable_variables == ()
    assert {v.ref() for v in rb.non_trainable_variables} <= {v.ref() for v in variables}
    assert PyUniformReplayBuffer(SPEC, 8).variables() == ()


@pytest.mark.parametrize("layout", [dict(capacity=5), dict(batch_size=1, max_length=5)], ids=["ring", "segments"])
def test_py_buffer_size_is_the_number_of_stored_items(layout):
    rb = PyUniformReplayBuffer(SPEC, **layout)
    assert rb.size == 0
    rb.add_batch(make_items([0]))
    rb.add_batch(make_items([1]))
    assert rb.size == 2
    for i in range(2, 9):
        rb.add_batch(make_items([i]))
    assert rb.size == 5 == rb.num_frames()
    rb.clear()
    assert rb.size == 0


SIZES = [tf.constant, lambda n: tf.constant(n, tf.int64), np.int64]


@pytest.mark.parametrize("size", SIZES, ids=["int32-tensor", "int64-tensor", "numpy-int"])
def test_sizes_may_be_integer_scalars_of_any_kind(buffer_cls, size):
    rb = buffer_cls(SPEC, batch_size=2, max_length=4)
    for t in range(3):
        rb.add_batch(make_items([2 * t, 2 * t + 1]))
    items, info = rb.get_next(size(5), size(2))
    assert decode(items).shape == (5, 2) and np.asarray(info.ids).shape == (5, 2)
    items, info = next(iter(rb.as_dataset(size(3), num_steps=size(2))))
    assert decode(items).shape == (3, 2)


def test_a_constant_size_works_inside_tf_function_and_an_unknown_one_is_refused():
    rb = TFUniformReplayBuffer(SPEC, 2, 4, seed=0)
    rb.add_batch(make_items([0, 1]))
    assert decode(tf.function(lambda: rb.get_next(tf.constant(6))[0])()).shape == (6,)

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def sample(n):
        return rb.get_next(n)[0]

    with pytest.raises(ValueError, match=r"get_next: sample_batch_size \(.*\) must have a value known when the sample"):
        sample(tf.constant(3))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sample_batch_size=tf.constant(2.0)), r"sample_batch_size \(.*\) must be an integer scalar; got float32"),
        (dict(num_steps=tf.constant([2])), r"num_steps \(.*\) must be an integer scalar; got int32\(1,\)"),
        (dict(sample_batch_size=tf.constant(0)), r"sample_batch_size \(0\) must be a positive integer"),
    ],
    ids=["float", "vector", "zero"],
)
def test_bad_tensor_sizes_are_refused(buffer_cls, kwargs, message):
    rb = buffer_cls(SPEC, batch_size=2, max_length=4)
    rb.add_batch(make_items([0, 1]))
    with pytest.raises(ValueError, match=f"get_next: {message}"):
        rb.get_next(**kwargs)


class TFAgentsLikeTable(tf.Module):
    def __init__(self):
        super().__init__()
        self._storage = {"obs": tf.Variable(tf.ones([8, 3]))}


class TFAgentsLikeBuffer(tf.Module):
    """What a TF-Agents TFUniformReplayBuffer saves under its key: a data table, an id table, a last id."""

    def __init__(self):
        super().__init__()
        self._data_table = TFAgentsLikeTable()
        self._last_id = tf.Variable(3, dtype=tf.int64)


def test_restoring_a_tf_agents_checkpoint_points_to_the_migration_and_changes_nothing(buffer_cls, tmp_path):
    path = tf.train.Checkpoint(replay_buffer=TFAgentsLikeBuffer()).write(str(tmp_path / "ckpt"))
    rb = buffer_cls(SPEC, batch_size=2, max_length=4)
    rb.add_batch(make_items([0, 1]))
    with pytest.raises(ValueError, match=r"TF-Agents replay buffer's checkpoint: .*restore_tf_agents_checkpoint"):
        tf.train.Checkpoint(replay_buffer=rb).restore(path)
    assert int(rb.num_frames()) == 2
    assert sorted(decode(rb.gather_all()).reshape(-1).tolist()) == [0, 1]


class TFAgentsStandIn(tf.Module):
    """A TF-Agents TFUniformReplayBuffer's saved state (2 segments of 4 rows of SPEC), with a chosen last id."""

    def __init__(self, last_id: int):
        super().__init__()
        self._data_table, self._id_table = tf.Module(), tf.Module()
        rows = np.arange(8) % 4 * 2 + np.arange(8) // 4  # a global id per row (b * 4 + i holds add i of segment b)
        self._data_table._storage = tf.nest.map_structure(tf.Variable, make_items(rows))
        self._id_table._storage = tf.Variable(np.tile(np.arange(4), 2).astype(np.int64), shape=tf.TensorShape(None))
        self._last_id = tf.Variable(last_id, dtype=tf.int64)


@pytest.mark.parametrize("last_id", [-2, -1000])
def test_a_tf_agents_checkpoint_with_a_negative_last_id_is_refused_and_changes_nothing(buffer_cls, last_id, tmp_path):
    """A `_last_id` below -1 (no buffer writes it) emptied the buffer and reported a negative count."""
    from tfreplay.compat.tf_agents import restore_tf_agents_checkpoint

    path = tf.train.Checkpoint(replay_buffer=TFAgentsStandIn(last_id)).write(str(tmp_path / "ckpt"))
    rb = buffer_cls(SPEC, batch_size=2, max_length=4)
    rb.add_batch(make_items([0, 1]))
    with pytest.raises(ValueError, match=rf"_last_id \({last_id}\) must be -1 \(an empty buffer\) or the id"):
        restore_tf_agents_checkpoint(rb, path)
    assert sorted(decode(rb.gather_all()).reshape(-1).tolist()) == [0, 1]
