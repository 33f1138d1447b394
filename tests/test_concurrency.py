"""Writers and readers on several threads: no torn item, no stray item, no lost item.

Every leaf of an item carries the item's payload (see helpers), so a row
assembled from two writes shows as leaves that disagree. The buffers are
large enough never to overwrite, so a row never changes once written: each
sample must show exactly what the final buffer holds at the sampled id.
"""

import sys
import threading

import numpy as np
import pytest
from helpers import SPEC, decode, make_items, run_threads

from tfreplay import PyUniformReplayBuffer, TFUniformReplayBuffer

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
