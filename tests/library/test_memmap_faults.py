"""Memory-mapped buffers under faults: a second process, lost or edited files, a full disk, SIGKILL at random.

Each test checks the directory's promise: flushed rows come back exactly, a directory that cannot be resumed is
refused with nothing in it written, and no file a finished flush made obsolete stays behind.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPEC, decode, make_items
from test_memmap import fingerprint

from tfreplay import PyPrioritizedReplayBuffer, PyUniformReplayBuffer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
BIG = {"id": tf.TensorSpec([], tf.int64), "pad": tf.TensorSpec([255], tf.float32)}  # 1 KB rows
HEADER = f"""
import os, signal, sys, time
import numpy as np
import tensorflow as tf
sys.path[:0] = [{ROOT!r}]
import tfreplay
BIG = {{"id": tf.TensorSpec([], tf.int64), "pad": tf.TensorSpec([255], tf.float32)}}
def items(ids):
    ids = np.asarray(ids, np.int64)
    return {{"id": ids, "pad": np.repeat(ids[:, None], 255, axis=1).astype(np.float32)}}
def say(*words):  # one write: a kill leaves no half line (print writes each piece apart when unbuffered)
    os.write(1, (" ".join(map(str, words)) + "\\n").encode())
"""


def big_items(ids):
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "pad": np.repeat(ids[:, None], 255, axis=1).astype(np.float32)}


def stored_ids(rb) -> list:
    """The ids the buffer stores, oldest first, after checking every row's payload is its id's (no torn row)."""
    items = rb.gather_all()
    ids = np.asarray(items["id"]).reshape(-1)
    np.testing.assert_array_equal(np.asarray(items["pad"]).reshape(len(ids), 255), np.repeat(ids[:, None], 255, 1))
    return ids.tolist()


def start(script: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HEADER + textwrap.dedent(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def read_line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    assert line, f"the child ended early (exit {proc.wait()})"
    return line.strip()


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream:
            stream.close()


# The first buffer pauses after its files are made and before its first manifest: a second open must be
# refused there without touching them (the pause is injected at the buffer's own attach step).
FIRST = """
import tfreplay._src.backends.memmap as memmap
attach = memmap.MemmapFiles.attach
def paused(self, *args, **kwargs):
    say("made")
    sys.stdin.readline()
    return attach(self, *args, **kwargs)
memmap.MemmapFiles.attach = paused
rb = tfreplay.PyUniformReplayBuffer(BIG, 64, storage_dir={path!r})
rb.add_batch(items(np.arange(40)))
rb.flush()
say("flushed")
sys.stdin.readline()
"""


@pytest.mark.slow  # two processes, each importing TensorFlow
def test_a_second_process_opening_a_new_directory_touches_nothing(tmp_path):
    path = str(tmp_path / "replay")
    first = start(FIRST.format(path=path))
    try:
        assert read_line(first) == "made"
        made = fingerprint(path)
        with pytest.raises(ValueError, match=r"storage_dir \(.*replay'\) must not be open in another buffer"):
            PyUniformReplayBuffer(BIG, 64, storage_dir=path)
        assert fingerprint(path) == made  # not truncated, not replaced
        first.stdin.write("go\n")
        first.stdin.flush()
        assert read_line(first) == "flushed"
        with pytest.raises(ValueError, match=r"must not be open in another buffer"):
            PyUniformReplayBuffer(BIG, 64, storage_dir=path)
        os.kill(first.pid, signal.SIGKILL)  # the first buffer dies holding its flushed rows
    finally:
        stop(first)
    rb = PyUniformReplayBuffer(BIG, 64, storage_dir=path)
    assert stored_ids(rb) == list(range(40))
    rb.close()


def flushed_dir(path, wrap: bool = False) -> None:
    """A closed buffer's directory; `wrap`: left open after overwriting flushed rows (an undo log in it)."""
    rb = PyUniformReplayBuffer(SPEC, 8, storage_dir=path)
    rb.add_batch(make_items(np.arange(8)))
    rb.flush()
    if wrap:
        rb.add_batch(make_items(np.arange(8, 11)))
        rb._twin.files.release()  # the process "dies" here: the lock goes with it, the log stays
    else:
        rb.close()


@pytest.mark.parametrize("lost", ["manifest", "manifest and state", "manifest with an undo log"])
def test_a_directory_without_its_manifest_is_refused_and_left_unchanged(lost, tmp_path):
    flushed_dir(tmp_path, wrap=lost.endswith("log"))
    assert glob.glob(str(tmp_path / "undo-*.log")) or not lost.endswith("log")
    os.remove(tmp_path / "manifest.json")
    if lost == "manifest and state":
        for folder in glob.glob(str(tmp_path / "state-*")):
            shutil.rmtree(folder)
    before = fingerprint(tmp_path)
    with pytest.raises(
        ValueError, match=r"storage_dir \(.*\) holds a buffer's files \(\[.*storage-0\.dat.*\]\) but no manifest\.json"
    ):
        PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    assert fingerprint(tmp_path) == before


def undo_log(path) -> str:
    (log,) = glob.glob(os.path.join(path, "undo-*.log"))
    return log


def edit_rows(log: str, rows: list) -> None:
    """Writes `rows` over the first record's row indices (the int64s after its count)."""
    with open(log, "r+b") as f:
        count = int(np.frombuffer(f.read(8), np.int64)[0])
        assert count == len(rows)
        f.write(np.asarray(rows, np.int64).tobytes())


@pytest.mark.parametrize(
    "rows, rule",
    [
        # in range, but not where the rows were
        ([5, 1, 2], r"undo-\d+\.log: its record at byte 0 .* must match its checksum"),
        ([0, 0, 2], r"undo-\d+\.log: .*row 0 .*twice"),
        ([0, 1, 99], r"undo-\d+\.log: .*rows \(\[99\]\) must be in \[0, 8\)"),
    ],
)
def test_an_edited_undo_log_is_refused_before_any_row_is_put_back(rows, rule, tmp_path):
    flushed_dir(tmp_path, wrap=True)
    edit_rows(undo_log(tmp_path), rows)
    before = fingerprint(tmp_path)
    with pytest.raises(ValueError, match=rf"storage_dir \(.*\): {rule}"):
        PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    assert fingerprint(tmp_path) == before


def test_an_undo_log_puts_back_what_a_killed_writer_overwrote(tmp_path):
    flushed_dir(tmp_path, wrap=True)
    rb = PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    assert decode(rb.gather_all()).tolist() == [list(range(8))]
    rb.close()
    assert not glob.glob(str(tmp_path / "undo-*.log"))


def edit_manifest(path, edit) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def bump_num_adds(manifest):
    manifest["state"]["index/num_adds"]["values"] = [v + 1 for v in manifest["state"]["index/num_adds"]["values"]]


def next_rng(manifest):
    manifest["rng"]["state"]["state"] += 1  # a valid generator state, not the one flushed


@pytest.mark.parametrize("edit, field", [(bump_num_adds, "state index/num_adds"), (next_rng, "rng")])
def test_a_manifest_edited_consistently_is_refused_naming_the_field(edit, field, tmp_path):
    rb = PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    rb.add_batch(make_items(np.arange(5)))  # one more item would still look like a buffer's state
    rb.close()
    edit_manifest(tmp_path, edit)
    before = fingerprint(tmp_path)
    with pytest.raises(ValueError, match=rf"manifest\.json: its {field} \(.*\) must be what the flush wrote"):
        PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    assert fingerprint(tmp_path) == before


def test_files_a_killed_flush_left_are_removed_on_open(tmp_path):
    rb = PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    rb.add_batch(make_items(np.arange(6)))
    rb.flush()
    rb.close()
    generation = json.loads((tmp_path / "manifest.json").read_text())["generation"]
    # What kills leave: a flush killed before its manifest (a newer state folder), one killed after it
    # (the older state folder and undo log), and a manifest being written.
    shutil.copytree(tmp_path / f"state-{generation}", tmp_path / f"state-{generation + 1}")
    shutil.copytree(tmp_path / f"state-{generation}", tmp_path / f"state-{generation - 1}")
    (tmp_path / f"undo-{generation - 1}.log").write_bytes(b"\0" * 24)
    (tmp_path / "manifest.json.tmp").write_text("{")
    storage = sorted(glob.glob(str(tmp_path / "storage-*.dat")))
    rb = PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)
    assert decode(rb.gather_all()).tolist() == [list(range(6))]
    rb.close()
    generation = json.loads((tmp_path / "manifest.json").read_text())["generation"]
    names = sorted(n for n in os.listdir(tmp_path) if not n.startswith("storage-"))
    assert names == ["manifest.json", f"state-{generation}"]
    assert sorted(glob.glob(str(tmp_path / "storage-*.dat"))) == storage


FULL = """
path = {path!r}
try:
    tfreplay.PyUniformReplayBuffer(BIG, 4096, storage_dir=os.path.join(path, "too-big"))  # 4 MB on 1 MB
    say("made too big")
except OSError as err:
    say("refused", err)
rb = tfreplay.PyUniformReplayBuffer(BIG, 256, storage_dir=os.path.join(path, "replay"))  # 256 KB
rb.add_batch(items(np.arange(200)))
rb.flush()
with open(os.path.join(path, "filler"), "wb", buffering=0) as f:  # the disk fills up
    try:
        while True:
            f.write(b"x" * 4096)
    except OSError:
        pass
try:
    for start in range(200, 1000, 50):  # fills the reserved rows, then overwrites flushed ones
        rb.add_batch(items(np.arange(start, start + 50)))
    say("added")
except OSError as err:
    say("add refused", err)
try:
    rb.flush()
    say("flushed")
except OSError as err:
    say("flush refused", err)
os.remove(os.path.join(path, "filler"))
say("exit")
"""


@pytest.mark.slow  # a tmpfs mount and a writer process
def test_a_full_disk_is_an_oserror_and_keeps_flushed_rows(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a 1 MB tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        child = subprocess.run(
            [sys.executable, "-c", HEADER + FULL.format(path=str(mount))], capture_output=True, text=True, env=ENV
        )
        assert child.returncode == 0, f"the writer died (exit {child.returncode}): {child.stdout} {child.stderr}"
        lines = child.stdout.splitlines()
        assert lines[0].startswith("refused") and "too-big" in lines[0] and "bytes" in lines[0], lines
        assert "free disk space" in lines[0], lines
        assert lines[1].startswith("add refused") and "undo-" in lines[1], lines
        assert lines[-1] == "exit", lines
        rb = PyUniformReplayBuffer(BIG, 256, storage_dir=mount / "replay")
        ids = stored_ids(rb)
        # The last flush's rows, or a later flush's; the adds refused changed nothing.
        assert ids in ([*range(200)], [*range(250)]), ids[-5:]
        rb.close()
        assert not glob.glob(str(mount / "too-big" / "storage-*"))  # the refused buffer's files went again
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# The SIGKILL soak: writers killed at random while they open (resume) a directory, add, flush and restore
# checkpoints, beside a second process that opens the same directory.
WRITER = """
import json
cls = getattr(tfreplay, {cls!r})
checkpoints = {checkpoints!r}
rng = np.random.default_rng({seed})
say("opening")
try:
    rb = cls(BIG, {capacity}, storage_dir={path!r})
except ValueError as err:
    say("refused", "must not be open in another buffer" in str(err))
    sys.exit(0)
ids = np.asarray(rb.gather_all()["id"]).reshape(-1).tolist()
say("opened", json.dumps(ids))
checkpoint = tf.train.Checkpoint(buffer=rb)
step = {first_id}
while True:
    op = rng.choice(["add"] * 6 + ["flush", "restore"])
    if op == "add":
        count = int(rng.integers(1, 6))
        rb.add_batch(items(np.arange(step, step + count)))
        ids, step = (ids + list(range(step, step + count)))[-{capacity}:], step + count
    elif op == "flush":
        say("pending", json.dumps(ids))
        rb.flush()
        say("done")
    else:
        prefix = str(rng.choice(sorted(checkpoints)))
        say("pending", json.dumps(checkpoints[prefix]))
        checkpoint.read(prefix).assert_consumed()
        ids = list(checkpoints[prefix])
        say("done")
"""
OPENER = """
for line in sys.stdin:
    cls, path = line.split()
    try:
        getattr(tfreplay, cls)(BIG, {capacity}, storage_dir=path).close()
        say("opened")
    except ValueError as err:
        say("refused", "must not be open in another buffer" in str(err))
"""


class Lines:
    """A child's stdout lines, read by a thread so the child never blocks on a full pipe."""

    def __init__(self, proc: subprocess.Popen):
        import queue
        import threading

        self.proc, self.queue = proc, queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.queue.put(line.strip())
        self.queue.put(None)

    def next(self, timeout: float = 120.0):
        return self.queue.get(timeout=timeout)

    def rest(self) -> list:
        lines = []
        while (line := self.next()) is not None:
            lines.append(line)
        return lines


def replay(lines: list, durable: list, pending) -> tuple[list, object]:
    """Follows a writer's report: what it opened must be what was durable, then each finished flush or restore
    is durable; returns `(durable, pending)`, pending being a flush or restore that may or may not have landed."""
    for line in lines:
        word, _, rest = line.partition(" ")
        if word == "opened":
            assert json.loads(rest) in [durable] + ([pending] if pending is not None else []), "lost rows"
            durable, pending = json.loads(rest), None
        elif word == "pending":
            pending = json.loads(rest)
        elif word == "done":
            durable, pending = pending, None
        elif word == "refused":
            assert rest == "True", line
    return durable, pending


@pytest.mark.slow  # about 8 s per kill: each writer imports TensorFlow
def test_sigkill_at_random_loses_no_flushed_row_and_leaves_no_stray_file(tmp_path):
    """TFREPLAY_SOAK_KILLS sets the number of kills (default 5)."""
    kills, capacity = int(os.environ.get("TFREPLAY_SOAK_KILLS", "3")), 32
    rng = np.random.default_rng(29)
    kinds = {}
    for i, cls in enumerate([PyUniformReplayBuffer, PyPrioritizedReplayBuffer]):
        checkpoints = {}
        for j in range(2):
            ram = cls(BIG, capacity)
            ids = list(range(10**6 * (i + 1) + 1000 * j, 10**6 * (i + 1) + 1000 * j + capacity - j * 7))
            ram.add_batch(big_items(ids))
            checkpoints[tf.train.Checkpoint(buffer=ram).write(str(tmp_path / f"{cls.__name__}-{j}"))] = ids
        kinds[cls] = {"path": str(tmp_path / cls.__name__), "checkpoints": checkpoints, "durable": [], "files": None}
    opener, opened = None, {"writers killed": 0, "openers killed": 0, "refused": 0, "opened": 0}
    try:
        for life in range(kills):
            cls = [PyUniformReplayBuffer, PyPrioritizedReplayBuffer][life % 2]
            kind = kinds[cls]
            if opener is None:
                opener = start(OPENER.format(capacity=capacity))
                opener_lines = Lines(opener)
            script = WRITER.format(
                cls=cls.__name__,
                checkpoints=kind["checkpoints"],
                seed=life,
                capacity=capacity,
                path=kind["path"],
                first_id=life * 10_000,
            )
            writer = start(script)
            lines = Lines(writer)
            try:
                assert lines.next() == "opening"
                if rng.random() < 0.5:  # a second process opens the directory too, and may be killed doing so
                    opener.stdin.write(f"{cls.__name__} {kind['path']}\n")
                    opener.stdin.flush()
                    if rng.random() < 0.3:
                        time.sleep(rng.uniform(0, 0.02))
                        os.kill(opener.pid, signal.SIGKILL)
                        stop(opener)
                        opener, opened["openers killed"] = None, opened["openers killed"] + 1
                    else:
                        outcome = opener_lines.next()
                        assert outcome in ("opened", "refused True"), outcome
                        opened[outcome.split()[0]] += 1
                time.sleep(rng.choice([rng.uniform(0, 0.05), rng.uniform(0.2, 2.0)]))  # in its open, or later
                if writer.poll() is None:  # not refused for the second process's open
                    os.kill(writer.pid, signal.SIGKILL)
                    opened["writers killed"] += 1
            finally:
                stop_quietly(writer)
            kind["durable"], pending = replay(lines.rest(), kind["durable"], None)
            rb = cls(BIG, capacity, storage_dir=kind["path"])
            got = stored_ids(rb)
            assert got in [kind["durable"]] + ([pending] if pending is not None else []), f"life {life}: lost rows"
            rb.close()
            kind["durable"] = got
            names = sorted(os.listdir(kind["path"]))
            generation = json.loads(open(os.path.join(kind["path"], "manifest.json")).read())["generation"]
            assert [n for n in names if not n.startswith("storage-")] == ["manifest.json", f"state-{generation}"]
            kind["files"] = kind["files"] or [n for n in names if n.startswith("storage-")]
            assert [n for n in names if n.startswith("storage-")] == kind["files"]
    finally:
        if opener is not None:
            stop(opener)
    print(f"lives: {kills}; kills and second opens: {opened}")


def stop_quietly(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    if proc.stdin:
        proc.stdin.close()


def test_a_buffer_whose_making_fails_lets_the_directory_go(tmp_path):
    failures = []  # kept, with their tracebacks, as an `except` block keeps its exception
    for spec, kwargs in [
        ({"id": SPEC["id"], "s": tf.TensorSpec([], tf.string)}, {}),  # refused while its files are made
        ({"id": SPEC["id"]}, {"within_episodes": True}),  # refused after them
    ]:
        try:
            PyPrioritizedReplayBuffer(spec, 8, storage_dir=tmp_path, **kwargs)
        except (TypeError, ValueError) as err:
            failures.append(err)
    assert len(failures) == 2, failures
    rb = PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path)  # the failed ones hold nothing, not even the lock
    rb.add_batch(make_items(np.arange(3)))
    rb.close()
    assert decode(PyUniformReplayBuffer(SPEC, 8, storage_dir=tmp_path).gather_all()).tolist() == [[0, 1, 2]]
