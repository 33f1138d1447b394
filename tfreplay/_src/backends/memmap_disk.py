"""The directory side of memory-mapped storage: its lock, what it may hold, reserved blocks, the undo log, digests.

What a directory holds, by name: `manifest.json` (the last flush), `storage-<i>.dat` (the mapped files),
`state-<generation>/` (the last flush's larger state arrays), `undo-<generation>.log` (flushed rows overwritten
since), and while a new buffer is being made, `unfinished` (so a directory killed before its first manifest is
made again, while one whose manifest was lost is refused). Every check here runs before anything in the
directory is written.

The undo log is a list of records `[count][rows: count int64][each storage array's rows][crc32]`, all int64
but the arrays' bytes; the checksum covers the rows and their bytes. A short last record is the one being
written when the process died (its rows were not overwritten yet); anything else that does not parse is refused.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import zlib
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows: no lock)
    fcntl = None  # type: ignore[assignment]

MANIFEST = "manifest.json"
UNFINISHED = "unfinished"
_OLD_LOCK = ".lock"  # an older tfreplay's lock file: harmless, removed on open
_NO_RESERVE = (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOSYS", errno.EINVAL))


def own_file(name: str) -> bool:
    """Whether a directory entry is one a memmap buffer writes."""
    stem = name.split(".")[0].split("-")[0]
    return name in (MANIFEST, MANIFEST + ".tmp", UNFINISHED, _OLD_LOCK) or stem in ("storage", "state", "undo")


def lock(path: str, where: str) -> int:
    """Makes the directory if needed and locks it (the directory itself, so no file is made first); returns the
    descriptor that holds the lock until it is closed."""
    os.makedirs(path, exist_ok=True)
    if fcntl is None:  # pragma: no cover (no lock: a descriptor that stands for the open directory)
        return os.open(os.devnull, os.O_RDONLY)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ValueError(
            f"{where}: storage_dir ({path!r}) must not be open in another buffer; it is (in this process or "
            "another). close() that buffer first."
        ) from None
    return fd


def examine(path: str, where: str) -> str | None:
    """The manifest's text, or None for a new buffer (an empty directory, or one whose making never finished);
    refuses a directory of other files, or of a buffer's files without their manifest."""
    manifest = os.path.join(path, MANIFEST)
    if os.path.exists(manifest):
        with open(manifest, encoding="utf-8") as f:
            return f.read()
    names = sorted(os.listdir(path))
    foreign = [n for n in names if not own_file(n)]
    if foreign:
        raise ValueError(
            f"{where}: storage_dir ({path!r}) must be empty or hold a tfreplay buffer ({MANIFEST}); it holds "
            f"{foreign[:3]}. Pass a new or empty directory."
        )
    files = [n for n in names if n not in (UNFINISHED, _OLD_LOCK)]
    if files and UNFINISHED not in names:
        raise ValueError(
            f"{where}: storage_dir ({path!r}) holds a buffer's files ({files[:4]}) but no {MANIFEST}, which says "
            f"what they hold; it must hold both. Put back {MANIFEST} from a backup, or pass a new or empty "
            "directory (remove this one if its items are not needed); nothing in it was changed."
        )
    return None


def begin_new(path: str) -> None:
    """Marks the directory as a buffer being made, after removing what an unfinished making left."""
    for name in os.listdir(path):
        if name != UNFINISHED:
            remove(os.path.join(path, name))
    with open(os.path.join(path, UNFINISHED), "wb") as f:
        os.fsync(f.fileno())
    sync_dir(path)


def tidy(path: str, generation: int) -> None:
    """Removes what the flush of `generation` made obsolete: other state folders, every undo log (none belongs
    to a generation yet), a half-written manifest and the new-buffer mark."""
    keep = {MANIFEST, f"state-{generation}"}
    for name in os.listdir(path):
        stale = name.startswith(("state-", "undo-")) or name in (MANIFEST + ".tmp", UNFINISHED, _OLD_LOCK)
        if stale and name not in keep:
            remove(os.path.join(path, name))


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def reserve(path: str, size: int, where: str) -> None:
    """Gives the file `path` its `size` bytes of disk blocks now, so that writing its mapped pages never meets a
    full disk (which kills the process with SIGBUS); a disk without room is an `OSError` here instead. Where the
    platform cannot reserve blocks, the free space is checked instead."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            if size and hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
                return
        except OSError as err:
            if err.errno not in _NO_RESERVE:
                raise _no_room(where, path, size, err.strerror, err.errno or errno.ENOSPC) from None
        if size > os.fstat(fd).st_size:
            disk = os.statvfs(os.path.dirname(path))
            free = disk.f_bavail * disk.f_frsize
            if free < size - os.fstat(fd).st_size:
                raise _no_room(where, path, size, f"{free} bytes free", errno.ENOSPC)
            os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _no_room(where: str, path: str, size: int, why: Any, code: int) -> OSError:
    folder, file = os.path.split(path)
    return OSError(
        code,
        f"{where}: storage_dir ({folder!r}): {file} needs {size} bytes of disk ({why}); free disk space or pass a "
        "storage_dir on a disk with room, or a smaller capacity.",
    )


def write_failed(where: str, path: str, err: OSError, what: str) -> OSError:
    folder, file = os.path.split(path)
    return OSError(
        err.errno,
        f"{where}: storage_dir ({folder!r}): writing {file} failed ({err.strerror}); {what} Free disk space, then "
        "try again: the directory still holds the last flush.",
    )


def sync_dir(path: str) -> None:
    if os.name == "posix":
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# The undo log.
def append(fd: int, rows: np.ndarray, arrays: list) -> None:
    """Appends one record; a failed write is cut off again, so the log never holds a broken record mid-file."""
    body = b"".join([rows.astype(np.int64).tobytes(), *(np.ascontiguousarray(a[rows]).tobytes() for a in arrays)])
    record = b"".join([np.int64(rows.size).tobytes(), body, np.int64(zlib.crc32(body)).tobytes()])
    end = os.lseek(fd, 0, os.SEEK_END)
    try:
        view = memoryview(record)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.ftruncate(fd, end)
        raise


def read_log(here: str, path: str, arrays: list, live: np.ndarray) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """Every record of an undo log as `(rows, each array's rows)`, after checking all of them: rows in range,
    each saved once and counted by the flush (`live`, per row), checksums right."""
    with open(path, "rb") as f:
        data = f.read()
    name, capacity = os.path.basename(path), live.size
    row_bytes = [a[0].nbytes for a in arrays]
    records, seen, at = [], np.zeros([capacity], bool), 0
    while at + 8 <= len(data):
        count = int(np.frombuffer(data, np.int64, 1, at)[0])
        size = 8 * count + count * sum(row_bytes)
        if not 0 < count <= capacity:
            raise _bad_log(f"{here}: {name}: its record at byte {at} must hold 1 to {capacity} rows ({count})")
        if at + 16 + size > len(data):
            break  # the record being written when the process died: its rows were not overwritten yet
        rows = np.frombuffer(data, np.int64, count, at + 8)
        where = f"{here}: {name}: its record at byte {at} ({count} rows)"
        bad = rows[(rows < 0) | (rows >= capacity)]
        if bad.size:
            raise _bad_log(f"{where}: rows ({bad[:4].tolist()}) must be in [0, {capacity})")
        unique, times = np.unique(rows, return_counts=True)
        again = np.concatenate([rows[seen[rows]], unique[times > 1]])
        if again.size:
            raise _bad_log(f"{where} saves row {int(again[0])} twice; each row must be saved once per flush")
        if not live[rows].all():
            raise _bad_log(f"{where}: row {int(rows[~live[rows]][0])} must be one the last flush counted")
        body = data[at + 8 : at + 8 + size]
        if int(np.frombuffer(data, np.int64, 1, at + 8 + size)[0]) != zlib.crc32(body):
            raise _bad_log(f"{where} must match its checksum; it was edited or damaged")
        seen[rows] = True
        chunks, offset = [], at + 8 + 8 * count
        for array, nbytes in zip(arrays, row_bytes):
            flat = np.frombuffer(data, array.dtype, count * nbytes // array.dtype.itemsize, offset)
            chunks.append(flat.reshape((count,) + array.shape[1:]))
            offset += count * nbytes
        records.append((rows, chunks))
        at += 16 + size
    return records


def _bad_log(rule: str) -> ValueError:
    return ValueError(
        f"{rule}. Putting back rows from it could restore them to the wrong place: restore the directory from a "
        "backup or pass a new storage_dir; nothing in it was changed."
    )


# Digests: the manifest records one of each field and state array, so an edit of either is refused.
def digest(value: Any) -> str:
    data = value.tobytes() if isinstance(value, np.ndarray) else json.dumps(value, sort_keys=True).encode()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


FIELDS = ("generation", "layout", "files", "rng", "rate_limiter")


def check_digests(here: str, manifest: dict, state: dict[str, np.ndarray]) -> None:
    """Refuses a manifest whose fields or state arrays are not what the flush that wrote it recorded."""
    saved = manifest.get("digests")
    if not isinstance(saved, dict):
        raise ValueError(f"{here}: {MANIFEST}: its digests ({saved!r}) must be the object a flush writes.")
    found = {**{f: manifest.get(f) for f in FIELDS}, **{f"state {n}": v for n, v in state.items()}}
    for field, value in found.items():
        if saved.get(field) != digest(value):
            shown = value.reshape(-1)[:4].tolist() if isinstance(value, np.ndarray) else value
            raise ValueError(
                f"{here}: {MANIFEST}: its {field} ({json.dumps(shown, default=str)[:60]}) must be what the flush "
                "wrote (its digest differs); the file was edited or damaged. Restore the directory from a backup "
                "or pass a new storage_dir."
            )
