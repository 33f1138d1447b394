"""The buffer: a storage and a sampler over the ring and the episode index, on a backend's arrays.

`Buffer` is the one class behind every public buffer. It checks arguments
once at the boundary, keeps its parts (`parts.Parts`) and a cache of checked
requests, and runs each call (`calls.py`, `single_pass.py`) over the pure
functions of the parts that do the work (`write.py`, `sample.py`).

Its backend (`backends/tf.py`: `TFTwin`, `backends/numpy.py`: `NumpyTwin`; the protocol is
`backends.Backend`) is where TF and NumPy differ, in primitives only: the
array namespace, how state is made, the lock, the random source, refusals,
the consistent read, tracing, and the trackables a checkpoint saves (which
`bind` returns and the buffer holds).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay._src import calls, sample, single_pass, specs
from tfreplay._src import storage as storages
from tfreplay._src.api import BufferInfo, ReplayBuffer, counter_dataset
from tfreplay._src.checkpoint import layout as checkpoints
from tfreplay._src.front_door import FrontDoor
from tfreplay._src.index.episodes import EpisodeRule
from tfreplay._src.parts import Parts, Request, index_state
from tfreplay._src.rate_limiting.gate import Gate
from tfreplay._src.rate_limiting.limiter import EmptyBufferError
from tfreplay._src.specs import Nest

# Requests remembered per buffer (a program's own few; a new transform object per call must not grow it).
_REQUESTS_MAX = 64
# The gate of a sample whose caller holds its admission already (`Buffer._sample_admitted`): nothing to wait for.
_ADMITTED = Gate(None, "Buffer", 1, 1)


class Buffer(ReplayBuffer):
    """A replay buffer assembled from parts (see the module docstring); the public buffers are its subclasses.

    Args:
      data_spec: a nest of `tf.TensorSpec`: one stored item (one row).
      twin: the backend: a `TFTwin` (state in `tf.Variable`s) or a `NumpyTwin` (NumPy arrays), not shared.
      batch_size: number of segments (parallel environments).
      max_length: rows per segment.
      storage: a storage factory, `storage.rows` or `storage.frames(history_len)`.
      sampler: an unbound sampler (`UniformSampler`, `PrioritizedSampler`, or one of the protocol's).
      episode_rule: which fields mark episode boundaries; "auto" detects
        `step_type`/`first`/`terminated`/`truncated`; None keeps no index.
      rate_limiter: a `RateLimiter` (one per buffer), or None.
      name: the `tf.Module` name (TF twins take it from their scope).
      window_shift, drop_remainder: the deterministic pass's window shift (default `num_steps`) and
        whether it drops incomplete batches and windows.
      stateful_dataset: mark datasets as carrying external state.
    """

    # What a sample with nothing to draw does (the TF-Agents compat classes match TF-Agents): a note after the
    # refusal's message (ours: the rate limiter that would wait), or zeros instead of a refusal (see `Parts`).
    _empty_note = sample.WAIT_HINT
    _zeros_when_empty = False

    def __init__(
        self,
        data_spec: Nest,
        twin: Any,
        *,
        batch_size: int,
        max_length: int,
        sampler: Any,
        storage: Callable[..., Any] = storages.rows,
        episode_rule: EpisodeRule | str | None = "auto",
        rate_limiter: Any = None,
        name: str | None = None,
        window_shift: int | None = None,
        drop_remainder: bool = False,
        stateful_dataset: bool = False,
    ):
        where = type(self).__name__
        try:
            specs.check_positive_int(where, "batch_size", batch_size)
            specs.check_positive_int(where, "max_length", max_length)
            specs.check_positive_int(where, "dataset_window_shift", window_shift, allow_none=True)
            super().__init__(data_spec, batch_size * max_length, stateful_dataset, name=twin.module_name(name or where))
            object.__setattr__(self, "_twin", twin)
            self._num_segments, self._max_length = int(batch_size), int(max_length)
            self._window_shift, self._drop_remainder = window_shift, bool(drop_remainder)
            built = storage(self._data_spec, self._num_segments, self._max_length, twin.make, where)
            rule = _episode_rule(where, episode_rule, self._data_spec, self._leaf_paths)
            if sampler.within_episodes and rule is None:
                raise ValueError(
                    f"{where}: within_episodes (True) needs items that mark episode boundaries: a scalar 'step_type' "
                    "or bool 'first', 'terminated' or 'truncated' field, or an EpisodeRule naming them."
                )
            # Plain windows go through the episode index for frames (a transition needs its history) or on request.
            window = built.window if built.window.lead > 0 or sampler.within_episodes else None
            num_adds = twin.make("index/num_adds", [batch_size], tf.int64)
            index = index_state(twin.make, self._num_segments, self._capacity) if rule is not None else {}
            bound = sampler.bind(twin.make, self._capacity)
            parts = Parts(
                twin.ops,
                self._num_segments,
                self._max_length,
                tuple(self._leaf_paths),
                built,
                bound,
                rule,
                window,
                num_adds,
                **index,
                empty_note=self._empty_note,
                zeros_when_empty=self._zeros_when_empty,
            )
            object.__setattr__(self, "_parts", parts)
            object.__setattr__(self, "_requests", _Requests())
            insert_size = self._num_segments if twin.lockstep else 1
            object.__setattr__(self, "_gate", Gate(rate_limiter, where, self._capacity, insert_size))
            object.__setattr__(self, "_sample", functools.partial(calls.get_next, parts, twin, self._gate))
            for name, trackable in twin.bind(
                parts, self.checkpoint_layout(), self._gate, self._num_frames, where
            ).items():
                setattr(self, name, trackable)  # what a checkpoint saves, by the names it has always had
        except BaseException:
            twin.close()  # a twin that took a storage directory lets it go
            raise

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
        return self._parts.storage.nbytes

    def variables(self) -> tuple:
        """Every variable of the buffer, the random generator's state and the write counters included
        (what a v1 graph initializes; the counters are not checkpointed). A NumPy buffer has none."""
        return super().variables() + self._twin.variables()

    def sampling_mass(self, num_steps: int | None = None) -> Any:
        """What a sample draws from now: the number of valid windows (uniform), or their summed
        `priority ** alpha` (prioritized). A window's probability is its weight over this; a sharded
        service (`tfreplay.distributed`) weighs its shards by it."""
        req = self._sample_request("sampling_mass", None, num_steps, True, None)
        return calls.mass(self._parts, self._twin, req.window, False, num_steps)

    def flush(self) -> None:
        """Makes every add so far durable: a NumPy buffer with a `storage_dir` writes its mapped files back and
        a new manifest (after a crash, reopening the directory resumes here). Other buffers have nothing to write.
        """
        self._twin.flush()

    def close(self) -> None:
        """Ends the buffer's service (see `ReplayBuffer.close`); a buffer with a `storage_dir` flushes and frees
        the directory for another buffer to open."""
        super().close()
        self._twin.close()

    def checkpoint_layout(self) -> dict:
        """What a checkpoint must match to restore into this buffer (see `checkpoint/layout.py`)."""
        parts = self._parts
        record = checkpoints.layout(self._data_spec, self._num_segments, self._max_length, parts.storage.history_len)
        if parts.rule is not None:  # the index keeps each segment's newest item
            record["index_newest"] = True
        return {**record, **parts.sampler.checkpoint_record}

    def empty_message(self, where: str, num_steps: int | None, transform: Any = None) -> str:
        """Why `where` found nothing to draw, and what to do."""
        return sample.empty_message(self._parts, where, self._sample_request(where, None, num_steps, True, transform))

    @property
    def front_door(self) -> FrontDoor:
        """What tfreplay's own modules (`TrainLoop`, `tfreplay.datasets`, the TF-Agents compat) use of this
        buffer: its capabilities, checked requests, what is stored (see `front_door.py`). Not for users: its
        members may change in any release."""
        return FrontDoor(self)

    # Checkpoints: the layout record first, and a foreign checkpoint refused (see `checkpoint/layout.py`).
    def _trackable_children(self, save_type: Any = "checkpoint", **kwargs: Any) -> dict:
        return checkpoints.record_first(super()._trackable_children(save_type, **kwargs))

    def _lookup_dependency(self, name: str, cached_dependencies: dict | None = None) -> Any:
        found = super()._lookup_dependency(name, cached_dependencies)
        return checkpoints.guard_lookup(self, name, found, cached_dependencies)

    # The hooks of `ReplayBuffer`.
    def _sample_request(
        self, where: str, sample_batch_size: Any, num_steps: Any, time_stacked: bool, transform: Any
    ) -> Request:
        """The checked request, made once per kind of sample (scalar tensors and NumPy integers as sizes too)."""
        plain = (sample_batch_size is None or type(sample_batch_size) is int) and (
            num_steps is None or type(num_steps) is int
        )
        if not plain:  # a scalar tensor or NumPy integer: its value
            sample_batch_size = specs.static_int(where, "sample_batch_size", sample_batch_size)
            num_steps = specs.static_int(where, "num_steps", num_steps)
        key = (where, sample_batch_size, num_steps, time_stacked, id(transform))
        known = self._requests.known
        cached = known.get(key)
        if cached is not None and cached[0] is transform:
            return cached[1]
        req = sample.request(self._parts, where, sample_batch_size, num_steps, time_stacked, transform)
        if len(known) >= _REQUESTS_MAX:
            known.clear()
        known[key] = (transform, req)  # the transform is kept, so its id stays its own
        return req

    def _max_window(self) -> int:
        return sample.max_window(self._parts)

    def _num_frames(self) -> Any:
        return calls.num_frames(self._parts, self._twin)

    def _add_batch(self, items: Nest) -> Any:
        return calls.add(self._parts, self._twin, self._gate, "add_batch", self._data_spec, items)

    def _sample_tensors(self, request: Request) -> tuple[Nest, BufferInfo]:
        return calls.sample_tensors(self._parts, self._twin, self._gate, request)

    def _sample_admitted(self, request: Request) -> tuple[Nest, BufferInfo]:
        """`get_next` inside a graph for a caller that holds the rate limiter's admission already (a fused train
        loop admits all its steps' samples at once, `train_loop.py`): drawn and refused alike, nothing waits."""
        return calls.get_next(self._parts, self._twin, _ADMITTED, request)

    def _sample_dataset(self, request: Request, num_parallel_calls: int | None) -> tf.data.Dataset:
        return calls.sample_dataset(self._parts, self._twin, self._gate, request, counter_dataset(), num_parallel_calls)

    def _single_pass_dataset(self, request: Request, num_parallel_calls: int | None) -> tf.data.Dataset:
        return single_pass.dataset(
            self._parts,
            self._twin,
            request.size if request.batched else None,
            request.num_steps,
            num_parallel_calls,
            self._window_shift,
            self._drop_remainder,
        )

    def _iterator_check(self, request: Request) -> Callable[[], None] | None:
        parts, twin, gate = self._parts, self._twin, self._gate
        if parts.zeros_when_empty:  # answers zeros: nothing to refuse
            return None

        def check() -> None:
            # With a rate limiter the elements wait for items (and a closed buffer ends the dataset).
            if gate.idle:
                found, message = calls.drawable(parts, twin, "as_dataset", request)
                if not bool(found):
                    raise EmptyBufferError(message)

        return check

    def _gather_all(self) -> Nest:
        return calls.gather_all(self._parts, self._twin)

    def _clear(self) -> Any:
        return calls.clear(self._parts, self._twin)

    def _update_priorities(self, ids: Any, priorities: Any) -> Any:
        return calls.update_priorities(self._parts, self._twin, ids, priorities)

    def _append_sequence(self, where: str, items: Nest, segment: Any) -> None:
        """Appends items (a leading time axis, oldest first) to one segment (NumPy frame buffers)."""
        ok = isinstance(segment, (int, np.integer)) and not isinstance(segment, bool)
        if not ok or not 0 <= segment < self._num_segments:
            raise ValueError(f"{where}: segment ({segment!r}) must be an integer in [0, {self._num_segments}).")
        calls.add(self._parts, self._twin, self._gate, where, self._data_spec, items, segment=int(segment))


class _Requests:
    """Checked requests by their arguments, out of sight of `tf.Module`'s attribute walk."""

    def __init__(self) -> None:
        self.known: dict[tuple, tuple] = {}


def _episode_rule(where: str, rule: Any, data_spec: Nest, paths: list) -> EpisodeRule | None:
    """The episode rule asked for: "auto" detects it from the spec; an `EpisodeRule` is checked against it."""
    if isinstance(rule, str):
        if rule != "auto":
            raise ValueError(f"{where}: episode_rule ({rule!r}) must be 'auto', None or an EpisodeRule.")
        rule = EpisodeRule.detect(data_spec, paths)
    if rule is not None:
        rule.check(where, paths, tf.nest.flatten(data_spec))
    return rule
