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


@pytest.mark.parametrize("dim,n,wrong", [
    (1, 50_000, None), (10, 50_000, None), (7840, 1_000, 1.006),
    pytest.param(7840, 5_000, 1.002, marks=pytest.mark.slow)])
def test_l2_laplace_radius_is_gamma(dim, n, wrong):
  """||b|| ~ Gamma(dim, scale 1/beta); float32 sampling stays accurate at dim 7840."""
  beta = 3.0
  r = jax.jit(jax.vmap(lambda k: mech.l2_laplace_radius(k, (dim,), beta)))(_keys(10 + dim, n))
  r = np.asarray(r, np.float64)
  law = stats.gamma(a=dim, scale=1.0 / beta)
  assert stats.kstest(r, law.cdf).pvalue > P_FLOOR
  _assert_mean(r, dim / beta, math.sqrt(dim) / beta)
  # Variance dim/beta^2; Var((r - m)^2) = E(r-m)^4 - var^2 = (3 var^2 + 6 dim/beta^4) - var^2.
  var = dim / beta**2
  _assert_mean((r - dim / beta) ** 2, var, math.sqrt(2 * var**2 + 6 * dim / beta**4))
  # A relative error ``wrong - 1`` in the radius scale is caught for dim 7840: it
  # shifts the mean by (wrong - 1) sqrt(dim) sd. Slow variant: 0.2% at n = 5000
  # (0.18 sd: expected KS distance 0.07 against a critical 0.032 at p = 1e-4; a
  # 0.1% error sits right at the critical value, so whether it was caught
  # depended on the seed). Always-on variant: 0.6% at n = 1000 (0.53 sd:
  # expected KS distance 0.21 against a critical sqrt(ln(2/p)/(2n)) = 0.070).
  # So float32 accumulation of the radius (a sum of dim exponentials) is accurate.
  if wrong is not None:
    assert stats.kstest(r, stats.gamma(a=dim, scale=wrong / beta).cdf).pvalue < P_FLOOR


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


LAPLACE_WIDTHS = (31, 32, 32, 32)  # sign bit + 127-bit uniform (laplace_from_words)
GAUSSIAN_WIDTHS = (9, 32, 32, 32)  # 105-bit radius uniform (normal_pairs_from_words)


def _chunks_with_leading_zeros(seed, n, widths, zeros):
  """Random chunks of the given widths with the first ``zeros`` chunks set to 0."""
  w = np.asarray(jax.random.bits(jax.random.key(seed), (len(widths), n), jnp.uint32))
  w = [np.zeros(n, np.uint32) if j < zeros else w[j] >> np.uint32(32 - width)
       for j, width in enumerate(widths)]
  return w


def _exact_exponential(chunks, widths):
  """-log((N + 1) 2^-B) in float64 from Python integers (N = the concatenated chunks)."""
  out = []
  bits = sum(widths)
  for values in zip(*chunks):
    n = 0
    for v, width in zip(values, widths):
      n = (n << width) | int(v)
    if 2 * (n + 1) > 2**bits:  # U > 1/2: -log1p(-(1 - U)) avoids float64 cancellation
      out.append(-math.log1p(-((2**bits - 1 - n) / 2**bits)))
    else:
      out.append(bits * math.log(2) - math.log(n + 1))
  return np.array(out)


@pytest.mark.parametrize("widths", [LAPLACE_WIDTHS, GAUSSIAN_WIDTHS])
def test_exponential_from_words_is_minus_log_of_the_multiword_uniform(widths):
  """At every level (first non-zero chunk j = 0..3) the float32 value is -log((N+1) 2^-B)."""
  from jaxdp.mechanisms import _sampling
  f = jax.jit(lambda c: _sampling.exponential_from_words(list(zip(c, widths)), jnp.float32))
  for zeros in range(4):
    chunks = _chunks_with_leading_zeros(60 + zeros, 400, widths, zeros)
    got = np.asarray(f([jnp.asarray(c) for c in chunks]), np.float64)
    np.testing.assert_allclose(got, _exact_exponential(chunks, widths), rtol=3e-7, atol=2e-7)
  # the extremes: N = 0 gives the cut B ln 2; N = 2^B - 1 gives 0
  zero = [jnp.zeros(1, jnp.uint32)] * 4
  full = [jnp.full(1, (1 << w) - 1, jnp.uint32) for w in widths]
  assert float(f(zero)[0]) == pytest.approx(sum(widths) * math.log(2), rel=1e-6)
  assert float(f(full)[0]) == 0.0


@pytest.mark.parametrize("widths", [LAPLACE_WIDTHS, GAUSSIAN_WIDTHS])
def test_exponential_near_one_is_not_rounded_to_zero(widths):
  """U within 2^-24 of 1 rounds to 1.0 in float32; E = -log U must still be its exact value > 0.

  Regression: the top chunk all ones and a second chunk above 2^32 - 2^16 gave
  E = 0, a zero Box-Muller radius, and a NaN one-coordinate L2-Laplace direction
  (about 1 key in 3e7; key 122943 of split(split(key(7))[0], 200000) hit it).
  """
  from jaxdp.mechanisms import _sampling
  f = jax.jit(lambda c: _sampling.exponential_from_words(list(zip(c, widths)), jnp.float32))
  top = (1 << widths[0]) - 1
  chunks = [np.array([top, top, top], np.uint32),
            np.array([0xFFFF3B13, 0xFFFFFFFF, 0xFFFFFFFF], np.uint32),
            np.array([0x9320953B, 0x12345678, 0xFFFFFFFF], np.uint32),
            np.array([0xC0FF7B83, 0x9ABCDEF0, 0xFFFFFF00], np.uint32)]
  got = np.asarray(f([jnp.asarray(c) for c in chunks]), np.float64)
  np.testing.assert_allclose(got, _exact_exponential(chunks, widths), rtol=3e-7)
  assert np.all(got > 0)
  # the sampler that showed it: a one-coordinate direction is never 0/0
  key = jax.random.split(jax.random.split(jax.random.key(7))[0], 200_000)[122943]
  assert np.all(np.isfinite(np.asarray(mech.l2_laplace_noise(key, (1,), 1.0))))


def test_samplers_reach_far_beyond_the_old_cuts():
  """Crafted bits: |Lap(1)| reaches 127 ln 2 = 88.03 (was 31.9), |N(0,1)| 12.06 (was 7.54)."""
  from jaxdp.mechanisms import _sampling
  zero = jnp.zeros(1, jnp.uint32)
  top = jnp.full(1, 1 << 31, jnp.uint32)
  # Each transform one compiled program (op by op, every primitive compiles on its own).
  laplace = jax.jit(lambda w: _sampling.laplace_from_words(w, jnp.float32))
  lap_pos = float(laplace([top, zero, zero, zero])[0])
  lap_neg = float(laplace([zero, zero, zero, zero])[0])
  assert lap_pos == pytest.approx(_sampling.LAPLACE_CUT, rel=1e-6) and lap_neg == -lap_pos
  assert _sampling.LAPLACE_CUT == pytest.approx(88.0297, abs=1e-4) and lap_pos > 31.9 + 50
  z_cos, z_sin = jax.jit(lambda w: _sampling.normal_pairs_from_words(w, jnp.float32))([zero] * 4)
  radius = math.hypot(float(z_cos[0]), float(z_sin[0]))
  assert radius == pytest.approx(_sampling.GAUSSIAN_CUT, rel=1e-6)
  assert _sampling.GAUSSIAN_CUT == pytest.approx(12.0649, abs=1e-4) and float(z_cos[0]) > 12.0
  # the tail mass beyond each cut is the mass of the smallest uniform atom
  assert math.exp(-_sampling.LAPLACE_CUT) == pytest.approx(_sampling.LAPLACE_TAIL_PROB, rel=1e-12)
  assert math.exp(-_sampling.GAUSSIAN_CUT**2 / 2) == pytest.approx(
      _sampling.GAUSSIAN_TAIL_PROB, rel=1e-12)
  assert _sampling.LAPLACE_TAIL_PROB < 1e-38 and _sampling.GAUSSIAN_TAIL_PROB < 3e-32
  # gamma summands: 128 bits each
  assert float(jax.jit(lambda w: _sampling.exponential_from_words(
      [(c, 32) for c in w], jnp.float32))([zero] * 4)[0]) == (
      pytest.approx(128 * math.log(2), rel=1e-6))


@pytest.mark.parametrize("zeros", [1, 2, 3])
def test_laplace_tail_law_beyond_each_word(zeros):
  """Conditioned on the first ``zeros`` chunks being 0, E - (their width) ln 2 ~ Exp(1).

  Feeds the exact transform of ``laplace_noise`` with random words whose leading
  bits are zero, i.e. samples the sampler's own tail region (beyond 21.5, 43.7
  and 65.9 scales), which a truncated sampler (the old 46-bit one stops at 31.9)
  or one that drops low-order words would not reproduce.
  """
  from jaxdp.mechanisms import _sampling
  n = 20_000
  chunks = _chunks_with_leading_zeros(70 + zeros, n, LAPLACE_WIDTHS, zeros)
  shift = sum(LAPLACE_WIDTHS[:zeros]) * math.log(2)
  # Jitted, as the samplers run it: one compiled program (shared by the three cases), not one
  # per primitive.
  transform = jax.jit(lambda cs: _sampling.exponential_from_words(
      list(zip(cs, LAPLACE_WIDTHS)), jnp.float32))
  e = np.asarray(transform([jnp.asarray(c) for c in chunks]), np.float64)
  excess = e - shift
  assert excess.min() >= -1e-4  # every value lies beyond shift (43.7 and 65.9 exceed the old 31.9)
  assert stats.kstest(excess, stats.expon().cdf).pvalue > P_FLOOR
  assert stats.kstest(excess, stats.expon(scale=1.05).cdf).pvalue < P_FLOOR


def test_normal_tail_law_beyond_the_old_bound():
  """Conditioned on the first 41 radius bits being 0 (R >= 7.54, the old cut): R^2/2 - 41 ln 2 ~ Exp(1).

  The angle stays uniform in the tail: cos^2 ~ Beta(1/2, 1/2) (arcsine law).
  """
  from jaxdp.mechanisms import _sampling
  n = 20_000
  w = np.asarray(jax.random.bits(jax.random.key(80), (4, n), jnp.uint32))
  words = [jnp.zeros(n, jnp.uint32), jnp.asarray(w[1]), jnp.asarray(w[2]),
           jnp.asarray(w[3] & np.uint32(0xFFFFFE00))]  # radius chunks (9, 32, ...) = (0, 0, ...)
  # Jitted, as the samplers run it (one compiled program, not one per primitive).
  z_cos, z_sin = jax.jit(lambda ws: _sampling.normal_pairs_from_words(ws, jnp.float32))(words)
  r2 = np.asarray(z_cos, np.float64) ** 2 + np.asarray(z_sin, np.float64) ** 2
  excess = r2 / 2 - 41 * math.log(2)
  assert excess.min() >= -1e-4 and np.sqrt(r2).min() >= 7.5
  assert stats.kstest(excess, stats.expon().cdf).pvalue > P_FLOOR
  assert stats.kstest(excess, stats.expon(scale=1.05).cdf).pvalue < P_FLOOR
  c2 = np.asarray(z_cos, np.float64) ** 2 / r2
  assert stats.kstest(c2, stats.beta(0.5, 0.5).cdf).pvalue > P_FLOOR


def _capped_laplace_hockey_stick(cut, shift, epsilon, grid=400_001):
  """sup_S P(S) - e^eps Q(S) for P = sign * min(Exp(1), cut), Q = P + shift (shift >= 0).

  The real-arithmetic model of the sampler: Laplace density on (-cut, cut) and
  atoms e^-cut/2 at +-cut. Computed numerically on a fine grid plus the atoms.
  """
  lo, hi = -cut, cut + shift
  x = np.linspace(lo, hi, grid)
  dx = x[1] - x[0]
  dens = lambda z, c: np.where(np.abs(z - c) < cut, 0.5 * np.exp(-np.abs(z - c)), 0.0)
  cont = np.sum(np.maximum(dens(x, 0.0) - math.exp(epsilon) * dens(x, shift), 0.0)) * dx
  atom = 0.5 * math.exp(-cut)
  # P's atoms at -cut and +cut are not atoms of Q (shift > 0): both count fully
  return cont + 2 * atom


@pytest.mark.parametrize("shift", [0.3, 1.0])
def test_stated_tail_delta_bounds_the_capped_laplace_privacy_loss(shift):
  """The formal statement of _sampling's docstring, checked on a scaled-down cut.

  With the sampler's cut at C (here C = 8 ln 2 so the numbers are visible), a
  pure eps-DP Laplace release (eps = shift / b) is (eps, delta)-DP with
  delta <= (d - 1 + e^eps) e^-C (d = 1) <= tail_delta's (1 + e^eps) e^-C, and
  NOT (eps, 0)-DP: the exact delta is e^-C (1 + e^eps)/2 > 0.
  """
  from jaxdp.mechanisms import _sampling
  cut = 8 * math.log(2)
  eps = shift
  delta = _capped_laplace_hockey_stick(cut, shift, eps)
  assert delta == pytest.approx(math.exp(-cut) * (1 + math.exp(eps)) / 2, rel=1e-3)
  assert delta <= math.exp(eps) * math.exp(-cut)
  assert delta > 0.5 * math.exp(-cut)  # truncation is never pure DP
  # tail_delta's generic bound, here with the real 127-bit cut for one coordinate
  assert _sampling.tail_delta(eps, laplace_coordinates=1) == pytest.approx(
      (1 + math.exp(eps)) * 2.0**-127, rel=1e-12)
  # the docstring's example: 2^50 Gaussian coordinates (2^49 pairs), tau = 2^-56
  assert _sampling.tail_delta(1.0, gaussian_coordinates=2**50) == pytest.approx(
      (1 + math.e) * 2.0**-56, rel=1e-12)
  assert _sampling.tail_delta(1.0, gaussian_coordinates=2**50) < 6e-17
  assert _sampling.tail_delta(10.0, gaussian_coordinates=2**50) < 4e-13


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


@pytest.mark.parametrize("n", [200_000, pytest.param(2_000_000, marks=pytest.mark.slow)])
def test_gaussian_tail_frequencies_and_layout(n):
  x = np.asarray(mech.gaussian_noise(jax.random.key(41), (n,), 1.0))
  # n = 2e6: ~5400, 930, 127 expected exceedances; n = 2e5: ~540, 93, 13 (the
  # Z_TOL-standard-error band is derived from n in _assert_prob)
  for t in (3.0, 3.5, 4.0):
    _assert_prob(np.abs(x) > t, 2 * stats.norm.sf(t))
  # one word per output: cosine half then sine half along the first even axis;
  # odd sizes: (2, ceil(n/2)) words, flat cosine half then the first sines
  from jaxdp.mechanisms import _sampling
  key = jax.random.key(42)
  # The words and their transform as one compiled program per shape (not op by op).
  pairs = jax.jit(lambda k, shape: _sampling.normal_pairs_from_words(
      _sampling._four_words(k, shape), jnp.float32), static_argnums=1)
  zc, zs = pairs(key, (4,))
  np.testing.assert_allclose(np.asarray(mech.gaussian_noise(key, (7,), 1.0)),
                             np.concatenate([np.asarray(zc), np.asarray(zs)[:3]]), rtol=1e-6)
  zc, zs = pairs(key, (3, 2, 5))
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
  # Jitted, as the samplers run it: one compiled program per key type and shape, not one per
  # primitive.
  word_pairs = jax.jit(_sampling.threefry_word_pairs, static_argnums=1)
  n = 200_000
  w0, w1 = word_pairs(jax.random.key(50), (n,))
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
  a0, _ = word_pairs(jax.random.key(50), (n,))
  np.testing.assert_array_equal(np.asarray(a0), w0)
  b0, _ = word_pairs(jax.random.key(51), (n,))
  assert np.mean(np.asarray(b0) == w0) < 1e-3
  odd0, odd1 = word_pairs(jax.random.PRNGKey(3), (3, 5))
  assert odd0.shape == odd1.shape == (3, 5)
  # another PRNG implementation falls back to jax.random.bits
  r0, r1 = word_pairs(jax.random.key(0, impl="rbg"), (6,))
  assert r0.shape == r1.shape == (6,)
  # vmap over keys equals the loop over keys
  keys = _keys(52, 3)
  batched = jax.jit(jax.vmap(lambda k: _sampling.threefry_word_pairs(k, (8,))[1]))(keys)
  looped = np.stack([np.asarray(word_pairs(k, (8,))[1]) for k in keys])
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


# ------------------------------------------------------------------ fused Threefry and layout


def test_threefry2x32_known_answers_and_primitive():
  """The written-out Threefry-2x32-20 matches Random123's known-answer vectors (Salmon et al.
  2011) and JAX's threefry2x32 primitive bit for bit, including under vmap over keys."""
  from jax.extend.random import threefry2x32_p
  from jaxdp.mechanisms import _sampling
  u32 = lambda *v: jnp.array(v, jnp.uint32)
  # (key, counter) -> output, Random123 kat_vectors for threefry2x32_20
  kat = [((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
         ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
         ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0))]
  for (k0, k1), (x0, x1), want in kat:
    got = jax.jit(_sampling.threefry2x32)(u32(k0), u32(k1), u32(x0), u32(x1))
    assert (int(got[0][0]), int(got[1][0])) == want
  w = jax.random.bits(jax.random.key(90), (4, 4096), jnp.uint32)
  got = jax.jit(jax.vmap(_sampling.threefry2x32))(w[0], w[1], w[2], w[3])
  want = threefry2x32_p.bind(w[0], w[1], w[2], w[3])
  for g, h in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(h))


@pytest.mark.parametrize("shape", [(3, 5), (6, 3), (3, 4, 5)])
def test_standard_normal_layout_is_the_concatenation_of_the_pair_halves(shape):
  """Bit for bit: cosine half then sine half along the first axis of length 0 mod 4 (else the
  first even axis), or flat for odd sizes; identical eagerly and under jit + vmap."""
  from jaxdp.mechanisms import _sampling
  key = jax.random.key(43)
  even = ([i for i, d in enumerate(shape) if d % 4 == 0]
          + [i for i, d in enumerate(shape) if d % 4 == 2])
  pairs = jax.jit(lambda k, s: _sampling.normal_pairs_from_words(_sampling._four_words(k, s),
                                                                  jnp.float32), static_argnums=1)
  if even:
    axis = even[0]
    zc, zs = pairs(key, shape[:axis] + (shape[axis] // 2,) + shape[axis + 1:])
    want = np.concatenate([np.asarray(zc), np.asarray(zs)], axis=axis)
  else:
    size = int(np.prod(shape))
    zc, zs = pairs(key, ((size + 1) // 2,))
    want = np.concatenate([np.asarray(zc), np.asarray(zs)])[:size].reshape(shape)
  got = _sampling.standard_normal(key, shape, jnp.float32)
  np.testing.assert_array_equal(np.asarray(got), want)
  keys = jnp.stack([key, jax.random.key(44)])
  batched = jax.jit(jax.vmap(lambda k: _sampling.standard_normal(k, shape, jnp.float32)))(keys)
  np.testing.assert_array_equal(np.asarray(batched[0]), want)
  np.testing.assert_array_equal(np.asarray(batched[1]),
                                np.asarray(_sampling.standard_normal(keys[1], shape, jnp.float32)))


def test_odd_sizes_padded_layout_is_bit_identical():
  """Odd sizes, and Box-Muller with an odd number of pairs, are computed on a length padded to a
  multiple of 8 and scattered into place: bit for bit the unpadded words and outputs (normal and
  Laplace)."""
  from jaxdp.mechanisms import _sampling
  key, f32 = jax.random.key(46), jnp.float32
  pairs = jax.jit(lambda k, s: _sampling.normal_pairs_from_words(_sampling._four_words(k, s), f32),
                  static_argnums=1)
  zc, zs = pairs(key, (501,))  # (1001,): 501 pairs (odd), the last sine dropped
  want = np.concatenate([np.asarray(zc), np.asarray(zs)])[:1001]
  np.testing.assert_array_equal(np.asarray(_sampling.standard_normal(key, (1001,), f32)), want)
  # (jit + vmap, and even sizes with an odd number of pairs, e.g. (6, 3): the layout test above)
  lap = jax.jit(lambda k: _sampling.laplace_from_words(_sampling._four_words(k, (7, 9)), f32))
  np.testing.assert_array_equal(np.asarray(_sampling.standard_laplace(key, (7, 9), f32)),
                                np.asarray(lap(key)))


@pytest.mark.parametrize("n", [200_000, pytest.param(1_000_000, marks=pytest.mark.slow)])
def test_standard_normal_law_pairs_and_related_keys(n):
  """N(0, 1) moments and KS; the two halves of each pair and draws under fold_in-related keys
  (the per-step keys of a training loop) are uncorrelated, in values and in squares."""
  from jaxdp.mechanisms import _sampling
  key = jax.random.key(45)
  x = np.asarray(_sampling.standard_normal(key, (n,), jnp.float32), np.float64)
  np.testing.assert_array_equal(x, np.asarray(_sampling.standard_normal(key, (n,), jnp.float32)))
  _assert_mean(x, 0.0, 1.0)
  _assert_mean(x**2, 1.0, math.sqrt(2.0))
  _assert_mean(x**4, 3.0, math.sqrt(96.0))
  assert stats.kstest(x, stats.norm.cdf).pvalue > P_FLOOR
  assert stats.kstest(x, stats.norm(scale=1.05).cdf).pvalue < P_FLOOR
  m = n // 2
  related = [np.asarray(_sampling.standard_normal(jax.random.fold_in(key, i), (n,), jnp.float32),
                        np.float64) for i in (1, 2)]
  # (cos, sin) halves of each pair; step i vs step i + 1 and vs the parent key, same positions
  for a, b in [(x[:m], x[m:]), (x, related[0]), (related[0], related[1])]:
    # corr of values and of squares: sd 1/sqrt(len) for independent N(0, 1) pairs
    assert abs(np.mean(a * b)) < Z_TOL / math.sqrt(a.size)
    sq = np.mean((a**2 - 1) * (b**2 - 1)) / 2.0
    assert abs(sq) < Z_TOL / math.sqrt(a.size)
  assert np.mean(x == related[0]) < 1e-3
