"""Episodes into a buffer, whatever their source: checks, field selection and whole episodes per segment."""

from __future__ import annotations

import collections
import collections.abc
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np
import tensorflow as tf

from tfreplay.datasets import _steps

Nest = Any
_CAST = "; cast it in to_items="
ToItems = Callable[[dict, Any], Nest]


class LoadInfo(NamedTuple):
    """What `load_rlds` or `load_minari` did.

    Attributes:
      num_episodes: episodes read from the source (episodes without steps are not counted).
      num_items: items added to the buffer.
      num_items_left_out: items of the last episodes not added, so that every segment of a buffer whose
        `add_batch` writes one item to each segment received the same number (0 for other buffers).
      convention: the convention the steps were read with, `"envlogger"` or `"d4rl"` (a Minari episode
        stores its final observation, as `"envlogger"` does).
    """

    num_episodes: int
    num_items: int
    num_items_left_out: int
    convention: str


def needs_next(buffer: Any, where: str) -> bool:
    """Whether the buffer stores the observation after each step (`next_observation`, or a frame buffer's frames)."""
    frames = buffer.front_door.capabilities.history_len is not None
    return frames or "next_observation" in top_fields(buffer.data_spec, where)


def episode_fields(transitions: dict, metadata: dict, frames: bool) -> dict:
    """The default fields of one episode: its transitions (a frame buffer's rows) and its metadata on every row."""
    fields = _steps.to_frame_rows(transitions) if frames else transitions
    length = len(fields.get("first", ()))
    for name, value in metadata.items():
        fields[name] = np.broadcast_to(value, (length, *np.shape(value))).copy()
    return fields


def add_episodes(
    where: str,
    buffer: Any,
    read: Callable[[], Iterable[tuple[dict, Any]]],
    to_items: ToItems | None,
    origin: str,
    spec_checked: bool = False,
) -> tuple[int, int, int]:
    """Checks every `(fields, context)` episode that `read()` gives, then reads them again and adds them.

    Each episode's items (its default fields, `episode_fields`, or what `to_items` makes of them and the
    context) are checked against the buffer's spec on the first read, so a source that any episode of fails
    is refused before anything is added: the buffer is unchanged. `spec_checked`: the default fields were
    checked already against the source's own spec, whose shapes are all known (then only each episode's
    rows are). The second read is not checked again: it must give the episodes the first gave. Checking
    first costs a second read of the source, not memory: each read holds one episode at a time. `to_items`
    runs on both reads. `origin` names the source in the messages, e.g. `"RLDS dataset ('/data/x')"`.

    Returns:
      `(num_episodes, num_items, num_items_left_out)`.

    Raises:
      ValueError: the second read gives an episode the first did not (a source that changes between reads);
        the buffer then holds the episodes added before it, as the message says.
    """
    first = _episode_items(where, buffer.data_spec, read(), to_items, origin, check=not spec_checked)
    checked = collections.Counter(length for length, _ in first)
    spreader = _Spreader(buffer)
    num_episodes = 0
    second = _episode_items(where, buffer.data_spec, read(), to_items, origin, check=False)
    while True:
        try:
            length, items = next(second)
        except StopIteration:
            break
        except (KeyError, TypeError, ValueError) as err:
            raise _changed(where, origin, spreader, f"refused an episode: {err}") from err
        num_episodes += 1
        if not checked[length]:
            raise _changed(where, origin, spreader, f"gave an episode of {length} items that its first did not.")
        checked[length] -= 1
        if length:
            try:
                spreader.add(items, length)
            except (TypeError, ValueError, tf.errors.OpError) as err:
                raise ValueError(
                    f"{where}: episode {num_episodes - 1} of the {origin} must be added whole; adding it raised "
                    f"{type(err).__name__}: {err}. The buffer holds the {spreader.num_written} items added before it."
                ) from err
    return num_episodes, spreader.num_written, spreader.num_left_out()


def _changed(where: str, origin: str, spreader: _Spreader, what: str) -> ValueError:
    return ValueError(
        f"{where}: the {origin} must give the same episodes on each read: its second read (to add them) {what} "
        f"The buffer holds the {spreader.num_written} items added before it."
    )


def _episode_items(
    where: str, spec: Nest, episodes: Iterable[tuple[dict, Any]], to_items: ToItems | None, origin: str, check: bool
) -> Iterator[tuple[int, Nest]]:
    """Each episode's `(number of items, items)` (`(0, None)` when empty), with `check` checked against the
    buffer's spec."""
    for index, (fields, context) in enumerate(episodes):
        if not len(fields.get("first", ())):
            yield 0, None
            continue
        label = f"episode {index} of the {origin}"
        if to_items is not None:
            items = to_items(fields, context)
            if check:
                check_items(where, spec, items, f"to_items, for {label}, gives")
        else:
            if check:
                check_sources(where, spec, available_specs(fields), f"{label} gives")
            items = select(where, spec, fields)
        yield _num_rows(where, items, label), items


def _num_rows(where: str, items: Nest, label: str) -> int:
    """The number of items in `[T, ...]` leaves, which must agree."""
    rows = {path: int(np.shape(leaf)[0]) if np.ndim(leaf) else -1 for path, leaf in _steps.named_leaves(items)}
    counts = set(rows.values())
    if len(counts) != 1 or -1 in counts:
        found = ", ".join(f"{path}: {n if n >= 0 else 'no'} rows" for path, n in rows.items())
        raise ValueError(
            f"{where}: the items of {label} ({found}) must have one row per item, the same number in every field."
        )
    return counts.pop()


def top_fields(spec: Nest, where: str) -> list[str]:
    if isinstance(spec, collections.abc.Mapping):
        return list(spec)
    if hasattr(spec, "_fields"):
        return list(spec._fields)
    raise TypeError(f"{where}: the buffer's data_spec ({type(spec).__name__}) must be a dict or a named tuple.")


def check_sources(where: str, spec: Nest, available: dict, whence: str) -> None:
    """Every field of the buffer's spec has a source of the same structure, dtype and shape.

    `available`: the spec of each field the source gives; `whence` names the source in the messages, e.g.
    `"the RLDS steps give"`.
    """
    for name in top_fields(spec, where):
        if name not in available:
            raise ValueError(
                f"{where}: the buffer's field {name!r} has no source: {whence} {sorted(available)} "
                "(pass to_items= to build it)."
            )
        compare_specs(where, name, field(spec, name), available[name], f"where {whence} it", "the spec expects", _CAST)


def check_items(where: str, spec: Nest, items: Nest, whence: str) -> None:
    """Items (`[T, ...]` arrays) match the buffer's spec; `whence` says where they came from."""
    try:
        tf.nest.assert_same_structure(spec, items, check_types=False)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{where}: the items {whence} must have the buffer's spec structure: {err}") from err
    given = tf.nest.map_structure(lambda s, x: _spec_of(x), spec, items)
    for name in top_fields(spec, where):
        compare_specs(
            where, name, field(spec, name), field(given, name), f"where {whence} it", "the spec expects", _CAST
        )


def specs_of(arrays: Nest) -> Nest:
    """The `tf.TensorSpec` of one row of each `[T, ...]` array of a nest."""
    return tf.nest.map_structure(_spec_of, arrays)


def _spec_of(array: Any) -> tf.TensorSpec:
    return tf.TensorSpec(np.shape(array)[1:], tf.as_dtype(np.asarray(array).dtype))


def available_specs(fields: dict) -> dict:
    """`specs_of` each default field whose leaves are all numeric (a field of strings is no source)."""
    out = {}
    for name, value in fields.items():
        try:
            out[name] = specs_of(value)
        except TypeError:
            continue
    return out


def compare_specs(where: str, name: str, want: Nest, have: Nest, found: str, expected: str, cast: str = "") -> None:
    """The one spec comparison of the loaders and savers: `have` (a nest of `tf.TensorSpec`) has the leaves of
    `want`, each of its dtype and of a shape compatible with its own.

    A refusal reads `<where>: <name>/<leaf> has <what> <value> <found>; <expected> <value>`, e.g. `load_rlds:
    reward has dtype float32 where the RLDS steps give it; the spec expects float64`; `cast` follows a dtype's
    (where to cast).

    Raises:
      TypeError: other leaves, or another dtype (tfreplay never casts silently).
      ValueError: another shape.
    """
    wanted, given = dict(_steps.named_leaves(want)), dict(_steps.named_leaves(have))
    if set(wanted) != set(given):
        raise TypeError(f"{where}: {name} has leaves {sorted(given)} {found}; {expected} {sorted(wanted)}.")
    for path, leaf in wanted.items():
        label, other = f"{name}/{path}" if path else name, given[path]
        if other.dtype != leaf.dtype:
            raise TypeError(
                f"{where}: {label} has dtype {other.dtype.name} {found}; {expected} {leaf.dtype.name} (tfreplay never "
                f"casts silently{cast})."
            )
        if not leaf.shape.is_compatible_with(other.shape):
            raise ValueError(
                f"{where}: {label} has shape {tuple(other.shape)} {found}; {expected} {tuple(leaf.shape)}."
            )


def field(nest: Nest, name: str) -> Nest:
    return nest[name] if isinstance(nest, collections.abc.Mapping) else getattr(nest, name)


def select(where: str, spec: Nest, values: dict) -> Nest:
    """The buffer's items from the default fields, each field packed as its spec is."""

    def pack(name: str) -> Nest:
        by_path = dict(_steps.named_leaves(values[name]))
        spec_field = field(spec, name)
        return tf.nest.pack_sequence_as(spec_field, [by_path[p] for p, _ in _steps.named_leaves(spec_field)])

    packed = {name: pack(name) for name in top_fields(spec, where)}
    return (
        type(spec)(**packed) if hasattr(spec, "_fields") else type(spec)(packed) if type(spec) is not dict else packed
    )


class _Spreader:
    """Writes whole episodes to the segment that has received the fewest items."""

    def __init__(self, buffer: Any):
        door = buffer.front_door
        self.buffer, self.door = buffer, door
        self.ring = not door.capabilities.lockstep  # a NumPy one-ring buffer: add_batch takes any number of rows
        self.by_segment = door.capabilities.appends_per_segment
        self.pending: list[list] = [[] for _ in range(buffer.batch_size)]
        self.received = [0] * buffer.batch_size
        self.num_written = 0
        self.add_rows = _graph_rows_adder(buffer) if door.capabilities.backend == "tf" else None

    def add(self, items: Nest, length: int) -> None:
        if self.ring:
            self.buffer.add_batch(items)
            self.num_written += length
            return
        segment = int(np.argmin(self.received))
        self.received[segment] += length
        if self.by_segment:
            self.door.add_sequence("add_sequence", items, segment)
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
