"""How the examples start: `absl.app.run`, except that asking for help ends with exit status 0.

absl's `--help` prints the usage and exits with status 1, which reads as a
failure to a shell, a Makefile or CI smoke check; here the help flags print
the same usage and exit 0. Every other argument goes to absl's own parser.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from absl import app

_SHORT_HELP = frozenset({"--help", "-help", "--helpshort", "-helpshort", "-?"})
_FULL_HELP = frozenset({"--helpfull", "-helpfull"})


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing; a help flag before any `--` prints the usage and exits 0."""
    options = set(argv[1 : argv.index("--")] if "--" in argv else argv[1:])
    if options & (_SHORT_HELP | _FULL_HELP):
        app.usage(shorthelp=not options & _FULL_HELP, writeto_stdout=True)
        sys.exit(0)
    return app.parse_flags_with_usage(argv)


def run(main: Callable[[list[str]], Any]) -> None:
    """`absl.app.run(main)` with `parse_flags`."""
    app.run(main, flags_parser=parse_flags)
