#!/usr/bin/env python
"""Every internal link of the built site points at a page that exists and, with a ``#fragment``,
at an id on that page. Run by ``make docs`` after ``sphinx-build`` (which already fails on links
between documents it knows); this catches the rest: links to files the site does not carry, and
anchors inside pages, in the HTML as a browser follows it.

Usage::

    .venv/bin/python tools/check_docs_links.py build/docs/html

External links (``http(s):``, ``mailto:``) are not fetched: the build runs where only the package
registries are reachable. Prints ``check-docs-links: N passed, M failed`` (one per link checked).
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

SKIP_DIRS = ("_static", "_sources", "_images", "_downloads")


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key) and (key == "id" or tag == "a"):
                self.ids.add(a[key] or "")
        if tag == "a" and a.get("href"):
            self.links.append(a["href"] or "")
        if tag in ("img", "script") and a.get("src"):
            self.links.append(a["src"] or "")
        if tag == "link" and a.get("href") and a.get("rel") in ("stylesheet", "preload"):
            self.links.append(a["href"] or "")


def parse(path: Path, cache: dict[Path, Page]) -> Page:
    if path not in cache:
        page = Page()
        page.feed(path.read_text(errors="replace"))
        cache[path] = page
    return cache[path]


def check(site: Path) -> tuple[int, list[str]]:
    cache: dict[Path, Page] = {}
    problems, checked = [], 0
    for html in sorted(site.rglob("*.html")):
        rel = html.relative_to(site)
        if rel.parts[0] in SKIP_DIRS:
            continue
        for link in parse(html, cache).links:
            parts = urlsplit(link)
            if parts.scheme or link.startswith("//") or link.startswith("javascript:"):
                continue
            checked += 1
            target = html if not parts.path else (html.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                problems.append(f"{rel}: {link} -> no such file")
                continue
            if parts.fragment and target.suffix == ".html":
                if unquote(parts.fragment) not in parse(target, cache).ids:
                    problems.append(f"{rel}: {link} -> no id {parts.fragment!r} in {target.relative_to(site)}")
    return checked, problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    site = Path(args[0] if args else "build/docs/html").resolve()
    if not (site / "index.html").exists():
        print(f"check-docs-links: no site at {site}: run `make docs` first")
        return 1
    checked, problems = check(site)
    for p in problems:
        print(f"FAILED {p}")
    print(f"check-docs-links: {checked - len(problems)} passed, {len(problems)} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
