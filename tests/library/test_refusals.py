"""Refused calls change nothing, and accepted inputs never poison the buffer.

`update_priorities` takes priorities of any float dtype (what Keras losses
give) and refuses, leaving every priority as it was, ids that are not
integers, priorities that are negative (a negative subnormal too, whatever
the float mode), NaN, infinite, or so large that `priority ** alpha` summed
over the tree would overflow. A refused sample does not advance the random
generator: the same seed gives the same `get_next` samples whatever was
refused before. (A dataset draws elements ahead of its reads, tf.data's
prefetch, so where it leaves the generator is not defined in the first place.)
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPEC, make_items, quick

import tfreplay

B, L = 2, 16
PRIORITIZED = {
    "tf": lambda alpha=0.6: tfreplay.TFPrioritizedReplayBuffer(SPEC, B, L, alpha=alpha, seed=5),
    "py": lambda alpha=0.6: tfreplay.PyPrioritizedReplayBuffer(SPEC, batch_size=B, max_length=L, alpha=alpha, seed=5),
}


def filled(twin: str, alpha: float = 0.6):
    rb = PRIORITIZED[twin](alpha)
    for step in range(L):
        rb.add_batch(make_items(step * B + np.arange(B)))
    return rb


def odds(rb) -> float:
    """What the priorities decide: the mass every probability divides by."""
    return float(rb.sampling_mass())


@pytest.mark.parametrize("twin", sorted(PRIORITIZED))
@pytest.mark.parametrize(
    "dtype", quick([np.float16, np.float32, np.float64, "tf.float32", "tf.bfloat16"], np.float16, "tf.bfloat16")
)
def test_priorities_of_any_float_dtype_are_taken(twin, dtype):
    rb = filled(twin)
    ids = np.arange(4, dtype=np.int64)
    values = np.array([0.5, 1.0, 2.0, 4.0])
    if isinstance(dtype, str):
        priorities = tf.constant(values, getattr(tf, dtype.split(".")[1]))
    else:
        priorities = values.astype(dtype)
    assert int(rb.update_priorities(ids, priorities)) == 0
    _, info = rb.get_next(400)
    seen = np.asarray(info.ids)
    probs = np.asarray(info.probabilities)
    total = float(rb.sampling_mass())
    for i, p in zip(ids, values):
        if (seen == i).any():
            np.testing.assert_allclose(probs[seen == i][0], p**0.6 / total, rtol=1e-5)


@pytest.mark.parametrize("twin", sorted(PRIORITIZED))
def test_float32_priorities_inside_a_function_are_taken(twin):
    if twin == "py":
        pytest.skip("a NumPy buffer is updated eagerly")
    rb = filled(twin)
    update = tf.function(lambda ids, p: rb.update_priorities(ids, p))
    assert int(update(tf.range(4, dtype=tf.int64), tf.constant([0.5, 1.0, 2.0, 4.0], tf.float32))) == 0


BAD_IDS = {
    "float": (np.array([1.7, 2.0]), TypeError, r"update_priorities: ids \(float64\) must be integers"),
    "huge float": (np.array([1e30, 2.0]), TypeError, r"update_priorities: ids \(float64\) must be integers"),
    "bool": (np.array([True, False]), TypeError, r"update_priorities: ids \(bool\) must be integers"),
}
BAD_PRIORITIES = {
    "negative": (np.array([1.0, -1.0]), "finite and non-negative"),
    "negative subnormal": (np.array([1.0, -1e-310]), "finite and non-negative"),
    "nan": (np.array([1.0, np.nan]), "finite and non-negative"),
    "inf": (np.array([1.0, np.inf]), "finite and non-negative"),
    "overflowing": (np.array([1.0, 1e308]), "at most"),
}


@pytest.mark.parametrize("twin", sorted(PRIORITIZED))
@pytest.mark.parametrize("case", sorted(BAD_IDS))
def test_ids_that_are_not_integers_are_refused_and_change_nothing(twin, case):
    rb = filled(twin)
    before = odds(rb)
    ids, error, message = BAD_IDS[case]
    with pytest.raises(error, match=message):
        rb.update_priorities(ids, np.array([3.0, 3.0]))
    assert odds(rb) == before


@pytest.mark.parametrize("twin", sorted(PRIORITIZED))
@pytest.mark.parametrize("case", sorted(BAD_PRIORITIES))
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_bad_priorities_are_refused_and_change_nothing(twin, case, mode):
    """Eagerly a `ValueError` naming the values; in a graph `InvalidArgumentError` with the rule. Alpha 1, so
    1e308 is finite as a priority but its leaves' sum would not be."""
    if twin == "py" and mode == "function":
        pytest.skip("a NumPy buffer is updated eagerly")
    rb = filled(twin, alpha=1.0)
    before = odds(rb)
    priorities, words = BAD_PRIORITIES[case]
    ids = np.array([0, 1], np.int64)
    if mode == "eager":
        with pytest.raises(ValueError, match=rf"update_priorities: priorities .* must be .*{words}"):
            rb.update_priorities(ids, priorities)
    else:
        update = tf.function(lambda i, p: rb.update_priorities(i, p))
        rule = "every priority must be finite and non-negative, and small enough that priority"
        with pytest.raises(tf.errors.InvalidArgumentError, match=rule):
            update(tf.constant(ids), tf.constant(priorities, tf.float64))
    assert odds(rb) == before
    rb.add_batch(make_items(L * B + np.arange(B)))  # new items enter at a priority that still sums finitely
    assert np.isfinite(float(rb.sampling_mass()))


KINDS = {
    "tf-uniform": lambda: tfreplay.TFUniformReplayBuffer(SPEC, B, L, seed=9),
    "py-uniform": lambda: tfreplay.PyUniformReplayBuffer(SPEC, batch_size=B, max_length=L, seed=9),
    "tf-prioritized": lambda: tfreplay.TFPrioritizedReplayBuffer(SPEC, B, L, seed=9),
    "py-prioritized": lambda: tfreplay.PyPrioritizedReplayBuffer(SPEC, batch_size=B, max_length=L, seed=9),
    "tf-episodes": lambda: tfreplay.TFUniformReplayBuffer(
        {**SPEC, "step_type": tf.TensorSpec([], tf.int32)}, B, L, seed=9, within_episodes=True
    ),
    "py-episodes": lambda: tfreplay.PyUniformReplayBuffer(
        {**SPEC, "step_type": tf.TensorSpec([], tf.int32)}, batch_size=B, max_length=L, seed=9, within_episodes=True
    ),
}


def add(kind: str, rb, step: int) -> None:
    items = make_items(step * B + np.arange(B))
    if "episodes" in kind:
        items["step_type"] = np.full([B], 0 if step % 4 == 0 else 1, np.int32)
    rb.add_batch(items)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("mode", quick(["eager", "function"], "eager"))
def test_a_refused_sample_does_not_advance_the_generator(kind, mode):
    """Two buffers of one seed: the first refuses samples before it holds anything (and windows longer than its
    episodes after); both are then filled alike and draw the same samples."""
    if kind.startswith("py") and mode == "function":
        pytest.skip("a NumPy buffer samples eagerly")
    refusing, plain = KINDS[kind](), KINDS[kind]()
    num_steps = 2 if "prioritized" not in kind else None

    def refused_samples(rb, num_steps) -> None:
        for _ in range(3):
            with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="add more|add items|empty"):
                if mode == "eager":
                    rb.get_next(8, num_steps=num_steps)
                else:
                    tf.function(lambda: rb.get_next(8, num_steps=num_steps))()

    refused_samples(refusing, num_steps)
    if "episodes" in kind:  # one step of each episode: no window of 2 yet
        add(kind, refusing, 0)
        add(kind, plain, 0)
        refused_samples(refusing, 2)
        start = 1
    else:
        start = 0
    for step in range(start, 12):
        add(kind, refusing, step)
        add(kind, plain, step)
    for _ in range(3):
        a, b = (rb.get_next(8, num_steps=num_steps)[1] for rb in (refusing, plain))
        np.testing.assert_array_equal(np.asarray(a.ids), np.asarray(b.ids))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_sampling_an_empty_buffer_raises_the_public_error_a_caller_of_either_kind_catches(kind):
    """`EmptyBufferError` is a `ValueError` (tfreplay's refusals) and TF's `InvalidArgumentError` (what the same
    refusal raises in a graph): code written for either catches it. The buffer is unchanged and still samples."""
    rb = KINDS[kind]()
    for caught in (tfreplay.EmptyBufferError, ValueError, tf.errors.InvalidArgumentError):
        with pytest.raises(caught, match="add more|add items|empty"):
            rb.get_next(4)
    assert int(rb.num_frames()) == 0
    add(kind, rb, 0)
    items, info = rb.get_next(4)
    assert np.asarray(info.ids).shape == (4,)
