"""The sample path, as pure functions of a buffer's parts: resolve a request, plan, read, package.

`request` checks a kind of sample once. Under the lock (or inside a TF
versioned read, `backends/tf_versioned.py`) `plan` has the sampler draw window starts
through a `View` and turns them into storage rows (with a transform: its
windows' mask, and the rows of the steps it reads alone); `read` does the
bulk copy. Outside the lock `package` applies the transform, drops the batch
axis of an unbatched sample and splits windows into steps unless
`time_stacked`. The same lines run on both twins through `parts.ops`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import tensorflow as tf

from tfreplay._src import specs
from tfreplay._src.api import BufferInfo
from tfreplay._src.index import episodes, ring
from tfreplay._src.parts import Parts, Request
from tfreplay._src.samplers import View
from tfreplay._src.transforms import base as transforms
from tfreplay._src.transforms import lookups


def max_window(parts: Parts) -> int:
    """The longest `num_steps` a window may have (a frame window also needs the frame before it)."""
    return parts.max_length - parts.storage.window.lead


def request(
    parts: Parts, where: str, sample_batch_size: Any, num_steps: Any, time_stacked: bool, transform: Any
) -> Request:
    """The checked kind of sample; `ValueError`/`TypeError` naming the argument otherwise."""
    specs.check_positive_int(where, "sample_batch_size", sample_batch_size, allow_none=True)
    specs.check_positive_int(where, "num_steps", num_steps, allow_none=True)
    steps: tuple = ()
    looked: tuple = ()
    if transform is not None:
        steps, looked = _check_transform(parts, where, num_steps, transform)
    longest = max_window(parts)
    if num_steps is not None and num_steps > longest:
        extra = " - 1" if parts.storage.window.lead else ""
        raise ValueError(
            f"{where}: num_steps ({num_steps}) must be at most max_length{extra} ({longest}); "
            "a window is drawn from one segment, which never holds more"
            + ("; a window also needs the frame before it." if extra else ".")
        )
    if transform is not None and not time_stacked:
        raise ValueError(f"{where}: time_stacked (False) must be True with a transform, which maps whole windows.")
    window, padded = parts.windows(transform)
    n = (num_steps or 1) if transform is None else int(transform.num_steps)
    if window is not None and not padded and n > 1 and not parts.sampler.episode_windows:
        raise ValueError(
            f"{where}: num_steps ({n}) must be None or 1 when windows stay inside episodes (frame buffers, "
            f"within_episodes=True): {type(parts.sampler).__name__} cannot keep such a window's probability exact. "
            "Draw single items, or windows that may run past an episode's end (padded windows, with a mask)."
        )
    key = f"{sample_batch_size}/{num_steps}/{time_stacked}/{transform!r}"
    size = 1 if sample_batch_size is None else int(sample_batch_size)
    batched = sample_batch_size is not None
    req = Request(size, batched, num_steps, n, time_stacked, transform, window, padded, steps, key, looked)
    if transform is None:  # the storage reads whole windows itself
        return dataclasses.replace(req, read=functools.partial(parts.storage.read, num_steps=num_steps, ops=parts.ops))
    return dataclasses.replace(req, read=functools.partial(_read_transformed, parts, req))


def _check_transform(parts: Parts, where: str, num_steps: Any, transform: Any) -> tuple[tuple, tuple]:
    """Refuses a transform this buffer cannot serve, before anything is drawn; its leaves' steps and the
    leaves it looks up at other steps of the episode."""
    if not isinstance(transform, transforms.Transform):
        raise TypeError(
            f"{where}: transform ({transform!r}) must be a tfreplay.transforms.Transform "
            "(NStepReturns, Sequences, or a subclass)."
        )
    if num_steps is not None:
        raise ValueError(
            f"{where}: num_steps ({num_steps}) must be None with a transform; "
            f"{transform!r} reads windows of {transform.num_steps} items."
        )
    if transform.num_steps > max_window(parts):
        raise ValueError(
            f"{where}: the window of {transform!r} ({transform.num_steps} items) must be at most "
            f"{max_window(parts)} items, the longest a segment holds; use a shorter window or a longer max_length."
        )
    window, padded = parts.windows(transform)
    kind, able = (
        ("padded", parts.sampler.padded_windows) if padded else ("episode-aware", parts.sampler.episode_windows)
    )
    # Without an index a padded window is a plain ring window, which every sampler draws.
    if window is not None and not able:
        raise ValueError(
            f"{where}: transform ({transform!r}) needs {kind} windows, which "
            f"{type(parts.sampler).__name__} does not draw."
        )
    transform.output_spec(parts.storage.item_spec)  # raises on fields it cannot use
    looked = tuple(transform.lookups(parts.storage.item_spec))
    if looked:
        lookups.check(parts, where, transform, looked)
    return tuple(transforms.leaf_steps(transform, parts.storage.item_spec)), looked


# The other fix for a sample with nothing to draw, after each refusal of tfreplay's own buffers (`Parts.empty_note`).
WAIT_HINT = (
    " To have sampling wait for items instead, build the buffer with a rate_limiter (rate_limiter=tfreplay.MinSize(n))."
)


def empty_message(parts: Parts, where: str, req: Request) -> str:
    """Why nothing could be drawn, and what to do (and the buffer's note: see `Parts.empty_note`)."""
    return _empty_message(parts, where, req) + parts.empty_note


def _empty_message(parts: Parts, where: str, req: Request) -> str:
    if req.transform is not None:
        return (
            f"{where}: the buffer holds no window {req.transform!r} can read yet "
            f"({req.n} items{', padded' if req.padded else ' of one episode'}); add more items before sampling."
        )
    n = req.n
    if parts.storage.window.lead:
        what = "transition" if n == 1 else f"window of {n} transitions of one episode"
        fix = "add steps after each episode's first frame before sampling."
        return f"{where}: the buffer holds no valid {what} yet; {fix}"
    if req.window is not None and n > 1:
        return f"{where}: no episode holds {n} consecutive items yet (num_steps={n}); add more before sampling."
    if n == 1:
        return f"{where}: the buffer is empty; add items before sampling."
    return f"{where}: no segment holds {n} consecutive items yet (num_steps={n}); add more items before sampling."


def plan(parts: Parts, view: View, req: Request) -> tuple[Any, Any, Any, Any]:
    """Under the lock: `(read plan, ids, probabilities, count)` of `req.size` windows, in array ops.

    With a transform the windows are its own (`req.n` items, strict or
    padded), the plan carries their `[size, n]` mask (and where its fields are
    read at one step, those steps' rows; where it looks up other steps of the
    episode, their rows: `with_lookups`) and the ids are each window's first
    item's. Compiled planners (`backends/numpy_windows.py`) return the same plan.
    """
    ops, layout = parts.ops, (parts.max_length, parts.num_segments)
    segment, t, probs, count = parts.sampler.sample(view, req.size, req.num_steps if req.transform is None else req.n)
    pos_at = parts.pos_at if parts.rule is not None else None
    if req.transform is None:
        step_rows, ids = ring.window_rows(segment, t, req.num_steps, *layout, ops)
        return parts.storage.plan(segment, t, step_rows, req.num_steps, pos_at, ops), ids, probs, count
    read_plan, ids = _transform_plan(parts, view, req, segment, t, pos_at)
    return with_lookups(parts, view, req, read_plan, ids), ids, probs, count


def with_lookups(parts: Parts, view: View, req: Request, read_plan: Any, ids: Any) -> Any:
    """The read plan of windows with first items `ids`, and the rows a transform's lookups read
    (`transforms/lookups.py`)."""
    return (read_plan, lookups.plan(parts, view, req, ids)) if req.lookups else read_plan


def rows_read(read_plan: Any, req: Request) -> Any:
    """The storage rows a read plan reads (a TF read is checked against writes to them: `backends/tf_versioned.py`)."""
    if req.transform is None:
        return read_plan
    if req.lookups:
        (windows, *_), (rows, _, end_rows) = read_plan
        return windows, rows, end_rows
    return read_plan[0]


def _transform_plan(parts: Parts, view: View, req: Request, segment: Any, t: Any, pos_at: Any) -> tuple[Any, Any]:
    """`(read plan, ids)` of a transform's windows starting at `t` of `segment`."""
    ops, layout, n = parts.ops, (parts.max_length, parts.num_segments), req.n
    local = ops.window_ids(t, n)  # time-major in NumPy's memory: the mask and reads keep that layout
    step_rows, ids = ring.rows_of(local, segment[:, None], *layout), ring.local_to_rows(t, segment, *layout)[1]
    read_plan = parts.storage.plan(segment, t, step_rows, n, pos_at, ops)
    if not view.padded:
        mask = ops.ones_like(step_rows) > 0
    else:  # the stored items; with an index, those of the first item's episode
        mask = episodes.window_mask(segment, local, view.num_adds, ops)
        if view.pos_at is not None and not req.steps:
            # Whole windows: `pos` is read with the items (`read`), not in the draw: in a compiled draw XLA on
            # CPU splits a gather from a large `pos` across threads.
            return (read_plan, mask, step_rows), ids
        if view.pos_at is not None:
            mask = mask & episodes.same_episode(view.pos_at(step_rows), ops)
    if not req.steps:
        return (read_plan, mask), ids
    # Each window's last real step, and the rows of its first and last: fields read there alone.
    last = ops.sum(ops.to_int64(mask), 1) - 1
    last_rows = ring.rows_of(t + last, segment, *layout)
    return (read_plan, mask, last, step_rows[:, 0], last_rows), ids


def compiled_plan(parts: Parts, segment: Any, t: Any, rows: Any, mask: Any, last: Any, last_rows: Any, req: Request):
    """The read plan of a transform's windows planned in compiled code: `rows` and `mask` time-major
    (`[n, size]`, as the array-op path lays them out in memory), `last` each window's last real step and
    `last_rows` its row; what `plan` returns for them."""
    ops, pos_at = parts.ops, parts.pos_at if parts.rule is not None else None
    read_plan = parts.storage.plan(segment, t, ops.transpose(rows), rows.shape[0], pos_at, ops)
    mask = ops.transpose(mask)
    return (read_plan, mask, last, rows[0], last_rows) if req.steps else (read_plan, mask)


def _read_transformed(parts: Parts, req: Request, read_plan: Any) -> tuple:
    """A transform's read of a plan (`Request.read`): `(items, mask)`, and a `Lookup` with lookups."""
    if req.lookups:  # the windows, then what the transform looks up
        read_plan, looked = read_plan
        return (*_read_windows(parts, read_plan, req), lookups.read(parts, looked, req))
    return _read_windows(parts, read_plan, req)


def _read_windows(parts: Parts, read_plan: Any, req: Request) -> tuple[Any, Any]:
    """A transform's windows and their mask."""
    ops = parts.ops
    read_plan, mask, *at = read_plan
    if len(at) == 1:  # padded whole windows: which stored items are steps of the first's episode
        mask = mask & episodes.same_episode(parts.pos_at(at[0]), ops)
    if len(at) <= 1:
        return parts.storage.read(read_plan, req.n, ops), mask
    last, first_rows, last_rows = at
    return parts.storage.read_steps(read_plan, list(req.steps), first_rows, last, last_rows, ops), mask


def package(items: Any, ids: Any, probs: Any, req: Request, ops: Any, split: bool = True) -> tuple[Any, BufferInfo]:
    """Applies a transform (outside the lock), drops the batch axis of an unbatched sample and, with `split`,
    makes a tuple of steps where `req` asks for one (`split_steps`)."""
    if req.transform is not None:
        items, mask, *looked = items  # with lookups, a `Lookup` after the mask
        items = req.transform(items, mask, ops, *looked)
    if not req.batched:
        items, ids, probs = tf.nest.map_structure(lambda x: x[0], (items, ids, probs))
    if split and req.num_steps is not None and not req.time_stacked:
        return split_steps(items, BufferInfo(ids=ids, probabilities=probs), req, ops)
    return items, BufferInfo(ids=ids, probabilities=probs)


def split_steps(items: Any, info: BufferInfo, req: Request, ops: Any) -> tuple[Any, BufferInfo]:
    """A tuple of `num_steps` items (and ids) instead of a time axis, unless `time_stacked`."""
    if req.num_steps is None or req.time_stacked:
        return items, info
    axis = 1 if req.batched else 0
    steps = zip(*[ops.unstack(x, axis) for x in tf.nest.flatten(items)])
    by_step = tuple(tf.nest.pack_sequence_as(items, list(step)) for step in steps)
    return by_step, BufferInfo(ids=ops.unstack(info.ids, axis), probabilities=info.probabilities)


def out_specs(parts: Parts, req: Request) -> tuple:
    """The specs of one time-stacked sample's `(items, ids, probabilities)`, for a dataset's map."""
    outer = ([req.size] if req.batched else []) + ([] if req.num_steps is None else [req.num_steps])
    item_spec = parts.storage.item_spec
    if req.transform is not None:
        item_spec = req.transform.output_spec(item_spec)
    items = tf.nest.map_structure(lambda s: tf.TensorSpec(outer + s.shape.as_list(), s.dtype), item_spec)
    return items, tf.TensorSpec(outer, tf.int64), tf.TensorSpec([req.size] if req.batched else [], tf.float32)
