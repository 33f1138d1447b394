"""The NumPy backend: a buffer's state in NumPy arrays, one `threading.Lock` around every write and sample.

So no item is ever torn. `get_next` and `gather_all` return NumPy arrays;
`as_dataset` yields tensors through `tf.numpy_function`. With `seed=None`
it follows TF's global seed like the TF backend (an op seed keeps buffers
apart). What a buffer asks of a backend is `backends.Backend`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay._src import sample, specs
from tfreplay._src.arrays import py_calls
from tfreplay._src.arrays.ops import NUMPY_OPS
from tfreplay._src.backends import BackendBase, numpy_windows
from tfreplay._src.backends.memmap import MemmapFiles
from tfreplay._src.backends.tf import resolve_seed
from tfreplay._src.checkpoint import state
from tfreplay._src.checkpoint.numpy_state import NumpyState
from tfreplay._src.parts import Parts, Request
from tfreplay._src.specs import Nest


def numpy_layout(where: str, capacity: Any, batch_size: Any, max_length: Any) -> tuple[int, int, bool]:
    """`(segments, max_length, lockstep)` of a NumPy buffer built as `(spec, capacity)` (one ring, any number
    of items per add) or `(spec, batch_size=B, max_length=L)` (one item per segment per add)."""
    if batch_size is None:
        if capacity is None:
            raise ValueError(f"{where}: capacity (None) must be given, or batch_size and max_length.")
        specs.check_positive_int(where, "capacity", capacity)
        if max_length is not None:
            raise ValueError(
                f"{where}: max_length ({max_length}) must come with batch_size; "
                "with capacity alone the buffer is one ring of capacity rows."
            )
        return 1, int(capacity), False
    specs.check_positive_int(where, "batch_size", batch_size)
    if capacity is not None:
        specs.check_positive_int(where, "capacity", capacity)
        if capacity % batch_size:
            raise ValueError(f"{where}: capacity ({capacity}) must be a multiple of batch_size ({batch_size}).")
        if max_length is not None and capacity != batch_size * max_length:
            raise ValueError(
                f"{where}: capacity ({capacity}) must equal batch_size ({batch_size}) * "
                f"max_length ({max_length}), or be left out."
            )
        return int(batch_size), int(capacity // batch_size), True
    specs.check_positive_int(where, "max_length", max_length, allow_none=True)
    return int(batch_size), 1000 if max_length is None else int(max_length), True


class NumpyTwin(BackendBase):
    """The NumPy backend (`backends.Backend`): arrays, a lock and a generator of one buffer.

    Args:
      seed: of the sampling generator (`np.random.default_rng`); None: TF's global seed if set.
      lockstep: each add holds one item per segment (`batch_size` rows); False: one ring, any number of rows.
      storage_dir: a directory for the items as memory-mapped files (see `backends/memmap.py`): a new or empty one,
        or one a buffer of the same layout flushed, which it resumes. None: items in RAM.
    """

    ops = NUMPY_OPS
    is_tf = False

    def __init__(self, seed: Any = None, lockstep: bool = True, storage_dir: Any = None):
        self.rng = np.random.default_rng(resolve_seed(seed))
        self.lock = threading.Lock()
        self.lockstep = bool(lockstep)
        self.arrays: dict[str, np.ndarray] = {}
        self.plan_windows: Callable[..., tuple | None] = lambda *args: None  # set by `bind`
        self.files = None if storage_dir is None else MemmapFiles(storage_dir)
        self._flush: Callable[[], None] = lambda: None

    def make(self, name: str, shape: list, dtype: tf.DType) -> np.ndarray:
        """A zero-filled array, part of the checkpoint; aligned to a cache line, as TF aligns tensors (the sum
        tree's 8-child nodes then take one line each)."""
        if self.files is not None and name.startswith("storage/"):
            self.arrays[name] = array = self.files.make(name, shape, dtype)
            return array
        kind = np.dtype(dtype.as_numpy_dtype)
        if kind.hasobject:  # strings: Python objects, never read by address
            array = np.zeros(shape, kind)
        else:
            size = int(np.prod(shape)) * kind.itemsize
            raw = np.zeros(size + 64, np.uint8)
            start = -raw.ctypes.data % 64
            array = raw[start : start + size].view(kind).reshape(shape)
        self.arrays[name] = array
        return array

    def bind(self, parts: Parts, layout: dict, gate: Any, stored: Callable[[], Any], owner: str) -> dict:
        """The state a `tf.train.Checkpoint` saves (under the name format 1 gave it); a storage directory
        takes the buffer's state too."""
        files, around = self.files, None
        if files is not None:
            # A restore into memory-mapped files is a write like any other: the directory then reopens as the
            # last flush (a crash during the copy) or as the checkpoint (flushed once it is in place).
            def before_copy() -> None:
                if files.is_open:
                    files.save_every_row()

            def after_copy() -> None:
                if files.is_open:
                    self._flush()

            around = (before_copy, after_copy)
        self.plan_windows = numpy_windows.finder(parts)
        check = lambda values: state.check(parts, values)  # noqa: E731
        arrays = lambda: dict(self.arrays)  # noqa: E731
        saved = NumpyState(
            self.lock, arrays, self.rng, layout=layout, gate=gate, stored=stored, check=check, around_copy=around
        )
        if files is not None:
            ram = {k: a for k, a in self.arrays.items() if k not in files.arrays}
            files.attach(owner, parts, layout, ram, self.rng, gate)
            self._flush = lambda: files.flush(parts, layout, ram, self.rng, gate)
        return {"_numpy_state": saved}

    def exclusive(self, fn: Callable[[], Any]) -> Any:
        with self.lock:
            return fn()

    def changing(self, parts: Parts, fn: Callable[[], Any], num_new: int | None, segments: Any = None) -> Any:
        """`fn()`; with a storage directory the flushed rows it overwrites are kept first, until the next flush."""
        if self.files is not None and num_new is not None:
            self.files.save_rows(parts, num_new, segments)
        return fn()

    def draw(self, shape: list, total: Any) -> np.ndarray:
        """Uniform int64 draws in `[0, total)` (any defined value when `total` is 0)."""
        return self.rng.integers(0, max(int(total), 1), size=shape, dtype=np.int64)

    def pick(self, shape: list, total: Any) -> tuple[np.ndarray, np.ndarray]:
        """`draw` and its probability in one call: the uniform sampler's whole draw."""
        total = int(total)
        draws = self.rng.integers(0, max(total, 1), size=shape, dtype=np.int64)
        return draws, np.full(shape, 1.0 / total if total else 0.0, np.float32)

    def uniform(self, shape: list) -> np.ndarray:
        return self.rng.random(shape)

    def check(self, ok: Any, value: Any, message: str) -> Any:
        if not ok:
            raise ValueError(message)
        return value

    def read(self, parts: Parts, req: Request) -> tuple:
        """Draws and reads under the lock (planned in compiled code where it can be), packages outside it."""
        view = parts.views.get((req.window, req.padded))
        generator = self.rng.bit_generator
        with self.lock:
            if view is None:
                view = parts.cached_view(req.window, req.padded, self)
            before = generator.state
            planned = self.plan_windows(parts, req, self.draw, view) if req.window is not None or req.padded else None
            read_plan, ids, probs, count = sample.plan(parts, view, req) if planned is None else planned
            if count <= 0:  # the draw is undone (under the lock: no other draw comes between)
                generator.state = before
                return None, None, 0
            items = req.read(read_plan)
        return (*sample.package(items, ids, probs, req, NUMPY_OPS, split=False), count)

    def consistent(self, parts: Parts, fn: Callable[[], tuple], where: str, strict: bool = False) -> Any:
        """Under the lock, nothing can tear a read."""
        with self.lock:
            return fn()[0]

    def as_tensors(self, fn: Callable, inputs: list, out_specs: Nest) -> Nest:
        """`fn` as a stateful `tf.numpy_function`, its outputs shaped like `out_specs`."""
        flat_specs = tf.nest.flatten(out_specs)

        def call(*args: Any) -> list:
            return [np.asarray(x, s.dtype.as_numpy_dtype) for x, s in zip(tf.nest.flatten(fn(*args)), flat_specs)]

        out = py_calls.numpy_function(call, inputs, [s.dtype for s in flat_specs])
        for tensor, spec in zip(out, flat_specs):
            tensor.set_shape(spec.shape)
        return tf.nest.pack_sequence_as(out_specs, out)

    def flush(self) -> None:
        """Makes the storage directory a snapshot of the buffer now (nothing to do in RAM)."""
        if self.files is not None and self.files.is_open:
            with self.lock:
                self._flush()

    def close(self) -> None:
        """A last flush, then the storage directory is free for another buffer to open."""
        if self.files is not None and self.files.is_open:
            with self.lock:
                self._flush()
                self.files.release()
