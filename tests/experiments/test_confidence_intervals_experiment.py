"""experiments/confidence_intervals.py end to end on a small Adult pool: every study's CSV and
figure, replicates in chunks equal to one call, and a second run that computes nothing."""

import csv
import functools
import math

import numpy as np
import pytest

import _repo_modules

_load = _repo_modules.load

# One variant per study; tiny cells (pool of 2,000 Adult rows, n = 500, d = 2: one compiled
# program serves every cell but the non-private one).
ALL_STUDIES = ("grid", "split", "split23", "epsilon_grid", "vi_n", "vi_d", "vi_epsilon",
               "epsilon_fit", "sample_complexity")
# The studies whose code paths are not the grid's (always run; all of them: slow).
NEW_PATHS = ("split23", "epsilon_grid", "vi_n", "epsilon_fit", "sample_complexity")


@functools.cache
def _experiment():
  """The experiment module, its Adult pool loaded once for every test here (3 s)."""
  ci = _load("experiments/confidence_intervals.py")
  pools, load = {}, ci.load_pool

  def load_pool(config):
    key = (config.dataset, config.pool_size, config.seed)
    if key not in pools:
      pools[key] = load(config)
    return pools[key]

  ci.load_pool = load_pool
  return ci


def _config(tmp_path, studies=NEW_PATHS, **kw):
  ci = _experiment()
  config = _load("configs/confidence_intervals.py").get_config()
  config.update(dict(
      out_dir=str(tmp_path), pool_size=2000, studies=tuple(studies), losses=("logistic",),
      variants=("output_zcdp",), floors=("paper",), floor="paper", ns=(500,), ds=(2,),
      replicates=20, replicate_chunk=8, chunk_size=2, split_fractions=(0.5, 0.9), split_d=2,
      split_n=500, split23_shares=(0.25, 0.75), split23_ds=(2,), split23_n=500,
      split23_replicates=20, epsilons=(0.5, 2.0), epsilon_grid_ns=(500,), epsilon_grid_d=2,
      vi_replicates=20, vi_ds=(2,), vi_fixed_n=500, vi_d=2, fit_epsilons=(0.5, 1.0, 2.0),
      fit_n=500, fit_d=2, nonprivate_ns=(500,), sample_complexity_step=500,
      sample_complexity_max_n=500, sample_complexity_d=2))
  config.update(kw)
  return ci, ci.resolve_config(config)


def _read(path):
  with open(path, newline="", encoding="utf-8") as f:
    return list(csv.DictReader(f))


def _every_study_writes_its_rows_and_figures_and_resumes(studies, tmp_path, monkeypatch):
  ci, config = _config(tmp_path, studies)
  out, runner = ci.run(config)
  assert runner.computed > 0
  for study in studies:
    rows = _read(out / f"{study}.csv")
    assert rows, study
    if study == "sample_complexity":
      assert list(rows[0]) == list(ci.SAMPLE_COMPLEXITY_FIELDS)
      (row,) = rows
      assert row["variant"] == "output_zcdp" and int(row["n_nonprivate"]) == 500
      # n_private is the smallest multiple of the step, at most max_n, at least as short
      if row["n_private"]:
        assert int(row["n_private"]) == 500
        assert float(row["private_length"]) <= float(row["nonprivate_length"])
      continue
    assert list(rows[0]) == list(ci.ROW_FIELDS), study
    for r in rows:
      assert r["study"] == study and r["dataset"] == "adult"
      assert 0.0 <= float(r["coverage"]) <= 1.0
      assert float(r["length"]) > float(r["vi_length"]) > 0.0
      assert float(r["rho"]) == pytest.approx(float(r["epsilon"]) ** 2 / 2)
      assert int(r["replicates"]) == 20
      assert r["coverage_warning"] == ""  # logistic, output perturbation: covers
    for f in ci.FIGURE_FILES[study]:
      if f != "grid.png":  # Figs. 17-18 fit the d = 5 rows; these are d = 2
        assert (out / f).is_file(), (study, f)
  split23 = _read(out / "split23.csv")
  assert sorted(float(r["phi2_share"]) for r in split23) == pytest.approx([0.25, 0.75])
  assert [float(r["phi1_fraction"]) for r in split23] == pytest.approx([0.9, 0.9])  # Table 2
  assert {float(r["epsilon"]) for r in _read(out / "epsilon_grid.csv")} == {0.5, 2.0}
  cells = _read(out / "sample_complexity_cells.csv")
  nonprivate = [r for r in cells if r["variant"] == "nonprivate"]
  assert len(nonprivate) == 1 and math.isinf(float(nonprivate[0]["epsilon"]))
  assert (out / "length_fits.json").is_file()

  # A second run reads every cell from the PointLog: nothing is computed, the same rows.
  before = {s: _read(out / f"{s}.csv") for s in studies}
  calls, drawn = [], []
  monkeypatch.setattr(ci, "run_cell", lambda *a, **k: calls.append(k))
  monkeypatch.setattr(ci, "plot_study", lambda study, rows, out: drawn.append(study))
  out2, runner2 = ci.run(config)
  assert out2 == out and runner2.computed == 0 and not calls
  assert {s: _read(out / f"{s}.csv") for s in studies} == before
  assert drawn == list(studies)


@pytest.mark.slow
def test_every_study_writes_its_rows_and_figures_and_resumes(tmp_path, monkeypatch):
  _every_study_writes_its_rows_and_figures_and_resumes(NEW_PATHS, tmp_path, monkeypatch)


@pytest.mark.slow
def test_all_studies_write_their_rows_and_figures_and_resume(tmp_path, monkeypatch):
  _every_study_writes_its_rows_and_figures_and_resumes(ALL_STUDIES, tmp_path, monkeypatch)


# n below the pool's 2,000 rows: replicates as row indices; above: as row multiplicities.
@pytest.mark.parametrize("n", [500, pytest.param(2500, marks=pytest.mark.slow)])
def test_replicates_in_chunks_equal_one_call(tmp_path, n):
  ci, config = _config(tmp_path)
  x_full, y = ci.load_pool(config)
  x = ci.design(x_full, 2)
  theta0 = ci.Runner(config, None, x_full, y).theta0("logistic", 2)[1]
  cell = dict(study="grid", loss="logistic", variant="output_zcdp", floor="paper", n=n,
              epsilon=1.0, fractions=None, replicates=20,
              key=ci.jax.random.key(3))
  rows = []
  for chunk in (8, 20):
    config.replicate_chunk = chunk
    rows.append(ci.run_cell(config, x, y, theta0, **cell))
  assert rows[0]["coverage"] == rows[1]["coverage"]
  for field in ("length", "length_se", "vi_length", "coverage_se"):
    np.testing.assert_allclose(rows[0][field], rows[1][field], rtol=1e-9)


def test_coverage_warning_uses_the_total_budget_in_pure_dp_terms():
  ci = _load("experiments/confidence_intervals.py")
  # objective perturbation under-covers below n eps^2 = 10,000: pure eps = 1 at n = 9,000 is
  # 9,000; zCDP rho = 0.6 is eps = sqrt(1.2), 10,800.
  assert ci.warning_for("logistic", "objective", 9000, "pure", 1.0)
  assert ci.warning_for("logistic", "objective", 9000, "zcdp", 0.6) == ""
  assert ci.warning_for("logistic", "output", 500, "pure", 0.1) == ""


def test_cells_where_algorithm_1_does_not_exist_are_left_out():
  # Paper 003 Alg. 1 needs c > t / (2 n (e^{eps_1} - 1)): at c = 0.001 and eps = 0.1
  # (eps_1 = 0.065) that is n > 1,860 for logistic regression; output perturbation has no
  # such condition.
  ci = _load("experiments/confidence_intervals.py")
  kw = dict(loss="logistic", l2_reg=0.002, h=0.5, alpha=0.05, quantiles="exact",
            num_samples=10000, floor="paper", fractions=None)
  objective, output = dict(kw, perturbation="objective"), dict(kw, perturbation="output")
  assert not ci.feasible(n=1000, dim=11, phi={"epsilon": 0.1}, kw=objective)
  assert ci.feasible(n=2000, dim=11, phi={"epsilon": 0.1}, kw=objective)
  assert ci.feasible(n=1000, dim=11, phi={"epsilon": 0.1}, kw=output)
