"""How the examples start: `tfreplay.rl._cli` (`absl.app.run`, except that asking for help exits 0)."""

from tfreplay.rl._cli import parse_flags, run  # noqa: F401
