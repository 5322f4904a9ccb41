"""The documentation site's sources, fast (no Sphinx build: ``make docs`` builds it with warnings as
errors and checks the built links): every page is in a toctree, the generated reference pages cover
what the code defines, the link checker finds what is broken, the README's links resolve."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(REPO / "tools"))

pytest.importorskip("sphinx", reason="the docs extra (jdist[docs]) is not installed")

import check_docs_links
import jdist_docs


def _toctree_entries(page: Path) -> list[Path]:
    out = []
    for block in re.findall(r"```\{toctree\}\n(.*?)```", page.read_text(), re.DOTALL):
        for line in block.splitlines():
            line = line.strip()
            if not line or line.startswith(":"):
                continue
            target = re.sub(r"^.*<(.+)>$", r"\1", line)
            base = REPO if target.startswith("/") else page.parent
            path = base / target.lstrip("/")
            if "*" in target:
                out += sorted(path.parent.glob(path.name + ".ipynb"))
            else:
                out.append(next(p for p in (path.with_suffix(".md"), path.with_suffix(".ipynb")) if p.exists()))
    return out


def test_every_page_is_in_a_toctree() -> None:
    seen, todo = set(), [DOCS / "index.md"]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        if page.suffix == ".md":
            todo += _toctree_entries(page)
    pages = {p for p in DOCS.rglob("*.md") if not any(part.startswith("_") for part in p.relative_to(DOCS).parts)}
    pages |= set((REPO / "notebooks").glob("*.ipynb")) | {REPO / "CHANGELOG.md", REPO / "CONTRIBUTING.md"}
    assert pages - seen == set(), "pages no toctree reaches (add them to docs/index.md or a section page)"


def test_option_reference_has_every_option() -> None:
    from jdist.plugins import option_table

    table = option_table()
    rst = "\n".join(jdist_docs.options_rst(table))
    for opt in (*table.cluster, *table.cell):
        assert f"``{opt.flags[-1]}``" in rst, opt.name
    assert rst.count("   * - ``") == len(table.cluster) + len(table.cell)


def test_cli_reference_has_every_command() -> None:
    from jdist.cli import parser

    helps = dict(jdist_docs.cli_helps())
    sub = next(a for a in parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    assert set(helps) == {"jdist", *(f"jdist {name}" for name in sub.choices)}
    assert "--version" in helps["jdist"]
    assert "--backend" in helps["jdist run"]


def test_api_reference_has_every_public_name() -> None:
    import jdist

    groups = jdist_docs.api_groups()
    listed = [name for names in groups.values() for name in names]
    assert sorted(listed) == sorted(set(jdist.__all__) - {"load_ipython_extension"})
    assert "prepare" in groups["jdist.rank"] and "last_run" in groups["jdist.kernel"] and "Run" in groups[""]


def test_link_checker_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "index.html").write_text('<a href="docs/a.html#here">ok</a>')
    (tmp_path / "docs" / "a.html").write_text(
        '<h1 id="here">A</h1><a href="#here">self</a><a href="b.html">gone</a><a href="a.html#nowhere">bad</a>'
        '<a href="https://example.org/x">external, not fetched</a>')
    checked, problems = check_docs_links.check(tmp_path)
    assert checked == 4
    assert problems == ["docs/a.html: b.html -> no such file",
                        "docs/a.html: a.html#nowhere -> no id 'nowhere' in docs/a.html"]


def test_readme_links_resolve() -> None:
    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local, "the README links into the docs"
    for link in local:
        assert (REPO / link.split("#")[0]).exists(), link
