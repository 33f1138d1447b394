"""Compiled kernels (`kernels/*.cc`): plain C libraries for the NumPy twin, TF ops for the TF twin.

Each accessor returns its kernel, or None; with None its caller runs the same computation in array ops
instead: same results, slower.

* `sum_tree_library()`: the sum tree's descent and update, and whole ring draws and updates, for NumPy
  arrays through ctypes (`sum_tree.cc` over `sum_tree.h`). Prioritized NumPy replay spends its time there.
* `windows_library()`: the NumPy twin's plan of padded windows (n-step returns, padded sequences) and its
  draw of strict windows through the episode index, each in a few C calls (`windows.cc`).
* `sum_tree_ops()`: the same sum-tree loops as TF ops on the tree's variable (`sum_tree_ops.cc`).
* `frame_stack()`: the op that stacks a frame buffer's frames in one pass (`frame_stack.cc`).

How they load. The two C libraries are compiled when the package is built (`pip wheel`, `pip install`,
`pip install -e .`: setup.py's optional extension, a baseline ISA) and load from the package. A TF op is built
against one TensorFlow and loads only into that version: a wheel carries the ops for each TensorFlow it was
built with (`native/ops/<op>-tf<version>-<sources>.so`). setup.py builds them where the building Python imports
TensorFlow, where the environment a `pip install` goes into has it, or for the Pythons named in
`TFREPLAY_WHEEL_TF`. For any other TensorFlow, the ops are one explicit step: `python -m tfreplay.native build`
builds them (and the C libraries where the package lacks them) into the cache: `$TFREPLAY_CACHE`, else
`$XDG_CACHE_HOME/tfreplay`, else `~/.cache/tfreplay` (a private temp folder where that cannot be written).
Nothing compiles on first use unless `TFREPLAY_BUILD_OPS=1` allows it (one line says what it builds).

Where a kernel is missing, its first use logs one WARNING per process (logger `tfreplay.native`) naming
what got slower and the fix. `TFREPLAY_NATIVE=0` turns every kernel off on purpose, without a warning; it is
read at each accessor call, while loaded libraries are kept for the process; `disabled(...)` does the same for
one block of one thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import glob
import importlib.machinery
import logging
import os
import pathlib
import threading
from typing import Any, Iterator, NamedTuple, Sequence

import tensorflow as tf

from tfreplay.native import _build, _sources

_HERE = pathlib.Path(__file__).parent
_log = logging.getLogger("tfreplay.native")
_lock = threading.Lock()
_loaded: dict[str, Any] = {}  # kernel name -> its library or op module, or None once it could not load
_warned: set[str] = set()
_off = threading.local()  # kernels `disabled` in this thread

_C_FIX = "Reinstall tfreplay from a wheel, or run `python -m tfreplay.native build`."
_TF_FIX = (
    "Run `python -m tfreplay.native build` once for this TensorFlow, or set TFREPLAY_BUILD_OPS=1 to build it on "
    "first use."
)


@dataclasses.dataclass(frozen=True)
class _Kernel:
    title: str  # what it is, for messages
    instead: str  # what runs without it
    seconds: str  # about how long a build takes


_KERNELS = {
    "sum_tree": _Kernel(
        "the compiled sum tree",
        "PyPrioritizedReplayBuffer samples and updates priorities with NumPy array ops, several times slower",
        "a second",
    ),
    "windows": _Kernel(
        "the compiled window plan",
        "NumPy buffers plan n-step returns and sequences with NumPy array ops, slower",
        "a second",
    ),
    "sum_tree_ops": _Kernel(
        "the sum-tree TF ops",
        "TFPrioritizedReplayBuffer samples and updates priorities with TF array ops, 5-7x slower (a sample of 256 "
        "and its update on 100k items)",
        "25 s",
    ),
    "frame_stack": _Kernel(
        "the frame-stacking TF op",
        "TFFrameReplayBuffer stacks frames with XLA instead, 1.2-2x slower (get_next(32) of Atari frames)",
        "25 s",
    ),
}
NAMES = tuple(_KERNELS)


@tf.autograph.experimental.do_not_convert  # called while tracing: AutoGraph must not try to convert the loader
def frame_stack() -> Any:
    """The op `frame_stack(frames_handle, rows, T, history_len, time_axis)`, or None."""
    module = _kernel("frame_stack")
    return None if module is None else module.tfreplay_frame_stack


@tf.autograph.experimental.do_not_convert
def sum_tree_ops() -> Any:
    """The module of the sum-tree ops (`kernels/sum_tree_ops.cc`: descend, set, ring draw, ring update), or None."""
    return _kernel("sum_tree_ops")


def sum_tree_library() -> Any:
    """The same functions for NumPy arrays (ctypes, `kernels/sum_tree.cc`), or None."""
    return _kernel("sum_tree")


def windows_library() -> Any:
    """The NumPy twin's window plan and strict draw (ctypes, `kernels/windows.cc`), or None."""
    return _kernel("windows")


def address(array: Any) -> int:
    """The address of a contiguous NumPy array's data, for a ctypes call (a third of the cost of
    `array.ctypes.data`)."""
    try:
        return ctypes.addressof(_BYTES(array))
    except (TypeError, ValueError):  # read-only or empty
        return array.__array_interface__["data"][0]


_BYTES: Any = ctypes.c_char.from_buffer  # takes any writable buffer (an ndarray is one)


class KernelStatus(NamedTuple):
    """Where a kernel would load from now: `origin` is `"package"`, `"cache"` or `"missing"` (then `path` is
    None and `reason` says why)."""

    name: str
    kind: str  # "C library" or "TF op"
    title: str
    origin: str
    path: str | None
    reason: str


class BuildResult(NamedTuple):
    """What `build` did for one kernel: `state` is `"packaged"` (the package has it: nothing to build),
    `"cached"` (already built), `"built"` or `"failed"` (`reason` says why, `output` holds the compiler's)."""

    name: str
    state: str
    path: str | None
    seconds: float
    reason: str
    output: str


def status() -> list[KernelStatus]:
    """Every kernel's status, without loading or building anything."""
    rows = []
    for name, kernel in _KERNELS.items():
        kind = "C library" if name in _sources.LIBRARIES else "TF op"
        packaged, stale = _packaged(name)
        if packaged is not None and not stale:
            rows.append(KernelStatus(name, kind, kernel.title, "package", str(packaged), ""))
            continue
        cached = _build.find(name, _config(name), _build.compiler())
        if cached is not None:
            rows.append(KernelStatus(name, kind, kernel.title, "cache", str(cached), ""))
        else:
            rows.append(KernelStatus(name, kind, kernel.title, "missing", None, _missing_reason(name, stale)))
    return rows


def build(names: Sequence[str] | None = None) -> list[BuildResult]:
    """Builds kernels into the cache (all TF ops and any C library the package lacks; default: every kernel).

    Each compile logs one line first (WARNING: visible by default). A second process building the same kernel
    waits for this one and finds it built. A kernel that failed to load earlier in this process is tried again
    at its next use.

    Raises:
      ValueError: a name that is not a kernel.
    """
    names = NAMES if names is None else tuple(names)
    unknown = [name for name in names if name not in _KERNELS]
    if unknown:
        raise ValueError(f"build: kernel ({', '.join(unknown)}) must be one of {', '.join(NAMES)}.")
    # Each compile is a compiler process of its own: they run side by side, one per core.
    workers = max(1, min(len(names), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="tfreplay-build") as pool:
        results = list(pool.map(_build_one, names))
    with _lock:
        for name in names:
            if name in _loaded and _loaded[name] is None:
                del _loaded[name]
    return results


def _build_one(name: str) -> BuildResult:
    packaged, stale = _packaged(name)
    if packaged is not None and not stale:
        return BuildResult(name, "packaged", str(packaged), 0.0, "", "")
    outcome = _compile(name, "asked for")
    return BuildResult(name, outcome.state, _str(outcome.path), outcome.seconds, outcome.reason, outcome.output)


@contextlib.contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Within it, in this thread, the kernels named (every kernel when none is) are unavailable, as with
    `TFREPLAY_NATIVE=0` but for one block: what a buffer builds or traces inside it (its first calls, a
    `tf.function` or dataset made inside) runs on the array-op or XLA fallback, with the same results and no
    warning. For comparing the two paths, e.g. in tests and benchmarks."""
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise ValueError(f"disabled: kernel names ({unknown}) must be among {list(NAMES)}.")
    before: frozenset = getattr(_off, "names", frozenset())
    _off.names = before | frozenset(names or NAMES)
    try:
        yield
    finally:
        _off.names = before


def _kernel(name: str) -> Any:
    """Kernel `name`, loaded once per process (a failure is remembered too, and warned about once)."""
    if os.environ.get("TFREPLAY_NATIVE", "1") == "0" or name in getattr(_off, "names", ()):
        return None
    with _lock:
        if name not in _loaded:
            _loaded[name], reason = _load(name)
            if _loaded[name] is None and name not in _warned:
                _warned.add(name)
                _log.warning("%s", _fallback_message(name, reason))
        return _loaded[name]


def _fallback_message(name: str, reason: str) -> str:
    """One line: which kernel is missing and why, what runs instead, and the fix."""
    kernel = _KERNELS[name]
    verb = "are" if kernel.title.endswith("ops") else "is"
    fix = _C_FIX if name in _sources.LIBRARIES else _TF_FIX
    return f"tfreplay: {kernel.title} {verb} not available ({reason}); {kernel.instead}. {fix}"


def _load(name: str) -> tuple[Any, str]:
    """`(kernel, "")` from the package, else the cache, else a build where allowed; else `(None, why)`."""
    packaged, stale = _packaged(name)
    reason = _missing_reason(name, stale)
    if packaged is not None and not stale:
        kernel, reason = _open(name, packaged)
        # A wheel's TF op that this TensorFlow refuses (another build of the same version) leaves the cache's.
        if kernel is not None or name in _sources.LIBRARIES:
            return kernel, reason
    command = _build.compiler()
    cached = _build.find(name, _config(name), command)
    if cached is not None:
        return _open(name, cached)
    if os.environ.get("TFREPLAY_BUILD_OPS") != "1":
        return None, reason
    if command is None:
        return None, _build.no_compiler_reason()
    outcome = _compile(name, "TFREPLAY_BUILD_OPS=1 allows builds on first use")
    if outcome.path is None:
        return None, outcome.reason
    return _open(name, outcome.path)


def _missing_reason(name: str, stale: bool) -> str:
    if stale:
        return "the packaged library does not match its sources"
    if name in _sources.LIBRARIES:
        return "not compiled into this install (installed without a C++ compiler?)"
    return f"not built for TensorFlow {tf.__version__}"


def _compile(name: str, why: str) -> _build.Outcome:
    """Builds kernel `name` into the cache, after one line saying what and why."""
    command = _build.compiler()
    if command is None:
        return _build.Outcome("failed", reason=_build.no_compiler_reason())
    config, flags = _config(name), _flags(name)
    built = _build.find(name, config, command, exact=True)
    if built is not None:
        return _build.Outcome("cached", built)
    target = "" if name in _sources.LIBRARIES else f" for TensorFlow {tf.__version__}"
    _log.warning(
        "tfreplay: building %s (%s)%s into %s: %s; it takes about %s, once.",
        _KERNELS[name].title,
        _sources.FILES[name][0],
        target,
        _build.primary_cache(),
        why,
        _KERNELS[name].seconds,
    )
    return _build.compile_kernel(name, _sources.KERNELS / _sources.FILES[name][0], flags, config, command)


def _flags(name: str) -> list[str]:
    if name in _sources.LIBRARIES:
        return _sources.build_flags(name)
    return _sources.build_flags(name, [*tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()])


def _config(name: str) -> list[str]:
    """What a cached build depends on besides the compiler: its sources and flags (and so TensorFlow's)."""
    version = [] if name in _sources.LIBRARIES else [tf.__version__]
    return [_sources.source_key(name), *_flags(name), *version]


def _packaged(name: str) -> tuple[pathlib.Path | None, bool]:
    """The library built into the package, and whether its sources differ from these. A TF op counts only when
    it was built for this TensorFlow version (`_sources.packaged_op`)."""
    if name not in _sources.LIBRARIES:
        folder = _HERE / _sources.PACKAGED_OPS
        path = folder / _sources.packaged_op(name, tf.__version__)
        if path.is_file():
            return path, False
        other = min(folder.glob(f"{name}-tf{glob.escape(tf.__version__)}-*.so"), default=None)
        return other, other is not None  # built for this TensorFlow from other sources: stale
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _HERE / f"_{name}{suffix}"
        if path.is_file():
            return path, _library_key(name, path) != _sources.source_key(name)
    return None, False


def _library_key(name: str, path: pathlib.Path) -> str | None:
    try:
        key = getattr(ctypes.CDLL(str(path)), f"tfreplay_{name}_source_key")
    except (OSError, AttributeError):
        return None
    key.restype = ctypes.c_char_p
    return key().decode()


def _open(name: str, path: pathlib.Path) -> tuple[Any, str]:
    """`(kernel, "")` loaded from `path`, or `(None, why)`."""
    try:
        if name not in _sources.LIBRARIES:
            return tf.load_op_library(str(path)), ""
        library = ctypes.CDLL(str(path))
        for function, (restype, argtypes) in _SIGNATURES[name].items():
            getattr(library, function).argtypes = argtypes
            getattr(library, function).restype = restype
        return library, ""
    except (OSError, AttributeError, tf.errors.NotFoundError) as err:
        _log.debug("tfreplay: loading %s failed:\n%s", path, err)
        return None, f"loading {path.name} failed: {str(err).splitlines()[0][:200]}"


def _str(path: pathlib.Path | None) -> str | None:
    return None if path is None else str(path)


_a, _n, _flag = ctypes.c_void_p, ctypes.c_int64, ctypes.c_bool  # arrays go as raw addresses: contiguous, typed
_SIGNATURES: dict[str, dict[str, tuple[Any, list[Any]]]] = {  # per function: return type (or None), arguments
    "sum_tree": {
        "tfreplay_sum_tree_descend": (None, [_a, _n, _a, _n, _a, _a]),
        "tfreplay_sum_tree_set": (None, [_a, _n, _a, _a, _n]),
        "tfreplay_ring_draw": (_flag, [_a, _n, _a, _n, _n, _n, _a, _n, _flag, _a, _a, _a, _a]),  # all start one
        "tfreplay_ring_update": (_n, [_a, _n, _a, _n, _n, _a, _a, _a, _n, _a]),  # stale ids, or -1: a bad priority
        "tfreplay_ring_sample": (_n, [_a, _n, _a, _n, _n, _a, _n, _a, _a, _a, _a, _a]),  # bit 0: all start one
    },
    "windows": {
        "tfreplay_padded_counts": (_n, [_a, _n, _n, _n, _a, _a, _a]),  # how many starts to draw from
        "tfreplay_window_plan": (None, [_a, _a, _a, _a, _a, _n, _n, _n, _n, _a, _a, _a, _a, _a, _a, _a]),
        # strict windows through the episode index: the counts, a round of candidates, the exact draw
        "tfreplay_strict_counts": (_n, [_a, _n, _n, _n, _n, _n, _n, _a, _a, _n, _a, _a, _a, _a, _a]),
        "tfreplay_strict_keep": (_n, [_a, _n, _n, _a, _a, _n, _n, _n, _n, _n, _a, _a, _a, _a]),  # still missing
        "tfreplay_strict_exact": (None, [_a, _n, _a, _n, _n, _n, _n, _n, _a, _a, _a, _a, _a]),
    },
}

__all__ = [
    "NAMES",
    "BuildResult",
    "KernelStatus",
    "address",
    "build",
    "disabled",
    "frame_stack",
    "status",
    "sum_tree_library",
    "sum_tree_ops",
    "windows_library",
]
