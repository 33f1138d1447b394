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


def every_group(result: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each group's cases but its baseline, against that baseline, as one list of `bars` named `group: case`."""
    out = []
    for group in interleave.groups(result):
        out += [{**row, "case": f"{group}: {row['case']}"} for row in bars(result, group) if not row["reference"]]
    return out


def caption(result: Dict[str, Any]) -> str:
    """The run's line: what `benchmarks.interleave.render` heads its tables with."""
    return interleave.render({**result, "cases": []}).strip()


def versus_group(result: Dict[str, Any], group: str) -> str | None:
    """The group a group's cases are set beside (`versus`), where they are."""
    targets = {c["versus"][0] for c in interleave.groups(result)[group] if c.get("versus")}
    return next(iter(targets)) if len(targets) == 1 else None


def draw(
    result: Dict[str, Any], group: str | None, path: pathlib.Path, versus: bool = False, title: str = ""
) -> pathlib.Path:
    """One group's chart, written to `path` (PNG); with `versus`, its cases over the cases they are set beside;
    with `group` None, every group's cases against their own baselines in one chart called `title`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = bars(result, group, versus) if group is not None else every_group(result)
    if group is None:
        base, group = "its group's baseline", title
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
    ax.set_yticklabels([textwrap.shorten(r["case"], 58, placeholder="...") for r in rows], fontsize=8)
    top = max(r["high"] for r in rows)
    for yi, r in zip(y, rows):
        label = "1.00x (reference)" if r["reference"] else f"{r['median']:.2f}x" + (" parity" if r["parity"] else "")
        ax.text(r["high"] * 1.05 if top > 8 else r["high"] + top * 0.01, yi, label, va="center", fontsize=8)
    if top > 8:  # one case far out (a cold cache): a log axis keeps the others readable
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
    args = parser.parse_args(argv)
    written = []
    for source in args.json:
        for result in json.loads(source.read_text())["runs"]:
            if args.one_chart:
                written.append(draw(result, None, args.out / f"{source.stem}.png", title=args.one_chart))
                continue
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
