"""scripts/screenshots.py without a browser: the pages it shoots exist in the docs, its server serves the site on
the loopback interface and stops, and a missing site or browser is refused with what to do."""

from __future__ import annotations

import importlib.util
import pathlib
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("screenshots", ROOT / "scripts/screenshots.py")
screenshots = importlib.util.module_from_spec(spec)
spec.loader.exec_module(screenshots)


@pytest.mark.parametrize("name, path, shows", screenshots.PAGES)
def test_each_page_it_shoots_is_a_page_of_the_docs(name, path, shows):
    source = ROOT / "docs" / (path.rstrip("/") or "index")
    assert name.endswith(".png") and shows
    assert any(source.with_suffix(s).exists() for s in (".md", ".ipynb")), source


def test_the_site_is_served_on_the_loopback_interface_until_the_block_ends(tmp_path):
    (tmp_path / "index.html").write_text("<p>the site</p>")
    with screenshots.serve(tmp_path) as base:
        assert base.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(base, timeout=10) as page:
            assert page.read() == b"<p>the site</p>"
    with pytest.raises(OSError):
        urllib.request.urlopen(base, timeout=2)


def test_a_site_not_built_is_refused_with_the_command_that_builds_it(tmp_path):
    with pytest.raises(SystemExit, match=r"index.html is missing; run `make docs` first"):
        screenshots.main(["--site", str(tmp_path)])


def test_no_browser_is_refused_with_the_package_that_gives_one(monkeypatch):
    monkeypatch.setattr(screenshots.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match=r"no Chromium on PATH; install Debian's `chromium` package"):
        screenshots.find_chromium()
