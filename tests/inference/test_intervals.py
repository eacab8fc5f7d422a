"""Tests of the private confidence intervals (jaxdp/inference/intervals.py; paper 003 Alg. 3/5)."""

import math

import jax
import numpy as np
import pytest
from scipy import stats

from _spend_probe import charged
from jaxdp.accounting import PrivacyAccountant, PrivacyBudget, events
from jaxdp.errors import BudgetExceededError
from jaxdp.inference import intervals as ci
from jaxdp.inference import sensitivities as sens
from jaxdp.training import certified_solve

# The coverage warning has its own tests (test_interval_replicates.py); here it is noise.
pytestmark = pytest.mark.filterwarnings("ignore::jaxdp.inference.CoverageWarning")


def _logistic_pool(seed=0, n=1500, d=3):
  """Simulated logistic data with an intercept, rows in the unit ball."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)) / math.sqrt(d)
  x[:, -1] = 0.5
  x = x / np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
  theta = np.array([1.5, -2.0, 0.8])[:d]
  y = np.where(rng.random(n) < 1 / (1 + np.exp(-x @ theta)), 1, 0)
  return x, y


def _exact_fit(x, y, lam, loss="logistic", counts=None):
  import scipy.optimize
  ys = sens.as_signed_labels(y)
  w = np.ones(len(y)) if counts is None else counts
  rows = np.repeat(np.arange(len(y)), w.astype(int))
  fun = lambda t: certified_solve.objective_and_grad(t, x[rows], ys[rows], loss=loss, h=0.5,
                                                     l2_total=lam)
  return scipy.optimize.minimize(fun, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B",
                                 options=dict(gtol=1e-12, ftol=0, maxiter=1000)).x


def _sandwich(x, y, theta, lam, alpha=0.05, loss="logistic"):
  ys = sens.as_signed_labels(y)
  n = len(y)
  z = ys * (x @ theta)
  if loss == "logistic":
    d1, d2 = -1 / (1 + np.exp(z)), 1 / (1 + np.exp(z)) / (1 + np.exp(-z))
  else:
    raise NotImplementedError
  hess = (x * d2[:, None]).T @ x / n + lam * np.eye(x.shape[1])
  cov = (x * (d1 * d1)[:, None]).T @ x / n - lam ** 2 * np.outer(theta, theta)
  hinv = np.linalg.inv(hess)
  se = np.sqrt(np.diag(hinv @ cov @ hinv) / n)
  q = stats.norm.ppf(1 - alpha / 2)
  return theta - q * se, theta + q * se


def _phi(priv, total):
  """The privacy argument of the notion ``priv``: ``epsilon=`` (pure) or ``rho=`` (zCDP)."""
  return {"epsilon" if priv == "pure" else "rho": total}


def test_budget_split_table2_and_overrides():
  for (pert, priv), fr in ci.TABLE2_FRACTIONS.items():
    s = ci.budget_split(**_phi(priv, 2.0), perturbation=pert)
    assert sum(s) == pytest.approx(2.0, rel=1e-12)
    assert s.theta == pytest.approx(2.0 * fr[0])
  assert ci.budget_split(epsilon=1.0, perturbation="objective") == pytest.approx(
      (0.65, 0.175, 0.175))
  # The notion follows from the argument: rho picks Table 2's zCDP row.
  assert ci.budget_split(rho=1.0, perturbation="objective") == pytest.approx((0.9, 0.05, 0.05))
  assert ci.budget_split(rho=1.0, perturbation="output",
                         fractions=(0.5, 0.25, 0.25)) == pytest.approx((0.5, 0.25, 0.25))
  for bad in ((0.5, 0.5, 0.5), (1.0, 0.0, 0.0), (0.5, 0.5), (0.5, -0.1, 0.6)):
    with pytest.raises(ValueError, match="fractions"):
      ci.budget_split(rho=1.0, perturbation="output", fractions=bad)
  with pytest.raises(ValueError, match="rho"):
    ci.budget_split(rho=0.0, perturbation="output")
  with pytest.raises(ValueError, match="epsilon"):
    ci.budget_split(epsilon=-1.0, perturbation="output")
  for kw in (dict(epsilon=1.0, rho=0.5), {}):
    with pytest.raises(ValueError, match="epsilon.*rho"):
      ci.budget_split(**kw, perturbation="output")
  with pytest.raises(TypeError):  # keyword-only
    ci.budget_split(1.0, perturbation="output")  # pylint: disable=too-many-function-args


# Objective perturbation always on (Theorems 2 and 4's pure sum; Theorem 2's zCDP branch);
# output perturbation under ``slow``.
@pytest.mark.parametrize("pert", ["objective", pytest.param("output", marks=pytest.mark.slow)])
def test_events_follow_theorems_2_and_4(pert):
  """``epsilon=e`` (pure DP) and ``rho=e^2/2`` (zCDP, Prop. 1's conversion of the same e), same
  key: the notion follows from the argument and is recorded in ``Calibration.privacy``; each
  spends its theorem's event; the releases differ (Table 2 row and noise laws)."""
  x, y = _logistic_pool()
  e = 1.0
  runs = {}
  for priv, total in (("pure", e), ("zcdp", e ** 2 / 2)):
    acc = PrivacyAccountant()
    # Exact quantiles (num_samples unused): the default num_samples, a static argument of the
    # jitted pipeline, so the pure run shares its compilation with the tests below.
    out, cal = ci.confidence_intervals(jax.random.key(0), x, y, **_phi(priv, total),
                                       perturbation=pert, accountant=acc)
    assert cal.privacy == priv
    assert cal.split == pytest.approx(ci.budget_split(**_phi(priv, total), perturbation=pert))
    assert acc.neighbouring == "replace_one"
    assert np.all(out.lower < out.upper) and np.all(np.isfinite(out.lower))
    s = cal.split
    if priv == "pure":  # Theorems 2 and 4: phi_1 + phi_2 + phi_3
      assert acc.pure_epsilon() == pytest.approx(total, rel=1e-9)
    elif pert == "output":  # Theorem 4 (zCDP)
      assert acc.zcdp_rho() == pytest.approx(total, rel=1e-9)
    else:  # Theorem 2: phi_1^2/2 + phi_2 + phi_3 with eps_1 = sqrt(2 rho_1); AMP splits eps_1
      assert acc.zcdp_rho() <= total * (1 + 1e-12)
      assert acc.zcdp_rho() >= s.hessian + s.covariance + 0.97 * s.theta
    runs[priv] = out
  pure, zcdp = runs["pure"], runs["zcdp"]
  assert not np.allclose(pure.lower, zcdp.lower) and not np.allclose(pure.upper, zcdp.upper)


@pytest.mark.parametrize("kw,match", [
    (dict(epsilon=1.0, rho=0.5), "epsilon.*rho"), ({}, "epsilon.*rho"),
    (dict(epsilon=0.0), "epsilon"), (dict(epsilon=-1.0), "epsilon"),
    (dict(rho=0.0), "rho"), (dict(rho=-0.5), "rho")])
def test_privacy_argument_checked_before_any_work_or_spend(kw, match):
  """Both, neither, or a non-positive ``epsilon``/``rho``: a ValueError naming them, before the
  data are read (``x`` here is not even an array) and before the accountant is charged."""
  acc = PrivacyAccountant()
  keys = jax.random.split(jax.random.key(0), 2)
  for fn, key in ((ci.confidence_intervals, keys[0]), (ci.confidence_intervals_batched, keys)):
    with pytest.raises(ValueError, match=match):
      fn(key, "not data", None, accountant=acc, **kw)
    assert acc.ledger == ()
  with pytest.raises(ValueError, match=match):
    ci.calibrate(num_examples=10, dim=2, **kw)


def test_privacy_and_budget_keywords_are_refused_before_any_spend():
  """The notion comes from ``epsilon=``/``rho=`` alone: ``privacy=`` and ``budget=`` are not
  arguments (a TypeError naming them, before any work or spend), in the batched call too."""
  x, y = _logistic_pool(n=50)
  acc = PrivacyAccountant()
  keys = jax.random.split(jax.random.key(0), 2)
  for bad in (dict(epsilon=1.0, privacy="zcdp"), dict(budget=1.0)):
    with pytest.raises(TypeError, match="privacy|budget"):
      ci.confidence_intervals(keys[0], x, y, accountant=acc, **bad)
    with pytest.raises(TypeError, match="privacy|budget"):
      ci.confidence_intervals_batched(keys, x, y, accountant=acc, **bad)
  assert acc.ledger == ()


def test_noise_off_output_zcdp_is_exactly_the_sandwich_interval():
  x, y = _logistic_pool()
  lam = 0.002
  out, _ = ci.confidence_intervals(jax.random.key(1), x, y, rho=math.inf,
                                   perturbation="output", l2_reg=lam)
  theta = _exact_fit(x, y, lam)
  np.testing.assert_allclose(out.theta, theta, atol=1e-6)
  lo, hi = _sandwich(x, y, theta, lam)
  np.testing.assert_allclose(out.lower, lo, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out.upper, hi, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pert", [
    pytest.param(p, marks=() if i == 0 else (pytest.mark.slow,))
    for i, p in enumerate(ci.PERTURBATIONS)])
def test_noise_off_exact_quantiles_are_the_sandwich_interval(pert):
  """Algorithms 3 and 5 without noise, exact quantiles: z sqrt((H^-1 Sigma H^-1)_jj / n).

  The first perturbation always on, the others under ``slow``.
  """
  x, y = _logistic_pool()
  lam = 0.002
  lo, hi = _sandwich(x, y, _exact_fit(x, y, lam), lam)
  se = (hi - lo) / (2 * stats.norm.ppf(0.975))
  out, _ = ci.confidence_intervals(jax.random.key(2), x, y, epsilon=math.inf,
                                   perturbation=pert, l2_reg=lam)
  # Minimisers agree to ~1e-9 (certified); the quantile is exact to float32's 1e-7.
  np.testing.assert_allclose(out.lower, lo, rtol=0, atol=1e-5 * se.min())
  np.testing.assert_allclose(out.upper, hi, rtol=0, atol=1e-5 * se.min())


# One configuration always on (the objective noise, the one a wrong Monte Carlo omits
# first); the other two under ``slow`` (each compiles both quantile paths).
@pytest.mark.parametrize("pert,priv", [("objective", "pure"),
                                       pytest.param("objective", "zcdp", marks=pytest.mark.slow),
                                       pytest.param("output", "pure", marks=pytest.mark.slow)])
def test_exact_and_monte_carlo_quantiles_agree_under_privacy(pert, priv):
  """Same key: same theta~, H~, Sigma~; the half-widths differ only by Monte Carlo error.

  At m = 100,000 the 2.5% quantile's relative sd is below 1% for these laws; allow 4%. A
  Monte Carlo half-width with a wrong noise (e.g. the objective noise omitted) is far off.
  """
  x, y = _logistic_pool()
  kw = dict(**_phi(priv, 1.0), perturbation=pert, l2_reg=0.01)
  ex, _ = ci.confidence_intervals(jax.random.key(6), x, y, **kw)
  mc, _ = ci.confidence_intervals(jax.random.key(6), x, y, quantiles="monte_carlo",
                                  num_samples=100_000, **kw)
  np.testing.assert_array_equal(ex.theta, mc.theta)
  np.testing.assert_allclose(mc.upper - mc.theta, ex.upper - ex.theta, rtol=0.04)
  np.testing.assert_allclose(mc.theta - mc.lower, ex.theta - ex.lower, rtol=0.04)


def test_noise_off_monte_carlo_matches_the_sandwich_interval():
  """Algorithm 3 without noise: MC quantiles of N(0, H^-1 Sigma H^-1 / n)."""
  x, y = _logistic_pool()
  lam = 0.002
  # m = 100,000: num_samples is a static argument of the jitted pipeline, so this run shares
  # its compilation with test_exact_and_monte_carlo_quantiles_agree_under_privacy's Monte
  # Carlo run (objective perturbation, pure DP, the same data shape).
  m = 100_000
  out, _ = ci.confidence_intervals(jax.random.key(2), x, y, epsilon=math.inf,
                                   perturbation="objective", l2_reg=lam,
                                   quantiles="monte_carlo", num_samples=m)
  lo, hi = _sandwich(x, y, _exact_fit(x, y, lam), lam)
  # The 2.5% quantile of m normal draws has sd sqrt(q(1-q)/m)/phi(z_q) sigma (0.060 sigma at
  # m = 2,000, 0.0085 sigma at m = 100,000); allow 5 sd.
  q = 0.025
  sd = math.sqrt(q * (1 - q) / m) / stats.norm.pdf(stats.norm.ppf(q))
  assert sd < 0.0085
  se = (hi - lo) / (2 * stats.norm.ppf(0.975))
  assert np.all(np.abs(out.lower - lo) < 5 * sd * se)
  assert np.all(np.abs(out.upper - hi) < 5 * sd * se)


def test_noise_off_coverage_is_nominal_on_simulated_logistic_data():
  """Bootstrap replicates of a pool with theta_0 its exact minimiser: coverage ~ 0.95.

  Tolerance: 4 binomial sds of a single coordinate's coverage over R replicates (the
  coordinate average is at least as precise); a wrong variance (e.g. dropping the
  sandwich or sqrt(n)) moves coverage far outside it.
  """
  x, y = _logistic_pool(seed=3)
  lam = 0.002
  theta0 = _exact_fit(x, y, lam)
  reps = 300
  counts = np.random.default_rng(4).multinomial(len(y), np.full(len(y), 1 / len(y)), size=reps)
  keys = jax.random.split(jax.random.key(5), reps)
  out, _ = ci.confidence_intervals_batched(keys, x, y, rho=math.inf, counts=counts,
                                           perturbation="output", l2_reg=lam,
                                           chunk_size=100)
  cover = np.mean((out.lower <= theta0) & (theta0 <= out.upper))
  assert abs(cover - 0.95) <= 4 * math.sqrt(0.95 * 0.05 / reps)


@pytest.mark.parametrize("mode", [
    pytest.param(m, marks=() if i == 0 else (pytest.mark.slow,))
    for i, m in enumerate(ci.BATCH_MODES)])
def test_private_intervals_are_longer_and_deterministic(mode):
  """The first batch mode always on, the others under ``slow`` (each compiles the batch).

  Objective perturbation, exact quantiles and the default ``num_samples`` (a static argument
  of the jitted pipeline): the single calls share their compilations with the tests above
  (``epsilon=2`` with ``test_events_follow_theorems_2_and_4``, ``epsilon=inf`` with
  ``test_noise_off_exact_quantiles_are_the_sandwich_interval``).
  """
  x, y = _logistic_pool()
  kw = dict(perturbation="objective")
  a, _ = ci.confidence_intervals(jax.random.key(3), x, y, epsilon=2.0, **kw)
  b, _ = ci.confidence_intervals(jax.random.key(3), x, y, epsilon=2.0, **kw)
  c, _ = ci.confidence_intervals(jax.random.key(3), x, y, epsilon=math.inf, **kw)
  np.testing.assert_array_equal(a.lower, b.lower)
  assert np.all(a.upper - a.lower > c.upper - c.lower)
  # Batched == single for the same key (one replicate, no counts). Three keys: one chunk of
  # three replicates on one core, the compiled batch of
  # test_batched_chunks_in_threads_are_bit_identical_to_sequential (chunk_size=3).
  keys = jax.random.split(jax.random.key(9), 3)
  one, _ = ci.confidence_intervals(keys[1], x, y, epsilon=2.0, **kw)
  # lax.map and jax.vmap over the replicates agree with the single call.
  bat, _ = ci.confidence_intervals_batched(keys, x, y, epsilon=2.0, batch_mode=mode, **kw)
  np.testing.assert_allclose(bat.lower[1], one.lower, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(bat.upper[1], one.upper, rtol=1e-5, atol=1e-7)


def test_batched_chunks_in_threads_are_bit_identical_to_sequential(monkeypatch):
  x, y = _logistic_pool()
  reps = 10
  counts = np.random.default_rng(8).multinomial(len(y), np.full(len(y), 1 / len(y)), size=reps)
  keys = jax.random.split(jax.random.key(10), reps)
  outs = []
  for workers in ("1", "2"):
    monkeypatch.setenv("JAXDP_CPU_WORKERS", workers)
    outs.append(ci.confidence_intervals_batched(keys, x, y, epsilon=1.0, counts=counts,
                                                chunk_size=3, l2_reg=0.01)[0])
  for a, b in zip(*outs):
    np.testing.assert_array_equal(a, b)
  # And each replicate is the single call on its key and counts. The two calls release
  # different certified minimisers (the batched one warm-starts Newton, so it stops at
  # another iterate): each is within tol/Lambda of the exact minimiser of the same
  # replicate (||grad J|| <= tol and J is Lambda-strongly convex), and the same key gives
  # the same noise, so ||theta~_batched - theta~_single|| <= 2 tol / Lambda =: delta (1.4e-5
  # here; a 1e-9 tolerance failed for about one key in five). The half-widths are smooth in
  # theta~: the data parts of H and Sigma move by at most max|f'''| delta <= delta/10 and
  # max|(f'^2)'| delta <= 0.3 delta (||x|| <= 1), Lemma 2's noise scale by a relative
  # 2 (1 - S) delta <= delta, the eigenvalue floor is 1-Lipschitz and H~ >= Lambda I, so
  # H~^-1 moves by a relative <= delta/(10 Lambda); to first order the half-width moves by
  # a relative <= delta/Lambda (Lambda = 0.01 <= 0.1). A wrong key or replicate moves both
  # by the scale of the privacy noise or of the bootstrap (> 1e-2 here), far outside.
  for i in (0, 4, 9):
    one, cal = ci.confidence_intervals(keys[i], x, y, epsilon=1.0, counts=counts[i],
                                       l2_reg=0.01)
    delta = 2 * cal.tol / cal.l2_reg
    np.testing.assert_allclose(outs[1].theta[i], one.theta, rtol=0, atol=delta + 1e-12)
    np.testing.assert_allclose(outs[1].upper[i] - outs[1].theta[i], one.upper - one.theta,
                               rtol=delta / cal.l2_reg, atol=1e-12)
    np.testing.assert_allclose(outs[1].theta[i] - outs[1].lower[i], one.theta - one.lower,
                               rtol=delta / cal.l2_reg, atol=1e-12)


@pytest.mark.parametrize("floor,expected", [(None, 0.002), ("paper", 0.002), ("psd", 0.0)])
def test_floors(floor, expected):
  """Algorithm 2's floor 2c = Lambda on both matrices by default; "psd" floors Sigma~ at 0."""
  x, y = _logistic_pool()
  kw = {} if floor is None else dict(floor=floor)
  # Exact quantiles, the default num_samples: the compiled pipeline of the tests above.
  out, cal = ci.confidence_intervals(jax.random.key(4), x, y, epsilon=1.0, **kw)
  assert cal.covariance_floor == expected and cal.hessian_floor == 0.002
  assert np.linalg.eigvalsh(out.covariance).min() >= expected - 1e-9
  assert np.linalg.eigvalsh(out.hessian).min() >= 0.002 - 1e-9


@pytest.mark.parametrize("loss", ["logistic", "huber"])
def test_released_minimiser_is_certified(loss):
  x, y = _logistic_pool()
  lam = 0.002
  out, cal = ci.confidence_intervals(jax.random.key(6), x, y, rho=math.inf, loss=loss,
                                     perturbation="output", l2_reg=lam)
  _, g = certified_solve.objective_and_grad(out.theta, x, sens.as_signed_labels(y), loss=loss,
                                            h=0.5, l2_total=lam)
  assert np.linalg.norm(g) <= cal.tol


def test_host_repair_certifies_a_bad_iterate():
  x, y = _logistic_pool()
  ys = sens.as_signed_labels(y)
  cal = ci.calibrate(num_examples=len(y), dim=3, epsilon=math.inf, perturbation="output")
  bad = np.array([0.3, 0.3, 0.3])
  fixed = ci._repair(bad, np.zeros(3), np.array(1.0), cal, x, ys, np.ones(len(y)))
  _, g = certified_solve.objective_and_grad(fixed, x, ys, loss="logistic", h=0.5,
                                            l2_total=cal.l2_reg)
  assert np.linalg.norm(g) <= cal.tol


def test_input_validation():
  x, y = _logistic_pool()
  k = jax.random.key(0)
  x, y = x[:200], y[:200]
  with pytest.raises(ValueError, match="x"):
    ci.confidence_intervals(k, 2 * x + 1, y, epsilon=1.0)
  with pytest.raises(ValueError, match="y"):
    ci.confidence_intervals(k, x, 2 * y, epsilon=1.0)
  x_nan = x.copy()
  x_nan[0, 0] = np.nan
  with pytest.raises(ValueError, match="x"):
    ci.confidence_intervals(k, x_nan, y, epsilon=1.0)
  with pytest.raises(ValueError, match="epsilon"):
    ci.confidence_intervals(k, x, y, epsilon=0.0)
  with pytest.raises(ValueError, match="l2_reg"):
    ci.confidence_intervals(k, x, y, epsilon=1.0, l2_reg=0.0)
  with pytest.raises(ValueError, match="l2_reg"):  # Algorithm 1 needs c > t/(2n(e^eps - 1))
    ci.confidence_intervals(k, x, y, epsilon=0.01, l2_reg=1e-5)
  with pytest.raises(ValueError, match="alpha"):
    ci.confidence_intervals(k, x, y, epsilon=1.0, alpha=1.5)
  with pytest.raises(ValueError, match="floor"):
    ci.confidence_intervals(k, x, y, epsilon=1.0, floor="none")
  with pytest.raises(ValueError, match="h"):
    ci.confidence_intervals(k, x, y, epsilon=1.0, loss="huber", h=0.0)
  with pytest.raises(ValueError, match="counts"):
    ci.confidence_intervals(k, x, y, epsilon=1.0, counts=-np.ones(200))
  with pytest.raises(TypeError):
    ci.confidence_intervals(0, x, y, epsilon=1.0)
  assert isinstance(ci.calibrate(num_examples=10, dim=2, epsilon=math.inf).event,
                    events.NonPrivateDpEvent)


def test_order_statistic_matches_sorting_for_several_ranks():
  rng = np.random.default_rng(3)
  samples = rng.standard_normal((1001, 4)).astype(np.float32)
  ks = np.array([1, 26, 500, 976, 1001])
  order_statistic = jax.jit(ci.order_statistic)  # one compiled program per rank shape
  got = np.asarray(order_statistic(jax.numpy.asarray(samples), jax.numpy.asarray(ks)))
  want = np.sort(samples, axis=0)[ks - 1]
  width = samples.max(0) - samples.min(0)
  assert got.shape == (5, 4)
  assert np.all(got >= want) and np.all(got - want <= width * 2.0 ** -40 + 1e-6)
  one = np.asarray(order_statistic(jax.numpy.asarray(samples), 26))
  np.testing.assert_array_equal(one, got[1])


def test_empty_or_misshapen_data_are_named_errors():
  k = jax.random.key(0)
  for x, y in [(np.zeros((0, 3)), np.zeros(0)), (np.zeros(0), np.zeros(0)),
               (np.zeros((3, 0)), np.zeros(3))]:
    with pytest.raises(ValueError, match="x must"):
      ci.confidence_intervals(k, x, y, epsilon=1.0)
  with pytest.raises(ValueError, match="y must"):
    ci.confidence_intervals(k, np.zeros((3, 2)), np.zeros(4), epsilon=1.0)
  with pytest.raises(ValueError, match="keys"):
    ci.confidence_intervals_batched(jax.random.split(k, 0), np.zeros((3, 2)), np.ones(3),
                                    epsilon=1.0)
  with pytest.raises(ValueError, match="counts"):
    ci.confidence_intervals(k, np.zeros((3, 2)), np.ones(3), epsilon=1.0,
                            counts=np.array([1.0, np.inf, 0.0]))


def test_bad_labels_are_named_by_row_not_value():
  x = np.full((4, 2), 0.5)
  with pytest.raises(ValueError, match=r"y\[2\]") as err:
    ci.confidence_intervals(jax.random.key(0), x, np.array([0, 1, 7.3141592653, 1]),
                            epsilon=1.0)
  assert "7.31" not in str(err.value)


def test_batched_call_without_counts_charges_one_event_per_key():
  """Issue 26 item 1: (1, N) unit weights were charged once for M keys."""
  x, y = _logistic_pool(n=50)
  keys = jax.random.split(jax.random.key(0), 8)
  budget = PrivacyBudget(epsilon=1.5)
  with pytest.raises(BudgetExceededError):  # 8 releases at eps = 1, refused before any work
    ci.confidence_intervals_batched(keys, x, y, epsilon=1.0, l2_reg=0.05, accountant=budget)
  assert budget.spent_epsilon == 0.0
  acc, count = charged(ci.confidence_intervals_batched, keys, x, y, epsilon=1.0, l2_reg=0.05)
  assert count == 8 and acc.pure_epsilon() == pytest.approx(8.0, rel=1e-12)


@pytest.mark.parametrize("pert,priv", [("objective", "pure"), ("output", "pure"),
                                       ("objective", "zcdp"), ("output", "zcdp")])
def test_counts_are_charged_by_group_privacy(pert, priv):
  """A row drawn k times is k records: k phi pure (Dwork-Roth Thm 2.2), k^2 rho zCDP
  (Bun-Steinke Prop. 27), at the largest multiplicity; M replicates are M such releases."""
  x, y = _logistic_pool(n=50)
  counts = np.ones((3, 50), np.int64)
  counts[0, :3], counts[0, 3:6] = 2, 0
  counts[1, 7], counts[1, 8:10] = 3, 0          # the largest multiplicity: k = 3
  k = 3
  total = 1.0 if priv == "pure" else 0.5
  kw = dict(**_phi(priv, total), perturbation=pert, l2_reg=0.05)
  one, _ = charged(ci.confidence_intervals, jax.random.key(0), x, y, counts=counts[1], **kw)
  many, count = charged(ci.confidence_intervals_batched, jax.random.split(jax.random.key(1), 3),
                         x, y, counts=counts, **kw)
  plain, _ = charged(ci.confidence_intervals, jax.random.key(0), x, y, **kw)
  assert count == 3
  if priv == "pure":
    assert one.pure_epsilon() == pytest.approx(k * total, rel=1e-9)
    assert many.pure_epsilon() == pytest.approx(3 * k * total, rel=1e-9)
  else:  # every leaf k^2-fold: the rho of the unweighted call, k^2 times
    assert one.zcdp_rho() == pytest.approx(k * k * plain.zcdp_rho(), rel=1e-9)
    assert many.zcdp_rho() == pytest.approx(3 * k * k * plain.zcdp_rho(), rel=1e-9)
  # Multiplicity 1 everywhere costs exactly the example-level event.
  same, _ = charged(ci.confidence_intervals, jax.random.key(0), x, y,
                     counts=np.ones(50, np.int64), **kw)
  assert same.ledger == plain.ledger
