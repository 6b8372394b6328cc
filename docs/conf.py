"""Sphinx configuration of gpscale's documentation site (``make docs``).

Sphinx rather than MkDocs: the API reference is generated from the docstrings, which are
Google-style (read by napoleon) and carry reST roles and directives (``:func:``, ``:mod:``,
``.. math::``, tables); only Sphinx's autodoc renders those. The guide is written in Markdown,
read by myst-parser, so that its pages also read well as plain files in the repository.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # the checkout's code, also without an editable install

from sphinx import addnodes  # noqa: E402
from sphinx.transforms.post_transforms import SphinxPostTransform  # noqa: E402

import gpscale  # noqa: E402

project = "gpscale"
author = "the gpscale developers"
copyright = "2026, the gpscale developers"  # noqa: A001
release = gpscale.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "**/.ipynb_checkpoints"]

# Markdown: GitHub-style heading anchors, so that links such as ``page.md#a-heading`` resolve
# as they do in the repository; $...$ maths where a page uses it.
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 4

# Docstrings: Google style, as STYLE.md §7 asks; members in source order.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_default_options = {"show-inheritance": True}

html_theme = "alabaster"
html_title = f"gpscale {release}"
html_static_path: list[str] = []
html_theme_options = {
    "description": "Gaussian processes on data too large for exact inference",
    "fixed_sidebar": True,
    "page_width": "1180px",
    "sidebar_width": "240px",
}


# Markdown files outside docs/ that the site shows as one of its pages. The guide and the notes
# link to them by their repository paths (so that the links also work when reading the files in
# the repository); in the site such a link leads to the page instead.
REPOSITORY_PAGES = {"BENCHMARKS.md": "results", "CHANGELOG.md": "changelog", "README.md": "index"}


class RepositoryLinks(SphinxPostTransform):
    """Point Markdown links to ``REPOSITORY_PAGES`` files at their pages (runs before
    myst-parser's own reference resolver, priority 9). Any other link outside docs/ is left
    alone, so that it is reported as missing."""

    default_priority = 8

    def run(self, **kwargs):
        for node in self.document.findall(addnodes.pending_xref):
            if node.get("refdomain") != "doc" or node.get("reftype") != "myst":
                continue
            target = Path(node["reftarget"])
            if not target.is_absolute():
                continue
            try:
                relative = (target.parent / (target.name + ".md")).relative_to(ROOT)
            except ValueError:
                continue
            page = REPOSITORY_PAGES.get(relative.as_posix())
            if page is not None:
                node["reftarget"] = page


def _skip_member(app, what, name, obj, skip, options):
    """Leave out scikit-learn's generated metadata-routing setters (``set_fit_request``, ...):
    they are scikit-learn's API, documented there, and their docstrings refer to its glossary."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
    app.add_post_transform(RepositoryLinks)
