"""NumPy buffers with `storage_dir`: items in memory-mapped files, durable at `flush()`, resumed on reopen.

The contract suite runs over them too (`helpers.KINDS`, the `*-memmap` kinds); this file checks what only a
directory has: a reopened buffer samples exactly as the one that was never closed, a directory of another
buffer is refused and left unchanged, and a writer killed with SIGKILL loses only what it had not flushed.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf
from helpers import CONTRACT_FRAME, SPEC, assert_nest_equal, contract_rows, decode, make_items, quick

from tfreplay import PyFrameReplayBuffer, PyPrioritizedReplayBuffer, PyUniformReplayBuffer, frame_data_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fingerprint(path) -> dict:
    """Every file under `path` by name: its bytes' digest (what "unchanged" means for a directory)."""
    found = {}
    for folder, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                found[os.path.relpath(os.path.join(folder, name), path)] = hashlib.sha256(f.read()).hexdigest()
    return found


@pytest.mark.parametrize("cls", [PyUniformReplayBuffer, PyPrioritizedReplayBuffer])
def test_a_reopened_buffer_samples_as_the_one_never_closed(cls, tmp_path):
    ram = cls(SPEC, 24, seed=3)
    disk = cls(SPEC, 24, seed=3, storage_dir=tmp_path)
    for start in range(0, 40, 5):  # wraps the ring
        ram.add_batch(make_items(np.arange(start, start + 5)))
        disk.add_batch(make_items(np.arange(start, start + 5)))
    if cls is PyPrioritizedReplayBuffer:
        for rb in (ram, disk):
            rb.update_priorities(np.array([20, 30, 39]), np.array([5.0, 0.0, 2.0]))
    ram.get_next(7)
    disk.get_next(7)  # the generator's state is part of what reopens
    disk.close()
    again = cls(SPEC, 24, seed=99, storage_dir=tmp_path)
    assert again.num_frames() == ram.num_frames() == 24
    assert_nest_equal(again.gather_all(), ram.gather_all())
    for _ in range(3):
        got, want = again.get_next(32, num_steps=2), ram.get_next(32, num_steps=2)
        assert_nest_equal(got, want)
    assert type(got[0]["id"]) is np.ndarray  # samples are plain arrays, not views of the files
    again.add_batch(make_items(np.arange(40, 43)))
    ram.add_batch(make_items(np.arange(40, 43)))
    assert_nest_equal(again.gather_all(), ram.gather_all())
    again.close()


def test_a_frame_buffer_reopens_with_its_episode_index(tmp_path):
    spec = frame_data_spec(CONTRACT_FRAME)
    ram = PyFrameReplayBuffer(spec, batch_size=2, max_length=9, history_len=2, seed=1)
    disk = PyFrameReplayBuffer(spec, batch_size=2, max_length=9, history_len=2, seed=1, storage_dir=tmp_path)
    for step in range(13):
        rows = contract_rows(np.full([2], step), np.arange(2), 2)
        ram.add_batch(rows)
        disk.add_batch(rows)
    disk.flush()
    disk._twin.files.release()  # never closed, as after a crash (the lock goes with the process)
    again = PyFrameReplayBuffer(spec, batch_size=2, max_length=9, history_len=2, storage_dir=tmp_path)
    assert again.num_transitions() == ram.num_transitions()
    assert_nest_equal(again.get_next(40), ram.get_next(40))
    again.close()


def flushed(cls, path, **kwargs):
    rb = cls(SPEC, **kwargs, storage_dir=path)
    rb.add_batch(make_items(np.arange(6)))
    rb.close()
    return fingerprint(path)


OTHERS = {
    "capacity": (
        PyUniformReplayBuffer,
        {"capacity": 12},
        r"manifest's max_length \(8\) must equal this buffer's \(12\)",
    ),
    "sampler": (
        PyPrioritizedReplayBuffer,
        {"capacity": 8},
        r"manifest's sum_tree \(null\) must equal this buffer's \('fanout 8'\): the manifest holds a uniform buffer; "
        r"this buffer is prioritized\. Open it with a uniform buffer of the same layout",
    ),
    "dtype": (
        PyUniformReplayBuffer,
        {"capacity": 8, "spec": {**SPEC, "id": tf.TensorSpec([], tf.int32)}},
        r"manifest's dtype of id \('int64'\) must equal this buffer's \('int32'\)",
    ),
    "leaves": (
        PyUniformReplayBuffer,
        {"capacity": 8, "spec": {"id": SPEC["id"]}},
        r"manifest's leaves \(\[.*\]\) must equal this buffer's \(\[\"id\"\]\)",
    ),
    "segments": (PyUniformReplayBuffer, {"batch_size": 2, "max_length": 4}, r"manifest's batch_size \(1\)"),
}


@pytest.mark.parametrize("case", sorted(OTHERS))
def test_a_directory_of_another_buffer_is_refused_and_left_unchanged(case, tmp_path):
    before = flushed(PyUniformReplayBuffer, tmp_path, capacity=8)
    cls, kwargs, message = OTHERS[case]
    spec = kwargs.pop("spec", SPEC)
    with pytest.raises(ValueError, match=r"storage_dir \(.*\): the " + message):
        cls(spec, **kwargs, storage_dir=tmp_path)
    assert fingerprint(tmp_path) == before
    rb = PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)  # still opens, as it was
    assert decode(rb.gather_all()).tolist() == [[0, 1, 2, 3, 4, 5]]
    rb.close()


def test_a_damaged_manifest_is_refused_naming_the_entry(tmp_path):
    flushed(PyUniformReplayBuffer, tmp_path, capacity=8)
    path = tmp_path / "manifest.json"
    text = path.read_text()
    path.write_text(text.replace('"values": [6]', f'"values": [{2**61}]'))  # ids would run past int64
    with pytest.raises(ValueError, match=r"does not hold a buffer's consistent state: .*index/num_adds"):
        PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    path.write_text(text.replace('"values": [6]', '"values": [-6]'))
    with pytest.raises(ValueError, match=r"storage_dir \(.*\): the manifest does not hold a buffer's state: .*"):
        PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    path.write_text("\x80\x04K\x01.")  # a pickle is not read as one
    with pytest.raises(ValueError, match=r"manifest.json in storage_dir .* must be JSON written by tfreplay"):
        PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)


def test_a_directory_must_be_new_empty_or_a_buffers(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"storage_dir \(.*\) must be empty or hold a tfreplay buffer"):
        PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    assert os.listdir(tmp_path) == ["notes.txt"]
    with pytest.raises(ValueError, match=r"must be a directory; it is a file"):
        PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path / "notes.txt")
    with pytest.raises(TypeError, match=r"storage_dir \(3\) must be a path"):
        PyUniformReplayBuffer(SPEC, 8, storage_dir=3)
    with pytest.raises(TypeError, match=r"cannot store storage/s \(string\)"):
        PyUniformReplayBuffer({"s": tf.TensorSpec([], tf.string)}, 8, storage_dir=tmp_path / "new")


def test_one_open_buffer_per_directory_until_close(tmp_path):
    rb = PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    rb.add_batch(make_items(np.arange(3)))
    with pytest.raises(ValueError, match=r"must not be open in another buffer.*close\(\) that buffer first"):
        PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    rb.close()
    rb.close()  # idempotent
    again = PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    assert again.num_frames() == 3  # close() flushed
    again.close()


def test_adds_after_the_last_flush_are_not_resumed(tmp_path):
    rb = PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    rb.add_batch(make_items(np.arange(3)))
    rb.flush()
    rb.add_batch(make_items(np.arange(3, 5)))
    twin = rb._twin  # the process "dies": the directory is let go without a flush
    twin.files.release()
    again = PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    assert decode(again.gather_all()).tolist() == [[0, 1, 2]]
    again.close()


WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    sys.path[:0] = [{root!r}, {tests!r}]
    from helpers import SPEC, make_items
    from tfreplay import {cls}
    rb = {cls}(SPEC, {capacity}, storage_dir={path!r})
    step = 0
    for flush in range({flushes}):
        for _ in range(4):
            rb.add_batch(make_items(np.arange(step, step + 3)))
            step += 3
        rb.flush()
        print("flushed", step, flush=True)
    while True:  # adds never flushed, overwriting flushed rows, until the process is killed
        rb.add_batch(make_items(np.arange(step, step + 3)))
        step += 3
        if step % 30 == 0:
            print("unflushed", step, flush=True)
    """
)


@pytest.mark.parametrize("cls", quick([PyUniformReplayBuffer, PyPrioritizedReplayBuffer], PyUniformReplayBuffer))
@pytest.mark.parametrize("capacity", quick([200, 20], 20))  # 20: the ring wraps between flushes
def test_a_killed_writer_loses_only_unflushed_rows(cls, capacity, tmp_path):
    script = WRITER.format(
        root=ROOT, tests=os.path.join(ROOT, "tests"), cls=cls.__name__, capacity=capacity, path=str(tmp_path), flushes=3
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        while len([x for x in lines if x.startswith("unflushed")]) < 3:
            line = writer.stdout.readline()
            assert line, f"the writer ended early: {lines}"
            lines.append(line)
        os.kill(writer.pid, signal.SIGKILL)  # in the middle of its adds
    finally:
        writer.kill()
        writer.wait()
    last = max(int(x.split()[1]) for x in lines if x.startswith("flushed"))
    assert last == 36
    rb = cls(SPEC, capacity, storage_dir=tmp_path)
    kept = np.arange(max(last - capacity, 0), last)
    assert rb.num_frames() == len(kept)
    assert decode(rb.gather_all()).tolist() == [kept.tolist()]
    items, info = rb.get_next(64)
    assert set(decode(items).tolist()) <= set(kept.tolist())
    np.testing.assert_array_equal(decode(items), info.ids)  # every leaf of every drawn row is its item's
    rb.add_batch(make_items(np.arange(last, last + 3)))  # and it carries on from there
    assert decode(rb.gather_all())[0, -3:].tolist() == [last, last + 1, last + 2]
    rb.close()


BIG = {"id": tf.TensorSpec([], tf.int64), "pad": tf.TensorSpec([512], tf.float32)}  # 2 KB rows: copies take a while


def big_items(ids):
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "pad": np.repeat(ids[:, None], 512, axis=1).astype(np.float32)}


def stored_ids(rb):
    items = rb.gather_all()
    ids = np.asarray(items["id"]).reshape(-1)
    np.testing.assert_array_equal(np.asarray(items["pad"]).reshape(len(ids), -1)[:, -1], ids)  # no torn row
    return ids.tolist()


RESTORER = textwrap.dedent(
    """
    import sys, time
    import tensorflow as tf
    sys.path[:0] = [{root!r}]
    from tfreplay import PyUniformReplayBuffer
    BIG = {{"id": tf.TensorSpec([], tf.int64), "pad": tf.TensorSpec([512], tf.float32)}}
    rb = PyUniformReplayBuffer(BIG, {capacity}, storage_dir={path!r})
    checkpoint = tf.train.Checkpoint(buffer=rb)
    for cycle in range({cycles}):
        for prefix in {prefixes!r}:
            checkpoint.read(prefix).assert_consumed()
            print("restored", prefix, flush=True)
    time.sleep(600)  # killed here when the cycles end: the last restore must reopen
    """
)


def run_killed(script, lines_before_kill, delay):
    """Runs `script`, SIGKILLs it `delay` seconds after its `lines_before_kill`-th line; returns the lines."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        while len(lines) < lines_before_kill:
            line = proc.stdout.readline()
            assert line, f"the script ended early: {lines}"
            lines.append(line.split()[-1])
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    return lines


@pytest.mark.slow  # processes killed at random during restores
def test_a_restore_is_flushed_and_a_crash_during_one_reopens_a_whole_state(tmp_path):
    """Restores alternate between two checkpoints in a process killed at random points: the directory reopens
    as a whole state (the last flush or a checkpoint, never rows of both), and a finished restore is durable."""
    capacity = 4000
    states = {}
    for name, first in (("a", 0), ("b", 10_000)):
        ram = PyUniformReplayBuffer(BIG, capacity)
        ram.add_batch(big_items(np.arange(first, first + capacity)))
        states[tf.train.Checkpoint(buffer=ram).write(str(tmp_path / name))] = list(range(first, first + capacity))
    path = str(tmp_path / "memmap")
    rb = PyUniformReplayBuffer(BIG, capacity, storage_dir=path)
    rb.add_batch(big_items(np.arange(50_000, 50_000 + capacity)))
    rb.close()
    whole = [list(range(50_000, 50_000 + capacity)), *states.values()]
    fmt = dict(root=ROOT, capacity=capacity, path=path, prefixes=list(states))
    rng = np.random.default_rng(0)
    for _ in range(3):  # killed somewhere inside a restore
        run_killed(RESTORER.format(cycles=10**6, **fmt), 1 + int(rng.integers(0, 4)), rng.uniform(0, 0.05))
        again = PyUniformReplayBuffer(BIG, capacity, storage_dir=path)
        assert stored_ids(again) in whole
        again.close()
    last = run_killed(RESTORER.format(cycles=1, **fmt), len(states), 0)[-1]  # killed after its last restore
    assert stored_ids(PyUniformReplayBuffer(BIG, capacity, storage_dir=path)) == states[last]
