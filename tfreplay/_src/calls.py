"""A buffer's calls, written once over its backend's primitives (`backends/__init__.py`).

Each function takes the buffer's parts, its backend and, where the rate
limiter takes part, its gate. The work itself is the pure functions of the
parts (`write.py`, `sample.py`); here it is checked, gated, locked, refused
when there is nothing to draw, and traced or run as the backend runs it.
A NumPy backend runs every call in Python; a TF one runs eager calls as
concrete functions traced once per kind (`Backend.compile`) and graph calls
as ops, where a refusal is an assertion and the rate limiter's wait an op.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from tfreplay._src import sample, specs, write
from tfreplay._src.api import BufferInfo
from tfreplay._src.arrays.ops import under_xla
from tfreplay._src.backends import Backend
from tfreplay._src.parts import Parts, Request
from tfreplay._src.rate_limiting.limiter import EmptyBufferError
from tfreplay._src.specs import Nest

# Dataset elements a NumPy buffer draws per `tf.numpy_function` call where draws are independent: the call costs
# more than drawing a few more windows.
DATASET_BLOCK = 8


def add(
    parts: Parts, backend: Backend, gate: Any, where: str, data_spec: Nest, items: Nest, segment: Any = None
) -> Any:
    """Validates a batch, waits for the rate limiter, then writes it under the lock. `segment`: append a
    sequence (a leading time axis) to that one segment (NumPy)."""
    if not backend.is_tf:
        return _add_arrays(parts, backend, gate, where, data_spec, items, segment)
    leaves, asserts = specs.validate_tensor_batch(where, data_spec, parts.leaf_paths, items, parts.num_segments)
    n = parts.num_segments
    if tf.executing_eagerly():  # one traced call per batch signature
        signature = [tf.TensorSpec(x.shape, x.dtype) for x in leaves]
        run = backend.compile("add", lambda leaves: _locked_write(parts, backend, leaves), signature)
        return gate.call(where, "insert", n, lambda: run(leaves))
    with tf.control_dependencies(asserts):  # checked, then wait for the rate limiter, then lock and write
        admitted = gate.admit_op(where, "insert", n)
    with tf.control_dependencies(asserts + admitted):
        return gate.settle_op(where, "insert", n, True, _locked_write(parts, backend, leaves))


def _locked_write(parts: Parts, backend: Any, leaves: list) -> Any:
    """A TF write of one item per segment: one call holding the lock (`TFTwin.locked_call`)."""
    return backend.locked_call(lambda: backend.changing(parts, lambda: write.write(parts, leaves, 1), 1))


def _add_arrays(parts: Parts, backend: Backend, gate: Any, where: str, spec: Nest, items: Nest, segment: Any) -> None:
    """`add` of NumPy arrays: one item per segment (lockstep), any number of rows (one ring), or a sequence
    appended to one segment; the rate limiter settles under the lock (a checkpoint holds rows and count)."""
    rows = parts.num_segments if backend.lockstep and segment is None else None
    arrays = specs.validate_numpy_batch(where, spec, parts.leaf_paths, items, rows)
    if segment is not None:
        num_new, segments, count = arrays[0].shape[0], np.full([1], segment, np.int64), arrays[0].shape[0]
    else:
        num_new = 1 if backend.lockstep else arrays[0].shape[0]  # one ring: rows in order
        segments, count = None, num_new * parts.num_segments
    if num_new:
        run = lambda: backend.changing(parts, lambda: write.write(parts, arrays, num_new, segments), num_new, segments)  # noqa: E731
        gate.call(where, "insert", count, run, backend.exclusive)


def get_next(parts: Parts, backend: Backend, gate: Any, req: Request) -> tuple[Nest, BufferInfo]:
    """One sample of `req`; refused (`EmptyBufferError`, or zeros: `Parts.zeros_when_empty`) when there is
    nothing to draw. In a graph the refusal is an assertion (`sample_tensors`)."""
    if backend.is_tf and not tf.executing_eagerly():
        items, info = sample_tensors(parts, backend, gate, req)
    else:
        items, info, count = backend.read(parts, req)
        if count <= 0:  # the backend rewound the draw: the same seed gives the same samples
            if parts.zeros_when_empty:
                items, info = _zeros(parts, req)
            else:
                raise EmptyBufferError(sample.empty_message(parts, "get_next", req))
    if req.num_steps is not None and not req.time_stacked:
        return sample.split_steps(items, info, req, backend.ops)
    return items, info


def sample_tensors(parts: Parts, backend: Backend, gate: Any, req: Request) -> tuple[Nest, BufferInfo]:
    """One time-stacked sample as graph tensors (a `get_next` in a graph, or a dataset element); an empty
    draw gives its admission back. A NumPy sample is one stateful op, admitted by the dataset's tick."""
    if not backend.is_tf:
        items_spec, ids_spec, probs_spec = sample.out_specs(parts, req)

        def draw() -> tuple:
            items, info = gate.settled("sample", req.size, lambda: get_next(parts, backend, gate, req))
            return items, info.ids, info.probabilities

        items, ids, probs = backend.as_tensors(draw, [], (items_spec, ids_spec, probs_spec))
        return items, BufferInfo(ids=ids, probabilities=probs)
    items, info, count = backend.read(parts, req)
    count = gate.settle_op("get_next", "sample", req.size, count > 0, count)  # refund if empty
    message = "" if under_xla() else sample.empty_message(parts, "get_next", req)  # XLA: probability 0 instead
    return backend.check(count > 0, (items, info), message)


def sample_dataset(
    parts: Parts, backend: Backend, gate: Any, req: Request, counter: tf.data.Dataset, parallel: Any
) -> tf.data.Dataset:
    """Fresh samples, one drawn per element when the pipeline asks for it (so a TF read after an add sees that
    add, as TF-Agents' tests rely on). A NumPy buffer draws `DATASET_BLOCK` elements per call where draws are
    independent (a uniform sampler's: the block is one sample of `block * size`) and nothing limits them one
    by one."""
    deterministic = None if parallel is None else False  # independent draws: deliver as they finish
    if backend.is_tf or gate.limiter is not None or not parts.sampler.draws_uniformly:
        ticks = gate.ticks(counter, req.size)
        return ticks.map(lambda _: sample_tensors(parts, backend, gate, req), parallel, deterministic=deterministic)
    block = dataclasses.replace(req, size=DATASET_BLOCK * req.size, batched=True)
    outer = [DATASET_BLOCK] + ([req.size] if req.batched else [])

    def draw(_: Any) -> Any:
        sample_ = sample_tensors(parts, backend, gate, block)
        return tf.nest.map_structure(lambda x: tf.reshape(x, outer + x.shape[1:].as_list()), sample_)

    return counter.map(draw, num_parallel_calls=parallel, deterministic=deterministic).unbatch()


def update_priorities(parts: Parts, backend: Backend, ids: Any, priorities: Any) -> Any:
    """New priorities for sampled ids; returns how many ids were stale. Bad values are refused before anything
    changes (in a graph: by an assertion, or by the compiled update itself)."""
    sampler, limit = parts.sampler, parts.sampler.priority_limit
    if not backend.is_tf:
        ids, values = write.numpy_priorities(ids, priorities)
        view = parts.cached_view(parts.window, False, backend)
        checked = sampler.checks_priorities(view)  # the compiled update refuses bad values itself, as -1
        write.check_priorities(ids.shape, values.shape, None if checked else values, limit)
        if ids.ndim != 1:
            ids, values = ids.reshape(-1), values.reshape(-1)
        stale = int(backend.exclusive(lambda: write.update_priorities(parts, view, ids, values)))
        if stale < 0:  # the update found a bad priority and wrote nothing
            write.check_priorities(ids.shape, values.shape, values, limit)  # raises, naming the bad values
        return stale
    ids, values = write.tensor_priorities(ids, priorities)
    if tf.executing_eagerly():
        write.check_priorities(ids.shape, values.shape, values.numpy(), limit)
        shape = [None] * ids.shape.rank  # one trace for any number of ids
        signature = (tf.TensorSpec(shape, tf.int64), tf.TensorSpec(shape, tf.float64))
        update = backend.compile(f"update/{len(shape)}", lambda i, p: _update(parts, backend, i, p), *signature)
        return update(ids, values)
    write.check_priorities(ids.shape, values.shape, None)
    stale = _update(parts, backend, ids, values)
    if sampler.checks_priorities(parts.cached_view(parts.window, False, backend)):
        return stale  # the compiled update raises on a bad priority itself
    return backend.check(stale >= 0, stale, write.PRIORITIES_RULE)  # -1: a bad priority, nothing written


def _update(parts: Parts, backend: Backend, ids: tf.Tensor, priorities: tf.Tensor) -> tf.Tensor:
    """A TF update: without the lock where the sampler's compiled update allows it (it reads the counters'
    variable itself: the in-place view), else under the lock."""
    with backend.placement():
        unlocked = parts.cached_view(parts.window, False, backend)
        fused = parts.sampler.unlocked_update(unlocked, ids, priorities)
        if fused is not None:
            return fused[1]

        def locked() -> Any:
            view = parts.view(parts.window, False, backend, backend.ops.read)
            return write.update_priorities(parts, view, ids, priorities)

        return backend.exclusive(locked)


def num_frames(parts: Parts, backend: Backend) -> Any:
    """How many items are stored (a Python int for NumPy buffers)."""
    count = write.num_frames(parts)
    return count if backend.is_tf else int(count)


def gather_all(parts: Parts, backend: Backend) -> Nest:
    return backend.exclusive(lambda: write.gather_all(parts))


def clear(parts: Parts, backend: Backend, also: Any = None) -> Any:
    """Empties the buffer under the lock (`also`: more updates first, e.g. zeroing rows); TF samples reading
    without the lock learn of it from the write counters."""
    ops = backend.ops

    def cleared() -> Any:
        return ops.after(also() if also is not None else [], lambda: write.clear(parts))

    return backend.exclusive(lambda: backend.changing(parts, cleared, None))


def mass(parts: Parts, backend: Backend, window: Any, padded: bool, num_steps: int | None) -> Any:
    """What the sampler would draw from now (`sampling_mass`; 0: nothing), read under the lock."""
    return backend.exclusive(lambda: mass_held(parts, backend, window, padded, num_steps))


def mass_held(parts: Parts, backend: Backend, window: Any, padded: bool, num_steps: int | None) -> Any:
    """`mass` for a caller that holds the lock already (the lock is not reentrant)."""
    return parts.sampler.mass(parts.view(window, padded, backend, backend.ops.read), num_steps)


def drawable(parts: Parts, backend: Backend, where: str, req: Request, held: bool = False) -> tuple[Any, str]:
    """Whether `req` finds anything to draw now (read under the lock; `held`: the caller holds it), and the
    message that refuses it when not. A buffer that answers zeros always draws."""
    if parts.zeros_when_empty:
        return tf.constant(True), ""
    n = req.num_steps if req.transform is None else req.n
    found = (mass_held if held else mass)(parts, backend, req.window, req.padded, n)
    return found > 0, sample.empty_message(parts, where, req)


def _zeros(parts: Parts, req: Request) -> tuple[Nest, BufferInfo]:
    """A sample of zeros shaped as `req` asks (ids 0, probabilities 0), time-stacked: what TF-Agents' NumPy
    buffer returns when it is empty (`Parts.zeros_when_empty`)."""
    items_spec, ids_spec, probs_spec = sample.out_specs(parts, req)
    items = tf.nest.map_structure(lambda s: np.zeros(s.shape, s.dtype.as_numpy_dtype), items_spec)
    info = BufferInfo(ids=np.zeros(ids_spec.shape, np.int64), probabilities=np.zeros(probs_spec.shape, np.float32))
    return items, info
