"""jaxdp.inference.mixture_quantiles: exact quantiles of the laws Algorithms 3 and 5 sample."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special, stats

from jaxdp.inference import mixture_quantiles as mq
from jaxdp.mechanisms.l2_laplace import l2_laplace_noise

Z975 = stats.norm.ppf(0.975)


@functools.lru_cache(maxsize=None)
def _half_widths_jit(dim, alpha, num_nodes, compute_dtype):
  """``interval_half_widths`` as ONE compiled program per configuration (op-by-op eager
  dispatch compiles every primitive of the root search separately)."""
  kw = {} if num_nodes is None else dict(num_nodes=num_nodes)
  return jax.jit(lambda a, mixing: mq.interval_half_widths(
      a, mixing, dim=dim, alpha=alpha, gaussian_z=float(stats.norm.ppf(1 - alpha / 2)),
      compute_dtype=compute_dtype, **kw))


def _half_widths(a, mixing, dim, alpha=0.05, num_nodes=None, compute_dtype=jnp.float32):
  with jax.enable_x64(True):
    fn = _half_widths_jit(dim, alpha, num_nodes, compute_dtype)
    out = fn(jnp.asarray(a, jnp.float64), tuple(jnp.asarray(c, jnp.float64) for c in mixing))
    return np.asarray(out)


def test_chi2_rule_is_exact_for_low_moments():
  for dof in (2, 6, 12):
    v, w = mq.chi2_rule(dof, 24)
    assert abs(w.sum() - 1) < 1e-12
    for k in range(1, 6):  # E V^k = prod_{i<k} (dof + 2i)
      want = np.prod([dof + 2 * i for i in range(k)])
      assert abs(np.dot(w, v ** k) / want - 1) < 1e-10


@pytest.mark.parametrize("m", [5000, pytest.param(20000, marks=pytest.mark.slow)])
def test_l2_laplace_is_the_chi2_scale_mixture_of_gaussians(m):
  """sqrt(V) G with V ~ chi^2_{d+1} has the radius law Gamma(d) of exp(-||b||) (KS, fixed seed)."""
  d = 5
  rng = np.random.default_rng(0)
  mix = np.sqrt(rng.chisquare(d + 1, size=m))[:, None] * rng.normal(size=(m, d))
  with jax.enable_x64(True):
    lib = np.asarray(jax.jit(jax.vmap(lambda k: l2_laplace_noise(k, (d,), 1.0, jnp.float64)))(
        jax.random.split(jax.random.key(0), m)))
  for sample in (mix, lib):
    assert stats.kstest(np.linalg.norm(sample, axis=1), stats.gamma(d).cdf).pvalue > 1e-3
  # One coordinate of both (the law the intervals use): two-sample KS.
  assert stats.ks_2samp(mix[:, 0], lib[:, 0]).pvalue > 1e-3
  # The test can fail: a wrong number of degrees of freedom is rejected.
  wrong = np.sqrt(rng.chisquare(d, size=m))[:, None] * rng.normal(size=(m, d))
  assert stats.kstest(np.linalg.norm(wrong, axis=1), stats.gamma(d).cdf).pvalue < 1e-6


# Each point costs one adaptive 2-D quadrature (seconds): two always-on points (both
# mixture components present; the Gaussian part absent), the rest under ``slow``.
@pytest.mark.parametrize("a,b,c", [
    pytest.param(1.0, 0.1, 0.01, marks=pytest.mark.slow), (1.0, 1.0, 1.0),
    pytest.param(0.01, 1.0, 0.0, marks=pytest.mark.slow),
    pytest.param(1e-4, 1.0, 0.3, marks=pytest.mark.slow),
    pytest.param(1.0, 0.0, 0.5, marks=pytest.mark.slow), (0.0, 1.0, 0.0)])
def test_tail_probability_matches_adaptive_quadrature(a, b, c):
  d = 11
  q = float(_half_widths([a], ([b], [c]), d)[0])
  # chi^2_{d+1} density written out, and Phi(-t) for the normal tail: the same values as
  # scipy's frozen ``stats.gamma((d + 1)/2, scale=2).pdf`` and ``stats.norm.sf`` (both are
  # checked below), at a fraction of the per-call cost of the quadrature's ~10^5 calls.
  k = (d + 1) / 2
  log_norm = -k * math.log(2.0) - math.lgamma(k)
  pdf = lambda u: math.exp(log_norm + (k - 1) * math.log(u) - u / 2) if u > 0 else 0.0
  gam = stats.gamma(k, scale=2.0)
  for u in (0.5, 12.0, 140.0):
    assert pdf(u) == pytest.approx(gam.pdf(u), rel=1e-12)
  assert special.ndtr(-2.0) == stats.norm.sf(2.0)
  integrand = lambda u, v: special.ndtr(-q / math.sqrt(a + b * u + c * v)) * pdf(u) * pdf(v)
  # P(chi^2_12 > 150) < 1e-25: the truncation is far below the tolerance.
  tail = integrate.dblquad(integrand, 0, 150, 0, 150, epsabs=1e-11, epsrel=1e-9)[0]
  assert abs(tail - 0.025) < 2e-7


def test_gaussian_only_and_degenerate_coordinates():
  got = _half_widths([4.0, 0.0, 1e-30], (), 3)
  np.testing.assert_allclose(got, [2 * Z975, 0.0, 1e-15 * Z975], rtol=1e-6)
  got = _half_widths([1.0, 0.0], ([0.0, 0.0],), 3)
  np.testing.assert_allclose(got, [Z975, 0.0], rtol=1e-6)


@pytest.mark.parametrize("m", [300_000, pytest.param(1_000_000, marks=pytest.mark.slow)])
def test_quantiles_match_monte_carlo_of_the_algorithm_3_law(m):
  """T = H^-1 (G + b/sqrt n)/sqrt n - Z, drawn with the library's samplers; m draws.

  At the computed q, the empirical tail frequency of each coordinate is Binomial(m, 0.025)/m
  if q is right: it must be within 4.5 binomial sds (both tails, all coordinates). The
  always-on m = 3 10^5 still rejects 2% narrower half-widths (the tail moves by ~2e-3,
  above 4.5 sd = 1.3e-3); 10^6 under ``slow``.
  """
  d, n = 4, 400.0
  rng = np.random.default_rng(1)
  a_mat = rng.normal(size=(d, d))
  h = a_mat @ a_mat.T / d + 0.5 * np.eye(d)
  sigma = np.diag([0.3, 0.1, 0.05, 0.2])
  gamma, beta_z = 0.02, 2.0
  h_inv = np.linalg.inv(h)
  a = np.diag(h_inv @ sigma @ h_inv) / n
  b = np.sum(h_inv * h_inv, axis=0) / (gamma * n) ** 2
  q = _half_widths(a, (b, np.full(d, beta_z ** -2.0)), d)
  with jax.enable_x64(True):
    k1, k2, k3 = jax.random.split(jax.random.key(7), 3)
    g = np.asarray(jax.random.multivariate_normal(k1, jnp.zeros(d), jnp.asarray(sigma), (m,)))
    # One compiled program for both draws (beta is an argument, not a constant).
    draw_jit = jax.jit(lambda keys, beta: jax.vmap(lambda kk: l2_laplace_noise(
        kk, (d,), beta, jnp.float64))(keys))
    draw = lambda k, beta: np.asarray(draw_jit(jax.random.split(k, m), jnp.float64(beta)))
    t = (g + draw(k2, gamma) / math.sqrt(n)) @ h_inv / math.sqrt(n) - draw(k3, beta_z)
  sd = math.sqrt(0.025 * 0.975 / m)
  for freq in (np.mean(t > q, axis=0), np.mean(t < -q, axis=0)):
    assert np.all(np.abs(freq - 0.025) < 4.5 * sd), (freq, q)
  # And it can fail: 2% narrower half-widths are rejected on every coordinate.
  assert np.all(np.mean(t > 0.98 * q, axis=0) - 0.025 > 4.5 * sd)


def test_quantile_is_accurate_in_float64_and_float32():
  a, mixing = [0.3, 2.0], ([0.5, 0.01], [0.02, 0.02])
  q32 = _half_widths(a, mixing, 6)
  q64 = _half_widths(a, mixing, 6, compute_dtype=jnp.float64)
  np.testing.assert_allclose(q32, q64, rtol=2e-6)
  # More nodes do not move it (the rule has converged).
  np.testing.assert_allclose(_half_widths(a, mixing, 6, num_nodes=48,
                                          compute_dtype=jnp.float64), q64, rtol=1e-8)


def test_chi2_rule_validation():
  with pytest.raises(ValueError):
    mq.chi2_rule(0, 10)
  with pytest.raises(ValueError):
    mq.chi2_rule(3, 0)
