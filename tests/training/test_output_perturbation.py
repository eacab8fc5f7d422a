"""Tests of output perturbation / model sensitivity (jaxdp/training/output_perturbation.py)."""

import math

import jax
import numpy as np
import pytest
from scipy import stats

from jaxdp.audit import histogram_epsilon_lower_bound
from jaxdp.accounting import analytic_gaussian_alpha, analytic_gaussian_sigma, events
from jaxdp.training import linear, output_perturbation as op


def _data(seed=0, n=200, d=5, c=3):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, c, size=n)
  x = rng.normal(size=(c, d))[y] + rng.normal(size=(n, d))
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), y.astype(np.int32)


def test_laplace_calibration_equals_paper_formula():
  """beta = N lambda eps / (2K), K = sqrt(2) (paper 000 Alg. 1)."""
  n, lam, eps = 1000, 1e-3, 0.7
  cal = op.output_perturbation_calibration(num_examples=n, l2_reg=lam, epsilon=eps)
  assert cal.noise == "l2_laplace"
  assert cal.scale == pytest.approx(n * lam * eps / (2 * math.sqrt(2)), rel=1e-12)
  assert cal.event == events.PureDpEvent(eps, neighbouring="replace_one")
  # With the solver slack: Delta = 2K/(N lam) + 2 tol / lam.
  cal_tol = op.output_perturbation_calibration(num_examples=n, l2_reg=lam, epsilon=eps,
                                               solver_tol=1e-6)
  assert cal_tol.sensitivity == pytest.approx(2 * math.sqrt(2) / (n * lam) + 2e-6 / lam, rel=1e-12)


def test_gaussian_calibration_equals_paper_formula():
  """sigma = 2 K alpha / (N lambda sqrt(2 eps)) (paper 000 Alg. 3) = analytic Gaussian on 2K/(N lambda)."""
  n, lam, eps, delta = 500, 1e-2, 0.5, 1e-5
  cal = op.output_perturbation_calibration(num_examples=n, l2_reg=lam, epsilon=eps, delta=delta)
  k = math.sqrt(2)
  alpha = analytic_gaussian_alpha(eps, delta)
  assert cal.scale == pytest.approx(2 * k * alpha / (n * lam * math.sqrt(2 * eps)), rel=1e-6)
  assert cal.scale == pytest.approx(analytic_gaussian_sigma(eps, delta, 2 * k / (n * lam)), rel=1e-12)
  assert isinstance(cal.event, events.GaussianDpEvent)
  assert cal.event.noise_multiplier == pytest.approx(cal.scale / cal.sensitivity)


def test_binary_chaudhuri_calibration():
  """Paper 003 Alg. 4: gamma = n c eps, zCDP variance 1/(2 rho (n c)^2), with c = lambda/2, K = 1."""
  n, lam = 300, 0.02
  c = lam / 2
  cal = op.output_perturbation_calibration(num_examples=n, l2_reg=lam, epsilon=0.4, lipschitz=1.0)
  assert cal.scale == pytest.approx(n * c * 0.4, rel=1e-12)
  cal_z = op.output_perturbation_calibration(num_examples=n, l2_reg=lam, rho=0.3, lipschitz=1.0)
  assert cal_z.scale ** 2 == pytest.approx(1.0 / (2 * 0.3 * (n * c) ** 2), rel=1e-12)
  assert cal_z.event == events.ZCDpEvent(0.3, neighbouring="replace_one")


def test_calibration_validation():
  with pytest.raises(ValueError, match="l2_reg"):
    op.output_perturbation_calibration(num_examples=10, l2_reg=0.0, epsilon=1.0)
  with pytest.raises(ValueError, match="exactly one"):
    op.output_perturbation_calibration(num_examples=10, l2_reg=1.0, epsilon=1.0, rho=0.1)
  with pytest.raises(ValueError, match="epsilon"):
    op.output_perturbation_calibration(num_examples=10, l2_reg=1.0, epsilon=-1.0)
  with pytest.raises(ValueError, match="delta"):
    op.output_perturbation_calibration(num_examples=10, l2_reg=1.0, epsilon=1.0, delta=1.5)
  x, y = _data()
  with pytest.raises(ValueError, match="l2_reg"):
    op.model_sensitivity(jax.random.key(0), x, y, num_classes=3, l2_reg=0.0, epsilon=1.0)
  with pytest.raises(ValueError, match="normalize_rows"):
    op.model_sensitivity(jax.random.key(0), 2 * x, y, num_classes=3, l2_reg=0.1, epsilon=1.0)


def test_noise_norm_follows_gamma_law():
  """||theta_priv - theta_hat||_F ~ Gamma(D C, 1/beta) (KS test that rejects a 15% scale error)."""
  x, y = _data()
  keys = jax.random.split(jax.random.key(1), 3000)
  res = op.model_sensitivity(keys, x, y, num_classes=3, l2_reg=0.05, epsilon=2.0)
  base = linear.fit_linear(x, y, num_classes=3, l2_reg=0.05).weights
  norms = np.linalg.norm(np.asarray(res.weights - base, np.float64).reshape(3000, -1), axis=1)
  beta = res.calibration.scale
  assert stats.kstest(norms, stats.gamma(a=15, scale=1 / beta).cdf).pvalue > 1e-3
  assert stats.kstest(norms, stats.gamma(a=15, scale=1.15 / beta).cdf).pvalue < 1e-3


def test_gaussian_noise_std():
  x, y = _data()
  keys = jax.random.split(jax.random.key(2), 2000)
  res = op.model_sensitivity(keys, x, y, num_classes=3, l2_reg=0.05, epsilon=1.0, delta=1e-5)
  base = linear.fit_linear(x, y, num_classes=3, l2_reg=0.05).weights
  noise = np.asarray(res.weights - base, np.float64).reshape(-1)
  assert stats.kstest(noise / res.calibration.scale, "norm").pvalue > 1e-3
  assert np.std(noise) == pytest.approx(res.calibration.scale, rel=0.02)


def test_eps_inf_is_exactly_non_private():
  x, y = _data()
  res = op.model_sensitivity(jax.random.key(0), x, y, num_classes=3, l2_reg=0.01, epsilon=math.inf)
  ref = linear.fit_linear(x, y, num_classes=3, l2_reg=0.01)
  np.testing.assert_array_equal(res.weights, ref.weights)
  assert res.event == events.NonPrivateDpEvent()


def test_same_key_same_result_and_batch_equals_loop():
  x, y = _data()
  keys = jax.random.split(jax.random.key(5), 3)
  batch = op.model_sensitivity(keys, x, y, num_classes=3, l2_reg=0.05, epsilon=1.0)
  for i in range(3):
    one = op.model_sensitivity(keys[i], x, y, num_classes=3, l2_reg=0.05, epsilon=1.0)
    np.testing.assert_allclose(batch.weights[i], one.weights, rtol=1e-6, atol=1e-6)
  again = op.model_sensitivity(keys[0], x, y, num_classes=3, l2_reg=0.05, epsilon=1.0)
  np.testing.assert_array_equal(again.weights, op.model_sensitivity(
      keys[0], x, y, num_classes=3, l2_reg=0.05, epsilon=1.0).weights)


def test_binary_output_perturbation_zcdp_and_huber():
  x, y = _data(c=2)
  keys = jax.random.split(jax.random.key(3), 4)
  res = op.output_perturbation(keys, x, y, loss="huber", h=0.5, l2_reg=0.05, rho=0.5)
  assert res.weights.shape == (4, 5)
  assert res.event == events.ZCDpEvent(0.5, neighbouring="replace_one")
  assert res.calibration.sensitivity == pytest.approx(2 / (200 * 0.05) + 2e-6 / 0.05)


def _binary_1d_pair():
  """Neighbouring 1-D datasets (replace-one) with a large minimiser gap."""
  x1 = np.full((10, 1), 1.0, np.float32)
  y1 = np.asarray([1] * 9 + [1])
  y2 = np.asarray([1] * 9 + [0])
  return x1, y1, y2


def test_empirical_privacy_output_perturbation():
  """Histogram log-ratio on neighbouring datasets stays below eps; a 2x under-noised mechanism is caught."""
  x, y1, y2 = _binary_1d_pair()
  eps, lam = 1.0, 0.5
  m1 = linear.fit_linear(x, y1, loss="logistic", l2_reg=lam).weights
  m2 = linear.fit_linear(x, y2, loss="logistic", l2_reg=lam).weights
  cal = op.output_perturbation_calibration(num_examples=10, l2_reg=lam, epsilon=eps, lipschitz=1.0,
                                           solver_tol=1e-6)
  assert abs(float(m1[0] - m2[0])) <= cal.sensitivity
  k1, k2 = jax.random.split(jax.random.key(7))
  n = 200_000
  s1 = op.perturb_weights(jax.random.split(k1, n), m1, cal)[:, 0]
  s2 = op.perturb_weights(jax.random.split(k2, n), m2, cal)[:, 0]
  assert histogram_epsilon_lower_bound(s1, s2) <= eps
  # Power: the same audit flags noise 4x too small (true eps ~ 4 * gap * beta > eps).
  bad = cal._replace(scale=4.0 * cal.scale)
  b1 = op.perturb_weights(jax.random.split(k1, n), m1, bad)[:, 0]
  b2 = op.perturb_weights(jax.random.split(k2, n), m2, bad)[:, 0]
  assert histogram_epsilon_lower_bound(b1, b2) > eps


def test_capped_fit_is_released_within_the_certified_radius():
  """Review item 4: an L-BFGS fit capped at one iteration is released (the old code raised a
  data-dependent RuntimeError) and the point the noise is added to is within the certified
  distance <= tol/lambda of the exact minimiser (scipy float64 reference)."""
  from scipy import optimize  # pylint: disable=import-outside-toplevel
  from jaxdp.training import certified_solve  # pylint: disable=import-outside-toplevel
  x, y = _data()
  lam, tol = 0.05, 1e-6
  res = op.model_sensitivity(jax.random.key(3), x, y, num_classes=3, l2_reg=lam, epsilon=1.0,
                             max_iter=1, tol=tol, return_nonprivate_diagnostics=True)
  cert = res.nonprivate_info.certificate
  assert int(cert.route) > 0 and not bool(res.nonprivate_info.solver.converged)
  fun = lambda v: (lambda fg: (fg[0], fg[1].reshape(-1)))(certified_solve.objective_and_grad(
      v.reshape(5, 3), x.astype(np.float64), y, loss="softmax", h=0.5, l2_total=lam))
  ref = optimize.minimize(fun, np.zeros(15), jac=True, method="L-BFGS-B",
                          options=dict(maxiter=5000, gtol=1e-13, ftol=0.0)).x.reshape(5, 3)
  assert np.linalg.norm(cert.weights - ref) <= cert.distance <= tol / lam
  assert res.calibration.sensitivity == pytest.approx(2 * math.sqrt(2) / (200 * lam) + 2 * tol / lam)


def test_certified_fit_capped_at_one_iteration_is_certified_not_refused():
  """The shared non-private fit of experiments (model sensitivity, prediction sensitivity):
  capped at max_iter=1 it is repaired and certified within tol/lambda (float64 gradient norm
  recomputed here), never refused; model_sensitivity releases around the same point."""
  from jaxdp.training import certified_solve  # pylint: disable=import-outside-toplevel
  x, y = _data()
  lam, tol = 0.05, 1e-6
  model, cert = op.certified_fit(x, y, num_classes=3, l2_reg=lam, max_iter=1, tol=tol)
  assert not bool(model.info.converged) and int(cert.route) > 0
  _, g = certified_solve.objective_and_grad(cert.weights, x.astype(np.float64), y, loss="softmax",
                                            h=0.5, l2_total=lam)
  assert np.linalg.norm(g) <= cert.grad_norm <= tol and cert.distance <= cert.radius == tol / lam
  res = op.model_sensitivity(jax.random.key(3), x, y, num_classes=3, l2_reg=lam, epsilon=1.0,
                             max_iter=1, tol=tol, return_nonprivate_diagnostics=True)
  np.testing.assert_array_equal(res.nonprivate_info.certificate.weights, cert.weights)
  with pytest.raises(ValueError, match="l2_reg"):
    op.certified_fit(x, y, num_classes=3, l2_reg=0.0)


def _fields(obj, prefix=""):
  """``(dotted name, value)`` of every leaf field of nested NamedTuples."""
  if isinstance(obj, tuple) and hasattr(obj, "_fields"):
    out = []
    for name in obj._fields:
      out += _fields(getattr(obj, name), f"{prefix}{name}.")
    return out
  return [(prefix.rstrip("."), obj)]


def _same(a, b):
  if isinstance(a, (np.ndarray, jax.Array)) or isinstance(b, (np.ndarray, jax.Array)):
    return np.array_equal(np.asarray(a), np.asarray(b))
  return a == b


@pytest.mark.parametrize("method", ["output", "model_sensitivity", "loss", "objective"])
def test_released_result_holds_no_nonprivate_value(method):
  """Issue 26 item 6: ``certificate.weights`` (the exact non-private minimiser) and
  ``info.value`` (J(w*)) were returned beside the private weights. Every field of the result
  but ``weights`` must be public: identical across keys AND across neighbouring datasets; the
  weights differ across keys and are never the certified non-private minimiser."""
  from jaxdp.training import objective_perturbation as obp  # pylint: disable=import-outside-toplevel
  x, y = _data(n=60, d=3, c=2)  # the shape of the (60, 3) fits of test_objective_perturbation
  x2, y2 = x.copy(), y.copy()
  x2[0], y2[0] = -x[0], 1 - y[0]  # replace-one neighbour: a record on the sphere, label flipped
  run = {
      "output": lambda k, a, b, **kw: op.output_perturbation(
          k, a, b, l2_reg=0.1, loss="logistic", epsilon=1.0, **kw),
      "model_sensitivity": lambda k, a, b, **kw: op.model_sensitivity(
          k, a, b, num_classes=2, l2_reg=0.1, epsilon=1.0, **kw),
      "loss": lambda k, a, b, **kw: obp.loss_perturbation(
          k, a, b, num_classes=2, epsilon=1.0, l2_reg=0.1, **kw),
      "objective": lambda k, a, b, **kw: obp.objective_perturbation(
          k, a, b, epsilon=1.0, l2_reg=0.1, **kw),
  }[method]
  k1, k2 = jax.random.key(1), jax.random.key(2)
  r1, r2, r3 = run(k1, x, y), run(k2, x, y), run(k1, x2, y2)
  assert r1.nonprivate_info is None
  names = [name for name, _ in _fields(r1)]
  assert "weights" in names and not any("certificate" in n or "info." in n for n in names)
  for (name, a), (_, b), (_, c) in zip(_fields(r1), _fields(r2), _fields(r3)):
    if name == "weights":
      assert not _same(a, b)
    else:
      assert _same(a, b) and _same(a, c), name  # public: a function of the parameters only
  # Only on request, under the nonprivate_ name: then it holds the non-private minimiser,
  # which is not what is released.
  dbg = run(k1, x, y, return_nonprivate_diagnostics=True)
  np.testing.assert_array_equal(dbg.weights, r1.weights)
  w_star = dbg.nonprivate_info.certificate.weights
  assert not np.allclose(np.asarray(r1.weights, np.float64), w_star)
