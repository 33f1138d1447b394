"""Rate limiting: Reverb's samples-per-insert rule, waits, timeouts, close(), and collector/learner threads.

Every wait in these tests is bounded: limiters get timeouts where a bug could
block the test thread, and threads are joined with a timeout and checked.
"""

from __future__ import annotations

import json
import math
import threading
import time

import helpers  # noqa: F401  (quiets TF before it loads)
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

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
    with pytest.raises(TypeError, match=r"add_batch: id has dtype int32; the spec expects int64"):
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


KINDS = {
    "tf": lambda lim: TFUniformReplayBuffer(SPEC, 2, 64, seed=0, rate_limiter=lim),
    "py": lambda lim: PyUniformReplayBuffer(SPEC, batch_size=2, max_length=64, seed=0, rate_limiter=lim),
    "tf-prioritized": lambda lim: TFPrioritizedReplayBuffer(SPEC, 2, 64, seed=0, rate_limiter=lim),
    "py-prioritized": lambda lim: PyPrioritizedReplayBuffer(
        SPEC, batch_size=2, max_length=64, seed=0, rate_limiter=lim
    ),
}


def ratio() -> SampleToInsertRatio:
    """2 samples per insert after 4 items, the error kept in [0, 16]; never waits (a refused call raises)."""
    return SampleToInsertRatio(2.0, 4, 8.0, insert_timeout=0, sample_timeout=0)


def save(rb, tmp_path, name: str = "ckpt") -> str:
    return tf.train.Checkpoint(buffer=rb).write(str(tmp_path / name))


def restored(kind: str, limiter: RateLimiter | None, path: str):
    rb = KINDS[kind](limiter)
    tf.train.Checkpoint(buffer=rb).read(path).assert_consumed()
    return rb


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_restored_limiter_resumes_the_saved_counts(kind, tmp_path):
    twin = kind[:2]
    rb = KINDS[kind](ratio())
    fill(rb, twin, 3)  # 6 inserts: error 12
    rb.get_next(sample_batch_size=3)  # error 9
    path = save(rb, tmp_path)
    limiter = ratio()
    fresh = restored(kind, limiter, path)
    assert limiter.info()[:4] == (6, 3, 0, 6)  # inserts, samples, pending, size
    assert limiter.info().error == 9
    fresh.get_next(sample_batch_size=3)  # admitted at once: the warm-up is not repeated
    fresh.add_batch(items(twin, 100))  # error 6 + 4 = 10
    fresh.add_batch(items(twin, 102))  # 14
    with pytest.raises(RateLimitTimeoutError, match=r"add_batch: the rate limiter would wait .* error=14"):
        fresh.add_batch(items(twin, 104))  # 18 > 16: the learner is behind, as it was before the save
    assert limiter.info()[:4] == (10, 6, 0, 10)


@pytest.mark.parametrize("kind", ["tf", "py"])
def test_a_checkpoint_without_counts_resumes_after_the_warm_up(kind, tmp_path):
    """Counts start as if the stored items had just ended the warm-up: error = min(size, min_size) * spi."""
    twin = kind[:2]
    full, short = KINDS[kind](None), KINDS[kind](None)
    fill(full, twin, 3)
    fill(short, twin, 1)
    limiter = ratio()
    rb = restored(kind, limiter, save(full, tmp_path, "full"))
    assert limiter.info()[:4] == (4, 0, 0, 6)
    rb.get_next(sample_batch_size=8)  # error 8 - 8 = 0: admitted at once
    with pytest.raises(RateLimitTimeoutError, match=r"get_next: the rate limiter would wait"):
        rb.get_next()
    limiter = ratio()
    rb = restored(kind, limiter, save(short, tmp_path, "short"))
    assert limiter.info()[:4] == (2, 0, 0, 2)  # still warming up: samples wait, inserts pass
    with pytest.raises(RateLimitTimeoutError, match=r"get_next: the rate limiter would wait"):
        rb.get_next()
    rb.add_batch(items(twin, 10))
    rb.get_next()


@pytest.mark.parametrize("kind", ["tf", "py"])
def test_counts_restore_into_a_buffer_without_a_limiter_and_back(kind, tmp_path):
    twin = kind[:2]
    rb = KINDS[kind](ratio())
    fill(rb, twin, 3)
    rb.get_next(sample_batch_size=3)
    plain = restored(kind, None, save(rb, tmp_path))  # the counts have nowhere to go
    assert int(plain.num_frames()) == 6
    plain.add_batch(items(twin, 50))
    limiter = ratio()
    restored(kind, limiter, save(plain, tmp_path, "plain"))  # saved without counts: the warm-up rule
    assert limiter.info()[:4] == (4, 0, 0, 8)


def test_a_save_inside_tf_function_writes_the_counts_when_it_runs(tmp_path):
    rb = KINDS["tf"](ratio())
    fill(rb, "tf", 3)
    checkpoint = tf.train.Checkpoint(buffer=rb)
    write = tf.function(lambda: checkpoint.write(str(tmp_path / "ckpt")))
    write()  # traced here, with no samples yet
    tf.function(lambda: rb.get_next(sample_batch_size=3))()
    path = write().numpy().decode()
    limiter = ratio()
    fresh = restored("tf", limiter, path)
    assert limiter.info()[:4] == (6, 3, 0, 6)
    tf.function(lambda: fresh.get_next(sample_batch_size=3))()


def test_a_v1_graph_restore_puts_the_counts_back(tmp_path):
    """A session restores the variables with no hook after them: the counts go in when the restore is built."""
    rb = KINDS["tf"](ratio())
    fill(rb, "tf", 3)
    rb.get_next(sample_batch_size=3)
    path = save(rb, tmp_path)
    with tf.Graph().as_default():
        limiter = ratio()
        fresh = KINDS["tf"](limiter)
        status = tf.train.Checkpoint(buffer=fresh).read(path)
        sample = fresh.get_next(sample_batch_size=3)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.variables_initializer(list(fresh.variables())))
            status.initialize_or_restore(sess)
            sess.run(sample)  # admitted at once
    assert limiter.info()[:4] == (6, 6, 0, 6)


@pytest.mark.parametrize("twin", ["tf", "py"])
def test_a_restore_wakes_a_sampler_waiting_on_the_empty_buffer(twin, tmp_path):
    rb = make(twin, SampleToInsertRatio(2.0, 4, 8.0, insert_timeout=0, sample_timeout=0))
    fill(rb, twin, 3)
    path = save(rb, tmp_path)
    limiter = SampleToInsertRatio(2.0, 4, 8.0, sample_timeout=JOIN)
    fresh = make(twin, limiter)
    thread, out = start(lambda: fresh.get_next(sample_batch_size=2))
    time.sleep(0.2)
    assert out == [] and limiter.info().samples == 0  # waiting: the buffer is empty
    tf.train.Checkpoint(buffer=fresh).read(path)
    assert joined(thread) and out == ["done"]
    assert limiter.info()[:2] == (6, 2)


MALFORMED = [
    ({"inserts": 6, "samples": 3}, "must be an object with exactly"),
    ({"inserts": 6, "samples": -1, "size": 6}, "must be an object with exactly"),
    ({"inserts": 6, "samples": 3, "size": 6.0}, "must be an object with exactly"),
    ({"inserts": 6, "samples": True, "size": 6}, "must be an object with exactly"),
    ({"inserts": 6, "samples": 3, "size": 7}, "size at most inserts"),
    ({"inserts": 999, "samples": 3, "size": 200}, r"size at most inserts and the capacity \(128\)"),
    ([6, 3, 6], "must be an object with exactly"),
]


@pytest.mark.parametrize("kind", ["tf", "py"])
@pytest.mark.parametrize("counts, message", MALFORMED)
def test_malformed_counts_are_refused_and_change_nothing(kind, counts, message, tmp_path):
    twin = kind[:2]
    rb = KINDS[kind](ratio())
    fill(rb, twin, 3)
    rb.get_next(sample_batch_size=3)
    crafted = rewritten(save(rb, tmp_path), str(tmp_path / "crafted"), lambda r: {**r, "rate_limiter": counts})
    limiter = ratio()
    target = KINDS[kind](limiter)
    target.add_batch(items(twin, 70))
    with pytest.raises(ValueError, match=rf"checkpoint restore: the checkpoint's rate_limiter counts .*{message}"):
        tf.train.Checkpoint(buffer=target).read(crafted)
    assert limiter.info()[:4] == (2, 0, 0, 2)
    assert int(target.num_frames()) == 2


@pytest.mark.parametrize("kind", ["tf", "py"])
def test_a_checkpoint_from_before_the_counts_restores_with_the_warm_up_rule(kind, tmp_path):
    """Written by a tfreplay that saved no counts (no record entry; a TF one lacks its restore hook too)."""
    twin = kind[:2]
    rb = KINDS[kind](ratio())
    fill(rb, twin, 3)
    rb.get_next(sample_batch_size=3)
    old = rewritten(save(rb, tmp_path), str(tmp_path / "old"), without_counts, graph=without_hooks)
    limiter = ratio()
    fresh = KINDS[kind](limiter)
    tf.train.Checkpoint(buffer=fresh).read(old).assert_existing_objects_matched()
    if twin == "tf":  # the first call counts the restored items (for TF, inside a graph here)
        tf.function(lambda: fresh.get_next(sample_batch_size=8))()
    else:
        fresh.get_next(sample_batch_size=8)
    assert limiter.info()[:4] == (4, 8, 0, 6)


def rewritten(path: str, out: str, change, graph=lambda g: g) -> str:
    """A copy of checkpoint `path` at `out`: its layout record through `change`, its object graph through `graph`."""
    reader = tf.train.load_checkpoint(path)
    names = sorted(reader.get_variable_to_shape_map())
    values = {n: reader.get_tensor(n) for n in names}
    (key,) = [n for n in names if n.endswith(("/layout", "/py_state"))]
    values[key] = json.dumps(change(json.loads(values[key])))
    values["_CHECKPOINTABLE_OBJECT_GRAPH"] = graph(values["_CHECKPOINTABLE_OBJECT_GRAPH"])
    tensors = [tf.convert_to_tensor(values[n]) for n in names]
    tf.raw_ops.SaveV2(prefix=out, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)
    return out


def without_counts(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "rate_limiter"}


def without_hooks(serialized: bytes) -> bytes:
    """The object graph without the children a tfreplay before the counts did not have (a TF record's hook)."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph.FromString(serialized)
    for node in graph.nodes:
        kept = [c for c in node.children if c.local_name != "after_restore"]
        del node.children[:]
        node.children.extend(kept)
    return graph.SerializeToString()


def test_a_numpy_save_during_adds_holds_counts_that_match_its_items(tmp_path):
    """Each checkpoint's `size` equals the items it holds: an add's rows and its count go in together."""
    rb = PyUniformReplayBuffer(SPEC, batch_size=2, max_length=100_000, seed=0, rate_limiter=MinSize(1))
    stop = threading.Event()

    def collect() -> None:
        i = 0
        while not stop.is_set():
            rb.add_batch(items("py", i))
            i += 2

    thread, out = start(collect)
    try:
        paths = [tf.train.Checkpoint(buffer=rb).write(str(tmp_path / f"c{k}")) for k in range(30)]
    finally:
        stop.set()
        assert joined(thread) and out == ["done"]
    for path in paths:
        limiter = MinSize(1)
        fresh = PyUniformReplayBuffer(SPEC, batch_size=2, max_length=100_000, seed=0, rate_limiter=limiter)
        tf.train.Checkpoint(buffer=fresh).read(path).assert_consumed()
        assert limiter.info().size == fresh.num_frames(), path
