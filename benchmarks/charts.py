"""Charts for the Benchmarks page from interleaved runs: `python -m benchmarks.charts JSON [...] --out DIR`.

Each group of each run (`--interleaved-json`, `make bench ROUNDS=R`) becomes
one PNG, `DIR/<json stem>-<group>.png`: a bar per case, its ratio to the
group's baseline (or floor) as the median over the rounds, the min-max as a
whisker, a line at 1.0, and the cases whose min-max holds 1.0 labelled
parity. A group whose cases are set beside another group's (the prioritized
learner beside the uniform one) gets a second chart of those ratios,
`...-versus.png`. `--one-chart TITLE` draws every group of a run in one
chart instead, each case against its own group's baseline (`DIR/<json
stem>.png`). The title is the group; under it, the run's own line (file, date,
machine, versions, rounds, load), so a chart never leaves its command and
machine behind. `--groups` keeps some groups only (substrings of their names).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import textwrap
from typing import Any, Dict, List, Sequence

from benchmarks import interleave


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def bars(result: Dict[str, Any], group: str, versus: bool = False) -> List[Dict[str, Any]]:
    """A group's cases as `{"case", "median", "low", "high", "parity", "reference"}`: ratios to its baseline, or
    with `versus` those of its cases set beside another case (e.g. prioritized beside uniform) to that case."""
    cases = interleave.groups(result)[group]
    base = interleave.reference(cases)
    if base is None and not versus:
        raise ValueError(f"charts: group {group!r} has no baseline or floor case to set its cases against")
    every = {(c["group"], c["case"]): c for c in result["cases"]}
    out = []
    for case in cases:
        other = every.get(tuple(case.get("versus", ()))) if versus else base
        if other is None:  # with `versus`: a case set beside nothing
            continue
        spread = interleave.ratio(case, other)
        reference = case is other
        out.append(
            {
                "case": case["case"],
                "median": spread.median,
                "low": spread.low,
                "high": spread.high,
                "parity": not reference and spread.parity,
                "reference": reference,
            }
        )
    return out


def every_group(
    result: Dict[str, Any], keep: Sequence[str] = (), versus: bool = False, beside: Sequence[str] = ()
) -> List[Dict[str, Any]]:
    """Bars from every group (or those whose names hold one of `keep`), named `group: case`: each case but the
    baseline over its group's baseline; with `versus`, each case set beside another over that case; with
    `beside`, each group's tfreplay case over the case of each peer named (its name's first word), where the group
    has one."""
    out = []
    for group, cases in interleave.groups(result).items():
        if keep and not any(k in group for k in keep):
            continue
        if beside:
            out += _beside(group, cases, beside)
            continue
        rows = [row for row in bars(result, group, versus) if versus or not row["reference"]]
        out += [{**row, "case": f"{group}: {row['case']}", "reference": False} for row in rows]
    return out


def _beside(group: str, cases: List[Dict[str, Any]], peers: Sequence[str]) -> List[Dict[str, Any]]:
    """The group's tfreplay case (its NumPy-side one, "tfreplay Py", where it has several) over each peer's."""
    mine = [c for c in cases if c["case"].split()[0] == "tfreplay"]
    mine = [c for c in mine if c["case"].endswith(" Py")] or mine
    out = []
    for peer in peers:
        theirs = [c for c in cases if c["case"].split()[0] == peer]
        if mine and theirs:
            spread = interleave.ratio(mine[0], theirs[0])
            name = f"{group}: {mine[0]['case']} / {theirs[0]['case']}"
            row = {"case": name, "median": spread.median, "low": spread.low, "high": spread.high}
            out.append({**row, "parity": spread.parity, "reference": False})
    return out


def caption(result: Dict[str, Any]) -> str:
    """The run's line: what `benchmarks.interleave.render` heads its tables with."""
    return interleave.render({**result, "cases": []}).strip()


def versus_group(result: Dict[str, Any], group: str) -> str | None:
    """The group a group's cases are set beside (`versus`), where they are."""
    targets = {c["versus"][0] for c in interleave.groups(result)[group] if c.get("versus")}
    return next(iter(targets)) if len(targets) == 1 else None


def draw(
    result: Dict[str, Any],
    group: str | None,
    path: pathlib.Path,
    versus: bool = False,
    title: str = "",
    keep: Sequence[str] = (),
    beside: Sequence[str] = (),
) -> pathlib.Path:
    """One group's chart, written to `path` (PNG); with `versus`, its cases over the cases they are set beside;
    with `group` None, the bars of `every_group` in one chart called `title`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = bars(result, group, versus) if group is not None else every_group(result, keep, versus, beside)
    if not rows:
        raise ValueError(f"charts: nothing to draw for {title or group!r} (no group or case matches)")
    if group is None:
        base = "the peer's" if beside else "the case it is set beside" if versus else "its group's baseline"
        group = title
    elif versus:
        other = versus_group(result, group)
        base, group = f"the same case of {other}", f"{group} over {other}"
    else:
        base = next(r["case"] for r in rows if r["reference"])
    height = 1.2 + 0.42 * len(rows)
    fig, ax = plt.subplots(figsize=(9, height))
    y = list(range(len(rows)))[::-1]
    medians = [r["median"] for r in rows]
    errors = [[r["median"] - r["low"] for r in rows], [r["high"] - r["median"] for r in rows]]
    colors = ["#9e9e9e" if r["reference"] else "#4c72b0" if r["median"] >= 1 else "#55a868" for r in rows]
    ax.barh(y, medians, xerr=errors, color=colors, height=0.6, error_kw={"ecolor": "#333333", "capsize": 3})
    ax.axvline(1.0, color="#c44e52", linewidth=1)
    ax.set_yticks(y)
    names = [r["case"] for r in rows]
    first = {name.split()[0] for name in names}
    if len(first) == 1 and len(rows) > 1 and all(": " in name for name in names):  # every group's first word
        names = [name.split(" ", 1)[1] for name in names]
    ax.set_yticklabels([textwrap.shorten(name, 58, placeholder="...") for name in names], fontsize=8)
    top = max(r["high"] for r in rows)
    log = top > 8 or min(r["low"] for r in rows) < 0.1  # cases far out: a log axis keeps the others readable
    for yi, r in zip(y, rows):
        figure = f"{r['median']:.2f}x" if r["median"] >= 0.1 else f"{r['median']:.2g}x"
        label = "1.00x (reference)" if r["reference"] else figure + (" parity" if r["parity"] else "")
        ax.text(r["high"] * 1.08 if log else r["high"] + top * 0.01, yi, label, va="center", fontsize=8)
    if log:
        ax.set_xscale("log")
        ax.set_xlim(min(r["low"] for r in rows) / 1.5, top * 3)
    else:
        ax.set_xlim(0, top * 1.25)
    reference = textwrap.shorten(base, 40, placeholder="...")
    ax.set_xlabel(f"time per operation / {reference} (median, min-max; lower is faster)", fontsize=9)
    ax.set_title(group, fontsize=11, loc="left")
    fig.text(0.01, 0.005, "\n".join(textwrap.wrap(caption(result), 150)), fontsize=6, va="bottom", color="#555555")
    fig.tight_layout(rect=(0, 0.08 + 0.2 / height, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> List[pathlib.Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=pathlib.Path, help="interleaved runs (--interleaved-json files)")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the folder the PNGs go to")
    parser.add_argument("--groups", nargs="*", default=None, help="keep the groups whose names hold one of these")
    parser.add_argument("--one-chart", default=None, metavar="TITLE", help="all groups of a run in one chart")
    parser.add_argument("--name", default=None, help="with --one-chart: the PNG's name (default: the JSON's stem)")
    parser.add_argument("--versus", action="store_true", help="with --one-chart: cases over those set beside them")
    parser.add_argument("--beside", nargs="*", default=(), help="with --one-chart: tfreplay over these peers")
    args = parser.parse_args(argv)
    written = []
    for source in args.json:
        runs = json.loads(source.read_text())["runs"]
        if args.one_chart:  # the first run that has the groups asked for
            run = next(
                r for r in runs if not args.groups or any(g in c["group"] for c in r["cases"] for g in args.groups)
            )
            path = args.out / f"{args.name or source.stem}.png"
            written.append(draw(run, None, path, args.versus, args.one_chart, args.groups or (), args.beside))
            continue
        for result in runs:
            for group in interleave.groups(result):
                if args.groups and not any(g in group for g in args.groups):
                    continue
                path = args.out / f"{source.stem}-{_slug(group)}.png"
                written.append(draw(result, group, path))
                if versus_group(result, group):
                    written.append(draw(result, group, path.with_name(f"{path.stem}-versus.png"), versus=True))
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
