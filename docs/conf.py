"""Sphinx configuration of the jaxdp documentation site.

Build (from the repository root, after ``pip install -e ".[docs]"``)::

  sphinx-build -W --keep-going -b html docs docs/_build/html

Pages are MyST Markdown (``*.md``), the API reference is reStructuredText
(``api/*.rst``, autodoc + napoleon over the Google docstrings), and the
tutorials are the notebooks of ``colabs/``, copied here at build time and
rendered without execution (their cells are executed by the tests instead).
"""

import inspect
import pathlib
import re
import shutil
import sys

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

project = "jaxdp"
author = "the jaxdp authors"
copyright = "the jaxdp authors"  # pylint: disable=redefined-builtin

extensions = [
    "myst_nb",                  # MyST Markdown pages and notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",      # Google-style docstrings
    "sphinx.ext.mathjax",       # :math: and $...$
]

# The notebooks of colabs/ are the tutorials: copied into tutorials/notebooks/
# (ignored by git) so that Sphinx, whose sources are docs/, can render them.
_NOTEBOOKS = DOCS / "tutorials" / "notebooks"
_NOTEBOOKS.mkdir(parents=True, exist_ok=True)
for _nb in sorted((ROOT / "colabs").glob("*.ipynb")):
  _target = _NOTEBOOKS / _nb.name
  if not _target.exists() or _target.read_bytes() != _nb.read_bytes():
    shutil.copyfile(_nb, _target)

exclude_patterns = ["_build", "data", "figures", "jupyter_execute", "**.ipynb_checkpoints"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

# MyST: GitHub-style anchors for headings (links such as page.md#a-heading),
# $...$ / $$...$$ math, and ::: fences.
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]

# Notebooks are rendered as committed (no outputs are committed); the tests
# execute them (tests/test_custom_loop_notebook.py and friends).
nb_execution_mode = "off"

# autodoc + napoleon: Google docstrings, signatures with their type hints in
# the description, members in source order.
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": False}
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

html_theme = "furo"
html_title = "jaxdp"


def _is_foreign(obj) -> bool:
  module = getattr(obj, "__module__", None)
  return isinstance(module, str) and not module.startswith("jaxdp")


def _skip_foreign_members(app, what, name, obj, skip, options):  # pylint: disable=unused-argument
  """Documents the members jaxdp defines and describes.

  Skipped: the methods scikit-learn generates on estimators, and the fields of a
  NamedTuple (its "Attributes:" section documents them; autodoc would add each
  again as "Alias for field number i").
  """
  if what == "class" and callable(obj) and _is_foreign(obj):
    return True
  if what == "class" and (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
    return True
  return None


_SINGLE_TICKS = re.compile(r"(?<![`\w])`([^`\n]+)`(?![`_])(\w?)")


def _clean_docstring(app, what, name, obj, options, lines):  # pylint: disable=unused-argument
  """Drops the type's docstring shown for a constant; reads foreign `x` as literals."""
  if what in ("data", "attribute") and obj is not None and not isinstance(obj, type):
    type_doc = type(obj).__doc__
    if lines and isinstance(type_doc, str) and "\n".join(lines).strip() == inspect.cleandoc(type_doc):
      lines[:] = []
      return
  if _is_foreign(obj):
    lines[:] = [_SINGLE_TICKS.sub(lambda m: f"``{m.group(1)}``" + (f"\\ {m.group(2)}" if m.group(2)
                                                                 else ""), line) for line in lines]


def setup(app):
  app.connect("autodoc-skip-member", _skip_foreign_members)
  app.connect("autodoc-process-docstring", _clean_docstring)
