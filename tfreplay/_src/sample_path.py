"""The sample path of a composed buffer: plan under the lock, read, package; dataset blocks.

`SamplePath` is a base of `ComposedBuffer` (`core/buffer.py`) and uses its
state: the sampler draws window starts through a `View`, `_sample_plan` turns
them into storage rows (and, with a transform, the window mask and the rows
of the steps a transform reads alone), `_read_planned` reads them, and
`_package` applies the transform outside the lock. `_sample_dataset` draws
several dataset elements per map call where that is cheaper.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfreplay._src import episodes, ring
from tfreplay._src.api import BufferInfo, ReplayBuffer, counter_dataset
from tfreplay._src.samplers import View
from tfreplay._src.samplers.uniform import UniformSampler
from tfreplay._src.specs import Nest


class SamplePath(ReplayBuffer):
    """How a composed buffer draws, reads and packages samples (see the module docstring)."""

    _ops: Any
    # Dataset elements drawn per map call (`_sample_dataset`): a twin sets what its calls cost. The TF twin
    # keeps 1: each element is drawn when the pipeline asks for it, so one read after an add sees that add
    # (TF-Agents' tests rely on it), and a block saved only about 4 µs per element there.
    _dataset_block = 1

    def _sample_plan(
        self, size: int, num_steps: int | None, transform: Any = None, view: View | None = None
    ) -> tuple[Any, Any, Any, Any]:
        """Under the lock: `(read plan, ids, probabilities, count)` of `size` windows.

        With a transform the windows are its own (`num_steps` items, strict or
        padded), the plan carries their `[size, num_steps]` mask (and where
        its fields are read at one step, those steps' rows) and the ids are
        each window's first item's. `view`: the state to draw from (default: read now).
        The NumPy twin plans padded windows in compiled code where it can (`core/native_windows.py`).
        """
        ops, layout = self._ops, (self._max_length, self._num_segments)
        view = self._view(transform) if view is None else view
        n = num_steps if transform is None else int(transform.num_steps)
        segment, t, probs, count = self._sampler.sample(view, size, n)
        pos_at = self._pos_at if self._rule is not None else None
        if transform is None:
            step_rows, ids = ring.window_rows(segment, t, n, *layout, ops)
            return self._storage.plan(segment, t, step_rows, n, pos_at, ops), ids, probs, count
        local = ops.window_ids(t, n)  # time-major in NumPy's memory: the mask and reads keep that layout
        step_rows, ids = ring.rows_of(local, segment[:, None], *layout), ring.local_to_rows(t, segment, *layout)[1]
        plan = self._storage.plan(segment, t, step_rows, n, pos_at, ops)
        steps = self._steps_of(transform)
        if not view.padded:
            mask = ops.ones_like(step_rows) > 0
        else:  # the stored items; with an index, those of the first item's episode
            mask = episodes.window_mask(segment, local, view.num_adds, ops)
            if view.pos_at is not None and not steps:
                # Whole windows: `pos` is read with the items (`_read_planned`), not in the draw: in a
                # compiled draw XLA on CPU splits a gather from a large `pos` across threads.
                return (plan, mask, step_rows), ids, probs, count
            if view.pos_at is not None:
                mask = mask & episodes.same_episode(view.pos_at(step_rows), ops)
        if not steps:
            return (plan, mask), ids, probs, count
        # Each window's last real step, and the rows of its first and last: fields read there alone.
        last = ops.sum(ops.to_int64(mask), 1) - 1
        last_rows = ring.rows_of(t + last, segment, *layout)
        return (plan, mask, last, step_rows[:, 0], last_rows), ids, probs, count

    def _compiled_windows(
        self, segment: Any, t: Any, rows: Any, mask: Any, last: Any, last_rows: Any, transform: Any
    ) -> tuple:
        """The read plan of a transform's windows planned in compiled code (either twin): `rows` and `mask`
        time-major (`[num_steps, size]`, as the array-op path lays them out in memory), `last` each window's
        last real step and `last_rows` its row; what `_sample_plan` returns for them."""
        n, pos_at = rows.shape[0], self._pos_at if self._rule is not None else None
        plan = self._storage.plan(segment, t, self._ops.transpose(rows), n, pos_at, self._ops)
        mask = self._ops.transpose(mask)
        return (plan, mask, last, rows[0], last_rows) if self._steps_of(transform) else (plan, mask)

    def _read_planned(self, plan: Any, num_steps: int | None, transform: Any = None) -> Any:
        """The bulk read of a plan: items, or with a transform `(items, mask)`."""
        if transform is None:
            return self._storage.read(plan, num_steps, self._ops)
        plan, mask, *at = plan
        if len(at) == 1:  # padded whole windows: which stored items are steps of the first's episode
            mask = mask & episodes.same_episode(self._pos_at(at[0]), self._ops)
        if len(at) <= 1:
            return self._storage.read(plan, transform.num_steps, self._ops), mask
        return self._read_steps(plan, at, transform), mask

    def _read_steps(self, plan: Any, at: list, transform: Any) -> Nest:
        """Windows' items with the leaves `transform` reads at one step (`Transform.steps`) read there only."""
        ops, (last, first_rows, last_rows) = self._ops, at
        steps = self._steps_of(transform)
        read_leaves = getattr(self._storage, "read_leaves", None)
        if read_leaves is not None:  # rows: each leaf at its own rows
            rows = {None: plan, "first": first_rows, "last": last_rows}
            return read_leaves([rows[step] for step in steps], ops)
        n = transform.num_steps  # otherwise whole windows, then each leaf's step picked
        items = self._storage.read(plan, n, ops)
        flat_last = ops.arange(last.shape[0]) * n + last

        def pick(x: Any, step: str | None) -> Any:
            if step is None:
                return x
            return x[:, 0] if step == "first" else ops.gather(ops.reshape(x, [-1] + list(x.shape[2:])), flat_last)

        return tf.nest.pack_sequence_as(items, [pick(x, step) for x, step in zip(tf.nest.flatten(items), steps)])

    def _read_sample(self, size: int, num_steps: int | None, transform: Any = None) -> tuple[Nest, Any, Any, Any]:
        """Under the lock: `(items, ids, probabilities, count)` (items: `(items, mask)` with a transform)."""
        plan, ids, probs, count = self._sample_plan(size, num_steps, transform)
        return self._read_planned(plan, num_steps, transform), ids, probs, count

    def _package(
        self,
        items: Nest,
        ids: Any,
        probs: Any,
        batched: bool,
        num_steps: int | None,
        time_stacked: bool,
        transform: Any = None,
    ) -> tuple[Nest, BufferInfo]:
        """Applies a transform (outside the lock); drops the batch axis of an unbatched sample;
        splits windows into steps unless `time_stacked`."""
        if transform is not None:
            items, mask = items
            items = transform(items, mask, self._ops)
        if not batched:
            items, ids, probs = tf.nest.map_structure(lambda x: x[0], (items, ids, probs))
        return self._split_steps(items, BufferInfo(ids=ids, probabilities=probs), batched, num_steps, time_stacked)

    def _split_steps(
        self, items: Nest, info: BufferInfo, batched: bool, num_steps: int | None, time_stacked: bool
    ) -> tuple[Nest, BufferInfo]:
        """A tuple of `num_steps` items (and ids) instead of a time axis, unless `time_stacked`."""
        if num_steps is None or time_stacked:
            return items, info
        axis = 1 if batched else 0
        steps = zip(*[self._ops.unstack(x, axis) for x in tf.nest.flatten(items)])
        by_step = tuple(tf.nest.pack_sequence_as(items, list(step)) for step in steps)
        return by_step, BufferInfo(ids=self._ops.unstack(info.ids, axis), probabilities=info.probabilities)

    def _sample_dataset(
        self,
        sample_batch_size: int | None,
        num_steps: int | None,
        num_parallel_calls: int | None,
        transform: Any = None,
    ) -> tf.data.Dataset:
        """Samples for `_dataset_block` elements per map call, split into elements.

        A map call costs more than drawing a few more windows: one call per
        block brings the per-element cost down. Every element is still an
        independent sample, drawn at most `block - 1` elements before it is
        read: a uniform sampler's draws are independent, so the block is one
        sample of `block * size`; a stratified one (prioritized) spreads one
        sample's draws over its mass, so there each element is a sample of its
        own. With a rate limiter each element is one call, admitted on its own.
        """
        block = self._dataset_block if self._gate.limiter is None else 1
        if block == 1:
            return super()._sample_dataset(sample_batch_size, num_steps, num_parallel_calls, transform)
        deterministic = None if num_parallel_calls is None else False  # independent draws: deliver as they finish
        draw = lambda _: self._sample_block(block, sample_batch_size, num_steps, transform)  # noqa: E731
        return counter_dataset().map(draw, num_parallel_calls=num_parallel_calls, deterministic=deterministic).unbatch()

    def _sample_block(self, block: int, sample_batch_size: int | None, num_steps: int | None, transform: Any) -> Nest:
        """`block` samples as tensors, stacked: `(items, BufferInfo)` with a leading `[block]` axis."""
        if type(self._sampler) is not UniformSampler:
            samples = [self._sample_tensors(sample_batch_size, num_steps, transform) for _ in range(block)]
            return tf.nest.map_structure(lambda *x: tf.stack(x), *samples)
        size = sample_batch_size or 1
        outer = [block] + ([size] if sample_batch_size is not None else [])
        sample = self._sample_tensors(block * size, num_steps, transform)
        return tf.nest.map_structure(lambda x: tf.reshape(x, outer + x.shape[1:].as_list()), sample)
