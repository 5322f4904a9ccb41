"""Sphinx directives that generate jdist's reference pages from the code, so they cannot drift:

* ``jdist-options``: every ``%%distributed`` option from :func:`jdist.plugins.option_table`
  (jdist's own and the installed plugins'), with its flags, value, default, scope and help;
* ``jdist-cli``: the help of ``jdist`` and of each subcommand, from :func:`jdist.cli.parser`;
* ``jdist-api``: autodoc entries for every public name of ``jdist`` (``jdist.__all__``),
  grouped by where it runs (the module that defines it: ``jdist.rank``, ``jdist.kernel`` or
  elsewhere).
"""

from __future__ import annotations

import argparse
import inspect
import os
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _value(opt: Any) -> str:
    if opt.switch:
        return "(switch)"
    if getattr(opt, "toggle", False):
        return "``on|off``"
    if opt.choices:
        return "``" + "|".join(str(c) for c in opt.choices) + "``"
    if opt.metavar:
        return f"``{opt.metavar}``"
    return f"``{getattr(opt.type, '__name__', 'value').upper()}``" if opt.type else ""


class _Rst(SphinxDirective):
    def emit(self, lines: list[str]) -> list[nodes.Node]:
        """Parse reST lines in place of the directive (in a MyST page: through its eval-rst)."""
        container = nodes.container()
        if type(self.state).__module__.startswith("myst_parser"):
            lines = ["````{eval-rst}", *lines, "````"]
        self.state.nested_parse(StringList(lines, source="jdist_docs"), self.content_offset, container)
        return container.children


def options_rst(table: Any) -> list[str]:
    """reST lines of the option table: a list-table of cluster options, then one of cell options."""
    owners = {name: f"{found[0].kind} ``{found[0].name}``" for name, found in table.owned.items() if found}
    lines = []
    for kind, title in (("cluster", "Cluster options (where and how the ranks run)"),
                        ("cell", "Cell options (this cell, or a destination for its records)")):
        lines += [f".. rubric:: {title}", "",
                  ".. list-table::", "   :header-rows: 1", "   :widths: 18 12 10 8 52", "   :class: jdist-options", "",
                  "   * - option", "     - value", "     - default", "     - scope", "     - what it does"]
        for opt in getattr(table, kind):
            default = "" if opt.default in (None, False, "") else f"``{opt.default}``"
            lines += [f"   * - ``{'``, ``'.join(opt.flags)}``", f"     - {_value(opt)}", f"     - {default}",
                      f"     - {opt.scope.value}",
                      f"     - {_cell(opt.help)} {_cell(opt.scope.note)}"
                      + (f" (from the {owners[opt.name]})" if opt.name in owners else "")]
        lines.append("")
    return lines


class OptionsDirective(_Rst):
    """The option table: one row per option, cluster options first."""

    def run(self) -> list[nodes.Node]:
        from jdist.plugins import option_table

        return self.emit(options_rst(option_table()))


def cli_helps() -> list[tuple[str, str]]:
    """``(command, its --help)`` for ``jdist`` and each subcommand, at 100 columns."""
    from jdist.cli import parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal's width: the same on every machine
    try:
        top = parser()
        helps = [("jdist", top.format_help())]
        for action in top._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    helps.append((f"jdist {name}", sub.format_help()))
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return helps


class CliDirective(_Rst):
    """``jdist --help`` and every subcommand's ``--help``, as the terminal prints them."""

    def run(self) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        helps = cli_helps()
        for title, text in helps:
            out.append(nodes.rubric(text=f"{title} --help"))
            block = nodes.literal_block(text, text, classes=["jdist-cli"])
            block["language"] = "text"
            out.append(block)
        return out


#: Where each public name runs, by the package of the module that defines it.
_WHERE = (("jdist.rank", "On the ranks (inside %%distributed cells)"),
          ("jdist.kernel", "In the notebook kernel"),
          ("", "Anywhere"))


def api_groups() -> dict[str, list[str]]:
    """The public names of ``jdist`` by where they run (keys: the prefixes of :data:`_WHERE`)."""
    import jdist

    groups: dict[str, list[str]] = {prefix: [] for prefix, _ in _WHERE}
    for name in jdist.__all__:
        if name == "load_ipython_extension":
            continue  # %load_ext jdist: the magics page documents what it adds
        module = jdist._LAZY[name]
        groups[next(p for p, _ in _WHERE if module.startswith(p))].append(name)
    return groups


class ApiDirective(_Rst):
    """autodoc entries for ``jdist.__all__``, grouped by where the names run."""

    def run(self) -> list[nodes.Node]:
        import jdist

        groups = api_groups()
        lines = []
        for prefix, title in _WHERE:
            if not groups[prefix]:
                continue
            lines += [f".. rubric:: {title}", ""]
            for name in groups[prefix]:
                obj = getattr(jdist, name)
                kind = "autoclass" if inspect.isclass(obj) else "autofunction" if callable(obj) else "autodata"
                lines += [f".. {kind}:: jdist.{name}", ""]
                if kind == "autodata":
                    lines += ["   :annotation:", ""]
        return self.emit(lines)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("jdist-options", OptionsDirective)
    app.add_directive("jdist-cli", CliDirective)
    app.add_directive("jdist-api", ApiDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
