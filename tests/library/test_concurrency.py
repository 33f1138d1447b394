"""Writers and readers on several threads: no torn item, no stray item, no lost item.

Every leaf of an item carries the item's payload (see helpers), so a row
assembled from two writes shows as leaves that disagree. The buffers are
large enough never to overwrite, so a row never changes once written: each
sample must show exactly what the final buffer holds at the sampled id.
"""

import itertools
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPEC, decode, make_items, run_threads

from tfreplay import PyUniformReplayBuffer, Sequences, TFUniformReplayBuffer
from tfreplay._src.twin_tf import locked_call, tf_exclusive

WRITERS, ADDS_PER_WRITER, ROWS = 3, 150, 4
PREFILL = 4_000_000 + np.arange(2 * ROWS)  # payloads added before the threads start (two per segment)


def make_buffer(kind: str, max_length: int = 2 + WRITERS * ADDS_PER_WRITER):
    if kind == "tf":
        return TFUniformReplayBuffer(SPEC, batch_size=ROWS, max_length=max_length, seed=0)
    if kind == "py":
        return PyUniformReplayBuffer(SPEC, batch_size=ROWS, max_length=max_length, seed=0)
    return PyUniformReplayBuffer(SPEC, ROWS * max_length, seed=0)  # one ring, any batch size


@pytest.fixture(autouse=True)
def frequent_thread_switches():
    """Switch threads every microsecond, so an unguarded write is caught halfway."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.parametrize("kind", ["tf", "py", "py-capacity"])
def test_concurrent_writers_and_readers(kind):
    rb = make_buffer(kind)
    for batch in PREFILL.reshape(2, ROWS):
        rb.add_batch(make_items(batch))
    rb.get_next(16, num_steps=2)  # trace before the threads start
    writers_done = threading.Event()
    samples = []  # (ids, payloads) pairs, from every reader

    def writer(w):
        def write():
            for k in range(ADDS_PER_WRITER):
                rb.add_batch(make_items((w * ADDS_PER_WRITER + k) * ROWS + np.arange(ROWS)))

        return write

    def reader(draw):
        def read():
            reads = 0
            while not writers_done.is_set() or reads < 5:
                items, info = draw()
                samples.append((np.asarray(info.ids), decode(items)))  # decode: no torn item
                reads += 1

        return read

    iterator = iter(rb.as_dataset(16, num_steps=2, num_parallel_calls=2))
    readers = [reader(lambda: rb.get_next(16, num_steps=2)), reader(lambda: rb.get_next(8)), reader(iterator.__next__)]

    def writers():
        run_threads([writer(w) for w in range(WRITERS)])
        writers_done.set()

    run_threads([writers] + readers)

    everything = decode(rb.gather_all())
    written = np.concatenate([PREFILL, np.arange(WRITERS * ADDS_PER_WRITER * ROWS)])
    assert sorted(everything.ravel().tolist()) == sorted(written.tolist()), "an item was lost or duplicated"
    assert int(rb.num_frames()) == written.size
    payload_at = everything.T.ravel()  # gather_all is [segment, time]; global id = time * segments + segment
    assert len(samples) >= 15
    for ids, payloads in samples:
        np.testing.assert_array_equal(payload_at[ids], payloads)
        if ids.ndim == 2:
            segments = rb.batch_size
            assert (np.diff(ids, axis=-1) == segments).all(), "a window is not consecutive in one segment"


@pytest.mark.parametrize("kind", ["tf", "py", "py-capacity"])
def test_concurrent_writers_with_wrap_around_never_tear_items(kind):
    """With overwrites, items still come whole, and only written payloads come back."""
    rb = make_buffer(kind, max_length=5)
    rb.add_batch(make_items(PREFILL[:ROWS]))
    rb.get_next(32)
    done = threading.Event()
    seen = []

    def write(w):
        for k in range(ADDS_PER_WRITER):
            rb.add_batch(make_items((w * ADDS_PER_WRITER + k) * ROWS + np.arange(ROWS)))

    def writers():
        run_threads([lambda w=w: write(w) for w in range(WRITERS)])
        done.set()

    def read():
        while not done.is_set():
            seen.append(decode(rb.get_next(32)[0]))

    run_threads([writers, read, read])
    seen = np.concatenate(seen + [decode(rb.gather_all()).ravel()])
    assert set(seen.tolist()) <= set(range(WRITERS * ADDS_PER_WRITER * ROWS)) | set(PREFILL[:ROWS].tolist())


@pytest.mark.slow
@pytest.mark.parametrize("size", [64, 4096], ids=["small", "large"])
def test_tf_samples_show_the_items_their_ids_name_while_a_writer_wraps_around(size):
    """A large TF sample reads its rows unlocked; one that a write may have overwritten meanwhile is drawn again.

    One writer adds payload == global id, so a whole sample's payloads equal its ids exactly: a row
    overwritten during the read shows the newer item (its id plus the capacity). 4,096 windows of two
    items are over 256 KiB (`twin_tf.UNLOCKED_READ_BYTES`): read outside the lock; 64 are read inside."""
    rb = make_buffer("tf", max_length=3)
    for k in range(2):
        rb.add_batch(make_items(k * ROWS + np.arange(ROWS)))
    done = threading.Event()
    samples = []

    def write():
        for k in range(2, 400):
            rb.add_batch(make_items(k * ROWS + np.arange(ROWS)))
        done.set()

    def reader(draw):
        def read():
            while not done.is_set():
                items, info = draw()
                samples.append((np.asarray(info.ids), decode(items)))

        return read

    in_graph = tf.function(lambda: rb.get_next(size, num_steps=2))
    iterator = iter(rb.as_dataset(size, num_steps=2, num_parallel_calls=4))
    draws = [lambda: rb.get_next(size, num_steps=2), in_graph, iterator.__next__, lambda: rb.get_next(2 * size)]
    for draw in draws:
        draw()  # traced before the writer starts
    run_threads([write] + [reader(draw) for draw in draws])
    assert len(samples) >= 20
    for ids, payloads in samples:
        np.testing.assert_array_equal(payloads, ids)


@pytest.mark.slow
def test_tf_episode_windows_drawn_unlocked_stay_whole_while_a_writer_wraps_around():
    """Small samples through the episode index draw and read without the lock, and are drawn again under it when
    a write started meanwhile. One writer adds payload == global id in episodes of 4 items (a ring of 7), so a
    whole window shows its first id plus one segment stride per step, inside one episode; a draw that read the
    index halfway through a write, or rows overwritten after it, would show other payloads."""
    episode, n = 4, 3
    rb = TFUniformReplayBuffer({**SPEC, "step_type": tf.TensorSpec([], tf.int32)}, batch_size=ROWS, max_length=7)

    def add(k):
        step_type = np.full([ROWS], 0 if k % episode == 0 else 1, np.int32)
        rb.add_batch({**make_items(k * ROWS + np.arange(ROWS)), "step_type": step_type})

    for k in range(episode):
        add(k)
    done = threading.Event()
    samples = []

    def write():
        for k in range(episode, 600):
            add(k)
        done.set()

    def reader(draw):
        def read():
            while not done.is_set():
                window, info = draw()
                samples.append(
                    (np.asarray(info.ids), np.asarray(window.mask), tf.nest.map_structure(np.asarray, window.items))
                )

        return read

    strict, padded = Sequences(n), Sequences(n, pad=True)
    iterator = iter(rb.as_dataset(16, transform=strict, num_parallel_calls=2))
    draws = [
        lambda: rb.get_next(16, transform=strict),
        tf.function(lambda: rb.get_next(16, transform=padded)),
        iterator.__next__,
    ]
    for draw in draws:
        draw()  # traced before the writer starts
    run_threads([write] + [reader(draw) for draw in draws])
    assert len(samples) >= 30
    for ids, mask, items in samples:
        assert (mask[:, 0] & (np.diff(mask.astype(int), axis=1) <= 0).all(1)).all(), "a mask is not a prefix"
        expected = ids[:, None] + ROWS * np.arange(n)
        np.testing.assert_array_equal(decode(tf.nest.map_structure(lambda x, m=mask: x[m], items)), expected[mask])
        local = np.where(mask, expected // ROWS, expected[:, :1] // ROWS)
        assert (local // episode == local[:, :1] // episode).all(), "a window crosses an episode boundary"


# The TF buffers' lock: released on every path, never left to the garbage collector.

_lock_names = itertools.count()


def fresh_lock() -> tf.CriticalSection:
    """A critical section of its own: eagerly, unnamed ones all share one mutex (TF's default shared_name)."""
    return tf.CriticalSection(shared_name=f"test_concurrency_{next(_lock_names)}")


def lock_is_free(lock: tf.CriticalSection, timeout: float = 10.0) -> bool:
    """Whether a graph function on another thread gets through `lock` within `timeout` seconds."""
    enter = tf.function(lambda: lock.execute(lambda: tf.constant(0)))
    entered = threading.Event()
    threading.Thread(target=lambda: (enter(), entered.set()), daemon=True).start()
    return entered.wait(timeout)


def test_an_interrupted_eager_critical_section_frees_the_lock_at_once():
    lock = fresh_lock()

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as kept:  # keeps the traceback, so every frame of the call, alive
        tf_exclusive(lock, interrupted)
    assert lock_is_free(lock), "the mutex stays held while the interrupted section's traceback lives"
    assert kept.value is not None


def test_a_locked_call_failing_inside_a_function_frees_the_lock():
    lock = fresh_lock()
    fail = tf.function(lambda: locked_call(lock, lambda: tf.debugging.check_numerics(tf.constant(np.nan), "nan")))
    with pytest.raises(tf.errors.InvalidArgumentError, match="nan"):
        fail()
    assert lock_is_free(lock)


def test_locked_call_refuses_to_run_eagerly():
    # Eagerly a Python object would hold the mutex; callers trace it into a concrete function instead.
    with pytest.raises(RuntimeError, match="locked_call: called eagerly; trace it into a concrete function"):
        locked_call(fresh_lock(), lambda: tf.constant(0))


@pytest.mark.xfail(
    strict=True,
    reason="TensorFlow's MutexLock: a waiter cancelled while another holds the mutex marks it free "
    "(mutex_ops.cc sets locked_ = !cancelled), so dropping a dataset iterator whose map calls wait "
    "for a TF buffer's lock lets a second caller in beside the holder",
)
def test_dropping_an_iterator_whose_calls_wait_for_a_lock_keeps_it_held():
    lock = fresh_lock()
    v = tf.Variable(0)
    waiting = tf.data.Dataset.range(10**9).map(lambda _: lock.execute(v.read_value), num_parallel_calls=4)
    iterator = iter(waiting.prefetch(100_000))  # a buffer it never fills: map calls are always running
    next(iterator)
    held = tf.raw_ops.MutexLock(mutex=lock._handle)  # from now on the running map calls wait
    time.sleep(0.2)
    del iterator  # cancels them
    try:
        assert not lock_is_free(lock, timeout=3.0), "a second caller entered while the lock was held"
    finally:
        del held  # lets the second caller finish
