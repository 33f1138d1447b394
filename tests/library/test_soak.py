"""Soak: every way into and out of the buffers racing at once, for a fixed count of rounds, under a watchdog.

Writers (eager `add_batch`, `add_batch` inside `tf.function`), readers (eager
`get_next`, `get_next` inside `tf.function`, eager `gather_all` and
`num_transitions`) and `as_dataset` iterators (an AUTOTUNE map and an AUTOTUNE
prefetch; the NumPy twins' iterators are dropped while their map calls still
sample) share the TF and NumPy uniform and frame buffers. Rings of a few rows
make writers overwrite what readers are reading. Every side must stop when
told, within a deadline, or the test fails with the stuck sides' stacks; a
timer kills a run whose own thread hangs (it dumps every stack first). Every
sampled item must be whole and its ids plausible.

The race lasts until the slowest side has run `TFREPLAY_SOAK_ROUNDS` rounds
(every side keeps going until then), so its length is a count, not a time:
`TFREPLAY_SOAK_ROUNDS=200 pytest -m slow tests/library/test_soak.py -s` soaks
for longer.
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import sys
import threading
import time
import traceback

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPEC, XlaStacks, decode, make_items

from tfreplay import (
    PyFrameReplayBuffer,
    PyUniformReplayBuffer,
    TFFrameReplayBuffer,
    TFUniformReplayBuffer,
    frame_data_spec,
)

RACE_ROUNDS = int(os.environ.get("TFREPLAY_SOAK_ROUNDS", "4"))  # of the slowest side
JOIN_SECONDS = 60.0  # after the stop: a side still running then is stuck
KILL_SECONDS = 300.0  # the whole test, in case the test's own thread hangs
SEGMENTS, RING, SAMPLE = 4, 24, 8  # the ring of every buffer wraps every 24 adds
FRAME = (2, 3)
AUTOTUNE = tf.data.AUTOTUNE


class Sides:
    """Named threads that each repeat a step until told to stop (at least once)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.rounds: dict[str, int] = {}
        self.errors: list[tuple[str, BaseException]] = []
        self.threads: list[threading.Thread] = []
        self.target = 1

    def add(self, name: str, step) -> None:
        def run() -> None:
            try:
                while True:
                    step()
                    self.rounds[name] = self.rounds.get(name, 0) + 1
                    if min(self.rounds.values()) >= self.target:
                        self.stop.set()
                    if self.stop.is_set():
                        return
            except BaseException as err:  # reported by race()
                self.errors.append((name, err))
                self.stop.set()

        self.rounds[name] = 0
        self.threads.append(threading.Thread(target=run, name=name, daemon=True))

    def race(self, rounds: int) -> None:
        """Runs every side until each has run `rounds` rounds; fails with the stuck sides' stacks if any outlives
        the deadline after the stop."""
        self.target = rounds
        for thread in self.threads:
            thread.start()
        self.stop.wait(KILL_SECONDS / 2)  # a side stuck before its rounds is reported below, with its stack
        self.stop.set()
        deadline = time.monotonic() + JOIN_SECONDS
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t for t in self.threads if t.is_alive()]
        if stuck:
            frames = sys._current_frames()
            stacks = "".join(f"\n--- {t.name}\n" + "".join(traceback.format_stack(frames[t.ident])) for t in stuck)
            pytest.fail(f"{len(stuck)} sides still running {JOIN_SECONDS:.0f} s after the stop:{stacks}")
        if self.errors:
            name, err = self.errors[0]
            raise AssertionError(f"side {name!r} failed: {err!r}") from err


@pytest.fixture
def kill_switch(request):
    """Dumps every thread's stack and exits if the test is still running after KILL_SECONDS.

    The stack goes to pytest's own copy of the terminal's stderr (captured output dies with the process).
    """
    try:
        from _pytest.faulthandler import fault_handler_stderr_fd_key

        fd = request.config.stash[fault_handler_stderr_fd_key]
    except (ImportError, KeyError):
        fd = sys.__stderr__.fileno()
    faulthandler.dump_traceback_later(KILL_SECONDS, exit=True, file=fd)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def frequent_thread_switches():
    """Switch threads every 0.1 ms, so sides interleave finely."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(interval)


class Tally:
    """Adds that returned and the largest id sampled, counted across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.adds, self.max_id = 0, -1

    def added(self) -> None:
        with self._lock:
            self.adds += 1

    def sampled(self, ids: np.ndarray) -> None:
        with self._lock:
            self.max_id = max(self.max_id, int(ids.max()))

    def check(self) -> None:
        assert self.max_id < self.adds * SEGMENTS, f"id {self.max_id} was never written ({self.adds} adds)"


class Uniform:
    """A uniform buffer, its writers' payloads and the checks of what it returns.

    Each add draws a fresh base `k` and writes payload `k * SEGMENTS + b` to
    segment `b`, so an item's payload names the segment its id must name.
    """

    def __init__(self, rb) -> None:
        self.rb = rb
        self.bases = itertools.count()
        self.tally = Tally()

    def items(self) -> dict:
        return make_items(next(self.bases) * SEGMENTS + np.arange(SEGMENTS))

    def add(self, add_batch) -> None:
        add_batch(self.items())
        self.tally.added()

    def check(self, items, info) -> None:
        payloads = decode(items)  # every leaf of every item agrees: nothing torn
        ids = np.asarray(info.ids)
        assert ids.shape == payloads.shape
        assert (ids >= 0).all()
        np.testing.assert_array_equal(payloads % SEGMENTS, ids % SEGMENTS, err_msg="an item outside its id's segment")
        if ids.ndim == 2:
            assert (np.diff(ids, axis=1) == SEGMENTS).all(), f"a window is not consecutive in one segment: {ids}"
        self.tally.sampled(ids)

    def check_all(self) -> None:
        payloads = decode(self.rb.gather_all())  # [segment, time]
        assert (payloads % SEGMENTS == np.arange(SEGMENTS)[:, None]).all()


class Frames:
    """A frame buffer, its writers' rows and the checks of what it returns.

    Each add draws a base `k`; every frame of segment `b` shows `b + 1` in its
    first pixel and `k % 251 + 1` in the others, and the step's action and
    reward are `k`: the newest frame of a next-observation stack must show the
    base of the step's action.
    """

    def __init__(self, rb) -> None:
        self.rb = rb
        self.bases = itertools.count()
        self.tally = Tally()

    def row(self) -> dict:
        k = next(self.bases)
        frame = np.full((SEGMENTS,) + FRAME, k % 251 + 1, np.uint8)
        frame[:, 0, 0] = np.arange(SEGMENTS) + 1
        return {
            "frame": frame,
            "first": np.full(SEGMENTS, k % 5 == 0),
            "action": np.full(SEGMENTS, k, np.int32),
            "reward": np.full(SEGMENTS, k, np.float32),
            "terminated": np.zeros(SEGMENTS, bool),
            "truncated": np.zeros(SEGMENTS, bool),
        }

    def add(self, add_batch) -> None:
        add_batch(self.row())
        self.tally.added()

    def check(self, items, info) -> None:
        ids = np.asarray(info.ids)
        assert (ids >= 0).all()
        action = np.asarray(items["action"])
        np.testing.assert_array_equal(np.asarray(items["reward"]), action.astype(np.float32))
        segment = (ids % SEGMENTS + 1)[..., None]
        for key in ("observation", "next_observation"):
            frames = np.moveaxis(np.asarray(items[key]), -1, -3)  # [..., history, *FRAME]
            flat = frames.reshape(frames.shape[:-2] + (-1,))
            blank = (flat == 0).all(-1)  # before the episode's first frame
            whole = (flat[..., 1:] == flat[..., 1:2]).all(-1) & (flat[..., 0] == segment)
            assert (blank | whole).all(), f"{key}: a torn frame or one from another segment"
        newest = np.moveaxis(np.asarray(items["next_observation"]), -1, 0)[-1]  # the step's own frame
        np.testing.assert_array_equal(newest[..., 1, 1], action % 251 + 1, err_msg="frame and action disagree")
        self.tally.sampled(ids)


def iterating(dataset, check, kind: str, num_elements: int = 20):
    """A step that reads `num_elements` elements of `dataset`.

    NumPy twins: from a new iterator each time, dropped while its map calls
    still sample. TF twins: from one iterator, kept for the whole race:
    dropping one whose map calls wait for the lock breaks TF's mutex (see
    test_concurrency's xfail), which would let a writer tear what a reader reads.
    """
    kept = iter(dataset) if kind != "py" else None

    def step() -> None:
        iterator = kept or iter(dataset)
        for _ in range(num_elements):
            check(*next(iterator))

    return step


def as_tensors(nest):
    return tf.nest.map_structure(tf.constant, nest)


def uniform_sides(sides: Sides, kind: str, rb) -> Uniform:
    buf = Uniform(rb)
    for _ in range(6):
        buf.add(rb.add_batch)
    ds = rb.as_dataset(SAMPLE, num_steps=2, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)
    steps = {
        "add": lambda: buf.add(rb.add_batch),
        "get_next": lambda: buf.check(*rb.get_next(SAMPLE, num_steps=2)),
        "dataset": iterating(ds, buf.check, kind),
    }
    if kind == "tf":
        add_fn = tf.function(lambda items: rb.add_batch(items))
        get_fn = tf.function(lambda: rb.get_next(SAMPLE))
        steps["add in tf.function"] = lambda: buf.add(lambda items: add_fn(as_tensors(items)))
        steps["get_next in tf.function"] = lambda: buf.check(*get_fn())
        steps["gather_all"] = buf.check_all
    else:
        steps["second add"] = steps["add"]
    for name, step in steps.items():
        step()  # trace, compile and fill before the race
        sides.add(f"{kind} uniform: {name}", step)
    return buf


def frame_sides(sides: Sides, kind: str, rb) -> Frames:
    buf = Frames(rb)
    for _ in range(6):
        buf.add(rb.add_batch)
    ds = rb.as_dataset(SAMPLE, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)
    steps = {
        "add": lambda: buf.add(rb.add_batch),
        "get_next": lambda: buf.check(*rb.get_next(SAMPLE)),
        "dataset": iterating(ds, buf.check, kind),
    }
    if kind != "py":
        add_fn = tf.function(lambda items: rb.add_batch(items))
        get_fn = tf.function(lambda: rb.get_next(SAMPLE))
        steps["add in tf.function"] = lambda: buf.add(lambda row: add_fn(as_tensors(row)))
        steps["get_next in tf.function"] = lambda: buf.check(*get_fn())
        steps["num_transitions"] = lambda: int(rb.num_transitions())
    for name, step in steps.items():
        step()
        sides.add(f"{kind} frames: {name}", step)
    return buf


@pytest.mark.slow
def test_every_side_racing_at_once_finishes_and_reads_whole_items(kill_switch, frequent_thread_switches):
    sides = Sides()
    spec = frame_data_spec(FRAME)
    tf_xla = XlaStacks(TFFrameReplayBuffer(spec, SEGMENTS, RING, history_len=3, seed=2))  # stacked by XLA
    buffers = [
        uniform_sides(sides, "tf", TFUniformReplayBuffer(SPEC, SEGMENTS, RING, seed=0)),
        uniform_sides(sides, "py", PyUniformReplayBuffer(SPEC, batch_size=SEGMENTS, max_length=RING, seed=0)),
        frame_sides(sides, "tf", TFFrameReplayBuffer(spec, SEGMENTS, RING, history_len=3, seed=1)),
        frame_sides(sides, "tf-xla", tf_xla),
        frame_sides(sides, "py", PyFrameReplayBuffer(spec, batch_size=SEGMENTS, max_length=RING, history_len=3)),
    ]

    sides.race(RACE_ROUNDS)

    for buf in buffers:
        buf.tally.check()
    for buf in buffers[:2]:
        buf.check_all()
    print("rounds per side:", sides.rounds)
