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
  # jax.random.laplace stops at ~16.6 in float32
  assert e[0] > 16.6 + 15


def _tail_words(seed: int, n: int) -> tuple[jax.Array, jax.Array]:
  """Random word pairs conditioned on the top 23 bits of word 0 being zero (U <= 2^-23)."""
  w = jax.random.bits(jax.random.key(seed), (2, n), jnp.uint32)
  return w[0] & jnp.uint32(511), w[1]


def test_normal_radius_uniform_support_reaches_41_ln2():
  from jaxdp.mechanisms import _sampling
  # U = (hi + (mid + 1) 2^-18) 2^-23 with hi = word0 >> 9, mid = (word0 & 511) << 9 | (word1 & 511)
  w0 = jnp.array([0, 0, 1, 511, (1 << 9), 0xFFFFFFFF], jnp.uint32)
  w1 = jnp.array([0, 1, 0, 511, 0, 0xFFFFFFFF], jnp.uint32)
  u = np.asarray(_sampling.radius_uniform_from_bits(w0, w1, jnp.float32), np.float64)
  expected = np.array([1, 2, 2**9 + 1, 2**18, 2**18 + 1, 2**41], np.float64) * 2.0**-41
  np.testing.assert_allclose(u, expected, rtol=2**-23)
  np.testing.assert_array_equal(u[:4], expected[:4])  # exact in the tail (hi = 0)
  z_cos, _ = _sampling.normal_pairs_from_bits(jnp.zeros(1, jnp.uint32), jnp.zeros(1, jnp.uint32),
                                              jnp.float32)
  # the largest Box-Muller radius, at the smallest angle (pi 2^-23): sqrt(2 * 41 ln 2) = 7.539,
  # beyond jax.random.normal's float32 bound of ~5.42
  assert float(z_cos[0]) == pytest.approx(math.sqrt(82 * math.log(2)), rel=1e-6)
  assert float(z_cos[0]) > 7.5


def test_normal_tail_law_beyond_jax_random_normal_bound():
  """Conditioned on U <= 2^-23 (radius >= 5.65 > 5.42): R^2/2 - 23 ln 2 ~ Exp(1), reaching R > 7.

  Feeds the exact transform of ``gaussian_noise`` with random words whose top 23
  bits are zero, i.e. samples the sampler's own tail region, which a truncated
  sampler (``jax.random.normal`` stops at 5.42) or one that drops the low
  bits of ``U`` would not reproduce.
  """
  from jaxdp.mechanisms import _sampling
  n = 100_000
  w0, w1 = _tail_words(40, n)
  z_cos, z_sin = _sampling.normal_pairs_from_bits(w0, w1, jnp.float32)
  r2 = np.asarray(z_cos, np.float64) ** 2 + np.asarray(z_sin, np.float64) ** 2
  excess = r2 / 2 - 23 * math.log(2)
  assert excess.min() >= -1e-4
  # the law is Exp(1) truncated at 18 ln 2 (mass 4e-6 beyond), on a 2^-18 grid
  assert stats.kstest(excess, stats.expon().cdf).pvalue > P_FLOOR
  assert stats.kstest(excess, stats.expon(scale=1.05).cdf).pvalue < P_FLOOR
  # P(R > 7 | U <= 2^-23) = exp(-(24.5 - 23 ln 2)) = 1.9e-4: ~19 hits expected, P(none) = e^-19
  p = math.exp(-(24.5 - 23 * math.log(2)))
  hits = np.sqrt(r2) > 7.0
  assert hits.any()
  _assert_prob(hits, p)
  # and the angle stays uniform in the tail: cos^2 ~ Beta(1/2, 1/2) (arcsine law)
  c2 = np.asarray(z_cos, np.float64) ** 2 / r2
  assert stats.kstest(c2, stats.beta(0.5, 0.5).cdf).pvalue > P_FLOOR


def test_cos_sin_from_bits_accuracy_and_uniform_angle():
  from jaxdp.mechanisms import _sampling
  a = jnp.arange(0, 1 << 23, 3, dtype=jnp.uint32)
  f = jax.jit(lambda w: _sampling.cos_sin_from_bits(w, jnp.float32))
  c, s = f(a << 9)
  angle = (np.asarray(a, np.float64) + 0.5) * (2 * np.pi * 2.0**-23)
  assert np.max(np.abs(np.asarray(c, np.float64) - np.cos(angle))) < 2e-7
  assert np.max(np.abs(np.asarray(s, np.float64) - np.sin(angle))) < 2e-7
  # never exactly 0 (the grid is offset by half a step from the multiples of pi/2)
  quarter = jnp.array([0, 1 << 21, 2 << 21, 3 << 21, (1 << 23) - 1], jnp.uint32)
  cq, sq = f(quarter << 9)
  assert np.all(np.asarray(cq) != 0) and np.all(np.asarray(sq) != 0)
  # the low 9 bits (used by the radius) do not move the angle
  c2, s2 = f((a << 9) | jnp.uint32(511))
  np.testing.assert_array_equal(np.asarray(c2), np.asarray(c))
  np.testing.assert_array_equal(np.asarray(s2), np.asarray(s))


def test_gaussian_tail_frequencies_and_layout():
  n = 2_000_000
  x = np.asarray(mech.gaussian_noise(jax.random.key(41), (n,), 1.0))
  for t in (3.0, 3.5, 4.0):  # ~5400, 930, 127 expected exceedances
    _assert_prob(np.abs(x) > t, 2 * stats.norm.sf(t))
  # one word per output: cosine half then sine half along the first even axis;
  # odd sizes: (2, ceil(n/2)) words, flat cosine half then the first sines
  from jaxdp.mechanisms import _sampling
  key = jax.random.key(42)
  zc, zs = _sampling.normal_pairs_from_bits(*_sampling.threefry_word_pairs(key, (4,)), jnp.float32)
  np.testing.assert_allclose(np.asarray(mech.gaussian_noise(key, (7,), 1.0)),
                             np.concatenate([np.asarray(zc), np.asarray(zs)[:3]]), rtol=1e-6)
  zc, zs = _sampling.normal_pairs_from_bits(*_sampling.threefry_word_pairs(key, (3, 2, 5)),
                                            jnp.float32)
  np.testing.assert_allclose(np.asarray(mech.gaussian_noise(key, (3, 4, 5), 1.0)),
                             np.concatenate([np.asarray(zc), np.asarray(zs)], axis=1), rtol=1e-6)


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


def test_threefry_word_pairs_are_uniform_independent_and_keyed():
  """Both output words of each Threefry block: uniform bytes, uncorrelated, one stream per key."""
  from jaxdp.mechanisms import _sampling
  n = 200_000
  w0, w1 = _sampling.threefry_word_pairs(jax.random.key(50), (n,))
  w0, w1 = np.asarray(w0), np.asarray(w1)
  assert w0.dtype == np.uint32 and w0.shape == (n,)
  for w in (w0, w1):
    for shift in (0, 8, 16, 24):  # every byte uniform on 256 values
      counts = np.bincount((w >> shift) & 255, minlength=256)
      assert stats.chisquare(counts).pvalue > P_FLOOR
  # the two words of a block are independent: their top bytes' joint table is uniform
  joint = np.bincount(((w0 >> 28) << 4) | (w1 >> 28), minlength=256)
  assert stats.chisquare(joint).pvalue > P_FLOOR
  u0, u1 = w0 / 2.0**32 - 0.5, w1 / 2.0**32 - 0.5
  assert abs(np.mean(u0 * u1)) < Z_TOL / 12 / math.sqrt(n)
  # deterministic per key, different keys differ, odd sizes and legacy keys work
  a0, _ = _sampling.threefry_word_pairs(jax.random.key(50), (n,))
  np.testing.assert_array_equal(np.asarray(a0), w0)
  b0, _ = _sampling.threefry_word_pairs(jax.random.key(51), (n,))
  assert np.mean(np.asarray(b0) == w0) < 1e-3
  odd0, odd1 = _sampling.threefry_word_pairs(jax.random.PRNGKey(3), (3, 5))
  assert odd0.shape == odd1.shape == (3, 5)
  # another PRNG implementation falls back to jax.random.bits
  r0, r1 = _sampling.threefry_word_pairs(jax.random.key(0, impl="rbg"), (6,))
  assert r0.shape == r1.shape == (6,)
  # vmap over keys equals the loop over keys
  keys = _keys(52, 3)
  batched = jax.vmap(lambda k: _sampling.threefry_word_pairs(k, (8,))[1])(keys)
  looped = np.stack([np.asarray(_sampling.threefry_word_pairs(k, (8,))[1]) for k in keys])
  np.testing.assert_array_equal(np.asarray(batched), looped)


def test_one_dimensional_l2_laplace_never_nan():
  """Regression: a 1-D direction g/|g| was 0/0 = NaN when the Box-Muller angle hit a multiple of
  pi/2 exactly (probability 2^-22 per draw; key 7's second half, draw 194599 of 200,000)."""
  _, k2 = jax.random.split(jax.random.key(7))
  keys = jax.random.split(k2, 200_000)
  d = np.asarray(jax.jit(jax.vmap(lambda k: mech.uniform_direction(k, (1,))))(keys))[:, 0]
  assert np.all(np.abs(d) == 1.0)
  assert np.isfinite(d[194_599])
  _assert_prob(d > 0, 0.5)
