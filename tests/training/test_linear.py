"""Tests of the linear-model ERM solver and losses (jaxdp/training/linear.py, linear_losses.py)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from jaxdp.training import linear, linear_losses


def _data(seed=0, n=240, d=8, c=3):
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(c, d))
  y = rng.integers(0, c, size=n)
  x = centers[y] + rng.normal(size=(n, d))
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  return x.astype(np.float32), y.astype(np.int32)


# ---- losses and their constants -------------------------------------------------------


def test_loss_values():
  # Each loss jitted: one compiled program, not one per primitive.
  logits = jnp.asarray([[1.0, 2.0, 0.5]])
  expected = math.log(sum(math.exp(v) for v in (1.0, 2.0, 0.5))) - 2.0
  np.testing.assert_allclose(jax.jit(linear_losses.softmax_cross_entropy)(logits, jnp.asarray([1])),
                             [expected], rtol=1e-6)
  np.testing.assert_allclose(jax.jit(linear_losses.binary_logistic)(jnp.asarray(0.3)),
                             math.log1p(math.exp(-0.3)), rtol=1e-6)
  h = 0.5
  z = jnp.asarray([2.0, 1.5, 1.0, 0.5, 0.0])
  np.testing.assert_allclose(jax.jit(linear_losses.huberized_hinge)(z, h),
                             [0.0, 0.0, (1 + h - 1.0) ** 2 / (4 * h), (1 + h - 0.5) ** 2 / (4 * h), 1.0],
                             rtol=1e-6)


def test_softmax_gradient_and_hessian_bounds():
  """||grad_a l|| <= sqrt(2) (paper 000 Thm 9) and lambda_max(Hessian) <= 1/2 (Thm 10)."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(500, 5)) * 6.0, jnp.float32)
  labels = jnp.asarray(rng.integers(0, 5, size=500))
  # jitted: one compilation instead of eager dispatch of every primitive of grad / hessian.
  grads = jax.jit(jax.vmap(jax.grad(lambda a, y: linear_losses.softmax_cross_entropy(a, y))))(
      logits, labels)
  norms = np.linalg.norm(np.asarray(grads), axis=1)
  assert norms.max() <= linear_losses.SOFTMAX_LIPSCHITZ + 1e-6
  assert norms.max() > 1.3  # the bound is nearly attained by confident wrong predictions
  hess = jax.jit(jax.vmap(jax.hessian(lambda a, y: linear_losses.softmax_cross_entropy(a, y))))(
      logits, labels)
  assert np.linalg.eigvalsh(np.asarray(hess, np.float64)).max() <= 0.5 + 1e-6


def test_binary_loss_derivative_bounds():
  z = jnp.linspace(-6.0, 6.0, 2001)
  for loss, curv in [("logistic", 0.25), ("huber", 1.0 / (2 * 0.3))]:
    f = (lambda v: linear_losses.binary_logistic(v)) if loss == "logistic" else (
        lambda v: linear_losses.huberized_hinge(v, 0.3))
    d1 = jax.jit(jax.vmap(jax.grad(f)))(z)
    d2 = jax.jit(jax.vmap(jax.grad(jax.grad(f))))(z)
    assert float(jnp.max(jnp.abs(d1))) <= linear_losses.lipschitz_constant(loss) + 1e-6
    assert float(jnp.max(jnp.abs(d2))) <= linear_losses.curvature_bound(loss, 0.3) + 1e-5
    assert float(jnp.max(jnp.abs(d2))) >= 0.9 * curv


def test_unknown_loss_raises():
  with pytest.raises(ValueError, match="loss"):
    linear_losses.lipschitz_constant("hinge")


# ---- solver -----------------------------------------------------------------------------


def test_softmax_matches_sklearn_objective():
  """Same objective as sklearn's LogisticRegression with C = 1 / (N lambda), no intercept."""
  x, y = _data()
  n, lam = x.shape[0], 1e-2
  model = linear.fit_linear(x, y, num_classes=3, l2_reg=lam, tol=1e-6)
  assert bool(model.info.converged)
  sk = LogisticRegression(C=1.0 / (n * lam), fit_intercept=False, tol=1e-10, max_iter=10_000)
  sk.fit(x.astype(np.float64), y)
  objective = jax.jit(lambda w: linear.linear_objective(w, x, y, l2_reg=lam))
  obj = lambda w: float(objective(jnp.asarray(w, jnp.float32)))
  sk_obj, our_obj = obj(sk.coef_.T), float(model.info.value)
  assert abs(our_obj - sk_obj) / abs(sk_obj) < 1e-4
  np.testing.assert_allclose(our_obj, obj(model.weights), rtol=1e-6)


def test_binary_logistic_matches_sklearn_objective():
  x, y = _data(c=2)
  n, lam = x.shape[0], 1e-2
  model = linear.fit_linear(x, y, loss="logistic", l2_reg=lam)
  assert model.weights.shape == (x.shape[1],) and bool(model.info.converged)
  sk = LogisticRegression(C=1.0 / (n * lam), fit_intercept=False, tol=1e-10, max_iter=10_000)
  sk.fit(x.astype(np.float64), y)
  sk_obj = float(jax.jit(lambda w: linear.linear_objective(w, x, y, loss="logistic", l2_reg=lam))(
      jnp.asarray(sk.coef_[0], jnp.float32)))
  assert abs(float(model.info.value) - sk_obj) / sk_obj < 1e-4
  # {-1, 1} labels give the same model as {0, 1}.
  model_pm = linear.fit_linear(x, 2 * y - 1, loss="logistic", l2_reg=lam)
  np.testing.assert_allclose(model_pm.weights, model.weights, rtol=1e-5, atol=1e-6)


def test_huber_solution_is_stationary():
  x, y = _data(c=2)
  model = linear.fit_linear(x, y, loss="huber", h=0.4, l2_reg=1e-2, tol=1e-6)
  grad = jax.jit(jax.grad(lambda w: linear.linear_objective(w, x, y, loss="huber", h=0.4,
                                                            l2_reg=1e-2)))(model.weights)
  assert bool(model.info.converged)
  assert float(jnp.linalg.norm(grad)) <= 2e-6


def test_linear_term_and_extra_l2_shift_the_minimiser():
  """Stationarity: grad(mean loss) + (lam + extra) w + b = 0."""
  x, y = _data()
  b = jnp.asarray(np.random.default_rng(3).normal(size=(8, 3)) * 0.1, jnp.float32)
  model = linear.fit_linear(x, y, num_classes=3, l2_reg=1e-2, linear_term=b, extra_l2=0.05)
  g = jax.jit(jax.grad(lambda w: linear.data_loss(w, x, y)))(model.weights)
  np.testing.assert_allclose(g + 0.06 * model.weights + b, 0.0, atol=3e-6)


def test_batched_equals_loop_over_datasets_and_lambdas():
  xs, ys = zip(*[_data(seed=s, n=120) for s in range(3)])
  xs, ys = np.stack(xs), np.stack(ys)
  lams = np.asarray([1e-3, 1e-2, 1e-1], np.float32)
  for mode in ("vmap", "map"):
    batch = linear.fit_linear_batched(xs, ys, num_classes=3, l2_reg=lams, batch_mode=mode)
    for i in range(3):
      single = linear.fit_linear(xs[i], ys[i], num_classes=3, l2_reg=float(lams[i]))
      np.testing.assert_allclose(batch.weights[i], single.weights, rtol=1e-4, atol=1e-5)
    assert bool(jnp.all(batch.info.converged))


def test_predict_labels_and_bias_feature():
  x, y = _data()
  model = linear.fit_linear(x, y, num_classes=3, l2_reg=1e-3)
  acc = float(jnp.mean(linear.predict_labels(model.weights, x) == y))
  assert acc > 0.8
  xb = linear.append_bias_feature(x * 3.0 / np.linalg.norm(x, axis=1, keepdims=True).max())
  assert xb.shape == (x.shape[0], x.shape[1] + 1)
  xb_ok = linear.append_bias_feature(x)
  assert np.linalg.norm(xb_ok, axis=1).max() <= 1.0 + 1e-6
  del xb


# ---- validation ---------------------------------------------------------------------------


def test_input_validation():
  x, y = _data()
  with pytest.raises(ValueError, match="normalize_rows"):
    linear.fit_linear(x * 2.0, y, num_classes=3, l2_reg=1e-2)
  ok = linear.fit_linear(x * 2.0, y, num_classes=3, l2_reg=1e-2, normalize=True)
  ref = linear.fit_linear(x, y, num_classes=3, l2_reg=1e-2)
  np.testing.assert_allclose(ok.weights, ref.weights, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"\[0, 3\)"):
    linear.fit_linear(x, y + 1, num_classes=3, l2_reg=1e-2)
  with pytest.raises(ValueError, match="binary"):
    linear.fit_linear(x, y, loss="logistic", l2_reg=1e-2)
  x_nan = x.copy()
  x_nan[0, 0] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    linear.fit_linear(x_nan, y, num_classes=3, l2_reg=1e-2)
  with pytest.raises(ValueError, match="l2_reg"):
    linear.fit_linear(x, y, num_classes=3, l2_reg=-1.0)
  with pytest.raises(ValueError, match="num_classes"):
    linear.fit_linear(x, y, num_classes=1, l2_reg=1e-2)
  with pytest.raises(ValueError, match="shape"):
    linear.fit_linear(x, y[:-1], num_classes=3, l2_reg=1e-2)


def test_fit_linear_under_user_vmap_over_lambda():
  x, y = _data(n=120)
  lams = jnp.asarray([1e-3, 1e-1])
  w = jax.vmap(lambda lam: linear.fit_linear(x, y, num_classes=3, l2_reg=lam).weights)(lams)
  for i in range(2):
    ref = linear.fit_linear(x, y, num_classes=3, l2_reg=float(lams[i])).weights
    np.testing.assert_allclose(w[i], ref, rtol=1e-4, atol=1e-5)
  assert float(jnp.linalg.norm(w[1])) < float(jnp.linalg.norm(w[0]))


@pytest.mark.parametrize("solver", ["glm", "lbfgs"])
def test_private_fit_entry_point_warm_start_and_solver(solver):
  """linear._fit(..., init=, solver=) (used by the private methods): a start at the solution
  stops at once; both solvers reach the same minimiser, also batched (fit_linear_batched)."""
  x, y = _data(n=120)  # the shapes of the tests above: their compiled fits are reused
  xj, yj = jnp.asarray(x), jnp.asarray(y)
  args = (xj, yj, 1e-2, 0.5, jnp.zeros(()), 0.0, 1e-6)
  kw = dict(loss="softmax", num_classes=3, max_iter=500, has_linear=False, solver=solver)
  cold = linear._fit(*args, **kw)  # pylint: disable=protected-access
  warm = linear._fit(*args, init=cold.weights, **kw)  # pylint: disable=protected-access
  assert bool(cold.info.converged) and bool(warm.info.converged)
  assert int(warm.info.num_iter) <= 1 < int(cold.info.num_iter)
  ref = linear.fit_linear(x, y, num_classes=3, l2_reg=1e-2, solver="glm").weights
  np.testing.assert_allclose(cold.weights, ref, atol=2e-4)  # tol / lambda = 1e-4 each
  batch = linear.fit_linear_batched(np.stack([x, x, x]), np.stack([y, y, y]), num_classes=3,
                                    l2_reg=1e-2, solver=solver, batch_mode="map")
  np.testing.assert_allclose(batch.weights[1], ref, atol=2e-4)


def test_auto_batch_mode_vmaps_problems_sharing_a_large_matrix_on_cpu():
  from jaxdp.training import linear as lin  # pylint: disable=import-outside-toplevel
  if jax.default_backend() != "cpu":
    assert lin.resolve_batch_mode("auto", shared_data_bytes=1) == "vmap"
    return
  assert lin.resolve_batch_mode("auto") == "map"
  assert lin.resolve_batch_mode("auto", shared_data_bytes=2 * 2 ** 20) == "map"
  assert lin.resolve_batch_mode("auto", shared_data_bytes=lin.VMAP_SHARED_DATA_BYTES) == "vmap"
  assert lin.resolve_batch_mode("map", shared_data_bytes=10 ** 9) == "map"
  with pytest.raises(ValueError, match="batch_mode"):
    lin.resolve_batch_mode("loop")


def test_label_refusals_name_the_row_not_the_label_value():
  """Issue 26 item 7: the binary-label refusal printed the label values it found."""
  x = np.full((5, 2), 0.5, np.float32)
  y = np.array([0, 1, 1, 0, 7.3141592653])
  with pytest.raises(ValueError, match=r"binary labels.*row 4 does not") as err:
    linear.check_labels(y, "logistic", None, 5)
  assert "7.31" not in str(err.value)
  with pytest.raises(ValueError, match=r"row 2 does not"):
    linear.check_labels(np.array([0, 1, -1, 1, 0]), "logistic", None, 5)
  with pytest.raises(ValueError, match=r"integer labels in \[0, 3\); row 1 does not") as err:
    linear.fit_linear(x, np.array([0, 2.5, 1, 0, 1]), num_classes=3, l2_reg=0.1)
  assert "2.5" not in str(err.value)
