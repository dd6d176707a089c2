"""The README is a learner's five-minute page whose links all lead somewhere; the manual
(docs/, mkdocs.yml) builds strictly and offline, and its pages load nothing from the internet.

`make docs` builds the site in CI (`mkdocs build --strict`: a broken link or anchor between
pages, a page left out of the nav or an API reference that no longer resolves fails). The
README is not part of the site, so its links are checked here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import yaml

from .conftest import ROOT

README = Path(ROOT, "README.md")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_is_short() -> None:
    """The issue's bar: a page a learner reads in five minutes (it was 73 KB)."""
    assert len(README.read_bytes()) < 15_000


def test_every_link_and_picture_of_the_readme_is_there() -> None:
    targets = LINK.findall(README.read_text(encoding="utf-8"))
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert len(local) >= 10 and any(t.startswith("docs/") for t in local)
    missing = [t for t in local if not Path(ROOT, t.split("#")[0]).exists()]
    assert missing == []


def test_the_site_is_configured_to_fetch_nothing() -> None:
    """No web fonts (Material loads Google Fonts unless `font: false`), and only plugins that
    work offline: search (built into the site) and mkdocstrings (reads the source)."""
    config = yaml.safe_load(Path(ROOT, "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["theme"]["name"] == "material" and config["theme"]["font"] is False
    plugins = {next(iter(p)) if isinstance(p, dict) else p for p in config["plugins"]}
    assert plugins <= {"search", "mkdocstrings"}
    assert config["strict"] is True


class _Resources(HTMLParser):
    """Every address a page loads by itself (scripts, styles, pictures, fonts, frames)."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag in {"script", "img", "iframe", "source", "video", "audio"} and found.get("src"):
            self.loaded.append(found["src"] or "")
        if tag == "link" and found.get("rel") in {"stylesheet", "preload", "icon", "preconnect"}:
            self.loaded.append(found.get("href") or "")


def test_the_built_site_loads_nothing_from_outside(tmp_path: Path) -> None:
    """The site built as `make docs` builds it: every page's scripts, styles and pictures are
    the site's own files (the learner reads it offline, in a classroom without internet)."""
    site = tmp_path / "site"
    done = subprocess.run([Path(sys.executable).parent / "mkdocs", "build", "--strict", "--quiet",
                           "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    pages = list(site.rglob("*.html"))
    assert len(pages) >= 15
    outside = {}
    for page in pages:
        parser = _Resources()
        parser.feed(page.read_text(encoding="utf-8"))
        assert parser.loaded, page
        outside[page.name] = [u for u in parser.loaded if re.match(r"([a-z]+:)?//", u)]
    assert {name: urls for name, urls in outside.items() if urls} == {}
    assert (site / "screenshots" / "04-transpose.svg").is_file()
    css = " ".join(p.read_text(encoding="utf-8") for p in site.rglob("*.css"))
    assert "fonts.googleapis" not in css and "@import url(http" not in css
