"""Screenshots of the built docs site, as a reader's browser draws it: `make screenshots` (after `make docs`).

Serves `site/` on 127.0.0.1 and has headless Chromium draw the home page, a guide, an executed tutorial and the
Benchmarks page into PNGs (default `site-screenshots/`), each at a desktop width and tall enough to hold the page's
first figures. Chromium comes from the system (`chromium` or `chromium-browser` on PATH; Debian's `chromium`
package).

    python scripts/screenshots.py [--site site] [--out site-screenshots] [--height 2400]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import pathlib
import shutil
import subprocess
import sys
import threading

# (file name, page path in the site, what a reader should see on it)
PAGES = [
    ("home.png", "", "the demo's learning curve, the install line and the quick start"),
    ("guide-collect-and-train.png", "guides/collect-and-train/", "a guide with the demo's curve and its code"),
    ("tutorial-collect-and-train.png", "tutorials/02_collect_and_train/", "an executed tutorial, outputs shown"),
    ("benchmarks.png", "benchmarks/", "the Benchmarks page's summary and charts"),
]


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("screenshots: no Chromium on PATH; install Debian's `chromium` package (apt-get install chromium)")


@contextlib.contextmanager
def serve(site: pathlib.Path):
    """The site on an unused port of 127.0.0.1, for as long as the block runs; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def shoot(chromium: str, url: str, out: pathlib.Path, width: int, height: int) -> None:
    command = [
        chromium,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",  # lets the page's scripts (the theme, its diagrams) finish before the shot
        f"--window-size={width},{height}",
        f"--screenshot={out}",
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"screenshots: Chromium failed on {url}:\n{done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", default="site", help="the built site (make docs)")
    parser.add_argument("--out", default="site-screenshots", help="where the PNGs go")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=2400)
    args = parser.parse_args(argv)
    site, out = pathlib.Path(args.site), pathlib.Path(args.out)
    if not (site / "index.html").exists():
        sys.exit(f"screenshots: {site}/index.html is missing; run `make docs` first")
    chromium = find_chromium()
    out.mkdir(parents=True, exist_ok=True)
    with serve(site) as base:
        for name, path, shows in PAGES:
            shoot(chromium, base + path, out / name, args.width, args.height)
            print(f"{out / name}: {shows}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
