"""Checkpoint state of the NumPy twin: arrays, counters and the random generator."""

from __future__ import annotations

import io
import pickle
import threading
from typing import Callable

import numpy as np
import tensorflow as tf


class NumpyCheckpointState(tf.train.experimental.PythonState):
    """Lets `tf.train.Checkpoint` save a NumPy buffer: arrays, counters, RNG.

    Args:
      lock: the buffer's lock, held while state is read or replaced.
      arrays: returns the arrays to save; restore copies into them in place.
      rng: the buffer's NumPy generator; its state is saved too.
      scalars: returns plain Python counters to save (optional).
      restore_scalars: puts restored counters back (optional).
    """

    def __init__(
        self,
        lock: threading.Lock,
        arrays: Callable[[], list],
        rng: np.random.Generator,
        scalars: Callable[[], dict] | None = None,
        restore_scalars: Callable[[dict], None] | None = None,
    ):
        self._lock, self._arrays, self._rng = lock, arrays, rng
        self._scalars, self._restore_scalars = scalars, restore_scalars

    def serialize(self) -> bytes:
        with self._lock:
            out = io.BytesIO()
            np.savez(out, *self._arrays())
            scalars = self._scalars() if self._scalars else {}
            return pickle.dumps({"arrays": out.getvalue(), "rng": self._rng.bit_generator.state, "scalars": scalars})

    def deserialize(self, string_value: bytes) -> None:
        state = pickle.loads(string_value)
        with np.load(io.BytesIO(state["arrays"])) as data:
            saved = [data[f"arr_{i}"] for i in range(len(data.files))]
        with self._lock:
            arrays = self._arrays()
            if [a.shape for a in saved] != [a.shape for a in arrays]:
                raise ValueError("checkpoint: the saved buffer's arrays have other shapes than this buffer's.")
            for dst, src in zip(arrays, saved):
                dst[...] = src
            self._rng.bit_generator.state = state["rng"]
            if self._restore_scalars:
                self._restore_scalars(state["scalars"])
