"""Each CI lane's wall time against the budget, and the slowest tests of the run, from a `.ci/run` log.

`.ci/run` prints a line `::lane NAME` before each lane and `::lane NAME done in S s` after it; every pytest run
prints its slowest tests (`--durations`). This reads both back:

    python3 .ci/lanes.py ci.log            # the table and the 20 slowest tests
    python3 .ci/lanes.py ci.log --most 40

Standard library only: it runs before any venv exists. It exits 0 whatever the times are (a noisy machine
must not fail a run); a lane over its share is flagged in the table.
"""

from __future__ import annotations

import argparse
import re
import sys

# The budget, in minutes (also written at the top of .ci/run): the whole run, and `make test`.
BUDGET = {"total": 40.0, "test": 12.0}

_LANE = re.compile(r"^::lane (\S+)(?: done in (\d+) s)?\s*$")
_REPORT_HEAD = "| lane | wall"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s (call|setup|teardown)\s+(\S.*?)\s*$")


def parse(lines):
    """`(lane seconds, durations)`: {lane: seconds}, and [(seconds, phase, test, lane)] from every pytest run."""
    seconds: dict[str, int] = {}
    durations = []
    lane = "-"
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith(_REPORT_HEAD):  # `.ci/run` ends its log with this report: the log's own lines are read
            break
        match = _LANE.match(line)
        if match:
            lane = match.group(1)
            if match.group(2) is not None:
                seconds[lane] = int(match.group(2))
            continue
        match = _DURATION.match(line)
        if match:
            durations.append((float(match.group(1)), match.group(2), match.group(3), lane))
    return seconds, durations


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def report(seconds: dict, durations: list, most: int) -> str:
    total = sum(seconds.values())
    rows = [_REPORT_HEAD + " (m:ss) | share | budget |", "|---|---:|---:|---|"]
    for lane, secs in seconds.items():
        limit = BUDGET.get(lane)
        verdict = "" if limit is None else ("ok" if secs <= limit * 60 else f"OVER {limit:.0f} min")
        rows.append(f"| {lane} | {minutes(secs)} | {secs / max(total, 1):.0%} | {verdict} |")
    limit = BUDGET["total"]
    verdict = "ok" if total <= limit * 60 else f"OVER {limit:.0f} min"
    rows.append(f"| **all** | {minutes(total)} | 100% | {verdict} |")
    slowest = sorted(durations, reverse=True)[:most]
    rows += ["", f"The {len(slowest)} slowest tests (seconds, phase, lane):", ""]
    rows += [f"{secs:8.2f}s {phase:<8} {lane:<14} {test}" for secs, phase, test, lane in slowest]
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="a .ci/run log")
    parser.add_argument("--most", type=int, default=20, help="how many slowest tests to list (default 20)")
    args = parser.parse_args(argv)
    with open(args.log, encoding="utf-8", errors="replace") as log:
        seconds, durations = parse(log)
    print(report(seconds, durations, args.most))
    return 0


if __name__ == "__main__":
    sys.exit(main())
