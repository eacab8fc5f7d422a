"""Collection order of the privacy suite (the tests are unchanged; only their order).

``test_conformance.py`` runs entry by entry. Three kinds of test check one registered
entry again: ``test_extreme_records[name]`` (the entry's releases, unbatched, on datasets
of the first pair's shapes: what its charge, fresh and looped checks have just compiled),
test_power's injection rows (the row's check on the entry unpatched, then patched) and
test_selection_power's row. Each is moved right after the last ``test_conformance`` test
of its entry's block (the fresh tests of keyless entries do not count), so that
pytest-xdist, which hands out consecutive tests, gives them to the worker that has just
compiled the entry's programs and cached its releases (the rows' unpatched check reads
them: conformance_checks.pin) instead of compiling and releasing it all again in the other
worker. Only the order of the privacy suite's own tests changes, within the slots they
already hold; a test whose entry has no conformance test selected keeps its place.

Running the rows earlier cannot change another test: the patch is undone after the row
(monkeypatch) and the row clears the entry's cached releases after the patched check;
every patched function of the always-on rows is called in Python, outside any cached
compiled program (a patch that acted only inside a cached program would make its own row
fail: the unpatched check runs first, with the same shapes, in the same process); and the
rows already run before other directories' tests in the full suite.

The fresh tests of keyless entries (``fresh`` given), which test_conformance.py puts after
every entry's block, go to the end of the privacy suite: they collect the digests of the
fresh check's two subprocesses, started at the block of the last keyless entry, which then
run while the rest of the suite does instead of keeping a worker waiting.
"""

from __future__ import annotations

import pathlib

_HERE = pathlib.Path(__file__).resolve().parent


def _location(item) -> tuple[str, str]:
  return pathlib.Path(str(item.fspath)).name, getattr(item, "originalname", item.name)


def _params(item) -> dict:
  callspec = getattr(item, "callspec", None)
  return dict(callspec.params) if callspec is not None else {}


def _entry_of(item):
  """The registry entry a test re-checks (None: not moved)."""
  where, params = _location(item), _params(item)
  if where == ("test_extreme_records.py", "test_extreme_records"):
    return params.get("name")
  if where == ("test_power.py", "test_injected_library_defect_is_caught"):
    return getattr(params.get("row"), "entry", None)
  if where == ("test_selection_power.py", "test_under_noised_selection_is_caught"):
    return getattr(getattr(getattr(item, "module", None), "ROW", None), "entry", None)
  return None


def pytest_collection_modifyitems(session, config, items):  # pylint: disable=unused-argument
  slots = [i for i, item in enumerate(items)
           if pathlib.Path(str(item.fspath)).resolve().parent == _HERE]
  if not slots:
    return
  ours = [items[i] for i in slots]
  # The last conformance test of each entry's block (keyless fresh tests, last, excluded).
  # (Every block ends with a check other than fresh; only fresh tests follow the blocks.)
  anchor: dict[str, int] = {}
  for pos, item in enumerate(ours):
    if _location(item) == ("test_conformance.py", "test_check"):
      params = _params(item)
      if params.get("check") != "fresh" and params.get("name") is not None:
        anchor[params["name"]] = pos
  moved: dict[int, list] = {}
  for item in ours:
    name = _entry_of(item)
    if name in anchor:
      moved.setdefault(anchor[name], []).append(item)
  # The fresh tests of keyless entries (after every block) go to the end of the suite.
  tail = [item for pos, item in enumerate(ours)
          if _location(item) == ("test_conformance.py", "test_check")
          and _params(item).get("check") == "fresh"
          and anchor.get(_params(item).get("name"), pos) < pos]
  moved_ids = {id(item) for group in moved.values() for item in group}
  moved_ids.update(id(item) for item in tail)
  order = []
  for pos, item in enumerate(ours):
    if id(item) in moved_ids:
      continue
    order.append(item)
    order.extend(moved.get(pos, ()))
  order.extend(tail)
  assert len(order) == len(ours)
  for i, item in zip(slots, order):
    items[i] = item
