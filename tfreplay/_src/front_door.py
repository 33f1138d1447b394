"""A buffer's front door: what tfreplay's own modules outside the buffer's path use of a buffer.

`TrainLoop`, `tfreplay.datasets` and the TF-Agents compat reach a buffer
through `buffer.front_door`, never through its private members: what the
buffer can do (`Capabilities`, derived from its parts), a checked request and
a sample under the rate limiter, what is stored, and loading. It is not part
of the public API: its members may change in any release.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator

import tensorflow as tf

from tfreplay._src import calls
from tfreplay._src.index import ring
from tfreplay._src.index.episodes import EpisodeRule
from tfreplay._src.samplers import SamplerBase
from tfreplay._src.specs import Nest


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a buffer can do, read off its parts.

    Attributes:
      backend: `"tf"` (state in `tf.Variable`s) or `"numpy"`.
      prioritized: its sampler keeps priorities (it has an `update` of its own, not `SamplerBase`'s default):
        `update_priorities` applies.
      history_len: frames per stacked observation of a frame storage; None for rows.
      lockstep: each `add_batch` holds one item per segment; False: one ring that takes any number of rows.
      episode_rule: which fields mark episode boundaries, or None (no episode index).
      device: where a TF buffer's variables live (None for NumPy).
      host_fields: the variables a TF buffer keeps in host memory because `device` has no kernel that writes
        their rows, as `"name (dtype)"`; XLA cannot compile a function on `device` that reads them.
    """

    backend: str
    prioritized: bool
    history_len: int | None
    lockstep: bool
    episode_rule: EpisodeRule | None
    device: str | None
    host_fields: tuple = ()

    @property
    def appends_per_segment(self) -> bool:
        """Whole sequences go to one segment (`add_sequence`): NumPy frame buffers, whose environments may
        advance at their own pace."""
        return self.backend == "numpy" and self.history_len is not None


class FrontDoor:
    """The package-internal interface of one buffer (see the module docstring).

    Args:
      buffer: a `Buffer`.
    """

    def __init__(self, buffer: Any):
        self._buffer = buffer
        parts, twin = buffer._parts, buffer._twin
        self.capabilities = Capabilities(
            backend="tf" if twin.is_tf else "numpy",
            prioritized=getattr(type(parts.sampler), "update", SamplerBase.update) is not SamplerBase.update,
            history_len=parts.storage.history_len,
            lockstep=bool(twin.lockstep),
            episode_rule=parts.rule,
            device=twin.device if twin.is_tf else None,
            host_fields=tuple(getattr(twin, "on_host", ())),
        )

    @property
    def spec(self) -> Nest:
        """The item spec as the buffer stores it (every leaf a `tf.TensorSpec`; a compat buffer's `data_spec`
        is the spec as given)."""
        return self._buffer._data_spec

    # Sampling.
    def request(self, where: str, sample_batch_size: Any, num_steps: Any, time_stacked: bool, transform: Any) -> Any:
        """The checked request of one kind of sample, as `get_next` checks it (`ValueError` naming `where`)."""
        return self._buffer._sample_request(where, sample_batch_size, num_steps, time_stacked, transform)

    def sample_admitted(self, request: Any) -> tuple[Nest, Any]:
        """`get_next`'s sample in a graph for a caller that holds the rate limiter's admission already: nothing
        waits, and an empty draw gives nothing back."""
        return self._buffer._sample_admitted(request)

    def under_gate(self, where: str, num_samples: int, fn: Callable[[], Any], used: Callable[[], int]) -> Any:
        """`fn()` once the rate limiter admits `num_samples` samples (eagerly, or in a graph through its wait
        op); `used()` counts the samples a failed eager call drew, which it keeps."""
        gate = self._buffer._gate
        if tf.executing_eagerly():
            return fn() if gate.idle else gate.call(where, "sample", num_samples, fn, used=used)
        with tf.control_dependencies(gate.admit_op(where, "sample", num_samples)):
            return fn()

    def check_room(self, where: str, num_samples: int) -> None:
        """Raises `ValueError` when the rate limiter could never admit `num_samples` samples at once."""
        gate = self._buffer._gate
        if gate.limiter is not None:
            gate.limiter._check_room(where, "sample", num_samples)

    def drawable(self, where: str, request: Any) -> tuple[Any, str]:
        """Whether `request` finds anything to draw now, for a graph that holds the lock (`locked_call`), and
        the message that refuses it, naming `where`."""
        return calls.drawable(self._buffer._parts, self._buffer._twin, where, request, held=True)

    def check(self, ok: Any, value: Any, message: str) -> Any:
        """`value` once `ok` holds: refused with `message` (under XLA: zeros where not ok)."""
        return self._buffer._twin.check(ok, value, message)

    def locked_call(self, fn: Callable[[], Any]) -> Any:
        """`fn()`, one compiled call, holding the buffer's lock (graph only; XLA has no mutex of its own)."""
        return self._buffer._twin.locked_call(fn)

    # What is stored.
    def stored_rows(self) -> tuple[Nest, Any]:
        """Every stored item `[batch_size, time, ...]`, oldest first, and each segment's count of adds since
        the last clear, in one consistent read (segments that advance together: a rows buffer)."""
        parts, ops = self._buffer._parts, self._buffer._parts.ops

        def read() -> tuple[Nest, Any]:
            num_adds = ops.read(parts.num_adds)
            rows, _ = ring.all_rows(num_adds, parts.max_length, parts.num_segments, ops)
            return parts.storage.read(rows, None, ops), num_adds

        return self._buffer._twin.exclusive(read)

    def num_adds(self) -> Any:
        """Each segment's count of adds since the last clear, read under the lock."""
        parts, twin = self._buffer._parts, self._buffer._twin
        return twin.exclusive(lambda: twin.ops.read(parts.num_adds))

    # Loading.
    def add_sequence(self, where: str, items: Nest, segment: int) -> None:
        """Appends items (a leading time axis, oldest first) to one segment (`capabilities.appends_per_segment`)."""
        self._buffer._append_sequence(where, items, segment)

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        """Eager adds inside pass the rate limiter (a migration refilling a buffer no learner reads yet); after
        them its counts follow the rule for a checkpoint without counts."""
        with self._buffer._gate.loading(self._buffer._num_frames):
            yield

    def clear_zeroed(self) -> Any:
        """Empties a TF rows buffer and zeroes its stored rows (TF-Agents' `clear_all_variables`)."""
        parts, twin = self._buffer._parts, self._buffer._twin
        zeroed = lambda: [v.assign(tf.zeros_like(v)) for v in parts.storage.arrays]  # noqa: E731
        return calls.clear(parts, twin, also=zeroed)
