"""Discrete Laplace / discrete Gaussian on a public grid (CKS 2020): laws, grid, exact DP, errors.

Shapes and parameters are shared between tests so that each sampler compiles
once (nested ``lax.while_loop``s compile slowly on a busy CPU).
"""

import fractions
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdp import mechanisms as mech
from jaxdp.accounting import events
from jaxdp.mechanisms import discrete

N = 4000
P_FLOOR = 1e-4
LAP_T, LAP_S = 3, 2  # scale 1.5 grid units
GAU_T, GAU_C = 3, 2  # sigma^2 = 6


@pytest.fixture(scope="module")
def laplace_draws():
  return np.asarray(mech.discrete_laplace_noise(jax.random.key(0), (N,), LAP_T, LAP_S))


@pytest.fixture(scope="module")
def gaussian_draws():
  return np.asarray(mech.discrete_gaussian_noise(jax.random.key(1), (N,), GAU_T, GAU_C))


def _discrete_laplace_pmf(k, scale):
  q = math.exp(-1.0 / scale)
  return (1 - q) / (1 + q) * q ** np.abs(k)


def _discrete_gaussian_pmf(k, variance):
  support = np.arange(-200, 201)
  norm = np.sum(np.exp(-support.astype(np.float64) ** 2 / (2 * variance)))
  return np.exp(-np.asarray(k, np.float64) ** 2 / (2 * variance)) / norm


def _chi_square_on_window(draws, pmf, window):
  """Chi-square of the counts on [-window, window] plus the two lumped tails."""
  ks = np.arange(-window, window + 1)
  observed = np.array([np.sum(draws < -window)] + [np.sum(draws == k) for k in ks]
                      + [np.sum(draws > window)], np.float64)
  probs = pmf(ks)
  tail = (1.0 - probs.sum()) / 2
  expected = np.concatenate([[tail], probs, [tail]]) * draws.size
  return stats.chisquare(observed, expected).pvalue


def test_discrete_laplace_sampler_matches_the_exact_pmf(laplace_draws):
  assert laplace_draws.dtype == np.int32
  scale = LAP_T / LAP_S
  assert _chi_square_on_window(laplace_draws, lambda k: _discrete_laplace_pmf(k, scale), 6) > P_FLOOR
  # power: a 20% larger scale is rejected by the same statistic
  assert _chi_square_on_window(
      laplace_draws, lambda k: _discrete_laplace_pmf(k, 1.2 * scale), 6) < P_FLOOR


def test_discrete_gaussian_sampler_matches_the_exact_pmf(gaussian_draws):
  assert gaussian_draws.dtype == np.int32
  n = GAU_T * GAU_C
  assert _chi_square_on_window(gaussian_draws, lambda k: _discrete_gaussian_pmf(k, n), 8) > P_FLOOR
  assert _chi_square_on_window(
      gaussian_draws, lambda k: _discrete_gaussian_pmf(k, 1.44 * n), 8) < P_FLOOR
  # the discrete Gaussian is symmetric with variance slightly below n (CKS Cor. 9)
  assert abs(gaussian_draws.mean()) < 6 * math.sqrt(n / N)


@functools.lru_cache(maxsize=None)
def _loop_sampler(t, s, c):
  """One jitted reference program per (t, s, c), shared by every call below."""
  return jax.jit(jax.vmap(lambda k: discrete._sampler_one(k, t, s, c)))


def _one_loop_per_draw(key, n, t, s, c):
  """The reference: one ``while_loop`` per coordinate (``discrete._sampler_one``), vmapped.

  The n keys are padded (by repeating the last one) to N rows, so every n runs the one
  compiled N-row program; the padding rows are dropped.
  """
  keys = jax.random.key_data(jax.random.split(key, n)).astype(jnp.uint32)
  padded = jnp.concatenate([keys, jnp.repeat(keys[-1:], max(N - n, 0), axis=0)])
  return np.asarray(_loop_sampler(t, s, c)(padded))[:n]


def test_work_queue_returns_the_per_coordinate_loop_draws(laplace_draws, gaussian_draws):
  """The work queue (256 lanes restarting on the next coordinate) changes no draw:
  every coordinate is the integer its own exact loop returns for its key, so the law
  is the CKS law checked above (N = 4000 and 521 refill lanes; 1 uses one lane)."""
  np.testing.assert_array_equal(laplace_draws,
                                _one_loop_per_draw(jax.random.key(0), N, LAP_T, LAP_S, None))
  np.testing.assert_array_equal(gaussian_draws,
                                _one_loop_per_draw(jax.random.key(1), N, GAU_T, 1, GAU_C))
  for n in (1, 521):
    key = jax.random.key(n)
    np.testing.assert_array_equal(np.asarray(mech.discrete_laplace_noise(key, (n,), LAP_T, LAP_S)),
                                  _one_loop_per_draw(key, n, LAP_T, LAP_S, None))
  assert mech.discrete_laplace_noise(jax.random.key(2), (0, 3), LAP_T, LAP_S).shape == (0, 3)
  # vmappable over keys: the batched stages equal one call per key
  keys = jax.random.split(jax.random.key(3), 3)
  batched = jax.vmap(lambda k: mech.discrete_laplace_noise(k, (521,), LAP_T, LAP_S))(keys)
  np.testing.assert_array_equal(
      np.asarray(batched),
      np.stack([np.asarray(mech.discrete_laplace_noise(k, (521,), LAP_T, LAP_S)) for k in keys]))


def test_calibrated_extreme_parameters_keep_the_exact_law():
  """The largest integers the calibration produces: t = s = 2^20 (scale 1), and sigma^2 ~ 2^15.

  Large ``t`` makes the uniform draws' rejection thresholds non-trivial; the
  largest variance exercises the biggest acceptance exponents.
  """
  t, s = mech.discrete_laplace_scale(1.0, 1.0, 1.0)
  assert (t, s) == (2**20, 2**20)
  z = np.asarray(mech.discrete_laplace_noise(jax.random.key(8), (N,), t, s))
  assert _chi_square_on_window(z, lambda k: _discrete_laplace_pmf(k, 1.0), 5) > P_FLOOR
  tg, cg = mech.discrete_gaussian_variance(1.0, 1.0 / (2 * 180.0**2), 1.0)
  n = tg * cg
  assert 180**2 <= n <= 2**15
  g = np.asarray(mech.discrete_gaussian_noise(jax.random.key(9), (N,), tg, cg), np.float64)
  # for sigma >> 1 the discrete Gaussian's variance is n up to e^-(2 pi^2 n) (CKS Cor. 9)
  assert abs(g.mean()) < 6 * math.sqrt(n / N)
  assert abs(g.var() - n) < 6 * n * math.sqrt(2.0 / N)
  assert stats.kstest(g / math.sqrt(n), stats.norm.cdf).pvalue > P_FLOOR


def test_discrete_releases_lie_on_the_public_grid_and_replay_within_sensitivity():
  """Outputs are exactly j * grid_step; same key, neighbouring data: the grid index moves by <= K."""
  key = jax.random.key(7)
  g = 0.25
  x = jnp.array([3.1, -7.3, 100.0, 0.0])
  y = x.at[1].add(0.9)  # one coordinate moves by Delta_1 = 0.9 < 1
  for release in (
      lambda v: mech.discrete_laplace_mechanism(key, v, 1.0, 1.0, g, max_changed_coordinates=1),
      lambda v: mech.discrete_gaussian_mechanism(key, v, 1.0, 0.5, g, max_changed_coordinates=1)):
    a, b = np.asarray(release(x), np.float64), np.asarray(release(y), np.float64)
    for out in (a, b):
      j = out / g
      np.testing.assert_array_equal(j, np.round(j))
      np.testing.assert_array_equal(out, (np.round(j) * np.float32(g)).astype(np.float32))
    # same noise, so the difference is the difference of the rounded statistics
    assert np.sum(np.abs(a - b)) / g <= math.ceil(1.0 / g)


def test_rounding_sensitivity_bound_and_the_half_even_counterexample():
  """|round(x/g) - round(y/g)| <= ceil(|x - y|/g) for floor(. + 1/2); half-even breaks it."""
  rng = np.random.default_rng(0)
  g = 0.5
  x = rng.uniform(-10, 10, 20_000).astype(np.float32)
  delta = rng.uniform(0, 2.0, x.size).astype(np.float32)
  y = (x + delta).astype(np.float32)
  # Jitted, as the samplers run it (the grid step traced): one compiled program per input
  # shape instead of one per primitive.
  grid_index = jax.jit(discrete._grid_index)
  kx = np.asarray(grid_index(jnp.asarray(x), g))
  ky = np.asarray(grid_index(jnp.asarray(y), g))
  exact_delta = y.astype(np.float64) - x.astype(np.float64)
  assert np.all(np.abs(ky - kx) <= np.ceil(exact_delta / g))
  # ties: 0.5 and 1.5 (delta = 1 grid step) round to 0 and 2 under half-even
  assert np.round(1.5) - np.round(0.5) == 2
  ties = np.asarray(grid_index(jnp.array([0.5, 1.5]), 1.0))
  assert ties[1] - ties[0] == 1
  # beyond 2^23 float32 values are integers: fl(v + 0.5) would round to even and move
  # 8388610 -> 8388611 (delta 1) from 8388610 to 8388612; the grid index is exact
  big = np.array([8388609.0, 8388610.0, 8388611.0, 2.0**24 + 2], np.float32)
  np.testing.assert_array_equal(np.asarray(grid_index(jnp.asarray(big), 1.0)),
                                big.astype(np.int64))
  assert np.floor(np.float32(8388611.0) + np.float32(0.5)) == 8388612.0  # the trap avoided
  # clamping: huge values stay inside int32 with room for the noise
  huge = np.asarray(grid_index(jnp.array([3e9, -3e9]), 1.0))
  np.testing.assert_array_equal(huge, [2**30 - 64, -(2**30 - 64)])


def test_exact_dp_on_the_worst_case_pair_from_the_exact_pmf():
  """The calibrated (t, s) and n give the claimed eps / rho on the rounded worst-case shift."""
  for sens, eps, g, changed in ((1.0, 1.0, 1.0, 1), (0.3, 0.5, 0.1, 1), (1.0, 2.0, 0.25, 3)):
    t, s = mech.discrete_laplace_scale(sens, eps, g, changed)
    k1 = math.ceil(fractions.Fraction(sens) / fractions.Fraction(g)) + changed - 1
    scale = t / s
    assert scale >= k1 / eps and scale <= k1 / eps * (1 + 1.0 / t)
    # exact pmf ratio of the integer noise at every grid point for a shift of K_1 (one coordinate)
    ks = np.arange(-60, 61)
    log_ratio = np.log(_discrete_laplace_pmf(ks, scale)) - np.log(_discrete_laplace_pmf(ks + k1, scale))
    assert np.max(np.abs(log_ratio)) <= eps * (1 + 1e-12)
    assert np.max(np.abs(log_ratio)) == pytest.approx(k1 / scale, rel=1e-9)
  for sens, rho, g in ((1.0, 0.5, 0.1), (2.0, 0.1, 1.0)):
    t, c = mech.discrete_gaussian_variance(sens, rho, g)
    k2 = math.ceil(fractions.Fraction(sens) / fractions.Fraction(g))
    n = t * c
    assert k2**2 / (2 * n) <= rho
    # exact Renyi divergence of the discrete Gaussian under a K_2 shift: alpha K^2/(2n) (CKS Prop. 5)
    support = np.arange(-2000, 2001).astype(np.float64)
    log_p = -support**2 / (2 * n)  # the normaliser is shift-invariant and cancels
    log_q = -(support - k2) ** 2 / (2 * n)
    log_norm = np.log(np.sum(np.exp(log_p)))
    for alpha in (2.0, 5.0):
      terms = alpha * log_p + (1 - alpha) * log_q - log_norm
      renyi = (np.log(np.sum(np.exp(terms - terms.max()))) + terms.max()) / (alpha - 1)
      assert renyi <= alpha * rho * (1 + 1e-9)
      assert renyi == pytest.approx(alpha * k2**2 / (2 * n), rel=1e-6)


def test_discrete_events_and_validation_errors_name_the_argument():
  ev = mech.discrete_laplace_mechanism_event(1.0, 0.7, 1.0)
  assert isinstance(ev, events.PureDpEvent) and ev.epsilon == 0.7
  zev = mech.discrete_gaussian_mechanism_event(1.0, 0.2, 1.0, neighbouring="replace_one")
  assert isinstance(zev, events.ZCDpEvent) and zev.rho == 0.2 and zev.neighbouring == "replace_one"
  key = jax.random.key(0)
  v = jnp.array([1.0, 2.0])
  with pytest.raises(ValueError, match="grid_step"):
    mech.discrete_laplace_mechanism(key, v, 1.0, 1.0, 0.0)
  with pytest.raises(ValueError, match="grid_step"):
    mech.discrete_laplace_mechanism(key, v, 1.0, 1.0, float("nan"))
  with pytest.raises(ValueError, match="grid_step"):  # noise of 2^20+ grid steps
    mech.discrete_laplace_mechanism(key, v, 1.0, 1e-4, 1e-3)
  with pytest.raises(ValueError, match="grid_step"):  # sigma of more than 181 grid steps
    mech.discrete_gaussian_mechanism(key, v, 1.0, 1e-3, 0.01)
  with pytest.raises(ValueError, match="epsilon"):
    mech.discrete_laplace_mechanism(key, v, 1.0, -1.0, 1.0)
  with pytest.raises(ValueError, match="rho"):
    mech.discrete_gaussian_mechanism(key, v, 1.0, 0.0, 1.0)
  with pytest.raises(ValueError, match="l1_sensitivity"):
    mech.discrete_laplace_mechanism(key, v, 0.0, 1.0, 1.0)
  with pytest.raises(ValueError, match="max_changed_coordinates"):
    mech.discrete_laplace_mechanism(key, v, 1.0, 1.0, 1.0, max_changed_coordinates=0)
  with pytest.raises(ValueError, match="value"):
    mech.discrete_laplace_mechanism(key, jnp.array([1.0, jnp.nan]), 1.0, 1.0, 1.0)
  with pytest.raises(TypeError, match="key"):
    mech.discrete_gaussian_mechanism(0, v, 1.0, 1.0, 1.0)


def test_samplers_run_under_x64_with_int32_output(laplace_draws, gaussian_draws):
  """The classic models draw their discrete noise inside ``jax.enable_x64``: same draws, int32."""
  # The module's shapes, parameters and keys: ``plain`` is the fixtures' draws (no new
  # compilation outside x64).
  plain = (laplace_draws, gaussian_draws)
  with jax.enable_x64(True):
    wide = (mech.discrete_laplace_noise(jax.random.key(0), (N,), LAP_T, LAP_S),
            mech.discrete_gaussian_noise(jax.random.key(1), (N,), GAU_T, GAU_C))
  for a, b in zip(plain, wide):
    assert b.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
