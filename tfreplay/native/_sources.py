"""Which files make each kernel, the flags every build shares, and the key of a kernel's sources.

Shared by the loader and `setup.py` (which loads this file by its path, without importing tfreplay or
TensorFlow), so a packaged library and the sources beside it can be checked against each other.
"""

from __future__ import annotations

import hashlib
import pathlib
from typing import Sequence

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
# TF ops: built against one TensorFlow, into the cache (`python -m tfreplay.native build`) or into a wheel.
OPS = ("sum_tree_ops", "frame_stack")

# Where a wheel carries TF ops built for given TensorFlow versions, beside this file.
PACKAGED_OPS = "ops"

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


def build_flags(name: str, tf_flags: Sequence[str] = ()) -> list[str]:
    """The compiler flags of a shared library of kernel `name`; a TF op adds TensorFlow's own (its
    `tf.sysconfig.get_compile_flags()`, then `get_link_flags()`)."""
    return ["-shared", "-fPIC", "-w", *FLAGS, f'-D{KEY_MACRO}="{source_key(name)}"', *tf_flags]


def packaged_op(name: str, tf_version: str) -> str:
    """The file name of TF op `name` built into a wheel for TensorFlow `tf_version` from these sources: a wheel
    loads only the one named for the running TensorFlow (a TF op's ABI is that version's)."""
    return f"{name}-tf{tf_version}-{source_key(name)}.so"
