"""What each kind of public buffer adds to the `Buffer` API.

One definition each, assigned in every class of the kind (`tfreplay.buffers`)
and, by its author, in a `tfreplay.compose.Buffer` of the kind.
"""

from __future__ import annotations

from typing import Any

from tfreplay._src.buffer import Buffer


def update_priorities(self: Buffer, ids: Any, priorities: Any) -> Any:
    """Gives sampled items (their `BufferInfo.ids`) new priorities, eagerly or in a graph.

    Items overwritten since they were sampled are left alone; returns how
    many ids were such stale ones. New items enter at the largest priority
    given so far; priority 0 means never drawn until raised.

    Raises:
      ValueError: priorities of another shape than `ids`, or negative, NaN
        or infinite ones (in a graph: `InvalidArgumentError`); nothing changes.
    """
    return self._update_priorities(ids, priorities)


def _history_len(self: Buffer) -> int:
    """Frames per stacked observation."""
    return int(self._parts.storage.history_len)


def _transition_spec(self: Buffer) -> dict:
    """The spec of one sampled transition."""
    return dict(self._parts.storage.item_spec)


def num_transitions(self: Buffer) -> Any:
    """How many stored transitions can be drawn now (single steps)."""
    twin, parts = self._twin, self._parts
    window = parts.window

    def count() -> Any:
        num_adds, pos_counts = twin.ops.read(parts.num_adds), twin.ops.read(parts.pos_counts)
        return window.count(num_adds, pos_counts, parts.pos_at, parts.max_length, 1, twin.ops)

    return twin.exclusive(count)


def _size(self: Buffer) -> int:
    """How many items are stored now (TF-Agents' `PyUniformReplayBuffer.size`; also `num_frames()`)."""
    return self._num_frames()


def _device(self: Buffer) -> str:
    """Where the variables live."""
    return self._twin.device


def _scope(self: Buffer) -> str:
    """The name scope of the buffer's variables and ops."""
    return self._twin.scope


# What each kind of buffer adds to the API: one definition each, assigned in every class of the kind.
TF_MEMBERS: dict[str, Any] = {"device": property(_device), "scope": property(_scope)}
NUMPY_MEMBERS: dict[str, Any] = {"size": property(_size)}
FRAME_MEMBERS: dict[str, Any] = {
    "history_len": property(_history_len),
    "transition_spec": property(_transition_spec),
    "num_transitions": num_transitions,
}
