"""docs/sharp_edges.md lists every registered release point with its relation and unit."""

import release_points_table


def test_sharp_edges_table_matches_registry():
  table = release_points_table.current()
  assert table is not None, (
      "docs/sharp_edges.md has no release-point table; run "
      "`python tests/privacy/release_points_table.py`.")
  assert table == release_points_table.render(), (
      "the release-point table in docs/sharp_edges.md differs from the conformance registry; "
      "run `python tests/privacy/release_points_table.py` and commit the result.")


def test_every_relation_and_unit_is_stated():
  import conformance_registry as reg
  for entry in reg.load_all().values():
    assert entry.neighbouring in ("add_remove", "replace_one"), entry.name
    assert entry.unit, entry.name
    assert f"`{entry.name}`" in release_points_table.render()
