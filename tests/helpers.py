"""Helpers shared by the test files: items that carry their id, plain Python models, adapters.

Test files import from here (`from helpers import ...`), never from `conftest`
or from each other; `conftest.py` holds only fixtures.

* Uniform items (`SPEC`, `make_items`, `decode`): every leaf encodes the item's
  global id, so a sample is checked by value and a torn item shows.
* Frame rows (`id_frames`, `contract_rows`, `make_stream`) and `Reference`, a
  model of frame replay that stacks frames from the whole stream.
* `Kind`: how the contract suite drives one buffer class (items, decoding,
  which ids may be drawn, the documented sample spec); `KINDS` has all eight
  public buffers (uniform, frame, prioritized and prioritized frame; TF and NumPy),
  and the four NumPy ones again with their items in memory-mapped files (`storage_dir`).
* `Api`: one buffer's methods eagerly, inside `tf.function`, or through
  `as_dataset` (`MODES`); it returns NumPy.
* `quick`: which cases of a large parametrized matrix `make test` runs; the
  others are marked `slow`, so `make test-slow` runs the rest of the matrix.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import math  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfreplay import (  # noqa: E402
    BufferInfo,
    PyFrameReplayBuffer,
    PyPrioritizedFrameReplayBuffer,
    PyPrioritizedReplayBuffer,
    PyUniformReplayBuffer,
    TFFrameReplayBuffer,
    TFPrioritizedFrameReplayBuffer,
    TFPrioritizedReplayBuffer,
    TFUniformReplayBuffer,
    frame_data_spec,
    native,
)

# --- uniform items ------------------------------------------------------------------

# The contract spec: nested, mixed dtypes. Every leaf of an item carries the
# same integer (by default the item's global id), so a sample is checked by
# value and an item torn between two rows shows as leaves that disagree.
SPEC = {
    "obs": {"pixels": tf.TensorSpec([4, 4], tf.uint8), "vec": tf.TensorSpec([3], tf.float32)},
    "action": tf.TensorSpec([], tf.int32),
    "done": tf.TensorSpec([], tf.bool),
    "id": tf.TensorSpec([], tf.int64),
}


def quick(values, *kept, unpack: bool = False) -> list:
    """`values` for `pytest.mark.parametrize`, with every value not in `kept` marked `slow`.

    A matrix test (backends x modes x cases) keeps in `make test` the cases that cover its behaviour on each
    backend once; the rest of the matrix runs in `make test-slow`, and CI runs both lanes. `unpack`: each value
    is a tuple of several arguments (a parametrize of several names).
    """
    missing = [k for k in kept if not any(k is v or k == v for v in values)]
    if missing:
        raise ValueError(f"quick: kept values {missing!r} must be among the parametrized values {values!r}")
    slow = [pytest.mark.slow]
    return [
        v if any(v is k or v == k for k in kept) else pytest.param(*(v if unpack else (v,)), marks=slow) for v in values
    ]


def make_items(values) -> dict:
    """Items whose every leaf encodes `values` (any outer shape, each < 2**22)."""
    values = np.asarray(values, np.int64)
    raw = np.ascontiguousarray(values[..., None]).view(np.uint8)  # 8 little-endian bytes
    pixels = np.concatenate([raw, raw], axis=-1).reshape(values.shape + (4, 4))
    vec = np.stack([values, values, -values], axis=-1).astype(np.float32) + np.float32([0, 0.5, 0])
    return {
        "obs": {"pixels": pixels, "vec": vec},
        "action": values.astype(np.int32),
        "done": values % 2 == 1,
        "id": values,
    }


def decode(items) -> np.ndarray:
    """The values `items` carry, after checking every leaf agrees (no torn item)."""
    items = tf.nest.map_structure(np.asarray, items)
    values = items["id"]
    pixels = items["obs"]["pixels"].reshape(values.shape + (2, 8))
    np.testing.assert_array_equal(pixels[..., 0, :], pixels[..., 1, :])
    np.testing.assert_array_equal(np.ascontiguousarray(pixels[..., 0, :]).view(np.int64)[..., 0], values)
    np.testing.assert_array_equal(items["obs"]["vec"], make_items(values)["obs"]["vec"])
    np.testing.assert_array_equal(items["action"], values.astype(np.int32))
    np.testing.assert_array_equal(items["done"], values % 2 == 1)
    return values


# --- nests --------------------------------------------------------------------------


def to_numpy(nest):
    return tf.nest.map_structure(lambda x: x if isinstance(x, np.ndarray) else np.asarray(x), nest)


def assert_nest_equal(a, b) -> None:
    tf.nest.assert_same_structure(a, b)
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def assert_specs_equal(got, want) -> None:
    """Same structure (and container types), and per leaf the same dtype and fully known shape."""
    tf.nest.assert_same_structure(got, want)
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        assert g.dtype == w.dtype, (g, w)
        assert g.shape.is_fully_defined() and g.shape.as_list() == w.shape.as_list(), (g, w)


def with_outer(spec, outer: list):
    """`spec` with `outer` dimensions in front of every leaf (names dropped)."""
    return tf.nest.map_structure(lambda s: tf.TensorSpec(list(outer) + s.shape.as_list(), s.dtype), spec)


def variables_bytes(rb) -> list:
    """Raw bytes of every variable a TF buffer holds (rows, counter, generator)."""
    return [v.numpy().tobytes() for v in sorted(rb.variables(), key=lambda v: v.name)]


def coverage_draws(num_values: int, failure: float = 1e-9) -> int:
    """Uniform draws after which some of `num_values` values is still missing with
    probability below `failure` (union bound: `num_values * exp(-draws / num_values)`)."""
    return math.ceil(num_values * (math.log(num_values) + math.log(1 / failure)))


def run_threads(targets, timeout: float = 120.0) -> None:
    """Runs each target on its own thread; re-raises the first failure."""
    errors = []

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as err:  # reported on the main thread
                errors.append(err)

        return run

    threads = [threading.Thread(target=guarded(fn), daemon=True) for fn in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


# --- frame rows and the frame reference --------------------------------------------------

FRAME = (2, 3)
EXTRAS = ("action", "reward", "terminated", "truncated")


def frame_of(segment: int, local: np.ndarray) -> np.ndarray:
    """Frames that are never all zero and tell their segment and id."""
    local = np.asarray(local)
    out = np.zeros(local.shape + FRAME, np.uint8)
    out[..., 0, 0] = segment + 1
    out[..., 0, 1] = local % 256
    out[..., 0, 2] = local // 256
    out[..., 1, :] = ((local[..., None] * 7 + segment * 13 + np.arange(3)) % 250 + 1).astype(np.uint8)
    return out


def id_frames(values, shape: tuple) -> np.ndarray:
    """uint8 frames of `shape` (at least 6 pixels) that encode `values` (each < 2**40); never all zero.

    The first pixels hold the little-endian bytes of `value + 1`, the rest a
    pattern of the value, so a frame from the wrong row or a transposed stack shows.
    """
    values = np.asarray(values, np.int64)
    size = math.prod(shape)
    raw = np.ascontiguousarray((values + 1)[..., None]).view(np.uint8)[..., : min(8, size)]
    rest = (values[..., None] * 7 + np.arange(size - raw.shape[-1])) % 251 + 1
    return np.concatenate([raw, rest.astype(np.uint8)], axis=-1).reshape(values.shape + tuple(shape))


def make_stream(rng: np.random.Generator, segment: int, length: int, max_episode: int = 6) -> dict:
    """Rows of one environment: a first frame, then its steps, episode after episode.

    Episodes end terminated, truncated, or (rarely) with no step at all; the
    last one may still be running.
    """
    first, terminated, truncated = [], [], []
    while len(first) < length:
        steps = int(rng.integers(0, max_episode + 1)) if rng.random() < 0.1 else int(rng.integers(1, max_episode + 1))
        end = rng.choice(["terminated", "truncated"])
        first.append(True)
        terminated.append(False)
        truncated.append(False)
        for k in range(1, steps + 1):
            first.append(False)
            terminated.append(k == steps and end == "terminated")
            truncated.append(k == steps and end == "truncated")
    local = np.arange(length)
    first = np.array(first[:length])
    return {
        "frame": frame_of(segment, local),
        "first": first,
        "action": np.where(first, 0, rng.integers(0, 6, length)).astype(np.int32),
        "reward": np.where(first, 0, rng.normal(size=length)).astype(np.float32),
        "terminated": np.array(terminated[:length]),
        "truncated": np.array(truncated[:length]),
    }


def row(streams: list[dict], i: int) -> dict:
    """Row `i` of every stream: one `add_batch` of a frame buffer."""
    return {k: np.stack([s[k][i] for s in streams]) for k in streams[0]}


class Reference:
    """Frame replay as a plain model: the full observation and next-observation stack of every transition.

    Built from each segment's stream since the last clear (streams may differ
    in length), it stacks frames from the whole stream, not from a ring, and
    decides which transitions may be drawn from the frames they show: a
    transition is a row after its episode's first frame; it shows the frames
    `t - history_len .. t`, zeros before the episode's first frame; it may be
    drawn when every frame it shows is still stored. A window of `n` is `n`
    such transitions in a row of one episode.
    """

    def __init__(self, streams: list[dict], max_length: int, history_len: int):
        self.num_segments, self.history_len = len(streams), history_len
        self.frame_shape = tuple(streams[0]["frame"].shape[1:])
        self.keys = ["observation", "next_observation"] + [k for k in streams[0] if k not in ("frame", "first")]
        self.transitions = {}  # global id -> full transition
        self.live = {}  # global id -> whether every frame it shows is still stored
        for s, stream in enumerate(streams):
            n = len(stream["first"])
            oldest = max(0, n - max_length)
            start = 0
            for t in range(n):
                if stream["first"][t]:
                    start = t
                if t == start or t < oldest:
                    continue  # an episode's first frame (or the stream's) is no transition
                shown = [j for j in range(t - history_len, t + 1) if j >= start]
                gid = t * self.num_segments + s
                self.live[gid] = min(shown) >= oldest
                self.transitions[gid] = {
                    "observation": self._stack(stream, start, t - history_len, t),
                    "next_observation": self._stack(stream, start, t - history_len + 1, t + 1),
                    **{k: stream[k][t] for k in stream if k not in ("frame", "first")},
                    "_start": start,
                }

    def _stack(self, stream: dict, start: int, lo: int, hi: int) -> np.ndarray:
        zeros = np.zeros(self.frame_shape, stream["frame"].dtype)
        return np.stack([stream["frame"][j] if j >= start else zeros for j in range(lo, hi)], axis=-1)

    def valid(self, num_steps: int = 1) -> set:
        """Global ids of valid window starts: `num_steps` live transitions of one episode."""
        out = set()
        for gid in self.transitions:
            ids = [gid + k * self.num_segments for k in range(num_steps)]
            if all(self.live.get(i) for i in ids):
                if len({self.transitions[i]["_start"] for i in ids}) == 1:
                    out.add(gid)
        return out

    def in_order(self, num_steps: int = 1) -> list:
        """`valid(num_steps)`, segment by segment, oldest first (`gather_all`'s order)."""
        return sorted(self.valid(num_steps), key=lambda gid: (gid % self.num_segments, gid // self.num_segments))

    def check(self, items: dict, ids: np.ndarray) -> None:
        """Every leaf of `items` equals the transitions of `ids` (any outer shape)."""
        ids = np.asarray(ids)
        assert sorted(items) == sorted(self.keys), (sorted(items), self.keys)
        for key in self.keys:
            got = np.asarray(items[key])
            if ids.size == 0:
                assert got.shape[: ids.ndim] == ids.shape, key
                continue
            want = np.stack([self.transitions[int(i)][key] for i in ids.reshape(-1)]).reshape(got.shape)
            np.testing.assert_array_equal(got, want, err_msg=key)


class XlaStacks:
    """A TF frame buffer whose every call runs (and traces) with the frame-stack op disabled: its samples are
    stacked by XLA, the fallback where the op is not built (`tfreplay.native.disabled`, per thread)."""

    def __init__(self, rb):
        self.rb = rb

    def __getattr__(self, name):
        attr = getattr(self.rb, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            with native.disabled("frame_stack"):
                return attr(*args, **kwargs)

        return call


# --- the contract's adapters ------------------------------------------------------------


class Kind:
    """How the contract suite drives one buffer class.

    The suite adds steps `0, 1, ...` since the last clear; step `k` writes the
    items of global ids `k * batch_size + [0, batch_size)`. An adapter turns
    those ids into an item batch, decodes a sample back to its ids (checking
    every leaf by value), and models which window starts may be drawn.
    """

    name: str
    cls: type
    is_tf: bool
    data_spec: dict  # the spec of the rows `items` makes
    history_len = None
    prioritized = False  # has `update_priorities`; before any update every valid window is equally likely
    window = 2  # the `num_steps` the suite draws windows of (the longest a prioritized frame buffer allows is 1)
    has_stateful_dataset = True  # takes `stateful_dataset`
    # Leaves the bad-batch cases mutate: (float32 leaf, shaped leaf, top-level key to drop).
    float_leaf: str
    shaped_leaf: str
    dropped_key: str

    def __init__(self, name: str, cls: type):
        self.name, self.cls, self.is_tf = name, cls, cls.__name__.startswith("TF")

    def __repr__(self) -> str:
        return self.name

    def make(self, batch_size: int, max_length: int, seed: int | None = 0, data_spec=None, **kwargs):
        """A new buffer of this class (`data_spec` defaults to the adapter's)."""
        raise NotImplementedError

    def items(self, ids: np.ndarray, batch_size: int) -> dict:
        raise NotImplementedError

    def decode(self, items, batch_size: int) -> np.ndarray:
        raise NotImplementedError

    def item_spec(self):
        """The documented spec of one sampled item (before outer dimensions)."""
        raise NotImplementedError

    def valid_starts(self, batch_size: int, max_length: int, num_adds: int, num_steps: int | None) -> list:
        raise NotImplementedError

    def all_ids(self, batch_size: int, max_length: int, num_adds: int) -> np.ndarray:
        """Ids of what `gather_all` returns, in its documented layout."""
        raise NotImplementedError

    def max_window(self, max_length: int) -> int:
        raise NotImplementedError

    def empty_message(self, num_steps: int | None, where: str = "get_next") -> str:
        """The refusal of a sample with nothing to draw, by `where` (`as_dataset` when an iterator starts)."""
        raise NotImplementedError

    def too_long_message(self, where: str, num_steps: int, max_length: int) -> str:
        """The refusal of `num_steps` one longer than the longest window (`max_window`), called at `where`."""
        raise NotImplementedError

    def from_single_pass(self, stacked, batch_size: int):
        """The single pass's elements (stacked) in `gather_all`'s layout."""
        return stacked


class UniformKind(Kind):
    """The uniform ring over `SPEC`: `gather_all` is `[batch_size, time, ...]`, oldest first."""

    float_leaf, shaped_leaf, dropped_key = "obs/vec", "obs/pixels", "done"
    data_spec = SPEC

    def make(self, batch_size, max_length, seed=0, data_spec=None, **kwargs):
        spec = self.data_spec if data_spec is None else data_spec
        return self.cls(spec, batch_size=batch_size, max_length=max_length, seed=seed, **kwargs)

    def items(self, ids, batch_size):
        return make_items(ids)

    def decode(self, items, batch_size):
        return decode(items)

    def item_spec(self):
        return SPEC

    def valid_starts(self, batch_size, max_length, num_adds, num_steps):
        first, last = max(0, num_adds - max_length), num_adds - (num_steps or 1)
        return sorted(t * batch_size + s for t in range(first, last + 1) for s in range(batch_size))

    def all_ids(self, batch_size, max_length, num_adds):
        local = np.arange(max(0, num_adds - max_length), num_adds)
        return local[None, :] * batch_size + np.arange(batch_size)[:, None]

    def max_window(self, max_length):
        return max_length

    def empty_message(self, num_steps, where="get_next"):
        if (num_steps or 1) == 1:
            return f"{where}: the buffer is empty; add items before sampling"
        return rf"{where}: no segment holds {num_steps} consecutive items yet \(num_steps={num_steps}\)"

    def too_long_message(self, where, num_steps, max_length):
        return rf"{where}: num_steps \({num_steps}\) must be at most max_length \({max_length}\)"

    def from_single_pass(self, stacked, batch_size):
        return tf.nest.map_structure(lambda x: x.reshape((batch_size, -1) + x.shape[1:]), stacked)


# Contract frame streams: a first frame every EPISODE rows (episodes of 4
# steps), frames and extras that encode the row's global id.
CONTRACT_FRAME = (4, 5)
CONTRACT_HISTORY = 3
EPISODE = 5


def contract_rows(local, segment, batch_size: int) -> dict:
    """Frame-buffer rows at local ids `local` of `segment` (arrays of one shape)."""
    local, segment = np.broadcast_arrays(np.asarray(local, np.int64), np.asarray(segment, np.int64))
    ids = local * batch_size + segment
    return {
        "frame": id_frames(ids, CONTRACT_FRAME),
        "first": local % EPISODE == 0,
        "action": ids.astype(np.int32),
        "reward": ids.astype(np.float32) + np.float32(0.5),
        "terminated": ids % 2 == 1,
        "truncated": ids % 3 == 0,
    }


def contract_reference(batch_size: int, num_rows: int, max_length: int = 10**9) -> Reference:
    streams = [contract_rows(np.arange(num_rows), s, batch_size) for s in range(batch_size)]
    return Reference(streams, max_length, CONTRACT_HISTORY)


class FrameKind(Kind):
    """Frame replay over `contract_rows`: `gather_all` is `[num_transitions, ...]`, segment by segment."""

    history_len = CONTRACT_HISTORY
    float_leaf, shaped_leaf, dropped_key = "reward", "frame", "terminated"
    data_spec = frame_data_spec(CONTRACT_FRAME)

    def make(self, batch_size, max_length, seed=0, data_spec=None, **kwargs):
        spec = self.data_spec if data_spec is None else data_spec
        kwargs.update(history_len=self.history_len, seed=seed)
        if self.is_tf:
            return self.cls(spec, batch_size, max_length, **kwargs)
        return self.cls(spec, batch_size=batch_size, max_length=max_length, **kwargs)

    def items(self, ids, batch_size):
        ids = np.asarray(ids, np.int64)
        return contract_rows(ids // batch_size, ids % batch_size, batch_size)

    def decode(self, items, batch_size):
        items = tf.nest.map_structure(np.asarray, items)
        ids = items["action"].astype(np.int64)
        if ids.size:
            contract_reference(batch_size, int(ids.max()) // batch_size + 1).check(items, ids)
        return ids

    def item_spec(self):
        stack = tf.TensorSpec(list(CONTRACT_FRAME) + [self.history_len], tf.uint8)
        extras = {k: v for k, v in self.data_spec.items() if k not in ("frame", "first")}
        return {"observation": stack, "next_observation": stack, **extras}

    def valid_starts(self, batch_size, max_length, num_adds, num_steps):
        return sorted(contract_reference(batch_size, num_adds, max_length).valid(num_steps or 1))

    def all_ids(self, batch_size, max_length, num_adds):
        return np.array(contract_reference(batch_size, num_adds, max_length).in_order(), np.int64)

    def max_window(self, max_length):
        return max_length - 1

    def empty_message(self, num_steps, where="get_next"):
        if (num_steps or 1) == 1:
            return f"{where}: the buffer holds no valid transition yet"
        return f"{where}: the buffer holds no valid window of {num_steps} transitions of one episode yet"

    def too_long_message(self, where, num_steps, max_length):
        return rf"{where}: num_steps \({num_steps}\) must be at most max_length - 1 \({max_length - 1}\)"


class PrioritizedKind(UniformKind):
    """Prioritized replay over `SPEC`: the uniform ring's layout; new items enter at priority 1 until an update."""

    prioritized = True

    def __init__(self, name: str, cls: type):
        super().__init__(name, cls)
        self.has_stateful_dataset = self.is_tf  # PyPrioritizedReplayBuffer takes no `stateful_dataset`


class PrioritizedFrameKind(FrameKind):
    """Prioritized frame replay: transitions only, `num_steps` None or 1."""

    prioritized = True
    window = 1

    def max_window(self, max_length):
        return 1

    def too_long_message(self, where, num_steps, max_length):
        # Not `{where}: `: the refusal names the sampler (PrioritizedSampler), unlike the call's other checks.
        return rf"num_steps \({num_steps}\) must be None or 1 when windows stay inside episodes"


class MemmapKind:
    """A NumPy kind whose buffers keep their items in memory-mapped files, each in its own new directory."""

    def make(self, batch_size, max_length, seed=0, data_spec=None, **kwargs):
        kwargs.setdefault("storage_dir", tempfile.mkdtemp(dir=_NEW_STATES.name))
        return super().make(batch_size, max_length, seed, data_spec, **kwargs)


class UniformMemmapKind(MemmapKind, UniformKind):
    pass


class PrioritizedMemmapKind(MemmapKind, PrioritizedKind):
    pass


class FrameMemmapKind(MemmapKind, FrameKind):
    pass


class PrioritizedFrameMemmapKind(MemmapKind, PrioritizedFrameKind):
    pass


KINDS = {
    "tf-uniform": UniformKind("tf-uniform", TFUniformReplayBuffer),
    "py-uniform": UniformKind("py-uniform", PyUniformReplayBuffer),
    "tf-frame": FrameKind("tf-frame", TFFrameReplayBuffer),
    "py-frame": FrameKind("py-frame", PyFrameReplayBuffer),
    "tf-prioritized": PrioritizedKind("tf-prioritized", TFPrioritizedReplayBuffer),
    "py-prioritized": PrioritizedKind("py-prioritized", PyPrioritizedReplayBuffer),
    "tf-prioritized-frame": PrioritizedFrameKind("tf-prioritized-frame", TFPrioritizedFrameReplayBuffer),
    "py-prioritized-frame": PrioritizedFrameKind("py-prioritized-frame", PyPrioritizedFrameReplayBuffer),
    "py-uniform-memmap": UniformMemmapKind("py-uniform-memmap", PyUniformReplayBuffer),
    "py-prioritized-memmap": PrioritizedMemmapKind("py-prioritized-memmap", PyPrioritizedReplayBuffer),
    "py-frame-memmap": FrameMemmapKind("py-frame-memmap", PyFrameReplayBuffer),
    "py-prioritized-frame-memmap": PrioritizedFrameMemmapKind(
        "py-prioritized-frame-memmap", PyPrioritizedFrameReplayBuffer
    ),
}
# A buffer's own kind (the memmap kinds share their classes with the in-RAM ones).
_KIND_OF_CLASS = {kind.cls: kind for name, kind in KINDS.items() if not name.endswith("-memmap")}

_SHARED: dict = {}  # (kind, batch_size, max_length) -> (buffer, its checkpoint, the path of its new state)
_APIS: dict = {}
_NEW_STATES = tempfile.TemporaryDirectory(prefix="tfreplay-tests-")  # removed when the session ends


def shared_buffer(kind: Kind, batch_size: int, max_length: int):
    """One buffer per kind and layout, put back for each caller into the state it had when new.

    TF buffers compile their draws per sample shape on first use (a second or
    so each for frames): sharing one buffer keeps that to once per session.
    The checkpoint of its new state (empty, counters at zero, the generator at
    seed 0, no priority given yet) is restored for each caller, so every test
    sees the same seeded draws whichever tests ran before it.
    """
    key = (kind.name, batch_size, max_length)
    if key not in _SHARED:
        rb = kind.make(batch_size, max_length, seed=0)
        checkpoint = tf.train.Checkpoint(buffer=rb)
        _SHARED[key] = rb, checkpoint, checkpoint.write(os.path.join(_NEW_STATES.name, "-".join(map(str, key))))
    rb, checkpoint, path = _SHARED[key]
    checkpoint.read(path).assert_consumed()
    return rb


def shared_api(kind: Kind, mode: str, batch_size: int, max_length: int) -> Api:
    """An `Api` of `shared_buffer(kind, batch_size, max_length)` in `mode`, shared too, so the functions
    and datasets it traces are traced once per session."""
    rb = shared_buffer(kind, batch_size, max_length)
    key = (kind.name, mode, batch_size, max_length)
    if key not in _APIS:
        _APIS[key] = Api(rb, mode, kind)
    api = _APIS[key]
    api.num_adds, api.static = 0, None
    return api


# --- one API over modes ------------------------------------------------------------------

MODES = ("eager", "function", "dataset")


class Api:
    """Calls one buffer's methods in one mode; returns NumPy.

    Modes:
      eager: the methods themselves.
      function: inside `tf.function`. The NumPy twins have no graph mode for
        `add_batch`/`gather_all`/`clear` (they store values), so those stay
        eager; their samples are read from `as_dataset` inside the function,
        the only way a NumPy twin's sample reaches a graph.
      dataset: samples from an `as_dataset(...)` iterator, `gather_all` from
        the single deterministic pass; writes stay eager.

    `error` is what a check only the running graph can make (an empty buffer)
    raises in this mode; `where` names the entry point that checks sample
    arguments. `add_steps` appends items carrying their global ids. `static`
    holds the graph's static spec of the last sample (not in eager mode).
    `True`/`False` for `mode` mean "function"/"eager".
    """

    def __init__(self, rb, mode="eager", kind: Kind | None = None):
        if isinstance(mode, bool):
            mode = "function" if mode else "eager"
        assert mode in MODES, mode
        self.rb, self.mode = rb, mode
        self.kind = kind or _KIND_OF_CLASS.get(type(rb)) or KINDS["py-uniform"]
        self.in_function = mode == "function" and self.kind.is_tf  # writes and reads traced
        self.via_dataset = mode == "dataset" or (mode == "function" and not self.kind.is_tf)
        self.error = ValueError if mode == "eager" else tf.errors.InvalidArgumentError
        self.where = "as_dataset" if self.via_dataset else "get_next"
        self.num_adds = 0  # add_batch calls since the last clear
        self.static = None
        self._fns = {}

    def _call(self, name, *args, **kwargs):
        method = getattr(self.rb, name)
        if not self.in_function:
            return method(*args, **kwargs)
        key = (name, repr(sorted(kwargs.items())))  # repr: 2.0 == 2 and True == 1 trace apart
        if key not in self._fns:
            self._fns[key] = tf.function(lambda *a: method(*a, **kwargs))
        return self._fns[key](*args)

    def add_batch(self, items):
        out = self._call("add_batch", items)
        self.num_adds += 1
        return out

    def add_steps(self, num_steps: int) -> None:
        batch_size = self.rb.batch_size
        for _ in range(num_steps):
            self.add_batch(self.kind.items(self.num_adds * batch_size + np.arange(batch_size), batch_size))

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        if self.via_dataset:
            if num_steps is not None and not time_stacked:
                pytest.skip("as_dataset has no time_stacked: its windows are always stacked on a time axis")
            items, info = self._from_dataset(sample_batch_size, num_steps)
        elif self.in_function:
            items, info = self._traced_sample(sample_batch_size, num_steps, time_stacked)
        else:
            items, info = self.rb.get_next(sample_batch_size, num_steps, time_stacked)
        return to_numpy(items), BufferInfo(*to_numpy(tuple(info)))

    def _traced_sample(self, sample_batch_size, num_steps, time_stacked):
        key = ("get_next", repr((sample_batch_size, num_steps, time_stacked)))
        if key not in self._fns:

            def sample():
                out = self.rb.get_next(sample_batch_size, num_steps, time_stacked)
                self.static = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), out)
                return out

            self._fns[key] = tf.function(sample)
        return self._fns[key]()

    def _from_dataset(self, sample_batch_size, num_steps):
        key = ("dataset", repr((sample_batch_size, num_steps)))
        if key not in self._fns:
            ds = self.rb.as_dataset(sample_batch_size, num_steps)
            read = tf.function(lambda: next(iter(ds))) if self.mode == "function" else lambda: next(iter(ds))
            self._fns[key] = (ds, read)
        ds, read = self._fns[key]
        self.static = ds.element_spec
        return read()  # a fresh iterator: nothing drawn before this call

    def gather_all(self):
        if self.mode != "dataset":
            return to_numpy(self._call("gather_all"))
        if "single_pass" not in self._fns:  # iterated again, the same pass reads the buffer's state then
            self._fns["single_pass"] = self.rb.as_dataset(single_deterministic_pass=True)
        elements = [to_numpy(items) for items, _ in self._fns["single_pass"]]
        if elements:
            stacked = tf.nest.map_structure(lambda *x: np.stack(x), *elements)
        else:
            spec = self.kind.item_spec()
            stacked = tf.nest.map_structure(lambda s: np.zeros([0] + s.shape.as_list(), s.dtype.as_numpy_dtype), spec)
        return self.kind.from_single_pass(stacked, self.rb.batch_size)

    def num_frames(self) -> int:
        return int(self._call("num_frames"))

    def update_priorities(self, ids, priorities) -> int:
        """`update_priorities` (in this mode: inside `tf.function` for a TF buffer); the stale ids' count."""
        return int(self._call("update_priorities", ids, priorities))

    def sampling_mass(self, num_steps=None) -> float:
        return float(self._call("sampling_mass", num_steps=num_steps))

    def clear(self) -> None:
        self._call("clear")
        self.num_adds = 0


def state(api: Api, num_steps=None, sample_batch_size: int = 7):
    """Everything observable: contents, count, the sampling mass (a prioritized buffer's summed priorities),
    and the next seeded sample."""
    window = None if api.num_frames() == 0 else num_steps
    sample = None
    if api.num_frames():
        sample = api.get_next(sample_batch_size, num_steps=window)
    mass = np.float64(api.rb.sampling_mass()) if hasattr(api.rb, "sampling_mass") else None
    return api.gather_all(), api.num_frames(), mass, sample


# The uniform variants the older uniform-only tests run over.
VARIANTS = {
    "tf-eager": (TFUniformReplayBuffer, False),
    "tf-function": (TFUniformReplayBuffer, True),
    "py": (PyUniformReplayBuffer, False),
}


def make_buffer(variant: str, batch_size: int, max_length: int, seed: int | None = 0, **kwargs):
    cls, _ = VARIANTS[variant]
    return cls(SPEC, batch_size=batch_size, max_length=max_length, seed=seed, **kwargs)
