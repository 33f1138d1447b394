"""A NumPy buffer's items in `np.memmap` files of a directory, so a buffer can be larger than RAM.

`NumpyTwin(storage_dir=path)` makes every storage array (`storage/...`) as a
memory-mapped file; the counters, the episode index and the sampler's state
stay in RAM (a few bytes per row). A flush makes the directory a consistent
snapshot:

1. the mapped files are written back (`msync`);
2. the RAM state goes to `state-<generation>/` (`.npy`, loaded without
   pickles) and, small integer arrays inline, to a new `manifest.json`
   (written beside, synced, then renamed over the old one), with a digest
   of each of its fields and state arrays;
3. whatever that flush made obsolete is removed (older state folders, undo
   logs, a half-written manifest), also what a process killed during an
   earlier flush left.

A crash between flushes must not cost flushed rows, but once the ring is
full every add overwrites the oldest row, which the last flush still counts.
So before an add overwrites a row the last flush counted (once per row per
flush), the row's flushed contents are appended to `undo-<generation>.log`;
reopening puts them back. The log is written, not synced: it covers a killed
process (the kernel keeps its pages); after a power loss only the rows
overwritten since the last flush may hold their newer items.

The directory is locked (`fcntl.flock` on the directory itself, where the
platform has it) before anything in it is read or made, so a second buffer
never touches a directory another holds. A new buffer's files get their
disk blocks when they are made (`posix_fallocate`), so a full disk is an
`OSError` then, never a SIGBUS on a later write. Reopening a directory
checks everything it reads like a checkpoint restore
(`checkpoint/layout.py` and `checkpoint/state.py`), the undo log's records
and the manifest's digests included, before anything is put in place, and
maps the files again without copying them (`memmap_disk.py` has the
directory's rules).
"""

from __future__ import annotations

import json
import mmap
import os
import weakref
from typing import Any

import numpy as np
import tensorflow as tf

from tfreplay._src.backends import memmap_disk as disk
from tfreplay._src.checkpoint import state
from tfreplay._src.checkpoint.layout import check_layout, limiter_counts, parse_json
from tfreplay._src.checkpoint.numpy_state import _like, _plain, _rng_state
from tfreplay._src.index import ring

MANIFEST = disk.MANIFEST
_KIND = "tfreplay-memmap"
_VERSION = 1
_INLINE = 4096  # integer state arrays up to this many entries are kept in the manifest itself


class MemmapFiles:
    """The directory of one NumPy buffer: its mapped storage files, manifest, state snapshots and undo log.

    The directory is locked before anything in it is read or made, and held until `release`.
    """

    def __init__(self, storage_dir: Any):
        if not isinstance(storage_dir, (str, os.PathLike)) or not os.fspath(storage_dir):
            raise TypeError(f"NumpyTwin: storage_dir ({storage_dir!r}) must be a path (str or os.PathLike).")
        self.path = os.path.abspath(os.fspath(storage_dir))
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"NumpyTwin: storage_dir ({self.path!r}) must be a directory; it is a file.")
        self.where = "NumpyTwin"
        self._undo_fd: int | None = None
        self._lock_fd: int | None = disk.lock(self.path, self.where)
        # A buffer whose making fails before `attach` lets the directory go when it is collected.
        self._unlock = weakref.finalize(self, os.close, self._lock_fd)
        try:
            text = disk.examine(self.path, self.where)
            self.manifest = None if text is None else _checked_manifest(self.path, text)
            if self.manifest is None:
                disk.begin_new(self.path)
        except BaseException:
            self.release()
            raise
        self.arrays: dict[str, np.ndarray] = {}  # storage arrays by name, in the order the storage made them
        self._paths: dict[str, str] = {}
        self._maps: list[np.memmap] = []
        self.generation = 0 if self.manifest is None else self.manifest["generation"]
        self._mismatch: str | None = None
        self._counted = self._saved = np.zeros([0], bool)

    # Construction.
    def make(self, name: str, shape: list, dtype: tf.DType) -> np.ndarray:
        """A storage array as a mapped file: the directory's own when it resumes, else a new zero-filled one
        whose disk blocks are reserved now. A file that does not match is not opened: a placeholder stands in
        until `attach` refuses the directory."""
        kind = np.dtype(dtype.as_numpy_dtype)
        if kind.hasobject:
            raise TypeError(f"NumpyTwin: storage_dir cannot store {name} ({dtype.name}): strings are Python objects.")
        if self.manifest is None:
            path = os.path.join(self.path, f"storage-{len(self.arrays)}.dat")
            try:
                disk.reserve(path, int(np.prod(shape)) * kind.itemsize, self.where)
            except OSError:  # no room: the new buffer's files go again
                for made in [*self._paths.values(), path]:
                    disk.remove(made)
                raise
            array = self._map(name, path, kind, shape)
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
        path = os.path.join(self.path, file) if isinstance(file, str) and disk.own_file(file) else None
        size = int(np.prod(shape)) * kind.itemsize
        if path is None or not os.path.isfile(path) or os.path.getsize(path) != size:
            found = os.path.getsize(path) if path and os.path.isfile(path) else None
            self._mismatch = self._mismatch or f"the file of {name} ({file!r}, {found} bytes) must hold {size} bytes"
            return _placeholder(shape, kind)
        disk.reserve(path, size, self.where)  # a file written sparse (by an older tfreplay) gets its blocks
        return self._map(name, path, kind, shape)

    def _map(self, name: str, path: str, kind: np.dtype, shape: list) -> np.ndarray:
        """A plain-array view of a mapped file (samples are then plain arrays); the map is kept to flush it."""
        mapped = np.memmap(path, kind, "r+", shape=tuple(shape))
        self._maps.append(mapped)
        self._paths[name] = path
        return np.asarray(mapped)

    def attach(self, where: str, parts: Any, layout: dict, ram: dict, rng: Any, gate: Any) -> None:
        """Resumes the directory's state into `ram` (the buffer's RAM state arrays), `rng` and `gate` after
        checking all of it, or writes the first manifest. On any refusal nothing on disk has changed."""
        self.where = where
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
        records = self._undo_records(here, values["index/num_adds"], parts.max_length)
        try:  # against the rows as flushed: the undo log put back in private copies of the pages it touches
            state.check(parts, {**values, **self._as_flushed(records)})
        except ValueError as err:
            raise ValueError(f"{here} does not hold a buffer's consistent state: {err}") from None
        disk.check_digests(here, manifest, values)
        _put_back(list(self.arrays.values()), records)
        for mapped in self._maps:
            mapped.flush()
        for name, value in values.items():
            ram[name][...] = value
        rng.bit_generator.state = rng_state
        gate.restored(counts, lambda: int(np.minimum(parts.num_adds, parts.max_length).sum()))

    def _undo_records(self, here: str, num_adds: np.ndarray, length: int) -> list:
        """The checked records of this generation's undo log (rows a crash after them left newer items in)."""
        path = os.path.join(self.path, f"undo-{self.generation}.log")
        if not os.path.exists(path):
            return []
        live = state.live_items(np.asarray(num_adds, np.int64), length)[1].reshape(-1)
        return disk.read_log(here, path, list(self.arrays.values()), live)

    def _as_flushed(self, records: list) -> dict[str, np.ndarray]:
        """The storage arrays as the last flush left them, without writing: copy-on-write maps where the undo
        log puts rows back."""
        if not records:
            return dict(self.arrays)
        private: dict[str, np.ndarray] = {
            n: np.memmap(self._paths[n], a.dtype, "c", shape=a.shape) for n, a in self.arrays.items()
        }
        _put_back(list(private.values()), records)
        return private

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
        path = os.path.join(self.path, file) if isinstance(file, str) and disk.own_file(file.split("/")[0]) else None
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
        path = os.path.join(self.path, f"undo-{self.generation}.log")
        arrays = list(self.arrays.values())
        row_bytes = sum(a[0].nbytes for a in arrays)
        step = max(1, (64 << 20) // max(row_bytes, 1))  # records of at most about 64 MB: RAM stays bounded
        try:
            if self._undo_fd is None:
                self._undo_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            for start in range(0, rows.size, step):
                block = rows[start : start + step]
                disk.append(self._undo_fd, block, arrays)
                self._saved[block] = True
        except OSError as err:
            raise disk.write_failed(self.where, path, err, "nothing was written to the buffer.") from None

    def flush(self, parts: Any, layout: dict, ram: dict, rng: Any, gate: Any) -> None:
        """Makes the directory the buffer's snapshot now (see the module docstring); the caller holds the lock.
        A flush that fails (a full disk) leaves the directory at the last flush."""
        generation = self.generation + 1
        path = os.path.join(self.path, MANIFEST)
        try:
            for mapped in self._maps:
                mapped.flush()
            entries, digests = self._write_state(generation, ram)
            manifest = {
                "kind": _KIND,
                "version": _VERSION,
                "generation": generation,
                "layout": layout,
                "files": {
                    n: {"file": os.path.basename(self._paths[n]), "dtype": a.dtype.name, "shape": list(a.shape)}
                    for n, a in self.arrays.items()
                },
                "state": entries,
                "rng": _plain(rng.bit_generator.state),
                "rate_limiter": gate.counts(),
            }
            manifest["digests"] = {**{f: disk.digest(manifest[f]) for f in disk.FIELDS}, **digests}
            _write_synced(path + ".tmp", json.dumps(manifest))
            os.replace(path + ".tmp", path)  # the flush is made here: the undo log of this generation starts
        except OSError as err:
            raise disk.write_failed(
                self.where, getattr(err, "filename", None) or path, err, "the flush was not made."
            ) from None
        self.generation = generation
        if self._undo_fd is not None:
            os.close(self._undo_fd)
            self._undo_fd = None
        live = state.live_items(np.asarray(parts.num_adds, np.int64), parts.max_length)[1]
        self._counted[...] = live.reshape(-1)
        self._saved[...] = False
        disk.sync_dir(self.path)
        disk.tidy(self.path, generation)

    def _write_state(self, generation: int, ram: dict) -> tuple[dict, dict]:
        """The manifest's state entries of the RAM arrays (small integer ones inline, others as synced `.npy`
        files in `state-<generation>/`) and their digests."""
        folder = f"state-{generation}"
        os.makedirs(os.path.join(self.path, folder), exist_ok=True)
        entries, digests = {}, {}
        for i, (name, array) in enumerate(sorted(ram.items())):
            entry: dict = {"dtype": array.dtype.name, "shape": list(array.shape)}
            if array.dtype.kind in "iu" and array.size <= _INLINE and (array >= 0).all():
                entry["values"] = array.reshape(-1).tolist()
            else:
                entry["file"] = f"{folder}/{i}.npy"
                _save_synced(os.path.join(self.path, entry["file"]), array)
            entries[name] = entry
            digests[f"state {name}"] = disk.digest(np.ascontiguousarray(array))
        disk.sync_dir(os.path.join(self.path, folder))
        return entries, digests

    def release(self) -> None:
        """Lets another buffer open the directory (after a last flush, by the caller)."""
        if self._undo_fd is not None:
            os.close(self._undo_fd)
            self._undo_fd = None
        if self._lock_fd is not None:
            self._unlock()  # closing the descriptor drops the lock
            self._lock_fd = None

    @property
    def is_open(self) -> bool:
        return self._lock_fd is not None


def _put_back(arrays: list, records: list) -> None:
    """Writes the undo log's saved rows into `arrays`."""
    for rows, chunks in records:
        for array, saved in zip(arrays, chunks):
            array[rows] = saved


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


def _placeholder(shape: list, kind: np.dtype) -> np.ndarray:
    """Zeros in anonymous memory the kernel fills only when touched: what stands in for a refused file."""
    size = max(int(np.prod(shape)) * kind.itemsize, 1)
    return np.frombuffer(mmap.mmap(-1, size), np.uint8)[: int(np.prod(shape)) * kind.itemsize].view(kind).reshape(shape)


def _save_synced(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _write_synced(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
