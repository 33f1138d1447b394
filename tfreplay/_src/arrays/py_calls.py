"""Python calls inside TF graphs (`tf.numpy_function`) that let the interpreter exit.

A `tf.data` pipeline that prefetches calls its Python functions on TF's own
threads, ahead of the reader. Once the interpreter starts to finalize, a
thread that asks for the GIL is stopped where it stands; the main thread,
destroying the pipeline's iterator at shutdown, then waits for that call
forever, and the process hangs at exit (a module-level iterator of a NumPy
buffer's `as_dataset` did, in most runs).

So every Python call tfreplay puts in a graph goes through `numpy_function`:
when the interpreter begins to exit (`atexit`, before any thread is stopped),
new calls fail at once, and the exit waits, at most `DRAIN_SECONDS`, until no
call is running and none has started for `QUIET_SECONDS`. By then each
prefetch buffer is full, its thread waits inside TF, and destroying the
iterator stops it cleanly.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any, Callable, Sequence

import tensorflow as tf

QUIET_SECONDS = 0.05
DRAIN_SECONDS = 2.0

_lock = threading.Lock()
_state = {"exiting": False, "running": 0, "last": 0.0}


def numpy_function(fn: Callable[..., Any], inputs: Sequence[Any], dtypes: Any, name: str | None = None) -> Any:
    """`tf.numpy_function(fn, inputs, dtypes, stateful=True)`, whose calls stop once the interpreter exits."""

    def call(*args: Any) -> Any:
        with _lock:
            _state["last"] = time.monotonic()
            if _state["exiting"]:
                raise RuntimeError("tfreplay: the interpreter is exiting; this graph's Python call was not run.")
            _state["running"] += 1
        try:
            return fn(*args)
        finally:
            with _lock:
                _state["running"] -= 1
                _state["last"] = time.monotonic()

    return tf.numpy_function(call, list(inputs), dtypes, stateful=True, name=name)


def _drain() -> None:
    """At exit: refuse new calls, then wait (bounded) until the running ones are done and no more arrive."""
    with _lock:
        _state["exiting"] = True
    deadline = time.monotonic() + DRAIN_SECONDS
    while time.monotonic() < deadline:
        with _lock:
            idle = _state["running"] == 0 and time.monotonic() - _state["last"] >= QUIET_SECONDS
        if idle:
            return
        time.sleep(0.01)  # the GIL is free meanwhile: TF's threads finish their calls or are refused


atexit.register(_drain)
