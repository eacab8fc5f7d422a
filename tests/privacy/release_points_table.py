"""The table of release points in ``docs/sharp_edges.md``, drawn from the conformance registry.

``python tests/privacy/release_points_table.py`` rewrites the table between the
markers of ``docs/sharp_edges.md`` from the registry (every registered entry's
neighbouring relation, privacy unit, claim and sensitivity);
``test_release_points_table.py`` fails when the
committed table and the registry disagree, so the documented relation and unit
of an entry point cannot drift from what its tests check.
"""

from __future__ import annotations

import pathlib
import sys

_HERE = pathlib.Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
  sys.path.insert(0, str(_HERE))

import conformance_registry as reg  # pylint: disable=wrong-import-position

DOC = _HERE.parent.parent / "docs" / "sharp_edges.md"
BEGIN = "<!-- release-points:begin (drawn by tests/privacy/release_points_table.py) -->"
END = "<!-- release-points:end -->"


def _cell(text: str) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def render() -> str:
  """The markdown table (with its markers) of every registered release point."""
  entries = sorted(reg.load_all().values(), key=lambda e: (e.family, e.name))
  rows = [BEGIN,
          "| family | entry point | neighbouring | unit | claim (as tested) | sensitivity |",
          "| --- | --- | --- | --- | --- | --- |"]
  for e in entries:
    sens = "—" if e.sensitivity is None else f"{e.sensitivity:g} ({e.norm})"
    rows.append(f"| {e.family} | `{e.name}` | {e.neighbouring} | {e.unit} | "
                f"{_cell(e.guarantee)} | {sens} |")
  rows.append(END)
  return "\n".join(rows)


def current() -> str | None:
  """The table now in docs/sharp_edges.md (None without markers)."""
  text = DOC.read_text(encoding="utf-8")
  if BEGIN not in text or END not in text:
    return None
  start = text.index(BEGIN)
  return text[start:text.index(END) + len(END)]


def write() -> None:
  """Replaces the table between the markers (or appends a section with it)."""
  text = DOC.read_text(encoding="utf-8")
  table = render()
  old = current()
  if old is None:
    text = text.rstrip("\n") + (
        "\n\n## Every release point: relation and unit\n\n"
        "Each public entry point that releases something computed from private data or\n"
        "spends a `DpEvent`, with the neighbouring relation and privacy unit its claim is\n"
        "proven for, as registered (and tested) in the privacy conformance suite\n"
        "(`tests/privacy/`). Claims are those of the suite's test configuration.\n\n"
        + table + "\n")
  else:
    text = text.replace(old, table)
  DOC.write_text(text, encoding="utf-8")


if __name__ == "__main__":
  write()
  print(f"wrote {len(reg.REGISTRY)} release points to {DOC}")
