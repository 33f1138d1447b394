"""`tf.train.Checkpoint` saves and restores every buffer exactly, mid-wrap-around, and refuses the rest.

Exactly means: the same rows, the same ring counter and the same random state,
so a resumed run stores and samples what the uninterrupted one would. Refused
(with a `ValueError` naming the field, and the buffer left as it was): a
checkpoint of another layout or dtype, of another buffer class or library, of
another format version, or crafted (a pickle payload must never run).
"""

import json
import pickle
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    FRAME,
    SPEC,
    Api,
    assert_nest_equal,
    decode,
    make_items,
    make_stream,
    quick,
    row,
    state,
    to_numpy,
)

from tfreplay import (
    PyFrameReplayBuffer,
    PyPrioritizedReplayBuffer,
    PyUniformReplayBuffer,
    TFFrameReplayBuffer,
    TFPrioritizedReplayBuffer,
    TFUniformReplayBuffer,
    frame_data_spec,
)


def filled(buffer_cls, seed=3) -> Api:
    api = Api(buffer_cls(SPEC, batch_size=3, max_length=4, seed=seed))
    api.add_steps(6)  # wrapped: the write head is mid-segment
    api.get_next(sample_batch_size=5, num_steps=2)  # the generator has moved on from its seed
    return api


def test_restore_undoes_later_adds_clears_and_samples(buffer_cls, tmp_path):
    subject, twin = filled(buffer_cls), filled(buffer_cls)
    checkpoint = tf.train.Checkpoint(buffer=subject.rb)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    subject.add_steps(3)
    subject.get_next(sample_batch_size=9)
    subject.clear()
    subject.add_batch(make_items([50, 51, 52]))
    checkpoint.restore(path).assert_existing_objects_matched()
    assert_nest_equal(state(subject, num_steps=2), state(twin, num_steps=2))
    for api in (subject, twin):
        api.num_adds = 6
        api.add_steps(2)  # the resumed ring writes where the uninterrupted one does
    assert_nest_equal(state(subject, num_steps=3), state(twin, num_steps=3))
    np.testing.assert_array_equal(decode(subject.gather_all())[:, 0], [12, 13, 14])


def test_restore_into_a_new_buffer_resumes_the_same_run(buffer_cls, tmp_path):
    saved, twin = filled(buffer_cls), filled(buffer_cls)
    path = tf.train.Checkpoint(buffer=saved.rb).save(str(tmp_path / "ckpt"))
    fresh = Api(buffer_cls(SPEC, batch_size=3, max_length=4, seed=99))
    tf.train.Checkpoint(buffer=fresh.rb).restore(path).assert_existing_objects_matched()
    assert fresh.num_frames() == 12
    assert_nest_equal(state(fresh, num_steps=2), state(twin, num_steps=2))
    ds_ids = [info.ids.numpy().tolist() for _, info in fresh.rb.as_dataset(single_deterministic_pass=True)]
    assert ds_ids == decode(twin.gather_all()).ravel().tolist()


def test_restore_replays_the_same_draws(buffer_cls, tmp_path):
    api = filled(buffer_cls)
    path = tf.train.Checkpoint(buffer=api.rb).save(str(tmp_path / "ckpt"))
    expected = api.get_next(sample_batch_size=20, num_steps=2)
    tf.train.Checkpoint(buffer=api.rb).restore(path)
    assert_nest_equal(api.get_next(sample_batch_size=20, num_steps=2), expected)


def test_tf_buffer_state_is_plain_variables(tmp_path):
    """Rows (one variable per leaf), the ring counter and the generator's state."""
    api = filled(TFUniformReplayBuffer)
    path = tf.train.Checkpoint(buffer=api.rb).save(str(tmp_path / "ckpt"))
    names = [name for name, _ in tf.train.list_variables(path) if name.startswith("buffer/")]
    assert sum("/_state/storage" in n for n in names) == len(tf.nest.flatten(SPEC)), names
    assert any("_num_adds" in n for n in names) and any("_rng" in n for n in names), names


# All four buffers, saved mid-wrap-around and checked through what a user sees.
KINDS = ["tf-uniform", "py-uniform", "tf-frames", "py-frames"]
CLASSES = {
    "tf-uniform": TFUniformReplayBuffer,
    "py-uniform": PyUniformReplayBuffer,
    "tf-frames": TFFrameReplayBuffer,
    "py-frames": PyFrameReplayBuffer,
}
GEOMETRY = {"uniform": (2, 4), "frames": (2, 6)}  # (batch_size, max_length) of the saved buffers
STREAM_ROWS = 64


def build(kind: str, batch_size=None, max_length=None, *, seed=1, history_len=2, dtype=None, one_ring=False):
    """A buffer of `kind`; by default of its saved geometry. `one_ring`: one segment of the same capacity."""
    default_batch, default_length = GEOMETRY[kind.split("-")[1]]
    batch_size, max_length = batch_size or default_batch, max_length or default_length
    cls = CLASSES[kind]
    if kind.endswith("uniform"):
        spec = SPEC if dtype is None else {**SPEC, "obs": {**SPEC["obs"], "pixels": tf.TensorSpec([4, 4], dtype)}}
        kwargs = dict(batch_size=batch_size, max_length=max_length)
    else:
        spec = frame_data_spec(FRAME, frame_dtype=dtype or tf.uint8)
        kwargs = dict(batch_size=batch_size, max_length=max_length, history_len=history_len)
    if one_ring and kind.startswith("py"):
        return cls(spec, batch_size * max_length, seed=seed, **{k: v for k, v in kwargs.items() if k == "history_len"})
    if one_ring:
        kwargs.update(batch_size=1, max_length=batch_size * max_length)
    return cls(spec, seed=seed, **kwargs)


def add_rows(rb, first: int, count: int) -> None:
    """Adds rows `first .. first + count - 1` of one fixed stream per segment (the same for every buffer)."""
    segments = rb.batch_size
    if "Uniform" in type(rb).__name__:
        for i in range(first, first + count):
            items = make_items(i * segments + np.arange(segments))
            items["obs"]["pixels"] = items["obs"]["pixels"].astype(rb.data_spec["obs"]["pixels"].dtype.as_numpy_dtype)
            rb.add_batch(items)
        return
    streams = [make_stream(np.random.default_rng(s), s, STREAM_ROWS) for s in range(segments)]
    for stream in streams:
        stream["frame"] = stream["frame"].astype(rb.data_spec["frame"].dtype.as_numpy_dtype)
    for i in range(first, first + count):
        rb.add_batch(row(streams, i))


def observed(rb):
    """What a user sees: every stored item, the count, and the next seeded samples (drawing moves the generator)."""
    num_frames = int(rb.num_frames())
    sample = None
    if num_frames:
        sample = rb.get_next(sample_batch_size=5, num_steps=2 if "Uniform" in type(rb).__name__ else None)
    return to_numpy(rb.gather_all()), num_frames, to_numpy(sample)


def saved_run(kind: str):
    """A buffer past wrap-around whose generator has moved on from its seed."""
    rb = build(kind)
    add_rows(rb, 0, 9)
    observed(rb)
    return rb


@pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=pytest.mark.slow) if k == "tf-frames" else k for k in KINDS]
)  # the TF frame buffers compile their draws with XLA: about 10 s
def test_round_trip_mid_wrap_around_resumes_the_same_run(kind, tmp_path):
    saved = saved_run(kind)
    path = tf.train.Checkpoint(buffer=saved).save(str(tmp_path / "ckpt"))
    add_rows(saved, 9, 2)
    saved.clear()
    fresh = build(kind, seed=99)
    add_rows(fresh, 0, 3)
    for rb in (saved, fresh):
        tf.train.Checkpoint(buffer=rb).restore(path).assert_existing_objects_matched()
        twin = saved_run(kind)  # the uninterrupted run
        assert_nest_equal(observed(rb), observed(twin))
        for buffer in (rb, twin):
            add_rows(buffer, 9, 3)  # the resumed ring writes and draws where the uninterrupted one does
        assert_nest_equal(observed(rb), observed(twin))


# (storage, target buffer, the message naming the field, the saved value and this buffer's)
MISMATCHES = [
    pytest.param(
        "uniform",
        dict(batch_size=4, max_length=2),
        r"batch_size \(2\) must equal this buffer's \(4\)",
        id="2x4-into-4x2",
    ),
    pytest.param(
        "uniform", dict(one_ring=True), r"batch_size \(2\) must equal this buffer's \(1\)", id="2x4-into-one-ring"
    ),
    pytest.param("uniform", dict(max_length=3), r"max_length \(4\) must equal this buffer's \(3\)", id="2x4-into-2x3"),
    pytest.param(
        "uniform",
        dict(dtype=tf.float32),
        r"dtype of obs/pixels \('uint8'\) must equal this buffer's \('float32'\)",
        id="uint8-into-float32",
    ),
    pytest.param(
        "frames",
        dict(batch_size=4, max_length=3),
        r"batch_size \(2\) must equal this buffer's \(4\)",
        id="2x6-into-4x3",
    ),
    pytest.param(
        "frames", dict(one_ring=True), r"batch_size \(2\) must equal this buffer's \(1\)", id="2x6-into-one-ring"
    ),
    pytest.param(
        "frames",
        dict(dtype=tf.float32),
        r"dtype of frame \('uint8'\) must equal this buffer's \('float32'\)",
        id="uint8-into-float32",
    ),
    pytest.param(
        "frames", dict(history_len=3), r"history_len \(2\) must equal this buffer's \(3\)", id="history-2-into-3"
    ),
]


# Every mismatch on the NumPy twin; on the TF twin (a run saved and two buffers built per case, seconds each) one of
# each storage: the check reads the checkpoint's layout before either backend's state.
LAYOUT_CASES = [pytest.param(*m.values, "py", id=f"{m.id}-py") for m in MISMATCHES] + [
    pytest.param(*m.values, "tf", id=f"{m.id}-tf", marks=pytest.mark.slow)
    for m in MISMATCHES
    if m.id in ("2x4-into-2x3", "history-2-into-3")
]


@pytest.mark.parametrize("storage, target, message, twin", LAYOUT_CASES)
def test_a_checkpoint_of_another_layout_or_dtype_is_refused_and_changes_nothing(
    storage, target, message, twin, tmp_path
):
    kind = f"{twin}-{storage}"
    path = tf.train.Checkpoint(buffer=saved_run(kind)).write(str(tmp_path / "ckpt"))
    rb, reference = build(kind, seed=5, **target), build(kind, seed=5, **target)
    for buffer in (rb, reference):
        add_rows(buffer, 0, 5)
    with pytest.raises(ValueError, match=rf"checkpoint restore: the checkpoint's {message}; restore into a buffer"):
        tf.train.Checkpoint(buffer=rb).restore(path)
    assert_nest_equal(observed(rb), observed(reference))


SAMPLED = {
    "uniform": {"tf": TFUniformReplayBuffer, "py": PyUniformReplayBuffer},
    "prioritized": {"tf": TFPrioritizedReplayBuffer, "py": PyPrioritizedReplayBuffer},
}


@pytest.mark.parametrize("twin", ["tf", "py"])
@pytest.mark.parametrize("saved, target", [("uniform", "prioritized"), ("prioritized", "uniform")])
def test_a_checkpoint_of_the_other_sampler_names_both_kinds_and_changes_nothing(twin, saved, target, tmp_path):
    def made(kind, seed, adds):
        rb = SAMPLED[kind][twin](SPEC, batch_size=2, max_length=4, seed=seed)
        for step in range(adds):
            rb.add_batch(make_items(step * 2 + np.arange(2)))
        return rb

    path = tf.train.Checkpoint(buffer=made(saved, 1, 9)).write(str(tmp_path / "ckpt"))
    rb, reference = made(target, 5, 3), made(target, 5, 3)
    with pytest.raises(
        ValueError,
        match=rf"checkpoint restore: the checkpoint's sum_tree \(.*\) must equal this buffer's \(.*\): the checkpoint "
        rf"holds a {saved} buffer; this buffer is {target}\. Restore it into a {saved} buffer of the same layout",
    ):
        tf.train.Checkpoint(buffer=rb).restore(path)
    assert_nest_equal(observed(rb), observed(reference))


class ForeignBuffer(tf.Module):
    """Another library's buffer (TF-Agents' names), saved under the same checkpoint key."""

    def __init__(self):
        super().__init__()
        self._data_table = tf.Variable(tf.zeros([8, 3]))
        self._id_table = tf.Variable(tf.zeros([8], tf.int64))
        self._last_id = tf.Variable(7, dtype=tf.int64)


class UnversionedTFBuffer(tf.Module):
    """A TF buffer's state as tfreplay wrote it before checkpoint format 1: no layout record."""

    def __init__(self):
        super().__init__()
        self._num_adds = tf.Variable([5, 5], dtype=tf.int64)
        self._rng = tf.random.Generator.from_seed(1)


@pytest.mark.parametrize("kind", quick(KINDS, "tf-uniform", "py-uniform", "py-frames"))
def test_a_checkpoint_without_tfreplay_state_is_refused(kind, tmp_path):
    path = tf.train.Checkpoint(buffer=ForeignBuffer()).write(str(tmp_path / "ckpt"))
    rb, reference = build(kind), build(kind)
    for buffer in (rb, reference):
        add_rows(buffer, 0, 3)
    name = CLASSES[kind].__name__
    with pytest.raises(
        ValueError,
        match=rf"checkpoint's buffer state '_data_table' must be one of this {name}'s .*"
        rf"holds no {name} state of tfreplay format 1",
    ):
        tf.train.Checkpoint(buffer=rb).restore(path)
    assert_nest_equal(observed(rb), observed(reference))


def test_a_tf_checkpoint_written_before_the_layout_record_is_refused(tmp_path):
    path = tf.train.Checkpoint(buffer=UnversionedTFBuffer()).write(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match=r"buffer state \('_\w+'\) must come with a tfreplay layout record"):
        tf.train.Checkpoint(buffer=build("tf-uniform")).restore(path)


@pytest.mark.parametrize(
    "saved, target",
    [
        ("tf-uniform", "py-uniform"),
        ("py-frames", "tf-frames"),
        ("tf-uniform", "tf-frames"),
        ("py-frames", "py-uniform"),
    ],
)
def test_a_checkpoint_of_another_buffer_class_is_refused(saved, target, tmp_path):
    path = tf.train.Checkpoint(buffer=saved_run(saved)).write(str(tmp_path / "ckpt"))
    # Another twin's state has other children; the same twin's other storage fails the layout check.
    with pytest.raises(ValueError, match=rf"holds no {CLASSES[target].__name__} state|storage \('\w+'\) must equal"):
        tf.train.Checkpoint(buffer=build(target)).restore(path)


def test_a_rows_checkpoint_restored_into_a_frame_buffer_names_the_storage(tmp_path):
    path = tf.train.Checkpoint(buffer=saved_run("py-uniform")).write(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match=r"the checkpoint's storage \('rows'\) must equal this buffer's \('frames'\)"):
        tf.train.Checkpoint(buffer=build("py-frames")).restore(path)


# Untrusted checkpoints: a pickle payload must be refused without running.
PAYLOAD_RAN = []


def _mark_payload_ran():
    PAYLOAD_RAN.append(True)


class Payload:
    def __reduce__(self):
        return _mark_payload_ran, ()


@pytest.fixture
def payload():
    """Pickled bytes that run `_mark_payload_ran` when unpickled (checked once here)."""
    PAYLOAD_RAN.clear()
    data = pickle.dumps(Payload())
    pickle.loads(data)
    assert PAYLOAD_RAN == [True]
    PAYLOAD_RAN.clear()
    yield data
    ran, PAYLOAD_RAN[:] = list(PAYLOAD_RAN), []
    assert ran == [], "the checkpoint's pickle payload ran"


class PickledState(tf.train.experimental.PythonState):
    """The pre-format-1 NumPy buffer state: a pickle (here, one that runs code)."""

    def __init__(self, data: bytes):
        self.data = data

    def serialize(self):
        return self.data

    def deserialize(self, string_value):
        raise AssertionError("never restored")


def rewrite(path: str, out: str, **entries) -> str:
    """A copy of checkpoint `path` at `out`, the entry whose key ends in `/<name>` set to `entries[name]`."""
    reader = tf.train.load_checkpoint(path)
    names = sorted(reader.get_variable_to_shape_map())
    values = {n: reader.get_tensor(n) for n in names}
    for entry, value in entries.items():
        (key,) = [n for n in names if n.endswith(f"/{entry}")]
        values[key] = value
    tensors = [tf.convert_to_tensor(values[n]) for n in names]
    tf.raw_ops.SaveV2(prefix=out, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)
    return out


def saved_layout(path: str, **changes) -> str:
    reader = tf.train.load_checkpoint(path)
    key = next(n for n in reader.get_variable_to_shape_map() if n.endswith(("/layout", "/py_state")))
    return json.dumps({**json.loads(reader.get_tensor(key)), **changes})


def saved_layout_without(path: str, field: str) -> str:
    layout = json.loads(saved_layout(path))
    del layout[field]
    return json.dumps(layout)


def test_the_pre_format_pickle_state_is_refused_without_running_it(payload, tmp_path):
    old = tf.Module()
    old._checkpoint_state = PickledState(payload)
    path = tf.train.Checkpoint(buffer=old).write(str(tmp_path / "ckpt"))
    rb, reference = build("py-uniform"), build("py-uniform")
    with pytest.raises(
        ValueError, match=r"buffer state '_checkpoint_state' must be one of this PyUniformReplayBuffer's"
    ):
        tf.train.Checkpoint(buffer=rb).restore(path)
    assert_nest_equal(observed(rb), observed(reference))


NEWER_FORMAT = r"format \(2\) must be 1; it was written by another tfreplay version"
OLDER_INDEX = r"episode index must keep each segment's newest item \(index_newest\); it was written by an earlier"
# (kind, entry, its crafted value (a callable of the payload and the saved path), the message)
CRAFTED = [
    ("py-uniform", "rng", lambda p, _: p, r"rng state \(b'.*\) must be JSON written by tfreplay"),
    ("py-frames", "layout", lambda p, _: p, r"layout record \(b'.*\) must be JSON written by tfreplay"),
    ("tf-uniform", "py_state", lambda p, _: p, r"layout record \(b'.*\) must be JSON written by tfreplay"),
    (
        "py-uniform",
        "scalars",
        lambda p, _: json.dumps({"num_adds": 1.5}),
        r"counters \(\{\"num_adds\": 1.5\}\) must have the form",
    ),
    (
        "py-frames",
        "rng",
        lambda p, _: json.dumps({"bit_generator": "MT19937", "state": {"key": [1], "pos": 0}}),
        r"rng state .* must have the form of this buffer's",
    ),
    ("py-uniform", "layout", lambda p, path: saved_layout(path, format=2), NEWER_FORMAT),
    pytest.param(  # the format check is the record's, read alike by every buffer: on TF frames in the slow lane
        "tf-frames", "py_state", lambda p, path: saved_layout(path, format=2), NEWER_FORMAT, marks=pytest.mark.slow
    ),
    # An index from before `index/newest` (a TF one also lacks the variable): never restored as stale state.
    ("py-frames", "layout", lambda p, path: saved_layout_without(path, "index_newest"), OLDER_INDEX),
    ("tf-frames", "py_state", lambda p, path: saved_layout_without(path, "index_newest"), OLDER_INDEX),
    (
        "py-uniform",
        "array/storage/id",
        lambda p, _: np.zeros([8], np.int32),
        r"array storage/id \(\[\"int32\", \[8\]\]\) must equal",
    ),
]


@pytest.mark.parametrize("kind, entry, value, message", CRAFTED, ids=lambda x: x if isinstance(x, str) else None)
def test_a_crafted_checkpoint_is_refused_and_changes_nothing(kind, entry, value, message, payload, tmp_path):
    path = tf.train.Checkpoint(buffer=saved_run(kind)).write(str(tmp_path / "ckpt"))
    crafted = rewrite(path, str(tmp_path / "crafted"), **{entry: value(payload, path)})
    rb, reference = build(kind, seed=5), build(kind, seed=5)
    for buffer in (rb, reference):
        add_rows(buffer, 0, 5)
    with pytest.raises(ValueError, match=rf"checkpoint restore: the checkpoint's {message}"):
        tf.train.Checkpoint(buffer=rb).restore(crafted)
    assert_nest_equal(observed(rb), observed(reference))


RACE_ROWS, RACE_CHUNK = 20_000, 200


def racing_buffer(kind: str):
    """A one-ring NumPy buffer of 1 KB rows whose payload (`id`, or a frame's `action`) is the row's global id."""
    if kind == "py-uniform":
        spec = {"id": tf.TensorSpec([], tf.int64), "pad": tf.TensorSpec([1024], tf.uint8)}
        return PyUniformReplayBuffer(spec, RACE_ROWS, seed=0)
    return PyFrameReplayBuffer(frame_data_spec((32, 32)), RACE_ROWS, history_len=2, seed=0)


def race_rows(kind: str, first: int) -> dict:
    ids = np.arange(first, first + RACE_CHUNK)
    pad = np.broadcast_to((ids % 251).astype(np.uint8)[:, None], (RACE_CHUNK, 1024))
    if kind == "py-uniform":
        return {"id": ids, "pad": pad}
    return {
        "frame": pad.reshape(RACE_CHUNK, 32, 32),
        "first": ids % 50 == 0,
        "action": ids.astype(np.int32),
        "reward": np.zeros(RACE_CHUNK, np.float32),
        "terminated": ids % 50 == 49,
        "truncated": np.zeros(RACE_CHUNK, bool),
    }


@pytest.mark.parametrize("kind", ["py-uniform", "py-frames"])
def test_a_save_racing_a_writer_stores_a_consistent_snapshot(kind, tmp_path):
    """Saves while another thread adds: each checkpoint's rows are those its counters say (no newer row got in)."""
    rb = racing_buffer(kind)
    added, stop = [0], threading.Event()

    def add():
        rb.add_batch(race_rows(kind, added[0]))
        added[0] += RACE_CHUNK

    def keep_adding():
        while not stop.is_set():
            add()

    for _ in range(RACE_ROWS // RACE_CHUNK + 5):  # past wrap-around
        add()
    writer = threading.Thread(target=keep_adding, daemon=True)
    writer.start()
    paths, deadline = [], time.monotonic() + 60
    try:
        for i in range(6):
            start = added[0]
            while added[0] < start + 2 * RACE_CHUNK:  # the writer is running
                assert writer.is_alive() and time.monotonic() < deadline, "the writer stopped"
                time.sleep(0.001)
            paths.append(tf.train.Checkpoint(buffer=rb).write(str(tmp_path / f"ckpt{i}")))
    finally:
        stop.set()
        writer.join(30)
    for path in paths:
        restored = racing_buffer(kind)
        tf.train.Checkpoint(buffer=restored).restore(path)
        items = restored.gather_all()  # oldest first
        if kind == "py-uniform":
            ids, newest_frame = items["id"].ravel(), items["pad"][0, :, 0]
        else:
            ids, newest_frame = items["action"].astype(np.int64), items["next_observation"][:, 0, 0, -1]
        assert np.all(np.diff(ids) > 0) and ids[-1] - ids[0] < RACE_ROWS, "rows from after the saved counters"
        np.testing.assert_array_equal(newest_frame, ids % 251)


@pytest.mark.parametrize("kind", ["py-uniform", "py-frames"])
def test_a_saved_model_holding_a_numpy_buffer_exports_it(kind, tmp_path):
    """SavedModel traces the saver into a graph: the NumPy state is still written, and restores."""
    module = tf.Module()
    module.buffer = saved_run(kind)
    tf.saved_model.save(module, str(tmp_path / "model"))
    rb = build(kind, seed=7)
    tf.train.Checkpoint(buffer=rb).restore(str(tmp_path / "model" / "variables" / "variables"))
    assert_nest_equal(observed(rb), observed(saved_run(kind)))
