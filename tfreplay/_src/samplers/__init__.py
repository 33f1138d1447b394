"""Samplers: which stored windows a buffer draws, and with what probability.

A sampler sees the buffer through a `View` (the ring counters, the episode
index, the random source) and returns window starts. Its interface:

* `bind(make, num_rows)`: create its state (variables or arrays) through the
  twin's `make(name, shape, dtype)`, so checkpoints include it; returns the sampler.
* `on_write(ops, rows, startable)`: the storage rows just written (returns
  update ops, or `[]`); `startable` says per row whether it can ever start a
  window (False: a frame buffer's first frames), or is None (all can).
* `sample(view, size, num_steps)`: `(segment, t, probabilities, count)`:
  `size` windows starting at local id `t` of `segment`, each one's
  probability, and how many windows could be drawn (0: none).
* `mass(view, num_steps)`: the total weight `sample` draws from now (the
  number of valid windows, or their summed priority); a sharded service
  weighs its shards by it.
* `update(view, ids, priorities)`: new priorities (returns `(updates, stale
  count)`), and `clear(ops)`: no-ops for uniform sampling.

A new sampler is one file here plus the line that passes it to a buffer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tfreplay._src.episodes import Shape


@dataclasses.dataclass
class View:
    """What a sampler may read: taken under the buffer's lock, or by a TF sample without it, which the write
    counters check afterwards (`core/twin_tf.py`).

    `window` is None when episodes do not matter (plain ring windows);
    otherwise windows are drawn through the episode index (`pos_at`,
    `pos_counts`) with the storage's window shape. With `padded`, windows may
    run past their episode's end (`episodes.young_starts` is the rule;
    `newest`: the index's `[pos, ended]` of each segment's newest item).
    A sampler says what it draws beyond plain ring windows with
    `episode_windows = True` (strict windows through the index) and
    `padded_windows = True`; the buffer refuses other requests.
    """

    ops: Any
    num_adds: Any
    max_length: int
    num_segments: int
    draw: Callable[[list, Any], Any]
    uniform: Callable[[list], Any]
    window: Shape | None = None
    pos_at: Callable[[Any], Any] | None = None
    pos_counts: Any = None
    padded: bool = False
    newest: Any = None
