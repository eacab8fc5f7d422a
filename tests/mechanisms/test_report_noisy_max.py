"""Report-noisy-max (LNMax, GNMax): output law, exact privacy loss, events."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate
from scipy import stats

from jaxdp import mechanisms as mech
from jaxdp.accounting import events

Z_TOL = 6.0


def laplace_difference_cdf(w: float, b: float) -> float:
  """P(Z1 - Z0 <= w) for i.i.d. Z ~ Lap(b): (1/4)(2 + |w|/b) e^{-|w|/b} for w <= 0."""
  a = abs(w) / b
  lower = 0.25 * (2.0 + a) * math.exp(-a)
  return lower if w <= 0 else 1.0 - lower


def log_laplace_difference_cdf(w: float, b: float) -> float:
  """log P(Z1 - Z0 <= w), accurate in both tails."""
  a = abs(w) / b
  log_lower = math.log(0.25 * (2.0 + a)) - a
  return log_lower if w <= 0 else math.log1p(-math.exp(log_lower))


def _two_class_p0_laplace(counts, b):
  # class 0 wins iff n0 + Z0 > n1 + Z1 iff Z1 - Z0 < n0 - n1
  return laplace_difference_cdf(counts[0] - counts[1], b)


def _assert_prob(hits, p):
  se = math.sqrt(p * (1 - p) / hits.size)
  assert abs(hits.mean() - p) < Z_TOL * se, (hits.mean(), p, se)


# ------------------------------------------------------------------ output law


def test_lnmax_two_class_law_matches_exact_formula():
  b, n = 2.0, 200_000
  counts = jnp.broadcast_to(jnp.array([3, 5]), (n, 2))
  out = np.asarray(jax.jit(mech.report_noisy_max_laplace)(jax.random.key(0), counts, b))
  assert out.shape == (n,) and out.dtype == np.int32
  p0 = _two_class_p0_laplace([3, 5], b)
  assert p0 == pytest.approx(0.75 * math.exp(-1))
  _assert_prob(out == 0, p0)
  # a wrong scale is detected at this sample size
  assert abs((out == 0).mean() - _two_class_p0_laplace([3, 5], 1.5 * b)) > Z_TOL * math.sqrt(p0 / n)


def test_gnmax_two_class_law_matches_exact_formula():
  sigma, n = 2.0, 200_000
  counts = jnp.broadcast_to(jnp.array([3.0, 5.0]), (n, 2))
  out = np.asarray(jax.jit(mech.report_noisy_max_gaussian)(jax.random.key(1), counts, sigma))
  p0 = stats.norm.cdf((3 - 5) / (sigma * math.sqrt(2)))
  _assert_prob(out == 0, p0)


def test_noisy_max_many_classes_chisquare():
  # With one dominant class and small noise the argmax is almost always that class;
  # with huge noise the output is close to uniform. Check the exact uniform limit:
  # equal counts give a uniform law by symmetry.
  n, c = 60_000, 6
  counts = jnp.full((n, c), 7)
  for f, s in ((mech.report_noisy_max_laplace, 1.0), (mech.report_noisy_max_gaussian, 1.0)):
    out = np.asarray(f(jax.random.key(2), counts, s))
    assert stats.chisquare(np.bincount(out, minlength=c)).pvalue > 1e-4


# ------------------------------------------------------------------ exact privacy loss


@pytest.mark.parametrize("b", [0.5, 1.0, 4.0])
def test_lnmax_vote_swap_loss_exceeds_one_over_b_and_tends_to_two_over_b(b):
  """Neighbours (n0, n1) -> (n0 - 1, n1 + 1): the exact worst log-ratio is < 2/b and -> 2/b."""
  worst = 0.0
  for n1 in range(-400, 401):
    d, d_nb = (0, n1), (-1, n1 + 1)
    for k in (0, 1):  # output class k wins iff Z_other - Z_k < n_k - n_other
      lp = log_laplace_difference_cdf(d[k] - d[1 - k], b)
      lq = log_laplace_difference_cdf(d_nb[k] - d_nb[1 - k], b)
      worst = max(worst, abs(lp - lq))
  assert worst <= mech.report_noisy_max_laplace_epsilon(b) + 1e-12  # 2/b
  assert worst > 1.0 / b  # the monotone (Dwork & Roth Claim 3.9) 1/b does not hold here
  assert worst == pytest.approx(2.0 / b, rel=0.01 if b <= 1 else 0.05)


def _laplace_rdp_exact(order: float, shift: float) -> float:
  """D_alpha(Lap(0, 1) || Lap(shift, 1)) by numerical integration."""
  def integrand(x):
    lp = -abs(x) - math.log(2)
    lq = -abs(x - shift) - math.log(2)
    return math.exp(order * lp + (1 - order) * lq)
  val = sum(integrate.quad(integrand, lo, hi, epsabs=0, epsrel=1e-12)[0]
            for lo, hi in ((-np.inf, 0.0), (0.0, shift), (shift, np.inf)))
  return math.log(val) / (order - 1)


def _laplace_rdp_mironov(order: float, eps: float) -> float:
  """Mironov (2017) Proposition 6, the RDP dp_accounting uses for LaplaceDpEvent(1/eps)."""
  return eps + math.log1p((order - 1) * math.expm1(eps * (1 - 2 * order)) / (2 * order - 1)) / (order - 1)


@pytest.mark.parametrize("b", [0.5, 2.0])
@pytest.mark.parametrize("order", [1.5, 2.0, 8.0, 32.0])
def test_laplace_event_with_l1_sensitivity_two_covers_a_moved_vote(b, order):
  """RDP of the 2-coordinate shift (1, -1)/b <= RDP of LaplaceDpEvent(b/2) (1-coordinate shift 2/b)."""
  one = _laplace_rdp_exact(order, 1.0 / b)
  assert one == pytest.approx(_laplace_rdp_mironov(order, 1.0 / b), rel=1e-7)
  moved_vote = 2 * one  # independent coordinates: Renyi divergences add
  ev = mech.report_noisy_max_laplace_event(b)
  assert ev == events.LaplaceDpEvent(noise_multiplier=b / 2, neighbouring="add_remove")
  assert moved_vote <= _laplace_rdp_mironov(order, 1.0 / ev.noise_multiplier) + 1e-12


def test_gnmax_event_and_rho():
  sigma = 3.0
  ev = mech.report_noisy_max_gaussian_event(sigma)
  assert isinstance(ev, events.GaussianDpEvent)
  assert ev.noise_multiplier == pytest.approx(sigma / math.sqrt(2))
  # PATE 2018 Prop. 8: (lambda, lambda / sigma^2)-RDP, i.e. rho = 1/sigma^2.
  assert mech.report_noisy_max_gaussian_rho(sigma) == pytest.approx(1 / sigma**2)
  assert 1 / (2 * ev.noise_multiplier**2) == pytest.approx(1 / sigma**2)
  # add/remove neighbouring: one count moves, Delta_2 = 1
  assert mech.report_noisy_max_gaussian_event(sigma, l2_sensitivity=1.0).noise_multiplier == sigma
  assert mech.report_noisy_max_laplace_epsilon(2.0, l1_sensitivity=1.0) == 0.5


# ------------------------------------------------------------------ jit / vmap / keys


@pytest.mark.parametrize("f", [mech.report_noisy_max_laplace, mech.report_noisy_max_gaussian])
def test_noisy_max_vmap_jit_and_keys(f):
  counts = jnp.array([[3, 4, 4, 1], [0, 0, 9, 8]])
  key = jax.random.key(5)
  scales = jnp.array([0.5, 2.0, 10.0])
  batched = np.asarray(jax.jit(jax.vmap(lambda s: f(key, counts, s)))(scales))
  looped = np.stack([np.asarray(f(key, counts, float(s))) for s in scales])
  np.testing.assert_array_equal(batched, looped)
  keys = jax.random.split(key, 5)
  g = lambda k: f(k, counts, 2.0)
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(g))(keys)), np.stack([np.asarray(g(k)) for k in keys]))
  np.testing.assert_array_equal(np.asarray(jax.jit(g)(keys[0])), np.asarray(g(keys[0])))
  big = jnp.zeros((2000, 8))
  assert np.mean(np.asarray(f(keys[0], big, 1.0)) != np.asarray(f(keys[1], big, 1.0))) > 0.5
