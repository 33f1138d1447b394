"""TF-Agents' replay-buffer tutorial (docs/tutorials/5_replay_buffers_tutorial.ipynb), its buffer work with the
imports switched to `tfreplay.compat.tf_agents`: a TF buffer of a nested spec filled, sampled, read as a
dataset and gathered; a NumPy buffer built from the same spec through `specs.tensor_spec.to_nest_array_spec`.
Written from what the tutorial does, with the results it prints checked."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfreplay.compat.tf_agents import specs
from tfreplay.compat.tf_agents.replay_buffers import py_uniform_replay_buffer, tf_uniform_replay_buffer
from tfreplay.compat.tf_agents.specs import tensor_spec

# The tutorial's item: an action beside a (lidar, camera) pair; 32 parallel writers, 1000 steps each.
DATA_SPEC = (
    tf.TensorSpec([3], tf.float32, "action"),
    (tf.TensorSpec([5], tf.float32, "lidar"), tf.TensorSpec([3, 2], tf.float32, "camera")),
)
BATCH_SIZE, MAX_LENGTH = 32, 1000


def tutorial_batch(step: int = 0) -> tuple:
    """Every writer's item: action all 1, lidar all 2, camera all 3 (the tutorial's), plus `step`."""
    values = tf.nest.map_structure(
        lambda spec, fill: tf.fill(spec.shape, fill + float(step)), DATA_SPEC, (1.0, (2.0, 3.0))
    )
    return tf.nest.map_structure(lambda t: tf.stack([t] * BATCH_SIZE), values)


def shapes(nest) -> list:
    return [tuple(t.shape) for t in tf.nest.flatten(nest)]


def test_the_tutorials_tf_buffer_adds_samples_streams_and_gathers():
    rb = tf_uniform_replay_buffer.TFUniformReplayBuffer(DATA_SPEC, batch_size=BATCH_SIZE, max_length=MAX_LENGTH)
    for step in range(6):  # one add, then five more before reading
        rb.add_batch(tutorial_batch(step))
    assert int(rb.num_frames()) == 6 * BATCH_SIZE

    sample, _ = rb.get_next(sample_batch_size=10, num_steps=1)
    assert shapes(sample) == [(10, 1, 3), (10, 1, 5), (10, 1, 3, 2)]
    action, lidar, camera = (t.numpy() for t in tf.nest.flatten(sample))
    step = action[:, 0, 0] - 1.0  # which add each sampled item came from
    assert set(step) <= set(range(6))
    np.testing.assert_array_equal(lidar, np.broadcast_to((step + 2.0)[:, None, None], (10, 1, 5)))
    np.testing.assert_array_equal(camera, np.broadcast_to((step + 3.0)[:, None, None, None], (10, 1, 3, 2)))

    iterator = iter(rb.as_dataset(sample_batch_size=4, num_steps=2))
    for _ in range(3):
        trajectories, _ = next(iterator)
        assert shapes(trajectories) == [(4, 2, 3), (4, 2, 5), (4, 2, 3, 2)]
        first = trajectories[0].numpy()[:, :, 0]
        np.testing.assert_array_equal(first[:, 1] - first[:, 0], np.ones(4))  # two consecutive adds

    gathered = rb.gather_all()
    assert shapes(gathered) == [(BATCH_SIZE, 6, 3), (BATCH_SIZE, 6, 5), (BATCH_SIZE, 6, 3, 2)]
    np.testing.assert_array_equal(gathered[0].numpy()[:, :, 0], np.tile(np.arange(6) + 1.0, (BATCH_SIZE, 1)))


def test_the_tutorials_numpy_buffer_takes_the_array_specs_of_the_same_item():
    array_specs = tensor_spec.to_nest_array_spec(DATA_SPEC)
    assert array_specs == (
        specs.ArraySpec((3,), np.float32, "action"),
        (specs.ArraySpec((5,), np.float32, "lidar"), specs.ArraySpec((3, 2), np.float32, "camera")),
    )
    assert [s.name for s in tf.nest.flatten(array_specs)] == ["action", "lidar", "camera"]
    rb = py_uniform_replay_buffer.PyUniformReplayBuffer(capacity=1000 * 32, data_spec=array_specs)
    assert rb.data_spec is array_specs and rb.capacity == 32_000

    for step in range(3):
        rb.add_batch(tf.nest.map_structure(lambda t: t.numpy(), tutorial_batch(step)))
    assert int(rb.num_frames()) == 3 * BATCH_SIZE
    items = rb.get_next(sample_batch_size=10, num_steps=2)
    assert shapes(items) == [(10, 2, 3), (10, 2, 5), (10, 2, 3, 2)]
    assert all(array_specs[0].check_array(row) for row in items[0][:, 0])
    (batch,) = rb.as_dataset(sample_batch_size=4).take(1)
    assert shapes(batch) == [(4, 3), (4, 5), (4, 3, 2)]
    gathered = rb.gather_all()
    assert set(np.unique(gathered[0])) == {1.0, 2.0, 3.0} and gathered[0].size == 3 * BATCH_SIZE * 3


def test_array_specs_convert_both_ways_and_refuse_an_unknown_dimension():
    back = tensor_spec.to_nest_tensor_spec(tensor_spec.to_nest_array_spec(DATA_SPEC))
    assert back == DATA_SPEC and [s.name for s in tf.nest.flatten(back)] == ["action", "lidar", "camera"]
    spec = specs.ArraySpec.from_array(np.zeros([2, 4], np.int64), "frame")
    assert (spec.shape, spec.dtype, spec.name) == ((2, 4), np.dtype(np.int64), "frame")
    assert spec == specs.ArraySpec([2, 4], "int64") and spec != specs.ArraySpec([2, 4], np.int32)
    assert spec.check_array(np.ones([2, 4], np.int64)) and not spec.check_array(np.ones([2, 4], np.int32))
    with pytest.raises(ValueError, match=r"to_array_spec: shape of obs \(\(None, 4\)\) must be fully defined"):
        tensor_spec.to_array_spec(tf.TensorSpec([None, 4], tf.float32, "obs"))
    with pytest.raises(TypeError, match=r"to_array_spec: spec \(3\) must be a tf.TensorSpec or an ArraySpec"):
        tensor_spec.to_array_spec(3)
    with pytest.raises(ValueError, match=r"ArraySpec: shape \(\(2, -1\)\) must have known, non-negative dimensions"):
        specs.ArraySpec((2, -1), np.float32)
