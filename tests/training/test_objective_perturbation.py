"""Tests of loss/objective perturbation (jaxdp/training/objective_perturbation.py)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdp.audit import histogram_epsilon_lower_bound
from jaxdp.accounting import events
from jaxdp.training import certified_solve, linear, objective_perturbation as obp


def _data(seed=0, n=60, d=3, c=2):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, c, size=n)
  x = rng.normal(size=(c, d))[y] + rng.normal(size=(n, d))
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), y.astype(np.int32)


def _recovered_noise(res, x, y, loss, l2_reg, h=0.5):
  """b = -N grad[(1/N) sum l + ((lambda + extra)/2)||theta||^2] at theta_priv (stationarity)."""
  n = x.shape[0]
  lam = l2_reg + res.calibration.objective.extra_l2
  w = np.asarray(res.nonprivate_info.certificate.weights, np.float64)  # the certified minimiser, before Z

  def grad_one(v):
    _, g = certified_solve.objective_and_grad(v, x.astype(np.float64), y, loss=loss, h=h,
                                              l2_total=lam)
    return g

  return -n * np.stack([grad_one(v) for v in w])


# ---- calibration --------------------------------------------------------------------------


def test_loss_perturbation_calibration_formulas():
  """Paper 000 Alg. 4/5: beta = eps/(2K), rho = 2LC/eps, sigma = (K/eps) sqrt(8 log(2/delta) + 4 eps)."""
  k, l = math.sqrt(2), 0.5
  cal = obp.loss_perturbation_calibration(epsilon=0.5, num_examples=1000, num_classes=10,
                                          neighbouring="add_remove")
  assert cal.noise == "l2_laplace"
  assert cal.scale == pytest.approx(0.5 / (2 * k), rel=1e-12)
  assert cal.rho == pytest.approx(2 * l * 10 / 0.5, rel=1e-12)
  assert cal.extra_l2 == pytest.approx(cal.rho / 1000, rel=1e-12)  # rho/(2N)||theta||^2 (Alg. 4)
  assert cal.event == events.PureDpEvent(0.5, neighbouring="add_remove")
  cal_g = obp.loss_perturbation_calibration(epsilon=0.5, delta=1e-5, num_examples=1000, num_classes=10,
                                            neighbouring="add_remove")
  # C = 10 > 1: the chi-tail calibration (module docstring), larger than the paper's constant.
  t = stats.chi.isf(1e-5, 10)
  assert cal_g.scale == pytest.approx(k * (t + math.sqrt(t * t + 0.5)) / 0.5, rel=1e-12)
  assert cal_g.scale > (k / 0.5) * math.sqrt(8 * math.log(2 / 1e-5) + 4 * 0.5)
  assert cal_g.event == events.ApproxDpEvent(0.5, 1e-5, neighbouring="add_remove")
  cal_r = obp.loss_perturbation_calibration(epsilon=0.5, num_examples=1000, num_classes=10)
  assert cal_r.neighbouring == "replace_one"  # the default: the other linear methods' relation
  assert cal_r.scale == pytest.approx(cal.scale / 2, rel=1e-12)  # ||b' - b|| <= 2K: beta = eps/(4K)
  cal_rg = obp.loss_perturbation_calibration(epsilon=0.5, delta=1e-5, num_examples=1000, num_classes=10)
  t2 = stats.chi.isf(1e-5, 20)  # replace-one: b' - b in a 2C-dimensional subspace, Delta = 2K
  assert cal_rg.scale == pytest.approx(2 * k * (t2 + math.sqrt(t2 * t2 + 0.5)) / 0.5, rel=1e-12)
  cal_big = obp.loss_perturbation_calibration(epsilon=0.5, num_examples=1000, num_classes=10, rho=100.0)
  assert cal_big.extra_l2 == pytest.approx(0.1)
  with pytest.raises(ValueError, match="rho"):
    obp.loss_perturbation_calibration(epsilon=0.5, num_examples=1000, num_classes=10, rho=1.0)
  with pytest.raises(ValueError, match="neighbouring"):
    obp.loss_perturbation_calibration(epsilon=0.5, num_examples=10, num_classes=2, neighbouring="x")
  inf = obp.loss_perturbation_calibration(epsilon=math.inf, num_examples=10, num_classes=2)
  assert inf.noise == "none" and inf.extra_l2 == 0.0


# Jitted (one compilation per data shape) instead of the eager dispatch of every primitive.
_regularised_loss_grad = jax.jit(jax.grad(
    lambda v, x, y, lam: linear.data_loss(v, x, y, loss="softmax") + 0.5 * lam * jnp.sum(v * v)))


def _implied_noise(w, x, y, calibration, l2_reg):
  """b(theta) = -N grad[(1/N) sum l + ((l2_reg + extra_l2)/2)||theta||^2] (paper 000 Eq. 21)."""
  n = x.shape[0]
  lam = l2_reg + calibration.extra_l2
  g = _regularised_loss_grad(w, x, y, lam)
  return -n * np.asarray(g, np.float64)


def test_loss_perturbation_implied_noise_shift_is_bounded():
  """Eq. 30-31 of paper 000 Thm 3: for EVERY theta, ||b_D'(theta) - b_D(theta)|| <= K (add/remove)
  or 2K (replace-one), with the exact objective the library minimises (incl. l2_reg and rho/N).

  Under add/remove, a mean-normalised l2_reg > 0 adds l2_reg * theta to the shift (unbounded), so
  the library must refuse it; under replace-one it cancels.
  """
  k = math.sqrt(2)
  x, y = _data(n=6, d=2)
  x_add, y_add = np.concatenate([x, [[1.0, 0.0]]]).astype(np.float32), np.append(y, 1).astype(np.int32)
  y_rep = y.copy()
  y_rep[0] = 1 - y_rep[0]
  thetas = [np.zeros((2, 2), np.float32), 50.0 * np.ones((2, 2), np.float32),
            np.asarray([[300.0, -200.0], [-100.0, 40.0]], np.float32)]
  cal_a = obp.loss_perturbation_calibration(epsilon=1.0, num_examples=6, num_classes=2,
                                            neighbouring="add_remove")
  cal_a2 = obp.loss_perturbation_calibration(epsilon=1.0, num_examples=7, num_classes=2,
                                             neighbouring="add_remove")
  lam = 0.3
  cal_r = obp.loss_perturbation_calibration(epsilon=1.0, num_examples=6, num_classes=2,
                                            neighbouring="replace_one", l2_reg=lam)
  for w in thetas:
    w = jnp.asarray(w)
    shift_a = _implied_noise(w, x_add, y_add, cal_a2, 0.0) - _implied_noise(w, x, y, cal_a, 0.0)
    assert np.linalg.norm(shift_a) <= k * (1 + 1e-5)
    shift_r = _implied_noise(w, x, y_rep, cal_r, lam) - _implied_noise(w, x, y, cal_r, lam)
    assert np.linalg.norm(shift_r) <= 2 * k * (1 + 1e-5)
  # What add/remove with l2_reg > 0 would do: the shift grows with theta (here far above K) ...
  w = jnp.asarray(thetas[2])
  shift_bad = _implied_noise(w, x_add, y_add, cal_a2, lam) - _implied_noise(w, x, y, cal_a, lam)
  assert np.linalg.norm(shift_bad) > 10 * k
  # ... so the library refuses it (calibration and the training function).
  with pytest.raises(ValueError, match="l2_reg must be 0 with neighbouring='add_remove'"):
    obp.loss_perturbation_calibration(epsilon=1.0, num_examples=6, num_classes=2, l2_reg=lam,
                                      neighbouring="add_remove")
  with pytest.raises(ValueError, match="l2_reg must be 0"):
    obp.loss_perturbation(jax.random.key(0), x, y, num_classes=2, epsilon=1.0, l2_reg=lam,
                          neighbouring="add_remove")


def test_binary_objective_perturbation_calibration():
  """Paper 003 Alg. 1: eps' = eps - log(1 + t/(2nc)), gamma = eps'/2, c = lambda/2."""
  n, lam, eps = 500, 0.01, 1.0
  c = lam / 2
  cal = obp.objective_perturbation_calibration(epsilon=eps, num_examples=n, l2_reg=lam)
  eps_p = eps - math.log(1 + 0.25 / (2 * n * c))
  assert cal.epsilon_noise == pytest.approx(eps_p, rel=1e-12)
  assert cal.scale == pytest.approx(eps_p / 2, rel=1e-12)
  assert cal.extra_l2 == 0.0 and cal.event == events.PureDpEvent(eps, neighbouring="replace_one")
  cal_h = obp.objective_perturbation_calibration(epsilon=eps, num_examples=n, l2_reg=lam, loss="huber",
                                                 h=0.2)
  assert cal_h.epsilon_noise == pytest.approx(eps - math.log(1 + (1 / 0.4) / (2 * n * c)), rel=1e-12)
  # Validity c > t / (2 n (e^eps - 1)) fails for tiny lambda: the Delta branch makes eps' = eps/2.
  small = 1e-6
  assert c > 0.25 / (2 * n * math.expm1(eps))
  assert not small / 2 > 0.25 / (2 * n * math.expm1(eps))
  cal_d = obp.objective_perturbation_calibration(epsilon=eps, num_examples=n, l2_reg=small)
  assert cal_d.scale == pytest.approx(eps / 4, rel=1e-12)
  total = small + cal_d.extra_l2
  assert math.log1p(0.25 / (n * total)) == pytest.approx(eps / 2, rel=1e-9)
  with pytest.raises(ValueError, match="l2_reg must be >"):
    obp.objective_perturbation_calibration(epsilon=eps, num_examples=n, l2_reg=small,
                                           allow_extra_l2=False)
  with pytest.raises(ValueError, match="loss"):
    obp.objective_perturbation_calibration(epsilon=eps, num_examples=n, l2_reg=lam, loss="softmax")


# ---- end-to-end noise law (recovered from the stationarity condition) --------------------


def test_loss_perturbation_noise_norm_gamma_law_and_convergence():
  """||B|| recovered from grad J_priv = 0 follows Gamma(D C, 1/beta); all fits converged."""
  x, y = _data()
  keys = jax.random.split(jax.random.key(0), 600)
  res = obp.loss_perturbation(keys, x, y, num_classes=2, epsilon=2.0, l2_reg=0.01, tol=1e-6,
                              return_nonprivate_diagnostics=True,
                              neighbouring="replace_one")
  assert np.all(res.nonprivate_info.certificate.distance <= res.calibration.radius)
  b = _recovered_noise(res, x, y, "softmax", 0.01).reshape(600, -1)
  norms = np.linalg.norm(b, axis=1)
  beta = res.calibration.objective.scale
  assert stats.kstest(norms, stats.gamma(a=6, scale=1 / beta).cdf).pvalue > 1e-3
  assert stats.kstest(norms, stats.gamma(a=6, scale=1.15 / beta).cdf).pvalue < 1e-3


def test_gaussian_loss_perturbation_noise_is_gaussian():
  x, y = _data()
  keys = jax.random.split(jax.random.key(1), 300)
  res = obp.loss_perturbation(keys, x, y, num_classes=2, epsilon=1.0, delta=1e-5, l2_reg=0.01,
                              return_nonprivate_diagnostics=True,
                              neighbouring="replace_one")
  b = _recovered_noise(res, x, y, "softmax", 0.01).reshape(-1) / res.calibration.objective.scale
  assert stats.kstest(b, "norm").pvalue > 1e-3
  assert np.std(b) == pytest.approx(1.0, rel=0.05)


def test_binary_objective_perturbation_noise_gamma_law():
  x, y = _data()
  keys = jax.random.split(jax.random.key(2), 600)
  for loss, tol in (("logistic", 1e-6), ("huber", 1e-6)):
    res = obp.objective_perturbation(keys, x, y, epsilon=1.0, l2_reg=0.05, loss=loss, h=0.5, tol=tol,
                                     return_nonprivate_diagnostics=True)
    assert np.all(res.nonprivate_info.certificate.distance <= res.calibration.radius)
    norms = np.linalg.norm(_recovered_noise(res, x, y, loss, 0.05), axis=1)
    gamma = res.calibration.objective.scale
    assert stats.kstest(norms, stats.gamma(a=3, scale=1 / gamma).cdf).pvalue > 1e-3
    # Power: gamma = eps' instead of eps'/2 (or eps/2 vs eps/4 in the fallback) is rejected.
    assert stats.kstest(norms, stats.gamma(a=3, scale=0.5 / gamma).cdf).pvalue < 1e-6
    assert stats.kstest(norms, stats.gamma(a=3, scale=1.25 / gamma).cdf).pvalue < 1e-3


def test_eps_inf_is_exactly_non_private():
  x, y = _data(c=3)
  res = obp.loss_perturbation(jax.random.key(0), x, y, num_classes=3, epsilon=math.inf, l2_reg=0.01)
  ref = linear.fit_linear(x, y, num_classes=3, l2_reg=0.01)
  np.testing.assert_array_equal(res.weights, ref.weights)
  assert res.event == events.NonPrivateDpEvent()
  yb = (y > 0).astype(np.int32)
  res_b = obp.objective_perturbation(jax.random.key(0), x, yb, epsilon=math.inf, l2_reg=0.01)
  np.testing.assert_array_equal(res_b.weights, linear.fit_linear(x, yb, loss="logistic",
                                                                 l2_reg=0.01).weights)


def test_vmapped_equals_loop_and_key_determinism():
  x, y = _data(c=3)
  keys = jax.random.split(jax.random.key(4), 3)
  # The single-key fits do not depend on the batch mode: computed once, compared with both.
  ones = [obp.loss_perturbation(keys[i], x, y, num_classes=3, epsilon=1.0, l2_reg=0.01,
                                neighbouring="replace_one") for i in range(3)]
  for mode in ("vmap", "map"):
    batch = obp.loss_perturbation(keys, x, y, num_classes=3, epsilon=1.0, l2_reg=0.01, batch_mode=mode,
                                  neighbouring="replace_one")
    for i in range(3):
      np.testing.assert_allclose(batch.weights[i], ones[i].weights, rtol=1e-4, atol=1e-4)
  a = ones[0]
  b = obp.loss_perturbation(keys[0], x, y, num_classes=3, epsilon=1.0, l2_reg=0.01,
                               neighbouring="replace_one")
  np.testing.assert_array_equal(a.weights, b.weights)


def _scipy_minimizer(x, y, loss, lam, lin, shape, h=0.5):
  """High-precision float64 minimiser of the (perturbed) objective: scipy L-BFGS-B, then Newton
  steps with a central-difference Hessian of the analytic float64 gradient (L-BFGS-B alone can
  stall near 1e-8 on a line-search failure; Newton with a 1e-6-accurate Hessian contracts the
  gradient by ~1e-6 per step)."""
  from scipy import optimize  # pylint: disable=import-outside-toplevel
  x64 = x.astype(np.float64)
  grad = lambda v: certified_solve.objective_and_grad(
      v.reshape(shape), x64, y, loss=loss, h=h, l2_total=lam, linear_term=lin)[1].reshape(-1)
  fun = lambda v: (lambda fg: (fg[0], fg[1].reshape(-1)))(certified_solve.objective_and_grad(
      v.reshape(shape), x64, y, loss=loss, h=h, l2_total=lam, linear_term=lin))
  v = optimize.minimize(fun, np.zeros(int(np.prod(shape))), jac=True, method="L-BFGS-B",
                        options=dict(maxiter=5000, gtol=1e-13, ftol=0.0)).x
  eye, step = np.eye(v.size), 1e-5
  for _ in range(4):
    hess = np.stack([(grad(v + step * e) - grad(v - step * e)) / (2 * step) for e in eye], axis=1)
    v = v - np.linalg.solve(0.5 * (hess + hess.T), grad(v))
  assert np.linalg.norm(grad(v)) < 1e-10
  return v.reshape(shape)


def _fitted_objective_noise(key, x, y, cal, *, loss, num_classes, l2_reg, h=0.5):
  """The B that _run drew, bit for bit: the same jitted _perturbed_fit (one iteration) on the
  same key. B drawn outside that jit can differ from the fused in-jit draw by float32 rounding,
  which matters at the ~1e-8 scale of these certificates."""
  from jaxdp.mechanisms import noise_scale_as  # pylint: disable=import-outside-toplevel
  k_obj, _ = jax.random.split(key)
  scale = noise_scale_as(cal.objective.scale, jnp.float32, round_up=False)
  _, b = obp._perturbed_fit(  # pylint: disable=protected-access
      k_obj, jnp.asarray(x, jnp.float32), jnp.asarray(y), scale, cal.objective.extra_l2, l2_reg, h,
      max(cal.tol, 1e-7), None, noise="l2_laplace", loss=loss, num_classes=num_classes,
      max_iter=1)
  return np.asarray(b, np.float64)


def _fitted_objective_noise_many(keys, x, y, cal, *, loss, num_classes, l2_reg, h=0.5,
                                 max_iter=500):
  """:func:`_fitted_objective_noise` for a batch of keys: the B's the batched _run drew, through
  the same jitted _perturbed_fit_many and the same chunking (jaxdp.training.batching).

  ``max_iter``: the fit's (loss_perturbation's default 500), so this is the very program (static
  arguments and all) that drew the release's B, compiled once for both; B is drawn before the
  iterations, so the fits themselves do not matter here."""
  from jaxdp.mechanisms import noise_scale_as  # pylint: disable=import-outside-toplevel
  from jaxdp.training import batching  # pylint: disable=import-outside-toplevel
  obj_keys = jax.vmap(jax.random.split)(keys)[:, 0]
  scale = noise_scale_as(cal.objective.scale, jnp.float32, round_up=False)
  args = (jnp.asarray(x, jnp.float32), jnp.asarray(y), scale, cal.objective.extra_l2, l2_reg, h,
          max(cal.tol, 1e-7), None)
  mode = linear.resolve_batch_mode("auto")
  fit = lambda k: obp._perturbed_fit_many(  # pylint: disable=protected-access
      k, *args, noise="l2_laplace", loss=loss, num_classes=num_classes, max_iter=max_iter,
      mode=mode)
  _, b = batching.map_in_chunks(fit, obj_keys, batching.num_chunks(len(obj_keys), mode))
  return np.asarray(b, np.float64)


@pytest.mark.parametrize("method", ["loss", "binary"])
def test_capped_fit_is_released_within_the_certified_radius(method):
  """Review items 3/4: an L-BFGS fit capped at one iteration is NOT refused (the old code raised
  RuntimeError, a data-dependent refusal); the released minimiser is within the certified
  distance of the exact minimiser (scipy, float64), which is within r = tol/Lambda."""
  x, y = _data(c=3 if method == "loss" else 2)
  key = jax.random.key(7)
  if method == "loss":
    res = obp.loss_perturbation(key, x, y, num_classes=3, epsilon=1.0, l2_reg=0.01, max_iter=1,
                                return_nonprivate_diagnostics=True)
    shape, loss = (3, 3), "softmax"
  else:
    res = obp.objective_perturbation(key, x, y, epsilon=1.0, l2_reg=0.05, max_iter=1,
                                     return_nonprivate_diagnostics=True)
    shape, loss = (3,), "logistic"
  cal, cert = res.calibration, res.nonprivate_info.certificate
  assert int(cert.route) > 0  # L-BFGS alone was not certified: a repair route was used
  b = _fitted_objective_noise(key, x, y, cal, loss=loss, num_classes=3 if method == "loss" else 2,
                              l2_reg=0.01 if method == "loss" else 0.05)
  lam = cal.strong_convexity
  # The fit sees x after linear.check_features (rows a hair outside the unit ball are pulled
  # inside): the exact minimiser is the one of that data.
  w_star = _scipy_minimizer(linear.check_features(x), y, loss, lam, b / x.shape[0], shape)
  err = np.linalg.norm(cert.weights - w_star)
  assert err <= cert.distance <= cal.radius == pytest.approx(cal.tol / lam)
  # The released weights are the certified point plus the AMP output noise (float32 rounding).
  assert np.linalg.norm(np.asarray(res.weights, np.float64) - cert.weights) > 0


def test_warm_start_keeps_the_released_law():
  """init_weights (the non-private minimiser, or a far-away point) only moves where L-BFGS starts:
  same calibration and certified radius, the same B and Z for the same key, and the release
  equals the cold-start release to within 2 tol/Lambda (both certified points are within
  tol/Lambda of the same exact minimiser; the exact scipy minimiser checks each)."""
  x, y = _data(c=3)
  keys = jax.random.split(jax.random.key(11), 3)
  kw = dict(num_classes=3, epsilon=1.0, l2_reg=0.01, tol=1e-6, return_nonprivate_diagnostics=True)
  cold = obp.loss_perturbation(keys, x, y, **kw)
  w_np = linear.fit_linear(x, y, num_classes=3, l2_reg=0.01).weights
  for init in (w_np, np.full((3, 3), 5.0, np.float32)):
    warm = obp.loss_perturbation(keys, x, y, init_weights=init, **kw)
    assert warm.calibration == cold.calibration and warm.event == cold.event
    r = cold.calibration.radius
    wc, cc = warm.nonprivate_info.certificate, cold.nonprivate_info.certificate
    assert wc.radius == cc.radius == r == pytest.approx(1e-6 / cold.calibration.strong_convexity)
    assert np.all(wc.distance <= r) and np.all(cc.distance <= r)
    gap = np.linalg.norm((wc.weights - cc.weights).reshape(3, -1), axis=1)
    assert np.all(gap <= 2 * r)
    # Same key: same output noise Z, so the releases differ only by the certified points
    # (plus float32 rounding of the releases).
    rel = np.linalg.norm((np.asarray(warm.weights, np.float64)
                          - np.asarray(cold.weights, np.float64)).reshape(3, -1), axis=1)
    scale = np.linalg.norm(np.asarray(cold.weights, np.float64).reshape(3, -1), axis=1)
    assert np.all(rel <= 2 * r + 4 * 2.0 ** -24 * scale)
  # The warm start saves iterations (the point of it); start at the minimiser itself.
  at_min = obp.loss_perturbation(keys, x, y,
                                 init_weights=cold.nonprivate_info.certificate.weights[0], **kw)
  assert int(at_min.nonprivate_info.solver.num_iter[0]) <= int(cold.nonprivate_info.solver.num_iter[0])
  # Near-exact reference for one draw: both within their certified distance of it.
  b = _fitted_objective_noise_many(keys, x, y, cold.calibration, loss="softmax", num_classes=3,
                                   l2_reg=0.01)[0]
  lam = cold.calibration.strong_convexity
  ref = certified_solve.certify_minimizers(  # within 1e-10/Lambda of the exact minimiser
      cold.nonprivate_info.certificate.weights[0], x, y, loss="softmax", h=0.5, l2_total=lam,
      tol=1e-10,
      linear_term=b / x.shape[0])
  for res in (cold, warm):
    err = np.linalg.norm(res.nonprivate_info.certificate.weights[0] - ref.weights)
    assert err <= res.nonprivate_info.certificate.distance[0] + ref.distance <= r + 1e-10 / lam


def test_warm_start_validation():
  x, y = _data(c=3)
  kw = dict(num_classes=3, epsilon=1.0, l2_reg=0.01)
  with pytest.raises(ValueError, match="init_weights"):
    obp.loss_perturbation(jax.random.key(0), x, y, init_weights=np.zeros((3, 2)), **kw)
  with pytest.raises(ValueError, match="init_weights"):
    obp.loss_perturbation(jax.random.key(0), x, y, init_weights=np.full((3, 3), np.nan), **kw)
  xb, yb = _data(c=2)
  with pytest.raises(ValueError, match="init_weights"):
    obp.objective_perturbation(jax.random.key(0), xb, yb, epsilon=1.0, l2_reg=0.05,
                               init_weights=np.zeros((3, 2)))
  # Binary objective perturbation warm-starts too (same calibration, certified within r).
  cold = obp.objective_perturbation(jax.random.key(1), xb, yb, epsilon=1.0, l2_reg=0.05, tol=1e-6,
                                    return_nonprivate_diagnostics=True)
  warm = obp.objective_perturbation(jax.random.key(1), xb, yb, epsilon=1.0, l2_reg=0.05, tol=1e-6,
                                    return_nonprivate_diagnostics=True,
                                    init_weights=np.ones(3, np.float32))
  r = cold.calibration.radius
  gap = warm.nonprivate_info.certificate.weights - cold.nonprivate_info.certificate.weights
  assert np.linalg.norm(gap) <= 2 * r


def test_accelerated_gradient_fallback_certifies_from_any_start():
  """Route 2 alone (no polish): Nesterov AGD with the data-independent iteration bound."""
  x, y = _data(c=3)
  lam, tol = 0.01, 1e-7
  start = np.full((3, 3), 50.0)  # far away, outside the ball ||theta|| <= K/lambda's reach
  sol = certified_solve.certify_minimizers(start, x, y, loss="softmax", h=0.5, l2_total=lam,
                                           tol=tol, polish=False)
  assert int(sol.route) == 2
  w_star = _scipy_minimizer(x, y, "softmax", lam, None, (3, 3))
  assert np.linalg.norm(sol.weights - w_star) <= sol.distance <= tol / lam
  bound = certified_solve.accelerated_gradient_iterations(lam, 0.5 + lam, 2 * math.sqrt(2) / lam, tol)
  assert 0 < int(sol.iterations) <= bound


def test_amp_split_events_and_output_noise_scale():
  """eps1 + eps2 = eps (delta1 + delta2 = delta); beta2 = eps2 / (2 tol/Lambda); sigma2 analytic."""
  from jaxdp.accounting import analytic_gaussian_sigma  # pylint: disable=import-outside-toplevel
  amp = obp.loss_perturbation_amp_calibration(epsilon=2.0, num_examples=500, num_classes=3, dim=4,
                                              l2_reg=0.01, amp_fraction=0.05, tol=1e-6)
  assert sum(amp.epsilon_split) == pytest.approx(2.0, rel=1e-12)
  assert amp.epsilon_split[1] == pytest.approx(0.1)
  assert amp.objective.scale == pytest.approx(1.9 / (4 * math.sqrt(2)), rel=1e-12)
  lam = 0.01 + amp.objective.extra_l2
  assert amp.strong_convexity == pytest.approx(lam)
  assert amp.output_sensitivity == pytest.approx(2e-6 / lam, rel=1e-12)
  assert amp.output_scale == pytest.approx(0.1 / (2e-6 / lam), rel=1e-12)
  assert [type(e) for e in amp.event.events] == [events.PureDpEvent] * 2
  assert [e.epsilon for e in amp.event.events] == pytest.approx([1.9, 0.1], rel=1e-12)
  amp_g = obp.loss_perturbation_amp_calibration(epsilon=1.0, delta=1e-5, num_examples=500,
                                                num_classes=3, dim=4, l2_reg=0.01, tol=1e-6)
  assert sum(amp_g.delta_split) == pytest.approx(1e-5, rel=1e-12)
  assert amp_g.output_scale == pytest.approx(
      analytic_gaussian_sigma(0.01, 1e-7, amp_g.output_sensitivity), rel=1e-12)
  # Default tol: output noise norm ~1% of the objective noise's effect on theta.
  auto = obp.loss_perturbation_amp_calibration(epsilon=1.0, num_examples=500, num_classes=3, dim=4,
                                               l2_reg=0.01)
  obj_effect = 12 / auto.objective.scale / 500  # E||B|| / N (Lambda cancels)
  out_effect = 12 / auto.output_scale * auto.strong_convexity
  assert out_effect / obj_effect == pytest.approx(0.01, rel=1e-9)
  with pytest.raises(ValueError, match="amp_fraction"):
    obp.loss_perturbation_amp_calibration(epsilon=1.0, num_examples=5, num_classes=2, dim=1,
                                          amp_fraction=1.0)
  with pytest.raises(ValueError, match="tol"):
    obp.loss_perturbation_amp_calibration(epsilon=1.0, num_examples=5, num_classes=2, dim=1,
                                          l2_reg=0.1, tol=1e-16)


def test_gaussian_sigma_multiclass_chi_and_binary_unchanged():
  """Review item 5: C > 1 uses the chi tail (>= the conservative sqrt(k) + sqrt(2 log(1/delta))
  form's exact counterpart); C = 1 keeps the paper's constant."""
  k = math.sqrt(2)
  for nb, factor, dof in (("add_remove", 1, 1), ("replace_one", 2, 2)):
    paper = factor * (k / 0.7) * math.sqrt(8 * math.log(2 / 1e-6) + 4 * 0.7)
    assert obp.gaussian_loss_perturbation_sigma(0.7, 1e-6, num_classes=1, neighbouring=nb) == \
        pytest.approx(paper, rel=1e-12)
  for c in (2, 5, 10, 100):
    for nb, factor, dof in (("add_remove", 1, c), ("replace_one", 2, 2 * c)):
      sig = obp.gaussian_loss_perturbation_sigma(0.7, 1e-6, num_classes=c, neighbouring=nb)
      t = stats.chi.isf(1e-6, dof)
      assert t <= math.sqrt(dof) + math.sqrt(2 * math.log(1e6))  # chi tail, Lipschitz concentration
      assert sig >= factor * k * (t + math.sqrt(t * t + 0.7)) / 0.7 * (1 - 1e-12)
  # The chi constant is what matters at C = 100 (far above the paper's fixed-direction value).
  assert obp.gaussian_loss_perturbation_sigma(0.7, 1e-6, num_classes=100) > 2 * (
      2 * (k / 0.7) * math.sqrt(8 * math.log(2 / 1e-6) + 4 * 0.7))


def test_amp_output_noise_norm_law():
  """Released - certified point = Z with ||Z|| ~ Gamma(dim, 1/beta2) (L2-Laplace output noise)."""
  x, y = _data()
  # 600 keys: the batch shape of the gamma-law test above (its compiled fits are reused).
  keys = jax.random.split(jax.random.key(9), 600)
  res = obp.loss_perturbation(keys, x, y, num_classes=2, epsilon=2.0, l2_reg=0.01,
                              return_nonprivate_diagnostics=True)
  z = np.asarray(res.weights, np.float64) - res.nonprivate_info.certificate.weights
  norms = np.linalg.norm(z.reshape(600, -1), axis=1)
  beta2 = res.calibration.output_scale
  assert stats.kstest(norms, stats.gamma(a=6, scale=1 / beta2).cdf).pvalue > 1e-3
  assert stats.kstest(norms, stats.gamma(a=6, scale=1.2 / beta2).cdf).pvalue < 1e-3


def test_input_validation():
  x, y = _data()
  with pytest.raises(ValueError, match="normalize_rows"):
    obp.loss_perturbation(jax.random.key(0), 3 * x, y, num_classes=2, epsilon=1.0)
  with pytest.raises(ValueError, match="epsilon"):
    obp.loss_perturbation(jax.random.key(0), x, y, num_classes=2, epsilon=0.0)
  with pytest.raises(ValueError, match="binary"):
    obp.objective_perturbation(jax.random.key(0), x, y + 1, epsilon=1.0, l2_reg=0.1)


# ---- empirical privacy ----------------------------------------------------------------------


def _audit_loss_perturbation(num_runs: int, eps: float, beta_factor: float = 1.0) -> float:
  """1-D, 2-class loss perturbation on add/remove neighbours; returns the log-ratio lower bound.

  ``beta_factor > 1`` shrinks the noise (a deliberately broken mechanism) to check the
  audit's power; it calls the internal solver with the modified scale.
  """
  x = np.asarray([[1.0], [0.8], [-1.0], [1.0], [0.5]], np.float32)
  y = np.asarray([1, 1, 0, 0, 1], np.int32)
  x2 = np.concatenate([x, [[1.0]]]).astype(np.float32)
  y2 = np.concatenate([y, [0]]).astype(np.int32)
  k1, k2 = jax.random.split(jax.random.key(11))

  # Both branches run the same compiled program per data shape: batch_mode="vmap", a float32
  # array scale and a positional init=None (as loss_perturbation passes them) give
  # _perturbed_fit_many the same signature.
  from jaxdp.mechanisms import noise_scale_as  # pylint: disable=import-outside-toplevel

  def run(k, xs, ys):
    keys = jax.random.split(k, num_runs)
    if beta_factor == 1.0:
      res = obp.loss_perturbation(keys, xs, ys, num_classes=2, epsilon=eps, neighbouring="add_remove",
                                  batch_mode="vmap")
    else:
      cal = obp.loss_perturbation_calibration(epsilon=eps, num_examples=xs.shape[0], num_classes=2,
                                              neighbouring="add_remove")
      scale = noise_scale_as(cal.scale * beta_factor, jnp.float32, round_up=False)
      res, _ = obp._perturbed_fit_many(  # pylint: disable=protected-access
          keys, jnp.asarray(xs, jnp.float32), jnp.asarray(ys), scale, cal.extra_l2, 0.0, 0.5, 1e-6,
          None, noise="l2_laplace", loss="softmax", num_classes=2, max_iter=500, mode="vmap")
    # Post-processing statistic: the logit difference theta[0, 1] - theta[0, 0].
    return np.asarray(res.weights[:, 0, 1] - res.weights[:, 0, 0])

  return histogram_epsilon_lower_bound(run(k1, x, y), run(k2, x2, y2), num_bins=10)


def test_empirical_privacy_loss_perturbation_small():
  assert _audit_loss_perturbation(10_000, eps=1.0) <= 1.0
  # Power: noise 5x too small is detected (lower bound 1.30 > eps at 10k runs, 1.41 at 20k).
  assert _audit_loss_perturbation(10_000, eps=1.0, beta_factor=5.0) > 1.0


@pytest.mark.slow
def test_empirical_privacy_loss_perturbation_large():
  for eps in (0.5, 2.0):
    assert _audit_loss_perturbation(200_000, eps=eps) <= eps


def _audit_binary_objective_perturbation(num_runs: int, eps: float) -> float:
  """1-D logistic objective perturbation (paper 003 Alg. 1) on replace-one neighbours."""
  x = np.asarray([[1.0], [0.9], [-1.0], [0.7], [1.0], [-0.5]], np.float32)
  y1 = np.asarray([1, 1, 0, 0, 1, 0], np.int32)
  y2 = y1.copy()
  y2[-1] = 1  # replace the last record's label (and thereby its contribution)
  x2 = x.copy()
  x2[-1] = 1.0
  k1, k2 = jax.random.split(jax.random.key(12))
  kw = dict(epsilon=eps, l2_reg=0.2, loss="logistic")
  r1 = obp.objective_perturbation(jax.random.split(k1, num_runs), x, y1, **kw)
  r2 = obp.objective_perturbation(jax.random.split(k2, num_runs), x2, y2, **kw)
  return histogram_epsilon_lower_bound(np.asarray(r1.weights[:, 0]), np.asarray(r2.weights[:, 0]),
                                         num_bins=10)


def test_empirical_privacy_binary_objective_perturbation_small():
  assert _audit_binary_objective_perturbation(20_000, eps=1.0) <= 1.0


@pytest.mark.slow
def test_empirical_privacy_binary_objective_perturbation_large():
  for eps in (0.5, 2.0):
    assert _audit_binary_objective_perturbation(200_000, eps=eps) <= eps
