"""The benchmarks' in-graph loop: each call waits for the previous one, unless `--overlap` asks for the old loop."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import cases

CALLS = 300


def _counting_step():
    """A step whose increment is a read then a write (not atomic), recording what each call read, in call order."""
    counter = tf.Variable(0, dtype=tf.int64)
    calls = tf.Variable(0, dtype=tf.int64)  # atomic: how many calls ran, whatever their order
    seen = tf.Variable(tf.fill([CALLS], tf.constant(-1, tf.int64)))

    def step() -> tf.Tensor:
        value = counter.read_value()
        order = calls.assign_add(1) - 1
        record = seen.scatter_nd_update(tf.reshape(tf.minimum(order, CALLS - 1), [1, 1]), tf.reshape(value, [1]))
        with tf.control_dependencies([record]):
            return counter.assign(value + 1)

    return step, counter, calls, seen


def test_serialized_loop_runs_each_call_after_the_previous_one():
    step, counter, calls, seen = _counting_step()
    last = tf.function(lambda count: cases.repeat(step, count))(tf.constant(CALLS))
    assert calls.numpy() == CALLS
    # Each call read what the previous one wrote: no read overtook a write, no increment was lost.
    np.testing.assert_array_equal(seen.numpy(), np.arange(CALLS))
    assert counter.numpy() == CALLS and last.numpy() == CALLS


@pytest.mark.parametrize("overlap", [False, True])
def test_graph_loop_runs_the_step_calls_times_per_bench_call(overlap):
    step, _, calls, _ = _counting_step()
    cases.set_overlap(overlap)
    try:
        bench = cases.graph_loop(step, calls=7)
    finally:
        cases.set_overlap(False)
    bench.fn()
    bench.fn()
    assert bench.ops == 7 and calls.numpy() == 14


@pytest.mark.parametrize("module", ["run", "prioritized", "windows", "peers"])
def test_every_bench_entry_point_parses_overlap(module):
    parse_args = importlib.import_module(f"benchmarks.{module}").parse_args
    assert parse_args([]).overlap is False
    assert parse_args(["--overlap"]).overlap is True
