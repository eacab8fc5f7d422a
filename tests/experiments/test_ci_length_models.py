"""Tests of experiments/ci_length_models.py: the Sec. 7.7 length fits, the Sec. 7.5
sample-complexity search and the figures (paper 003)."""

import csv
import io
import math

import numpy as np
import pytest

import _repo_modules

clm = _repo_modules.load("experiments/ci_length_models.py")

NS = np.array([1000, 2000, 4000, 8000, 16000, 32000, 64000], dtype=float)
EPS = np.array([0.1, 0.2, 0.5, 1.0, 2.0, 5.0])


def test_fit_inverse_n_recovers_exact_coefficients():
  lengths = 30.0 / NS + 4.0 / np.sqrt(NS)
  c0, c1 = clm.fit_inverse_n(NS, lengths)
  assert (c0, c1) == pytest.approx((30.0, 4.0), rel=1e-9)
  q = clm.fit_quality(clm.inverse_n_curve(NS, c0, c1), lengths)
  assert q["r2"] == pytest.approx(1.0, abs=1e-12) and q["max_rel_err"] < 1e-9


def test_fit_inverse_sqrt_n_recovers_c_and_misfits_a_privacy_term():
  clean = 4.0 / np.sqrt(NS)
  assert clm.fit_inverse_sqrt_n(NS, clean) == pytest.approx(4.0, rel=1e-12)
  private = 300.0 / NS + 4.0 / np.sqrt(NS)
  c = clm.fit_inverse_sqrt_n(NS, private)
  c0, c1 = clm.fit_inverse_n(NS, private)
  q_sqrt = clm.fit_quality(clm.inverse_sqrt_n_curve(NS, c), private)
  q_full = clm.fit_quality(clm.inverse_n_curve(NS, c0, c1), private)
  assert q_full["r2"] == pytest.approx(1.0, abs=1e-12)
  assert q_sqrt["r2"] < 0.95 and q_sqrt["max_rel_err"] > 0.2


@pytest.mark.parametrize("notion", ["pure", "zcdp"])
def test_fit_epsilon_recovers_exact_coefficients(notion):
  lengths = clm.epsilon_curve(EPS, 0.02, 0.09, notion)
  feature = 1 / EPS**2 if notion == "pure" else 2 / EPS**2
  np.testing.assert_allclose(lengths, np.sqrt(0.02 * feature + 0.09))
  c0, c1 = clm.fit_epsilon(EPS, lengths, notion)
  assert (c0, c1) == pytest.approx((0.02, 0.09), rel=1e-8)
  assert clm.fit_quality(clm.epsilon_curve(EPS, c0, c1, notion), lengths)["r2"] == pytest.approx(
      1.0, abs=1e-12)


def test_fit_epsilon_keeps_variances_non_negative():
  """Lengths growing with eps would need c0 < 0: the fit stays at c0 = 0, defined everywhere."""
  c0, c1 = clm.fit_epsilon(EPS, 0.3 + 0.01 * EPS, "pure")
  assert c0 == 0.0 and c1 > 0
  assert np.all(np.isfinite(clm.epsilon_curve(np.array([1e-3, 1e3]), c0, c1, "pure")))


def test_fit_quality_values():
  q = clm.fit_quality([1.1, 1.9, 3.0], [1.0, 2.0, 3.0])
  assert q["r2"] == pytest.approx(1 - 0.02 / 2.0)
  assert q["max_rel_err"] == pytest.approx(0.1)
  assert q["rms_rel_err"] == pytest.approx(math.sqrt((0.01 + 0.0025) / 3))


@pytest.mark.parametrize("call, match", [
    (lambda: clm.fit_inverse_n([1000, 2000], [0.1]), "same length"),
    (lambda: clm.fit_inverse_n([1000], [0.1]), "at least 2"),
    (lambda: clm.fit_inverse_sqrt_n([0, 2000], [0.1, 0.2]), "ns"),
    (lambda: clm.fit_epsilon([1.0, 2.0], [0.1, -0.2], "pure"), "lengths"),
    (lambda: clm.fit_epsilon([1.0, 2.0], [0.1, 0.2], "approx"), "notion"),
    (lambda: clm.fit_quality([1.0], [0.0]), "obs"),
    (lambda: clm.sample_complexity(lambda n: 1.0, {1000: 0.5}, step=0), "step"),
    (lambda: clm.sample_complexity(lambda n: 1.0, {1000: 0.5}, step=10, max_n=5), "max_n"),
    (lambda: clm.sample_complexity(lambda n: 1.0, {1000: float("nan")}), "nonprivate_lengths"),
    (lambda: clm.sample_complexity(lambda n: 1.0, {}), "nonprivate_lengths"),
])
def test_bad_input_raises_naming_the_argument(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def _counting(fn):
  calls = []

  def length_at(n):
    calls.append(n)
    return fn(n)
  return length_at, calls


def _linear_scan(fn, target, step, max_n):
  for n in range(step, max_n + 1, step):
    if fn(n) <= target:
      return n
  return None


def test_sample_complexity_equals_a_linear_scan_with_fewer_calls():
  def private(n):
    return 300.0 / n + 4.0 / math.sqrt(n)
  nonprivate = {n: 3.92 / math.sqrt(n) for n in range(1000, 10001, 1000)}
  nonprivate[500] = 0.9  # reached at the first grid point
  nonprivate[77] = 1e-4  # never reached below max_n
  step, max_n = 2500, 2_000_000
  length_at, calls = _counting(private)
  got = clm.sample_complexity(length_at, nonprivate, step=step, max_n=max_n)
  want = {k: _linear_scan(private, v, step, max_n) for k, v in nonprivate.items()}
  assert got == want
  assert list(got) == list(nonprivate)
  assert got[500] == 2500 and got[77] is None
  assert len(calls) == len(set(calls))  # memoised
  scan_calls = max_n // step  # the unreached target alone costs a full linear scan
  assert len(calls) < scan_calls / 10


@pytest.mark.parametrize("targets", [range(1000, 10001, 1000), (1000, 10000)])
def test_sample_complexity_calls_no_more_than_the_scan_to_the_largest_answer(targets):
  """Dense targets cost about what the paper's scan costs, sparse ones far less."""
  def private(n):
    return 3000.0 / n + 4.0 / math.sqrt(n)
  nonprivate = {m: 4.0 / math.sqrt(m) for m in targets}
  length_at, calls = _counting(private)
  got = clm.sample_complexity(length_at, nonprivate)
  assert got == {m: _linear_scan(private, v, 2500, 2_000_000) for m, v in nonprivate.items()}
  scan_calls = max(got.values()) // 2500
  assert len(calls) <= scan_calls
  if len(nonprivate) == 2:
    assert len(calls) < scan_calls / 2


def test_sample_complexity_scans_linearly_after_a_rise():
  step = 100
  bumpy = {k: 10.0 - 0.1 * k for k in range(1, 41)}
  bumpy[2] = 0.5  # a dip below the target between the doubling points 1 and 3 ...
  bumpy[3] = 9.95  # ... and a rise from 1 to 3 that the search sees

  def private(n):
    return bumpy[n // step]
  target = 9.0  # the paper's scan stops at 2; a search trusting monotonicity finds 10
  length_at, calls = _counting(private)
  got = clm.sample_complexity(length_at, {1: target}, step=step, max_n=4000)
  assert got == {1: _linear_scan(private, target, step, 4000)} == {1: 200}
  assert len(calls) == len(set(calls))
  assert calls[:3] == [100, 300, 700] and 1000 in calls  # the search, then the scan from 100


def test_sample_complexity_treats_infinite_lengths_as_too_long():
  length_at, _ = _counting(lambda n: math.inf if n < 5000 else 1.0 / n)
  assert clm.sample_complexity(length_at, {1: 1e-4}, step=1000, max_n=20000) == {1: 10000}


# ----------------------------------------------------------------------------- figures


def _as_strings(rows):
  """``rows`` written to CSV and read back with csv.DictReader (every value a string)."""
  buf = io.StringIO()
  fields = sorted({k for r in rows for k in r})
  writer = csv.DictWriter(buf, fieldnames=fields)
  writer.writeheader()
  writer.writerows(rows)
  buf.seek(0)
  return list(csv.DictReader(buf))


def _row(study, variant, *, n=10000, d=10, epsilon=1.0, **kw):
  zcdp = variant.endswith("zcdp")
  length = kw.pop("length", (2.0 if not zcdp else 1.2) * (d**0.5) * (50 / n + 1 / n**0.5)
                  * (1 + 0.3 / epsilon))
  base = dict(study=study, dataset="adult", loss="logistic", variant=variant, floor="paper",
              n=n, d=d, epsilon=epsilon, rho=epsilon**2 / 2 if zcdp else "",
              phi1_fraction=0.8, phi2_share=0.5, coverage=0.96, coverage_se=0.005,
              length=length, length_se=0.01 * length, vi_length=0.6 * length, replicates=100,
              seconds_per_interval=0.01, coverage_warning="")
  base.update(kw)
  return base


def _check_png(path):
  data = path.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


PAIR = ("objective_pure", "output_zcdp")  # one pure, one zCDP variant: fewer panels to draw


META = {"Software": "jaxdp test"}


# Always on: tests/experiments/test_confidence_intervals_experiment.py draws this figure from
# the experiment's rows.
@pytest.mark.slow
def test_plot_split23_writes_a_png(tmp_path):
  split = [_row("split23", v, d=d, phi2_share=s, coverage=0.9 + 0.1 * s,
                length=(1 + d) * (1 + (s - 0.5)**2))
           for v in PAIR for d in (1, 10) for s in (0.125, 0.5, 0.875)]
  clm.plot_split23(_as_strings(split), tmp_path / "split.png", metadata=META)
  _check_png(tmp_path / "split.png")


# Always on: tests/experiments/test_confidence_intervals_experiment.py draws this figure from
# the experiment's rows.
@pytest.mark.slow
def test_plot_epsilon_grid_writes_a_png(tmp_path):
  grid = [_row("epsilon_grid", v, n=n, epsilon=e, coverage=min(1.0, 0.85 + e * n / 2e5))
          for v in PAIR for n in (1000, 5000, 20000) for e in (0.1, 0.5, 1.0, 2.0)]
  clm.plot_epsilon_grid(grid, tmp_path / "grid.png", metadata=META)
  _check_png(tmp_path / "grid.png")


# Always on: tests/experiments/test_confidence_intervals_experiment.py draws this figure from
# the experiment's rows.
@pytest.mark.slow
def test_plot_ci_vs_vi_writes_a_png(tmp_path):
  vi = [_row("vi_epsilon", v, epsilon=x) for v in clm.VARIANTS for x in (0.2, 1.0, 5.0)]
  clm.plot_ci_vs_vi(_as_strings(vi), tmp_path / "vi.png", metadata=META)
  _check_png(tmp_path / "vi.png")


def test_plot_length_fits_in_n_writes_a_png_and_fits_d5(tmp_path):
  nfit = [_row("grid", v, n=n, d=d) for v in PAIR for n in (1000, 4000, 16000, 64000)
          for d in (5, 10)]
  fits = clm.plot_length_fits(_as_strings(nfit), tmp_path / "fit_n.png", metadata=META)
  _check_png(tmp_path / "fit_n.png")
  assert {f["variant"] for f in fits} == set(PAIR) and all(f["d"] == 5 for f in fits)
  assert all(f["quality"]["r2"] == pytest.approx(1.0) for f in fits)
  assert all(f["quality_sqrt"]["r2"] < f["quality"]["r2"] for f in fits)


def test_plot_length_fits_in_epsilon_writes_a_png_and_recovers_the_fit(tmp_path):
  efit = [_row("epsilon_fit", v, d=5, epsilon=e,
               length=float(clm.epsilon_curve(e, 0.01, 0.04, v.split("_")[1])))
          for v in PAIR for e in (0.1, 0.3, 1.0, 3.0)]
  fits = clm.plot_length_fits(efit, tmp_path / "fit_eps.png", metadata=META)
  _check_png(tmp_path / "fit_eps.png")
  assert {f["notion"] for f in fits} == {"pure", "zcdp"}
  assert all((f["c0"], f["c1"]) == pytest.approx((0.01, 0.04), rel=1e-6) for f in fits)


# Always on: tests/experiments/test_confidence_intervals_experiment.py draws this figure from
# the experiment's rows.
@pytest.mark.slow
def test_plot_sample_complexity_writes_a_png(tmp_path):
  sc = [dict(dataset=ds, variant=v, n_nonprivate=m, nonprivate_length=1 / m**0.5,
             n_private=None if (v == "objective_pure" and m == 10000) else 5 * m + 2500 * i,
             private_length=1 / m**0.5)
        for ds in ("adult", "kddcup99") for i, v in enumerate(clm.VARIANTS)
        for m in (1000, 5000, 10000)]
  clm.plot_sample_complexity(_as_strings(sc), tmp_path / "sc.png", metadata=META)
  _check_png(tmp_path / "sc.png")


def test_ci_vs_vi_axis_follows_the_study():
  assert clm._study_axis(_as_strings([_row("vi_n", "output_pure")]))[::2] == ("n", True)
  assert clm._study_axis([_row("vi_d", "output_pure")])[::2] == ("d", False)
  assert clm._study_axis([_row("vi_epsilon", "output_pure")])[::2] == ("epsilon", True)


def test_coerce_row_types():
  warning = "objective perturbation with n * eps_1 below 3000"
  row = clm.coerce_row({"n": "2500", "epsilon": "0.5", "rho": "", "coverage_warning": warning,
                        "n_private": "None", "variant": "output_pure"})
  assert row == {"n": 2500, "epsilon": 0.5, "rho": None, "coverage_warning": warning,
                 "n_private": None, "variant": "output_pure"}


def test_plot_bad_rows_raise(tmp_path):
  with pytest.raises(ValueError, match="rows"):
    clm.plot_ci_vs_vi([_row("vi_n", "output_pure"), _row("vi_d", "output_pure")],
                      tmp_path / "x.png")
  with pytest.raises(ValueError, match="variant"):
    clm.plot_split23([_row("split23", "output_approx")], tmp_path / "x.png")
  with pytest.raises(ValueError, match="d = 5"):
    clm.plot_length_fits([_row("grid", "output_pure", d=10)], tmp_path / "x.png")
  with pytest.raises(ValueError, match="no rows"):
    clm.plot_sample_complexity([], tmp_path / "x.png")
