"""Before/after from interleaved runs: `python -m benchmarks.compare --before A.json [A2.json ...] --after B.json ...`.

Each JSON is one `--interleaved-json` file (`make bench ROUNDS=R`), made by the
same benchmark files on two versions of the library, run alternately on one
machine. Every case is taken over its group's floor (or baseline) within its
round, which takes the machine's drift out; the table gives each case's median
of those ratios on each side, pooled over the rounds of all that side's runs,
and after over before. A change within the two sides' min-max spread is not a
change.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any, Dict, List, Tuple

from benchmarks import interleave

Key = Tuple[str, str, str]  # (file, group, case)


def normalized(paths: List[str]) -> Dict[Key, List[float]]:
    """Per case, its seconds over its group's reference in each round of each run."""
    out: Dict[Key, List[float]] = {}
    for path in paths:
        for run in json.loads(open(path).read())["runs"]:
            groups: Dict[str, List[Dict[str, Any]]] = {}
            for case in run["cases"]:
                groups.setdefault(case["group"], []).append(case)
            for group, cases in groups.items():
                base = interleave.reference(cases)
                for case in cases:
                    if base is None or case is base:
                        continue
                    ratios = [a / b for a, b in zip(case["seconds"], base["seconds"])]
                    out.setdefault((run["about"].split(",")[0], group, case["case"]), []).extend(ratios)
    return out


def table(before: Dict[Key, List[float]], after: Dict[Key, List[float]]) -> str:
    rows = ["| group | case | before (x floor) | after (x floor) | after / before |", "|---|---|---:|---:|---:|"]
    changes = []
    for key in sorted(set(before) & set(after)):
        b, a = before[key], after[key]
        change = statistics.median(a) / statistics.median(b)
        changes.append(change)
        spread = lambda xs: f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"  # noqa: E731
        rows.append(f"| {key[1]} | {key[2]} | {spread(b)} | {spread(a)} | {change:.2f} |")
    if changes:
        rows.append(
            f"\n{len(changes)} cases; after / before: median {statistics.median(changes):.2f}, "
            f"range {min(changes):.2f}-{max(changes):.2f}"
        )
    return "\n".join(rows)


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", required=True)
    parser.add_argument("--after", nargs="+", required=True)
    args = parser.parse_args(argv)
    print(table(normalized(args.before), normalized(args.after)))


if __name__ == "__main__":
    main()
