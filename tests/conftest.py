"""Shared fixtures: quiet TF logs before TensorFlow is imported."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfreplay import BufferInfo, PyUniformReplayBuffer, TFUniformReplayBuffer  # noqa: E402

# The contract spec: nested, mixed dtypes. Every leaf of an item carries the
# same integer (by default the item's global id), so a sample is checked by
# value and an item torn between two rows shows as leaves that disagree.
SPEC = {
    "obs": {"pixels": tf.TensorSpec([4, 4], tf.uint8), "vec": tf.TensorSpec([3], tf.float32)},
    "action": tf.TensorSpec([], tf.int32),
    "done": tf.TensorSpec([], tf.bool),
    "id": tf.TensorSpec([], tf.int64),
}


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


def to_numpy(nest):
    return tf.nest.map_structure(lambda x: x if isinstance(x, np.ndarray) else np.asarray(x), nest)


class Api:
    """Calls one buffer's methods eagerly or inside `tf.function`; returns NumPy.

    `error` is what a runtime check (an empty buffer) raises in this mode.
    `add_steps` appends items carrying their global ids.
    """

    def __init__(self, rb, in_function: bool):
        self.rb = rb
        self.in_function = in_function
        self.error = tf.errors.InvalidArgumentError if in_function else ValueError
        self.num_adds = 0  # add_batch calls since the last clear
        self._fns = {}

    def _call(self, name, *args, **kwargs):
        method = getattr(self.rb, name)
        if not self.in_function:
            return method(*args, **kwargs)
        key = (name, tuple(sorted(kwargs.items())))
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
            self.add_batch(make_items(self.num_adds * batch_size + np.arange(batch_size)))

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        kwargs = dict(sample_batch_size=sample_batch_size, num_steps=num_steps, time_stacked=time_stacked)
        items, info = self._call("get_next", **kwargs)
        return to_numpy(items), BufferInfo(*to_numpy(tuple(info)))

    def gather_all(self):
        return to_numpy(self._call("gather_all"))

    def num_frames(self) -> int:
        return int(self._call("num_frames"))

    def clear(self) -> None:
        self._call("clear")
        self.num_adds = 0


VARIANTS = {
    "tf-eager": (TFUniformReplayBuffer, False),
    "tf-function": (TFUniformReplayBuffer, True),
    "py": (PyUniformReplayBuffer, False),
}


def make_buffer(variant: str, batch_size: int, max_length: int, seed: int | None = 0, **kwargs):
    cls, _ = VARIANTS[variant]
    return cls(SPEC, batch_size=batch_size, max_length=max_length, seed=seed, **kwargs)


@pytest.fixture(params=sorted(VARIANTS))
def variant(request) -> str:
    """Each buffer class, and the TF one both eagerly and inside tf.function."""
    return request.param


@pytest.fixture(params=["tf", "py"])
def buffer_cls(request):
    """Each buffer class."""
    return {"tf": TFUniformReplayBuffer, "py": PyUniformReplayBuffer}[request.param]


@pytest.fixture
def make_api(variant):
    """`make_api(batch_size, max_length, seed=0, **kwargs)` -> an `Api` for this variant."""

    def make(batch_size: int, max_length: int, seed: int | None = 0, **kwargs) -> Api:
        return Api(make_buffer(variant, batch_size, max_length, seed, **kwargs), VARIANTS[variant][1])

    return make


def state(api: Api, num_steps=None, sample_batch_size: int = 7):
    """Everything observable: contents, count, and the next seeded sample."""
    window = None if api.num_frames() == 0 else num_steps
    sample = None
    if api.num_frames():
        sample = api.get_next(sample_batch_size, num_steps=window)
    return api.gather_all(), api.num_frames(), sample


def assert_nest_equal(a, b) -> None:
    tf.nest.assert_same_structure(a, b)
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def variables_bytes(rb) -> list:
    """Raw bytes of every variable a TF buffer holds (rows, counter, generator)."""
    return [v.numpy().tobytes() for v in sorted(rb.variables, key=lambda v: v.name)]
