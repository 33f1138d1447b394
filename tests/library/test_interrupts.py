"""A NumPy `add_batch` interrupted wherever Ctrl-C can land happened whole or not at all.

A profile function raises `KeyboardInterrupt` at a random point of the call
where CPython would run a pending signal's handler (as any Python function
starts, as any C function returns: tfreplay's, NumPy's, `tf.nest`'s), as
Ctrl-C does in the main thread. A second buffer, never
interrupted, takes the same adds: after each interrupt the first must show
exactly what the second showed before the add or after it (its items, its
counts and the sampling mass of every window length it draws), and, once the
add is made whole, draw the same samples from the same seed.
"""

import dataclasses
import functools
import os
import sys
from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf
from helpers import run_threads, to_numpy

from tfreplay import (
    EmptyBufferError,
    PyFrameReplayBuffer,
    PyPrioritizedFrameReplayBuffer,
    PyPrioritizedReplayBuffer,
    PyUniformReplayBuffer,
    frame_data_spec,
)

SEGMENTS, LENGTH = 2, 6  # small, so adds wrap around early and overwrite items (and their priorities and bins)
ROWS_SPEC = {"id": tf.TensorSpec([], tf.int64), "obs": tf.TensorSpec([2], tf.float32)}
EPISODE_SPEC = {**ROWS_SPEC, "step_type": tf.TensorSpec([], tf.int32)}
FRAME_SPEC = {**frame_data_spec((2, 2)), "action": tf.TensorSpec([], tf.int64)}


@dataclasses.dataclass(frozen=True)
class Kind:
    """A NumPy buffer kind: how to build one, its items for global ids, the window lengths it draws."""

    make: Callable[[], Any]
    items: Callable[[np.ndarray, np.ndarray], dict]  # (ids, episode starts) -> items
    steps: tuple = (None,)
    ring: bool = False  # one ring taking any number of rows per add (else one row per segment)
    prioritized: bool = False
    frames: bool = False


def rows(ids, starts):
    return {"id": ids, "obs": np.stack([ids, -ids], -1).astype(np.float32)}


def episode_rows(ids, starts):
    return {**rows(ids, starts), "step_type": np.where(starts, 0, 1).astype(np.int32)}


def frame_rows(ids, starts):
    frame = np.broadcast_to((ids % 251).astype(np.uint8)[:, None, None], (len(ids), 2, 2))
    zeros = np.zeros(len(ids), bool)
    return {
        "frame": frame.copy(),
        "first": starts,
        "action": ids,
        "reward": ids.astype(np.float32),
        "terminated": zeros,
        "truncated": zeros,
    }


def layout(**kwargs):
    return dict(batch_size=SEGMENTS, max_length=LENGTH, seed=0, **kwargs)


KINDS = {
    "uniform": Kind(lambda: PyUniformReplayBuffer(ROWS_SPEC, **layout()), rows, (None, 2)),
    "uniform-ring": Kind(lambda: PyUniformReplayBuffer(ROWS_SPEC, 2 * LENGTH, seed=0), rows, (None, 3), ring=True),
    "prioritized": Kind(
        lambda: PyPrioritizedReplayBuffer(ROWS_SPEC, alpha=1.0, **layout()), rows, (None, 2), prioritized=True
    ),
    "prioritized-episodes": Kind(
        lambda: PyPrioritizedReplayBuffer(EPISODE_SPEC, alpha=1.0, within_episodes=True, **layout()),
        episode_rows,
        prioritized=True,
    ),
    "windows": Kind(
        lambda: PyUniformReplayBuffer(EPISODE_SPEC, within_episodes=True, **layout()), episode_rows, (None, 2, 3)
    ),
    "frames": Kind(
        lambda: PyFrameReplayBuffer(FRAME_SPEC, history_len=2, **layout()), frame_rows, (None, 2), frames=True
    ),
    "prioritized-frames": Kind(
        lambda: PyPrioritizedFrameReplayBuffer(FRAME_SPEC, history_len=2, alpha=1.0, **layout()),
        frame_rows,
        prioritized=True,
        frames=True,
    ),
}


class Interrupt:
    """A profile function that raises `KeyboardInterrupt` at the `at`-th (from 0; None: never) point of the
    profiled call where CPython runs a pending signal's handler: as a Python function starts and as a C
    function returns to its caller (the interrupt then comes from the calling instruction, the C function's
    work done). Python unsets a profile function that raised, so the rest runs as after a real Ctrl-C."""

    def __init__(self, at: int | None):
        self.at, self.count = at, 0

    def __call__(self, frame, event, arg):
        if event in ("call", "c_return"):
            self.count += 1
            if self.count - 1 == self.at:
                raise KeyboardInterrupt


def interrupted(call: Callable[[], Any], at: int | None) -> tuple[bool, int]:
    """`call()` interrupted at its `at`-th signal point: (whether it raised KeyboardInterrupt, points passed)."""
    profile = Interrupt(at)
    sys.setprofile(profile)
    try:
        call()
    except KeyboardInterrupt:
        return True, profile.count
    finally:
        sys.setprofile(None)
    return False, profile.count


def observe(rb, kind: Kind) -> list:
    """What the buffer shows without drawing (so without moving its generator)."""
    seen = [int(rb.num_frames()), to_numpy(rb.gather_all())]
    seen += [np.asarray(rb.sampling_mass(n)) for n in kind.steps]
    if kind.frames:
        seen.append(int(rb.num_transitions()))
    return seen


def observe_from_another_thread(rb, kind: Kind) -> list:
    """`observe(rb)` from another thread, which must get through the buffer's lock within 10 seconds."""
    seen: list = []
    run_threads([lambda: seen.append(observe(rb, kind))], timeout=10.0)
    return seen[0]


def draw(rb, n) -> Any:
    try:
        items, info = rb.get_next(3, num_steps=n)
    except EmptyBufferError as err:
        return str(err)
    return to_numpy(items), np.asarray(info.ids), np.asarray(info.probabilities)


def same(a, b) -> bool:
    try:
        tf.nest.assert_same_structure(a, b)
    except (ValueError, TypeError):
        return False
    flat_a, flat_b = tf.nest.flatten(a), tf.nest.flatten(b)
    return all(np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y) for x, y in zip(flat_a, flat_b))


def check_payloads(kind: Kind, sample: Any) -> Any:
    """`sample`, once each drawn item is seen to carry its own id (row kinds store it; frame kinds as action)."""
    if not isinstance(sample, str):
        items, ids, _ = sample
        payload = items["action"] if kind.frames else items["id"]
        assert np.array_equal(payload, ids), (payload, ids)
    return sample


def run_trials(kind: Kind, trials: int, seed: int) -> dict:
    """Interrupted adds against an uninterrupted twin; counts of what each interrupt left."""
    rng = np.random.default_rng(seed)
    rb, ref = kind.make(), kind.make()
    counts = {"interrupted": 0, "whole": 0, "none": 0, "torn": 0}
    next_local = np.zeros(SEGMENTS, np.int64)  # per segment (the ring: segment 0 only)
    most = None  # signal points of the longest uninterrupted add (a tenth more: some adds run whole)
    for _ in range(trials):
        segments = np.zeros(rng.integers(1, 4), np.int64) if kind.ring else np.arange(SEGMENTS)
        local = next_local[segments] + (np.arange(len(segments)) if kind.ring else 0)
        ids = local * (1 if kind.ring else SEGMENTS) + segments
        items = kind.items(ids, rng.random(len(ids)) < 0.3)
        next_local[np.unique(segments)] += len(segments) if kind.ring else 1
        before = observe(ref, kind)
        ref.add_batch(items)
        after = observe(ref, kind)
        at = None if most is None else int(rng.integers(0, most + most // 10 + 1))
        raised, ran = interrupted(functools.partial(rb.add_batch, items), at)
        most = max(most or 0, ran if not raised else 0)
        counts["interrupted"] += raised
        seen = observe_from_another_thread(rb, kind)
        landed = same(seen, after)
        if raised and not landed and same(seen, before):
            counts["none"] += 1
            rb.add_batch(items)  # now whole: the buffers must agree from here on
            landed = same(observe(rb, kind), after)
        else:
            counts["whole"] += raised and landed
        if landed and same(before, after):  # an add that shows nothing (a frame buffer's first frame over
            for buffer in (rb, ref):  # another's): whether it landed is unknown, so both start again empty
                buffer.clear()
            next_local[:] = 0
            continue
        if not landed or any(not same(draw(rb, n), check_payloads(kind, draw(ref, n))) for n in kind.steps):
            counts["torn"] += 1
            rb, ref, next_local = kind.make(), kind.make(), np.zeros(SEGMENTS, np.int64)  # start again
            continue
        if kind.prioritized and rng.random() < 0.3:  # later adds enter at the largest priority given
            sample = draw(ref, None)
            if not isinstance(sample, str):
                priorities = rng.integers(1, 6, size=sample[1].shape).astype(np.float64)
                draw(rb, None)  # keeps the generators together
                rb.update_priorities(sample[1], priorities)
                ref.update_priorities(sample[1], priorities)
    return counts


@pytest.mark.parametrize("name", list(KINDS))
def test_an_interrupted_numpy_add_happens_whole_or_not_at_all(name):
    counts = run_trials(KINDS[name], trials=120, seed=29)
    assert counts["interrupted"] >= 80 and counts["none"] and counts["whole"], counts
    assert counts["torn"] == 0, f"{name}: {counts}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(KINDS))
def test_an_interrupted_numpy_add_happens_whole_or_not_at_all_soak(name):
    """`TFREPLAY_SOAK_INTERRUPTS` adds per kind (default 800), most of them interrupted."""
    trials = int(os.environ.get("TFREPLAY_SOAK_INTERRUPTS", "800"))
    counts = run_trials(KINDS[name], trials=trials, seed=2900 + list(KINDS).index(name))
    assert counts["torn"] == 0, f"{name}: {counts}"
