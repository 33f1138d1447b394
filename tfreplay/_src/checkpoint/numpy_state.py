"""A NumPy buffer's checkpoint state (see `layout.py` for the layout record and the rules).

`NumpyState` saves the arrays as tensors that share their memory (no copy),
and the generator's state and the counters as JSON of plain integers,
checked against the expected structure on restore; nothing is pickled. Its
save and restore are registered with TF's checkpoint saver registry, so the
save holds the buffer's lock while its arrays are written and the restore
copies everything in under it, after checking all of it.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.python.saved_model import registration  # the checkpoint saver registry (TF >= 2.10)

from tfreplay._src.checkpoint.layout import (
    _WHERE,
    _check_field,
    _Record,
    _short,
    check_layout,
    limiter_counts,
    parse_json,
)


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
      check: raises `ValueError` for restored arrays (name -> array) no buffer could hold, before any is copied.
      around_copy: `(before, after)`, called under the lock just before the restored arrays are copied in and
        once everything is in place (a memory-mapped buffer saves its flushed rows, then flushes).
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
        check: Callable[[dict], None] = lambda values: None,
        around_copy: tuple[Callable[[], None], Callable[[], None]] | None = None,
    ):
        self._lock, self._arrays, self._rng, self._layout, self._check = lock, arrays, rng, layout, check
        self._scalars = scalars or dict
        self._restore_scalars = restore_scalars or (lambda _: None)
        self._gate, self._stored = gate, stored
        self._before_copy, self._after_copy = around_copy or (lambda: None, lambda: None)

    def _serialize_to_tensors(self) -> dict:
        """Nothing through TF's tensor path (the registered saver below writes this state). Defined so that
        `assert_existing_objects_matched` counts this state as something to restore: a checkpoint that holds
        none of it then fails that assertion, as a TF buffer's does."""
        return {}

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
        values = {k: np.asarray(src) for k, src in zip(arrays, restored)}  # views of the restored tensors
        self._check(values)
        with self._lock:
            self._before_copy()
            for dst, src in zip(arrays.values(), values.values()):
                dst[...] = src  # one copy, into place
            self._rng.bit_generator.state = rng_state
            self._restore_scalars(scalars)
            if self._gate is not None and self._stored is not None:
                self._gate.restored(counts, self._stored)  # the items are in place: waiters may go
            self._after_copy()


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
