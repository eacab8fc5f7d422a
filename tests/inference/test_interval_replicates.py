"""Bootstrap replicates as row indices, and the coverage warning (jaxdp/inference/intervals.py).

Tiny data (N = 300 rows, d = 2): every test here compiles at most the gathered and the
weighted pipeline once at one chunk shape.
"""

import math
import warnings

import jax
import numpy as np
import pytest

from _spend_probe import SpendRecorder, StopAtSpend, charged
from jaxdp.accounting import PrivacyAccountant, PrivacyBudget
from jaxdp.errors import BudgetExceededError
from jaxdp.inference import CoverageWarning, OBJECTIVE_MIN_N_EPS_SQUARED, coverage_warning
from jaxdp.inference import intervals as ci
from jaxdp.training import certified_solve

N, D = 300, 2
M, SIZE = 4, 150              # replicates per call, rows per replicate (n <= N/2)
KW = dict(epsilon=2.0, perturbation="objective", l2_reg=0.05)
IGNORE_COVERAGE = pytest.mark.filterwarnings("ignore::jaxdp.inference.CoverageWarning")


def _pool():
  rng = np.random.default_rng(0)
  x = np.column_stack([rng.normal(size=N) / 2, np.full(N, 0.5)])
  x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
  y = np.where(rng.random(N) < 1 / (1 + np.exp(-x @ np.array([1.5, -1.0]))), 1, 0)
  return x, y


def _counts(seed=1):
  return np.random.default_rng(seed).multinomial(SIZE, np.full(N, 1 / N), size=M)


def _as_indices(counts):
  return np.repeat(np.tile(np.arange(N), counts.shape[0]), counts.ravel()).reshape(
      counts.shape[0], -1)


def _keys():
  return jax.random.split(jax.random.key(7), M)


def _assert_same_replicates(a, b, cal):
  """Two certified solves of the same replicates with the same keys: each released minimiser
  is within tol/Lambda of the exact one, so ||theta~_a - theta~_b|| <= 2 tol/Lambda =: delta,
  and the half-widths move by a relative <= delta/Lambda (the argument of
  test_intervals.test_batched_chunks_in_threads_are_bit_identical_to_sequential). Another
  replicate or key moves them by the bootstrap or privacy noise (> 1e-2 here)."""
  delta = 2 * cal.tol / cal.l2_reg
  np.testing.assert_allclose(a.theta, b.theta, rtol=0, atol=delta + 1e-12)
  np.testing.assert_allclose(a.upper - a.theta, b.upper - b.theta, rtol=delta / cal.l2_reg,
                             atol=1e-12)
  np.testing.assert_allclose(a.theta - a.lower, b.theta - b.lower, rtol=delta / cal.l2_reg,
                             atol=1e-12)


def _sandwich(xr, yr, lam, alpha=0.05):
  """The classical interval on the rows ``xr, yr``: the exact minimiser (scipy, float64) +-
  z sqrt((H^-1 Sigma H^-1)_jj / n) (paper 003 Eqs. 4.2-4.3), in numpy."""
  import scipy.optimize
  from scipy import stats
  from jaxdp.inference import sensitivities as sens
  from jaxdp.training import certified_solve
  ys = sens.as_signed_labels(yr)
  fun = lambda t: certified_solve.objective_and_grad(t, xr, ys, loss="logistic", h=0.5,
                                                     l2_total=lam)
  theta = scipy.optimize.minimize(fun, np.zeros(xr.shape[1]), jac=True, method="L-BFGS-B",
                                  options=dict(gtol=1e-12, ftol=0, maxiter=1000)).x
  z = ys * (xr @ theta)
  d1, d2 = -1 / (1 + np.exp(z)), 1 / (1 + np.exp(z)) / (1 + np.exp(-z))
  n = len(ys)
  hess = (xr * d2[:, None]).T @ xr / n + lam * np.eye(xr.shape[1])
  cov = (xr * (d1 * d1)[:, None]).T @ xr / n - lam ** 2 * np.outer(theta, theta)
  hinv = np.linalg.inv(hess)
  se = np.sqrt(np.diag(hinv @ cov @ hinv) / n)
  q = stats.norm.ppf(1 - alpha / 2)
  return theta - q * se, theta + q * se, se


@IGNORE_COVERAGE
def test_indices_gather_each_replicates_rows():
  """One compiled program (the gathered one): indices= solves each replicate on its n rows;
  counts of total n <= N/2 are converted to the same indices (bit-identical); the order of the
  rows does not matter; without noise each interval is the sandwich interval of its own
  replicate (not of the pool's N rows), with the group size of its repeated rows."""
  x, y = _pool()
  counts = _counts()
  idx = _as_indices(counts)
  by_idx, cal_i = ci.confidence_intervals_batched(_keys(), x, y, indices=idx, **KW)
  by_counts, cal_c = ci.confidence_intervals_batched(_keys(), x, y, counts=counts, **KW)
  for a, b in zip(by_idx, by_counts):
    np.testing.assert_array_equal(a, b)
  assert cal_i == cal_c
  assert cal_i.num_examples == SIZE and cal_i.group_size == int(counts.max()) > 1
  perm = np.random.default_rng(2).permuted(idx, axis=1)
  shuffled, _ = ci.confidence_intervals_batched(_keys(), x, y, indices=perm, **KW)
  _assert_same_replicates(shuffled, by_idx, cal_i)
  # Another key or replicate is far outside the tolerance (the test can fail).
  assert np.max(np.abs(by_idx.theta[1:] - by_idx.theta[:-1])) > 1e-2
  # No noise, covariance unfloored, minimiser certified to ||grad J|| <= 1e-10 (same compiled
  # program: epsilon, floor and tol only change its parameters).
  off, _ = ci.confidence_intervals_batched(_keys(), x, y, indices=idx, floor="psd", tol=1e-10,
                                           **{**KW, "epsilon": math.inf})
  for j in range(M):
    lo, hi, se = _sandwich(x[idx[j]], y[idx[j]], KW["l2_reg"])
    np.testing.assert_allclose(off.lower[j], lo, rtol=0, atol=1e-5 * se.min())
    np.testing.assert_allclose(off.upper[j], hi, rtol=0, atol=1e-5 * se.min())
  pool_lo = _sandwich(x, y, KW["l2_reg"])[0]
  assert np.max(np.abs(off.lower[0] - pool_lo)) > 1e-2


@pytest.mark.slow  # compiles the weighted program too (~10 s on a busy CPU)
@IGNORE_COVERAGE
def test_indices_equal_the_weighted_path(monkeypatch):
  """Counts as multiplicities over all N rows (the weighted program) and the same replicates
  gathered: the same event, and intervals equal to the certificate's tolerance. The
  always-on check of the gathered program is test_indices_gather_each_replicates_rows."""
  x, y = _pool()
  counts = _counts()
  by_idx, cal_i = ci.confidence_intervals_batched(_keys(), x, y, indices=_as_indices(counts),
                                                  **KW)
  monkeypatch.setattr(ci, "_GATHER_AT_MOST", 0.0)  # counts as weights over all N rows
  weighted, cal_w = ci.confidence_intervals_batched(_keys(), x, y, counts=counts, **KW)
  assert cal_i == cal_w
  _assert_same_replicates(by_idx, weighted, cal_w)


@pytest.mark.slow  # compiles stage 2 alone (~10 s on a busy CPU); always on: the next test
@IGNORE_COVERAGE
def test_host_repair_and_stage_two_rerun_with_indices(monkeypatch):
  """A replicate that misses the certificate is repaired on the host from its gathered rows
  and stage 2 re-run on them (forced here: every certificate reported failed)."""
  x, y = _pool()
  idx = _as_indices(_counts())
  good, cal = ci.confidence_intervals_batched(_keys(), x, y, indices=idx, **KW)
  orig = ci._pipeline_jit
  real_repair = ci._repair
  calls = []

  def failing(*args, **kw):
    out, th, lin, cert = orig(*args, **kw)
    return out, th + 0.05, lin, cert + math.inf   # a worse iterate, certificate missed

  def repair(*args, **kw):
    calls.append(args[7] if len(args) > 7 else kw.get("gather"))
    return real_repair(*args, **kw)

  monkeypatch.setattr(ci, "_pipeline_jit", failing)
  monkeypatch.setattr(ci, "_repair", repair)
  fixed, _ = ci.confidence_intervals_batched(_keys(), x, y, indices=idx, **KW)
  assert calls and all(g is True for g in calls)
  _assert_same_replicates(fixed, good, cal)


def test_repair_of_one_indexed_replicate_is_certified():
  from jaxdp.inference import sensitivities as sens
  from jaxdp.training import certified_solve
  x, y = _pool()
  ys = sens.as_signed_labels(y)
  rows = _as_indices(_counts())[0]
  cal = ci.calibrate(num_examples=SIZE, dim=D, epsilon=math.inf, perturbation="output")
  fixed = ci._repair(np.array([0.4, 0.4]), np.zeros(D), np.array(1.0), cal, x, ys, rows,
                     gather=True)
  _, g = certified_solve.objective_and_grad(fixed, x[rows], ys[rows], loss="logistic", h=0.5,
                                            l2_total=cal.l2_reg)
  assert np.linalg.norm(g) <= cal.tol
  _, g_all = certified_solve.objective_and_grad(fixed, x, ys, loss="logistic", h=0.5,
                                                l2_total=cal.l2_reg)
  assert np.linalg.norm(g_all) > cal.tol  # the replicate's problem, not the pool's


@pytest.mark.parametrize("priv", ["pure", "zcdp"])
def test_indices_are_charged_by_group_privacy_like_counts(priv):
  """The group size is the most occurrences of one row in any replicate (here 3, in the
  second replicate); M replicates are M releases at that size; indices and the counts of
  the same replicates are charged identically."""
  x, y = _pool()
  idx = np.tile(np.arange(SIZE), (3, 1))
  idx[1, :3] = 7                                   # row 7 three times (once already)
  idx[1, 7] = 8                                    # ... and row 8 twice
  counts = np.stack([np.bincount(r, minlength=N) for r in idx])
  assert ci._max_multiplicity(idx) == 3 == counts.max()
  phi = {"epsilon": 1.0} if priv == "pure" else {"rho": 0.5}
  kw = dict(**phi, perturbation="output", l2_reg=0.05)
  keys = jax.random.split(jax.random.key(1), 3)
  by_idx, count = charged(ci.confidence_intervals_batched, keys, x, y, indices=idx, **kw)
  by_counts, _ = charged(ci.confidence_intervals_batched, keys, x, y, counts=counts, **kw)
  plain, _ = charged(ci.confidence_intervals, keys[0], x[:SIZE], y[:SIZE], **kw)
  assert count == 3 and by_idx.ledger == by_counts.ledger
  if priv == "pure":
    assert by_idx.pure_epsilon() == pytest.approx(3 * 3 * 1.0, rel=1e-9)
  else:
    assert by_idx.zcdp_rho() == pytest.approx(3 * 9 * plain.zcdp_rho(), rel=1e-9)
  # One replicate without repeats costs the example-level event of n = SIZE records.
  single, _ = charged(ci.confidence_intervals, keys[0], x, y, indices=idx[0], **kw)
  assert single.ledger == plain.ledger


# (arguments of the batched call, match, the single call's arguments or None)
@pytest.mark.parametrize("bad,match,single", [
    (dict(indices=np.zeros((M, 5), np.int64), counts=np.ones((M, N), np.int64)),
     "counts.*indices", dict(indices=np.zeros(5, np.int64), counts=np.ones(N, np.int64))),
    (dict(indices=np.zeros((M, 5))), "indices must be an integer",
     dict(indices=np.zeros(5))),
    (dict(indices=np.zeros((M, 5), bool)), "indices must be an integer",
     dict(indices=np.zeros(5, bool))),
    (dict(indices=np.full((M, 5), N)), r"indices must be row indices of x, in \[0, 300\)",
     dict(indices=np.full(5, N))),
    (dict(indices=np.full((M, 5), -1)), "indices must be row indices",
     dict(indices=np.full(5, -1))),
    (dict(indices=np.zeros((M + 1, 5), np.int32)), r"indices must have shape \(4, n\)", None),
    (dict(indices=np.zeros(5, np.int32)), r"indices must have shape \(4, n\)",
     dict(indices=np.zeros((1, 5), np.int32))),
    (dict(indices=np.zeros((M, 0), np.int32)), "n >= 1", dict(indices=np.zeros(0, np.int32))),
    (dict(counts=np.ones((M + 1, N), np.int64)), "counts must be non-negative", None),
])
def test_bad_replicates_are_named_before_any_spend(bad, match, single):
  x, y = _pool()
  budget = PrivacyBudget(epsilon=100.0)
  with pytest.raises(ValueError, match=match):
    ci.confidence_intervals_batched(_keys(), x, y, accountant=budget, **KW, **bad)
  if single is not None:
    with pytest.raises(ValueError, match=match.replace(r"\(4, n\)", r"\(n,\)")):
      ci.confidence_intervals(jax.random.key(0), x, y, accountant=budget, **KW, **single)
  assert budget.spent_epsilon == 0.0


def test_coverage_warning_rule_at_its_boundaries():
  base = dict(loss="logistic", perturbation="objective")
  at = math.sqrt(OBJECTIVE_MIN_N_EPS_SQUARED / 1000)
  assert coverage_warning(**base, num_examples=1000, epsilon=at) is None
  msg = coverage_warning(**base, num_examples=1000, epsilon=at * (1 - 1e-9))
  assert "n * eps^2" in msg and "OBJECTIVE_MIN_N_EPS_SQUARED" in msg and "output" in msg
  assert coverage_warning(**base, num_examples=999, epsilon=at) is not None
  assert coverage_warning(**base, num_examples=10, epsilon=math.inf) is None
  assert coverage_warning(loss="logistic", perturbation="output", num_examples=10,
                          epsilon=0.01) is None
  for pert, eps in (("output", 100.0), ("objective", math.inf), ("objective", 100.0)):
    huber = coverage_warning(loss="huber", perturbation=pert, num_examples=10**5, epsilon=eps)
    assert "huber" in huber and "n * eps^2" not in huber
  both = coverage_warning(loss="huber", perturbation="objective", num_examples=10, epsilon=1.0)
  assert "huber" in both and "n * eps^2" in both
  with pytest.raises(ValueError, match="loss"):
    coverage_warning(loss="hinge", perturbation="output", num_examples=10, epsilon=1.0)
  with pytest.raises(ValueError, match="epsilon"):
    coverage_warning(loss="logistic", perturbation="output", num_examples=10, epsilon=0.0)


def _warned(fn, *args, **kw):
  """``True`` if the call warns (a CoverageWarning raised as an error, before the spend),
  ``False`` if it reaches the spend (a recorder that stops it) without warning."""
  rec = SpendRecorder()
  with warnings.catch_warnings():
    warnings.simplefilter("error", CoverageWarning)
    try:
      fn(*args, accountant=rec, **kw)
    except CoverageWarning:
      assert not hasattr(rec, "event")  # nothing spent
      return True
    except StopAtSpend:
      return False
  raise AssertionError("the call neither warned nor spent")


def test_calls_warn_once_before_any_spend():
  """The release points apply the rule with the total budget in pure-DP terms (epsilon, or
  sqrt(2 rho) under zCDP) and n = the replicate's size; an error-filtered warning leaves the
  accountant untouched."""
  x, y = _pool()
  key, keys = jax.random.key(0), _keys()
  idx = _as_indices(_counts())
  eps_ok = math.sqrt(OBJECTIVE_MIN_N_EPS_SQUARED / N) * 1.01
  assert not _warned(ci.confidence_intervals, key, x, y, epsilon=eps_ok, l2_reg=0.05)
  assert _warned(ci.confidence_intervals, key, x, y, epsilon=eps_ok * 0.98, l2_reg=0.05)
  # n is the replicate's: SIZE < N rows of indices at the epsilon that suffices for N.
  assert _warned(ci.confidence_intervals_batched, keys, x, y, indices=idx, epsilon=eps_ok,
                 l2_reg=0.05)
  # zCDP: eps = sqrt(2 rho), so N eps^2 = 2 rho N: 9,000 at rho = 15, 10,800 at rho = 18.
  assert _warned(ci.confidence_intervals, key, x, y, rho=15.0, l2_reg=0.05)
  assert not _warned(ci.confidence_intervals, key, x, y, rho=18.0, l2_reg=0.05)
  assert not _warned(ci.confidence_intervals, key, x, y, epsilon=math.inf)
  assert not _warned(ci.confidence_intervals_batched, keys, x, y, epsilon=0.5,
                     perturbation="output", l2_reg=0.05)
  assert _warned(ci.confidence_intervals_batched, keys, x, y, epsilon=0.5,
                 perturbation="output", loss="huber", l2_reg=0.05)
  # A real accountant and budget are untouched when the warning is an error.
  acc, budget = PrivacyAccountant(), PrivacyBudget(epsilon=10.0)
  with warnings.catch_warnings():
    warnings.simplefilter("error", CoverageWarning)
    for a in (acc, budget):
      with pytest.raises(CoverageWarning, match="n \\* eps\\^2"):
        ci.confidence_intervals(key, x, y, epsilon=1.0, l2_reg=0.05, accountant=a)
  assert acc.ledger == () and budget.spent_epsilon == 0.0
  # Once per call: M replicates, one warning.
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with pytest.raises(BudgetExceededError):
      ci.confidence_intervals_batched(keys, x, y, epsilon=1.0, l2_reg=0.05,
                                      accountant=PrivacyBudget(epsilon=1.0))
  assert sum(issubclass(w.category, CoverageWarning) for w in caught) == 1


def test_default_floor_is_the_papers():
  cal = ci.calibrate(num_examples=1000, dim=2, epsilon=1.0)
  assert cal.covariance_floor == cal.hessian_floor == cal.l2_reg
  assert ci.calibrate(num_examples=1000, dim=2, epsilon=1.0, floor="psd").covariance_floor == 0.0


@pytest.mark.parametrize("pert", ["objective", "output"])
def test_default_tol_is_certifiable_at_large_n(pert):
  # Paper 003 Table 3's KDD Cup 99 row: n = 450,000, d = 10 (+ constant). The default
  # tolerance is never below the float64 certification floor, which grows like sqrt(n).
  for kw in (dict(epsilon=1.0), dict(rho=0.5), dict(epsilon=math.inf)):
    cal = ci.calibrate(num_examples=450_000, dim=11, perturbation=pert, **kw)
    assert cal.tol >= certified_solve.tol_floor(450_000, 11, loss="logistic")
