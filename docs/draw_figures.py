"""Draws every figure in ``docs/figures`` from its committed CSV in ``docs/data``.

Usage (from any directory; no data set, no training, about 30 s on two CPU cores)::

  python docs/draw_figures.py          # redraw every figure, rewrite the generated tables
  python docs/draw_figures.py --check  # change nothing; exit 1 if a figure or table is stale

The figures are drawn by the experiments' own plotting functions
(``plot`` of ``experiments/tradeoffs.py``, ``experiments/multiparty.py`` and
``experiments/survey_models.py``, ``plot_study`` of ``experiments/confidence_intervals.py``)
from the rows of the CSVs in :data:`FIGURES`, the one table of which figure is drawn from
which CSV (a confidence-interval figure is listed once its study's CSV is in
``docs/data``). Each PNG carries PNG text entries: ``Source``, the sha256 of
every CSV it was drawn from, and ``Command``, the command that drew it;
``--check`` (and ``tests/test_docs_figures.py``) compare them with the CSVs, so
a CSV edited without redrawing its figure is caught.

The tables of the paper pages (:data:`PAGES`, ``docs/paper_*.md``) that quote the
figures' numbers sit between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->`` (each block on exactly one page) and are written by
this script from the CSVs of :data:`TABLES`: edit the CSV and rerun, never the
table.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import pathlib
import re
import shutil
import sys
import tempfile
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"
FIGURES_DIR = ROOT / "docs" / "figures"
# The paper pages that hold the generated tables (one page per reproduced paper).
PAGES = tuple(ROOT / "docs" / f"paper_{n}.md" for n in ("000", "001", "003", "004"))
COMMAND = "python docs/draw_figures.py"


class Figure(NamedTuple):
  """How ``docs/figures/<name>.png`` is drawn.

  ``plot``: the experiment whose ``plot`` draws it; ``csvs``: its rows, in
  ``docs/data``; ``figure``/``dataset``: the ``configs/tradeoffs.py`` figure and
  data set (tradeoffs; survey models: ``dataset`` only, the rows do not name it;
  confidence intervals: ``figure`` is the study); ``output``: the file that the
  confidence-interval experiment's ``plot_study`` writes for the study (one
  directory of figures).
  """
  plot: str
  csvs: tuple[str, ...]
  figure: str = ""
  dataset: str = ""
  output: str = ""


# docs/figures/<name>.png <- docs/data/<csv>: the one mapping of figures to their data.
FIGURES = {
    "tradeoffs_fig1_digits": Figure("tradeoffs", ("tradeoffs_fig1_digits.csv",), "fig1", "digits"),
    "tradeoffs_fig1_mnist": Figure("tradeoffs", ("tradeoffs_fig1_mnist.csv",), "fig1", "mnist"),
    "tradeoffs_fig1_digits_selection": Figure(
        "tradeoffs", tuple(f"tradeoffs_fig1_digits_selection_{m}.csv"
                           for m in ("repeat_and_select", "composition", "none")),
        "fig1", "digits"),
    "tradeoffs_fig1_mnist_add_remove": Figure(
        "tradeoffs", ("tradeoffs_fig1_mnist_add_remove.csv",), "fig1", "mnist"),
    "tradeoffs_fig2_mnist": Figure("tradeoffs", ("tradeoffs_fig2_mnist.csv",), "fig2", "mnist"),
    "tradeoffs_fig3_mnist": Figure("tradeoffs", ("tradeoffs_fig3_mnist.csv",), "fig3", "mnist"),
    "tradeoffs_fig4_mnist": Figure("tradeoffs", ("tradeoffs_fig4_mnist.csv",), "fig4", "mnist"),
    "tradeoffs_fig5a_mnist": Figure("tradeoffs", ("tradeoffs_fig5a_mnist.csv",), "fig5a",
                                    "mnist"),
    "tradeoffs_fig5b_mnist": Figure("tradeoffs", ("tradeoffs_fig5b_mnist.csv",), "fig5b",
                                    "mnist"),
    "tradeoffs_fig6a_mnist": Figure("tradeoffs", ("tradeoffs_fig6a_mnist.csv",), "fig6a",
                                    "mnist"),
    "tradeoffs_fig6b_mnist": Figure("tradeoffs", ("tradeoffs_fig6b_mnist.csv",), "fig6b",
                                    "mnist"),
    "multiparty_fig2_mnist_standin": Figure("multiparty",
                                            ("multiparty_fig2_mnist_standin.csv",)),
    "multiparty_fig3_kdd": Figure("multiparty", ("multiparty_fig3_kdd.csv",)),
    "survey_models_adult": Figure("survey_models", ("survey_models_adult.csv",),
                                  dataset="adult"),
    "survey_models_bank": Figure("survey_models", ("survey_models_bank.csv",), dataset="bank"),
    "survey_models_mnist": Figure("survey_models", ("survey_models_mnist.csv",),
                                  dataset="mnist"),
}


def _ci_grid_csv(dataset: str) -> str:
  """The grid study's CSV: ``..._grid.csv``, or ``..._coverage.csv`` where only that is
  committed (the same rows without the ``study`` column)."""
  name = f"confidence_intervals_{dataset}_grid.csv"
  return name if (DATA / name).is_file() else f"confidence_intervals_{dataset}_coverage.csv"


def _ci_figures() -> dict[str, Figure]:
  """The confidence-interval figures (paper 003 Sec. 7): ``confidence_intervals_<dataset>_
  <study>.png`` from ``confidence_intervals_<dataset>_<study>.csv`` (the study's CSV of
  ``experiments/confidence_intervals.py``), and the grid study's coverage/length and CI-vs-VI
  figures. A figure is drawn once its CSV is committed."""
  figures = {
      "confidence_intervals_adult_coverage_length": Figure(
          "confidence_intervals", (_ci_grid_csv("adult"),), "grid", "adult",
          "coverage_length.png"),
      "confidence_intervals_adult_ci_vs_vi": Figure(
          "confidence_intervals", (_ci_grid_csv("adult"),), "grid", "adult", "ci_vs_vi.png"),
      "confidence_intervals_adult_budget_split": Figure(
          "confidence_intervals", ("confidence_intervals_adult_split.csv",), "split", "adult",
          "budget_split.png"),
  }
  studies = {"adult": ("grid", "split23", "vi_n", "vi_d", "epsilon_fit", "sample_complexity"),
             "kddcup99": ("epsilon_grid", "vi_epsilon", "sample_complexity"),
             "bank": ("sample_complexity",)}
  for dataset, names in studies.items():
    for study in names:
      name = f"confidence_intervals_{dataset}_{study}"
      figures[name] = Figure("confidence_intervals", (f"{name}.csv",), study, dataset,
                             f"{study}.png")
  return {name: fig for name, fig in figures.items()
          if all((DATA / c).is_file() for c in fig.csvs)}


FIGURES.update(_ci_figures())


class Table(NamedTuple):
  """A table of a paper page (``docs/paper_*.md``): one row per line of the figure, one column per x value.

  ``csv``: the figure's rows; ``extra``: ``(csv, label suffix)`` pairs whose rows are
  added as further lines (runs with other settings, e.g. another hyper-parameter grid).
  """
  csv: str
  figure: str
  dataset: str
  extra: tuple[tuple[str, str], ...] = ()


# docs/paper_*.md block <!-- generated:<name> --> <- docs/data/<csv>.
TABLES = {
    "tradeoffs_fig1_digits": Table("tradeoffs_fig1_digits.csv", "fig1", "digits"),
    "tradeoffs_fig1_mnist": Table("tradeoffs_fig1_mnist.csv", "fig1", "mnist"),
    "tradeoffs_fig1_mnist_add_remove": Table("tradeoffs_fig1_mnist_add_remove.csv", "fig1",
                                             "mnist"),
    "tradeoffs_fig2_mnist": Table("tradeoffs_fig2_mnist.csv", "fig2", "mnist"),
    "tradeoffs_fig3_mnist": Table("tradeoffs_fig3_mnist.csv", "fig3", "mnist"),
    "tradeoffs_fig4_mnist": Table("tradeoffs_fig4_mnist.csv", "fig4", "mnist"),
    "tradeoffs_fig5a_mnist": Table("tradeoffs_fig5a_mnist.csv", "fig5a", "mnist"),
    "tradeoffs_fig5b_mnist": Table("tradeoffs_fig5b_mnist.csv", "fig5b", "mnist"),
    "tradeoffs_fig6a_mnist": Table("tradeoffs_fig6a_mnist.csv", "fig6a", "mnist"),
    "tradeoffs_fig6b_mnist": Table("tradeoffs_fig6b_mnist.csv", "fig6b", "mnist"),
}


class CiTable(NamedTuple):
  """A confidence-interval table of ``docs/paper_003.md``, from one study's CSV.

  ``kind``: the layout (:func:`_ci_table`); ``loss``/``floor``: the rows shown (grid study).
  """
  csv: str
  kind: str
  loss: str = "logistic"
  floor: str = "paper"


_CI_TABLES = {
    "confidence_intervals_adult_grid": CiTable("confidence_intervals_adult_grid.csv", "grid"),
    "confidence_intervals_adult_grid_psd": CiTable("confidence_intervals_adult_grid.csv", "grid",
                                                   floor="psd"),
    "confidence_intervals_adult_grid_huber": CiTable("confidence_intervals_adult_grid.csv",
                                                     "grid", loss="huber"),
    "confidence_intervals_adult_split": CiTable("confidence_intervals_adult_split.csv", "split"),
    "confidence_intervals_adult_split23": CiTable("confidence_intervals_adult_split23.csv",
                                                  "split23"),
    "confidence_intervals_kddcup99_epsilon_grid": CiTable(
        "confidence_intervals_kddcup99_epsilon_grid.csv", "epsilon_grid"),
    "confidence_intervals_adult_vi_n": CiTable("confidence_intervals_adult_vi_n.csv", "vi"),
    "confidence_intervals_adult_vi_d": CiTable("confidence_intervals_adult_vi_d.csv", "vi"),
    "confidence_intervals_kddcup99_vi_epsilon": CiTable(
        "confidence_intervals_kddcup99_vi_epsilon.csv", "vi"),
    "confidence_intervals_adult_length_fits": CiTable("confidence_intervals_adult_grid.csv",
                                                      "fits_n"),
    "confidence_intervals_adult_epsilon_fit": CiTable("confidence_intervals_adult_epsilon_fit.csv",
                                                      "fits_epsilon"),
}
for _dataset in ("adult", "kddcup99", "bank"):
  _CI_TABLES[f"confidence_intervals_{_dataset}_sample_complexity"] = CiTable(
      f"confidence_intervals_{_dataset}_sample_complexity.csv", "sample_complexity")
# A table is generated once its CSV is committed.
TABLES.update({name: spec for name, spec in _CI_TABLES.items() if (DATA / spec.csv).is_file()})

CI_VARIANTS = ("objective_pure", "output_pure", "objective_zcdp", "output_zcdp")
CI_LABELS = ("obj ε-DP", "out ε-DP", "obj zCDP", "out zCDP")


def _markdown(header, body) -> str:
  return "\n".join("| " + " | ".join(str(c) for c in cells) + " |" for cells in
                   [header, ["---"] * len(header)] + body)


def _by_variant(rows, keys, cell) -> list[list[str]]:
  """One line per value of ``keys`` (sorted), one column per variant: ``cell(row)``."""
  lines = {}
  for r in rows:
    lines.setdefault(tuple(r[k] for k in keys), {})[r["variant"]] = r
  return [[f"{v:,}" if isinstance(v, int) else f"{v:g}" for v in key]
          + [cell(by[v]) if v in by else "" for v in CI_VARIANTS]
          for key, by in sorted(lines.items())]


def _coverage_cell(r) -> str:
  return f"{r['coverage']:.3f} / {r['length']:.3g}" + (" †" if r.get("coverage_warning") else "")


def _coverage_summary(rows) -> str:
  """How many cells are below nominal, and whether the library warns there (†)."""
  below = [r for r in rows if r["coverage"] < 0.95]
  unflagged = [r for r in below if not r.get("coverage_warning")]
  significant = [r for r in unflagged if r["coverage"] + 2 * r["coverage_se"] < 0.95]
  return (f"Cells below 0.95: {len(below)} of {len(rows)}, of which {len(below) - len(unflagged)}"
          f" flagged by `CoverageWarning` (†); of the {len(unflagged)} others, "
          f"{len(significant)} more than 2 s.e. below 0.95"
          + "".join(f" ({r['variant']}, d = {r['d']}, n = {r['n']:,}: {r['coverage']:.3f} ± "
                    f"{r['coverage_se']:.3f})" for r in unflagged)
          + f". Cells flagged in all: {sum(1 for r in rows if r.get('coverage_warning'))}.")


def _ci_table(spec: CiTable) -> str:
  """The markdown of a confidence-interval table (paper 003) from its study's CSV."""
  rows = read_rows(spec.csv)
  if spec.kind == "grid":
    rows = [r for r in rows if r["loss"] == spec.loss and r["floor"] == spec.floor]
    body = _by_variant(rows, ("d", "n"), _coverage_cell)
    text = _markdown(["d", "n"] + list(CI_LABELS), body)
    return text + "\n\n" + _coverage_summary(rows)
  if spec.kind == "split":
    rows = [r for r in rows if r["loss"] == spec.loss]
    return _markdown(["φ₁/φ"] + list(CI_LABELS), _by_variant(
        rows, ("phi1_fraction",), lambda r: f"{r['length']:.3f} ({r['coverage']:.3f})"))
  if spec.kind == "split23":
    return _markdown(["d", "φ₂/(φ − φ₁)"] + list(CI_LABELS),
                     _by_variant(rows, ("d", "phi2_share"), _coverage_cell))
  if spec.kind == "epsilon_grid":
    body = _by_variant(rows, ("n", "epsilon"), _coverage_cell)
    return (_markdown(["n", "ε (ρ = ε²/2)"] + list(CI_LABELS), body) + "\n\n"
            + _coverage_summary(rows))
  if spec.kind == "vi":
    axis = {"vi_n": "n", "vi_d": "d", "vi_epsilon": "epsilon"}[rows[0]["study"]]
    return _markdown([axis] + list(CI_LABELS), _by_variant(
        rows, (axis,), lambda r: f"{r['length']:.3g} / {r['vi_length']:.3g} "
        f"({r['coverage']:.3f})"))
  if spec.kind == "sample_complexity":
    lines = {}
    for r in rows:
      lines.setdefault((r["n_nonprivate"], r["nonprivate_length"]), {})[r["variant"]] = r
    body = [[f"{k[0]:,}", f"{k[1]:.3g}"] + [
        ("" if v not in by else f"{by[v]['n_private']:,}" if isinstance(by[v]["n_private"], int)
         else "> max") for v in CI_VARIANTS] for k, by in sorted(lines.items())]
    return _markdown(["n' (non-private)", "non-private length"] + list(CI_LABELS), body)
  lm = experiment("ci_length_models")
  if spec.kind == "fits_n":
    rows = [r for r in rows if r["loss"] == "logistic" and r["floor"] == "paper" and r["d"] == 5]
    fits = {f["variant"]: f for f in lm.length_fits(rows)}
    return _markdown(["variant", "c₀", "c₁", "c₀/n + c₁/√n: R², max rel. error", "c",
                      "c/√n: R², max rel. error"], [
        [label, f"{f['c0']:.4g}", f"{f['c1']:.4g}",
         f"{f['quality']['r2']:.4f}, {f['quality']['max_rel_err']:.3f}", f"{f['c']:.4g}",
         f"{f['quality_sqrt']['r2']:.4f}, {f['quality_sqrt']['max_rel_err']:.3f}"]
        for label, f in ((lab, fits[v]) for v, lab in zip(CI_VARIANTS, CI_LABELS) if v in fits)])
  if spec.kind == "fits_epsilon":
    fits = {f["variant"]: f for f in lm.length_fits(rows)}
    return _markdown(["variant", "model", "c₀", "c₁", "R²", "max relative error"], [
        [label, "√(c₀/ε² + c₁)" if f["notion"] == "pure" else "√(c₀/ρ + c₁)", f"{f['c0']:.4g}",
         f"{f['c1']:.4g}", f"{f['r2']:.4f}", f"{f['max_rel_err']:.3f}"]
        for label, f in ((lab, fits[v]) for v, lab in zip(CI_VARIANTS, CI_LABELS) if v in fits)])
  raise ValueError(f"unknown confidence-interval table kind {spec.kind!r}.")


def experiment(name: str):
  """``experiments/<name>.py`` as a module, loaded once (the experiments are scripts)."""
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
      spec.loader.exec_module(module)
    except BaseException:
      del sys.modules[name]
      raise
  return sys.modules[name]


def sha256(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _value(text: str):
  """A CSV cell as the experiment wrote it: int, float, bool or string ("" stays "")."""
  if text in ("True", "False"):
    return text == "True"
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return text


def read_rows(name: str) -> list[dict]:
  with open(DATA / name, newline="", encoding="utf-8") as f:
    return [{k: _value(v) for k, v in row.items()} for row in csv.DictReader(f)]


def metadata(name: str) -> dict[str, str | None]:
  """The PNG text entries of figure ``name``: the sha256 of its CSVs and the command."""
  source = "; ".join(f"docs/data/{c} sha256:{sha256(DATA / c)}" for c in FIGURES[name].csvs)
  return {"Source": source, "Command": COMMAND, "Software": None}


def png_metadata(path: pathlib.Path) -> dict[str, str]:
  """The PNG text entries of ``path``."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  with Image.open(path) as image:
    image.load()
    return dict(image.text)


def axis_values(axis: str, rows: list[dict]) -> set:
  """The x values of a tradeoffs figure (private training is stored at B = 0: flat in B)."""
  tradeoffs = experiment("tradeoffs")
  xkey = tradeoffs._ROW_AXIS.get(axis, axis)  # pylint: disable=protected-access
  return {r[xkey] for r in rows if r["method"] != "non_private"
          and not (axis == "budget" and r["method"] in tradeoffs.TRAINING)}


def _tradeoffs_config(figure: str, dataset: str, rows: list[dict]):
  """The plotting config of a tradeoffs figure: axis and layout from ``configs/tradeoffs.py``,
  every value drawn (methods, deltas, epsilons, axis values, B, selection) from ``rows``."""
  tradeoffs = experiment("tradeoffs")
  spec = importlib.util.spec_from_file_location("tradeoffs_config", tradeoffs.CONFIG_FILE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(figure)
  private = [r for r in rows if r["method"] != "non_private"]
  with config.unlocked():
    config.dataset = dataset
    present = {r["method"] for r in rows}
    config.methods = tuple(m for m in tradeoffs.METHODS if m in present)
    config.deltas = tuple(sorted({float(r["delta"]) for r in private}))
    config.epsilons = tuple(sorted({float(r["epsilon"]) for r in private}))
    config.axis_values = tuple(sorted(axis_values(config.axis, rows)))
    budgets = {int(r["budget"]) for r in private if r["kind"] == "prediction"}
    if config.axis != "budget" and budgets:
      (config.budget,) = budgets
    config.account_selection = any(r.get("selection") == "exponential_mechanism" for r in rows)
    config.neighbouring = relation(rows)
  return config


def relation(rows: list[dict]) -> str:
  """The one neighbouring relation of a tradeoffs figure's private rows; raises if they mix.

  Rows written before the ``neighbouring`` column existed are replace-one, except DP-SGD's
  (add/remove, the only relation DP-SGD was accounted for then).
  """
  found = {r.get("neighbouring") or ("add_remove" if r["method"] == "dpsgd" else "replace_one")
           for r in rows if r["method"] != "non_private"}
  if len(found) != 1:
    raise ValueError(f"a figure compares its methods under ONE neighbouring relation; these rows "
                     f"mix {sorted(found)}.")
  return found.pop()


def _multiparty_title(rows: list[dict]) -> str:
  """The title ``experiments/multiparty.py`` gives its figure, from the rows' data set."""
  title = f"Paper 001 protocol on {rows[0]['label']}"
  if rows[0]["dataset"] == "mnist_standin":
    title += " (STAND-IN: UCI HAR features unavailable)"
  return title


def _survey_config(dataset: str, rows: list[dict]):
  """The plotting config of a survey-models figure: ``configs/survey_models.py`` with the data
  set and the numbers of fits per point read from ``rows``."""
  spec = importlib.util.spec_from_file_location("survey_models_config",
                                                experiment("survey_models").CONFIG_FILE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  private = [r for r in rows if r["library"] != "sklearn"]
  config.dataset = dataset
  for field, sel in (("num_seeds", [r for r in private if r["model"] != "kmeans"]),
                     ("kmeans_num_seeds", [r for r in private if r["model"] == "kmeans"])):
    seeds = {int(r["num_seeds"]) for r in sel}
    if len(seeds) > 1:
      raise ValueError(f"{dataset}: one number of fits per model expected, got {seeds}.")
    if seeds:
      (config[field],) = seeds
  return config


def draw(names, out_dir: pathlib.Path) -> list[pathlib.Path]:
  """Draws the figures ``names`` of :data:`FIGURES` into ``out_dir/<name>.png``."""
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  names = list(names)
  unknown = [n for n in names if n not in FIGURES]
  if unknown:
    raise ValueError(f"names must be figures of FIGURES, got {unknown}.")
  written = []
  for name in names:
    fig = FIGURES[name]
    if fig.plot == "tradeoffs":
      rows = [r for c in fig.csvs for r in read_rows(c)]  # several: one per selection protocol
      config = _tradeoffs_config(fig.figure, fig.dataset, rows)
      experiment("tradeoffs").plot(rows, config, out_dir / f"{name}.png", metadata=metadata(name))
      written.append(out_dir / f"{name}.png")
    elif fig.plot == "multiparty":
      rows = read_rows(fig.csvs[0])
      experiment("multiparty").plot(rows, out_dir / f"{name}.png", _multiparty_title(rows),
                                    metadata=metadata(name))
      written.append(out_dir / f"{name}.png")
    elif fig.plot == "survey_models":
      rows = read_rows(fig.csvs[0])
      experiment("survey_models").plot(rows, _survey_config(fig.dataset, rows),
                                       out_dir / f"{name}.png", metadata=metadata(name))
      written.append(out_dir / f"{name}.png")
  # confidence intervals: one plot_study call draws every figure of a study's CSV (grid: three).
  by_study = {}
  for name in names:
    fig = FIGURES[name]
    if fig.plot == "confidence_intervals":
      by_study.setdefault((fig.csvs, fig.figure), []).append(name)
  for (csvs, study), group in by_study.items():
    rows = read_rows(csvs[0])
    with tempfile.TemporaryDirectory() as tmp:
      experiment("confidence_intervals").plot_study(study, rows, pathlib.Path(tmp),
                                                    metadata=metadata(group[0]))
      for name in group:
        shutil.move(pathlib.Path(tmp) / FIGURES[name].output, out_dir / f"{name}.png")
        written.append(out_dir / f"{name}.png")
  return written


def table(name: str) -> str:
  """The markdown table of ``TABLES[name]``: mean ± s.d. of every line at every x value
  (confidence intervals: :func:`_ci_table`)."""
  spec = TABLES[name]
  if isinstance(spec, CiTable):
    return _ci_table(spec)
  tradeoffs = experiment("tradeoffs")
  rows = read_rows(spec.csv)
  config = _tradeoffs_config(spec.figure, spec.dataset, rows)
  axis = config.axis
  xkey = tradeoffs._ROW_AXIS.get(axis, axis)  # pylint: disable=protected-access
  flat = ("epsilon", "delta", "budget")  # non-private, and training along B, do not move
  xs = sorted(axis_values(axis, rows))

  def lines(rows, suffix):
    out = []
    for method in tradeoffs.METHODS:
      mine = [r for r in rows if r["method"] == method]
      deltas = [None] if method == "non_private" or axis == "delta" else sorted(
          {r["delta"] for r in mine})
      epsilons = [None] if method == "non_private" or axis == "epsilon" or len(
          config.epsilons) == 1 else sorted({r["epsilon"] for r in mine})
      for delta in deltas:
        for eps in epsilons:
          sel = [r for r in mine if (delta is None or r["delta"] == delta)
                 and (eps is None or r["epsilon"] == eps)]
          if not sel:
            continue
          label = tradeoffs.LABELS[method]
          if method == "subsample_aggregate_paper_beta":
            label = "S&A, paper's β=ε/B (2ε-DP)"
          label += "" if delta is None else f", δ={delta:g}"
          label += "" if eps is None else f", ε={eps:g}"
          if method == "non_private" and axis in flat or method in tradeoffs.TRAINING and (
              axis == "budget"):
            cells = [sel[0]] * len(xs)
          else:
            by_x = {r[xkey]: r for r in sel}
            cells = [by_x.get(x) for x in xs]
          out.append([label + suffix] + [
              "" if r is None else f"{r['test_accuracy_mean']:.3f} ± {r['test_accuracy_std']:.3f}"
              for r in cells])
    return out

  body = lines(rows, "")
  for extra_csv, suffix in spec.extra:
    body += lines(read_rows(extra_csv), suffix)
  header = ["method"] + [f"{x:g}" for x in xs]
  return "\n".join("| " + " | ".join(cells) + " |" for cells in
                   [header, ["---"] * len(header)] + body)


def _block(name: str) -> re.Pattern:
  return re.compile(rf"(<!-- generated:{re.escape(name)} -->\n)(.*?)(<!-- /generated:"
                    rf"{re.escape(name)} -->)", re.DOTALL)


def results_text() -> str:
  """The paper pages (:data:`PAGES`) joined: every generated block is in it once."""
  return "\n".join(page.read_text(encoding="utf-8") for page in PAGES)


def render_results(text: str, names=None) -> str:
  """``text`` (a paper page, or :func:`results_text`) with its generated blocks rewritten.

  ``names`` (default: every table) are the blocks ``text`` must hold exactly once.
  """
  for name in TABLES if names is None else names:
    pattern = _block(name)
    if len(pattern.findall(text)) != 1:
      raise ValueError(f"the paper pages (docs/paper_*.md) must hold exactly one "
                       f"<!-- generated:{name} --> block.")
    generated = table(name)
    text = pattern.sub(lambda m, g=generated: m.group(1) + "\n" + g + "\n\n" + m.group(3), text)
  return text


def render_pages() -> dict:
  """Each paper page's path -> (its text, its text with its generated blocks rewritten)."""
  render_results(results_text())  # every table exactly once over all pages
  out = {}
  for page in PAGES:
    text = page.read_text(encoding="utf-8")
    out[page] = (text, render_results(text, [n for n in TABLES if _block(n).search(text)]))
  return out


def check() -> list[str]:
  """What disagrees with the CSVs: stale or missing figures, stale tables ([] if none)."""
  problems = []
  for name, fig in FIGURES.items():
    missing = [c for c in fig.csvs if not (DATA / c).is_file()]
    png = FIGURES_DIR / f"{name}.png"
    if missing:
      problems.append(f"{name}: missing CSV {missing}")
    elif not png.is_file():
      problems.append(f"{name}: missing docs/figures/{name}.png")
    else:
      want, have = metadata(name), png_metadata(png)
      for key in ("Source", "Command"):
        if have.get(key) != want[key]:
          problems.append(f"{name}: PNG {key} {have.get(key)!r} != {want[key]!r}")
  text = results_text()
  try:
    rendered = render_results(text)
  except ValueError as e:
    problems.append(str(e))
  else:
    for name in TABLES:
      if _block(name).search(text).group(2) != _block(name).search(rendered).group(2):
        problems.append(f"docs/paper_*.md table {name}: not what the CSV gives")
  return problems


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true",
                      help="change nothing; exit 1 if a figure or table disagrees with its CSV")
  args = parser.parse_args(argv)
  if args.check:
    problems = check()
    for p in problems:
      print(p, file=sys.stderr)
    print(f"{len(FIGURES)} figures, {len(TABLES)} tables: "
          f"{'OK' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0
  for path in draw(FIGURES, FIGURES_DIR):
    print(f"wrote {path.relative_to(ROOT)}")
  changed = []
  for page, (text, rendered) in render_pages().items():
    if rendered != text:
      page.write_text(rendered, encoding="utf-8")
      changed.append(page.name)
  print(f"docs/paper_*.md: {len(TABLES)} generated tables"
        f"{' rewritten in ' + ', '.join(changed) if changed else ' unchanged'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
