"""A rows buffer's whole stored episodes as NumPy transitions, oldest first (what `save_rlds` writes)."""

from __future__ import annotations

import collections.abc
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from tfreplay.datasets import _steps

Nest = Any


def whole_episodes(where: str, buffer: Any) -> Iterator[tuple[dict, bool]]:
    """Each whole stored episode (`[T, ...]` arrays by field name, named tuples as dicts) and whether it terminated.

    Segment by segment, oldest first. One whose first item was overwritten, or that has not ended, is left
    out. The buffer is checked here, before the first episode is read.

    Raises:
      TypeError: a frame buffer.
      ValueError: the buffer has no episode boundaries.
    """
    door = buffer.front_door
    if door.capabilities.history_len is not None:
        raise TypeError(f"{where}: buffer ({type(buffer).__name__}) must store rows; frame buffers are not supported.")
    rule = door.capabilities.episode_rule
    if rule is None:
        raise ValueError(
            f"{where}: buffer ({type(buffer).__name__}) must store episode boundaries: a 'step_type' or 'first' "
            "field, 'terminated'/'truncated', or an EpisodeRule."
        )

    def episodes() -> Iterator[tuple[dict, bool]]:
        stored, num_adds = door.stored_rows()
        items = as_dicts(tf.nest.map_structure(np.asarray, stored))
        for b, count in enumerate(np.asarray(num_adds)):
            segment = tf.nest.map_structure(lambda x, b=b: x[b], items)
            yield from _split(segment, rule, count >= buffer.max_length)

    return episodes()


def as_dicts(nest: Nest) -> Nest:
    """Named tuples (a `Transition`) as dicts, all the way down."""
    if hasattr(nest, "_fields"):
        return {k: as_dicts(v) for k, v in nest._asdict().items()}
    if isinstance(nest, collections.abc.Mapping):
        return {k: as_dicts(v) for k, v in nest.items()}
    return nest


def _split(segment: dict, rule: Any, full: bool) -> list[tuple[dict, bool]]:
    """The whole episodes of one segment's items (oldest first), each with whether it terminated."""
    length = len(tf.nest.flatten(segment)[0])
    if rule.start is not None:
        start_values = segment[rule.start]
        starts = start_values == _steps.STEP_TYPE_FIRST if start_values.dtype != bool else start_values.copy()
    else:
        starts = np.zeros([length], bool)
    ends = np.zeros([length], bool)
    for name in rule.ends:
        ends |= segment[name].astype(bool)
    starts[1:] |= ends[:-1]
    if length and rule.start is None and not full:
        starts[0] = True  # nothing was overwritten: the first item started an episode
    bounds = [int(i) for i in np.flatnonzero(starts)] + [length]
    out = []
    for begin, stop in zip(bounds[:-1], bounds[1:]):
        ended = bool(ends[stop - 1]) or (stop < length and rule.start is not None)
        if not ended:
            continue
        episode = {k: _steps.slice_nest(v, begin, stop) for k, v in segment.items()}
        if "terminated" in episode:
            terminal = bool(episode["terminated"][-1])
        else:
            terminal = "discount" in episode and float(episode["discount"][-1]) == 0.0
        out.append((episode, terminal))
    return out
