"""docs/sharp_edges.md is written for users: items numbered once (1..N), no change history."""

import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "sharp_edges.md"

# An item starts at the left margin: "12. **The rule, in bold, on one line.**".
_ITEM = re.compile(r"^(\d+)\. ", re.MULTILINE)
_RULE = re.compile(r"^\d+\. \*\*[^*].*\*\*$")
# A numbered line inside an item would render as a nested list with its own numbering.
_NESTED = re.compile(r"^[ \t]+\d+[.)] ", re.MULTILINE)
_REFERENCE = re.compile(r"sharp edges? (\d+)")
_HISTORY = {
    "used to": re.compile(r"\bused to\b", re.IGNORECASE),
    "no longer": re.compile(r"\bno longer\b", re.IGNORECASE),
    "issue <number>": re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),
    "before this change": re.compile(r"\bbefore this change\b", re.IGNORECASE),
}


def _text() -> str:
  return DOC.read_text(encoding="utf-8")


def test_items_are_numbered_once_from_one_without_gaps():
  numbers = [int(n) for n in _ITEM.findall(_text())]
  assert len(numbers) >= 50, f"expected the sharp edges as numbered items, found {len(numbers)}"
  duplicates = sorted({n for n in numbers if numbers.count(n) > 1})
  assert not duplicates, f"item numbers used more than once: {duplicates}"
  assert numbers == list(range(1, len(numbers) + 1)), (
      f"items must be numbered 1..{len(numbers)} in order, got {numbers}")


def test_every_item_starts_with_a_bold_one_line_rule():
  lines = [line for line in _text().splitlines() if _ITEM.match(line)]
  bad = [line[:80] for line in lines if not _RULE.match(line)]
  assert not bad, f"items whose first line is not a bold rule: {bad}"
  nested = _NESTED.findall(_text())
  assert not nested, f"indented numbered lines (nested lists): {nested}"


def test_cross_references_point_to_existing_items():
  text = _text()
  count = len(_ITEM.findall(text))
  refs = [int(n) for n in _REFERENCE.findall(text)]
  assert refs, "expected cross-references of the form 'sharp edge N'"
  assert all(1 <= n <= count for n in refs), (
      f"references outside 1..{count}: {sorted(n for n in refs if not 1 <= n <= count)}")


def test_no_change_history():
  text = _text()
  found = {}
  for name, pattern in _HISTORY.items():
    hits = [text[max(m.start() - 30, 0):m.end() + 30].replace("\n", " ")
            for m in pattern.finditer(text)]
    if hits:
      found[name] = hits
  assert not found, f"change-history phrases in docs/sharp_edges.md: {found}"
