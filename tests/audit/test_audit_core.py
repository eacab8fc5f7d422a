"""Tests of the audit core: Clopper-Pearson bounds, the epsilon bound, soundness, tightness."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sp_stats

from jaxdp import audit
from jaxdp import mechanisms
from jaxdp.accounting import analytic_gaussian


def _laplace_stats(rng, n, scale):
  return rng.laplace(0.0, scale, n), 1.0 + rng.laplace(0.0, scale, n)


# ------------------------------------------------------------------ statistics


def test_clopper_pearson_closed_forms():
  n, alpha = 50, 0.05
  # k = 0: upper bound solves (1 - p)^n = alpha; k = n: lower bound solves p^n = alpha.
  np.testing.assert_allclose(audit.clopper_pearson_upper(0, n, alpha), 1 - alpha ** (1 / n), rtol=1e-10)
  np.testing.assert_allclose(audit.clopper_pearson_lower(n, n, alpha), alpha ** (1 / n), rtol=1e-10)
  assert audit.clopper_pearson_upper(n, n, alpha) == 1.0
  assert audit.clopper_pearson_lower(0, n, alpha) == 0.0
  # The upper bound U(k) is the p at which P[Bin(n, p) <= k] = alpha.
  for k in (1, 7, 25, 49):
    u = float(audit.clopper_pearson_upper(k, n, alpha))
    assert sp_stats.binom.cdf(k, n, u) == pytest.approx(alpha, rel=1e-6)
    lo = float(audit.clopper_pearson_lower(k, n, alpha))
    assert sp_stats.binom.sf(k - 1, n, lo) == pytest.approx(alpha, rel=1e-6)
    assert lo < k / n < u


def test_epsilon_from_rates_formula():
  # Laplace(1) shift 1, threshold 1: FPR = e^-1 / 2, FNR = 1/2 -> ln((1 - 1/2) / (e^-1/2)) = 1.
  assert float(audit.epsilon_from_rates(0.5 / math.e, 0.5)) == pytest.approx(1.0, abs=1e-12)
  # Symmetric formula and delta: ln((1 - delta - FPR) / FNR).
  assert float(audit.epsilon_from_rates(0.2, 0.1, delta=0.1)) == pytest.approx(math.log(0.7 / 0.1))
  # A numerator <= 0 gives -inf on that side.
  assert float(audit.epsilon_from_rates(0.5, 1.0)) == pytest.approx(math.log(0.5))
  assert float(audit.epsilon_from_rates(1.0, 1.0)) == -math.inf


@pytest.mark.parametrize("thresholds", [None, np.linspace(-1.0, 3.0, 17)])
def test_lower_bound_is_sound_over_repetitions(thresholds):
  # Laplace(1) shifted by 1 is exactly 1-DP. A 95% lower bound may exceed 1 in
  # at most ~5% of independent audits; we allow 12/150 (P[Bin(150, .05) > 12] < 0.05).
  rng = np.random.default_rng(0)
  exceed = 0
  bounds = []
  for _ in range(150):
    s0, s1 = _laplace_stats(rng, 4000, 1.0)
    r = audit.epsilon_lower_bound(s0, s1, thresholds=thresholds, claimed_epsilon=1.0)
    bounds.append(r.epsilon_lower_bound)
    exceed += r.violates_claim
  assert exceed <= 12
  assert np.median(bounds) > 0.5  # and the audits are not vacuous


def test_split_and_grid_use_the_documented_levels():
  rng = np.random.default_rng(1)
  s0, s1 = _laplace_stats(rng, 10_000, 1.0)
  r = audit.epsilon_lower_bound(s0, s1, thresholds=[1.0], confidence=0.9)
  fp = np.sum(s0 > 1.0)
  fn = np.sum(s1 <= 1.0)
  # Grid of m = 1 threshold: each of the 4 one-sided intervals at alpha / 4.
  assert r.fpr_upper == pytest.approx(float(audit.clopper_pearson_upper(fp, 10_000, 0.1 / 4)))
  assert r.fnr_upper == pytest.approx(float(audit.clopper_pearson_upper(fn, 10_000, 0.1 / 4)))
  assert r.epsilon_lower_bound == pytest.approx(math.log((1 - r.fnr_upper) / r.fpr_upper))
  assert (r.method, r.direction, r.num_evaluation_trials) == ("grid", ">", 10_000)
  rs = audit.epsilon_lower_bound(s0, s1, confidence=0.9)
  assert rs.method == "split" and rs.num_evaluation_trials == 5_000
  # Split: the evaluation half alone gives the FPR/FNR, at alpha / 2 each.
  t = rs.threshold
  ev0, ev1 = s0[5_000:], s1[5_000:]
  fp = np.sum(ev0 > t) if rs.direction == ">" else np.sum(ev0 <= t)
  assert rs.fpr == pytest.approx(fp / 5_000)
  assert rs.fpr_upper == pytest.approx(float(audit.clopper_pearson_upper(fp, 5_000, 0.05)))


def test_bad_arguments_raise():
  s = np.zeros(10)
  with pytest.raises(ValueError, match="confidence"):
    audit.epsilon_lower_bound(s, s, confidence=1.0)
  with pytest.raises(ValueError, match="delta"):
    audit.epsilon_lower_bound(s, s, delta=1.0)
  with pytest.raises(ValueError, match="same number"):
    audit.epsilon_lower_bound(s, np.zeros(11))
  with pytest.raises(ValueError, match="NaN or inf"):
    audit.epsilon_lower_bound(s, np.full(10, np.nan))
  with pytest.raises(ValueError, match="selection_fraction"):
    audit.epsilon_lower_bound(s, s, selection_fraction=1.0)
  mech = lambda k, d: d + jax.random.laplace(k, ())
  with pytest.raises(ValueError, match="num_trials"):
    audit.audit_epsilon(mech, 0.0, 1.0, key=jax.random.key(0), num_trials=0, progress=False)
  with pytest.raises(ValueError, match="scalar"):
    audit.audit_epsilon(lambda k, d: d + jax.random.laplace(k, (2,)), 0.0, 1.0,
                        key=jax.random.key(0), num_trials=10, progress=False)
  with pytest.raises(ValueError, match="claimed_epsilon"):
    audit.audit_epsilon(mech, 0.0, 1.0, key=jax.random.key(0), num_trials=10,
                        claimed_epsilon=-1.0, progress=False)


def test_same_key_same_report_and_batching_is_invisible_to_the_bound_logic():
  mech = lambda k, d: mechanisms.laplace_mechanism(k, d, 1.0, 1.0)
  pair = audit.scalar_query_pair(1.0)
  kw = dict(key=jax.random.key(3), num_trials=3_000, claimed_epsilon=1.0, progress=False)
  a = audit.audit_epsilon(mech, pair.dataset, pair.neighbour, batch_size=1_000, **kw)
  b = audit.audit_epsilon(mech, pair.dataset, pair.neighbour, batch_size=1_000, **kw)
  assert a.epsilon_lower_bound == b.epsilon_lower_bound and a.threshold == b.threshold
  c = audit.audit_epsilon(mech, pair.dataset, pair.neighbour, batch_size=700, **kw)  # ragged last batch
  assert c.num_trials == 3_000 and 0.0 <= c.epsilon_lower_bound <= 1.0


def test_report_string():
  rng = np.random.default_rng(2)
  s0, s1 = _laplace_stats(rng, 2_000, 1.0)
  text = str(audit.epsilon_lower_bound(s0, s1, claimed_epsilon=1.0))
  for field in ("claimed epsilon", "epsilon lower bound", "trials per dataset", "FPR / FNR", "95%"):
    assert field in text
  d = audit.epsilon_lower_bound(s0, s1, claimed_epsilon=1.0).as_dict()
  assert d["num_trials"] == 2_000 and d["violates_claim"] is False and d["method"] == "split"


# ---------------------------------------------------- library mechanisms: tight


def _audit_laplace(num_trials, seed):
  pair = audit.scalar_query_pair(1.0)
  return audit.audit_epsilon(
      lambda k, d: mechanisms.laplace_mechanism(k, d, 1.0, 1.0), pair.dataset, pair.neighbour,
      key=jax.random.key(seed), num_trials=num_trials, batch_size=100_000, claimed_epsilon=1.0,
      progress=False)


def test_laplace_mechanism_audit_is_tight():
  r = _audit_laplace(200_000, 0)
  assert r.epsilon_lower_bound <= 1.0
  assert r.epsilon_lower_bound >= 0.85  # within 15% (the issue asks 30% at 10^6)


@pytest.mark.slow
def test_laplace_mechanism_audit_is_tight_1e6():
  r = _audit_laplace(1_000_000, 1)
  assert r.epsilon_lower_bound <= 1.0
  assert r.epsilon_lower_bound >= 0.9


def _audit_gaussian(num_trials, seed, delta):
  pair = audit.scalar_query_pair(1.0)
  return audit.audit_epsilon(
      lambda k, d: mechanisms.gaussian_mechanism(k, d, 1.0, 1.0, delta), pair.dataset,
      pair.neighbour, key=jax.random.key(seed), num_trials=num_trials, batch_size=100_000,
      claimed_epsilon=1.0, delta=delta, progress=False)


def test_gaussian_mechanism_audit_with_delta():
  r = _audit_gaussian(200_000, 0, 1e-2)
  assert r.delta == 1e-2
  assert 0.7 <= r.epsilon_lower_bound <= 1.0


@pytest.mark.slow
def test_gaussian_mechanism_audit_with_delta_1e6():
  r = _audit_gaussian(1_000_000, 1, 1e-2)
  assert 0.8 <= r.epsilon_lower_bound <= 1.0


def test_l2_laplace_mechanism_projection_and_likelihood_ratio():
  pair = audit.scalar_query_pair(1.0, dim=2)
  mech = lambda k, d: mechanisms.l2_laplace_mechanism(k, d, 1.0, 1.0)
  kw = dict(key=jax.random.key(0), num_trials=100_000, batch_size=50_000, claimed_epsilon=1.0,
            progress=False)
  # 1-D projection on the separating direction (not the optimal test in 2-D).
  proj = audit.audit_epsilon(mech, pair.dataset, pair.neighbour,
                             audit.projection_statistic(pair.neighbour - pair.dataset), **kw)
  assert 0.6 <= proj.epsilon_lower_bound <= 1.0
  # The likelihood ratio ||o - c0|| - ||o - c1|| is the optimal test and gets closer.
  lr = audit.audit_epsilon(mech, pair.dataset, pair.neighbour,
                           audit.l2_distance_statistic(pair.dataset, pair.neighbour), **kw)
  assert 0.8 <= lr.epsilon_lower_bound <= 1.0


def test_exponential_mechanism_audit_reaches_two_beta():
  beta, c = 0.5, 50
  pair = audit.exponential_mechanism_pair(c)
  claimed = mechanisms.exponential_mechanism_epsilon(beta)  # 2 beta Delta = 1
  r = audit.audit_epsilon(
      lambda k, s: mechanisms.exponential_mechanism(k, s, beta), pair.dataset, pair.neighbour,
      audit.indicator_statistic(0), key=jax.random.key(0), num_trials=100_000, batch_size=50_000,
      claimed_epsilon=claimed, progress=False)
  exact = audit.exponential_mechanism_log_ratio(c, beta)  # 0.97 for C = 50
  assert r.epsilon_lower_bound <= exact <= claimed
  assert r.epsilon_lower_bound >= 0.7
  # ... which refutes the naive claim "beta Delta"-DP (paper 000 Thm 7's proof drops Z).
  assert r.epsilon_lower_bound > beta


# ------------------------------------------------- miscalibration is caught


def test_laplace_with_halved_noise_is_caught():
  pair = audit.scalar_query_pair(1.0)
  # Claims epsilon = 1 but draws noise of scale 1/2 (i.e. calibrated to epsilon = 2).
  r = audit.audit_epsilon(
      lambda k, d: mechanisms.laplace_mechanism(k, d, 1.0, 2.0), pair.dataset, pair.neighbour,
      key=jax.random.key(4), num_trials=200_000, batch_size=100_000, claimed_epsilon=1.0,
      progress=False)
  assert r.violates_claim and r.epsilon_lower_bound > 1.5
  assert "VIOLATION" in str(r)


def test_gaussian_with_halved_noise_is_caught():
  pair = audit.scalar_query_pair(1.0)
  sigma = analytic_gaussian.analytic_gaussian_sigma(1.0, 1e-2, 1.0)
  r = audit.audit_epsilon(
      lambda k, d: d + mechanisms.gaussian_noise(k, (), sigma / 2.0), pair.dataset,
      pair.neighbour, key=jax.random.key(5), num_trials=200_000, batch_size=100_000,
      claimed_epsilon=1.0, delta=1e-2, progress=False)
  assert r.violates_claim


def test_grid_method_on_library_laplace():
  pair = audit.scalar_query_pair(1.0)
  r = audit.audit_epsilon(
      lambda k, d: mechanisms.laplace_mechanism(k, d, 1.0, 1.0), pair.dataset, pair.neighbour,
      key=jax.random.key(6), num_trials=100_000, batch_size=50_000, claimed_epsilon=1.0,
      thresholds=np.linspace(0.0, 3.0, 13), progress=False)
  assert r.method == "grid" and r.num_thresholds == 13
  assert 0.85 <= r.epsilon_lower_bound <= 1.0


def test_lower_bound_is_sound_for_discrete_outputs():
  # Randomized response: P[1 | D'] = e^eps / (1 + e^eps), P[1 | D] = 1 / (1 + e^eps),
  # exactly eps-DP. Binary statistics (all ties) must not break coverage.
  eps = 1.0
  p = 1.0 / (1.0 + np.exp(eps))
  rng = np.random.default_rng(3)
  bounds = []
  for _ in range(150):
    s0 = (rng.random(3000) < p).astype(float)
    s1 = (rng.random(3000) < 1 - p).astype(float)
    bounds.append(audit.epsilon_lower_bound(s0, s1).epsilon_lower_bound)
  bounds = np.asarray(bounds)
  assert np.sum(bounds > eps) <= 12
  assert np.median(bounds) > 0.8 * eps


def test_add_remove_neighbours_with_different_shapes():
  # Counting query under add/remove: D has 5 records, D' has 6 (Laplace, Delta_1 = 1).
  mech = lambda k, d: mechanisms.laplace_mechanism(k, jnp.sum(d), 1.0, 1.0)
  r = audit.audit_epsilon(mech, jnp.ones(5), jnp.ones(6), key=jax.random.key(7),
                          num_trials=100_000, batch_size=50_000, claimed_epsilon=1.0,
                          progress=False)
  assert 0.85 <= r.epsilon_lower_bound <= 1.0


def test_audit_detects_the_floating_point_leak_of_naive_laplace_noise():
  # Mironov (2012): with float32 arithmetic, o = 1 + b lies on a coarser grid
  # than o = b near 0, so exact cancellations in |o| - |o - 1| reveal which
  # dataset was used although the real-valued mechanism is 1-DP. A smooth
  # statistic (o itself) stays below the claim on the very same outputs.
  naive = lambda k, d: d + jax.random.laplace(k, (), jnp.float32)
  kw = dict(key=jax.random.key(8), num_trials=100_000, batch_size=50_000, claimed_epsilon=1.0,
            progress=False)
  smooth = audit.audit_epsilon(naive, jnp.float32(0.0), jnp.float32(1.0), **kw)
  assert smooth.epsilon_lower_bound <= 1.0
  bits = audit.audit_epsilon(naive, jnp.float32(0.0), jnp.float32(1.0),
                             lambda o: jnp.abs(o) - jnp.abs(o - 1.0), **kw)
  assert bits.violates_claim and bits.epsilon_lower_bound > 3.0


def test_histogram_epsilon_lower_bound_is_valid_and_detects_miscalibration():
  from jaxdp.audit import histogram_epsilon_lower_bound
  rng = np.random.default_rng(0)
  n = 200_000
  # Laplace(1) at 0 vs 1: exactly 1-DP; the bound must stay below 1 ...
  ok = histogram_epsilon_lower_bound(rng.laplace(0, 1, n), rng.laplace(1, 1, n), num_bins=20)
  assert 0.5 < ok <= 1.0
  # ... and half the noise (2-DP) must be detected above the 1-DP claim.
  bad = histogram_epsilon_lower_bound(rng.laplace(0, 0.5, n), rng.laplace(1, 0.5, n), num_bins=20)
  assert bad > 1.0
  with pytest.raises(ValueError):
    histogram_epsilon_lower_bound([0.0], [1.0], num_bins=1)
