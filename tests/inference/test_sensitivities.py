"""Tests of jaxdp/inference/sensitivities.py (paper 003 Eqs. 4.2-4.3, Lemmas 2-5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.inference import sensitivities as sens


def _unit_rows(rng, k, d):
  x = rng.normal(size=(k, d))
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def _candidates(rng, theta, d, h):
  """Candidate replacement rows: random unit rows at radii 1 and 1/2 plus structured ones.

  Structured: the margin extremes (x = +-theta/||theta||), margins at the Huber kinks
  (z = 1 - h, 1, 1 + h) and rows orthogonal to theta (margin 0: logistic f'' maximal).
  """
  xs = [_unit_rows(rng, 300, d), 0.5 * _unit_rows(rng, 60, d)]
  u = theta / np.linalg.norm(theta)
  xs.append(np.stack([u, -u]))
  for z in (1.0 - h, 1.0, 1.0 + h, 0.0):
    if abs(z) <= np.linalg.norm(theta):
      a = z / np.linalg.norm(theta)
      perp = _unit_rows(rng, 20, d)
      perp = perp - np.outer(perp @ u, u)
      perp = perp / np.linalg.norm(perp, axis=1, keepdims=True)
      xs.append(a * u + np.sqrt(max(1.0 - a * a, 0.0)) * perp)
  x = np.concatenate(xs)
  xx = np.concatenate([x, x])
  yy = np.concatenate([np.ones(len(x)), -np.ones(len(x))])
  return xx, yy


def _worst_pair(matrix_fn, theta, x0, y0, cand_x, cand_y):
  """max ||M(D) - M(D')||_F over D' = D with its last row replaced by each candidate pair."""
  def with_last(xr, yr):
    x = jnp.asarray(x0).at[-1].set(xr)
    y = jnp.asarray(y0).at[-1].set(yr)
    return matrix_fn(jnp.asarray(theta), x, y)

  mats = np.asarray(jax.jit(jax.vmap(with_last))(jnp.asarray(cand_x), jnp.asarray(cand_y)))
  flat = mats.reshape(len(mats), -1)
  # All pairs (D, D') among datasets that differ in the last row only.
  sq = np.sum(flat ** 2, axis=1)
  dist2 = sq[:, None] + sq[None, :] - 2 * flat @ flat.T
  return float(np.sqrt(np.max(dist2)))


@pytest.mark.parametrize("loss,which", [("logistic", "hessian"), ("logistic", "covariance"),
                                        ("huber", "hessian"), ("huber", "covariance")])
@pytest.mark.parametrize("theta_scale", [0.3, 2.5])
def test_brute_force_neighbours_never_exceed_the_lemma(loss, which, theta_scale):
  """Worst replace-one pair over many candidates <= Lemma 2/3/4/5 bound (and not far below)."""
  rng = np.random.default_rng(7)
  n, d, h, lam = 12, 3, 0.5, 0.01
  theta = rng.normal(size=d)
  theta *= theta_scale / np.linalg.norm(theta)
  x0 = _unit_rows(rng, n, d)
  y0 = np.where(rng.random(n) < 0.5, 1.0, -1.0)
  cx, cy = _candidates(rng, theta, d, h)
  fn = sens.hessian if which == "hessian" else sens.gradient_covariance
  worst = _worst_pair(lambda t, x, y: fn(t, x, y, loss=loss, l2_reg=lam, h=h), theta, x0, y0,
                      cx, cy)
  if which == "hessian":
    bound = sens.hessian_sensitivity(loss, n, h)
  else:
    bound = float(sens.covariance_sensitivity(loss, n, np.linalg.norm(theta), h))
  assert worst <= bound * (1 + 1e-6)
  # The search is meaningful: the triangle-inequality bounds are tight up to sqrt(2)
  # for the Hessians (two orthogonal maximal-curvature rows); the covariances come close too.
  # (With ||theta|| = 0.3 < 1 - h no margin reaches the Huber quadratic piece: H is data-free.)
  if not (loss == "huber" and which == "hessian" and theta_scale < 1 - h):
    assert worst >= (0.6 if which == "hessian" else 0.3) * bound


def test_lemma_formulas():
  n = 1000
  assert sens.logistic_hessian_sensitivity(n) == pytest.approx(1 / (2 * n))
  assert sens.huber_hessian_sensitivity(n, 0.25) == pytest.approx(1 / (n * 0.25))
  assert sens.huber_covariance_sensitivity(n) == pytest.approx(2 / n)
  s = 1 / (1 + np.exp(-1.7))
  assert float(sens.logistic_covariance_sensitivity(n, 1.7)) == pytest.approx(2 * s * s / n)


@pytest.mark.parametrize("loss", ["logistic", "huber"])
def test_derivatives_match_autodiff(loss):
  z = jnp.linspace(-3.0, 3.0, 61) + 0.013  # avoid the Huber kinks exactly
  # Each side one compiled program (op by op, every primitive would compile on its own).
  d1, d2 = jax.jit(lambda t: sens.loss_derivatives(t, loss, 0.5))(z)
  g = jax.jit(jax.vmap(jax.grad(lambda t: sens.loss_value(t, loss, 0.5))))(z)
  gg = jax.jit(jax.vmap(jax.grad(jax.grad(lambda t: sens.loss_value(t, loss, 0.5)))))(z)
  np.testing.assert_allclose(d1, g, atol=1e-5)
  np.testing.assert_allclose(d2, gg, atol=1e-4)


@pytest.mark.parametrize("loss", ["logistic", "huber"])
def test_hessian_and_covariance_against_autodiff(loss):
  rng = np.random.default_rng(1)
  n, d, lam = 40, 4, 0.1
  x = jnp.asarray(_unit_rows(rng, n, d) * 0.9, jnp.float32)
  y = jnp.asarray(np.where(rng.random(n) < 0.5, 1.0, -1.0), jnp.float32)
  w = jnp.asarray(rng.integers(0, 3, size=n), jnp.float32)
  theta = jnp.asarray(rng.normal(size=d) * 0.7, jnp.float32)

  def j(t):
    return jnp.sum(w * sens.loss_value(y * (x @ t), loss, 0.5)) / jnp.sum(w) + 0.5 * lam * t @ t

  # The library's matrices jitted too: one compile per shape instead of one per primitive.
  hessian = jax.jit(lambda *a, **k: sens.hessian(*a, loss=loss, l2_reg=lam, **k))
  covariance = jax.jit(lambda *a, **k: sens.gradient_covariance(*a, loss=loss, l2_reg=lam, **k))
  np.testing.assert_allclose(hessian(theta, x, y, counts=w),
                             jax.jit(jax.hessian(j))(theta), atol=1e-5)  # one compile
  per = jax.jit(jax.vmap(jax.grad(lambda t, xi, yi: sens.loss_value(yi * xi @ t, loss, 0.5)),
                         in_axes=(None, 0, 0)))(theta, x, y)
  want = (per * w[:, None]).T @ per / jnp.sum(w) - lam ** 2 * jnp.outer(theta, theta)
  np.testing.assert_allclose(covariance(theta, x, y, counts=w), want, atol=1e-5)
  # Counts = repeating rows.
  rows = np.repeat(np.arange(n), np.asarray(w, int))
  np.testing.assert_allclose(hessian(theta, x[rows], y[rows]), hessian(theta, x, y, counts=w),
                             atol=1e-6)


def test_labels():
  np.testing.assert_array_equal(sens.as_signed_labels([0, 1, 1]), [-1.0, 1.0, 1.0])
  np.testing.assert_array_equal(sens.as_signed_labels([-1, 1]), [-1.0, 1.0])
  for bad in ([0, 2], [-1, 0, 1], [0.5, 1.0]):
    with pytest.raises(ValueError, match="y"):
      sens.as_signed_labels(bad)
  with pytest.raises(ValueError, match="y"):
    sens.as_signed_labels(np.array([True, False]))
  with pytest.raises(ValueError, match="loss"):
    sens.hessian_sensitivity("softmax", 10)


@pytest.mark.parametrize("loss", ["logistic", "huber"])
def test_hessian_and_covariance_in_one_product_equals_the_separate_ones(loss):
  rng = np.random.default_rng(3)
  x = rng.normal(size=(500, 4)) / 2
  x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
  y = np.where(rng.random(500) < 0.4, 1.0, -1.0)
  theta = rng.normal(size=4)
  w = rng.integers(0, 3, size=500).astype(float)
  with jax.enable_x64(True):
    args = (jnp.asarray(theta), jnp.asarray(x), jnp.asarray(y))
    kw = dict(loss=loss, l2_reg=0.01, h=0.5, counts=jnp.asarray(w))
    hess, cov = sens.hessian_and_covariance(*args, xt=jnp.asarray(x.T.copy()), **kw)
    np.testing.assert_allclose(hess, sens.hessian(*args, **kw), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(cov, sens.gradient_covariance(*args, **kw), rtol=1e-12,
                               atol=1e-15)
