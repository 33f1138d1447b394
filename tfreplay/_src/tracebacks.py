"""tfreplay's own frames left out of the stack traces TF records for the graph checks it makes.

A graph assertion that fails inside `tf.function` is reported by TF as
`Graph execution error:`, then `Detected at node ... defined at` and the
Python frames where the op was made, then the assertion's message. For a
check of tfreplay's (an empty buffer, a batch of the wrong shape) those
frames would be a dozen of `tfreplay/_src`; made under `hidden()` they are
the caller's own. TF's stack-trace filter is not public API: without it
nothing is hidden and the message is the same.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

try:
    from tensorflow.python.util import tf_stack
except ImportError:  # pragma: no cover (a TensorFlow without it: frames are shown)
    tf_stack = None  # type: ignore[assignment]


def _ours(name: Any) -> bool:
    return isinstance(name, str) and (name == "tfreplay._src" or name.startswith("tfreplay._src."))


def _our_files() -> frozenset:
    """tfreplay/_src's files, and the files of the calls on the stack now that run its code: inside
    `tf.function` AutoGraph runs a converted copy of each function from a generated file (its globals are
    still the module's), which TF maps back to our lines only after filtering."""
    files = {getattr(module, "__file__", None) or "" for name, module in list(sys.modules.items()) if _ours(name)}
    frame = sys._getframe(1)
    while frame is not None:
        if _ours(frame.f_globals.get("__name__")):
            files.add(frame.f_code.co_filename)
        frame = frame.f_back  # type: ignore[assignment]
    return frozenset(files)


if tf_stack is not None and hasattr(tf_stack, "StackTraceFilter"):

    class _HideOurs(tf_stack.StackTraceFilter):  # type: ignore[misc,name-defined]
        def get_filtered_filenames(self) -> frozenset:
            parent = self.parent.get_filtered_filenames() if self.parent is not None else frozenset()
            return _our_files() | parent


def hidden() -> Any:
    """A context in which graph ops record their stack trace without tfreplay's internal frames."""
    if tf_stack is None or not hasattr(tf_stack, "StackTraceFilter"):  # pragma: no cover
        return contextlib.nullcontext()
    return _HideOurs()
