"""No sample waits on a TF buffer's mutex, and iterators dropped while writers add lose and tear nothing.

TensorFlow's `MutexLock` marks its mutex free when a waiter is cancelled
while another holds it, and dropping a dataset iterator cancels the map calls
it has in flight. So no op a sample runs (a `get_next` in a graph, every
element of `as_dataset`, the deterministic pass) may wait on the buffer's
mutex: a sample a write may have torn is drawn again instead. The graphs
are checked for the op itself; the soak runs the user pattern that lost items
before (collectors adding while iterators are made, read once and dropped).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPEC, decode, make_items

import tfreplay

LOCK_OPS = {"MutexLock", "MutexLockIdentity", "ConsumeMutexLock"}


def op_types(concrete) -> set:
    """Every op type in a concrete function's graph and in every function of its library."""
    graph_def = concrete.graph.as_graph_def()
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types |= {node.op for node in function.node_def}
    return types


def tf_buffer(kind: str, length: int = 64):
    if kind == "uniform":
        return tfreplay.TFUniformReplayBuffer(SPEC, 2, length, seed=0)
    if kind == "prioritized":
        return tfreplay.TFPrioritizedReplayBuffer(SPEC, 2, length, seed=0)
    if kind == "episodes":
        spec = {**SPEC, "step_type": tf.TensorSpec([], tf.int32)}
        return tfreplay.TFUniformReplayBuffer(spec, 2, length, seed=0, within_episodes=True)
    spec = tfreplay.frame_data_spec((2, 3))
    return tfreplay.TFFrameReplayBuffer(spec, 2, length, history_len=2, seed=0)


def items_for(kind: str, step: int) -> dict:
    if kind == "frames":
        first = np.full([2], step % 5 == 0)
        return {
            "frame": np.full([2, 2, 3], step % 250, np.uint8),
            "first": first,
            "action": np.zeros([2], np.int32),
            "reward": np.zeros([2], np.float32),
            "terminated": np.zeros([2], bool),
            "truncated": np.zeros([2], bool),
        }
    items = make_items(step * 2 + np.arange(2))
    if kind == "episodes":
        items["step_type"] = np.full([2], 0 if step % 4 == 0 else 1, np.int32)
    return items


KINDS = ["uniform", "prioritized", "episodes", "frames"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [4, 4096])  # a small sample and one large enough to allow writes beside it
def test_no_sample_graph_waits_on_the_buffer_mutex(kind, size):
    rb = tf_buffer(kind, length=2048)
    for step in range(10):
        rb.add_batch(items_for(kind, step))
    num_steps = None if kind == "prioritized" else 2
    get_next = tf.function(lambda: rb.get_next(size, num_steps=num_steps)).get_concrete_function()
    assert not op_types(get_next) & LOCK_OPS
    dataset = tf.function(
        lambda: rb.as_dataset(size, num_steps=num_steps).take(1).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
    ).get_concrete_function()
    assert not op_types(dataset) & LOCK_OPS
    if kind != "prioritized":  # the deterministic pass reads its elements without the lock too
        single = tf.function(
            lambda: (
                rb.as_dataset(2, num_steps=2, single_deterministic_pass=True)
                .take(1)
                .reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
            )
        ).get_concrete_function()
        assert not op_types(single) & LOCK_OPS
    # Writers still take it: two writers must never run at once.
    add = tf.function(lambda items: rb.add_batch(items)).get_concrete_function(
        tf.nest.map_structure(lambda x: tf.TensorSpec(x.shape, tf.as_dtype(x.dtype)), items_for(kind, 0))
    )
    assert "MutexLock" in op_types(add)


def run_pattern(rb, add, seconds: float, size: int, num_steps, check) -> int:
    """Three collectors call `add(collector, k)` for k = 0, 1, ... (until it returns False) while the main thread
    keeps making `as_dataset(...).prefetch(8)` iterators, reading one element and dropping them; returns how
    many iterators it dropped. `check` sees every sample."""
    stop, errors = threading.Event(), []

    def collector(i: int) -> None:
        try:
            k = 0
            while not stop.is_set() and add(i, k):
                k += 1
        except BaseException as err:  # reported on the main thread
            errors.append(err)

    threads = [threading.Thread(target=collector, args=(i,), daemon=True) for i in range(3)]
    for thread in threads:
        thread.start()
    dropped, deadline = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not errors and any(t.is_alive() for t in threads):
            iterator = iter(rb.as_dataset(size, num_steps=num_steps, num_parallel_calls=4).prefetch(8))
            check(*next(iterator))
            del iterator
            dropped += 1
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    if errors:
        raise errors[0]
    return dropped


@pytest.mark.slow
@pytest.mark.parametrize("twin", ["tf", "py"])
@pytest.mark.parametrize("prioritized", [False, True])
def test_dropping_iterators_while_collectors_add_loses_and_tears_nothing(twin, prioritized):
    """The pattern that lost inserts and returned torn samples when samples waited on the mutex (three writers,
    large samples, a prioritized buffer): every add lands, once, and every sample's items are whole."""
    length = 1 << 16  # never fills: every add stays stored
    if twin == "tf":
        cls = tfreplay.TFPrioritizedReplayBuffer if prioritized else tfreplay.TFUniformReplayBuffer
        rb = cls(SPEC, 2, length, seed=1)
    else:
        cls = tfreplay.PyPrioritizedReplayBuffer if prioritized else tfreplay.PyUniformReplayBuffer
        rb = cls(SPEC, batch_size=2, max_length=length, seed=1)
    rb.add_batch(make_items((3 << 20) + np.arange(2)))
    per_collector = (length - 1) // 3
    added = [[] for _ in range(3)]

    def add(collector: int, k: int) -> bool:
        if k == per_collector:
            return False
        values = (collector << 20) + 2 * k + np.arange(2)  # each add's items tell its collector and number
        rb.add_batch(make_items(values))
        added[collector].append(values)
        return True

    def check(items, info) -> None:
        decode(items)  # raises if an item's leaves come from different writes

    dropped = run_pattern(rb, add, 20.0, 2048, None, check)
    assert dropped > 5
    want = np.sort(np.concatenate([(3 << 20) + np.arange(2), *[v for a in added for v in a]]))
    assert int(rb.num_frames()) == want.size
    np.testing.assert_array_equal(np.sort(decode(rb.gather_all()).reshape(-1)), want)
