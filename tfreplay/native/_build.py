"""Building a kernel into the cache: the compiler, the cache folder, its file lock, one compile.

No TensorFlow here: a TF op's flags and version come in as arguments.

A cached library is named `<kernel>-<config>-<compiler>.so`: `config` hashes the sources, the flags and the CPU
(builds use `-march=native`), `compiler` the compiler's command. A library built by another compiler is still
loaded where the named one is missing (loading one beats falling back); `build` replaces it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from typing import Iterator, Sequence

_log = logging.getLogger("tfreplay.native")
_notes: set[str] = set()  # what was said once per process (the temp-dir fallback)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a build did: `"built"`, `"cached"` (already there, maybe built by another process meanwhile) or
    `"failed"`; `path` of the library (None when failed); `reason` a short why; `output` the compiler's."""

    state: str
    path: pathlib.Path | None = None
    reason: str = ""
    output: str = ""
    seconds: float = 0.0


def compiler() -> list[str] | None:
    """The C++ compiler's command: `$CXX` (which may carry arguments, e.g. `ccache g++`), else g++ or c++ on PATH."""
    if os.environ.get("CXX"):
        command = shlex.split(os.environ["CXX"])
        found = shutil.which(command[0])
        return None if found is None else [found, *command[1:]]
    found = shutil.which("g++") or shutil.which("c++")
    return None if found is None else [found]


def no_compiler_reason() -> str:
    if os.environ.get("CXX"):
        return f"no C++ compiler: CXX ({os.environ['CXX']}) is not a program on PATH"
    return "no C++ compiler: g++ or c++ on PATH, or CXX"


def stem(name: str, config: Sequence[str]) -> str:
    """`<kernel>-<config hash>`: what every cached build of these sources and flags starts with."""
    text = "\n".join([*config, _cpu()]).encode()
    return f"{name}-{hashlib.sha256(text).hexdigest()[:16]}"


def file_name(name: str, config: Sequence[str], command: Sequence[str]) -> str:
    return f"{stem(name, config)}-{hashlib.sha256(' '.join(command).encode()).hexdigest()[:8]}.so"


def primary_cache() -> pathlib.Path:
    """`$TFREPLAY_CACHE`, else `$XDG_CACHE_HOME/tfreplay`, else `~/.cache/tfreplay`."""
    if os.environ.get("TFREPLAY_CACHE"):
        return pathlib.Path(os.environ["TFREPLAY_CACHE"])
    home = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(home) / "tfreplay"


def caches() -> list[pathlib.Path]:
    """Where to look for a built library: the cache, then the temp-dir fallback where one exists."""
    fallback = _fallback(create=False)
    return [primary_cache()] + ([fallback] if fallback.is_dir() else [])


def find(name: str, config: Sequence[str], command: Sequence[str] | None, exact: bool = False) -> pathlib.Path | None:
    """A cached library of these sources and flags: the one `command` built if there, else (unless `exact`)
    the newest one another compiler built."""
    named = None if command is None else file_name(name, config, command)
    others: list[pathlib.Path] = []
    for cache in caches():
        if named is not None and (cache / named).is_file():
            return cache / named
        with contextlib.suppress(OSError):
            others += cache.glob(f"{stem(name, config)}-*.so")
    return None if exact else max(others, key=lambda p: p.stat().st_mtime, default=None)


def writable_cache() -> pathlib.Path:
    """The cache folder, or a private temp folder where it cannot be written (said once, at INFO)."""
    cache = primary_cache()
    if _writable(cache):
        return cache
    fallback = _fallback(create=True)
    if "fallback" not in _notes:
        _notes.add("fallback")
        _log.info("tfreplay: the kernel cache %s cannot be written; building into %s instead.", cache, fallback)
    return fallback


def compile_kernel(
    name: str, source: pathlib.Path, flags: Sequence[str], config: Sequence[str], command: Sequence[str]
) -> Outcome:
    """Builds `source` into the writable cache unless a process (this or another) has built it; a second process
    asking meanwhile waits on the file lock, then finds the library. Built aside, then renamed: nothing ever
    loads half a library."""
    start = time.perf_counter()
    try:
        cache = writable_cache()
        library = cache / file_name(name, config, command)
        with _locked(cache / f"{library.stem}.lock"):
            if library.is_file():
                return Outcome("cached", library)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                built = pathlib.Path(tmp) / library.name
                ok, output = run([*command, str(source), "-o", str(built), "-march=native", *flags])
                if not ok:  # a compiler that does not know -march=native: generic code
                    ok, output = run([*command, str(source), "-o", str(built), *flags])
                if not ok:
                    return Outcome("failed", None, first_error(command, output), output, time.perf_counter() - start)
                os.replace(built, library)
        return Outcome("built", library, "", output, time.perf_counter() - start)
    except OSError as err:
        return Outcome("failed", None, f"{type(err).__name__}: {err}", "", time.perf_counter() - start)


def run(command: list[str]) -> tuple[bool, str]:
    """Runs a compile: `(whether it succeeded, the compiler's output)`."""
    _log.debug("tfreplay: %s", " ".join(command))
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as err:
        return False, str(err)
    output = (done.stdout + done.stderr).strip()
    if output:
        _log.debug("tfreplay: the compiler says:\n%s", output)
    return done.returncode == 0, output or f"exit status {done.returncode}"


def first_error(command: Sequence[str], output: str) -> str:
    """A short reason: the compiler's first error line, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    error = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else "")
    return f"{pathlib.Path(command[0]).name} failed: {error[:200]}"


def _writable(folder: pathlib.Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _fallback(create: bool) -> pathlib.Path:
    """`<tmp>/tfreplay-<uid>`, private to this user; a fresh private folder where that one is not ours."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    folder = pathlib.Path(tempfile.gettempdir()) / f"tfreplay-{uid}"
    if not create:
        return folder
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.stat()
    if hasattr(os, "getuid") and (info.st_uid != uid or info.st_mode & 0o022):  # another user could plant a library
        return pathlib.Path(tempfile.mkdtemp(prefix="tfreplay-"))
    return folder


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    """Holds an exclusive lock on `path` (created if needed); without `fcntl` (Windows), no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cpu() -> str:
    """The CPU's model and feature flags (Linux), else the architecture's name: builds use -march=native."""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    first = [next((line for line in info if line.startswith(field)), "") for field in ("model name", "flags")]
    return "\n".join(first).strip() or platform.machine()
