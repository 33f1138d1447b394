"""`load_rlds`: stream RLDS episodes into a buffer, whole episodes per segment."""

from __future__ import annotations

import collections.abc
import os
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import tensorflow as tf

from tfreplay._src.twin_tf import TFTwin
from tfreplay.datasets import _steps

Nest = Any
ToItems = Callable[[dict, dict], Nest]
WHERE = "load_rlds"
# A directory written by `save_rlds` records its convention in the dataset's metadata under this key.
CONVENTION_KEY = "rlds_convention"


class LoadInfo(NamedTuple):
    """What `load_rlds` did.

    Attributes:
      num_episodes: episodes read from the source (episodes without steps are not counted).
      num_items: items added to the buffer.
      num_items_left_out: items of the last episodes not added, so that every segment of a buffer whose
        `add_batch` writes one item to each segment received the same number (0 for other buffers).
      convention: the convention the steps were read with, `"envlogger"` or `"d4rl"`.
    """

    num_episodes: int
    num_items: int
    num_items_left_out: int
    convention: str


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

    Args:
      source: a `tf.data.Dataset` of RLDS episodes (dicts with a `steps` dataset), or the directory of a
        TFDS dataset of them (read with `tfds.builder_from_directory`).
      buffer: any tfreplay buffer. Its spec must be a dict or named tuple.
      split: the split to read from a directory.
      convention: `"envlogger"` (an extra last step holding only the final observation), `"d4rl"` (every
        step a transition; a truncated episode's last step has no next observation, so a buffer that stores
        `next_observation` does not get it) or `"auto"`: the convention a `save_rlds` directory records,
        else `"envlogger"` when the first finished episode's last step has zero `action`, `reward` and
        `discount` and `"d4rl"` when it does not.
      to_items: `to_items(transitions, metadata)`, called per episode with the default fields (`[T, ...]`
        NumPy arrays; frame rows for a frame buffer) and the episode's metadata, returns the episode's
        items in the buffer's spec with a leading time axis. Use it to rename, cast or compute fields.
      chunk_size: steps read per step of the input pipeline.

    Returns:
      A `LoadInfo`.

    Raises:
      ValueError: `source` is not RLDS-shaped, a field the spec needs has no source, or a shape differs.
        Checked before anything is added, so the buffer is unchanged.
      TypeError: a dtype or structure differs from the buffer's spec.
    """
    if convention not in ("auto", *_steps.CONVENTIONS):
        raise ValueError(f"{WHERE}: convention ({convention!r}) must be 'auto', 'envlogger' or 'd4rl'.")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"{WHERE}: chunk_size ({chunk_size!r}) must be a positive integer.")
    dataset, recorded = _open(source, split)
    if convention == "auto" and recorded in _steps.CONVENTIONS:
        convention = recorded
    step_spec, meta_spec = _rlds_specs(dataset.element_spec, source)
    frames = hasattr(buffer, "history_len")
    fields = _top_fields(buffer.data_spec)
    needs_next = frames or "next_observation" in fields
    if to_items is None:
        _check_sources(buffer.data_spec, _default_specs(step_spec, meta_spec, needs_next, frames))
    spreader = _Spreader(buffer)
    num_episodes = 0
    for steps, metadata in _episodes(dataset, meta_spec, chunk_size):
        num_episodes += 1
        if convention == "auto":
            convention = _steps.detect(steps) or "auto"
        transitions = _steps.to_transitions(steps, "envlogger" if convention == "auto" else convention, needs_next)
        if frames:
            transitions = _steps.to_frame_rows(transitions)
        length = len(transitions.get("first", ()))
        if not length:
            continue
        for name, value in metadata.items():
            transitions[name] = np.broadcast_to(value, (length, *np.shape(value))).copy()
        if to_items is not None:
            items = to_items(transitions, metadata)
            _check_items(buffer.data_spec, items)
        else:
            items = _select(buffer.data_spec, transitions)
        spreader.add(items, len(tf.nest.flatten(items)[0]))
    return LoadInfo(num_episodes, spreader.num_written, spreader.num_left_out(), convention)


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


def _top_fields(spec: Nest) -> list[str]:
    if isinstance(spec, collections.abc.Mapping):
        return list(spec)
    if hasattr(spec, "_fields"):
        return list(spec._fields)
    raise TypeError(f"{WHERE}: the buffer's data_spec ({type(spec).__name__}) must be a dict or a named tuple.")


def _check_sources(spec: Nest, available: dict) -> None:
    """Every field of the buffer's spec has a source of the same structure, dtype and shape."""
    for name in _top_fields(spec):
        if name not in available:
            raise ValueError(
                f"{WHERE}: the buffer's field {name!r} has no source: RLDS steps give {sorted(available)} "
                "(pass to_items= to build it)."
            )
        _check_leaves(name, _field(spec, name), available[name], "the RLDS steps give")


def _check_items(spec: Nest, items: Nest) -> None:
    """A `to_items` result matches the buffer's spec (checked before the episode is added)."""
    try:
        tf.nest.assert_same_structure(spec, items, check_types=False)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{WHERE}: to_items must return the buffer's spec structure: {err}") from None
    given = tf.nest.map_structure(
        lambda s, x: tf.TensorSpec(np.shape(x)[1:], tf.as_dtype(np.asarray(x).dtype)), spec, items
    )
    for name in _top_fields(spec):
        _check_leaves(name, _field(spec, name), _field(given, name), "to_items gives")


def _check_leaves(name: str, spec: Nest, source: Nest, whence: str) -> None:
    want = dict(_steps.leaf_paths(spec))
    have = dict(_steps.leaf_paths(source))
    if set(want) != set(have):
        raise TypeError(
            f"{WHERE}: {name} has leaves {sorted(have)} where {whence} it; the spec expects {sorted(want)}."
        )
    for path, leaf in want.items():
        label = f"{name}/{path}" if path else name
        if have[path].dtype != leaf.dtype:
            raise TypeError(
                f"{WHERE}: {label} has dtype {have[path].dtype.name} where {whence} it; the spec expects "
                f"{leaf.dtype.name} (tfreplay never casts silently; cast it in to_items=)."
            )
        if not leaf.shape.is_compatible_with(have[path].shape):
            raise ValueError(
                f"{WHERE}: {label} has shape {tuple(have[path].shape)} where {whence} it; the spec expects "
                f"{tuple(leaf.shape)}."
            )


def _field(nest: Nest, name: str) -> Nest:
    return nest[name] if isinstance(nest, collections.abc.Mapping) else getattr(nest, name)


def _select(spec: Nest, values: dict) -> Nest:
    """The buffer's items from the default fields, each field packed as its spec is."""

    def pack(name: str) -> Nest:
        by_path = dict(_steps.leaf_paths(values[name]))
        field = _field(spec, name)
        return tf.nest.pack_sequence_as(field, [by_path[p] for p, _ in _steps.leaf_paths(field)])

    packed = {name: pack(name) for name in _top_fields(spec)}
    return (
        type(spec)(**packed) if hasattr(spec, "_fields") else type(spec)(packed) if type(spec) is not dict else packed
    )


def _episodes(dataset: tf.data.Dataset, meta_spec: dict, chunk_size: int) -> Iterator[tuple[dict, dict]]:
    """Each episode's steps (NumPy arrays, `[n, ...]`) and metadata, read in chunks of steps."""

    def chunks(index: Any, episode: dict) -> tf.data.Dataset:
        metadata = {name: episode[name] for name in meta_spec}
        return episode["steps"].batch(chunk_size).map(lambda steps: (index, metadata, steps))

    pending: list = []
    current: Any = None
    pending_meta: dict = {}
    for index, metadata, steps in dataset.enumerate().flat_map(chunks).prefetch(2).as_numpy_iterator():
        if pending and index != current:
            yield _steps.concat_all(pending), pending_meta
            pending = []
        current, pending_meta = index, metadata
        pending.append(steps)
    if pending:
        yield _steps.concat_all(pending), pending_meta


class _Spreader:
    """Writes whole episodes to the segment that has received the fewest items."""

    def __init__(self, buffer: Any):
        self.buffer = buffer
        self.ring = not buffer._twin.lockstep  # a NumPy one-ring buffer: add_batch takes any number of rows
        self.by_segment = hasattr(buffer, "add_sequence")
        self.pending: list[list] = [[] for _ in range(buffer.batch_size)]
        self.received = [0] * buffer.batch_size
        self.num_written = 0
        self.add_rows = _graph_rows_adder(buffer) if isinstance(buffer._twin, TFTwin) else None

    def add(self, items: Nest, length: int) -> None:
        if self.ring:
            self.buffer.add_batch(items)
            self.num_written += length
            return
        segment = int(np.argmin(self.received))
        self.received[segment] += length
        if self.by_segment:
            self.buffer.add_sequence(items, segment)
            self.num_written += length
            return
        self.pending[segment].append(items)
        self._flush()

    def _flush(self) -> None:
        """Adds as many rows as every segment has waiting, one `add_batch` per row."""
        waiting = [sum(len(tf.nest.flatten(x)[0]) for x in queue) for queue in self.pending]
        num = min(waiting)
        if not num:
            return
        heads = []
        for b, queue in enumerate(self.pending):
            joined = tf.nest.map_structure(lambda *xs: np.concatenate(xs), *queue) if len(queue) > 1 else queue[0]
            heads.append(tf.nest.map_structure(lambda x: x[:num], joined))
            rest = tf.nest.map_structure(lambda x: x[num:], joined)
            self.pending[b] = [rest] if waiting[b] > num else []
        rows = tf.nest.map_structure(lambda *xs: np.stack(xs, axis=1), *heads)  # [num, batch_size, ...]
        if self.add_rows is not None:
            self.add_rows(rows)
        else:
            for t in range(num):
                self.buffer.add_batch(tf.nest.map_structure(lambda x, t=t: x[t], rows))
        self.num_written += num * len(heads)

    def num_left_out(self) -> int:
        return sum(self.received) - self.num_written if not (self.ring or self.by_segment) else 0


def _graph_rows_adder(buffer: Any) -> Callable[[Nest], Any]:
    """One `tf.function` that adds `[num, batch_size, ...]` rows to a TF buffer, one `add_batch` per row inside
    the graph (about ten times faster than an eager `add_batch` per row); traced once per load."""
    signature = tf.nest.map_structure(
        lambda s: tf.TensorSpec([None, buffer.batch_size, *s.shape], s.dtype), buffer.data_spec
    )

    @tf.function(input_signature=[signature], autograph=False)
    def add_rows(rows: Nest) -> Any:
        def body(t: Any) -> Any:
            with tf.control_dependencies([buffer.add_batch(tf.nest.map_structure(lambda x: x[t], rows))]):
                return t + 1

        num = tf.shape(tf.nest.flatten(rows)[0])[0]
        return tf.while_loop(lambda t: t < num, body, [tf.constant(0)], parallel_iterations=1)

    return add_rows
