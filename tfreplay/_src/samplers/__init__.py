"""Samplers: which stored windows a buffer draws, and with what probability.

A sampler is given to a buffer unbound (`Sampler`); the buffer calls
`bind(make, num_rows)` once, which returns the `BoundSampler` it then uses:
a new object holding the sampler's state (variables or arrays made through
the twin's `make(name, shape, dtype)`, so checkpoints include them); the
given sampler is not changed. The bound sampler sees the buffer through a
`View` (the ring counters, the episode index, the random source), written
once over its `ops` namespace, so it runs on both twins.

`SamplerBase` gives the defaults of a sampler without priorities; a new
sampler is one class (one file here) that overrides `sample` and `mass`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Protocol

import numpy as np

from tfreplay._src.index.episodes import Shape

Make = Callable[[str, list, Any], Any]


def refuse(entry: str, value: Any, rule: str) -> ValueError:
    """The error for a checkpoint's saved state `entry` whose `value` breaks `rule` (nothing is restored)."""
    shown = np.asarray(value).reshape(-1)
    more = " ..." if shown.size > 4 else ""
    return ValueError(
        f"checkpoint restore: the checkpoint's {entry} ({shown[:4].tolist()}{more}) must be {rule}; "
        "it was altered or written by another library. Nothing was restored."
    )


@dataclasses.dataclass
class View:
    """What a sampler may read: taken under the buffer's lock, or by a TF sample without it, which the write
    counters check afterwards (`backends/tf_versioned.py`).

    `window` is None when episodes do not matter (plain ring windows);
    otherwise windows are drawn through the episode index (`pos_at`,
    `pos_counts`) with the storage's window shape. With `padded`, windows may
    run past their episode's end (`episodes.young_starts` is the rule;
    `newest`: the index's `[pos, ended]` of each segment's newest item).
    `num_adds` holds the ring's counters as read for this view (for an update
    that takes no lock, the TF counters' variable itself). The random draws
    are the backend's: `draw(shape, total)` gives int64 draws uniform in
    `[0, total)`, `pick(shape, total)` the same draws with each one's float32
    probability (`1 / total`), and `uniform(shape)` float64 draws in `[0, 1)`.
    """

    ops: Any
    num_adds: Any
    max_length: int
    num_segments: int
    draw: Callable[[list, Any], Any]
    pick: Callable[[list, Any], tuple[Any, Any]]
    uniform: Callable[[list], Any]
    window: Shape | None = None
    pos_at: Callable[[Any], Any] | None = None
    pos_counts: Any = None
    padded: bool = False
    newest: Any = None


class BoundSampler(Protocol):
    """What a buffer calls; see `SamplerBase` for what each member means and its default."""

    within_episodes: bool
    episode_windows: bool
    padded_windows: bool
    draws_uniformly: bool
    checkpoint_record: dict
    priority_limit: float

    def on_write(self, ops: Any, rows: Any, startable: Any) -> list: ...

    def sample(self, view: View, size: int, num_steps: int | None) -> tuple[Any, Any, Any, Any]: ...

    def mass(self, view: View, num_steps: int | None) -> Any: ...

    def update(self, view: View, ids: Any, priorities: Any) -> tuple[list, Any]: ...

    def unlocked_update(self, view: View, ids: Any, priorities: Any) -> tuple[list, Any] | None: ...

    def checks_priorities(self, view: View) -> bool: ...

    def clear(self, ops: Any) -> list: ...

    def check_state(self, values: dict, live: Any, startable: Any) -> None: ...


class Sampler(Protocol):
    """What a buffer is given: `bind` makes the sampler's state and returns the object the buffer uses."""

    within_episodes: bool

    def bind(self, make: Make, num_rows: int) -> BoundSampler: ...


class SamplerBase:
    """Defaults of the sampler protocol, for a sampler without state or priorities (subclass it).

    Attributes:
      within_episodes: strict windows never cross an episode boundary (the
        buffer then needs items that mark boundaries).
      episode_windows: it draws strict windows through the episode index
        (`view.window` set, `view.padded` False); the buffer refuses them otherwise.
      padded_windows: it draws padded windows (`view.padded`).
      draws_uniformly: it draws exactly as `UniformSampler` does: every valid
        window equally likely, independent draws that read only the ring
        counters and the index, so compiled planners may draw for it and a
        dataset may draw several elements at once. Leave False unless true.
      checkpoint_record: entries of the buffer's checkpoint layout record
        that describe the sampler's state (a checkpoint must match them).
      priority_limit: the largest priority `update` accepts (larger ones
        would overflow its sums; inf without priorities).
    """

    within_episodes = False
    episode_windows = False
    padded_windows = False
    draws_uniformly = False
    checkpoint_record: dict = {}
    priority_limit = math.inf

    def bind(self, make: Make, num_rows: int) -> Any:
        """The bound sampler; a stateless one is its own."""
        return self

    def on_write(self, ops: Any, rows: Any, startable: Any = None) -> list:
        """Update ops (or `[]`) for storage `rows` just written; `startable` says per row whether it can ever
        start a window (False: a frame buffer's first frames), or is None (all can). A step of the write's
        `ops.commit`: on NumPy arrays it may run again after an interrupt, so it sets values, never adds to them."""
        return []

    def sample(self, view: View, size: int, num_steps: int | None) -> tuple[Any, Any, Any, Any]:
        """`(segment, t, probabilities, count)`: `size` windows starting at local id `t` of `segment`, each
        one's probability, and how many windows could be drawn (0: none)."""
        raise NotImplementedError

    def mass(self, view: View, num_steps: int | None) -> Any:
        """The total weight `sample` draws from now (the number of valid windows, or their summed priority)."""
        raise NotImplementedError

    def update(self, view: View, ids: Any, priorities: Any) -> tuple[list, Any]:
        """New priorities of items, under the buffer's lock: `(update ops, how many ids were stale)`; a stale count
        of -1 says a priority was refused (negative, NaN, infinite, above `priority_limit`) and nothing changed."""
        return [], 0

    def unlocked_update(self, view: View, ids: Any, priorities: Any) -> tuple[list, Any] | None:
        """`update` without the buffer's lock where that is safe, else None (the buffer then locks)."""
        return None

    def checks_priorities(self, view: View) -> bool:
        """Whether `update` itself refuses a bad priority (a graph then needs no separate assertion)."""
        return False

    def clear(self, ops: Any) -> list:
        """Update ops that forget every item's state."""
        return []

    def check_state(self, values: dict, live: Any, startable: Any) -> None:
        """Before a restore: raises `ValueError` if the saved state of this sampler (`values`, by the names it
        made its arrays with) is not one it could have reached; `live` (per storage row) marks rows holding a
        stored item, `startable` rows that can ever start a window (None: all)."""
