"""The demo lives in the package: `tfreplay-demo` or `python -m tfreplay.rl.demo`; this name still runs it."""

from tfreplay.rl.demo import FLAGS, config_from_flags, main, run  # noqa: F401

if __name__ == "__main__":
    run()
