"""Noise samplers: moments, tails and laws (KS) with fixed seeds; jit/vmap/key semantics.

Tolerances are derived from the sampling distribution of each statistic
(``Z_TOL`` standard errors) or are KS/chi-square p-value floors, so a wrong
scale, a wrong law or a biased sampler fails.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdp import mechanisms as mech

Z_TOL = 6.0  # standard errors; a correct sampler fails with prob. ~2e-9
P_FLOOR = 1e-4  # KS p-value floor


def _keys(seed: int, n: int) -> jax.Array:
  return jax.random.split(jax.random.key(seed), n)


def _assert_mean(x: np.ndarray, mean: float, sd: float) -> None:
  se = sd / math.sqrt(x.size)
  assert abs(x.mean() - mean) < Z_TOL * se, (x.mean(), mean, se)


def _assert_prob(hits: np.ndarray, p: float) -> None:
  se = math.sqrt(p * (1 - p) / hits.size)
  assert abs(hits.mean() - p) < Z_TOL * se, (hits.mean(), p, se)


# ------------------------------------------------------------------ Laplace


def test_laplace_moments_tails_and_law():
  b = 2.5
  n = 200_000
  x = np.asarray(mech.laplace_noise(jax.random.key(0), (n,), b), dtype=np.float64)
  assert x.dtype == np.float64 and x.shape == (n,)
  _assert_mean(x, 0.0, math.sqrt(2) * b)
  # Var(X^2) = E X^4 - (E X^2)^2 = 24 b^4 - 4 b^4 = 20 b^4.
  _assert_mean(x**2, 2 * b**2, math.sqrt(20) * b**2)
  # E|X| = b, Var|X| = b^2 (|X| ~ Exp(1/b)).
  _assert_mean(np.abs(x), b, b)
  for t in (1.0, 3.0, 6.0):  # P(|X| > t b) = e^{-t}
    _assert_prob(np.abs(x) > t * b, math.exp(-t))
  assert stats.kstest(x, stats.laplace(scale=b).cdf).pvalue > P_FLOOR


def test_laplace_ks_rejects_wrong_scale():
  # Sanity of the KS test itself: the same samples against a 5% wrong scale fail.
  x = np.asarray(mech.laplace_noise(jax.random.key(0), (200_000,), 1.0))
  assert stats.kstest(x, stats.laplace(scale=1.05).cdf).pvalue < P_FLOOR


def test_laplace_per_coordinate_scale_broadcasts():
  scales = jnp.array([0.5, 1.0, 4.0])
  x = np.asarray(mech.laplace_noise(jax.random.key(1), (100_000, 3), scales), np.float64)
  for j, b in enumerate(np.asarray(scales)):
    _assert_mean(np.abs(x[:, j]), b, b)


def test_zero_scale_gives_zero_noise():
  assert np.all(np.asarray(mech.laplace_noise(jax.random.key(0), (3,), 0.0)) == 0)
  assert np.all(np.asarray(mech.gaussian_noise(jax.random.key(0), (3,), 0.0)) == 0)
  assert np.all(np.asarray(mech.l2_laplace_noise(jax.random.key(0), (3,), jnp.inf)) == 0)


# ------------------------------------------------------------------ Gaussian


def test_gaussian_moments_tails_and_law():
  s = 1.7
  n = 200_000
  x = np.asarray(mech.gaussian_noise(jax.random.key(2), (n,), s), dtype=np.float64)
  _assert_mean(x, 0.0, s)
  _assert_mean(x**2, s**2, math.sqrt(2) * s**2)  # Var(X^2) = 2 s^4
  for t in (1.0, 2.0, 3.0):
    _assert_prob(np.abs(x) > t * s, 2 * stats.norm.sf(t))
  assert stats.kstest(x, stats.norm(scale=s).cdf).pvalue > P_FLOOR
  assert stats.kstest(x, stats.norm(scale=1.05 * s).cdf).pvalue < P_FLOOR


# ------------------------------------------------------------------ L2 Laplace


@pytest.mark.parametrize("dim", [1, 10, 7840])
def test_l2_laplace_radius_is_gamma(dim):
  """||b|| ~ Gamma(dim, scale 1/beta); float32 sampling stays accurate at dim 7840."""
  beta = 3.0
  n = 50_000 if dim < 1000 else 5_000
  r = jax.jit(jax.vmap(lambda k: mech.l2_laplace_radius(k, (dim,), beta)))(_keys(10 + dim, n))
  r = np.asarray(r, np.float64)
  law = stats.gamma(a=dim, scale=1.0 / beta)
  assert stats.kstest(r, law.cdf).pvalue > P_FLOOR
  _assert_mean(r, dim / beta, math.sqrt(dim) / beta)
  # Variance dim/beta^2; Var((r - m)^2) = E(r-m)^4 - var^2 = (3 var^2 + 6 dim/beta^4) - var^2.
  var = dim / beta**2
  _assert_mean((r - dim / beta) ** 2, var, math.sqrt(2 * var**2 + 6 * dim / beta**4))
  # A 0.1% error in the radius scale is caught at this sample size for dim 7840
  # (relative s.e. of the mean is 1/sqrt(dim n) = 1.6e-4), so float32
  # accumulation of the radius (a sum of dim exponentials) is accurate.
  if dim == 7840:
    assert stats.kstest(r, stats.gamma(a=dim, scale=1.001 / beta).cdf).pvalue < P_FLOOR


@pytest.mark.parametrize("shape", [(10,), (784, 10)])
def test_l2_laplace_noise_norm_is_gamma(shape):
  """The norm of the full noise array (one radius for the whole array) is Gamma(prod(shape), 1/beta)."""
  beta = 0.5
  dim = int(np.prod(shape))
  n = 1_000
  noise = jax.jit(jax.vmap(lambda k: mech.l2_laplace_noise(k, shape, beta)))(_keys(20 + dim, n))
  assert noise.shape == (n,) + shape and noise.dtype == jnp.float32
  norms = np.linalg.norm(np.asarray(noise, np.float64).reshape(n, -1), axis=1)
  assert stats.kstest(norms, stats.gamma(a=dim, scale=1.0 / beta).cdf).pvalue > P_FLOOR


def test_l2_laplace_in_one_dimension_is_laplace():
  beta = 2.0
  x = jax.jit(jax.vmap(lambda k: mech.l2_laplace_noise(k, (), beta)))(_keys(3, 50_000))
  assert x.shape == (50_000,)
  assert stats.kstest(np.asarray(x, np.float64), stats.laplace(scale=1 / beta).cdf).pvalue > P_FLOOR


def test_uniform_direction_is_uniform_on_the_sphere():
  n = 50_000
  # d = 3: each coordinate is uniform on [-1, 1] (Archimedes' hat-box theorem).
  u3 = np.asarray(jax.jit(jax.vmap(lambda k: mech.uniform_direction(k, (3,))))(_keys(4, n)), np.float64)
  np.testing.assert_allclose(np.linalg.norm(u3, axis=1), 1.0, rtol=1e-5)
  for j in range(3):
    assert stats.kstest(u3[:, j], stats.uniform(loc=-1, scale=2).cdf).pvalue > P_FLOOR
  # d = 10: u_1^2 ~ Beta(1/2, 9/2); mean 0 and second moments I/d.
  d = 10
  u = np.asarray(jax.jit(jax.vmap(lambda k: mech.uniform_direction(k, (2, 5))))(_keys(5, n)), np.float64)
  u = u.reshape(n, d)
  assert stats.kstest(u[:, 0] ** 2, stats.beta(0.5, (d - 1) / 2).cdf).pvalue > P_FLOOR
  sd = 1 / math.sqrt(d)
  for j in range(d):
    _assert_mean(u[:, j], 0.0, sd)
  # off-diagonal E[u_i u_j] = 0 with sd 1/sqrt(d (d+2)); diagonal E[u_i^2] = 1/d.
  _assert_mean(u[:, 0] * u[:, 1], 0.0, 1 / math.sqrt(d * (d + 2)))
  b = stats.beta(0.5, (d - 1) / 2)
  _assert_mean(u[:, 3] ** 2, 1 / d, b.std())


def test_l2_laplace_rejects_vector_beta():
  with pytest.raises(ValueError, match="beta"):
    mech.l2_laplace_noise(jax.random.key(0), (3,), jnp.array([1.0, 2.0]))


# ------------------------------------------------------------------ jit / vmap / keys

SAMPLERS = {
    "laplace": lambda k, s: mech.laplace_noise(k, (4, 3), s),
    "gaussian": lambda k, s: mech.gaussian_noise(k, (4, 3), s),
    "l2_laplace": lambda k, s: mech.l2_laplace_noise(k, (4, 3), s),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_vmap_over_keys_and_scales_jit_and_key_semantics(name):
  f = SAMPLERS[name]
  keys = _keys(7, 5)
  eager = np.stack([np.asarray(f(k, 1.5)) for k in keys])
  # vmap over keys (jitted) equals the Python loop
  batched = np.asarray(jax.jit(jax.vmap(lambda k: f(k, 1.5)))(keys))
  np.testing.assert_allclose(batched, eager, rtol=1e-5, atol=1e-6)
  # vmap over noise scales equals the loop over scales with one key
  scales = jnp.array([0.5, 1.0, 2.0, 7.0])
  by_scale = np.asarray(jax.jit(jax.vmap(lambda s: f(keys[0], s)))(scales))
  looped = np.stack([np.asarray(f(keys[0], float(s))) for s in scales])
  np.testing.assert_allclose(by_scale, looped, rtol=1e-5, atol=1e-6)
  # jit equals no-jit; same key same noise; different keys different noise
  np.testing.assert_allclose(np.asarray(jax.jit(f)(keys[0], 1.5)), eager[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(f(keys[0], 1.5)), eager[0])
  assert not np.allclose(eager[0], eager[1])


def test_legacy_keys_int_and_scalar_shapes():
  legacy = jax.random.PRNGKey(0)
  np.testing.assert_array_equal(
      np.asarray(mech.laplace_noise(legacy, 3, 1.0)), np.asarray(mech.laplace_noise(legacy, (3,), 1.0)))
  assert mech.gaussian_noise(jax.random.key(0), (), 1.0).shape == ()
  assert mech.l2_laplace_noise(legacy, (3,), 1.0).shape == (3,)


# ------------------------------------------------------------------ long float32 tails


def test_exponential_from_bits_support_reaches_46_ln2():
  from jaxdp.mechanisms import _sampling
  shift = np.uint32(1 << 9)  # the top 23 bits of a word carry the value
  hi = jnp.array([0, 0, 0, (1 << 23) - 1], jnp.uint32) * shift
  lo = jnp.array([0, 1, (1 << 23) - 1, (1 << 23) - 1], jnp.uint32) * shift
  e = np.asarray(_sampling.exponential_from_bits(hi, lo, jnp.float32), np.float64)
  # U = (hi 2^23 + lo + 1) 2^-46
  expected = -np.log(np.array([1.0, 2.0, 2.0**23, 2.0**46]) * 2.0**-46)
  np.testing.assert_allclose(e, expected, rtol=1e-6, atol=1e-7)
  assert e[0] == pytest.approx(46 * math.log(2), rel=1e-6)  # |Lap| up to 31.9 scale units
  assert math.sqrt(2 * e[0]) > 7.98  # Box-Muller radius: |N(0,1)| up to 7.99
  # jax.random.laplace / normal stop at ~16.6 and ~5.42 in float32
  assert e[0] > 16.6 + 15 and math.sqrt(2 * e[0]) > 5.42 + 2.5


def test_box_muller_fourth_moment_and_pair_independence():
  m = 200_000
  x = np.asarray(mech.gaussian_noise(jax.random.key(30), (2 * m,), 1.0), np.float64)
  # E Z^4 = 3, Var(Z^4) = 105 - 9 = 96
  _assert_mean(x**4, 3.0, math.sqrt(96.0))
  # the cos and sin halves of each Box-Muller pair are independent N(0,1):
  # squares uncorrelated (they would be positively correlated if the radius were shared wrongly)
  a, b = x[:m] ** 2 - 1, x[m:] ** 2 - 1
  corr = np.mean(a * b) / math.sqrt(np.mean(a * a) * np.mean(b * b))
  assert abs(corr) < Z_TOL / math.sqrt(m)
  # odd sizes are fine
  assert mech.gaussian_noise(jax.random.key(31), (3, 5), 1.0).shape == (3, 5)


def test_laplace_sign_is_independent_of_magnitude():
  x = np.asarray(mech.laplace_noise(jax.random.key(32), (200_000,), 1.0), np.float64)
  pos, neg = np.abs(x[x > 0]), np.abs(x[x < 0])
  _assert_prob(x > 0, 0.5)
  assert stats.ks_2samp(pos, neg).pvalue > P_FLOOR
