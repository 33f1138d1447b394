"""The two workloads of the benchmark: a CartPole-sized and an Atari-sized buffer.

A workload fixes the item spec, the ring's shape (segments x rows per
segment) and the sample shape, and makes the data the benchmark feeds in:
one constant `add_batch` batch and a pool of random windows of storage rows
laid out the way the buffers lay them out (time-major, see `tfreplay/ring.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark configuration.

    Attributes:
      name: the name printed in the tables.
      make_spec: builds the item spec (a flat dict of `tf.TensorSpec`).
      batch_size: parallel environments: segments, and rows per `add_batch`.
      max_length: rows per segment.
      sample_batch_size: windows per `get_next` / dataset element.
      num_steps: items per window.
    """

    name: str
    make_spec: Callable[[], Dict[str, tf.TensorSpec]]
    batch_size: int
    max_length: int
    sample_batch_size: int
    num_steps: int

    @property
    def data_spec(self) -> Dict[str, tf.TensorSpec]:
        return self.make_spec()

    @property
    def capacity(self) -> int:
        """Items the buffer holds."""
        return self.batch_size * self.max_length

    @property
    def items_per_sample(self) -> int:
        """Items one `get_next` (or one dataset element) returns."""
        return self.sample_batch_size * self.num_steps

    @property
    def spec_bytes(self) -> int:
        """Bytes of one item according to its spec."""
        return sum(s.shape.num_elements() * s.dtype.size for s in tf.nest.flatten(self.data_spec))

    def make_batch(self, rng: np.random.Generator) -> Dict[str, np.ndarray]:
        """A random `add_batch` argument: `batch_size` rows of every leaf."""
        batch = {}
        for key, spec in self.data_spec.items():
            shape = [self.batch_size] + spec.shape.as_list()
            dtype = spec.dtype.as_numpy_dtype
            if spec.dtype.is_floating:
                batch[key] = rng.standard_normal(shape).astype(dtype)
            else:
                batch[key] = rng.integers(0, min(256, int(spec.dtype.max)), size=shape).astype(dtype)
        return batch

    def window_rows(self, rng: np.random.Generator, count: int) -> list:
        """`count` arrays of storage rows, each `[sample_batch_size, num_steps]`.

        Each array holds windows of consecutive items of one segment, drawn
        uniformly from a full ring, in the buffers' time-major row layout.
        """
        pool = []
        for _ in range(count):
            segment = rng.integers(0, self.batch_size, size=(self.sample_batch_size, 1))
            start = rng.integers(0, self.max_length - self.num_steps + 1, size=(self.sample_batch_size, 1))
            local = start + np.arange(self.num_steps)
            pool.append((local * self.batch_size + segment).astype(np.int64))
        return pool


def _cartpole_spec() -> Dict[str, tf.TensorSpec]:
    return {
        "observation": tf.TensorSpec([4], tf.float32, "observation"),
        "action": tf.TensorSpec([], tf.int64, "action"),
        "reward": tf.TensorSpec([], tf.float32, "reward"),
        "discount": tf.TensorSpec([], tf.float32, "discount"),
    }


def _atari_spec() -> Dict[str, tf.TensorSpec]:
    return {
        "observation": tf.TensorSpec([84, 84, 4], tf.uint8, "observation"),
        "action": tf.TensorSpec([], tf.int64, "action"),
    }


CARTPOLE = Workload("cartpole", _cartpole_spec, batch_size=16, max_length=4096, sample_batch_size=256, num_steps=2)
ATARI = Workload("atari", _atari_spec, batch_size=4, max_length=5000, sample_batch_size=32, num_steps=2)
WORKLOADS = {w.name: w for w in (CARTPOLE, ATARI)}
