"""Native kernels (`kernels/*.cc`), compiled on first use with the system's C++ compiler.

* `frame_stack()`: the frame-stacking TF op. `TFFrameReplayBuffer` samples
  about 20% faster with it (see the README's frame benchmark): it reads each
  frame once and writes the stacks in one pass, where XLA needs a slow
  per-element gather and a second pass.
* `sum_tree_ops()`: the sum tree's descent and update as TF ops on the tree's
  variable (for ring windows, a whole draw with its probabilities and a whole
  update in one op each); `sum_tree_library()`: the same loops as plain C
  functions, for NumPy through ctypes. Prioritized replay spends its time in these two loops
  (`core/samplers/sum_tree.py`).
* `windows_library()`: the NumPy twin's plan of padded windows (n-step
  returns, padded sequences) in one or two plain C calls, and its draw of
  strict windows through the episode index in two or three
  (`core/native_windows.py`), where array ops take about 40 and 30 small calls;
  `window_ops()`: the padded plan's two calls as TF ops, for the TF twin
  (where it would otherwise call an XLA-compiled function of the same plan).

A TF kernel is built against the installed TensorFlow's headers, once per
TensorFlow version; the plain library needs no TensorFlow. Both go into
`$TFREPLAY_CACHE` (default `~/.cache/tfreplay`), keyed by their sources, the
compiler, its flags and this CPU.

Without a compiler, or with `TFREPLAY_NATIVE=0`, or if a build fails (the
reason is logged once), each accessor returns None and its caller uses the
same computation in array ops instead: same results, slower.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import threading
from typing import Any, Callable

import tensorflow as tf

_KERNELS = pathlib.Path(__file__).with_name("kernels")
_lock = threading.Lock()
_loaded: dict[str, Any] = {}
_log = logging.getLogger(__name__)


@tf.autograph.experimental.do_not_convert  # called while tracing: AutoGraph must not try to convert the loader
def frame_stack() -> Any:
    """The op `frame_stack(frames_handle, rows, T, history_len, time_axis)`, or None."""
    return _once("frame_stack", _load)


@tf.autograph.experimental.do_not_convert
def sum_tree_ops() -> Any:
    """The module of the sum-tree ops (`kernels/sum_tree_ops.cc`: descend, set, ring draw, ring update), or None."""
    return _once("sum_tree_ops", lambda: _op_library("sum_tree_ops.cc", "the sum-tree kernel", "using TF ops instead"))


def sum_tree_library() -> Any:
    """The same functions for NumPy arrays (ctypes, `kernels/sum_tree.cc`), or None."""
    return _once("sum_tree", _sum_tree_library)


@tf.autograph.experimental.do_not_convert
def window_ops() -> Any:
    """The TF twin's padded-window plan as TF ops (`kernels/window_ops.cc`, over `windows.cc`), or None."""
    return _once("window_ops", lambda: _op_library("window_ops.cc", "the window-plan ops", "using XLA instead"))


def windows_library() -> Any:
    """The NumPy twin's window plan and strict draw (ctypes, `kernels/windows.cc`; see `core/native_windows.py`),
    or None."""
    return _once("windows", _windows_library)


def address(array: Any) -> int:
    """The address of a contiguous NumPy array's data, for a ctypes call (a third of the cost of
    `array.ctypes.data`)."""
    try:
        return ctypes.addressof(_BYTES(array))
    except (TypeError, ValueError):  # read-only or empty
        return array.__array_interface__["data"][0]


_BYTES: Any = ctypes.c_char.from_buffer  # takes any writable buffer (an ndarray is one)


def _once(name: str, load: Callable[[], Any]) -> Any:
    """Loads a kernel once per process (a None is remembered too)."""
    with _lock:
        if name not in _loaded:
            _loaded[name] = load()
        return _loaded[name]


def _load() -> Any:
    """The frame-stacking op, built now if needed, or None."""
    module = _op_library("frame_stack.cc", "the frame-stacking kernel", "using XLA instead")
    return None if module is None else module.tfreplay_frame_stack


def _op_library(source: str, what: str, fallback: str) -> Any:
    flags = [*tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    library = build(source, flags, what, fallback)
    if library is None:
        return None
    try:
        return tf.load_op_library(str(library))
    except tf.errors.NotFoundError as err:
        _log.warning("tfreplay: loading %s failed; %s.\n%s", what, fallback, str(err)[-2000:])
        return None


def _sum_tree_library() -> Any:
    a, n, flag = ctypes.c_void_p, ctypes.c_int64, ctypes.c_bool  # address, size
    return _c_library(
        "sum_tree.cc",
        "the sum-tree library",
        {
            "tfreplay_sum_tree_descend": (None, [a, n, a, n, a, a]),
            "tfreplay_sum_tree_set": (None, [a, n, a, a, n]),
            "tfreplay_ring_draw": (flag, [a, n, a, n, n, n, a, n, flag, a, a, a, a]),  # every draw starts a window
            "tfreplay_ring_update": (n, [a, n, a, n, n, a, a, a, n, a]),  # stale ids, or -1 for a bad priority
            "tfreplay_ring_sample": (n, [a, n, a, n, n, a, n, a, a, a, a, a]),  # bit 0: all start one; bit 1: count
        },
    )


def _windows_library() -> Any:
    a, n = ctypes.c_void_p, ctypes.c_int64
    return _c_library(
        "windows.cc",
        "the window-plan library",
        {
            "tfreplay_padded_counts": (n, [a, n, n, n, a, a, a]),  # how many starts to draw from
            "tfreplay_window_plan": (None, [a, a, a, a, a, n, n, n, n, a, a, a, a, a, a, a]),
            # strict windows through the episode index: the counts, a round of candidates, the exact draw
            "tfreplay_strict_counts": (n, [a, n, n, n, n, n, n, a, a, n, a, a, a, a, a]),
            "tfreplay_strict_keep": (n, [a, n, n, a, a, n, n, n, n, n, a, a, a, a]),  # how many still missing
            "tfreplay_strict_exact": (None, [a, n, a, n, n, n, n, n, a, a, a, a, a]),
        },
    )


def _c_library(source: str, what: str, signatures: dict[str, tuple[Any, list[Any]]]) -> Any:
    """`kernels/<source>` built (if needed) and loaded with ctypes, its functions typed, or None.

    Arrays go as raw addresses (`c_void_p`): callers pass contiguous arrays of the right dtype.
    `signatures`: per function, `(return type or None, argument types)`.
    """
    fallback = "using NumPy ops instead"
    library = build(source, [], what, fallback)
    if library is None:
        return None
    try:
        lib = ctypes.CDLL(str(library))
    except OSError as err:
        _log.warning("tfreplay: loading %s failed; %s.\n%s", what, fallback, err)
        return None
    for name, (restype, argtypes) in signatures.items():
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = restype
    return lib


def build(source: str, extra_flags: list[str], what: str, fallback: str) -> pathlib.Path | None:
    """Compiles `kernels/<source>` (and the headers beside it) into a cached shared library, or returns None.

    The cache key covers the sources, compiler, flags, TensorFlow version and
    CPU (the code is built with -march=native). Built aside, then moved: other
    processes never see half a library.
    """
    if os.environ.get("TFREPLAY_NATIVE", "1") == "0":
        return None
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        _log.info("tfreplay: no C++ compiler for %s; %s.", what, fallback)
        return None
    # No floating-point contraction: sums must round exactly as the array-op fallback rounds them.
    flags = ["-shared", "-fPIC", "-O3", "-march=native", "-ffp-contract=off", "-w", *extra_flags]
    path = _KERNELS / source
    # Every kernel file counts: a source may include another (window_ops.cc includes windows.cc).
    text = path.read_bytes() + b"".join(k.read_bytes() for k in sorted(_KERNELS.glob("*.[ch]*")))
    key = hashlib.sha256(text + " ".join([compiler, tf.__version__, _cpu(), *flags]).encode()).hexdigest()[:16]
    cache = pathlib.Path(os.environ.get("TFREPLAY_CACHE", pathlib.Path.home() / ".cache" / "tfreplay"))
    library = cache / f"{path.stem}-{key}.so"
    try:
        if not library.exists():
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                built = pathlib.Path(tmp) / library.name
                command = [compiler, str(path), "-o", str(built), *flags]
                try:
                    subprocess.run(command, check=True, capture_output=True, text=True)
                except subprocess.CalledProcessError:  # a compiler without -march=native: build generic code
                    command.remove("-march=native")
                    subprocess.run(command, check=True, capture_output=True, text=True)
                os.replace(built, library)
        return library
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        _log.warning("tfreplay: building %s failed; %s.\n%s", what, fallback, detail[-2000:])
        return None


def _cpu() -> str:
    """The CPU's model and feature flags (Linux), else the architecture's name."""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    first = [next((line for line in info if line.startswith(field)), "") for field in ("model name", "flags")]
    return "\n".join(first).strip() or platform.machine()
