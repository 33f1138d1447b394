"""Rate limiting: Reverb's samples-per-insert rule, waits, timeouts, close(), and collector/learner threads.

Every wait in these tests is bounded: limiters get timeouts where a bug could
block the test thread, and threads are joined with a timeout and checked.
"""

from __future__ import annotations

import math
import threading
import time

import helpers  # noqa: F401  (quiets TF before it loads)
import numpy as np
import pytest
import tensorflow as tf

from tfreplay import (
    BufferClosedError,
    MinSize,
    PyFrameReplayBuffer,
    PyPrioritizedReplayBuffer,
    PyUniformReplayBuffer,
    RateLimiter,
    RateLimitTimeoutError,
    SampleToInsertRatio,
    TFFrameReplayBuffer,
    TFPrioritizedReplayBuffer,
    TFUniformReplayBuffer,
)

SPEC = {"id": tf.TensorSpec([], tf.int64)}
JOIN = 30.0  # seconds a thread may take to stop after close(); far above what it needs


def make(twin: str, limiter: RateLimiter | None, batch_size: int = 2, max_length: int = 64):
    if twin == "tf":
        return TFUniformReplayBuffer(SPEC, batch_size, max_length, seed=0, rate_limiter=limiter)
    return PyUniformReplayBuffer(SPEC, batch_size=batch_size, max_length=max_length, seed=0, rate_limiter=limiter)


def items(twin: str, start: int, n: int = 2):
    ids = np.arange(start, start + n, dtype=np.int64)
    return {"id": tf.constant(ids) if twin == "tf" else ids}


def fill(rb, twin: str, adds: int, batch_size: int = 2) -> None:
    for i in range(adds):
        rb.add_batch(items(twin, i * batch_size, batch_size))


def start(fn) -> tuple[threading.Thread, list]:
    """`fn` in a thread; the list receives what it raised (or 'done')."""
    out: list = []

    def run() -> None:
        try:
            fn()
            out.append("done")
        except BaseException as err:  # noqa: BLE001 (the test inspects it)
            out.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def joined(thread: threading.Thread) -> bool:
    thread.join(JOIN)
    return not thread.is_alive()


@pytest.fixture(params=["tf", "py"])
def twin(request) -> str:
    return request.param


# --- arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: SampleToInsertRatio(0, 10, 5.0), r"samples_per_insert \(0\) must be a positive number"),
        (lambda: SampleToInsertRatio(math.nan, 10, 5.0), r"samples_per_insert \(nan\) must be a positive number"),
        (lambda: SampleToInsertRatio(True, 10, 5.0), r"samples_per_insert \(True\) must be a positive number"),
        (lambda: SampleToInsertRatio(1.0, 0, 5.0), r"min_size_to_sample \(0\) must be a positive integer"),
        (lambda: SampleToInsertRatio(1.0, 2.5, 5.0), r"min_size_to_sample \(2.5\) must be a positive integer"),
        (lambda: SampleToInsertRatio(4.0, 10, 3.0), r"error range .* must be at least 2 \* max\(1, samples_per_insert"),
        (lambda: SampleToInsertRatio(1.0, 10, -1.0), r"error_buffer \(-1.0\) must be a non-negative number or a pair"),
        (lambda: SampleToInsertRatio(1.0, 10, "5"), r"error_buffer \('5'\) must be a non-negative number or a pair"),
        (lambda: SampleToInsertRatio(1.0, 10, (5.0, 1.0)), r"min_diff \(5.0\) must be less than max_diff \(1.0\)"),
        (lambda: SampleToInsertRatio(1.0, 10, (0.0, math.inf)), r"error_buffer .* must hold finite numbers"),
        (lambda: SampleToInsertRatio(1.0, 10, (20.0, 40.0)), r"min_diff \(20\) must be at most samples_per_insert"),
        (lambda: SampleToInsertRatio(1.0, 1, 5.0, insert_timeout=-1), r"insert_timeout \(-1\) must be None"),
        (lambda: MinSize(0), r"MinSize: min_size_to_sample \(0\) must be a positive integer"),
        (lambda: MinSize(5, sample_timeout="1"), r"sample_timeout \('1'\) must be None \(wait\), 0"),
    ],
)
def test_bad_limiter_arguments_raise_clear_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_a_limiter_is_checked_against_its_buffer(twin):
    with pytest.raises(TypeError, match=r"rate_limiter \('fast'\) must be a RateLimiter \(MinSize, SampleToInsertRat"):
        make(twin, "fast")
    with pytest.raises(ValueError, match=r"min_size_to_sample \(200\) must be at most the capacity \(128\)"):
        make(twin, MinSize(200))
    limiter = MinSize(1)
    make(twin, limiter)
    with pytest.raises(ValueError, match=r"rate_limiter \(.*\) must be a new limiter; it already limits a"):
        make(twin, limiter)
    # 4 rows per add_batch at 2 samples each, plus one sample, need a range of 9.
    with pytest.raises(ValueError, match=r"error range \(max_diff - min_diff = 8\) must be at least .* = 9"):
        make(twin, SampleToInsertRatio(2.0, 4, 4.0), batch_size=4)


def test_a_sample_too_large_for_the_error_range_is_refused_and_changes_nothing(twin):
    limiter = SampleToInsertRatio(1.0, 2, 3.0)
    rb = make(twin, limiter)
    fill(rb, twin, 2)
    before = limiter.info()
    with pytest.raises(
        ValueError, match=r"get_next: the rate limiter's error range .* must be at least the largest sa"
    ):
        rb.get_next(sample_batch_size=5)
    assert limiter.info() == before


# --- the rule -------------------------------------------------------------------------


def test_min_size_samples_wait_until_enough_items_and_counts_are_items(twin):
    limiter = MinSize(4, sample_timeout=0)
    rb = make(twin, limiter)
    rb.add_batch(items(twin, 0))
    with pytest.raises(RateLimitTimeoutError, match=r"get_next: the rate limiter would wait to admit 3 samples; Mi"):
        rb.get_next(sample_batch_size=3)
    rb.add_batch(items(twin, 2))
    rb.get_next(sample_batch_size=3)
    rb.get_next()
    info = limiter.info()
    assert (info.inserts, info.samples, info.size, info.pending_inserts) == (4, 4, 4, 0)


def test_non_blocking_insert_signals_and_changes_nothing(twin):
    limiter = SampleToInsertRatio(1.0, 2, 3.0, insert_timeout=0)  # error kept in [-1, 5]
    rb = make(twin, limiter)
    fill(rb, twin, 2)  # 4 items: error 4; one more add would make it 6
    with pytest.raises(RateLimitTimeoutError, match=r"add_batch: the rate limiter would wait to admit 2 inserts; .*"
                       r"inserts=4 \(\+0 pending\), samples=0, size=4, error=4 \(kept in \[-1, 5\]\)"):  # fmt: skip
        rb.add_batch(items(twin, 4))
    assert int(rb.num_frames()) == 4 and limiter.info().inserts == 4
    rb.get_next()
    rb.add_batch(items(twin, 4))
    assert limiter.info()[:3] == (6, 1, 0)


def test_a_timeout_waits_that_long_then_names_the_state(twin):
    limiter = SampleToInsertRatio(1.0, 2, 3.0, insert_timeout=0.3, sample_timeout=0.3)
    rb = make(twin, limiter)
    begin = time.monotonic()
    with pytest.raises(RateLimitTimeoutError, match=r"get_next: the rate limiter waited 0.3 s to admit 1 samples"):
        rb.get_next()
    assert time.monotonic() - begin >= 0.3
    fill(rb, twin, 2)
    begin = time.monotonic()
    with pytest.raises(RateLimitTimeoutError, match=r"add_batch: the rate limiter waited 0.3 s to admit 2 inserts"):
        rb.add_batch(items(twin, 4))
    assert time.monotonic() - begin >= 0.3


def test_a_failed_sample_gives_its_count_back(twin):
    limiter = MinSize(2, sample_timeout=0)
    rb = make(twin, limiter)
    rb.add_batch(items(twin, 0))  # one item per segment: no window of 2 yet
    with pytest.raises(ValueError, match=r"get_next: no segment holds 2 consecutive items yet"):
        rb.get_next(sample_batch_size=4, num_steps=2)
    assert limiter.info().samples == 0


def test_a_failed_sample_in_a_graph_gives_its_count_back():
    limiter = MinSize(2, sample_timeout=0)
    rb = make("tf", limiter)
    rb.add_batch(items("tf", 0))
    learn = tf.function(lambda: rb.get_next(sample_batch_size=4, num_steps=2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"no segment holds 2 consecutive items yet"):
        learn()
    assert limiter.info().samples == 0
    rb.add_batch(items("tf", 2))
    learn()
    assert limiter.info().samples == 4


def test_a_rejected_batch_counts_nothing(twin):
    limiter = MinSize(1)
    rb = make(twin, limiter)
    with pytest.raises(TypeError):
        rb.add_batch({"id": np.zeros([2], np.int32)})
    assert limiter.info()[:3] == (0, 0, 0)


def test_clear_starts_the_counts_again(twin):
    limiter = SampleToInsertRatio(1.0, 2, 3.0, sample_timeout=0)
    rb = make(twin, limiter)
    fill(rb, twin, 2)
    rb.get_next()
    rb.clear()
    assert limiter.info()[:4] == (0, 0, 0, 0)
    with pytest.raises(RateLimitTimeoutError, match=r"would wait to admit 1 samples"):
        rb.get_next()


def test_clear_inside_a_graph_starts_the_counts_again():
    limiter = MinSize(1)
    rb = make("tf", limiter)
    fill(rb, "tf", 1)
    tf.function(rb.clear)()
    assert limiter.info()[:3] == (0, 0, 0)


@pytest.mark.parametrize(
    "build, add",
    [
        (lambda lim: TFFrameReplayBuffer(_FRAME_SPEC, 2, 16, history_len=2, rate_limiter=lim), "tf"),
        (
            lambda lim: PyFrameReplayBuffer(_FRAME_SPEC, batch_size=2, max_length=16, history_len=2, rate_limiter=lim),
            "py",
        ),  # fmt: skip
        (lambda lim: TFPrioritizedReplayBuffer(SPEC, 2, 16, rate_limiter=lim), "tf"),
        (lambda lim: PyPrioritizedReplayBuffer(SPEC, batch_size=2, max_length=16, rate_limiter=lim), "py"),
    ],
)
def test_frame_and_prioritized_buffers_are_limited(build, add):
    limiter = MinSize(4, sample_timeout=0)
    rb = build(limiter)
    spec = rb.data_spec

    def rows(i: int):
        row = {k: np.full([2] + s.shape.as_list(), i, s.dtype.as_numpy_dtype) for k, s in spec.items()}
        if "first" in row:
            row["first"] = np.array([i == 0] * 2)
        return tf.nest.map_structure(tf.constant, row) if add == "tf" else row

    rb.add_batch(rows(0))
    with pytest.raises(RateLimitTimeoutError, match=r"get_next: the rate limiter would wait"):
        rb.get_next()
    rb.add_batch(rows(1))
    rb.add_batch(rows(2))
    rb.get_next(sample_batch_size=3)
    assert limiter.info()[:2] == (6, 3)


_FRAME_SPEC = {
    "frame": tf.TensorSpec([2], tf.uint8),
    "first": tf.TensorSpec([], tf.bool),
    "action": tf.TensorSpec([], tf.int32),
}


def test_add_sequence_counts_its_rows():
    limiter = MinSize(1)
    rb = PyFrameReplayBuffer(_FRAME_SPEC, batch_size=2, max_length=16, history_len=2, rate_limiter=limiter)
    rows = {
        "frame": np.zeros([5, 2], np.uint8),
        "first": np.array([True] + [False] * 4),
        "action": np.zeros([5], np.int32),
    }
    rb.add_sequence(rows, segment=1)
    assert limiter.info().inserts == 5


# --- graphs -----------------------------------------------------------------------------


def test_inside_tf_function_both_sides_wait_and_count():
    limiter = SampleToInsertRatio(1.0, 2, 3.0, insert_timeout=0, sample_timeout=0)
    rb = make("tf", limiter)
    add = tf.function(lambda ids: rb.add_batch({"id": ids}))
    learn = tf.function(lambda: rb.get_next(sample_batch_size=2)[0]["id"])
    with pytest.raises(tf.errors.UnknownError, match=r"get_next: the rate limiter would wait to admit 2 samples"):
        learn()
    add(tf.constant([0, 1], tf.int64))
    add(tf.constant([2, 3], tf.int64))
    with pytest.raises(tf.errors.UnknownError, match=r"add_batch: the rate limiter would wait to admit 2 inserts"):
        add(tf.constant([4, 5], tf.int64))
    assert set(learn().numpy()) <= {0, 1, 2, 3}
    assert limiter.info()[:3] == (4, 2, 0)


def test_under_xla_a_limited_buffer_refuses_clearly():
    rb = make("tf", MinSize(1))
    fill(rb, "tf", 1)
    with pytest.raises(NotImplementedError, match=r"get_next: a buffer with a rate_limiter cannot wait inside an XLA"):
        tf.function(lambda: rb.get_next(), jit_compile=True)()
    with pytest.raises(NotImplementedError, match=r"add_batch: a buffer with a rate_limiter cannot wait inside an XLA"):
        tf.function(lambda: rb.add_batch({"id": tf.constant([0, 1], tf.int64)}), jit_compile=True)()


# --- close() ----------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["add_batch", "get_next"])
def test_close_wakes_a_blocked_call_and_refuses_later_ones(twin, side):
    limiter = SampleToInsertRatio(1.0, 2, 3.0)
    rb = make(twin, limiter)
    if side == "add_batch":
        fill(rb, twin, 2)
        call = lambda: rb.add_batch(items(twin, 4))  # noqa: E731
    else:
        call = lambda: rb.get_next()  # noqa: E731
    thread, out = start(call)
    time.sleep(0.2)
    assert thread.is_alive(), "the call should be waiting for the limiter"
    rb.close()
    assert joined(thread)
    assert isinstance(out[0], BufferClosedError) and isinstance(out[0], tf.errors.OutOfRangeError)
    assert f"{side}: the buffer is closed (close() was called)" in str(out[0])
    for later in (lambda: rb.add_batch(items(twin, 8)), rb.get_next, rb.as_dataset):
        with pytest.raises(BufferClosedError, match=r"the buffer is closed \(close\(\) was called\)"):
            later()
    assert int(rb.num_frames()) == 4 if side == "add_batch" else int(rb.num_frames()) == 0  # items stay


def test_close_inside_a_graph_raises_out_of_range():
    rb = make("tf", MinSize(1))
    learn = tf.function(lambda: rb.get_next())
    fill(rb, "tf", 1)
    learn()
    rb.close()
    with pytest.raises(tf.errors.OutOfRangeError, match=r"get_next: the buffer is closed"):
        learn()


def test_close_without_a_limiter_refuses_eager_calls(twin):
    rb = make(twin, None)
    fill(rb, twin, 1)
    rb.close()
    rb.close()  # idempotent
    with pytest.raises(BufferClosedError, match=r"add_batch: the buffer is closed"):
        rb.add_batch(items(twin, 2))
    assert len(np.asarray(tf.nest.flatten(rb.gather_all())[0]).reshape(-1)) == 2


@pytest.mark.parametrize("parallel", [None, 2])
def test_close_ends_a_waiting_dataset_cleanly(twin, parallel):
    rb = make(twin, SampleToInsertRatio(1.0, 2, 3.0))  # 4 items: 2 samples of 2, then it waits for inserts
    ds = rb.as_dataset(sample_batch_size=2, num_parallel_calls=parallel).prefetch(2)
    got: list = []

    def learn() -> None:
        for sample, _ in ds:
            got.append(sample["id"].numpy())

    thread, out = start(learn)
    fill(rb, twin, 2)
    deadline = time.monotonic() + JOIN
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert len(got) == 2 and thread.is_alive(), "the dataset should wait for inserts"
    rb.close()
    assert joined(thread)
    assert out == ["done"]  # StopIteration ended the loop


def test_a_learner_dropping_its_iterator_does_not_hang(twin):
    rb = make(twin, SampleToInsertRatio(1.0, 2, 3.0))
    fill(rb, twin, 2)
    it = iter(rb.as_dataset(num_parallel_calls=2).prefetch(4))
    next(it)
    begin = time.monotonic()
    del it  # its prefetch waits for inserts that never come
    assert time.monotonic() - begin < 5.0
    rb.close()


# --- collector and learner threads -----------------------------------------------------


def run_pair(twin: str, learner: str, spi: float = 2.0, error_buffer: float = 8.0, samples: int = 400):
    """A collector and a learner thread until `samples` are drawn, then close(); returns (limiter, history, outcomes).

    `history` holds the limiter's counts read under its lock after every call
    of either side and by a third thread that watches them.
    """
    limiter = SampleToInsertRatio(spi, 8, error_buffer, insert_timeout=JOIN, sample_timeout=JOIN)
    rb = make(twin, limiter, max_length=256)
    history, stop = [], threading.Event()
    add = tf.function(rb.add_batch) if learner == "function" else rb.add_batch

    def collect() -> None:
        for i in range(0, 10**9, 2):
            add(items(twin, i))
            history.append(limiter.info())

    def learn() -> None:
        if learner == "dataset":
            for _ in rb.as_dataset(sample_batch_size=4, num_parallel_calls=2).prefetch(2):
                history.append(limiter.info())
            return
        sample = tf.function(lambda: rb.get_next(sample_batch_size=4)) if learner == "function" else rb.get_next
        while True:
            sample() if learner == "function" else sample(sample_batch_size=4)
            history.append(limiter.info())

    def watch() -> None:
        while not stop.is_set():
            history.append(limiter.info())
            time.sleep(0.001)

    threads = [start(fn) for fn in (collect, learn, watch)]
    deadline = time.monotonic() + JOIN
    while limiter.info().samples < samples and time.monotonic() < deadline:
        time.sleep(0.01)
    rb.close()
    stop.set()
    assert all(joined(t) for t, _ in threads), "a side did not stop after close()"
    return limiter, history, [out[0] for _, out in threads]


@pytest.mark.slow
@pytest.mark.parametrize(
    "twin, learner", [("tf", "eager"), ("tf", "dataset"), ("tf", "function"), ("py", "eager"), ("py", "dataset")]
)
def test_collector_and_learner_threads_keep_the_ratio_and_stop_on_close(twin, learner):
    limiter, history, outcomes = run_pair(twin, learner)
    sampling = [h for h in history if h.samples > 0]
    assert len(sampling) > 50 and limiter.info().samples >= 400, "the learner barely ran"
    for h in sampling:  # the error stays in [8 * 2 - 8, 8 * 2 + 8] once sampling has begun
        assert limiter.min_diff <= h.error <= limiter.max_diff, h
    collector, learner_out, watcher = outcomes
    # Eagerly BufferClosedError, inside tf.function OutOfRangeError (its base); a dataset ends with StopIteration.
    closed = BufferClosedError if learner == "eager" else tf.errors.OutOfRangeError
    assert isinstance(collector, closed), collector
    assert learner_out == "done" if learner == "dataset" else isinstance(learner_out, closed), learner_out
    assert watcher == "done"


# --- checkpoints --------------------------------------------------------------------------


def test_checkpoints_hold_items_not_limiter_counts(twin, tmp_path):
    limiter = MinSize(2)
    rb = make(twin, limiter)
    fill(rb, twin, 2)
    rb.get_next()
    path = tf.train.Checkpoint(buffer=rb).write(str(tmp_path / "ckpt"))
    fresh_limiter = MinSize(2, sample_timeout=0)
    fresh = make(twin, fresh_limiter)
    tf.train.Checkpoint(buffer=fresh).read(path).assert_consumed()
    assert int(fresh.num_frames()) == 4
    assert fresh_limiter.info()[:3] == (0, 0, 0)  # this process's counts: the learner waits for new items
    with pytest.raises(RateLimitTimeoutError, match=r"would wait"):
        fresh.get_next()
    plain = make(twin, None)  # and the same checkpoint restores into a buffer without a limiter
    tf.train.Checkpoint(buffer=plain).read(path).assert_consumed()
    assert int(plain.num_frames()) == 4
