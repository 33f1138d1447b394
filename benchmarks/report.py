"""Markdown tables from pytest-benchmark's JSON: one per group, each case against its group's baseline.

    python -m benchmarks.report .benchmarks/last.json

Reads the file `--benchmark-json` wrote (`make bench` writes .benchmarks/last.json).
A row's time is pytest-benchmark's median per timed call over `ops`, the
operations that call made (a graph loop of 200 calls counts 200), so it reads
per operation; "noise" is the interquartile range over the median; "x base" is
the row's median over the median of the group's case marked `role="baseline"`
(or, without one, its first floor), timed in the same run. Floors are marked.

A file written by `--interleaved` (`make bench ROUNDS=R`) prints as
`benchmarks/interleave.py` renders it: medians over rounds with their min-max,
and each ratio taken within each round.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Dict, List

from benchmarks import interleave


def per_op(bench: Dict[str, Any]) -> float:
    """Seconds per operation: the median per timed call over the call's operations."""
    return bench["stats"]["median"] / bench.get("extra_info", {}).get("ops", 1)


def groups(benchmarks: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """The cases by group, groups and cases in run order."""
    out: Dict[str, List[Dict[str, Any]]] = {}
    for bench in benchmarks:
        out.setdefault(bench.get("group") or "(no group)", []).append(bench)
    return out


def reference(cases: List[Dict[str, Any]]) -> Dict[str, Any] | None:
    """The group's baseline, else its first floor."""
    for role in ("baseline", "floor"):
        for bench in cases:
            if bench.get("extra_info", {}).get("role") == role:
                return bench
    return None


def table(cases: List[Dict[str, Any]]) -> str:
    ref = reference(cases)
    base = per_op(ref) if ref else None
    lines = ["| case | µs/op | items/s | noise | x base |", "| --- | ---: | ---: | ---: | ---: |"]
    for bench in cases:
        info, seconds = bench.get("extra_info", {}), per_op(bench)
        stats = bench["stats"]
        name = info.get("case", bench["name"])
        if info.get("role"):
            name = f"{name} ({info['role']})"
        items = f"{interleave.rate(info['items'] / seconds)}" if "items" in info else "-"
        noise = f"±{50 * stats['iqr'] / stats['median']:.0f}%" if stats["median"] else "-"
        ratio = f"{seconds / base:,.2f}x" if base else "-"
        lines.append(f"| {name} | {interleave.num(seconds * 1e6)} | {items} | {noise} | {ratio} |")
    return "\n".join(lines)


def render(data: Dict[str, Any]) -> str:
    machine, commit = data.get("machine_info", {}), data.get("commit_info", {})
    load = machine.get("load_average_1min")
    load = f"{load:.1f}" if isinstance(load, (int, float)) else "?"
    head = (
        f"{data.get('datetime', '?')[:10]}; {machine.get('cpu_count', '?')} CPUs "
        f"({machine.get('cpu', {}).get('brand_raw', machine.get('processor', '?'))}), "
        f"Python {machine.get('python_version', '?')}, TensorFlow {machine.get('tensorflow', '?')}; "
        f"1-min load average {load} at the start; "
        f"commit {str(commit.get('id', '?'))[:10]}{' (dirty)' if commit.get('dirty') else ''}"
    )
    out = [head]
    for name, cases in groups(data.get("benchmarks", [])).items():
        out += ["", f"**{name}**", "", table(cases)]
    return "\n".join(out)


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="files written by pytest's --benchmark-json or --interleaved")
    args = parser.parse_args(argv)
    for i, path in enumerate(args.json):
        with open(path) as f:
            data = json.load(f)
        for j, run in enumerate(data["runs"] if "runs" in data else [data]):
            if i or j:
                print()
            print(interleave.render(run) if "runs" in data else render(run))


if __name__ == "__main__":
    main()
