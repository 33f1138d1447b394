"""Which files make each kernel, the flags every build shares, and the key of a kernel's sources.

Shared by the loader and `setup.py` (which loads this file by its path, without importing tfreplay or
TensorFlow), so a packaged library and the sources beside it can be checked against each other.
"""

from __future__ import annotations

import hashlib
import pathlib

KERNELS = pathlib.Path(__file__).with_name("kernels")

# Per kernel, its source file first, then the files it includes.
FILES = {
    "sum_tree": ("sum_tree.cc", "sum_tree.h"),
    "windows": ("windows.cc",),
    "sum_tree_ops": ("sum_tree_ops.cc", "sum_tree.h"),
    "frame_stack": ("frame_stack.cc",),
}

# Plain C libraries (no TensorFlow): compiled into the package when it is built, loaded with ctypes.
LIBRARIES = ("sum_tree", "windows")

# No floating-point contraction: sums must round exactly as the array-op fallback rounds them.
FLAGS = ("-O3", "-ffp-contract=off", "-std=c++17")

# The macro a build defines to the key of its sources; each library returns it from `tfreplay_<name>_source_key`.
KEY_MACRO = "TFREPLAY_SOURCE_KEY"


def source_key(name: str, kernels: pathlib.Path = KERNELS) -> str:
    """A short hash of kernel `name`'s files (names and bytes): a library built from other sources is stale."""
    digest = hashlib.sha256()
    for file in FILES[name]:
        digest.update(file.encode() + b"\0" + (kernels / file).read_bytes() + b"\0")
    return digest.hexdigest()[:16]
