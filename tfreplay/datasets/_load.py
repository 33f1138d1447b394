"""`load_rlds`: stream RLDS episodes into a buffer, whole episodes per segment."""

from __future__ import annotations

import collections.abc
import os
from typing import Any, Iterator

import tensorflow as tf

from tfreplay.datasets import _fill, _steps
from tfreplay.datasets._fill import LoadInfo, ToItems

WHERE = "load_rlds"
# A directory written by `save_rlds` records its convention in the dataset's metadata under this key.
CONVENTION_KEY = "rlds_convention"
_DATASET = "RLDS dataset (a tf.data.Dataset)"


def load_rlds(
    source: tf.data.Dataset | str | os.PathLike,
    buffer: Any,
    *,
    split: str = "train",
    convention: str = "auto",
    to_items: ToItems | None = None,
    chunk_size: int = 1024,
) -> LoadInfo:
    """Adds the episodes of an RLDS dataset to a buffer, one episode at a time.

    Each RLDS step becomes a transition named as `tfreplay.rl.drivers.Transition`:
    `observation`, `action`, `reward`, `discount`, `next_observation` (the next
    step's observation), `step_type` (`0` at an episode's first step, else `1`),
    `first` (bool), `terminated` (`is_last` and `is_terminal`) and `truncated`
    (`is_last` without `is_terminal`); every other step field keeps its name, and
    each episode metadata field (every episode field but `steps`) is repeated on
    every step of its episode. The buffer takes the top-level fields its spec
    names. A frame buffer (`frame_data_spec`) gets its rows instead: the first
    `frame` of an episode, then one row per step with the step's next frame.

    Steps are read in chunks and added per episode, so memory is bounded by the
    buffer and the longest episode, never by the dataset. Episodes are spread
    over the buffer's segments whole: each goes to the segment that has received
    the fewest items. A buffer built with `batch_size` adds one item to every
    segment per `add_batch`, so items wait until every segment has one; at the end,
    what could not be matched is left out (`LoadInfo.num_items_left_out`, less
    than the longest episode per segment). NumPy buffers built with `capacity`
    (one ring) and NumPy frame buffers (`add_sequence`) leave nothing out.

    A load is all or nothing: the source is read twice, first to check every
    episode (its fields against the buffer's spec, its `is_first`, `is_last` and
    `is_terminal` marks, what `to_items` gives), then to add them. A source that
    fails anywhere is refused before the first add, so the buffer is unchanged;
    memory still holds one episode at a time. The source must give the same
    episodes on both reads (their order may differ, as a reshuffled dataset's
    does); one that gives another episode on the second read is refused with the
    buffer holding what was added before it, as the message says.

    Args:
      source: a `tf.data.Dataset` of RLDS episodes (dicts with a `steps` dataset), or the directory of a
        TFDS dataset of them (read with `tfds.builder_from_directory`).
      buffer: any tfreplay buffer. Its spec must be a dict or named tuple.
      split: the split to read from a directory.
      convention: `"envlogger"` (an extra last step holding only the final observation), `"d4rl"` (every
        step a transition; a truncated episode's last step has no next observation, so a buffer that stores
        `next_observation` does not get it) or `"auto"`: the convention a `save_rlds` directory records,
        else `"envlogger"` when the first finished episode's last step has zero `action`, `reward` and
        `discount` and `"d4rl"` when it does not (`"envlogger"` when no episode has finished); every
        episode is read in that convention.
      to_items: `to_items(transitions, metadata)`, called per episode (on both reads, so it must not
        depend on how often it ran) with the default fields (`[T, ...]` NumPy arrays; frame rows for a
        frame buffer) and the episode's metadata, returns the episode's items in the buffer's spec with a
        leading time axis. Use it to rename, cast or compute fields.
      chunk_size: steps read per step of the input pipeline.

    Returns:
      A `LoadInfo`.

    Raises:
      ValueError: `source` is not RLDS-shaped, a field the spec needs has no source, a shape differs, an
        episode's marks are malformed (no `is_first` at its first step, or one later; an `is_last` before
        its last step; `is_terminal` without `is_last`), or TensorFlow cannot read an episode (its steps
        differ in shape, a corrupt file). The message names the dataset, the episode (its index in the
        source), and the step or the field; a TensorFlow error is chained to it. Nothing is added.
      TypeError: a dtype or structure differs from the buffer's spec. Nothing is added.
    """
    if convention not in ("auto", *_steps.CONVENTIONS):
        raise ValueError(f"{WHERE}: convention ({convention!r}) must be 'auto', 'envlogger' or 'd4rl'.")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"{WHERE}: chunk_size ({chunk_size!r}) must be a positive integer.")
    dataset, recorded = _open(source, split)
    origin = f"RLDS dataset ({os.fspath(source)!r})" if not isinstance(source, tf.data.Dataset) else _DATASET
    step_spec, meta_spec = _rlds_specs(dataset.element_spec, source)
    frames = buffer.front_door.capabilities.history_len is not None
    needs_next = _fill.needs_next(buffer, WHERE)
    spec_checked = False  # the default fields checked once against the dataset's spec, when it knows every shape
    if to_items is None:
        available = _default_specs(step_spec, meta_spec, needs_next, frames)
        _fill.check_sources(WHERE, buffer.data_spec, available, "the RLDS steps give")
        spec_checked = all(s.shape.is_fully_defined() for s in tf.nest.flatten(available))
    if convention == "auto":
        convention = recorded if recorded in _steps.CONVENTIONS else _detect(dataset, meta_spec, chunk_size, origin)

    def read() -> Iterator[tuple[dict, dict]]:
        for index, (steps, metadata) in enumerate(_episodes(dataset, meta_spec, chunk_size, origin)):
            _steps.check_marks(WHERE, f"episode {index} of the {origin}", steps)
            transitions = _steps.to_transitions(steps, convention, needs_next)
            yield _fill.episode_fields(transitions, metadata, frames), metadata

    counts = _fill.add_episodes(WHERE, buffer, read, to_items, origin, spec_checked)
    return LoadInfo(*counts, convention)


def _detect(dataset: tf.data.Dataset, meta_spec: dict, chunk_size: int, origin: str) -> str:
    """The convention of the first finished episode (`"envlogger"` when none has finished)."""
    for steps, _ in _episodes(dataset, meta_spec, chunk_size, origin):
        found = _steps.detect(steps)
        if found is not None:
            return found
    return "envlogger"


def _open(source: Any, split: str) -> tuple[tf.data.Dataset, Any]:
    """The episodes dataset of `source` and the convention its directory records (or None)."""
    if isinstance(source, tf.data.Dataset):
        return source, None
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"{WHERE}: source ({source!r}) must be a tf.data.Dataset or a directory path.")
    import tensorflow_datasets as tfds  # the `datasets` extra, loaded only here

    path = os.fspath(source)
    if not os.path.isfile(os.path.join(path, "dataset_info.json")):
        raise ValueError(f"{WHERE}: source ({path!r}) must be a TFDS dataset directory (with a dataset_info.json).")
    builder = tfds.builder_from_directory(path)
    if split not in builder.info.splits:
        raise ValueError(f"{WHERE}: split ({split!r}) must be one of {sorted(builder.info.splits)} in {path!r}.")
    metadata = builder.info.metadata or {}
    return builder.as_dataset(split=split), metadata.get(CONVENTION_KEY)


def _rlds_specs(element_spec: Any, source: Any) -> tuple[dict, dict]:
    """The step spec and the episode metadata spec of an RLDS episodes dataset."""
    what = source if not isinstance(source, tf.data.Dataset) else "the dataset"
    if not isinstance(element_spec, collections.abc.Mapping) or not isinstance(
        element_spec.get("steps"), tf.data.DatasetSpec
    ):
        found = sorted(element_spec) if isinstance(element_spec, collections.abc.Mapping) else type(element_spec)
        raise ValueError(
            f"{WHERE}: source ({what}) must hold RLDS episodes, dicts with a 'steps' dataset; its episodes have "
            f"{found}."
        )
    step_spec = element_spec["steps"].element_spec
    needed = ("observation", *_steps.MARKS)
    missing = [name for name in needed if not isinstance(step_spec, dict) or name not in step_spec]
    if missing:
        raise ValueError(
            f"{WHERE}: steps of {what} must have {', '.join(needed)}; missing {missing} "
            f"(they have {sorted(step_spec) if isinstance(step_spec, dict) else step_spec})."
        )
    return dict(step_spec), {k: v for k, v in element_spec.items() if k != "steps"}


def _default_specs(step_spec: dict, meta_spec: dict, needs_next: bool, frames: bool) -> dict:
    """The spec of every default field (what `_steps.to_transitions` or `to_frame_rows` build)."""
    flag = tf.TensorSpec([], tf.bool)
    out = {name: spec for name, spec in step_spec.items() if name not in _steps.MARKS}
    out.update(meta_spec)
    out.update(first=flag, terminated=flag, truncated=flag)
    if frames:
        out["frame"] = out.pop("observation")
    else:
        out["step_type"] = tf.TensorSpec([], tf.int32)
        if needs_next:
            out["next_observation"] = step_spec["observation"]
    return out


def _episodes(dataset: tf.data.Dataset, meta_spec: dict, chunk_size: int, origin: str) -> Iterator[tuple[dict, dict]]:
    """Each episode's steps (NumPy arrays, `[n, ...]`) and metadata, read in chunks of steps.

    Raises:
      ValueError: TensorFlow could not read an episode, or its steps differ in shape; the message names the
        episode and the field (found by reading the episodes again, one field at a time) and chains the error.
    """

    def chunks(index: Any, episode: dict) -> tf.data.Dataset:
        metadata = {name: episode[name] for name in meta_spec}
        return episode["steps"].batch(chunk_size).map(lambda steps: (index, metadata, steps))

    pending: list = []
    current: Any = None
    pending_meta: dict = {}
    try:
        for index, metadata, steps in dataset.enumerate().flat_map(chunks).prefetch(2).as_numpy_iterator():
            if pending and index != current:
                yield _steps.concat_all(pending), pending_meta
                pending = []
            current, pending_meta = index, metadata
            pending.append(steps)
        if pending:
            yield _steps.concat_all(pending), pending_meta
    except (tf.errors.OpError, ValueError) as err:
        index, name = _locate(dataset)
        episode = f"episode {index}" if index is not None else "an episode (not found again on a second read)"
        raise ValueError(
            f"{WHERE}: {episode} of the {origin}: {name or 'every field'} must be readable, one shape in every "
            f"step; reading it raised {type(err).__name__}: {err}"
        ) from err


def _locate(dataset: tf.data.Dataset) -> tuple[int | None, str | None]:
    """The episode and the step field that cannot be read (after an error: the episodes are read again, step by
    step, comparing each field's shapes with the episode's first step)."""
    index = -1
    try:
        for index_tensor, episode in dataset.enumerate():
            index, first = int(index_tensor), None
            for step in episode["steps"]:
                shapes = {name: [x.shape for x in tf.nest.flatten(value)] for name, value in step.items()}
                first = first or shapes
                changed = [name for name in sorted(shapes) if shapes[name] != first[name]]
                if changed:
                    return index, changed[0]
    except tf.errors.OpError:
        return index + 1, None
    return None, None
