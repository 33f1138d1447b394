"""Every buffer against a plain Python model (hypothesis state machines).

Uniform buffers: the model keeps, per segment, a list of the stored
payloads: append, and drop the oldest past `max_length`. Frame buffers: the
model keeps each segment's rows since the last clear (payload and `first`
flag) and asks `helpers.Reference` which transitions may be drawn and what
their stacks are. Every stored row carries a payload never used before, so
stale rows (after a wrap-around, a clear or a restore) cannot pass for live ones.
"""

import itertools
import os
import re
import shutil
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from helpers import FRAME, KINDS, SPEC, Reference, decode, id_frames, make_items, to_numpy
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tfreplay import (
    PyFrameReplayBuffer,
    PyUniformReplayBuffer,
    TFFrameReplayBuffer,
    TFUniformReplayBuffer,
    frame_data_spec,
)

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
            with pytest.raises(ValueError, match=re.escape(self.rb.empty_message("get_next", num_steps))):
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


# The TF twin runs the same rules in fewer examples: the NumPy twin's 100 (in `make test`) cover the model, and
# each TF example costs eager calls and a trace per buffer layout. TFREPLAY_TF_MODEL_EXAMPLES raises them.
TF_EXAMPLES = int(os.environ.get("TFREPLAY_TF_MODEL_EXAMPLES", "16"))


@settings(SETTINGS, max_examples=TF_EXAMPLES)
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


# --- frame buffers ------------------------------------------------------------------------

# (segments, max_length, history_len): few layouts, since a TF frame buffer
# compiles each sample shape once per buffer.
FRAME_LAYOUTS = [(2, 5, 2), (1, 6, 3)]
CHECKPOINTS = itertools.count()


def cached_frame_buffer(kind: str, layout: tuple):
    key = ("frames", kind) + layout
    if key not in _BUFFERS:
        segments, max_length, history_len = layout
        spec = frame_data_spec(FRAME)
        if kind == "tf":
            _BUFFERS[key] = TFFrameReplayBuffer(spec, segments, max_length, history_len=history_len, seed=0)
        else:
            _BUFFERS[key] = PyFrameReplayBuffer(
                spec, batch_size=segments, max_length=max_length, history_len=history_len, seed=0
            )
    return _BUFFERS[key]


def payload_rows(payloads, first) -> dict:
    """Frame-buffer rows whose frame and step entries all encode their payload."""
    payloads = np.asarray(payloads, np.int64)
    return {
        "frame": id_frames(payloads, FRAME),
        "first": np.asarray(first, bool).reshape(payloads.shape),
        "action": payloads.astype(np.int32),
        "reward": payloads.astype(np.float32) + np.float32(0.5),
        "terminated": payloads % 2 == 1,
        "truncated": payloads % 3 == 0,
    }


FIRST_FLAGS = st.sampled_from([False, False, False, True])  # episodes of about four rows


class FrameRingModel(RuleBasedStateMachine):
    KIND = "tf"

    @initialize(layout=st.sampled_from(FRAME_LAYOUTS))
    def make(self, layout):
        self.segments, self.max_length, self.history_len = layout
        self.rb = cached_frame_buffer(self.KIND, layout)
        self.rb.clear()
        self.rows = [[] for _ in range(self.segments)]  # per segment, (payload, first) since the clear
        self.checkpoint = tf.train.Checkpoint(buffer=self.rb)
        self.directory = tempfile.mkdtemp(prefix="tfreplay-frame-model-")
        self.saved = None  # (checkpoint path, rows) of the last save

    def teardown(self):
        if hasattr(self, "directory"):
            shutil.rmtree(self.directory, ignore_errors=True)

    def reference(self) -> Reference:
        streams = [payload_rows([p for p, _ in rows], [f for _, f in rows]) for rows in self.rows]
        return Reference(streams, self.max_length, self.history_len)

    # --- rules -------------------------------------------------------------------

    @rule(data=st.data())
    def add_batch(self, data):
        first = data.draw(st.lists(FIRST_FLAGS, min_size=self.segments, max_size=self.segments), label="first")
        payloads = [next(PAYLOADS) for _ in range(self.segments)]
        self.rb.add_batch(payload_rows(payloads, first))
        for rows, payload, flag in zip(self.rows, payloads, first):
            rows.append((payload, flag))

    @precondition(lambda self: self.KIND == "py")
    @rule(data=st.data())
    def add_sequence(self, data):
        segment = data.draw(st.integers(0, self.segments - 1), label="segment")
        first = data.draw(st.lists(FIRST_FLAGS, max_size=2 * self.max_length + 1), label="first")
        payloads = [next(PAYLOADS) for _ in first]
        self.rb.add_sequence(payload_rows(payloads, first), segment=segment)
        self.rows[segment].extend(zip(payloads, first))

    @rule()
    def clear(self):
        self.rb.clear()
        self.rows = [[] for _ in range(self.segments)]

    @rule()
    def save(self):
        path = self.checkpoint.write(os.path.join(self.directory, f"ckpt-{next(CHECKPOINTS)}"))
        self.saved = (path, [list(rows) for rows in self.rows])

    @precondition(lambda self: self.saved is not None)
    @rule()
    def restore(self):
        path, rows = self.saved
        self.checkpoint.read(path)
        self.rows = [list(r) for r in rows]

    @rule(
        sample_batch_size=st.sampled_from([None, 4]),
        num_steps=st.sampled_from([None, 2]),
        time_stacked=st.booleans(),
    )
    def get_next(self, sample_batch_size, num_steps, time_stacked):
        ref = self.reference()
        valid = ref.valid(num_steps or 1)
        if not valid:
            with pytest.raises(ValueError, match=KINDS["py-frame"].empty_message(num_steps)):
                self.rb.get_next(sample_batch_size, num_steps, time_stacked)
            return
        items, info = self.rb.get_next(sample_batch_size, num_steps, time_stacked)
        if num_steps is not None and not time_stacked:
            assert isinstance(items, tuple) and len(items) == num_steps
            for step, step_ids in zip(items, info.ids):
                ref.check(to_numpy(step), np.asarray(step_ids))
            ids = np.stack([np.asarray(i) for i in info.ids], axis=-1)
        else:
            ref.check(to_numpy(items), np.asarray(info.ids))
            ids = np.asarray(info.ids)
        assert list(ids.shape) == [d for d in (sample_batch_size, num_steps) if d is not None]
        windows = ids.reshape(-1, num_steps or 1)
        assert (np.diff(windows, axis=1) == self.segments).all(), "a window is not consecutive in one segment"
        assert set(windows[:, 0].tolist()) <= valid, "an invalid window was drawn"
        np.testing.assert_allclose(info.probabilities, 1 / len(valid), rtol=1e-6)

    # --- checked after every step -----------------------------------------------------

    @invariant()
    def stores_exactly_the_model(self):
        ref = self.reference()
        assert int(self.rb.num_frames()) == sum(min(len(rows), self.max_length) for rows in self.rows)
        assert int(self.rb.num_transitions()) == len(ref.valid())
        order = np.array(ref.in_order(), np.int64)  # segment by segment, oldest first
        everything = to_numpy(self.rb.gather_all())
        assert len(everything["action"]) == len(order)
        ref.check(everything, order)


@settings(SETTINGS, max_examples=max(1, TF_EXAMPLES // 2), stateful_step_count=20)
class TFFrameRingModel(FrameRingModel):
    KIND = "tf"


@settings(SETTINGS, max_examples=50, stateful_step_count=25)
class PyFrameRingModel(FrameRingModel):
    KIND = "py"


TestTFFrameReplayBuffer = pytest.mark.slow(TFFrameRingModel.TestCase)
TestPyFrameReplayBuffer = PyFrameRingModel.TestCase
