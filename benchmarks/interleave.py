"""Interleaved timing: rounds as the outer loop, every case timed once inside each round, medians across rounds.

pytest-benchmark times its cases one after another, so a change in the
machine's load between two cases moves their ratio. Here each round times
every case for the same number of calls, a group's cases one after another;
the order of the groups, and of the cases in each, runs backwards every other
round and rotates by one place every two, so each case takes each position and
follows each other case about equally often. A case's figure is
its median over the rounds with the min-max; a ratio is taken within each round
(both sides under that round's load), then its median and min-max over the
rounds. A ratio whose min-max holds 1.0 is parity, not a win or a loss.

`make bench ROUNDS=7` (pytest's `--interleaved=7`, wired in `benchmarks/conftest.py`)
runs the benchmark files' cases this way; `python -m benchmarks.report` prints
the JSON it writes. `run` times any list of `Case`s directly.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

Clock = Callable[[], float]


@dataclasses.dataclass
class Case:
    """One timed call: `fn()` does `ops` operations of `items` items each; `setup()`, untimed, runs before each call.

    `role` is `"baseline"` (the group's denominator) or `"floor"` (the least
    that kind of call costs; the denominator where a group has no baseline).
    `versus` names one more case, `(group, case)`, to set this one beside in
    every round. `calls` fixes the calls per round; left at 0, `run` sizes it
    once, from a warm-up, to about its `seconds`.
    """

    group: str
    name: str
    fn: Callable[[], Any]
    ops: int = 1
    items: int | None = None
    role: str | None = None
    setup: Callable[[], Any] | None = None
    versus: Tuple[str, str] | None = None
    calls: int = 0


@dataclasses.dataclass(frozen=True)
class Spread:
    """A median over rounds and the least and greatest value."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The median, least and greatest of one value per round."""
        if not values:
            raise ValueError("Spread.of: values (empty) must hold at least one round")
        return cls(statistics.median(values), min(values), max(values))

    @property
    def parity(self) -> bool:
        """Whether the min-max holds 1.0: read as a ratio, neither side is faster in every round."""
        return self.low <= 1.0 <= self.high


def order(count: int, round_index: int) -> List[int]:
    """The case indices round `round_index` times, in turn: each pair of rounds runs one rotation forwards, then
    backwards, and the next pair rotates by one more place (over `2 * count` rounds each case takes each place
    twice, and each neighbour comes before it as often as after)."""
    shift = (round_index // 2) % count if count else 0
    turn = list(range(shift, count)) + list(range(shift))
    return turn[::-1] if round_index % 2 else turn


def schedule(groups: Sequence[str], round_index: int) -> List[int]:
    """The indices of cases (given by their groups) in the order round `round_index` times them: the groups in
    `order`, each group's cases together, in `order` among themselves, so a case and its group's baseline are
    timed seconds apart at most, under about the same load."""
    members: Dict[str, List[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    runs = list(members.values())
    out = []
    for g in order(len(runs), round_index):
        out += [runs[g][i] for i in order(len(runs[g]), round_index)]
    return out


def timed(case: Case, clock: Clock = time.perf_counter) -> float:
    """Seconds of `case.calls` calls of `case.fn` (its `setup` before each, not counted), the collector off."""
    total = 0.0
    enabled = gc.isenabled()
    gc.disable()
    try:
        if case.setup is None:
            start = clock()
            for _ in range(case.calls):
                case.fn()
            return clock() - start
        for _ in range(case.calls):
            case.setup()
            start = clock()
            case.fn()
            total += clock() - start
        return total
    finally:
        if enabled:
            gc.enable()


def calibrate(case: Case, seconds: float, warmup: int = 2, clock: Clock = time.perf_counter) -> int:
    """Calls per round for about `seconds` a round, from the slower of two timed calls after `warmup` untimed ones."""
    for _ in range(warmup):
        if case.setup is not None:
            case.setup()
        case.fn()
    probe = dataclasses.replace(case, calls=1)
    one = max(timed(probe, clock), timed(probe, clock))
    return max(1, math.ceil(seconds / one)) if one > 0 else 1


def load() -> float | None:
    """The 1-minute load average, where the system gives one."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def run(
    cases: Sequence[Case],
    rounds: int,
    seconds: float = 0.25,
    clock: Clock = time.perf_counter,
    progress: Callable[[str], Any] | None = None,
) -> Dict[str, Any]:
    """Times `cases` in `rounds` interleaved rounds; returns what `render` prints (and JSON can hold).

    Each case without a fixed `calls` is sized first (warm-up included), so
    every round times the same work. The result holds, per case, its seconds
    per operation in each round, and the load average before the first round
    and after each.
    """
    if rounds < 1:
        raise ValueError(f"run: rounds ({rounds}) must be at least 1")
    names = [(c.group, c.name) for c in cases]
    if len(set(names)) != len(names):
        raise ValueError(f"run: cases must be unique by (group, name); repeated: {_repeated(names)}")
    for case in cases:
        if case.calls <= 0:
            case.calls = calibrate(case, seconds, clock=clock)
    times: List[List[float]] = [[] for _ in cases]
    loads = [load()]
    for r in range(rounds):
        for i in schedule([c.group for c in cases], r):
            times[i].append(timed(cases[i], clock) / (cases[i].calls * cases[i].ops))
        loads.append(load())
        if progress is not None:
            progress(f"round {r + 1}/{rounds} done, 1-minute load average {_load(loads[-1])}")
    return {
        "rounds": rounds,
        "seconds": seconds,
        "loads": loads,
        "cases": [_record(c, t) for c, t in zip(cases, times)],
    }


def _repeated(names: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    return sorted({n for n in names if names.count(n) > 1})


def _record(case: Case, seconds: List[float]) -> Dict[str, Any]:
    out = {"group": case.group, "case": case.name, "ops": case.ops, "calls": case.calls, "seconds": seconds}
    out.update({k: v for k, v in (("items", case.items), ("role", case.role)) if v is not None})
    if case.versus is not None:
        out["versus"] = list(case.versus)
    return out


def _load(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"


# The statistics and the tables, from `run`'s result.
def reference(cases: Sequence[Dict[str, Any]]) -> Dict[str, Any] | None:
    """A group's denominator: its case marked baseline, else its first floor."""
    for role in ("baseline", "floor"):
        for case in cases:
            if case.get("role") == role:
                return case
    return None


def ratio(case: Dict[str, Any], base: Dict[str, Any]) -> Spread:
    """`case` over `base` within each round, then the median and min-max over the rounds."""
    return Spread.of([a / b for a, b in zip(case["seconds"], base["seconds"])])


def groups(result: Dict[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
    out: Dict[str, List[Dict[str, Any]]] = {}
    for case in result["cases"]:
        out.setdefault(case["group"], []).append(case)
    return out


def num(x: float) -> str:
    """A figure to 3 significant digits or whole above 100."""
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def rate(x: float) -> str:
    """A rate with its unit (K, M, G), to 3 significant digits."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if x / scale >= 0.9995:
            return f"{x / scale:.2f}{suffix}"
    return f"{x:.0f}"


def cell(spread: Spread, scale: float = 1.0, suffix: str = "") -> str:
    """`median (low-high)`, with ` parity` where a ratio's (`suffix` "x") min-max holds 1.0."""
    text = f"{num(spread.median * scale)}{suffix} ({num(spread.low * scale)}-{num(spread.high * scale)})"
    return text + (" parity" if suffix == "x" and spread.parity else "")


def _versus_title(cases: List[Dict[str, Any]], group: str) -> str | None:
    targets = {tuple(c["versus"]) for c in cases if "versus" in c}
    if not targets:
        return None
    if len({t[1] for t in targets}) == 1 and {t[0] for t in targets} == {group}:
        return f"x {next(iter(targets))[1]}"
    if len({t[0] for t in targets}) == 1 and all(c["case"] == c["versus"][1] for c in cases if "versus" in c):
        return f"x {next(iter(targets))[0]}"
    return "x versus"


def table(result: Dict[str, Any], group: str) -> str:
    """One group's Markdown table: µs per operation and, per round, each case over the group's baseline."""
    cases, every = groups(result)[group], {(c["group"], c["case"]): c for c in result["cases"]}
    base, versus = reference(cases), _versus_title(cases, group)
    head = "| case | µs/op | items/s | x base |" + (f" {versus} |" if versus else "")
    lines = [head, "| --- | ---: | ---: | ---: |" + (" ---: |" if versus else "")]
    for case in cases:
        own = Spread.of(case["seconds"])
        name = case["case"] + (f" ({case['role']})" if case.get("role") else "")
        items = rate(case["items"] / own.median) if case.get("items") else "-"
        x = "-" if base is None else "1.00x" if case is base else cell(ratio(case, base), suffix="x")
        row = f"| {name} | {cell(own, 1e6)} | {items} | {x} |"
        if versus:
            other = every.get(tuple(case.get("versus", ())))
            text = cell(ratio(case, other), suffix="x") if other else "-"
            if other and versus == "x versus":
                text += f" vs {other['case']}"
            row += f" {text} |"
        lines.append(row)
    return "\n".join(lines)


def render(result: Dict[str, Any]) -> str:
    """A head line (rounds, load average at the start and at most, and `result["about"]` where set), then the
    tables."""
    loads = [x for x in result["loads"] if x is not None]
    head = (
        f"{result['rounds']} interleaved rounds of about {result['seconds']:g} s per case; "
        f"1-minute load average {_load(loads[0] if loads else None)} at the start, "
        f"{_load(max(loads) if loads else None)} at most"
    )
    if result.get("about"):
        head = f"{result['about']}; {head}"
    out = [head]
    for group in groups(result):
        out += ["", f"**{group}**", "", table(result, group)]
    return "\n".join(out)
