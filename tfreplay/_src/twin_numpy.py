"""The NumPy twin: a buffer's state in NumPy arrays, one `threading.Lock` around every write and sample.

So no item is ever torn. `get_next` and `gather_all` return NumPy arrays;
`as_dataset` yields tensors through `tf.numpy_function`. With `seed=None`
it follows TF's global seed like the TF twin (an op seed keeps buffers
apart). What a buffer asks of a twin is listed in `buffer.py`.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay._src import compiled_windows, sample, specs, write
from tfreplay._src.api import BufferInfo
from tfreplay._src.checkpoint import state
from tfreplay._src.checkpoint.numpy_state import NumpyState
from tfreplay._src.memmap import MemmapFiles
from tfreplay._src.ops import NUMPY_OPS
from tfreplay._src.parts import Parts, Request
from tfreplay._src.rate_limiter import EmptyBufferError
from tfreplay._src.specs import Nest
from tfreplay._src.twin_tf import resolve_seed

_UNSET = object()
# Dataset elements drawn per `tf.numpy_function` call where draws are independent: the call costs more than
# drawing a few more windows.
DATASET_BLOCK = 8


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


class NumpyTwin:
    """Arrays, lock and generator of one NumPy buffer, and how its calls reach them.

    Args:
      seed: of the sampling generator (`np.random.default_rng`); None: TF's global seed if set.
      lockstep: each add holds one item per segment (`batch_size` rows); False: one ring, any number of rows.
      storage_dir: a directory for the items as memory-mapped files (see `memmap.py`): a new or empty one,
        or one a buffer of the same layout flushed, which it resumes. None: items in RAM.
    """

    ops = NUMPY_OPS
    is_tf = False

    def __init__(self, seed: Any = None, lockstep: bool = True, storage_dir: Any = None):
        self.rng = np.random.default_rng(resolve_seed(seed))
        self.lock = threading.Lock()
        self.lockstep = bool(lockstep)
        self.arrays: dict[str, np.ndarray] = {}
        self._views: dict = {}
        self._planner: Any = _UNSET  # the compiled window plan: looked up on first use
        self.files = None if storage_dir is None else MemmapFiles(storage_dir)
        self._flush: Callable[[], None] = lambda: None

    def module_name(self, name: str) -> str:
        return name

    def begin(self, num_segments: int, max_length: int) -> None:
        """Nothing to make before the parts (the lock covers every call)."""

    # What the parts are made with.
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

    def exclusive(self, fn: Callable[[], Any]) -> Any:
        with self.lock:
            return fn()

    def draw(self, shape: list, total: Any) -> np.ndarray:
        """Uniform int64 draws in `[0, total)` (any defined value when `total` is 0)."""
        return self.rng.integers(0, max(int(total), 1), size=shape, dtype=np.int64)

    def uniform(self, shape: list) -> np.ndarray:
        return self.rng.random(shape)

    def check(self, ok: Any, value: Any, message: str) -> Any:
        if not ok:
            raise ValueError(message)
        return value

    def checkpoint_state(self, buffer: Any, layout: dict, gate: Any, stored: Callable[[], Any]) -> None:
        """Attaches the state a `tf.train.Checkpoint` saves (under the name format 1 gave it)."""
        arrays, parts, files = (lambda: dict(self.arrays)), buffer._parts, self.files
        # A restore into memory-mapped files is a write like any other: the directory then reopens as the last
        # flush (a crash during the copy) or as the checkpoint (flushed once it is in place).
        around = None
        if files is not None:

            def before_copy() -> None:
                if files.is_open:
                    files.save_every_row()

            def after_copy() -> None:
                if files.is_open:
                    self._flush()

            around = (before_copy, after_copy)
        buffer._numpy_state = NumpyState(
            self.lock,
            arrays,
            self.rng,
            layout=layout,
            gate=gate,
            stored=stored,
            check=lambda v: state.check(parts, v),
            around_copy=around,
        )
        if files is not None:
            ram = {k: a for k, a in self.arrays.items() if k not in files.arrays}
            files.attach(type(buffer).__name__, parts, layout, ram, self.rng, gate)
            self._flush = lambda: files.flush(parts, layout, ram, self.rng, gate)

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

    def variables(self) -> tuple:
        return ()

    # Calls.
    def add(self, parts: Parts, gate: Any, where: str, data_spec: Nest, items: Nest, segment: Any = None) -> None:
        """Validates a batch, waits for the rate limiter, then writes it under the lock. `segment`: append a
        sequence (a leading time axis) to that one segment."""
        rows = parts.num_segments if self.lockstep and segment is None else None
        arrays = specs.validate_numpy_batch(where, data_spec, parts.leaf_paths, items, rows)
        if segment is not None:
            num_new, segments, count = arrays[0].shape[0], np.full([1], segment, np.int64), arrays[0].shape[0]
        else:
            num_new = 1 if self.lockstep else arrays[0].shape[0]  # one ring: rows in order
            segments, count = None, num_new * parts.num_segments
        if num_new:
            files = self.files

            def run() -> Any:
                if files is not None:  # the flushed rows this add overwrites, kept until the next flush
                    files.save_rows(parts, num_new, segments)
                return write.write(parts, arrays, num_new, segments)

            gate.call(where, "insert", count, run, self.exclusive)

    def get_next(self, parts: Parts, gate: Any, req: Request) -> tuple[Nest, BufferInfo]:
        """Draws and reads under the lock (planned in compiled code where it can be), then packages outside it."""
        view = self._views.get((req.window, req.padded))
        generator = self.rng.bit_generator
        with self.lock:
            if view is None:  # views hold the live arrays (nothing moves under the lock): one per kind of window
                view = self._views[req.window, req.padded] = parts.view(
                    req.window, req.padded, self.draw, self.uniform, lambda a: a
                )
            before = generator.state
            planned = self._compiled(parts, req, view) if req.window is not None or req.padded else None
            read_plan, ids, probs, count = sample.plan(parts, view, req) if planned is None else planned
            if count <= 0:  # refused: the draw is undone, so the same seed gives the same samples
                generator.state = before
                if parts.zeros_when_empty:
                    return _zeros(parts, req)
                raise EmptyBufferError(sample.empty_message(parts, "get_next", req))
            items = sample.read(parts, read_plan, req)
        return sample.package(items, ids, probs, req, NUMPY_OPS)

    def _compiled(self, parts: Parts, req: Request, view: Any) -> tuple | None:
        """`sample.plan` of windows through the index or padded ones, planned in compiled code; None where only
        the array-op path plans them, or without the library."""
        if self._planner is _UNSET:
            self._planner = compiled_windows.planner(parts)
        return None if self._planner is None else self._planner.plan(parts, req, self.draw, lambda: view)

    def sample_tensors(self, parts: Parts, gate: Any, req: Request) -> tuple[Nest, BufferInfo]:
        """One dataset element's sample as tensors: a stateful `tf.numpy_function`, admitted by the dataset's
        tick (given back if it fails)."""
        items_spec, ids_spec, probs_spec = sample.out_specs(parts, req)

        def draw() -> tuple:
            items, info = gate.settled("sample", req.size, lambda: self.get_next(parts, gate, req))
            return items, info.ids, info.probabilities

        items, ids, probs = self.numpy_call(draw, [], (items_spec, ids_spec, probs_spec))
        return items, BufferInfo(ids=ids, probabilities=probs)

    def sample_dataset(self, parts: Parts, gate: Any, req: Request, counter: tf.data.Dataset, parallel: Any) -> Any:
        """Fresh samples, `DATASET_BLOCK` elements per call where draws are independent (a uniform sampler's:
        the block is one sample of `block * size`) and nothing limits them one by one; else one per call."""
        deterministic = None if parallel is None else False  # independent draws: deliver as they finish
        if gate.limiter is not None or not parts.sampler.draws_uniformly:
            ticks = gate.ticks(counter, req.size)
            return ticks.map(lambda _: self.sample_tensors(parts, gate, req), parallel, deterministic=deterministic)
        block = dataclasses.replace(req, size=DATASET_BLOCK * req.size, batched=True)
        outer = [DATASET_BLOCK] + ([req.size] if req.batched else [])

        def draw(_: Any) -> Any:
            sample_ = self.sample_tensors(parts, gate, block)
            return tf.nest.map_structure(lambda x: tf.reshape(x, outer + x.shape[1:].as_list()), sample_)

        return counter.map(draw, num_parallel_calls=parallel, deterministic=deterministic).unbatch()

    def numpy_call(self, fn: Callable, inputs: list, out_specs: Nest) -> Nest:
        """`fn` as a stateful `tf.numpy_function`, its outputs shaped like `out_specs`."""
        flat_specs = tf.nest.flatten(out_specs)

        def call(*args: Any) -> list:
            return [np.asarray(x, s.dtype.as_numpy_dtype) for x, s in zip(tf.nest.flatten(fn(*args)), flat_specs)]

        out = tf.numpy_function(call, inputs, [s.dtype for s in flat_specs], stateful=True)
        for tensor, spec in zip(out, flat_specs):
            tensor.set_shape(spec.shape)
        return tf.nest.pack_sequence_as(out_specs, out)

    def snapshot(self, parts: Parts, fn: Callable[[], Any], out_specs: Nest, where: str) -> Nest:
        """`fn()` under the lock, as tensors shaped like `out_specs` (usable in a dataset map)."""
        return self.numpy_call(lambda: self.exclusive(fn), [], out_specs)

    def read_whole(self, parts: Parts, fn: Callable, inputs: list, out_specs: Nest, message: str) -> Nest:
        """The items of `fn(*inputs) -> (ok, items, rows, num_adds)` under the lock, once `ok` is checked."""

        def read(*args: Any) -> Any:
            with self.lock:
                ok, items, _, _ = fn(*args)
            return self.check(ok, items, message)

        return self.numpy_call(read, inputs, out_specs)

    def update_priorities(self, parts: Parts, ids: Any, priorities: Any) -> int:
        ids, values = _priority_arrays(ids, priorities)
        key = (parts.window, False)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = parts.view(parts.window, False, self.draw, self.uniform, lambda a: a)
        limit = parts.sampler.priority_limit
        checked = parts.sampler.checks_priorities(view)  # the compiled update refuses bad values itself
        write.check_priorities(ids.shape, values.shape, None if checked else values, limit)
        if ids.ndim != 1:
            ids, values = ids.reshape(-1), values.reshape(-1)
        with self.lock:
            stale = int(write.update_priorities(parts, view, ids, values))
        if stale < 0:  # the update found a bad priority and wrote nothing
            write.check_priorities(ids.shape, values.shape, values, limit)  # raises, naming the bad values
        return stale

    def num_frames(self, parts: Parts) -> int:
        return int(np.minimum(parts.num_adds, parts.max_length).sum())

    def gather_all(self, parts: Parts) -> Nest:
        return self.exclusive(lambda: write.gather_all(parts))

    def clear(self, parts: Parts) -> None:
        self.exclusive(lambda: write.clear(parts))


def _priority_arrays(ids: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
    """`update_priorities`' arguments as int64 ids and float64 priorities; `TypeError` for graph tensors,
    non-integer ids and non-numeric priorities, `ValueError` for ids past int64."""
    arrays = []
    for name, value in (("ids", ids), ("priorities", priorities)):
        if isinstance(value, (tf.Tensor, tf.Variable)):
            if not tf.executing_eagerly():
                raise TypeError(
                    f"update_priorities: {name} is a graph tensor; a NumPy buffer stores values, so call it eagerly "
                    "(inside tf.function, use TFPrioritizedReplayBuffer)."
                )
            value = value.numpy()
        arrays.append(np.asarray(value))
    ids, values = arrays
    if ids.dtype == object or values.dtype == object:  # Python ints past 64 bits, or mixed values
        raise TypeError("update_priorities: ids and priorities must be numeric arrays (ids within int64).")
    write.priority_dtypes(ids.dtype, values.dtype)
    if ids.dtype == np.uint64 and ids.size and ids.max() > np.iinfo(np.int64).max:
        raise ValueError(f"update_priorities: ids ({int(ids.max())} among them) must be within int64.")
    return ids.astype(np.int64, copy=False), values.astype(np.float64, copy=False)


def _zeros(parts: Parts, req: Request) -> tuple[Nest, BufferInfo]:
    """A sample of zeros shaped as `req` asks (ids 0, probabilities 0): what TF-Agents' NumPy buffer returns when
    it is empty (`Parts.zeros_when_empty`)."""
    items_spec, ids_spec, probs_spec = sample.out_specs(parts, req)
    items = tf.nest.map_structure(lambda s: np.zeros(s.shape, s.dtype.as_numpy_dtype), items_spec)
    info = BufferInfo(ids=np.zeros(ids_spec.shape, np.int64), probabilities=np.zeros(probs_spec.shape, np.float32))
    return sample.split_steps(items, info, req, NUMPY_OPS)
