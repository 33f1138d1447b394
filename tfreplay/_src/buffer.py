"""The composed buffer: storage x sampler over the ring and a shared episode index.

`ComposedBuffer` holds the lines every buffer shares, written once over an
`ops` namespace: how a batch is written (rows, episode index, sampler), how
a sample is drawn and read (its base `sample_path.SamplePath`), the
deterministic pass, `gather_all`. A twin
(`twin_tf.TFBuffer`, `twin_py.PyBuffer`) supplies only what differs: its
arrays (`_make`), its lock (`_exclusive`), its random source (`_draw`), how an
empty buffer is refused (`_guard`), and how calls reach tensors.

Layout: `num_segments` segments of `max_length` rows (see `ring.py`);
`num_adds[s]` counts the items segment `s` received since the last clear.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay._src import checkpoint, episodes, ring, specs
from tfreplay._src import transform as transforms
from tfreplay._src.episodes import EpisodeRule
from tfreplay._src.sample_path import SamplePath
from tfreplay._src.samplers import View
from tfreplay._src.single_pass import SinglePass
from tfreplay._src.specs import Nest

# Transforms remembered as checked (`ComposedBuffer._served`): enough for a program's own few.
_SERVED_MAX = 64
PRIORITIES_RULE = "update_priorities: every priority must be finite and non-negative; nothing was updated."


def check_priorities(ids_shape: Any, priorities_shape: Any, values: Any) -> None:
    """Refuses priorities of another shape than their ids, or (when known) negative, NaN or infinite ones."""
    if tuple(ids_shape) != tuple(priorities_shape):
        raise ValueError(
            f"update_priorities: priorities (shape {tuple(priorities_shape)}) must have the shape of ids "
            f"({tuple(ids_shape)}), one priority per id."
        )
    if values is not None:
        bad = ~(np.isfinite(values) & (values >= 0))
        if bad.any():
            raise ValueError(
                f"update_priorities: priorities ({values[bad][:3].tolist()} among them) must be finite and "
                "non-negative; nothing was updated."
            )


def variable_name(path: str) -> str:
    """A valid TF name for a spec path (`'my obs'`, `'<item>'` are not)."""
    name = re.sub(r"[^A-Za-z0-9_.\-/]", "_", path).strip("/")
    return name if re.match(r"[A-Za-z0-9.]", name) else f"v{name}"


class ComposedBuffer(SinglePass, SamplePath):
    """A storage, a sampler, the ring and (where items carry episode boundaries) the episode index.

    Args:
      data_spec: a nest of `tf.TensorSpec`: one stored item (one row).
      num_segments, max_length: the layout (`batch_size` segments).
      storage: `(buffer, make) -> storage` (a `storage.RowStorage` or `FrameStorage`).
      sampler: an unbound sampler (`samplers.uniform.UniformSampler`, ...).
      episode_rule: which fields mark episode boundaries; "auto" detects
        `step_type`/`first`/`terminated`/`truncated`; None keeps no index.
    """

    _ops: Any

    def __init__(
        self,
        data_spec: Nest,
        num_segments: int,
        max_length: int,
        storage: Callable[[Any, Callable], Any],
        sampler: Any,
        episode_rule: EpisodeRule | str | None,
        *,
        name: str,
        window_shift: int | None = None,
        drop_remainder: bool = False,
        stateful_dataset: bool = False,
    ):
        where = type(self).__name__
        specs.check_positive_int(where, "batch_size", num_segments)
        specs.check_positive_int(where, "max_length", max_length)
        specs.check_positive_int(where, "dataset_window_shift", window_shift, allow_none=True)
        super().__init__(data_spec, num_segments * max_length, stateful_dataset, name=name)
        self._num_segments, self._max_length = int(num_segments), int(max_length)
        self._window_shift, self._drop_remainder = window_shift, bool(drop_remainder)
        self._init_state()
        self._storage = storage(self, self._make)
        if isinstance(episode_rule, str):
            if episode_rule != "auto":
                raise ValueError(f"{where}: episode_rule ({episode_rule!r}) must be 'auto', None or an EpisodeRule.")
            episode_rule = EpisodeRule.detect(self._data_spec, self._leaf_paths)
        if episode_rule is not None:
            episode_rule.check(where, self._leaf_paths, tf.nest.flatten(self._data_spec))
        object.__setattr__(self, "_rule", episode_rule)
        frames = self._storage.window.lead > 0
        if sampler.within_episodes and episode_rule is None:
            raise ValueError(
                f"{where}: within_episodes (True) needs items that mark episode boundaries: a scalar 'step_type' "
                "or bool 'first', 'terminated' or 'truncated' field, or an EpisodeRule naming them."
            )
        # Windows go through the episode index for frames (a transition needs its history) or on request.
        object.__setattr__(self, "_window", self._storage.window if frames or sampler.within_episodes else None)
        # id(transform) -> (transform, its leaves' steps): transforms checked once (kept, so ids stay theirs).
        object.__setattr__(self, "_served", {})
        self._num_adds = self._make("index/num_adds", [num_segments], tf.int64)
        if episode_rule is not None:
            self._pos = self._make("index/pos", [self._capacity], tf.int32)
            self._pos_counts = self._make("index/pos_counts", [num_segments, episodes.POS_BINS], tf.int64)
            # Per segment, its newest item's `[pos, ended]`: what a write continues from and what the padded-window
            # rule reads, without gathering from the per-row arrays (XLA splits each gather from a large array).
            self._newest = self._make("index/newest", [num_segments, 2], tf.int32)
        self._sampler = sampler.bind(self._make, self._capacity)

    @property
    def batch_size(self) -> int:
        """Number of segments: the batch size `add_batch` expects."""
        return self._num_segments

    @property
    def max_length(self) -> int:
        """Rows per segment."""
        return self._max_length

    @property
    def nbytes(self) -> int:
        """Bytes of item storage (the index and counters add a few per row)."""
        return self._storage.nbytes

    def sampling_mass(self, num_steps: int | None = None) -> Any:
        """What a sample draws from now: the number of valid windows (uniform), or their summed
        `priority ** alpha` (prioritized). A window's probability is its weight over this; a sharded
        service (`tfreplay.distributed`) weighs its shards by it."""
        self._check_sample_args("sampling_mass", None, num_steps)
        return self._exclusive(lambda: self._sampler.mass(self._view(), num_steps))

    def checkpoint_layout(self) -> dict:
        """What a checkpoint must match to restore into this buffer (see `checkpoint.layout`)."""
        history_len = getattr(self._storage, "history_len", None)
        record = checkpoint.layout(self._data_spec, self._num_segments, self._max_length, history_len)
        if self._rule is not None:  # the index keeps each segment's newest item (see `_newest`)
            record["index_newest"] = True
        if getattr(self._sampler, "tree_layout", None):  # prioritized: how the sum tree's nodes are laid out
            record["sum_tree"] = self._sampler.tree_layout
        return record

    # Twin hooks.
    def _init_state(self) -> None:
        """Creates the lock, random source and whatever `_make` needs."""
        raise NotImplementedError

    def _make(self, name: str, shape: list, dtype: tf.DType) -> Any:
        """A zero-filled array or variable, part of the checkpointed state."""
        raise NotImplementedError

    def _exclusive(self, fn: Callable[[], Any]) -> Any:
        raise NotImplementedError

    def _draw(self, shape: list, total: Any) -> Any:
        """Uniform int64 draws in `[0, total)` (any defined value when `total` is 0)."""
        raise NotImplementedError

    def _uniform(self, shape: list) -> Any:
        """Uniform float64 draws in `[0, 1)`."""
        raise NotImplementedError

    def _check(self, ok: Any, value: Any, message: str) -> Any:
        """`value`, once `ok` is checked: raises `ValueError` (in a graph: asserts, with the same message)."""
        raise NotImplementedError

    def _call_tensors(self, fn: Callable, inputs: list, out_specs: Nest) -> Nest:
        """`fn(*inputs)` under the lock, as tensors shaped like `out_specs` (usable in a dataset map)."""
        raise NotImplementedError

    def _guard(self, count: Any, value: Any, where: str, num_steps: int | None, transform: Any = None) -> Any:
        if isinstance(count, (int, np.integer)) and count > 0:
            return value  # a count known now: no message to build
        return self._check(count > 0, value, self.empty_message(where, num_steps, transform))

    # Shared lines.
    def _max_window(self) -> int:
        return self._max_length - self._storage.window.lead

    def _check_sample_args(self, where: str, sample_batch_size: Any, num_steps: Any, transform: Any = None) -> None:
        specs.check_positive_int(where, "sample_batch_size", sample_batch_size, allow_none=True)
        specs.check_positive_int(where, "num_steps", num_steps, allow_none=True)
        if transform is not None:
            self._check_transform(where, num_steps, transform)
        if num_steps is not None and num_steps > self._max_window():
            extra = " - 1" if self._storage.window.lead else ""
            raise ValueError(
                f"{where}: num_steps ({num_steps}) must be at most max_length{extra} ({self._max_window()}); "
                "a window is drawn from one segment, which never holds more"
                + ("; a window also needs the frame before it." if extra else ".")
            )

    def _check_transform(self, where: str, num_steps: Any, transform: Any) -> None:
        """Refuses a transform this buffer cannot serve, before anything is drawn."""
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
        if self._served_steps(transform) is not None:
            return  # served before: the rest holds
        if transform.num_steps > self._max_window():
            raise ValueError(
                f"{where}: the window of {transform!r} ({transform.num_steps} items) must be at most "
                f"{self._max_window()} items, the longest a segment holds; use a shorter window or a longer max_length."
            )
        window, padded = self._windows(transform)
        kind, able = ("padded", "padded_windows") if padded else ("episode-aware", "episode_windows")
        # Without an index a padded window is a plain ring window, which every sampler draws.
        if window is not None and not getattr(self._sampler, able, False):
            raise ValueError(
                f"{where}: transform ({transform!r}) needs {kind} windows, which "
                f"{type(self._sampler).__name__} does not draw."
            )
        transform.output_spec(self._storage.item_spec)  # raises on fields it cannot use
        if len(self._served) >= _SERVED_MAX:  # a new transform object per call must not grow it without bound
            self._served.clear()
        self._served[id(transform)] = (transform, transforms.leaf_steps(transform, self._storage.item_spec))

    def _served_steps(self, transform: Any) -> list | None:
        """`transforms.leaf_steps` of a transform served before, else None."""
        served = self._served.get(id(transform))
        return served[1] if served is not None and served[0] is transform else None

    def _steps_of(self, transform: Any) -> list:
        steps = self._served_steps(transform)
        return transforms.leaf_steps(transform, self._storage.item_spec) if steps is None else steps

    def _windows(self, transform: Any) -> tuple[Any, bool]:
        """`(window shape or None, padded)` of a sample: a transform's windows follow episodes when items mark them."""
        if transform is None:
            return self._window, False
        return (self._storage.window if self._rule is not None else None), bool(transform.padded)

    def empty_message(self, where: str, num_steps: int | None, transform: Any = None) -> str:
        if transform is not None:
            return (
                f"{where}: the buffer holds no window {transform!r} can read yet "
                f"({transform.num_steps} items{', padded' if transform.padded else ' of one episode'}); "
                "add more items before sampling."
            )
        n = num_steps or 1
        if self._storage.window.lead:
            what = "transition" if n == 1 else f"window of {n} transitions of one episode"
            return (
                f"{where}: the buffer holds no valid {what} yet; "
                "add steps after each episode's first frame before sampling."
            )
        if self._window is not None and n > 1:
            return f"{where}: no episode holds {n} consecutive items yet (num_steps={n}); add more before sampling."
        if n == 1:
            return f"{where}: the buffer is empty; add items before sampling."
        return f"{where}: no segment holds {n} consecutive items yet (num_steps={n}); add more items before sampling."

    def _pos_at(self, rows: Any) -> Any:
        return self._ops.to_int64(self._ops.gather(self._pos, rows))

    def _view(self, transform: Any = None, read: Callable[[Any], Any] | None = None) -> View:
        """What the sampler may read now (under the lock), each state array through `read` (default `ops.read`)."""
        window, padded = self._windows(transform)
        has_index, read = window is not None, read or self._ops.read
        return View(
            ops=self._ops,
            num_adds=read(self._num_adds),
            max_length=self._max_length,
            num_segments=self._num_segments,
            draw=self._draw,
            uniform=self._uniform,
            window=window,
            pos_at=self._pos_at if has_index else None,
            pos_counts=read(self._pos_counts) if has_index else None,
            padded=padded,
            newest=read(self._newest) if padded and has_index else None,
        )

    def _num_frames(self) -> Any:
        return self._exclusive(
            lambda: self._ops.sum(self._ops.minimum(self._ops.read(self._num_adds), self._max_length))
        )

    def _write_locked(self, leaves: list, num_new: int, segments: Any = None) -> Any:
        """Appends `num_new` items to each segment (or each of `segments`), oldest first.

        Leaves are time-major, `[num_new * number of segments, ...]`: one
        lockstep add is `[batch_size, ...]` as given. Only the newest
        `max_length` of a segment's items survive. Reads (counters, the `pos`
        of the rows before and of the rows overwritten) come first, then every
        write, then the counters move.
        """
        ops, length, num_segments = self._ops, self._max_length, self._num_segments
        skip = max(num_new - length, 0)
        adds = ops.read(self._num_adds)
        n = adds if segments is None else ops.gather(adds, segments)
        seg = ops.arange(num_segments) if segments is None else segments
        if num_new == 1:  # the usual add: one item per segment, no time axis to build
            local = n
            rows, ids = ring.local_to_rows(n, seg, length, num_segments)
        else:
            local = n[None, :] + skip + ops.arange(num_new - skip)[:, None]
            rows, ids = ring.local_to_rows(local, seg[None, :], length, num_segments)
            rows = ops.reshape(rows, [-1])
        reads: list = [rows]
        if self._rule is not None:
            reads += self._index_updates(leaves, num_new, seg, n, local, rows, skip)
        kept = leaves if not skip else [x[skip * len(seg) :] for x in leaves]

        def writes() -> list:
            updates = self._storage.write(rows, kept, ops)
            if self._rule is not None:
                pos, bins, weights, newest = reads[1:]
                updates.append(ops.scatter(self._pos, rows, ops.to_int32(ops.reshape(pos, [-1]))))
                updates.append(ops.bin_add(self._pos_counts, bins[0], bins[1], weights))
                if segments is None:
                    updates.append(ops.assign(self._newest, newest))
                else:
                    updates.append(ops.scatter(self._newest, segments, newest))
            return updates

        def sampler_writes() -> list:
            # Rows that can never start a window (a frame buffer's first frames), for samplers that weigh rows.
            lead = self._storage.window.lead
            startable = ops.reshape(reads[1], [-1]) >= lead if self._rule is not None and lead else None
            return self._sampler.on_write(ops, rows, startable)

        updates = ops.after(reads, writes)
        if segments is None:
            moved = ops.after(updates, lambda: ops.assign(self._num_adds, adds + num_new))
        else:
            moved = ops.after(updates, lambda: ops.scatter(self._num_adds, segments, n + num_new))
        # The sampler's rows after the counters: a priority update that takes no buffer lock (the TF twin's
        # compiled one) then finds an overwritten item stale before its row gets the new item's priority.
        sampled = ops.after([moved], sampler_writes)
        return ops.after([moved, *sampled], lambda: ops.read(self._num_adds))

    def _index_updates(
        self, leaves: list, num_new: int, segments: Any, n: Any, local: Any, rows: Any, skip: int
    ) -> list:
        """`[pos of the new rows, (segment, bin) pairs, +1/-1 weights, newest]` for the episode index
        (`newest`: the written segments' new `[pos, ended]`, `[len(segments), 2]`)."""
        ops, length = self._ops, self._max_length
        wanted = ([self._rule.start] if self._rule.start else []) + list(self._rule.ends)
        time_major = {p: ops.reshape(x, [num_new, -1]) for p, x in zip(self._leaf_paths, leaves) if p in wanted}
        starts, ends = self._rule.flags(time_major, ops)
        if num_new == 1:
            local, rows = local[None, :], rows[None, :]
        has_prev = n > 0
        prev = ops.read(self._newest) if segments is None else ops.gather(ops.read(self._newest), segments)
        if ends is not None:  # an item after an episode's last starts the next
            prev_ended = (prev[:, 1] > 0) & has_prev
            shifted = ops.where(ops.arange(ends.shape[0])[:, None] == 0, prev_ended[None, :], _shift_down(ends, ops))
            starts = shifted if starts is None else starts | shifted
        all_pos = episodes.new_pos(ops.to_int64(prev[:, 0]), has_prev, starts, ops)
        ended = ops.zeros_like(all_pos[-1]) if ends is None else ops.to_int64(ends[-1])
        newest = ops.to_int32(ops.stack([all_pos[-1], ended], 1))
        pos = all_pos[skip:]
        old_min = n - ops.minimum(n, length)
        # The row of new id `w` held the newest older id of its residue (skipped ids never landed).
        held = local - length * ((local - n[None, :]) // length + 1)
        overwritten = held >= old_min[None, :]
        old_pos = self._pos_at(rows)
        # Each new row joins its bin; the live row it overwrites leaves its own.
        seg = ops.reshape(segments[None, :] + ops.zeros_like(local), [-1])
        bins = ops.concat([ops.reshape(episodes.pos_bin(p, ops), [-1]) for p in (pos, old_pos)])
        added = ops.reshape(ops.ones_like(local), [-1])
        weights = ops.concat([added, -ops.reshape(ops.to_int64(overwritten), [-1])])
        return [pos, (ops.concat([seg, seg]), bins), weights, newest]

    def _gather_all_locked(self) -> Nest:
        ops = self._ops
        if self._window is None:
            rows, _ = ring.all_rows(ops.read(self._num_adds), self._max_length, self._num_segments, ops)
            return self._storage.read(rows, None, ops)
        segment, t = self._valid_starts(1, aligned=False)
        step_rows, _ = ring.window_rows(segment, t, None, self._max_length, self._num_segments, ops)
        return self._storage.read(self._storage.plan(segment, t, step_rows, None, self._pos_at, ops), None, ops)

    def _valid_starts(self, n: int, aligned: bool) -> tuple[Any, Any]:
        """Segments and starts of every valid window, segment by segment, oldest first."""
        ops = self._ops
        mask, t = self._window.grid(ops.read(self._num_adds), self._pos_at, self._max_length, n, aligned, ops)
        flat = ops.flatnonzero(ops.reshape(mask, [-1]))
        return flat // self._max_length, ops.gather(ops.reshape(t, [-1]), flat)

    def _update_checks_priorities(self) -> bool:
        """Whether `_update_locked` itself refuses a bad priority (a graph then needs no separate assertion)."""
        checks = getattr(self._sampler, "checks_priorities", None)
        return checks is not None and checks(self._windows(None)[0])

    def _update_locked(self, ids: Any, priorities: Any) -> Any:
        """Under the lock: gives items new priorities; returns how many ids were stale."""
        updates, stale = self._sampler.update(self._view(), ids, priorities)
        return self._ops.after(updates, lambda: stale)

    def _clear_locked(self) -> Any:
        ops = self._ops
        updates = [ops.assign(self._num_adds, ops.zeros_like(ops.read(self._num_adds)))]
        if self._rule is not None:
            updates.append(ops.assign(self._pos_counts, ops.zeros_like(ops.read(self._pos_counts))))
        updates = updates + ops.after(updates, lambda: self._sampler.clear(ops))  # after the counters, as in a write
        return ops.after(updates, lambda: ops.read(self._num_adds))


def _shift_down(x: Any, ops: Any) -> Any:
    """`x` moved one step later along axis 0 (row 0 keeps its value; callers replace it)."""
    return x if x.shape[0] == 1 else ops.gather(x, ops.maximum(ops.arange(x.shape[0]) - 1, 0))
