"""Laplace, Gaussian (analytic / classic / zCDP) and L2-Laplace mechanisms.

Each noise scale is checked against its formula, against the exact privacy
condition where one exists (Balle & Wang 2018 Theorem 8, computed here
independently of jaxdp.accounting), and empirically (sample moments).
"""

import functools
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special
from scipy import stats

from jaxdp import mechanisms as mech
from jaxdp.accounting import events

Z_TOL = 6.0


def _keys(seed, n):
  return jax.random.split(jax.random.key(seed), n)


def _draws(mechanism, value, n, seed, **privacy):
  f = functools.partial(mechanism, value=value, **privacy)
  return np.asarray(jax.jit(jax.vmap(lambda k: f(k)))(_keys(seed, n)), np.float64)


def _sd_check(noise: np.ndarray, sd: float) -> None:
  """Sample second moment of zero-mean noise vs sd^2 (Var(X^2) <= 20 sd^4 for Laplace)."""
  m2 = np.mean(noise**2)
  se = math.sqrt(20.0) * sd**2 / math.sqrt(noise.size)
  assert abs(m2 - sd**2) < Z_TOL * se, (m2, sd**2, se)


def balle_wang_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
  """Exact delta(epsilon) of N(0, sigma^2) on a Delta-sensitive query (Balle & Wang 2018, Thm 8).

  delta = Phi(Delta/(2 sigma) - eps sigma/Delta) - e^eps Phi(-Delta/(2 sigma) - eps sigma/Delta),
  with the second term in log space. Written here independently of jaxdp.accounting.
  """
  a = sensitivity / (2 * sigma)
  b = epsilon * sigma / sensitivity
  return float(special.ndtr(a - b) - np.exp(epsilon + special.log_ndtr(-a - b)))


# ------------------------------------------------------------------ Laplace


def test_laplace_mechanism_scale_is_sensitivity_over_epsilon():
  value = jnp.array([10.0, -3.0, 0.0])
  l1, eps = 2.0, 0.5
  b = l1 / eps
  assert mech.laplace_scale(l1, eps) == b
  out = _draws(mech.laplace_mechanism, value, 40_000, 0, l1_sensitivity=l1, epsilon=eps)
  noise = out - np.asarray(value)
  assert abs(noise.mean()) < Z_TOL * math.sqrt(2) * b / math.sqrt(noise.size)
  _sd_check(noise, math.sqrt(2) * b)
  ev = mech.laplace_mechanism_event(l1, eps)
  assert isinstance(ev, events.LaplaceDpEvent) and ev.noise_multiplier == pytest.approx(1 / eps)


def test_laplace_mechanism_promotes_integer_values():
  out = mech.laplace_mechanism(jax.random.key(0), jnp.array([1, 2, 3]), 1.0, 1.0)
  assert out.dtype == jnp.float32 and out.shape == (3,)


def test_laplace_event_pure_epsilon_through_rdp_limit():
  # The Laplace RDP curve tends to the pure epsilon = 1/noise_multiplier = eps.
  ev = mech.laplace_mechanism_event(1.0, 0.8)
  acc = dp_accounting.rdp.RdpAccountant(orders=[1e4])
  acc.compose(ev)
  # eps(delta) from RDP at a huge order approaches the pure epsilon from above.
  assert 0.8 <= acc.get_epsilon(1e-6) <= 0.8 + math.log(1e6) / (1e4 - 1) + 1e-3


# ------------------------------------------------------------------ analytic Gaussian

EPSILONS = [0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]
DELTAS = [1e-10, 1e-5, 1e-2, 0.3, 0.6]


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("delta", DELTAS)
def test_analytic_gaussian_sigma_meets_balle_wang_theorem_8(epsilon, delta):
  """delta(sigma) <= delta, tight to 1e-6 relative, in both branches of Algorithm 2."""
  sens = 1.3
  ev = mech.gaussian_mechanism_event(sens, epsilon, delta)
  sigma = ev.noise_multiplier * sens
  achieved = balle_wang_delta(sigma, epsilon, sens)
  assert achieved <= delta * (1 + 1e-6), (achieved, delta)
  assert achieved >= delta * (1 - 1e-6), (achieved, delta)  # not wastefully large


def test_analytic_gaussian_grid_covers_both_branches():
  # Branch of Algorithm 2: delta >= delta_0 = Phi(0) - e^eps Phi(-sqrt(2 eps)) or not.
  delta0 = [0.5 - math.exp(e) * stats.norm.cdf(-math.sqrt(2 * e)) for e in EPSILONS]
  pairs = [(d >= d0) for d0 in delta0 for d in DELTAS]
  assert any(pairs) and not all(pairs)


def test_gaussian_mechanism_pinned_value_and_empirical_sd():
  # sigma(eps=1, delta=1e-5, Delta=1) = 3.7306 (Balle & Wang 2018 Table/Fig. 1 regime).
  sigma = mech.gaussian_mechanism_event(1.0, 1.0, 1e-5).noise_multiplier
  assert sigma == pytest.approx(3.730632, abs=1e-6)
  assert balle_wang_delta(sigma, 1.0) == pytest.approx(1e-5, rel=1e-6)
  value = jnp.zeros((4,))
  out = _draws(mech.gaussian_mechanism, value, 40_000, 1, l2_sensitivity=2.0, epsilon=1.0, delta=1e-5)
  noise = out.ravel()
  se = math.sqrt(2) * (2 * sigma) ** 2 / math.sqrt(noise.size)
  assert abs(np.mean(noise**2) - (2 * sigma) ** 2) < Z_TOL * se


def test_gaussian_event_pld_recovers_target_epsilon():
  eps, delta = 1.0, 1e-5
  ev = mech.gaussian_mechanism_event(1.0, eps, delta)
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  acc.compose(ev)
  got = acc.get_epsilon(delta)
  # PLD discretisation is pessimistic by a little; the mechanism is exactly (eps, delta)-DP.
  assert eps - 1e-3 <= got <= eps + 2e-2, got


def test_classic_gaussian_is_never_below_the_analytic_sigma():
  for eps in (0.01, 0.1, 0.5, 0.99):
    for delta in (1e-10, 1e-5, 1e-2):
      classic = mech.classic_gaussian_mechanism_event(1.0, eps, delta).noise_multiplier
      assert classic == pytest.approx(math.sqrt(2 * math.log(1.25 / delta)) / eps, rel=1e-12)
      analytic = mech.gaussian_mechanism_event(1.0, eps, delta).noise_multiplier
      assert classic >= analytic
      # hence Dwork & Roth's sigma (with equality in c^2 >= 2 ln(1.25/delta)) is DP by Thm 8
      assert balle_wang_delta(classic, eps) <= delta


def test_classic_gaussian_refuses_epsilon_at_least_one():
  for eps in (1.0, 2.0):
    with pytest.raises(ValueError, match="epsilon"):
      mech.classic_gaussian_mechanism(jax.random.key(0), jnp.zeros(2), 1.0, eps, 1e-5)
    with pytest.raises(ValueError, match="epsilon"):
      mech.classic_gaussian_sigma(eps, 1e-5)


# ------------------------------------------------------------------ zCDP Gaussian


def test_zcdp_gaussian_sigma_and_event():
  sens, rho = 0.7, 0.125
  sigma = sens / math.sqrt(2 * rho)
  assert mech.gaussian_zcdp_sigma(rho, sens) == pytest.approx(sigma)
  ev = mech.zcdp_gaussian_mechanism_event(sens, rho)
  assert isinstance(ev, events.GaussianDpEvent)
  assert 1 / (2 * ev.noise_multiplier**2) == pytest.approx(rho, rel=1e-12)
  out = _draws(mech.zcdp_gaussian_mechanism, jnp.ones(3), 40_000, 2, l2_sensitivity=sens, rho=rho)
  noise = (out - 1.0).ravel()
  se = math.sqrt(2) * sigma**2 / math.sqrt(noise.size)
  assert abs(np.mean(noise**2) - sigma**2) < Z_TOL * se


# ------------------------------------------------------------------ L2 Laplace


def test_l2_laplace_mechanism_beta_and_noise_norm():
  value = jnp.full((6, 4), 3.0)
  l2, eps = 0.25, 2.0
  beta = eps / l2
  assert mech.l2_laplace_beta(l2, eps) == beta
  out = _draws(mech.l2_laplace_mechanism, value, 5_000, 3, l2_sensitivity=l2, epsilon=eps)
  norms = np.linalg.norm((out - 3.0).reshape(out.shape[0], -1), axis=1)
  d = value.size
  assert stats.kstest(norms, stats.gamma(a=d, scale=1 / beta).cdf).pvalue > 1e-4
  assert mech.l2_laplace_mechanism_event(l2, eps) == events.PureDpEvent(eps,
                                                                       neighbouring="add_remove")


def test_l2_laplace_density_ratio_bound():
  """The privacy proof: log p(z - f(D)) / p(z - f(D')) <= beta ||f(D) - f(D')|| (triangle inequality)."""
  beta = mech.l2_laplace_beta(0.5, 1.0)
  rng = np.random.default_rng(0)
  f_d = rng.normal(size=(200, 5))
  shift = rng.normal(size=(200, 5))
  shift *= 0.5 / np.linalg.norm(shift, axis=1, keepdims=True)  # ||f(D) - f(D')|| = Delta
  z = rng.laplace(size=(200, 5)) * 10
  log_ratio = -beta * np.linalg.norm(z - f_d, axis=1) + beta * np.linalg.norm(z - f_d - shift, axis=1)
  assert np.all(log_ratio <= 1.0 + 1e-12)
  # and the bound is approached when z is far away along the shift direction
  z_far = f_d - 1e6 * shift
  worst = -beta * np.linalg.norm(z_far - f_d, axis=1) + beta * np.linalg.norm(z_far - f_d - shift, axis=1)
  np.testing.assert_allclose(worst, 1.0, rtol=1e-6)


# ------------------------------------------------------------------ jit / vmap


@pytest.mark.parametrize(
    "mechanism,privacy",
    [
        (mech.laplace_mechanism, dict(l1_sensitivity=1.0, epsilon=1.0)),
        (mech.gaussian_mechanism, dict(l2_sensitivity=1.0, epsilon=1.0, delta=1e-5)),
        (mech.classic_gaussian_mechanism, dict(l2_sensitivity=1.0, epsilon=0.5, delta=1e-5)),
        (mech.zcdp_gaussian_mechanism, dict(l2_sensitivity=1.0, rho=0.5)),
        (mech.l2_laplace_mechanism, dict(l2_sensitivity=1.0, epsilon=1.0)),
    ],
)
def test_mechanisms_jit_vmap_and_keys(mechanism, privacy):
  value = jnp.arange(6.0).reshape(2, 3)
  f = functools.partial(mechanism, **privacy)
  keys = _keys(5, 4)
  eager = np.stack([np.asarray(f(k, value)) for k in keys])
  batched = np.asarray(jax.jit(jax.vmap(f, in_axes=(0, None)))(keys, value))
  np.testing.assert_allclose(batched, eager, rtol=1e-5, atol=1e-5)
  # value may itself be traced (jit over the data, privacy parameters closed over)
  np.testing.assert_allclose(np.asarray(jax.jit(f)(keys[0], value)), eager[0], rtol=1e-5, atol=1e-5)
  assert not np.allclose(eager[0], eager[1])
  np.testing.assert_array_equal(np.asarray(f(keys[0], value)), eager[0])


# ------------------------------------------------------------------ float32 rounding


@pytest.mark.parametrize("dtype", [np.float32, np.float16, jnp.bfloat16])
def test_scales_are_rounded_towards_more_noise(dtype):
  from jaxdp.mechanisms import _common
  rng = np.random.default_rng(0)
  for x in np.concatenate([rng.uniform(0.01, 100, 200), [0.1, 1 / 3, 3.730632, 2.0]]):
    up = _common.round_scale_up(float(x), dtype)
    down = _common.round_inverse_scale_down(float(x), dtype)
    assert float(up) >= x and float(down) <= x
    # tight: the next representable value on the other side is beyond x
    assert float(np.nextafter(up, np.asarray(0, up.dtype))) < x or float(up) == x
    assert float(np.nextafter(down, np.asarray(np.inf, down.dtype))) > x or float(down) == x


def test_mechanism_uses_the_rounded_up_scale():
  from jaxdp.mechanisms import _common
  key = jax.random.key(11)
  eps = 3.0  # 1/3 is not representable in float32
  out = np.asarray(mech.laplace_mechanism(key, jnp.zeros(5), 1.0, eps))
  unit = np.asarray(mech.laplace_noise(key, (5,), 1.0))
  scale32 = _common.round_scale_up(1 / eps, np.float32)
  assert float(scale32) > 1 / eps
  np.testing.assert_array_equal(out, unit * scale32)


# 1 + 2^-25 lies between the float32 values 1 and 1 + 2^-23 and is nearest to 1: a plain
# cast would round this scale DOWN (less noise) and this beta UP (less noise).
_ROUNDS_DOWN = 1.0 + 2.0**-25


def test_raw_samplers_and_selection_mechanisms_round_concrete_scales_towards_more_noise():
  from jaxdp.mechanisms import _common
  from jaxdp.mechanisms import exponential as _exponential
  from jaxdp.mechanisms import noisy_max as _noisy_max
  assert float(np.float32(_ROUNDS_DOWN)) < _ROUNDS_DOWN  # the premise of the test
  up = float(np.nextafter(np.float32(1.0), np.float32(2.0)))
  key = jax.random.key(12)
  unit_lap = np.asarray(mech.laplace_noise(key, (7,), 1.0))
  np.testing.assert_array_equal(np.asarray(mech.laplace_noise(key, (7,), _ROUNDS_DOWN)),
                                unit_lap * np.float32(up))
  unit_gau = np.asarray(mech.gaussian_noise(key, (7,), 1.0))
  np.testing.assert_array_equal(np.asarray(mech.gaussian_noise(key, (7,), _ROUNDS_DOWN)),
                                unit_gau * np.float32(up))
  # beta (an inverse scale) is rounded down: radius = Gamma / beta is never smaller.
  big_beta = 1.0 + 2.0**-22 - 2.0**-25  # nearest float32 is 1 + 2^-22 (above)
  assert float(np.float32(big_beta)) > big_beta
  below = np.nextafter(np.float32(big_beta), np.float32(0.0))
  gamma = np.asarray(mech.l2_laplace_radius(key, (3,), 1.0))
  np.testing.assert_array_equal(np.asarray(mech.l2_laplace_radius(key, (3,), big_beta)),
                                gamma / below)
  # report-noisy-max scales (rounded up) and exponential-mechanism betas (rounded down)
  assert float(_noisy_max._scale_for_batch(_ROUNDS_DOWN, jnp.float32)[0]) >= _ROUNDS_DOWN
  assert float(_noisy_max._scale_for_batch(np.array([_ROUNDS_DOWN, 2.0]), jnp.float32)[0, 0]) \
      >= _ROUNDS_DOWN
  assert float(_exponential._scaled_scores(jnp.ones(3), big_beta)[0]) <= big_beta
  # the shared helper, on arrays, both directions, and idempotent on representable values
  arr = np.array([_ROUNDS_DOWN, big_beta, 0.5, np.inf])
  assert np.all(np.asarray(_common.noise_scale_as(arr, jnp.float32), np.float64) >= arr)
  assert np.all(np.asarray(_common.noise_scale_as(arr, jnp.float32, round_up=False), np.float64)
                <= arr)
  np.testing.assert_array_equal(np.asarray(_common.noise_scale_as(np.float32(0.1), jnp.float32)),
                                np.float32(0.1))
