"""Sphinx configuration of jdist's documentation site.

The source folder is the repository root (``make docs``: ``sphinx-build -c docs . build/docs/html``),
so the pages under ``docs/``, the notebooks under ``notebooks/`` and ``CHANGELOG.md`` /
``CONTRIBUTING.md`` are all documents and the relative links between them (``../notebooks/...``,
``docs/...``) resolve as they do on GitHub. Only :data:`include_patterns` is read.
Pages are MyST Markdown; notebooks are rendered by MyST-NB from their saved outputs, never executed.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

import jdist

project = "jdist"
author = "the jdist developers"
copyright = "the jdist developers"
release = jdist.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_nb",  # MyST Markdown pages and .ipynb notebooks (it brings myst_parser)
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "jdist_docs",  # the option table, the CLI's help and the public API list, generated from the code
]

root_doc = "docs/index"
include_patterns = ["docs/**", "notebooks/*.ipynb", "CHANGELOG.md", "CONTRIBUTING.md"]
exclude_patterns = ["docs/_build", "docs/_ext", "docs/_extra", "docs/_static", "**/.ipynb_checkpoints",
                    ".venv", "build", "labextension", "node_modules"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb", ".rst": "restructuredtext"}

# MyST: GitHub-style heading anchors, so the pages' links such as frameworks.md#tensorflow-... resolve
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
# Notebooks: their saved outputs as they are (make test runs them; the site never executes them)
nb_execution_mode = "off"
nb_merge_streams = True

autodoc_member_order = "bysource"
autodoc_inherit_docstrings = False  # only jdist's own docstrings (a base class's, e.g. Accelerate's, are not ours to fix)
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# No intersphinx: the build runs where only the package registries are reachable (CI), and stays offline.

# Warnings are errors (make docs passes -W --keep-going). Left out, on purpose:
suppress_warnings = [
    "myst.header",  # a few pages step from ## to #### (pages written for GitHub); cosmetic on the site
    "mystnb.unknown_mime_type",  # widget views saved in notebooks: the site shows their text instead
    "ref.python",
    "misc.highlighting_failure",  # IPython syntax in cells (%run $script): Pygments retries leniently, same look  # autodoc's type hints naming classes outside the documented API (torch, IPython...)
]
nitpicky = False
smartquotes = False  # option flags such as --gpus stay two hyphens in help texts

html_theme = "pydata_sphinx_theme"
html_title = f"jdist {version}"
html_static_path = ["_static"]
html_css_files = ["jdist.css"]
html_extra_path = ["_extra"]  # index.html at the site root: a redirect to docs/index.html
html_theme_options = {
    "navbar_align": "left",
    "header_links_before_dropdown": 6,
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}
html_sidebars = {"CHANGELOG": [], "CONTRIBUTING": []}
html_show_sourcelink = False
