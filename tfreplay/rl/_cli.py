"""How tfreplay's command-line programs start: `absl.app.run`, except that asking for help exits 0.

absl's `--help` prints the usage and exits with status 1, which reads as a
failure to a shell, a Makefile or a CI smoke check; here the help flags print
the usage on stdout and exit 0. Every other argument goes to absl's parser.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

from absl import app, flags

_SHORT_HELP = frozenset({"--help", "-help", "--helpshort", "-helpshort", "-?"})
_FULL_HELP = frozenset({"--helpfull", "-helpfull"})


def _usage(full: bool, module: str | None) -> None:
    if full or module is None:
        app.usage(shorthelp=not full, writeto_stdout=True)
        return
    # The short help lists one module's flags: a console script's __main__ (which absl would list) has none.
    doc = sys.modules[module].__doc__ or ""
    sys.stdout.write(f"{doc.rstrip()}\n\nflags:\n{flags.FLAGS.module_help(module)}\n")


def parse_flags(argv: list[str], module: str | None = None) -> list[str]:
    """absl's flag parsing; a help flag before any `--` prints the usage and exits 0.

    Args:
      argv: the command line, program name first.
      module: the module whose docstring and flags the short help shows (default: `__main__`'s, as absl does).
    """
    options = set(argv[1 : argv.index("--")] if "--" in argv else argv[1:])
    if options & (_SHORT_HELP | _FULL_HELP):
        _usage(bool(options & _FULL_HELP), module)
        sys.exit(0)
    return app.parse_flags_with_usage(argv)


def run(main: Callable[[list[str]], Any], argv: Sequence[str] | None = None, module: str | None = None) -> None:
    """`absl.app.run(main)` with `parse_flags` (help for `module`'s flags)."""
    app.run(main, argv=list(argv) if argv is not None else None, flags_parser=lambda a: parse_flags(a, module))
