"""Exponential mechanism: Gumbel-max sampling law and the exact privacy loss.

The privacy part computes, in float64, the exact output distributions of the
mechanism on neighbouring vote histograms (one vote moved between two classes,
as in subsample-and-aggregate, paper 000 Algorithm 8) and checks the claims of
the docstring: the worst log-ratio exceeds beta (so paper 000's Theorem 7 proof,
which drops the normaliser, understates the loss) and never exceeds 2 beta; the
log-ratios span at most 2 beta (bounded range); Renyi divergences are at most
alpha beta^2 / 2 (zCDP).
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special
from scipy import stats

from jaxdp import mechanisms as mech
from jaxdp.accounting import events

P_FLOOR = 1e-4


def _chisquare_pvalue(samples: np.ndarray, probs: np.ndarray) -> float:
  counts = np.bincount(samples, minlength=probs.size)
  return float(stats.chisquare(counts, probs * samples.size).pvalue)


def _exact_probs(scores, beta):
  z = beta * np.asarray(scores, np.float64)
  return np.exp(z - special.logsumexp(z))


# ------------------------------------------------------------------ sampling law

SCORES = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
BETA = 0.7
N = 100_000


@pytest.fixture(scope="module")
def samples():
  batch = jnp.broadcast_to(jnp.asarray(SCORES, jnp.float32), (N, SCORES.size))
  out = jax.jit(mech.exponential_mechanism)(jax.random.key(0), batch, BETA)
  assert out.shape == (N,) and out.dtype == jnp.int32
  return np.asarray(out)


def test_gumbel_max_matches_target_distribution(samples):
  probs = _exact_probs(SCORES, BETA)
  assert _chisquare_pvalue(samples, probs) > P_FLOOR
  np.testing.assert_allclose(np.asarray(mech.exponential_mechanism_probs(SCORES, BETA)), probs, rtol=1e-5)


@pytest.mark.parametrize("wrong_beta", [BETA / 2, 0.95 * BETA])
def test_chisquare_rejects_a_wrong_distribution(samples, wrong_beta):
  assert _chisquare_pvalue(samples, _exact_probs(SCORES, wrong_beta)) < P_FLOOR


def test_batched_rows_are_independent_draws_from_their_own_law():
  rows = np.array([[0.0, 1.0, 2.0], [2.0, 0.0, -1.0]])
  n = 50_000
  scores = jnp.broadcast_to(jnp.asarray(rows, jnp.float32), (n, 2, 3))
  out = np.asarray(mech.exponential_mechanism(jax.random.key(1), scores, 1.0))
  assert out.shape == (n, 2)
  for r in range(2):
    assert _chisquare_pvalue(out[:, r], _exact_probs(rows[r], 1.0)) > P_FLOOR
  # the two slots are independent: the joint law is the product law
  joint = out[:, 0] * 3 + out[:, 1]
  prod = np.outer(_exact_probs(rows[0], 1.0), _exact_probs(rows[1], 1.0)).ravel()
  assert _chisquare_pvalue(joint, prod) > P_FLOOR


def test_minus_infinity_scores_are_never_chosen():
  scores = jnp.broadcast_to(jnp.array([-jnp.inf, 0.0, -jnp.inf, 0.0]), (10_000, 4))
  out = np.asarray(mech.exponential_mechanism(jax.random.key(2), scores, 1.0))
  assert set(np.unique(out)) == {1, 3}


def test_vmap_over_beta_and_keys_equals_loop_and_jit():
  scores = jnp.array([[0.0, 2.0, 1.0], [1.0, 1.0, 0.0]])
  key = jax.random.key(3)
  betas = jnp.array([0.1, 1.0, 5.0])
  batched = np.asarray(jax.jit(jax.vmap(lambda b: mech.exponential_mechanism(key, scores, b)))(betas))
  looped = np.stack([np.asarray(mech.exponential_mechanism(key, scores, float(b))) for b in betas])
  np.testing.assert_array_equal(batched, looped)
  keys = jax.random.split(key, 6)
  f = lambda k: mech.exponential_mechanism(k, scores, 1.0)
  np.testing.assert_array_equal(
      np.asarray(jax.jit(jax.vmap(f))(keys)), np.stack([np.asarray(f(k)) for k in keys]))
  np.testing.assert_array_equal(np.asarray(jax.jit(f)(keys[0])), np.asarray(f(keys[0])))
  # per-row beta broadcasting over the batch shape
  per_row = np.asarray(mech.exponential_mechanism(key, scores, jnp.array([1.0, 1.0])))
  np.testing.assert_array_equal(per_row, np.asarray(f(key)))


def test_same_key_same_draw_different_keys_differ():
  scores = jnp.zeros((1000, 10))
  a = np.asarray(mech.exponential_mechanism(jax.random.key(4), scores, 1.0))
  b = np.asarray(mech.exponential_mechanism(jax.random.key(4), scores, 1.0))
  c = np.asarray(mech.exponential_mechanism(jax.random.key(5), scores, 1.0))
  np.testing.assert_array_equal(a, b)
  assert np.mean(a != c) > 0.5


# ------------------------------------------------------------------ exact privacy loss


def _log_probs(hist, beta):
  z = beta * np.asarray(hist, np.float64)
  return z - special.logsumexp(z)


def _vote_moves(teachers, classes):
  """All (histogram, neighbour) pairs where one teacher moves its vote a -> b."""
  for hist in itertools.product(range(teachers + 1), repeat=classes):
    if sum(hist) != teachers:
      continue
    for a in range(classes):
      if hist[a] == 0:
        continue
      for b in range(classes):
        if b != a:
          nb = list(hist)
          nb[a] -= 1
          nb[b] += 1
          yield np.array(hist), np.array(nb)


@pytest.mark.parametrize("beta", [0.01, 0.5, 2.0])
def test_balanced_votes_already_lose_more_than_beta(beta):
  """[T/2, T/2] vs. [T/2+1, T/2-1]: p(class 1) goes from 1/2 to 1/(1+e^{2 beta}).

  Exact loss 2 beta - log 2 + log(1 + e^{-2 beta}) = beta + beta^2/2 + O(beta^4):
  above beta (paper 000 Thm 7's claim), below 2 beta.
  """
  t = 100
  lr = _log_probs([t // 2, t // 2], beta) - _log_probs([t // 2 + 1, t // 2 - 1], beta)
  loss = np.max(np.abs(lr))
  assert loss == pytest.approx(2 * beta - math.log(2) + math.log1p(math.exp(-2 * beta)), rel=1e-9)
  assert beta < loss <= 2 * beta


@pytest.mark.parametrize("beta", [0.1, 1.0, 3.0])
def test_vote_moved_to_the_dominant_class_costs_nearly_two_beta(beta):
  """Scores [1, T-1] -> [0, T]: p(class 0) falls by a factor tending to exp(2 beta)."""
  t = 200
  lr = _log_probs([1, t - 1], beta)[0] - _log_probs([0, t], beta)[0]
  assert beta < lr <= 2 * beta
  assert lr == pytest.approx(2 * beta, rel=1e-6)


@pytest.mark.parametrize("beta", [0.25, 1.0])
def test_exhaustive_small_ensemble_dp_bounded_range_and_zcdp(beta):
  worst = 0.0
  worst_range = 0.0
  orders = [1.5, 2.0, 4.0, 16.0, 64.0]
  worst_renyi = {a: 0.0 for a in orders}
  worst_kl = 0.0
  for hist, nb in _vote_moves(teachers=8, classes=3):
    lp, lq = _log_probs(hist, beta), _log_probs(nb, beta)
    lr = lp - lq
    worst = max(worst, np.max(np.abs(lr)))
    worst_range = max(worst_range, np.max(lr) - np.min(lr))
    worst_kl = max(worst_kl, float(np.sum(np.exp(lp) * lr)))
    for a in orders:
      d = special.logsumexp(a * lp + (1 - a) * lq) / (a - 1)
      worst_renyi[a] = max(worst_renyi[a], d)
  eps_naive = beta  # paper 000 Theorem 7's claim
  assert worst > 1.5 * eps_naive, "the normaliser must raise the loss above beta"
  assert worst <= mech.exponential_mechanism_epsilon(beta) + 1e-12  # 2 beta
  assert worst_range <= 2 * beta + 1e-12  # 2 beta-bounded range
  rho = mech.exponential_mechanism_zcdp_rho(beta)
  assert rho == pytest.approx(beta**2 / 2)
  assert worst_kl <= rho + 1e-12
  for a in orders:
    assert worst_renyi[a] <= a * rho + 1e-12, (a, worst_renyi[a], a * rho)


def test_helpers_and_event():
  assert mech.exponential_mechanism_epsilon(0.3, 2.0) == pytest.approx(1.2)
  assert mech.exponential_mechanism_beta(1.2, 2.0) == pytest.approx(0.3)
  ev = mech.exponential_mechanism_event(0.3, 2.0)
  assert isinstance(ev, events.ExponentialMechanismDpEvent)
  assert ev.epsilon == pytest.approx(1.2) and ev.rho == pytest.approx(0.18)


def test_monotone_neighbours_lose_at_most_beta():
  """Adding one vote (all scores move the same way) costs only beta (Dwork & Roth Sec. 3.4)."""
  beta = 1.0
  worst = 0.0
  for t in range(8):
    for hist in itertools.product(range(t + 1), repeat=3):
      if sum(hist) != t:
        continue
      for b in range(3):
        nb = np.array(hist)
        nb[b] += 1
        worst = max(worst, np.max(np.abs(_log_probs(hist, beta) - _log_probs(nb, beta))))
  assert 0.9 * beta < worst <= beta + 1e-12
