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

import os
import threading

import numpy as np
import pytest
import tensorflow as tf
from helpers import KINDS, SPEC, make_items, quick

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


GRAPH_KINDS = ["uniform", "prioritized", "episodes", "frames"]


@pytest.mark.parametrize("kind", GRAPH_KINDS)
@pytest.mark.parametrize("size", quick([4, 4096], 4096))  # a small sample and one large enough for writes beside it
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


# Iterators made, read once and dropped per buffer (a count, not a time); raise it for a longer soak.
SOAK_ITERATORS = int(os.environ.get("TFREPLAY_SOAK_ITERATORS", "2"))


def run_pattern(rb, add, size: int, check, cycles: int = SOAK_ITERATORS, also=None) -> int:
    """Three collectors call `add()` in turn while the main thread makes `cycles` `as_dataset(...).prefetch(8)`
    iterators, reading one element of each and dropping it, calling `also()` after each; returns how many
    iterators it dropped. `check` sees every element read."""
    stop, errors = threading.Event(), []

    def collector() -> None:
        try:
            while not stop.is_set():
                add()
        except BaseException as err:  # reported on the main thread
            errors.append(err)

    threads = [threading.Thread(target=collector, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    dropped = 0
    try:
        while dropped < cycles and not errors:
            iterator = iter(rb.as_dataset(size, num_parallel_calls=4).prefetch(8))
            check(*next(iterator))
            del iterator
            dropped += 1
            if also is not None:
                also()
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    if errors:
        raise errors[0]
    return dropped


def soaked(name: str):
    """`(buffer, add, check)` of the soak: collectors that take turns, so step k lands in ring row k (the
    model's layout), and a check that raises if an item's leaves come from different writes or another id."""
    kind, batch_size, max_length = KINDS[name], 2, 256  # small enough to wrap many times
    rb = kind.make(batch_size, max_length, seed=1)
    lock, num_adds = threading.Lock(), [0]

    def add() -> None:
        with lock:  # samples do not wait for it
            k = num_adds[0]
            rb.add_batch(kind.items(k * batch_size + np.arange(batch_size), batch_size))
            num_adds[0] = k + 1

    def check(items, info) -> None:
        np.testing.assert_array_equal(kind.decode(items, batch_size).reshape(-1), np.asarray(info.ids).reshape(-1))

    def check_all() -> int:  # every add landed once, in its own rows; returns how many
        want = kind.all_ids(batch_size, max_length, num_adds[0])
        np.testing.assert_array_equal(kind.decode(rb.gather_all(), batch_size), want)
        return num_adds[0]

    add()
    return rb, add, check, check_all


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KINDS))
def test_dropping_iterators_while_collectors_add_loses_and_tears_nothing(name):
    """The pattern that lost inserts and returned torn samples when samples waited on the mutex (three writers,
    samples large enough to overlap their writes): every add lands once, in its own rows, and every sample's
    items are whole and the ones its ids name. `TFREPLAY_SOAK_ITERATORS` sets how many iterators each buffer
    drops."""
    rb, add, check, check_all = soaked(name)
    dropped = run_pattern(rb, add, 1024, check)
    assert dropped == SOAK_ITERATORS
    print(f"{name}: {check_all()} adds of 2 whole, {dropped} iterators dropped, none torn")  # with -s


# The compiled loop on the plain TF buffer and on the one that is both prioritized and of frames: between them
# they take every TF sampling path (a compile each costs most of the test).
@pytest.mark.slow
@pytest.mark.parametrize("name", ["tf-uniform", "tf-prioritized-frame"])
def test_dropping_iterators_beside_compiled_train_loop_calls_loses_and_tears_nothing(name):
    """The same pattern with XLA samples as well: after each dropped iterator a `TrainLoop(jit_compile=True)`
    call draws 4 samples of 64, which hold the buffer's lock while the collectors add. Sized by count:
    `TFREPLAY_SOAK_ITERATORS` iterators dropped and compiled calls."""
    rb, add, check, check_all = soaked(name)
    prioritized = hasattr(rb, "update_priorities")

    def step(items, info):
        return ((items, info.ids), None) if prioritized else (items, info.ids)

    loop = tfreplay.TrainLoop(rb, step, 4, 64, metrics="stack", jit_compile=True)
    calls = [0]

    def compiled() -> None:
        items, ids = loop()
        flat = tf.nest.map_structure(lambda x: tf.reshape(x, [-1, *x.shape[2:]]), items)  # [steps * 64, ...]
        check(flat, tfreplay.BufferInfo(ids, None))
        calls[0] += 1

    dropped = run_pattern(rb, add, 1024, check, also=compiled)
    assert dropped == calls[0] == SOAK_ITERATORS
    print(f"{name}: {check_all()} adds of 2 whole, {dropped} iterators dropped, {calls[0]} compiled calls, none torn")
