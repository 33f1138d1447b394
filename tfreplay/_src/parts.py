"""A buffer's parts, and one kind of sample resolved once: what the pure functions of the core take.

`Parts` holds what `write.py`, `sample.py` and `single_pass.py` read and
change: the array namespace, the layout, the storage, the bound sampler, the
episode rule and the ring's and index's state arrays (NumPy arrays or
`tf.Variable`s). `Request` is one kind of sample (`get_next` or `as_dataset`
arguments), checked and resolved when first asked for and then reused.

Layout (see `index/ring.py`): `num_segments` segments of `max_length` rows;
`num_adds[s]` counts the items segment `s` received since the last clear.
The episode index (`pos`, `pos_counts`, `newest`; see `index/episodes.py`) exists
when items mark episode boundaries (`rule`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import tensorflow as tf

from tfreplay._src.index import episodes
from tfreplay._src.index.episodes import EpisodeRule, Shape
from tfreplay._src.samplers import View


@dataclasses.dataclass(frozen=True)
class Parts:
    """The parts of one buffer (see the module docstring).

    `window` is the window shape plain samples are drawn with through the
    episode index (frames always, rows with `within_episodes`), or None for
    plain ring windows.
    """

    ops: Any
    num_segments: int
    max_length: int
    leaf_paths: tuple
    storage: Any
    sampler: Any
    rule: EpisodeRule | None
    window: Shape | None
    num_adds: Any
    pos: Any = None
    pos_counts: Any = None
    newest: Any = None
    # A sample with nothing to draw: refused with this note after the message, or (`zeros_when_empty`, as
    # TF-Agents' NumPy buffer does) answered with zeros.
    empty_note: str = ""
    zeros_when_empty: bool = False
    # Views of the arrays themselves by `(window, padded)`: `cached_view`.
    views: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def capacity(self) -> int:
        return self.num_segments * self.max_length

    def pos_at(self, rows: Any) -> Any:
        """The index's `pos` of storage rows."""
        return self.ops.to_int64(self.ops.gather(self.pos, rows))

    def windows(self, transform: Any) -> tuple[Shape | None, bool]:
        """`(window shape or None, padded)`: a transform's windows follow episodes when items mark them."""
        if transform is None:
            return self.window, False
        return (self.storage.window if self.rule is not None else None), bool(transform.padded)

    def view(self, window: Shape | None, padded: bool, backend: Any, read: Callable) -> View:
        """What the sampler may read now, each state array through `read` (a copy, a variable read, or as is);
        its random draws are the backend's."""
        has_index = window is not None
        return View(
            ops=self.ops,
            num_adds=read(self.num_adds),
            max_length=self.max_length,
            num_segments=self.num_segments,
            draw=backend.draw,
            pick=backend.pick,
            uniform=backend.uniform,
            window=window,
            pos_at=self.pos_at if has_index else None,
            pos_counts=read(self.pos_counts) if has_index else None,
            padded=padded,
            newest=read(self.newest) if padded and has_index else None,
        )

    def cached_view(self, window: Shape | None, padded: bool, backend: Any) -> View:
        """`view` of the state arrays themselves, not read (a NumPy sample under the lock, where nothing moves,
        or a TF update whose compiled op reads the counters' variable itself): made once per kind of window."""
        view = self.views.get((window, padded))
        if view is None:
            view = self.views[window, padded] = self.view(window, padded, backend, _in_place)
        return view


def _in_place(array: Any) -> Any:
    return array


def _unset() -> Any:
    raise AssertionError("a Request's read is chosen by `sample.request`, which makes every Request")


@dataclasses.dataclass(frozen=True)
class Request:
    """One kind of sample, checked once.

    Attributes:
      size: windows drawn (`sample_batch_size`, or 1).
      batched: whether `sample_batch_size` was given (else the batch axis is dropped).
      num_steps: as given (None: single items, no time axis).
      n: the window length read (`num_steps`, 1, or the transform's).
      time_stacked: windows on a time axis (else a tuple of steps).
      transform: a `Transform`, or None.
      window: the windows' shape through the episode index, or None (ring windows).
      padded: windows may run past their episode's end (a transform's).
      steps: per leaf, the step a transform reads it at (`transform.leaf_steps`); empty: whole windows.
      key: names this kind of sample (traced functions are kept per key).
      lookups: leaf paths the transform reads at one more step of each window's episode (`transforms/lookups.py`).
      read: the bulk read of a plan (`sample.plan`), chosen with the request: the storage's read of whole
        windows, or a transform's windows with their mask (and lookups).
    """

    size: int
    batched: bool
    num_steps: int | None
    n: int
    time_stacked: bool
    transform: Any
    window: Shape | None
    padded: bool
    steps: tuple
    key: str
    lookups: tuple = ()
    read: Callable[[Any], Any] = dataclasses.field(default=lambda plan: _unset(), compare=False, repr=False)


def index_state(make: Callable, num_segments: int, capacity: int) -> dict:
    """The episode index's arrays (see `index/episodes.py`): `pos` per row, `pos_counts` and `newest` per segment.

    `newest` keeps each segment's newest item's `[pos, ended]`: what a write continues from and what the
    padded-window rule reads, without gathering from the per-row arrays (XLA splits each gather from a large
    array)."""
    return {
        "pos": make("index/pos", [capacity], tf.int32),
        "pos_counts": make("index/pos_counts", [num_segments, episodes.POS_BINS], tf.int64),
        "newest": make("index/newest", [num_segments, 2], tf.int32),
    }
