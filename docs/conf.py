"""Sphinx configuration of cerebrax's documentation site.

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (README,
Documentation). Warnings are errors. ``_ext/cerebrax_docs.py`` generates the API
reference (every public name, checked for a docstring), the config-key reference of the
``cerebrax`` command from its schema, the wafer figures, and the executed notebooks.
"""

from __future__ import annotations

import os
import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "cerebrax"
author = "the cerebrax developers"
copyright = "2026, the cerebrax developers"  # noqa: A001 (Sphinx's name)

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "cerebrax_docs",
]
exclude_patterns = ["_build", "README.md", "**.ipynb_checkpoints",
                    "_generated/config_keys.md"]  # included by command.md

# Markdown (MyST): headings get anchors, so a link to a missing one is a warning.
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 4

# Notebooks: executed at every build, an error in a cell fails the build. CI builds with
# CEREBRAX_DOCS_EXECUTE=off after tests/test_notebooks.py has run them.
nb_execution_mode = os.environ.get("CEREBRAX_DOCS_EXECUTE", "force")
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# API reference: signatures from the code, Google-style sections from the docstrings.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_mock_imports: list[str] = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # "Attributes:" as fields: autodoc lists the members once
autodoc_inherit_docstrings = False  # a method says what it does here, not what torch says
add_module_names = False

html_theme = "sphinx_book_theme"
html_title = "cerebrax"
html_theme_options = {
    "repository_url": "",
    "show_toc_level": 2,
    "navigation_with_keys": False,
}
html_static_path = ["_static"]
html_css_files = ["cerebrax.css"]
html_last_updated_fmt = None
