"""Collection order of the privacy suite: an entry's extreme-record test runs beside its checks.

``test_conformance.py`` runs entry by entry; ``test_extreme_records.py`` calls the same
entries' releases (unbatched, on datasets of the first pair's shapes) that the entry's
charge, fresh and looped checks have just compiled. Each ``test_extreme_records[name]``
is moved right after the last ``test_conformance`` test of ``name`` in the entry's block
(the fresh tests of keyless entries, which run last, do not count), so that pytest-xdist,
which hands out consecutive tests, gives both to the same worker and the second one finds
the entry's programs compiled instead of compiling them again in the other worker. Only
the order of the privacy suite's own tests changes, within the slots they already hold;
a test whose entry has no conformance test selected keeps its place. The extreme-record
test patches nothing, so running it earlier cannot affect another test.
"""

from __future__ import annotations

import pathlib

_HERE = pathlib.Path(__file__).resolve().parent
_MOVED = {("test_extreme_records.py", "test_extreme_records")}


def _location(item) -> tuple[str, str]:
  return pathlib.Path(str(item.fspath)).name, getattr(item, "originalname", item.name)


def _params(item) -> dict:
  callspec = getattr(item, "callspec", None)
  return dict(callspec.params) if callspec is not None else {}


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
    if _location(item) in _MOVED:
      name = _params(item).get("name")
      if name in anchor:
        moved.setdefault(anchor[name], []).append(item)
  if not moved:
    return
  moved_ids = {id(item) for group in moved.values() for item in group}
  order = []
  for pos, item in enumerate(ours):
    if id(item) in moved_ids:
      continue
    order.append(item)
    order.extend(moved.get(pos, ()))
  assert len(order) == len(ours)
  for i, item in zip(slots, order):
    items[i] = item
