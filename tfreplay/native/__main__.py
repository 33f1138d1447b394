"""`python -m tfreplay.native [status | build [KERNEL ...]]`: what is built, and the explicit build step."""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys

import tensorflow as tf

from tfreplay import native
from tfreplay.native import _build

USAGE = """\
python -m tfreplay.native            what is built (this text too)
python -m tfreplay.native status     what is built, and where each kernel loads from
python -m tfreplay.native build      build every TF op for the installed TensorFlow, and each C library
                                     the package lacks, into the cache (once per TensorFlow version)
python -m tfreplay.native build frame_stack ...   only these kernels

Environment: TFREPLAY_BUILD_OPS=1 allows builds on first use; TFREPLAY_NATIVE=0 turns every kernel off
(array ops, no warning); TFREPLAY_CACHE or XDG_CACHE_HOME moves the cache; CXX names the compiler."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfreplay.native",
        description="tfreplay's compiled kernels: their status, and the step that builds them.",
        epilog=USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("status", help="what is built, and where each kernel loads from")
    builder = commands.add_parser("build", help="build the TF ops (and any C library the package lacks)")
    builder.add_argument("kernels", nargs="*", metavar="KERNEL", help="default: all; " + ", ".join(native.NAMES))
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"]):  # the status first, then the usage
        print_status()
        print()
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    if args.command == "build":
        unknown = sorted(set(args.kernels) - set(native.NAMES))
        if unknown:
            parser.error(f"build: kernel ({', '.join(unknown)}) must be one of {', '.join(native.NAMES)}")
        return build(args.kernels or None)
    print_status()
    if args.command is None:
        print("\nUsage:\n" + USAGE)
    return 0


def print_status() -> None:
    compiler = _build.compiler()
    print(
        f"tfreplay's native kernels (TensorFlow {tf.__version__}; cache {_build.primary_cache()}; "
        f"compiler {' '.join(compiler) if compiler else 'none'}):"
    )
    for row in native.status():
        where = row.path if row.path is not None else row.reason
        print(f"  {row.name:<13} {row.kind:<10} {row.origin:<8} {where}")
    if os.environ.get("TFREPLAY_NATIVE") == "0":
        print("TFREPLAY_NATIVE=0: every kernel is off (array ops).")
    elif any(row.origin == "missing" for row in native.status()):
        print("Missing kernels fall back to array ops (same results, slower): python -m tfreplay.native build")


def build(names: list[str] | None) -> int:
    """Builds, one result line per kernel; a failure also prints the compiler's output. Non-zero if any failed."""
    failed = 0
    names = list(names or native.NAMES)
    # The compiles run side by side, one per core; a line as each ends.
    with concurrent.futures.ThreadPoolExecutor(max(1, min(len(names), os.cpu_count() or 1))) as pool:
        for future in concurrent.futures.as_completed([pool.submit(native.build, [name]) for name in names]):
            for result in future.result():
                where = result.path or result.reason
                timing = f" in {result.seconds:.1f} s" if result.state == "built" else ""
                print(f"{result.name:<13} {result.state}{timing}: {where}", flush=True)
                if result.state == "failed":
                    failed += 1
                    print(result.output[-4000:], file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
