"""The documentation site (docs/, built by Sphinx) covers the API and holds no change history.

Checked from the sources, without building the site (CI builds it strictly: ``.ci/run``):

* every public name of every jaxdp subpackage (its ``__all__``; the public names it imports
  where it has none) has an ``.. auto*::`` entry in the API reference ``docs/api/*.rst``,
  and every subpackage has its page there;
* every page of the site (``docs/**/*.md``) is written for users: no change history
  ("used to", "no longer", "previously", issue numbers), the guard of
  ``tests/test_docs_sharp_edges.py`` extended to every page;
* every API page is in the reference's table of contents (Sphinx checks the other pages);
  every figure and CSV of ``docs/figures`` and ``docs/data`` is on a page, and the paper
  pages show every figure of the papers' reproductions.

The names are read with ``ast`` from the ``__init__.py`` files (no import of jaxdp).
"""

import ast
import fnmatch
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "jaxdp"

_HISTORY = {
    "used to": re.compile(r"\bused to\b", re.IGNORECASE),
    "no longer": re.compile(r"\bno longer\b", re.IGNORECASE),
    "previously": re.compile(r"\bpreviously\b", re.IGNORECASE),
    "issue <number>": re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),
    "before this change": re.compile(r"\bbefore this change\b", re.IGNORECASE),
}
# ".. autoclass:: Name" (or a dotted name), and ".. currentmodule:: jaxdp.x".
_AUTO = re.compile(r"^\.\. auto(?:class|function|data|exception|module|attribute)::\s*(\S+)",
                   re.MULTILINE)
_CURRENT = re.compile(r"^\.\. (?:currentmodule|automodule)::\s*(\S+)", re.MULTILINE)
_BUILD_OUTPUTS = ("_build", "jupyter_execute", "notebooks")
PAPER_PAGES = ("paper_000.md", "paper_001.md", "paper_003.md", "paper_004.md")


def _subpackages() -> dict[str, pathlib.Path]:
  """``jaxdp.x`` -> its ``__init__.py``: public packages, not the deprecated aliases."""
  found = {}
  for init in sorted(PACKAGE.rglob("__init__.py")):
    parts = init.parent.relative_to(ROOT).parts
    if init.parent == PACKAGE or any(p.startswith("_") for p in parts):
      continue
    if "_module_alias.install" in init.read_text(encoding="utf-8"):
      continue  # an alias of another subpackage (documented there)
    found[".".join(parts)] = init
  return found


def _is_module(package_dir: pathlib.Path, module: str | None, name: str) -> bool:
  base = ROOT.joinpath(*module.split(".")) if module else package_dir
  return (base / f"{name}.py").is_file() or (base / name / "__init__.py").is_file()


def _public_names(init: pathlib.Path) -> list[str]:
  """The ``__all__`` of a subpackage; without one, the public non-module names it imports."""
  tree = ast.parse(init.read_text(encoding="utf-8"))
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
      return [ast.literal_eval(e) for e in node.value.elts]
  names = []
  for node in tree.body:
    if isinstance(node, ast.ImportFrom) and node.level == 0:
      for alias in node.names:
        name = alias.asname or alias.name
        if not name.startswith("_") and not _is_module(init.parent, node.module, alias.name):
          names.append(name)
  return names


def _documented() -> set[str]:
  """Fully qualified names with an ``.. auto*::`` entry in docs/api/*.rst."""
  names = set()
  for page in sorted((DOCS / "api").glob("*.rst")):
    current = None
    for line in page.read_text(encoding="utf-8").splitlines():
      module = _CURRENT.match(line)
      if module:
        current = module.group(1)
      entry = _AUTO.match(line)
      if entry:
        name = entry.group(1)
        names.add(name if name.startswith("jaxdp") or current is None else f"{current}.{name}")
  return names


def _pages() -> list[pathlib.Path]:
  return [p for p in sorted(DOCS.rglob("*.md"))
          if not any(part in _BUILD_OUTPUTS for part in p.relative_to(DOCS).parts)]


def test_the_name_readers_see_the_packages():
  packages = _subpackages()
  assert {"jaxdp.accounting", "jaxdp.dpsgd", "jaxdp.dpsgd.correlated", "jaxdp.training"} <= set(
      packages)
  assert "jaxdp.training.dpsgd" not in packages  # the deprecated alias
  accounting = _public_names(packages["jaxdp.accounting"])  # no __all__: its imports
  assert "PrivacyAccountant" in accounting and "events" not in accounting
  assert "laplace_mechanism" in _public_names(packages["jaxdp.mechanisms"])


def test_every_public_name_is_in_the_api_reference():
  documented = _documented()
  missing = {}
  for package, init in _subpackages().items():
    if package not in documented:
      missing[package] = ["(no page: add docs/api/<name>.rst with .. automodule::)"]
    names = [n for n in _public_names(init) if f"{package}.{n}" not in documented]
    if names:
      missing.setdefault(package, []).extend(names)
  assert not missing, (
      f"public names missing from the API reference (add an .. autoclass:: / autofunction:: / "
      f"autodata:: / automodule:: entry, and the autosummary line, to docs/api/*.rst): {missing}")


def test_every_api_page_is_in_the_reference_toctree():
  index = (DOCS / "api" / "index.md").read_text(encoding="utf-8")
  listed = set(re.findall(r"^([\w.]+)$", index, re.MULTILINE))
  pages = {p.stem for p in (DOCS / "api").glob("*.rst")}
  assert pages <= listed, f"API pages missing from docs/api/index.md: {sorted(pages - listed)}"


def test_no_change_history_on_any_page():
  pages = _pages()
  assert len(pages) >= 20, [p.name for p in pages]
  found = {}
  for page in pages:
    text = page.read_text(encoding="utf-8")
    for name, pattern in _HISTORY.items():
      for m in pattern.finditer(text):
        context = text[max(m.start() - 30, 0):m.end() + 30].replace("\n", " ")
        found.setdefault(str(page.relative_to(ROOT)), []).append(f"{name}: ...{context}...")
  assert not found, f"change-history phrases on documentation pages: {found}"


def test_the_history_guard_catches_each_phrase():
  for text in ("It used to fail.", "This is no longer done.", "As previously noted.",
               "See issue 42.", "Fixed in issues #7.", "Before this change it broke."):
    assert any(p.search(text) for p in _HISTORY.values()), text
  assert not any(p.search("The key is used for sampling; 42 issues remain open.")
                 for p in _HISTORY.values())


def _csv_patterns(text: str) -> list[str]:
  """The CSV names a page gives, as fnmatch patterns ("a_{x,y}.csv" -> a_x.csv, a_y.csv)."""
  patterns = []
  for token in re.findall(r"[\w*{},.-]+\.csv", text):
    brace = re.search(r"\{([^}]*)\}", token)
    options = brace.group(1).split(",") if brace else [""]
    patterns += [token[:brace.start()] + o + token[brace.end():] if brace else token
                 for o in options]
  return patterns


def test_every_figure_and_csv_is_on_a_page():
  text = "\n".join(p.read_text(encoding="utf-8") for p in _pages())
  papers = "\n".join((DOCS / f).read_text(encoding="utf-8") for f in PAPER_PAGES)
  figures = sorted(p.name for p in (DOCS / "figures").glob("*.png"))
  csvs = sorted(p.name for p in (DOCS / "data").glob("*.csv"))
  assert figures and csvs
  assert not [f for f in figures if f"figures/{f}" not in text], "figures on no page"
  patterns = _csv_patterns(text)
  assert not [c for c in csvs if not any(fnmatch.fnmatchcase(c, p) for p in patterns)], (
      "CSVs on no page")
  # The reproductions: every figure the paper pages draw from a paper's CSVs is shown there.
  shown = set(re.findall(r"!\[[^\]]*\]\(figures/([\w.-]+\.png)\)", papers))
  for prefix in ("tradeoffs_fig", "multiparty_", "confidence_intervals_", "survey_models_"):
    drawn = {f for f in figures if f.startswith(prefix) and "selection" not in f}
    assert drawn <= shown, f"figures not shown on a paper page: {sorted(drawn - shown)}"


def test_csv_patterns_expand_braces_and_globs():
  patterns = _csv_patterns("rows: `docs/data/survey_models_{adult,bank}.csv`, `x_*.csv`")
  assert patterns == ["survey_models_adult.csv", "survey_models_bank.csv", "x_*.csv"]
