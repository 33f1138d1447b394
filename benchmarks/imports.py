"""Import time: what `import tfreplay` costs over `import tensorflow`, in fresh interpreters.

    python -m benchmarks.imports            # 10 runs of each command, a Markdown table
    python -m benchmarks.imports --runs 20 --top 8

Two commands run in turns, each in a new process, so a change in the
machine's load falls on both: `python -X importtime -c "import tensorflow"`
and `python -X importtime -c "import tensorflow; import tfreplay"`. From
`-X importtime` (stderr) it reads the cumulative time of the top-level
`tensorflow` line (both commands) and of the `tfreplay` line: TensorFlow is
already loaded then, so that line is exactly tfreplay's own cost (a
difference of two processes' wall times would drown it in TensorFlow's own
variation, a second or more on a busy machine). `--top` lists the slowest
modules under tfreplay (median cumulative time): where to look when
tfreplay's cost exceeds its target.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
from typing import Sequence

TARGET_S = 0.3  # tfreplay's own import, over TensorFlow's
TF_ONLY = "import tensorflow"
TF_AND_TFREPLAY = "import tensorflow; import tfreplay"


@dataclasses.dataclass
class ImportRun:
    """One interpreter's `-X importtime` report: cumulative seconds per module, and of the top-level ones."""

    cumulative: dict[str, float]
    top_level: dict[str, float]


def parse_importtime(stderr: str) -> tuple[dict[str, float], dict[str, float]]:
    """Cumulative seconds of every module, and of the top-level imports alone, from `-X importtime` lines.

    A line reads `import time: <self us> | <cumulative us> | <indent><module>`;
    the indent is two spaces per level of nesting, none at the top level.
    """
    cumulative, top_level = {}, {}
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue  # the header line
        name = parts[2].rstrip()
        seconds = int(parts[1]) / 1e6
        cumulative[name.strip()] = seconds
        if not name[1:].startswith(" "):  # one space follows the bar; more mean a nested import
            top_level[name.strip()] = seconds
    return cumulative, top_level


def run_once(statement: str) -> ImportRun:
    """`statement` in a fresh interpreter under `-X importtime`."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks.imports: {statement!r} failed:\n{done.stderr[-2000:]}")
    cumulative, top_level = parse_importtime(done.stderr)
    return ImportRun(cumulative, top_level)


def run_alternating(num_runs: int) -> tuple[list[ImportRun], list[ImportRun]]:
    """`num_runs` of each command in turns, the order swapped every round so neither always goes first."""
    tf_only, both = [], []
    for i in range(num_runs):
        if i % 2 == 0:
            tf_only.append(run_once(TF_ONLY))
            both.append(run_once(TF_AND_TFREPLAY))
        else:
            both.append(run_once(TF_AND_TFREPLAY))
            tf_only.append(run_once(TF_ONLY))
    return tf_only, both


def _row(name: str, values: Sequence[float], target: str = "-", met: str = "-") -> str:
    median, low, high = statistics.median(values), min(values), max(values)
    return f"| {name} | {median:.3f} | {low:.3f} | {high:.3f} | {target} | {met} |"


def table(tf_only: list[ImportRun], both: list[ImportRun]) -> str:
    """The Markdown table: tensorflow's import, and tfreplay's over it."""
    tensorflow = [r.top_level["tensorflow"] for r in tf_only + both]
    tfreplay = [r.top_level["tfreplay"] for r in both]
    met = "yes" if statistics.median(tfreplay) <= TARGET_S else "NO"
    lines = [
        "| import | median s | min s | max s | target | met? |",
        "| --- | ---: | ---: | ---: | --- | --- |",
        _row("`tensorflow` (cumulative, both commands)", tensorflow),
        _row("`tfreplay` (cumulative, after tensorflow)", tfreplay, f"<= {TARGET_S} s", met),
    ]
    return "\n".join(lines)


def slowest(both: list[ImportRun], top: int) -> str:
    """The `top` modules under tfreplay with the largest median cumulative time."""
    names = {n for r in both for n in r.cumulative if n == "tfreplay" or n.startswith("tfreplay.")}
    medians = {n: statistics.median(r.cumulative.get(n, 0.0) for r in both) for n in names}
    lines = ["| module (under tfreplay) | median cumulative s |", "| --- | ---: |"]
    lines += [f"| `{n}` | {s:.3f} |" for n, s in sorted(medians.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(lines)


def machine() -> str:
    tf_version = importlib.metadata.version("tensorflow")
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "unset")
    return (
        f"{os.cpu_count()} CPUs ({platform.machine()}); Python {platform.python_version()}, "
        f"TensorFlow {tf_version}; TF_USE_LEGACY_KERAS={legacy}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each command (default 10)")
    parser.add_argument("--top", type=int, default=0, help="also list the N slowest modules under tfreplay")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs ({args.runs}) must be a positive integer.")
    load_start = os.getloadavg()[0]
    tf_only, both = run_alternating(args.runs)
    load_end = os.getloadavg()[0]
    print(
        f'Command: `python -X importtime -c "{TF_AND_TFREPLAY}"` in turns with `"{TF_ONLY}"`, '
        f"N = {args.runs} each; 1-min load average {load_start:.1f} at the start, {load_end:.1f} at the end. "
        f"Machine: {machine()}.\n"
    )
    print(table(tf_only, both))
    if args.top:
        print()
        print(slowest(both, args.top))


if __name__ == "__main__":
    main()
