"""A NumPy buffer's items in `np.memmap` files of a directory, so a buffer can be larger than RAM.

`NumpyTwin(storage_dir=path)` makes every storage array (`storage/...`) as a
memory-mapped file; the counters, the episode index and the sampler's state
stay in RAM (a few bytes per row). A flush makes the directory a consistent
snapshot:

1. the mapped files are written back (`msync`);
2. the RAM state goes to `state-<generation>/` (`.npy`, loaded without
   pickles) and, small integer arrays inline, to a new `manifest.json`
   (written beside, synced, then renamed over the old one);
3. the previous generation's files are removed.

A crash between flushes must not cost flushed rows, but once the ring is
full every add overwrites the oldest row, which the last flush still counts.
So before an add overwrites a row the last flush counted (once per row per
flush), the row's flushed contents are appended to `undo-<generation>.log`;
reopening puts them back. The log is written, not synced: it covers a killed
process (the kernel keeps its pages); after a power loss only the rows
overwritten since the last flush may hold their newer items.

Reopening a directory checks its manifest like a checkpoint restore
(`checkpoint/layout.py` and `checkpoint/state.py`) before anything is put
in place, and maps the files again without copying them. A directory is
held by one open buffer at a time (an `fcntl` lock, where the platform has
one).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from typing import Any

import numpy as np
import tensorflow as tf

from tfreplay._src import ring
from tfreplay._src.checkpoint import state
from tfreplay._src.checkpoint.layout import check_layout, limiter_counts, parse_json
from tfreplay._src.checkpoint.numpy_state import _like, _plain, _rng_state

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows: no lock)
    fcntl = None  # type: ignore[assignment]

MANIFEST = "manifest.json"
_LOCK = ".lock"
_KIND = "tfreplay-memmap"
_VERSION = 1
_INLINE = 4096  # integer state arrays up to this many entries are kept in the manifest itself


class MemmapFiles:
    """The directory of one NumPy buffer: its mapped storage files, manifest, state snapshots and undo log."""

    def __init__(self, storage_dir: Any):
        if not isinstance(storage_dir, (str, os.PathLike)) or not os.fspath(storage_dir):
            raise TypeError(f"NumpyTwin: storage_dir ({storage_dir!r}) must be a path (str or os.PathLike).")
        self.path = os.path.abspath(os.fspath(storage_dir))
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"NumpyTwin: storage_dir ({self.path!r}) must be a directory; it is a file.")
        self.manifest: dict | None = None
        manifest = os.path.join(self.path, MANIFEST)
        if os.path.exists(manifest):
            with open(manifest, encoding="utf-8") as f:
                self.manifest = _checked_manifest(self.path, f.read())
        elif os.path.isdir(self.path):
            foreign = sorted(n for n in os.listdir(self.path) if not _own_file(n))
            if foreign:
                raise ValueError(
                    f"NumpyTwin: storage_dir ({self.path!r}) must be empty or hold a tfreplay buffer "
                    f"({MANIFEST}); it holds {foreign[:3]}. Pass a new or empty directory."
                )
        self.arrays: dict[str, np.ndarray] = {}  # storage arrays by name, in the order the storage made them
        self._maps: list[np.memmap] = []
        self.generation = 0 if self.manifest is None else self.manifest["generation"]
        self._mismatch: str | None = None
        self._lock_fd: int | None = None
        self._undo_fd: int | None = None
        self._counted = self._saved = np.zeros([0], bool)

    # Construction.
    def make(self, name: str, shape: list, dtype: tf.DType) -> np.ndarray:
        """A storage array as a mapped file: the directory's own when it resumes, else a new zero-filled one.

        A file that does not match is not opened: a placeholder stands in until `attach` refuses the directory.
        """
        kind = np.dtype(dtype.as_numpy_dtype)
        if kind.hasobject:
            raise TypeError(f"NumpyTwin: storage_dir cannot store {name} ({dtype.name}): strings are Python objects.")
        if self.manifest is None:
            os.makedirs(self.path, exist_ok=True)
            file = f"storage-{len(self.arrays)}.dat"
            array = self._map(np.memmap(os.path.join(self.path, file), kind, "w+", shape=tuple(shape)))
        else:
            entry = self.manifest["files"].get(name)
            want = {"dtype": kind.name, "shape": list(shape)}
            if not isinstance(entry, dict) or {k: entry.get(k) for k in want} != want:
                self._mismatch = self._mismatch or f"{name} ({_short(entry)}) must be {want}"
                array = _placeholder(shape, kind)
            else:
                array = self._open(name, entry["file"], kind, shape)
        self.arrays[name] = array
        return array

    def _open(self, name: str, file: Any, kind: np.dtype, shape: list) -> np.ndarray:
        path = os.path.join(self.path, file) if isinstance(file, str) and _own_file(file) else None
        size = int(np.prod(shape)) * kind.itemsize
        if path is None or not os.path.isfile(path) or os.path.getsize(path) != size:
            found = os.path.getsize(path) if path and os.path.isfile(path) else None
            self._mismatch = self._mismatch or f"the file of {name} ({file!r}, {found} bytes) must hold {size} bytes"
            return _placeholder(shape, kind)
        return self._map(np.memmap(path, kind, "r+", shape=tuple(shape)))

    def _map(self, mapped: np.memmap) -> np.ndarray:
        """A plain-array view of a mapped file (samples are then plain arrays); the map is kept to flush it."""
        self._maps.append(mapped)
        return np.asarray(mapped)

    def attach(self, where: str, parts: Any, layout: dict, ram: dict, rng: Any, gate: Any) -> None:
        """Takes the directory: resumes its state into `ram` (the buffer's RAM state arrays), `rng` and `gate`
        after checking all of it, or writes the first manifest. On any refusal nothing on disk has changed."""
        self._take_lock(where)
        try:
            if self.manifest is not None:
                self._resume(where, parts, layout, ram, rng, gate)
            self._counted = np.zeros([parts.capacity], bool)
            self._saved = np.zeros([parts.capacity], bool)
            self.flush(parts, layout, ram, rng, gate)
        except BaseException:
            self.release()
            raise

    def _resume(self, where: str, parts: Any, layout: dict, ram: dict, rng: Any, gate: Any) -> None:
        manifest, here = self.manifest, f"{where}: storage_dir ({self.path!r})"
        assert manifest is not None
        check_layout(manifest.get("layout"), layout, here, "manifest")
        if self._mismatch is not None:
            raise ValueError(f"{here}: {self._mismatch}; it was altered or written by another buffer.")
        names = sorted(manifest["state"]) if isinstance(manifest.get("state"), dict) else manifest.get("state")
        if names != sorted(ram):
            raise ValueError(f"{here}: the manifest's state ({_short(names)}) must be {sorted(ram)}.")
        values = {name: self._load_state(here, name, manifest["state"][name], ram[name]) for name in ram}
        try:  # the generator's state and the limiter's counts, checked as a checkpoint's are
            rng_state = _rng_state(manifest.get("rng"), rng)
            counts = limiter_counts(manifest, parts.capacity)
        except ValueError as err:
            raise ValueError(f"{here}: the manifest does not hold a buffer's state: {err}") from None
        self._undo(here, parts.capacity)  # the rows as flushed, before the state is checked against them
        try:
            state.check(parts, {**values, **self.arrays})
        except ValueError as err:
            raise ValueError(f"{here} does not hold a buffer's consistent state: {err}") from None
        for name, value in values.items():
            ram[name][...] = value
        rng.bit_generator.state = rng_state
        gate.restored(counts, lambda: int(np.minimum(parts.num_adds, parts.max_length).sum()))

    def _load_state(self, here: str, name: str, entry: Any, like: np.ndarray) -> np.ndarray:
        want = {"dtype": like.dtype.name, "shape": list(like.shape)}
        if not isinstance(entry, dict) or {k: entry.get(k) for k in want} != want:
            raise ValueError(f"{here}: the manifest's state {name} ({_short(entry)}) must be {want}.")
        if "values" in entry:
            try:
                return _like(entry["values"], like, f"state {name}")
            except ValueError as err:
                raise ValueError(f"{here}: the manifest does not hold a buffer's state: {err}") from None
        file = entry.get("file")
        path = os.path.join(self.path, file) if isinstance(file, str) and _own_file(file.split("/")[0]) else None
        try:
            value = np.load(path, allow_pickle=False) if path else None
        except (OSError, ValueError) as err:
            raise ValueError(f"{here}: the state file of {name} ({file!r}) must be a .npy array ({err}).") from None
        if value is None or value.dtype != like.dtype or value.shape != like.shape:
            raise ValueError(f"{here}: the state file of {name} ({file!r}) must hold {want}.")
        return value

    # Writes.
    def save_rows(self, parts: Any, num_new: int, segments: Any) -> None:
        """Appends to the undo log the flushed contents of the rows an add is about to overwrite (each row once
        per flush): reopening after a crash puts them back."""
        rows = _rows_of_add(parts, num_new, segments)
        self._save(rows[self._counted[rows] & ~self._saved[rows]])

    def save_every_row(self) -> None:
        """Before a checkpoint restore overwrites every row: the flushed rows not saved yet go to the undo log,
        so a crash during the copy reopens the last flush, not a mix of it and the checkpoint."""
        self._save(np.flatnonzero(self._counted & ~self._saved))

    def _save(self, rows: np.ndarray) -> None:
        if not rows.size:
            return
        if self._undo_fd is None:
            path = os.path.join(self.path, f"undo-{self.generation}.log")
            self._undo_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        row_bytes = sum(a[0].nbytes for a in self.arrays.values())
        step = max(1, (64 << 20) // max(row_bytes, 1))  # records of at most about 64 MB: RAM stays bounded
        for start in range(0, rows.size, step):
            block = rows[start : start + step]
            chunks = [np.array([block.size], np.int64).tobytes(), block.astype(np.int64).tobytes()]
            chunks += [np.ascontiguousarray(a[block]).tobytes() for a in self.arrays.values()]
            _write_all(self._undo_fd, b"".join(chunks))
            self._saved[block] = True

    def flush(self, parts: Any, layout: dict, ram: dict, rng: Any, gate: Any) -> None:
        """Makes the directory the buffer's snapshot now (see the module docstring); the caller holds the lock."""
        for mapped in self._maps:
            mapped.flush()
        generation = self.generation + 1
        folder = f"state-{generation}"
        os.makedirs(os.path.join(self.path, folder), exist_ok=True)
        entries = {}
        for i, (name, array) in enumerate(sorted(ram.items())):
            entry: dict = {"dtype": array.dtype.name, "shape": list(array.shape)}
            if array.dtype.kind in "iu" and array.size <= _INLINE and (array >= 0).all():
                entry["values"] = array.reshape(-1).tolist()
            else:
                entry["file"] = f"{folder}/{i}.npy"
                _save_synced(os.path.join(self.path, entry["file"]), array)
            entries[name] = entry
        _sync_dir(os.path.join(self.path, folder))
        manifest = {
            "kind": _KIND,
            "version": _VERSION,
            "generation": generation,
            "layout": layout,
            "files": {
                n: {"file": f"storage-{i}.dat", "dtype": a.dtype.name, "shape": list(a.shape)}
                for i, (n, a) in enumerate(self.arrays.items())
            },
            "state": entries,
            "rng": _plain(rng.bit_generator.state),
            "rate_limiter": gate.counts(),
        }
        _replace_synced(os.path.join(self.path, MANIFEST), json.dumps(manifest))
        old, self.generation = self.generation, generation
        shutil.rmtree(os.path.join(self.path, f"state-{old}"), ignore_errors=True)
        if self._undo_fd is not None:
            os.close(self._undo_fd)
            self._undo_fd = None
        _remove(os.path.join(self.path, f"undo-{old}.log"))
        live = state.live_items(np.asarray(parts.num_adds, np.int64), parts.max_length)[1]
        self._counted[...] = live.reshape(-1)
        self._saved[...] = False

    def _undo(self, here: str, capacity: int) -> None:
        """Puts back the rows the undo log of this generation saved (a crash after them left newer items)."""
        path = os.path.join(self.path, f"undo-{self.generation}.log")
        if not os.path.exists(path):
            return
        with open(path, "rb") as f:
            data = f.read()
        row_bytes = [a[0].nbytes for a in self.arrays.values()]
        at = 0
        while at + 8 <= len(data):
            count = int(np.frombuffer(data, np.int64, 1, at)[0])
            size = 8 * count + count * sum(row_bytes)
            if count <= 0 or at + 8 + size > len(data):
                break  # the record being written when the process died: its rows were not overwritten yet
            rows = np.frombuffer(data, np.int64, count, at + 8)
            if (rows < 0).any() or (rows >= capacity).any():
                raise ValueError(f"{here}: undo log rows ({rows[:4].tolist()}) must be in [0, {capacity}).")
            at += 8 + 8 * count
            for array, nbytes in zip(self.arrays.values(), row_bytes):
                saved = np.frombuffer(data, array.dtype, count * nbytes // array.dtype.itemsize, at)
                array[rows] = saved.reshape((count,) + array.shape[1:])
                at += count * nbytes
        for mapped in self._maps:
            mapped.flush()

    # The lock.
    def _take_lock(self, where: str) -> None:
        os.makedirs(self.path, exist_ok=True)
        fd = os.open(os.path.join(self.path, _LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise ValueError(
                    f"{where}: storage_dir ({self.path!r}) must not be open in another buffer; it is (in this "
                    "process or another). close() that buffer first."
                ) from None
        self._lock_fd = fd

    def release(self) -> None:
        """Lets another buffer open the directory (after a last flush, by the caller)."""
        if self._undo_fd is not None:
            os.close(self._undo_fd)
            self._undo_fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    @property
    def is_open(self) -> bool:
        return self._lock_fd is not None


def _rows_of_add(parts: Any, num_new: int, segments: Any) -> np.ndarray:
    """The storage rows `write.write` will write for an add of `num_new` items per segment (or per `segments`)."""
    adds = np.asarray(parts.num_adds, np.int64)
    n = adds if segments is None else adds[segments]
    seg = np.arange(parts.num_segments) if segments is None else np.asarray(segments, np.int64)
    skip = max(num_new - parts.max_length, 0)
    local = n[None, :] + skip + np.arange(num_new - skip)[:, None]
    return np.asarray(ring.rows_of(local, seg[None, :], parts.max_length, parts.num_segments)).reshape(-1)


def _checked_manifest(path: str, text: str) -> dict:
    where = f"NumpyTwin: storage_dir ({path!r})"
    manifest = parse_json(text, f"{MANIFEST} in storage_dir {path!r}")
    ok = isinstance(manifest, dict) and manifest.get("kind") == _KIND
    if not ok or manifest.get("version") != _VERSION:
        raise ValueError(f"{where}: {MANIFEST} ({_short(manifest)}) must be a tfreplay memmap manifest, version 1.")
    generation = manifest.get("generation")
    files = manifest.get("files")
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 1 or not isinstance(files, dict):
        raise ValueError(f"{where}: {MANIFEST} must have a positive generation and a files object.")
    return manifest


def _own_file(name: str) -> bool:
    """Whether a directory entry is one a memmap buffer writes (so a half-made directory may be reused)."""
    stem = name.split(".")[0]
    return name in (MANIFEST, _LOCK, MANIFEST + ".tmp") or stem.split("-")[0] in ("storage", "state", "undo")


def _placeholder(shape: list, kind: np.dtype) -> np.ndarray:
    """Zeros in anonymous memory the kernel fills only when touched: what stands in for a refused file."""
    size = max(int(np.prod(shape)) * kind.itemsize, 1)
    return np.frombuffer(mmap.mmap(-1, size), np.uint8)[: int(np.prod(shape)) * kind.itemsize].view(kind).reshape(shape)


def _save_synced(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _replace_synced(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _sync_dir(os.path.dirname(path))


def _sync_dir(path: str) -> None:
    if os.name == "posix":
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
