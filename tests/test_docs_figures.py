"""The figures and tables of docs/ are drawn from their committed CSVs (docs/draw_figures.py).

Every figure in docs/figures carries the sha256 of the CSVs it was drawn from: a CSV
edited without ``python docs/draw_figures.py`` fails here, and so does a table of
the paper pages (docs/paper_*.md) that does not say what its CSV says.
"""

import importlib.util
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _draw_figures():
  spec = importlib.util.spec_from_file_location("docs_draw_figures",
                                                ROOT / "docs" / "draw_figures.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


df = _draw_figures()

# One figure of each plotting function (Fig. 4 has the augmented-N marker): always redrawn.
QUICK = ("tradeoffs_fig4_mnist", "confidence_intervals_adult_budget_split")


def test_every_figure_in_docs_is_drawn_from_a_committed_csv():
  on_disk = sorted(p.stem for p in df.FIGURES_DIR.glob("*.png"))
  assert on_disk == sorted(df.FIGURES), "docs/figures and draw_figures.FIGURES differ"
  for name, fig in df.FIGURES.items():
    for csv in fig.csvs:
      assert (df.DATA / csv).is_file(), f"{name}: docs/data/{csv} is missing"
    have = df.png_metadata(df.FIGURES_DIR / f"{name}.png")
    want = df.metadata(name)
    assert have.get("Source") == want["Source"], (
        f"{name}.png was not drawn from the committed CSV: run python docs/draw_figures.py")
    assert have.get("Command") == df.COMMAND


def test_a_csv_edited_without_redrawing_is_caught(tmp_path, monkeypatch):
  data = tmp_path / "data"
  shutil.copytree(df.DATA, data)
  csv = data / "tradeoffs_fig4_mnist.csv"
  text = csv.read_text(encoding="utf-8")
  assert "0.8578999638557434" in text  # N = 1,000, non-private
  csv.write_text(text.replace("0.8578999638557434", "0.9578999638557434"), encoding="utf-8")
  monkeypatch.setattr(df, "DATA", data)
  problems = df.check()
  assert any(p.startswith("tradeoffs_fig4_mnist: PNG Source") for p in problems), problems
  assert any("table tradeoffs_fig4_mnist" in p for p in problems), problems
  assert not any("fig5a" in p for p in problems), problems


def _redraw_matches_the_committed_figures(names, out):
  from PIL import Image  # pylint: disable=import-outside-toplevel
  written = df.draw(names, out)
  assert sorted(p.name for p in written) == sorted(f"{n}.png" for n in names)
  for name in names:
    new, old = out / f"{name}.png", df.FIGURES_DIR / f"{name}.png"
    have, want = df.png_metadata(new), df.png_metadata(old)
    assert {k: have.get(k) for k in ("Source", "Command")} == {
        k: want.get(k) for k in ("Source", "Command")}, name
    with Image.open(new) as a, Image.open(old) as b:
      assert a.size == b.size, f"{name}: redrawn {a.size}, committed {b.size}"


def test_redrawing_reproduces_the_committed_figures(tmp_path):
  _redraw_matches_the_committed_figures(QUICK, tmp_path)


@pytest.mark.slow
def test_redrawing_reproduces_every_committed_figure(tmp_path):
  _redraw_matches_the_committed_figures(list(df.FIGURES), tmp_path)


def test_results_tables_are_generated_from_the_csvs():
  text = df.results_text()
  for name in df.TABLES:
    match = df._block(name).search(text)  # pylint: disable=protected-access
    assert match, f"docs/paper_*.md have no <!-- generated:{name} --> block"
    assert match.group(2) == "\n" + df.table(name) + "\n\n", (
        f"docs/paper_*.md table {name} is not what its CSV gives: run python docs/draw_figures.py")
  # The Fig. 1 DP-SGD rows are the config default's (learning rates {1, 4}), replace-one like
  # every other row of the figure, as the text says.
  fig1 = df.table("tradeoffs_fig1_mnist").splitlines()
  eps = fig1[0].split(" | ")
  dpsgd = next(line for line in fig1 if line.startswith("| DP-SGD, δ=1e-05 |")).split(" | ")
  assert dpsgd[eps.index("1")] == "0.898 ± 0.001"
  rows = [r for r in df.read_rows("tradeoffs_fig1_mnist.csv") if r["method"] == "dpsgd"]
  assert {r["learning_rate"] for r in rows} <= {1.0, 4.0}
  assert {r["run"] for r in rows} == {"dpsgd_replace_one"}


@pytest.mark.parametrize("name,want", [("tradeoffs_fig1_mnist.csv", "replace_one"),
                                       ("tradeoffs_fig2_mnist.csv", "replace_one"),
                                       ("tradeoffs_fig3_mnist.csv", "replace_one"),
                                       ("tradeoffs_fig1_mnist_add_remove.csv", "add_remove")])
def test_each_comparison_figure_holds_one_neighbouring_relation(name, want):
  assert df.relation(df.read_rows(name)) == want


def test_rows_mixing_relations_are_refused():
  rows = df.read_rows("tradeoffs_fig1_mnist.csv")
  mixed = rows + [dict(rows[-1], neighbouring="add_remove")]
  with pytest.raises(ValueError, match="ONE neighbouring relation"):
    df.relation(mixed)
  # rows without the column: DP-SGD's were add/remove, the others replace-one
  legacy = [{k: v for k, v in r.items() if k != "neighbouring"} for r in rows]
  with pytest.raises(ValueError, match="mix"):
    df.relation(legacy)


def test_check_passes_on_the_committed_docs():
  assert df.check() == []
