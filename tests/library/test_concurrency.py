"""Writers and readers on several threads: no torn item, no stray item, no lost item.

Every leaf of an item carries the item's payload (see helpers), so a row
assembled from two writes shows as leaves that disagree. The buffers are
large enough never to overwrite, so a row never changes once written: each
sample must show exactly what the final buffer holds at the sampled id.
"""

import functools
import inspect
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf
from helpers import KINDS, SPEC, assert_nest_equal, decode, make_items, run_threads, shared_api, to_numpy

import tfreplay
from tfreplay import PyUniformReplayBuffer, Sequences, TFUniformReplayBuffer

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
    items are over 256 KiB (`backends/tf.py`: `UNLOCKED_READ_BYTES`): read outside the lock; 64 are read inside."""
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


# --- a failed or interrupted call never leaves a buffer locked ---------------------------------

PACKAGE = os.path.dirname(tfreplay.__file__)
# The contract's layout and sample size (test_contract.py), so a whole run compiles these buffers' draws once.
# They are refilled before they wrap: a buffer's number of adds shows in num_frames.
LOCK_B, LOCK_L, SAMPLE = 2, 7, 400


def interrupting(number: int, started: list):
    """A trace function that raises KeyboardInterrupt as the `number`-th (from 0) function of tfreplay
    starts, as if Ctrl-C landed there; `started` collects their names. Generators are let be (raising in
    one resumed by a context manager's exit would stand for no real interrupt)."""

    def trace(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(PACKAGE) and not code.co_flags & inspect.CO_GENERATOR:
            started.append(code.co_name)
            if len(started) == number + 1:
                raise KeyboardInterrupt  # propagates into the frame that was starting
        return None

    return trace


def interrupted(call, number: int):
    """`call()` interrupted as its `number`-th tfreplay function starts: the KeyboardInterrupt (whose
    traceback keeps every frame of the call alive, as pytest or a debugger keeps it) or None if `call` ran
    fewer functions; and the names of those that started."""
    started = []
    sys.settrace(interrupting(number, started))
    try:
        call()
    except KeyboardInterrupt as err:
        return err, started
    finally:
        sys.settrace(None)
    return None, started


def assert_unlocked_and_whole(api, checked: dict) -> None:
    """Another thread gets through the buffer's lock within 10 seconds (so no call left it held), and the
    buffer holds exactly the items of its adds so far, none torn, with their odds (so it stays usable).

    `checked` keeps, per number of adds, what the buffer held when it was first checked by value."""
    run_threads([api.rb.gather_all], timeout=10.0)
    api.num_adds = int(api.rb.num_frames()) // api.rb.batch_size  # an interrupted add may have landed
    kind, held = api.kind, (to_numpy(api.rb.gather_all()), api.sampling_mass())
    if api.num_adds not in checked:
        np.testing.assert_array_equal(kind.decode(held[0], LOCK_B), kind.all_ids(LOCK_B, LOCK_L, api.num_adds))
        if kind.prioritized:  # every item at priority 1
            assert held[1] == len(kind.valid_starts(LOCK_B, LOCK_L, api.num_adds, None))
        checked[api.num_adds] = held
    assert_nest_equal(held, checked[api.num_adds])
    if api.num_adds >= LOCK_L - 1:  # the next add could wrap the ring: start again
        api.clear()
        api.add_steps(4)


def interruptible(kind, name: str):
    """A public call a user may interrupt: reads, a write, and for prioritized buffers an update (of
    priority 1, so the odds stay)."""
    calls = {
        "gather_all": lambda rb: rb.gather_all(),
        "num_frames": lambda rb: rb.num_frames(),
        "num_transitions": lambda rb: rb.num_transitions(),
        "sampling_mass": lambda rb: rb.sampling_mass(),
        "get_next": lambda rb: rb.get_next(SAMPLE),
        "update_priorities": lambda rb: rb.update_priorities(rb.get_next(SAMPLE)[1].ids, np.ones(SAMPLE)),
    }
    return calls[name]


# Reads take the twin's lock (a TF CriticalSection, a Python lock) the same way whatever the sampler: they are
# interrupted on the uniform and frame buffers. Writes change what each storage and sampler keep: on all.
READS = ["gather_all", "num_frames", "sampling_mass", "get_next"]
INTERRUPTED_CALLS = [
    (kind, name)
    for kind in KINDS.values()
    for name in ([] if kind.prioritized else READS + ["num_transitions"] * bool(kind.history_len))
    + ["add_batch"]
    + ["update_priorities"] * kind.prioritized
]


@pytest.mark.parametrize("kind, name", INTERRUPTED_CALLS, ids=lambda x: getattr(x, "name", x))
def test_a_call_interrupted_anywhere_leaves_the_buffer_unlocked_and_usable(kind, name):
    """The call, interrupted in turn as each of tfreplay's functions in it starts (with the lock taken or
    not), leaves no lock held while the interrupt's traceback lives, and the buffer whole."""
    api = shared_api(kind, "eager", LOCK_B, LOCK_L)
    api.add_steps(4)
    call = (lambda: api.add_steps(1)) if name == "add_batch" else functools.partial(interruptible(kind, name), api.rb)
    call()  # traced and compiled before the count
    _, started = interrupted(call, 10**9)
    assert started, "the call ran none of tfreplay's functions"
    checked = {}
    for number in range(len(started)):
        err, _ = interrupted(call, number)
        assert err is not None, (number, started)
        assert_unlocked_and_whole(api, checked)
        del err


def failing(api, name: str):
    """A call refused after it may have taken the lock: `(call, error, message)`."""
    rb, kind = api.rb, api.kind
    bad = np.array([1.0, np.nan])
    if name == "empty-get_next":
        return (lambda: rb.get_next(SAMPLE)), ValueError, kind.empty_message(None)
    if name == "bad-priority":
        return (lambda: rb.update_priorities(np.arange(2), bad)), ValueError, r"priorities \(\[nan\] among them\)"
    if name == "graph-add_batch":  # a shape only the running graph can check
        spec = tf.nest.map_structure(lambda s: tf.TensorSpec([None] + s.shape.as_list(), s.dtype), rb.data_spec)
        add, too_many = tf.function(rb.add_batch, input_signature=[spec]), kind.items(np.arange(LOCK_B + 1), LOCK_B)
        return (lambda: add(too_many)), tf.errors.InvalidArgumentError, rf"add_batch: \S+ must have shape \[{LOCK_B}"
    if name == "graph-empty-get_next":
        return tf.function(lambda: rb.get_next(SAMPLE)), tf.errors.InvalidArgumentError, kind.empty_message(None)
    update = tf.function(lambda: rb.update_priorities(tf.range(2, dtype=tf.int64), tf.constant(bad)))
    return update, tf.errors.InvalidArgumentError, "update_priorities: every priority must be finite and non-negative"


# The lock is the twin's (a TF CriticalSection, a Python lock), so the refusals of rows and samples are tried on
# the uniform and frame buffers; the priority ones on the prioritized buffers.
FAILED_CALLS = [
    (kind, name)
    for kind in KINDS.values()
    for name in (["bad-priority"] if kind.prioritized else ["empty-get_next"])
    + (["graph-bad-priority"] if kind.prioritized else ["graph-add_batch", "graph-empty-get_next"]) * kind.is_tf
]


@pytest.mark.parametrize("kind, name", FAILED_CALLS, ids=lambda x: getattr(x, "name", x))
def test_a_failed_call_leaves_the_buffer_unlocked_and_usable(kind, name):
    api = shared_api(kind, "eager", LOCK_B, LOCK_L)
    if "empty" not in name:
        api.add_steps(4)
    call, error, message = failing(api, name)
    with pytest.raises(error, match=message):
        call()
    assert_unlocked_and_whole(api, {})
    api.add_steps(3)
    assert_unlocked_and_whole(api, {})


# A script whose datasets are still prefetching when it ends: their iterators are destroyed while the interpreter
# finalizes, and a Python call TF's threads start then must not hang the exit (in most runs it did).
EXIT_SCRIPT = """
import numpy as np, tensorflow as tf, tfreplay
spec = {"obs": tf.TensorSpec([4], tf.float32), "reward": tf.TensorSpec([], tf.float32)}
py = tfreplay.PyUniformReplayBuffer(spec, batch_size=16, max_length=1024, seed=0)
for _ in range(1024):
    py.add_batch({"obs": np.zeros([16, 4], np.float32), "reward": np.ones([16], np.float32)})
tf_rb = tfreplay.TFUniformReplayBuffer(spec, batch_size=4, max_length=256, seed=0, rate_limiter=tfreplay.MinSize(1))
tf_rb.add_batch({"obs": tf.zeros([4, 4]), "reward": tf.ones([4])})
iterators = [iter(py.as_dataset(1024, num_steps=4, num_parallel_calls=tf.data.AUTOTUNE)) for _ in range(3)]
iterators += [iter(py.as_dataset(1024, num_steps=4)), iter(tf_rb.as_dataset(8))]
for _ in range(10):  # the readers keep the prefetch threads busy up to the end
    for it in iterators:
        next(it)
print("sampled")
"""


@pytest.mark.slow  # a subprocess importing TensorFlow
def test_a_script_exits_while_its_datasets_prefetch(tmp_path):
    script = tmp_path / "prefetching.py"
    script.write_text(EXIT_SCRIPT)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("a script with prefetching datasets hung at exit")
    assert run.returncode == 0 and run.stdout.strip() == "sampled", run.stderr[-3000:]
