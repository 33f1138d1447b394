"""Runs each tutorial with its own parameters and writes the notebook, outputs and plots included, that the site shows.

    python tutorials/execute.py [NN_topic ...]      (`make tutorials-site`; all four by default)

Each `tutorials/NN_topic.py` (a jupytext percent script) runs top to bottom
in a fresh kernel of this interpreter, in an empty temporary folder (nothing
is left in the checkout), and is saved as `docs/tutorials/NN_topic.ipynb`.
The saved notebook keeps what a reader would see (outputs, plots, execution
counts) and drops what changes from run to run without meaning anything
(cell timings, kernel versions). The test suite checks that each saved
notebook holds its tutorial's current cells, executed in order without an
error, so a tutorial edited without running this fails `make test`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ROOT / "tutorials"
SITE = ROOT / "docs" / "tutorials"
CELL_TIMEOUT = 1800  # seconds; the longest cell trains DQN to its target


def execute(
    source: pathlib.Path, folder: str, parameters: dict | None = None, timeout: int = CELL_TIMEOUT
) -> nbformat.NotebookNode:
    """`source` run in a fresh kernel whose working directory is `folder`, this checkout first on its path;
    `parameters` (name -> value), if given, replace the cell tagged `parameters`. Raises `CellExecutionError`,
    with the failing cell and its traceback, on any error."""
    nb = jupytext.read(source, fmt="py:percent")
    if parameters is not None:
        (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        cell.source = "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # the notebook sets it
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [environ.get("PYTHONPATH")])])
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", coalesce_streams=True, resources={"metadata": {"path": folder}}
    )
    client.execute(env=environ)
    return nb


def settled(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """`nb` without what differs between two identical runs: cell timings and the kernel's versions."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="tutorials to run, e.g. 01_replay_buffers (default: all)")
    args = parser.parse_args(argv)
    sources = sorted(SOURCES.glob("[0-9][0-9]_*.py"))
    unknown = set(args.names) - {s.stem for s in sources}
    if unknown:
        parser.error(f"no tutorial named {sorted(unknown)}; the tutorials: {[s.stem for s in sources]}")
    SITE.mkdir(parents=True, exist_ok=True)
    for source in sources:
        if args.names and source.stem not in args.names:
            continue
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"{source.stem}-") as folder:
            nb = settled(execute(source, folder))
        target = SITE / f"{source.stem}.ipynb"
        nbformat.write(nb, target)
        print(f"{source.stem}: ran in {time.monotonic() - start:.0f} s, wrote {target.relative_to(ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
