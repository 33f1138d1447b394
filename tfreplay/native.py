"""The frame-stacking kernel (`kernels/frame_stack.cc`), compiled on first use.

`TFFrameReplayBuffer` samples about 20% faster with it (see the README's
frame benchmark): it reads each frame once and writes the stacks in one pass,
where XLA needs a slow per-element gather and a second pass. It is built with
the system's C++ compiler against the installed TensorFlow's headers, once per
TensorFlow version, into `$TFREPLAY_CACHE` (default `~/.cache/tfreplay`).

Without a compiler, or with `TFREPLAY_NATIVE=0`, or if the build fails (the
reason is logged once), `frame_stack()` is None and the buffer compiles the
same stacking with XLA instead: same samples, slower.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import threading
from typing import Any

import tensorflow as tf

_SOURCE = pathlib.Path(__file__).with_name("kernels") / "frame_stack.cc"
_lock = threading.Lock()
_loaded: dict[str, Any] = {}
_log = logging.getLogger(__name__)


@tf.autograph.experimental.do_not_convert  # called while tracing: AutoGraph must not try to convert the loader
def frame_stack() -> Any:
    """The op `frame_stack(frames_handle, rows, T, history_len, time_axis)`, or None."""
    with _lock:
        if "op" not in _loaded:
            _loaded["op"] = _load()
        return _loaded["op"]


def _load() -> Any:
    if os.environ.get("TFREPLAY_NATIVE", "1") == "0":
        return None
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        _log.info("tfreplay: no C++ compiler; frame stacks are compiled with XLA instead.")
        return None
    # Built for this CPU (-march=native), so the CPU is part of the cache key too.
    flags = ["-shared", "-fPIC", "-O3", "-march=native", "-w", *tf.sysconfig.get_compile_flags()]
    flags += tf.sysconfig.get_link_flags()
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([compiler, tf.__version__, _cpu(), *flags]).encode()).hexdigest()[:16]
    cache = pathlib.Path(os.environ.get("TFREPLAY_CACHE", pathlib.Path.home() / ".cache" / "tfreplay"))
    library = cache / f"frame_stack-{key}.so"
    try:
        if not library.exists():
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:  # build aside, then move: atomic for other processes
                built = pathlib.Path(tmp) / library.name
                command = [compiler, str(_SOURCE), "-o", str(built), *flags]
                try:
                    subprocess.run(command, check=True, capture_output=True, text=True)
                except subprocess.CalledProcessError:  # a compiler without -march=native: build generic code
                    command.remove("-march=native")
                    subprocess.run(command, check=True, capture_output=True, text=True)
                os.replace(built, library)
        return tf.load_op_library(str(library)).tfreplay_frame_stack
    except (OSError, subprocess.CalledProcessError, tf.errors.NotFoundError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        _log.warning("tfreplay: building the frame-stacking kernel failed; using XLA instead.\n%s", detail[-2000:])
        return None


def _cpu() -> str:
    """The CPU's model and feature flags (Linux), else the architecture's name."""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    first = [next((line for line in info if line.startswith(field)), "") for field in ("model name", "flags")]
    return "\n".join(first).strip() or platform.machine()
