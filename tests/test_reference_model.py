"""Both buffers against a plain Python model of the ring (hypothesis state machine).

The model keeps, per segment, a list of the stored payloads: append, and drop
the oldest past `max_length`. Every stored item carries a payload never used
before, so stale rows (after a wrap-around or a clear) cannot pass for live ones.
"""

import itertools
import re

import numpy as np
import pytest
from helpers import SPEC, decode, make_items
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tfreplay import PyUniformReplayBuffer, TFUniformReplayBuffer
from tfreplay.uniform import empty_message

PAYLOADS = itertools.count(1000)  # shared by every example: a payload is never reused
_BUFFERS = {}  # one buffer per layout, cleared by each example, so TF traces once


def cached_buffer(kind: str, batch_size: int, max_length: int):
    key = (kind, batch_size, max_length)
    if key not in _BUFFERS:
        if kind == "tf":
            _BUFFERS[key] = TFUniformReplayBuffer(SPEC, batch_size=batch_size, max_length=max_length, seed=0)
        elif kind == "py":
            _BUFFERS[key] = PyUniformReplayBuffer(SPEC, batch_size=batch_size, max_length=max_length, seed=0)
        else:  # TF-Agents' construction: one ring, batches of any size
            _BUFFERS[key] = PyUniformReplayBuffer(SPEC, max_length, seed=0)
    return _BUFFERS[key]


class RingModel(RuleBasedStateMachine):
    KIND = "tf"

    @initialize(batch_size=st.sampled_from([1, 2, 3]), max_length=st.sampled_from([1, 2, 3, 5]))
    def make(self, batch_size, max_length):
        if self.KIND == "py-capacity":
            batch_size = 1
        self.batch_size, self.max_length = batch_size, max_length
        self.rb = cached_buffer(self.KIND, batch_size, max_length)
        self.rb.clear()
        self.segments = [[] for _ in range(batch_size)]  # payloads, oldest first
        self.num_adds = 0  # items each segment received since the clear

    # --- the model ---------------------------------------------------------------

    def model_add(self, payloads: np.ndarray) -> None:
        for row in payloads.reshape(-1, self.batch_size):
            for segment, payload in zip(self.segments, row):
                segment.append(int(payload))
                del segment[: -self.max_length]
            self.num_adds += 1

    def payload(self, global_id: int) -> int:
        """The model's payload for a global id, asserting the item is live."""
        segment, local = global_id % self.batch_size, global_id // self.batch_size
        stored = self.segments[segment]
        first = self.num_adds - len(stored)
        assert first <= local < self.num_adds, f"id {global_id} is not live"
        return stored[local - first]

    # --- rules -------------------------------------------------------------------

    @rule(data=st.data())
    def add_batch(self, data):
        rows = self.batch_size
        if self.KIND == "py-capacity":
            rows = data.draw(st.integers(0, 2 * self.max_length + 1), label="rows")
        payloads = np.array([next(PAYLOADS) for _ in range(rows)], np.int64)
        self.rb.add_batch(make_items(payloads))
        self.model_add(payloads)

    @rule(
        sample_batch_size=st.sampled_from([None, 1, 4]),
        num_steps=st.sampled_from([None, 1, 2, 3]),
        time_stacked=st.booleans(),
    )
    def get_next(self, sample_batch_size, num_steps, time_stacked):
        if num_steps is not None and num_steps > self.max_length:
            with pytest.raises(ValueError, match=r"num_steps \(\d\) must be at most max_length"):
                self.rb.get_next(sample_batch_size, num_steps, time_stacked)
            return
        if len(self.segments[0]) < (num_steps or 1):
            with pytest.raises(ValueError, match=re.escape(empty_message("get_next", num_steps))):
                self.rb.get_next(sample_batch_size, num_steps, time_stacked)
            return
        items, info = self.rb.get_next(sample_batch_size, num_steps, time_stacked)
        if num_steps is not None and not time_stacked:
            assert isinstance(items, tuple) and len(items) == num_steps
            values = np.stack([decode(step) for step in items], axis=-1)
            ids = np.stack([np.asarray(i) for i in info.ids], axis=-1)
        else:
            values, ids = decode(items), np.asarray(info.ids)
        outer = [d for d in (sample_batch_size, num_steps) if d is not None]
        assert list(ids.shape) == outer
        windows = ids.reshape(-1, num_steps or 1)
        for window, window_values in zip(windows, values.reshape(windows.shape)):
            assert len(set(window % self.batch_size)) == 1, "a window mixes segments"
            assert (np.diff(window // self.batch_size) == 1).all(), "a window is not consecutive"
            assert [self.payload(int(i)) for i in window] == window_values.tolist()
        num_starts = self.batch_size * (len(self.segments[0]) - (num_steps or 1) + 1)
        np.testing.assert_allclose(info.probabilities, 1 / num_starts, rtol=1e-6)

    @rule()
    def clear(self):
        self.rb.clear()
        self.segments = [[] for _ in range(self.batch_size)]
        self.num_adds = 0

    # --- checked after every step -----------------------------------------------------

    @invariant()
    def stores_exactly_the_model(self):
        assert int(self.rb.num_frames()) == sum(map(len, self.segments))
        everything = self.rb.gather_all()
        assert np.asarray(everything["id"]).shape == (self.batch_size, len(self.segments[0]))
        assert decode(everything).tolist() == self.segments


SETTINGS = settings(
    max_examples=100,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,  # the same examples every run
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@SETTINGS
class TFRingModel(RingModel):
    KIND = "tf"


@SETTINGS
class PyRingModel(RingModel):
    KIND = "py"


@SETTINGS
class PyCapacityRingModel(RingModel):
    KIND = "py-capacity"


TestTFUniformReplayBuffer = pytest.mark.slow(TFRingModel.TestCase)
TestPyUniformReplayBuffer = PyRingModel.TestCase
TestPyUniformReplayBufferFromCapacity = PyCapacityRingModel.TestCase
