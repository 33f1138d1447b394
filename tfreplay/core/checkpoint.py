"""Buffer checkpoints: a versioned layout record, checked before anything is restored.

`tf.train.Checkpoint(buffer=rb)` saves a buffer under one node. Beside its
state every buffer keeps a *layout record* (`layout()`): the format version,
the storage kind (`rows`, or `frames` with `history_len`), `batch_size`,
`max_length`, `capacity`, the episode index's bins (`index_bins`: the shape
of its per-segment counts; `index_newest`: it keeps each segment's newest
item, which an older index did not), a prioritized buffer's sum-tree layout (`sum_tree`)
and each spec leaf's path, dtype and shape. Restore
compares the saved record with the buffer's own before any array or variable
is overwritten: a mismatch raises `ValueError` naming the field, the saved
value and this buffer's value, and the buffer stays as it was.

* TF buffers keep their rows, counters and generator in `tf.Variable`s, which
  TF saves itself. `LayoutState` adds the record as a `PythonState` (JSON): TF
  restores every `PythonState` of a restore before it assigns any variable, so
  the check comes first.
* NumPy buffers: `NumpyState` saves the arrays as tensors that share the
  arrays' memory (no copy), and the generator's state and the counters as JSON
  of plain integers, checked against the expected structure on restore.
  Nothing is pickled, so an untrusted checkpoint cannot run code. Its save and
  restore are registered with TF's checkpoint saver registry: TF's default
  path gives an object no hook after the write, so the lock could not be held
  across it. Here the write runs inside the save function. **Rule: a save holds
  the buffer's lock while its arrays are written**, so the snapshot is
  consistent while other threads write; adds and samples wait until it is on
  disk. Restore reads and checks everything first, then copies it in under
  the lock (peak memory: the buffer plus the saved arrays).
* `RestoreGuard`, a base of every buffer, saves the record first among the
  buffer's children and refuses, during restore, a saved child this buffer
  does not have (a checkpoint of another buffer class or library) or state
  that comes without a record (written before format 1): a foreign checkpoint
  under the buffer's key raises instead of leaving the buffer empty.

The record written also carries the rate limiter's counts (`rate_limiter`:
`{"inserts", "samples", "size"}`, or null without a limiter; see
`core/rate_limiter.py`). They are no layout field: any buffer restores them
(one without a limiter drops them), they are checked with the record (plain
non-negative integers, `size` at most `inserts` and the capacity) and put
back once the items are: a NumPy buffer's in the same locked copy, a TF
buffer's by the record's `after_restore` child, whose registered restore TF
runs after every variable. A record without the entry (a tfreplay before it)
restores by the limiter's rule for checkpoints without counts.

Format 1 is the first versioned one: older tfreplay checkpoints are refused.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.python.saved_model import registration  # the checkpoint saver registry (TF >= 2.10)

from tfreplay.core import episodes, specs
from tfreplay.core.after_restore import AfterRestore
from tfreplay.core.specs import Nest

FORMAT_VERSION = 1
_WHERE = "checkpoint restore"
_FIELDS = ("storage", "history_len", "batch_size", "max_length", "capacity", "index_bins", "sum_tree")


def layout(data_spec: Nest, batch_size: int, max_length: int, history_len: int | None = None) -> dict:
    """The layout record of a buffer: what a checkpoint must match to restore into it.

    Args:
      data_spec: the buffer's (normalized) spec of one item or row.
      batch_size, max_length: segments and rows per segment.
      history_len: frames per stack, for a frame buffer; `None` for rows.
    """
    leaves = {
        path: {"dtype": spec.dtype.name, "shape": spec.shape.as_list()}
        for path, spec in zip(specs.leaf_paths(data_spec), tf.nest.flatten(data_spec))
    }
    return {
        "format": FORMAT_VERSION,
        "storage": "rows" if history_len is None else "frames",
        "history_len": history_len,
        "batch_size": int(batch_size),
        "max_length": int(max_length),
        "capacity": int(batch_size) * int(max_length),
        "index_bins": episodes.POS_BINS,
        "leaves": leaves,
    }


def check_layout(saved: Any, expected: dict) -> None:
    """Raises `ValueError` naming the first field where `saved` differs from `expected`."""
    if not isinstance(saved, dict) or "format" not in saved:
        raise ValueError(
            f"{_WHERE}: the checkpoint's layout record ({_short(saved)}) must be a tfreplay layout record."
        )
    if not _same(saved["format"], FORMAT_VERSION):
        raise ValueError(
            f"{_WHERE}: the checkpoint's format ({_short(saved['format'])}) must be {FORMAT_VERSION}; "
            "it was written by another tfreplay version."
        )
    for field in _FIELDS:
        _check_field(field, saved.get(field), expected.get(field))
    leaves = saved.get("leaves")
    _check_field("leaves", list(leaves) if isinstance(leaves, dict) else leaves, list(expected["leaves"]))
    assert isinstance(leaves, dict)  # the check above compared its keys
    for path, want in expected["leaves"].items():
        got = leaves[path] if isinstance(leaves[path], dict) else {}
        for key in ("dtype", "shape"):
            _check_field(f"{key} of {path}", got.get(key), want[key])
    if expected.get("index_newest") and "index_newest" not in saved:  # last: everything else matches
        raise ValueError(
            f"{_WHERE}: the checkpoint's episode index must keep each segment's newest item (index_newest); "
            "it was written by an earlier tfreplay, whose index lacks it. Restore it with that version, or "
            "refill the buffer."
        )
    _check_field("index_newest", saved.get("index_newest"), expected.get("index_newest"))


def limiter_counts(saved: Any, capacity: int) -> dict[str, int] | None:
    """A checked record's rate limiter counts (None: saved without them); `ValueError` unless well-formed."""
    counts = saved.get("rate_limiter")
    if counts is None:
        return None
    keys = ("inserts", "samples", "size")
    ok = isinstance(counts, dict) and sorted(counts) == sorted(keys)
    ok = ok and all(isinstance(counts[k], int) and not isinstance(counts[k], bool) and counts[k] >= 0 for k in keys)
    if not (ok and counts["size"] <= min(counts["inserts"], capacity)):
        raise ValueError(
            f"{_WHERE}: the checkpoint's rate_limiter counts ({_short(counts)}) must be an object with exactly "
            f'"inserts", "samples" and "size", non-negative integers with size at most inserts and the capacity '
            f"({capacity}); it was altered or written by another library."
        )
    return {k: counts[k] for k in keys}


def _check_field(field: str, saved: Any, mine: Any) -> None:
    if not _same(saved, mine):
        raise ValueError(
            f"{_WHERE}: the checkpoint's {field} ({_short(saved)}) must equal this buffer's ({_short(mine)}); "
            "restore into a buffer built with the checkpoint's layout."
        )


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON, so `True` is not `1` and `1.0` is not `1`."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (bytes, str)) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_json(value: Any, what: str) -> Any:
    """Parses a saved JSON string; anything else (a pickle, say) is a `ValueError`, never executed."""
    try:
        return json.loads(value)
    except (TypeError, ValueError, RecursionError) as err:
        raise ValueError(
            f"{_WHERE}: the checkpoint's {what} ({_short(value)}) must be JSON written by tfreplay ({err})."
        ) from None


class _Record:
    """What `RestoreGuard` looks for among a buffer's children: the holder of its layout record."""

    _layout: dict
    # The restore (Trackable update uid) in which the buffer looked this record up.
    _restoring: int | None = None


class LayoutState(_Record, tf.train.experimental.PythonState):
    """A TF buffer's layout record and limiter counts, saved as JSON and checked before its variables restore.

    Args:
      layout: `layout(...)` of the buffer.
      gate: the buffer's `Gate` (its limiter's counts); None: no counts.
      stored: returns how many items the buffer stores (read after a restore).
    """

    def __init__(self, layout: dict, gate: Any = None, stored: Callable[[], Any] | None = None):
        self._layout, self._gate, self._stored = layout, gate, stored
        self._staged: list = []  # the checked counts of a restore, until its variables are in place
        self._after_restore = AfterRestore(self._apply)

    def _trackable_children(self, save_type: Any = "checkpoint", **kwargs: Any) -> dict:
        children = super()._trackable_children(save_type, **kwargs)
        return {**children, "after_restore": self._after_restore} if self._gate is not None else children

    def _serialize_to_tensors(self) -> dict:
        """As `PythonState`'s, but in a `tf.function` the record is read when the save runs, not when it is
        traced (the counts move between saves)."""
        if not tf.inside_function():
            return super()._serialize_to_tensors()
        value = tf.py_function(lambda: tf.constant(self.serialize()), [], tf.string)
        return {"py_state": tf.ensure_shape(value, [])}  # PythonState's key

    def serialize(self) -> str:
        counts = None if self._gate is None else self._gate.counts()
        return json.dumps({**self._layout, "rate_limiter": counts})

    def deserialize(self, string_value: Any) -> None:
        record = parse_json(string_value, "layout record")
        check_layout(record, self._layout)
        counts = limiter_counts(record, self._layout["capacity"])
        if self._gate is None:
            return
        if not tf.compat.v1.executing_eagerly_outside_functions():
            # A v1 graph: a session restores the variables later and runs no registered restore. The counts
            # go in now; without them the limiter keeps its own (the items are not there to count).
            if counts is not None:
                self._gate.restored(counts, self._stored)
            return
        self._staged[:] = [counts]
        if "rate_limiter" not in record:  # written before the counts, so without `after_restore` either
            self._gate.restored(None, self._stored, later=True)

    def _apply(self) -> None:
        if self._staged:
            self._gate.restored(self._staged.pop(), self._stored)


class NumpyState(_Record, tf.__internal__.tracking.Trackable):
    """A NumPy buffer's checkpoint state: arrays, generator, counters and layout record.

    Args:
      lock: the buffer's lock; held while the arrays are written to disk and
        while restored state is copied in.
      arrays: returns the arrays to save by name; restore copies into them in
        place (so they keep their identity).
      rng: the buffer's generator; its `bit_generator.state` is saved as JSON.
      layout: `layout(...)` of the buffer.
      scalars: returns plain integer counters by name (optional).
      restore_scalars: puts restored counters back (optional).
      gate: the buffer's `Gate`, whose limiter counts are saved and restored (optional).
      stored: returns how many items the buffer stores (read after the copy).
    """

    def __init__(
        self,
        lock: threading.Lock,
        arrays: Callable[[], dict[str, np.ndarray]],
        rng: np.random.Generator,
        *,
        layout: dict,
        scalars: Callable[[], dict[str, int]] | None = None,
        restore_scalars: Callable[[dict[str, int]], None] | None = None,
        gate: Any = None,
        stored: Callable[[], int] | None = None,
    ):
        self._lock, self._arrays, self._rng, self._layout = lock, arrays, rng, layout
        self._scalars = scalars or dict
        self._restore_scalars = restore_scalars or (lambda _: None)
        self._gate, self._stored = gate, stored

    def _write(self, prefix: tf.Tensor, name: str) -> None:
        """Writes one shard at `prefix`, holding the lock until the arrays are on disk."""
        with self._lock:
            tensors = {
                "layout": tf.constant(json.dumps({**self._layout, "rate_limiter": self._counts()})),
                "rng": tf.constant(json.dumps(_plain(self._rng.bit_generator.state))),
                "scalars": tf.constant(json.dumps(_plain(self._scalars()))),
            }
            tensors.update({f"array/{k}": _shared_tensor(a) for k, a in self._arrays().items()})
            keys = [_key(name, k) for k in tensors]
            tf.raw_ops.SaveV2(
                prefix=prefix, tensor_names=keys, shape_and_slices=[""] * len(keys), tensors=list(tensors.values())
            )

    def _counts(self) -> dict | None:
        return None if self._gate is None else self._gate.counts()

    def _read(self, path: str, name: str) -> None:
        """Checks everything the checkpoint holds for this buffer, then copies it in under the lock."""
        reader = tf.train.load_checkpoint(path)
        dtypes, shapes = reader.get_variable_to_dtype_map(), reader.get_variable_to_shape_map()
        entries = {k[len(_key(name, "")) :] for k in dtypes if k.startswith(_key(name, ""))}

        def json_entry(entry: str, what: str) -> Any:
            key = _key(name, entry)
            return parse_json(reader.get_tensor(key) if dtypes.get(key) == tf.string else None, what)

        record = json_entry("layout", "layout record") if "layout" in entries else None
        check_layout(record, self._layout)
        counts = limiter_counts(record, self._layout["capacity"])
        arrays = self._arrays()
        wanted = {"layout", "rng", "scalars"} | {f"array/{k}" for k in arrays}
        if entries != wanted:
            raise ValueError(
                f"{_WHERE}: the checkpoint's entries for this buffer ({sorted(entries)}) must be {sorted(wanted)}; "
                "it was written by another buffer or tfreplay version."
            )
        rng_state = _rng_state(json_entry("rng", "rng state"), self._rng)
        scalars = _like(json_entry("scalars", "counters"), self._scalars(), "counters")
        for k, array in arrays.items():
            saved = [dtypes[_key(name, f"array/{k}")].name, shapes[_key(name, f"array/{k}")]]
            _check_field(f"array {k}", saved, [tf.as_dtype(array.dtype).name, list(array.shape)])
        restored = tf.raw_ops.RestoreV2(
            prefix=path,
            tensor_names=[_key(name, f"array/{k}") for k in arrays],
            shape_and_slices=[""] * len(arrays),
            dtypes=[tf.as_dtype(a.dtype) for a in arrays.values()],
        )
        with self._lock:
            for dst, src in zip(arrays.values(), restored):
                dst[...] = np.asarray(src)  # a view of the restored tensor: one copy, into place
            self._rng.bit_generator.state = rng_state
            self._restore_scalars(scalars)
            if self._gate is not None and self._stored is not None:
                self._gate.restored(counts, self._stored)  # the items are in place: waiters may go


def _key(name: str, entry: str) -> str:
    return f"{name}/.ATTRIBUTES/{entry}"


def _shared_tensor(array: np.ndarray) -> tf.Tensor:
    """`array` as a CPU tensor sharing its memory (through DLPack); a copy where DLPack cannot export it.

    `tf.convert_to_tensor` copies (measured: TF 2.21, NumPy 2.4, every dtype).
    """
    try:
        return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    except (AttributeError, BufferError, TypeError, ValueError, RuntimeError, tf.errors.OpError):
        return tf.convert_to_tensor(array)


def _plain(value: Any) -> Any:
    """A generator state or counters as JSON-ready ints, strings, lists and dicts."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.reshape(-1).tolist()
    if isinstance(value, (np.integer, int)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        return value
    raise TypeError(f"checkpoint: state value ({value!r}) must be an int, str, integer array or dict of them.")


def _like(saved: Any, template: Any, field: str) -> Any:
    """`saved` (parsed JSON) in the form of `template`; `ValueError` unless it has exactly that structure.

    A generator's state and the counters are non-negative integers (and the
    generator's name): nothing else passes, whatever a checkpoint holds.
    """

    def refuse() -> ValueError:
        return ValueError(
            f"{_WHERE}: the checkpoint's {field} ({_short(saved)}) must have the form of this buffer's "
            f"({_short(_plain(template))}): plain non-negative integers only."
        )

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if isinstance(template, dict):
        if not isinstance(saved, dict) or sorted(saved) != sorted(str(k) for k in template):
            raise refuse()
        return {k: _like(saved[str(k)], v, f"{field}/{k}") for k, v in template.items()}
    if isinstance(template, np.ndarray):
        if not isinstance(saved, list) or len(saved) != template.size or not all(is_int(v) for v in saved):
            raise refuse()
        try:
            return np.array(saved, dtype=template.dtype).reshape(template.shape)
        except OverflowError:
            raise refuse() from None
    if isinstance(template, str):
        if saved != template:
            raise refuse()
        return saved
    if not is_int(saved):
        raise refuse()
    return saved


def _rng_state(saved: Any, rng: np.random.Generator) -> dict:
    """The saved generator state, checked by setting it on a fresh bit generator of the same kind."""
    state = _like(saved, rng.bit_generator.state, "rng state")
    try:
        type(rng.bit_generator)().state = state
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(
            f"{_WHERE}: the checkpoint's rng state must be a valid {type(rng.bit_generator).__name__} state ({err})."
        ) from None
    return state


def _save_all(trackables: dict[str, NumpyState], file_prefix: tf.Tensor) -> list[tf.Tensor]:
    """Registered save: one shard per buffer, each written under that buffer's lock.

    In a graph (a `tf.function`, or the saver a SavedModel traces) the write
    is a `tf.py_function` that runs when the graph does.
    """
    states = list(trackables.items())
    prefixes = [tf.strings.join([file_prefix, f"_{i}"]) for i in range(len(states))]

    def write(*values: tf.Tensor) -> bool:
        for (name, state), prefix in zip(states, values):
            state._write(prefix, name)
        return True

    if tf.executing_eagerly():
        write(*prefixes)
        return prefixes
    written = tf.py_function(write, prefixes, Tout=tf.bool)
    with tf.control_dependencies([written]):
        return [tf.identity(p) for p in prefixes]


def _restore_all(trackables: dict[str, NumpyState], merged_prefix: tf.Tensor) -> Any:
    """Registered restore: each buffer checks its entries, then copies them in (in a graph, when it runs)."""

    def read(prefix: tf.Tensor) -> bool:
        for name, state in trackables.items():
            state._read(prefix.numpy().decode(), name)
        return True

    if tf.executing_eagerly():
        return read(merged_prefix)
    return tf.py_function(read, [merged_prefix], Tout=tf.bool)


registration.register_checkpoint_saver(
    package="tfreplay",
    name="NumpyState",
    predicate=lambda x: isinstance(x, NumpyState),
    save_fn=_save_all,
    restore_fn=_restore_all,
)


# What TF-Agents' replay buffers save under their key (TFUniformReplayBuffer; PyUniformReplayBuffer).
TF_AGENTS_STATE = frozenset({"_data_spec", "_data_table", "_id_table", "_last_id", "_np_state", "_storage"})
TF_AGENTS_HINT = (
    " It looks like a TF-Agents replay buffer's checkpoint: load a TFUniformReplayBuffer's with "
    "tfreplay.compat.tf_agents.restore_tf_agents_checkpoint(buffer, path)."
)


class RestoreGuard:
    """Base of a buffer (a `tf.Module`) whose checkpoint holds a `LayoutState` or `NumpyState` child.

    Saves that child first, and while TF matches saved children to the
    buffer's during a restore (before restoring any of them), refuses a saved
    child the buffer does not have, or the buffer's state before its record.
    A buffer without such a child restores as TF does.
    """

    def _trackable_children(self, save_type: Any = "checkpoint", **kwargs: Any) -> dict:
        children = super()._trackable_children(save_type, **kwargs)  # type: ignore[misc]
        return {**{k: v for k, v in children.items() if isinstance(v, _Record)}, **children}

    def _lookup_dependency(self, name: str, cached_dependencies: dict | None = None) -> Any:
        found = super()._lookup_dependency(name, cached_dependencies)  # type: ignore[misc]
        if cached_dependencies is None:  # tracking a new attribute, not matching a checkpoint
            return found
        record = next((c for c in cached_dependencies.values() if isinstance(c, _Record)), None)
        if record is None:
            return found
        where, restore = type(self).__name__, self._update_uid  # type: ignore[attr-defined]
        if found is None:
            raise ValueError(
                f"{_WHERE}: the checkpoint's buffer state {name!r} must be one of this {where}'s "
                f"({sorted(cached_dependencies)}); the checkpoint holds no {where} state of tfreplay "
                f"format {FORMAT_VERSION} under this key (another buffer class or library wrote it)."
                + (TF_AGENTS_HINT if name in TF_AGENTS_STATE else "")
            )
        if found is record:
            record._restoring = restore
        elif record._restoring != restore:
            raise ValueError(
                f"{_WHERE}: the checkpoint's buffer state ({name!r}) must come with a tfreplay layout record; "
                f"it was written before checkpoint format {FORMAT_VERSION} or by another library."
            )
        return found
