"""`tfreplay.compat.tf_agents`: TF-Agents' signatures and returns over tfreplay's buffers (no TF-Agents needed).

TF-Agents' own tests run against this namespace in the compatibility lane
(`make test-compat`, `tests/compat/`); these pin the differences from the main
classes and the choices the README lists.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPEC, decode, make_items

from tfreplay.compat.tf_agents.replay_buffers import py_uniform_replay_buffer, replay_buffer, tf_uniform_replay_buffer

TFCompat = tf_uniform_replay_buffer.TFUniformReplayBuffer
PyCompat = py_uniform_replay_buffer.PyUniformReplayBuffer
LIST_SPEC = [tf.TensorSpec([2], tf.float32), [tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int32)]]


def list_items(values) -> list:
    values = np.asarray(values, np.int64)
    return [np.stack([values, values], -1).astype(np.float32), [values, values.astype(np.int32)]]


def test_import_tfreplay_loads_no_compat_module():
    code = "import sys, tfreplay; print(sorted(m for m in sys.modules if m.startswith('tfreplay.compat')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_constructors_take_tf_agents_signatures():
    names = list(inspect.signature(TFCompat.__init__).parameters)[1:10]
    assert names == [
        "data_spec",
        "batch_size",
        "max_length",
        "scope",
        "device",
        "table_fn",
        "dataset_drop_remainder",
        "dataset_window_shift",
        "stateful_dataset",
    ]
    assert list(inspect.signature(PyCompat.__init__).parameters)[1:3] == ["data_spec", "capacity"]
    assert list(inspect.signature(TFCompat.as_dataset).parameters)[1:5] == [
        "sample_batch_size",
        "num_steps",
        "num_parallel_calls",
        "single_deterministic_pass",
    ]
    rb = TFCompat(SPEC, 2, 4, "rb", "cpu:*", None, True)  # table_fn sixth, then dataset_drop_remainder
    assert rb.scope == "rb" and rb.table_fn is None and rb.batch_size == 2
    assert isinstance(rb, replay_buffer.ReplayBuffer) and isinstance(PyCompat(SPEC, 4), replay_buffer.ReplayBuffer)


def test_a_table_fn_other_than_tf_agents_table_is_refused():
    with pytest.raises(ValueError, match=r"TFUniformReplayBuffer: table_fn \(.*\) must be None or TF-Agents' table"):
        TFCompat(SPEC, 2, 4, table_fn=lambda spec, capacity: None)


def test_list_specs_come_back_as_lists_and_the_spec_as_given():
    rb = TFCompat(LIST_SPEC, 2, 4)
    assert rb.data_spec is LIST_SPEC
    rb.add_batch(list_items([0, 1]))
    items, info = rb.get_next(3)
    assert isinstance(items, list) and isinstance(items[1], list)
    np.testing.assert_array_equal(items[1][0], info.ids)
    steps, _ = rb.get_next(3, num_steps=1, time_stacked=False)
    assert isinstance(steps, tuple) and isinstance(steps[0], list)
    assert isinstance(rb.gather_all(), list)


def test_py_compat_returns_items_alone_from_get_next_and_as_dataset():
    rb = PyCompat(SPEC, 8)
    rb.add_batch(make_items(np.arange(5)))
    assert decode(rb.get_next(4, num_steps=2)).shape == (4, 2)
    first, second = rb.get_next(num_steps=2, time_stacked=False)
    assert int(decode(second)) == int(decode(first)) + 1
    element = next(iter(rb.as_dataset(3, num_steps=2)))
    assert isinstance(element, dict) and decode(element).shape == (3, 2)


def test_py_compat_takes_integer_arrays_whose_values_fit_and_refuses_lossy_ones():
    rb = PyCompat(tf.TensorSpec([], tf.int32), 4)
    rb.add_batch(np.array([0, 7]))  # int64, as NumPy makes it
    assert sorted(rb.gather_all().reshape(-1).tolist()) == [0, 7]
    with pytest.raises(TypeError, match=r"add_batch: <item> has dtype int64; the spec expects int32"):
        rb.add_batch(np.array([2**40]))
    with pytest.raises(TypeError, match=r"add_batch: <item> has dtype float64; the spec expects int32"):
        rb.add_batch(np.array([1.0]))
    assert rb.size == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sample_batch_size=3), r"sample_batch_size \(3\) must be at most batch_size \(2\)"),
        (dict(num_steps=5), r"num_steps \(5\) must be at most max_length \(4\)"),
    ],
    ids=["sample_batch_size", "num_steps"],
)
def test_a_deterministic_pass_that_would_drop_everything_is_refused(kwargs, message):
    rb = TFCompat(SPEC, 2, 4, dataset_drop_remainder=True)
    with pytest.raises(ValueError, match=f"as_dataset: {message} with dataset_drop_remainder=True; otherwise ALL"):
        rb.as_dataset(single_deterministic_pass=True, **kwargs)


def test_tf_agents_private_helpers_count_adds_and_clear_every_variable():
    rb = TFCompat(SPEC, 2, 4)
    assert int(rb._get_last_id()) == -1
    for t in range(3):
        rb.add_batch(make_items([2 * t, 2 * t + 1]))
    assert int(rb._get_last_id()) == 2
    storage = [v for v in rb.variables() if v.shape.rank and v.shape[0] == rb.capacity]  # a row per item
    assert len(storage) == len(tf.nest.flatten(SPEC)) and all(np.any(v.numpy()) for v in storage)
    rb._clear(clear_all_variables=True)
    assert int(rb._get_last_id()) == -1 and int(rb.num_frames()) == 0
    assert all(not np.any(v.numpy()) for v in storage)
