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
* NumPy buffers: `NumpyState` (`numpy_state.py`) saves the
  arrays as tensors that share the arrays' memory (no copy), and the
  generator's state and the counters as JSON of plain integers, checked
  against the expected structure on restore. Nothing is pickled, so an
  untrusted checkpoint cannot run code. Its save and restore are registered
  with TF's checkpoint saver registry: TF's default path gives an object no
  hook after the write, so the lock could not be held across it. Here the
  write runs inside the save function. **Rule: a save holds the buffer's
  lock while its arrays are written**, so the snapshot is consistent while
  other threads write; adds and samples wait until it is on disk. Restore
  reads and checks everything first, then copies it in under the lock (peak
  memory: the buffer plus the saved arrays).
* A buffer saves the record first among its children (`record_first`) and
  refuses, during restore, a saved child it does not have (a checkpoint of
  another buffer class or library) or state that comes without a record
  (written before format 1; `guard_lookup`): a foreign checkpoint under the
  buffer's key raises instead of leaving the buffer empty.

The record written also carries the rate limiter's counts (`rate_limiter`:
`{"inserts", "samples", "size"}`, or null without a limiter; see
`rate_limiting/limiter.py`). They are no layout field: any buffer restores them
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
from typing import Any, Callable

import tensorflow as tf

from tfreplay._src import specs
from tfreplay._src.checkpoint.after_restore import AfterRestore
from tfreplay._src.index import episodes
from tfreplay._src.specs import Nest

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


def check_layout(saved: Any, expected: dict, where: str = _WHERE, source: str = "checkpoint") -> None:
    """Raises `ValueError` naming the first field where `saved` differs from `expected` (`where` and `source`
    name the call and what holds the record: a checkpoint, or a storage directory's manifest)."""
    if not isinstance(saved, dict) or "format" not in saved:
        raise ValueError(f"{where}: the {source}'s layout record ({_short(saved)}) must be a tfreplay layout record.")
    if not _same(saved["format"], FORMAT_VERSION):
        raise ValueError(
            f"{where}: the {source}'s format ({_short(saved['format'])}) must be {FORMAT_VERSION}; "
            "it was written by another tfreplay version."
        )
    for field in _FIELDS:
        _check_field(field, saved.get(field), expected.get(field), where, source)
    leaves = saved.get("leaves")
    got_paths = list(leaves) if isinstance(leaves, dict) else leaves
    _check_field("leaves", got_paths, list(expected["leaves"]), where, source)
    assert isinstance(leaves, dict)  # the check above compared its keys
    for path, want in expected["leaves"].items():
        got = leaves[path] if isinstance(leaves[path], dict) else {}
        for key in ("dtype", "shape"):
            _check_field(f"{key} of {path}", got.get(key), want[key], where, source)
    if expected.get("index_newest") and "index_newest" not in saved:  # last: everything else matches
        raise ValueError(
            f"{where}: the {source}'s episode index must keep each segment's newest item (index_newest); "
            "it was written by an earlier tfreplay, whose index lacks it. Restore it with that version, or "
            "refill the buffer."
        )
    _check_field("index_newest", saved.get("index_newest"), expected.get("index_newest"), where, source)


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


def _check_field(field: str, saved: Any, mine: Any, where: str = _WHERE, source: str = "checkpoint") -> None:
    if field == "sum_tree" and (saved is None) != (mine is None):
        _refuse_other_sampler(saved, mine, where, source)
    if not _same(saved, mine):
        raise ValueError(
            f"{where}: the {source}'s {field} ({_short(saved)}) must equal this buffer's ({_short(mine)}); "
            f"{'restore into' if source == 'checkpoint' else 'open it with'} a buffer built with the {source}'s layout."
        )


def _refuse_other_sampler(saved: Any, mine: Any, where: str, source: str) -> None:
    """A uniform buffer's record against a prioritized one's (only a prioritized buffer has a sum tree): the
    refusal names both kinds."""
    kind, this = ("uniform", "prioritized") if saved is None else ("prioritized", "uniform")
    name = "Prioritized" if kind == "prioritized" else "Uniform"
    twins = "PyUniformReplayBuffer" if source != "checkpoint" else "TFUniformReplayBuffer or PyUniformReplayBuffer"
    twins = twins.replace("Uniform", name)
    verb = "Restore it into" if source == "checkpoint" else "Open it with"
    raise ValueError(
        f"{where}: the {source}'s sum_tree ({_short(saved)}) must equal this buffer's ({_short(mine)}): the {source} "
        f"holds a {kind} buffer; this buffer is {this}. {verb} a {kind} buffer of the same layout ({twins}, or the "
        "frame variant), or refill this one."
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

    def __init__(
        self, layout: dict, gate: Any = None, stored: Callable[[], Any] | None = None, commit: Callable = lambda: None
    ):
        self._layout, self._gate, self._stored, self._commit = layout, gate, stored, commit
        self._staged: list = []  # the checked counts of a restore, until its variables are in place
        self.staging: Any = None  # the buffer's `staged.Staging`: its variables' restored tensors, held
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
        elif self.staging is not None and tf.executing_eagerly():  # the hook runs: check everything first
            self.staging.begin()

    def _apply(self) -> None:
        self._commit()  # the variables, checked, then assigned together (raises and assigns none if refused)
        if self._staged:
            self._gate.restored(self._staged.pop(), self._stored)


# What TF-Agents' replay buffers save under their key (TFUniformReplayBuffer; PyUniformReplayBuffer).
TF_AGENTS_STATE = frozenset({"_data_spec", "_data_table", "_id_table", "_last_id", "_np_state", "_storage"})
TF_AGENTS_HINT = (
    " It looks like a TF-Agents replay buffer's checkpoint: load a TFUniformReplayBuffer's with "
    "tfreplay.compat.tf_agents.restore_tf_agents_checkpoint(buffer, path)."
)


def record_first(children: dict) -> dict:
    """A buffer's checkpoint children with its layout record first, so TF restores (and checks) it first."""
    return {**{k: v for k, v in children.items() if isinstance(v, _Record)}, **children}


def guard_lookup(buffer: Any, name: str, found: Any, cached_dependencies: dict | None) -> Any:
    """`found`, the buffer's child for the checkpoint's child `name`, once it passes the checks below.

    While TF matches saved children to the buffer's during a restore (before
    restoring any of them) this refuses a saved child the buffer does not
    have, or the buffer's state before its record: a foreign checkpoint under
    the buffer's key raises instead of leaving the buffer empty. A buffer
    without a record restores as TF does.
    """
    if cached_dependencies is None:  # tracking a new attribute, not matching a checkpoint
        return found
    record = next((c for c in cached_dependencies.values() if isinstance(c, _Record)), None)
    if record is None:
        return found
    where, restore = type(buffer).__name__, buffer._update_uid
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
