"""Tests of the one-run audit statistics (jaxdp.audit.one_run)."""

import math

import numpy as np
import pytest
from scipy import stats

from jaxdp.audit import one_run


def _ref_p_value(m, r, v, eps, delta):
  """The authors' p-value, written as a plain loop (Steinke et al. 2023, main theorem)."""
  q = 1.0 / (1.0 + math.exp(-eps))
  tail = stats.binom.sf(v - 1, r, q)
  alpha, acc = 0.0, 0.0
  for i in range(1, v + 1):
    acc += stats.binom.pmf(v - i, r, q)
    alpha = max(alpha, acc / i)
  return min(1.0, tail + 2 * m * delta * alpha)


@pytest.mark.parametrize("r", [2, 10, 100, 1000])
@pytest.mark.parametrize("beta", [0.05, 0.01])
def test_perfect_guesses_closed_form(r, beta):
  # P[all r correct] = p_eps^r = beta  =>  eps = log(p / (1 - p)), p = beta^(1/r).
  p = beta ** (1.0 / r)
  expected = max(0.0, math.log(p / (1 - p)))
  got = one_run.steinke_epsilon_lower_bound(5000, r, r, delta=0.0, significance=beta)
  assert abs(got - expected) <= 1e-9


def test_perfect_guesses_through_one_run_audit():
  m = 200
  included = np.arange(m) % 2 == 0
  scores = included.astype(float) + 1e-3 * np.arange(m)
  res = one_run.one_run_audit(scores, included, k_plus=50, k_minus=50, confidence=0.95)
  p = 0.05 ** (1 / 100)
  assert res.num_guesses == 100 and res.num_correct == 100 and res.num_hypotheses == 1
  assert abs(res.epsilon_lower_bound - math.log(p / (1 - p))) <= 1e-9
  assert res.method == "steinke2023" and res.confidence == 0.95


@pytest.mark.parametrize("m,r,v,eps,delta", [(1000, 100, 90, 1.0, 1e-5), (1000, 300, 250, 2.0, 1e-6),
                                            (500, 50, 30, 0.3, 0.0), (100, 100, 100, 4.0, 1e-3)])
def test_p_value_matches_reference_loop(m, r, v, eps, delta):
  assert one_run.steinke_p_value(m, r, v, eps, delta) == pytest.approx(
      _ref_p_value(m, r, v, eps, delta), rel=1e-10, abs=1e-15)


def test_bound_is_root_of_p_value():
  m, r, v, delta, beta = 1000, 200, 170, 1e-5, 0.05
  eps = one_run.steinke_epsilon_lower_bound(m, r, v, delta=delta, significance=beta)
  assert eps > 0
  assert _ref_p_value(m, r, v, eps - 1e-6, delta) < beta < _ref_p_value(m, r, v, eps + 1e-6, delta)


def test_monotone_in_correct_and_guesses():
  m = 1000
  by_v = [one_run.steinke_epsilon_lower_bound(m, 200, v, delta=1e-5) for v in range(120, 201, 10)]
  assert all(b2 >= b1 for b1, b2 in zip(by_v, by_v[1:])) and by_v[-1] > by_v[0]
  by_r = [one_run.steinke_epsilon_lower_bound(m, r, r, delta=1e-5) for r in (10, 50, 100, 500)]
  assert all(b2 > b1 for b1, b2 in zip(by_r, by_r[1:]))
  fd_v = [one_run.fdp_epsilon_lower_bound(m, 200, v, delta=1e-5)[0] for v in (140, 170, 200)]
  assert fd_v[0] <= fd_v[1] <= fd_v[2] and fd_v[2] > fd_v[0]


@pytest.mark.parametrize("m,r,v", [(1000, 100, 100), (1000, 200, 190), (1000, 500, 450),
                                   (10000, 1000, 900), (1000, 1000, 1000)])
def test_fdp_tighter_than_steinke_at_positive_delta(m, r, v):
  # Mahloujifar et al. 2024: the f-DP analysis of the same guesses gives a higher bound (delta > 0).
  st = one_run.steinke_epsilon_lower_bound(m, r, v, delta=1e-5)
  fd, mu = one_run.fdp_epsilon_lower_bound(m, r, v, delta=1e-5)
  assert fd > st > 0 and mu > 0


def test_fdp_rejection_monotone_in_mu_and_consistent_with_bound():
  m, r, v = 1000, 200, 180
  _, mu = one_run.fdp_epsilon_lower_bound(m, r, v, delta=1e-5)
  assert one_run.fdp_rejects(m, r, v, mu * 0.999)
  assert not one_run.fdp_rejects(m, r, v, mu * 1.01)
  assert not one_run.fdp_rejects(m, r, r // 2, 0.01)


def test_gdp_epsilon_matches_duality():
  from scipy.stats import norm
  for mu in (0.5, 1.0, 2.0):
    eps = one_run.gdp_epsilon(mu, 1e-5)
    delta = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    assert delta == pytest.approx(1e-5, rel=1e-6)
  assert one_run.gdp_epsilon(0.0, 1e-5) == 0.0


def test_search_uses_bonferroni_and_reports_it():
  rng = np.random.default_rng(0)
  included = rng.random(400) < 0.5
  scores = included + rng.normal(0, 0.5, 400)
  one = one_run.one_run_audit(scores, included, k_plus=50, k_minus=50)
  grid = one_run.one_run_audit(scores, included)
  assert grid.num_hypotheses == len(one_run.default_k_grid(400)) > 1
  assert grid.confidence == 0.95
  # The grid's (50, 50)-like choice is tested at level 0.05 / K: never above the single test.
  again = one_run.one_run_audit(scores, included, k_plus=[grid.k_plus], k_minus=[grid.k_minus])
  assert grid.epsilon_lower_bound <= again.epsilon_lower_bound + 1e-12
  assert one.num_hypotheses == 1


def test_guess_counts():
  scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
  included = np.array([1, 0, 1, 0, 0, 1], bool)
  np.testing.assert_array_equal(one_run.guess_counts(scores, included, [(1, 0), (2, 2), (0, 3)]),
                                [1, 1 + 1, 2])


@pytest.mark.parametrize("kwargs,match", [
    (dict(scores=[1.0, np.nan], included=[1, 0]), "scores"),
    (dict(scores=[1.0, 2.0], included=[1, 0, 1]), "included"),
    (dict(scores=[1.0, 2.0], included=[2, 0]), "included"),
    (dict(scores=[1.0, 2.0], included=[1, 0], k_plus=2, k_minus=1), "k_plus"),
    (dict(scores=[1.0, 2.0], included=[1, 0], k_plus=1), "k_minus"),
    (dict(scores=[1.0, 2.0], included=[1, 0], confidence=1.0), "confidence"),
    (dict(scores=[1.0, 2.0], included=[1, 0], method="fdp", delta=0.0), "delta"),
    (dict(scores=[1.0, 2.0], included=[1, 0], method="nope"), "method"),
])
def test_bad_input_raises_named_error(kwargs, match):
  with pytest.raises(ValueError, match=match):
    one_run.one_run_audit(**kwargs)


def test_count_checks():
  with pytest.raises(ValueError, match="num_correct"):
    one_run.steinke_p_value(10, 5, 6, 1.0)
  with pytest.raises(ValueError, match="significance"):
    one_run.steinke_epsilon_lower_bound(10, 5, 5, significance=0.0)


def _gaussian_trials(rng, trials, m, mu):
  included = rng.random((trials, m)) < 0.5
  scores = mu * included + rng.normal(size=(trials, m))   # each canary: a mu-GDP mechanism
  return scores, included


def _coverage(trials, m, mu, delta=1e-5, k=(25, 25)):
  rng = np.random.default_rng(1234)
  true_eps = one_run.gdp_epsilon(mu, delta)
  scores, included = _gaussian_trials(rng, trials, m, mu)
  over_st = over_fd = 0
  for s, inc in zip(scores, included):
    st = one_run.one_run_audit(s, inc, delta=delta, k_plus=k[0], k_minus=k[1])
    fd = one_run.one_run_audit(s, inc, delta=delta, k_plus=k[0], k_minus=k[1], method="fdp")
    over_st += st.epsilon_lower_bound > true_eps
    over_fd += fd.mu_lower_bound > mu
  return over_st / trials, over_fd / trials


def test_no_signal_gives_zero_bound_small():
  rng = np.random.default_rng(7)
  bounds = [one_run.one_run_audit(rng.normal(size=200), rng.random(200) < 0.5, delta=1e-5,
                                  method=meth).epsilon_lower_bound
            for _ in range(8) for meth in ("steinke", "fdp")]
  assert np.mean(np.asarray(bounds) == 0.0) >= 0.9


def test_coverage_gaussian_mechanism_small():
  # mu = 3 per canary: strong signal, the bounds are well above zero but must not exceed the truth.
  st, fd = _coverage(trials=20, m=100, mu=3.0)
  assert st <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 20)
  assert fd <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 20)


@pytest.mark.slow
def test_coverage_gaussian_mechanism_slow():
  for mu in (1.0, 2.0, 4.0):
    st, fd = _coverage(trials=400, m=200, mu=mu, k=(40, 40))
    se = math.sqrt(0.05 * 0.95 / 400)
    assert st <= 0.05 + 3 * se and fd <= 0.05 + 3 * se


@pytest.mark.slow
def test_no_signal_coverage_slow():
  rng = np.random.default_rng(11)
  over = 0
  n = 400
  for _ in range(n):
    res = one_run.one_run_audit(rng.normal(size=1000), rng.random(1000) < 0.5, delta=1e-5,
                                method="fdp")
    over += res.epsilon_lower_bound > 0
  assert over / n <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / n)
