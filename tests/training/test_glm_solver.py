"""Tests of the linear-model L-BFGS on the scores (jaxdp/training/glm_solver.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

from jaxdp.training import certified_solve, glm_solver, linear


def _data(seed=0, n=300, d=6, c=3, binary=False):
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(c, d))
  y = rng.integers(0, c, size=n)
  x = centers[y] + rng.normal(size=(n, d))
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  if binary:
    y = (y > 0).astype(np.float32)
  return x.astype(np.float32), y


def _scipy_minimiser(x, y, loss, lam, lin, shape, h=0.5):
  """float64 minimiser of J (scipy L-BFGS-B, gtol far below every tol tested here)."""
  x64 = x.astype(np.float64)
  fun = lambda v: (lambda fg: (fg[0], fg[1].reshape(-1)))(certified_solve.objective_and_grad(
      v.reshape(shape), x64, y, loss=loss, h=h, l2_total=lam, linear_term=lin))
  res = scipy.optimize.minimize(fun, np.zeros(int(np.prod(shape))), jac=True, method="L-BFGS-B",
                                options=dict(maxiter=5000, gtol=1e-13, ftol=0.0))
  w = res.x.reshape(shape)
  g = certified_solve.objective_and_grad(w, x64, y, loss=loss, h=h, l2_total=lam,
                                         linear_term=lin)[1]
  assert np.linalg.norm(g) < 1e-8  # so ||w - w*|| < 1e-8 / lam: negligible against tol / lam
  return w


@functools.partial(jax.jit, static_argnames=("loss",))
def _solve(x, y, lam, lin, init, tol, *, loss, h=0.5):
  return glm_solver.minimize_glm(x, y, loss=loss, l2_total=lam, init=init, linear_term=lin, h=h,
                                 tol=tol)


@pytest.mark.parametrize("loss", ["softmax", "logistic", "huber"])
def test_reaches_tol_and_matches_float64_minimiser_within_tol_over_lambda(loss):
  """Strong convexity: ||w - w*|| <= ||grad J(w)|| / Lambda <= tol / Lambda."""
  binary = loss != "softmax"
  x, y = _data(seed=1, binary=binary)
  shape = (6,) if binary else (6, 3)
  lam, tol = 0.02, 1e-5
  lin = np.random.default_rng(2).normal(size=shape).astype(np.float32) * 0.05
  w, info = _solve(jnp.asarray(x), jnp.asarray(y), lam, jnp.asarray(lin), jnp.zeros(shape), tol,
                   loss=loss)
  assert bool(info.converged) and float(info.grad_norm) <= tol
  w_star = _scipy_minimiser(x, y, loss, lam, lin.astype(np.float64), shape)
  assert np.linalg.norm(np.asarray(w, np.float64) - w_star) <= (tol + 1e-8) / lam
  # The float64 certificate of the float32 iterate holds too (route 0, no repair).
  cert = certified_solve.certify_minimizers(w, x, y, loss=loss, h=0.5, l2_total=lam, tol=2 * tol,
                                            linear_term=lin.astype(np.float64))
  assert int(cert.route) == 0 and cert.distance <= cert.radius


def test_info_is_evaluated_afresh_at_the_returned_point():
  x, y = _data()
  w, info = _solve(jnp.asarray(x), jnp.asarray(y), 0.01, jnp.zeros((6, 3)), jnp.zeros((6, 3)),
                   1e-6, loss="softmax")
  obj = jax.jit(lambda v: linear.linear_objective(v, x, y, l2_reg=0.01))
  np.testing.assert_allclose(float(info.value), float(obj(w)), rtol=1e-6)
  grad_norm = jax.jit(lambda v: jnp.linalg.norm(jax.grad(obj)(v)))
  np.testing.assert_allclose(float(info.grad_norm), float(grad_norm(w)),
                             rtol=0.05, atol=2e-7)
  assert 0 < int(info.num_iter) < 60


def test_iteration_cap_reports_not_converged():
  x, y = _data()
  # Jitted (one compiled program instead of the eager dispatch of every primitive).
  capped = jax.jit(functools.partial(glm_solver.minimize_glm, loss="softmax", max_iter=2))
  _, info = capped(jnp.asarray(x), jnp.asarray(y), l2_total=1e-3, init=jnp.zeros((6, 3)),
                   tol=1e-7)
  assert int(info.num_iter) == 2 and not bool(info.converged) and float(info.grad_norm) > 1e-7


def test_vmap_equals_loop_over_lambdas_and_linear_terms():
  x, y = _data()
  lams = jnp.asarray([1e-3, 1e-2, 1e-1])
  lins = jnp.asarray(np.random.default_rng(3).normal(size=(3, 6, 3)) * 0.05, jnp.float32)
  xj, yj, w0 = jnp.asarray(x), jnp.asarray(y), jnp.zeros((6, 3))
  wb, ib = jax.vmap(lambda l, b: _solve(xj, yj, l, b, w0, 1e-6, loss="softmax"))(lams, lins)
  for i in range(3):
    wi, ii = _solve(xj, yj, lams[i], lins[i], w0, 1e-6, loss="softmax")
    np.testing.assert_allclose(wb[i], wi, rtol=1e-4, atol=2e-5)
    assert bool(ib.converged[i]) and bool(ii.converged)


def test_warm_start_at_the_solution_stops_at_once_and_any_start_finds_it():
  x, y = _data(binary=True)
  xj, yj = jnp.asarray(x), jnp.asarray(y)
  lin = jnp.zeros((6,))
  w, _ = _solve(xj, yj, 0.01, lin, jnp.zeros(6), 1e-6, loss="logistic")
  w_again, info = _solve(xj, yj, 0.01, lin, w, 1e-6, loss="logistic")
  assert int(info.num_iter) <= 1 and bool(info.converged)
  far = jnp.asarray(np.random.default_rng(4).normal(size=6) * 20.0, jnp.float32)
  w_far, info_far = _solve(xj, yj, 0.01, lin, far, 1e-6, loss="logistic")
  assert bool(info_far.converged)
  np.testing.assert_allclose(w_far, w, atol=2e-4)  # tol/lambda = 1e-4 each
  del w_again


def test_fit_linear_solvers_agree_and_bad_solver_raises():
  x, y = _data()
  glm = linear.fit_linear(x, y, num_classes=3, l2_reg=1e-2, tol=1e-6)
  old = linear.fit_linear(x, y, num_classes=3, l2_reg=1e-2, tol=1e-6, solver="lbfgs")
  assert bool(glm.info.converged) and bool(old.info.converged)
  np.testing.assert_allclose(glm.weights, old.weights, atol=2e-4)  # both within tol/lambda = 1e-4
  with pytest.raises(ValueError, match="solver"):
    linear.fit_linear(x, y, num_classes=3, l2_reg=1e-2, solver="newton")
  with pytest.raises(ValueError, match="c1"):
    glm_solver.minimize_glm(jnp.asarray(x), jnp.asarray(y), loss="softmax", l2_total=0.1,
                            init=jnp.zeros((6, 3)), c1=0.5, c2=0.1)


def test_unregularised_fit_stays_finite():
  """Lambda = 0: the line search must not blow up (bracketing, bounded expansion)."""
  x, y = _data(binary=True)
  w, info = _solve(jnp.asarray(x), jnp.asarray(y), 0.0, jnp.zeros(6), jnp.zeros(6), 1e-6,
                   loss="logistic")
  assert bool(jnp.all(jnp.isfinite(w))) and bool(jnp.isfinite(info.value))
  ref = linear.fit_linear(x, y, loss="logistic", l2_reg=0.0, solver="lbfgs")
  assert float(info.value) <= float(ref.info.value) + 1e-6


def test_batched_certificate_equals_one_at_a_time():
  """certified_solve._certify_batch (one GEMM for all fits) == _certify_one per fit."""
  rng = np.random.default_rng(5)
  x, y = _data(n=120)
  x64 = x.astype(np.float64)
  for loss, shape, yy in (("softmax", (4, 6, 3), y), ("logistic", (4, 6), (y > 0) * 1.0),
                          ("huber", (4, 6), (y > 0) * 1.0)):
    w = rng.normal(size=shape)
    lin = rng.normal(size=shape) * 0.1
    batch = certified_solve._certify_batch(w, x64, yy, lin, loss=loss, h=0.5, l2_total=0.1)
    one = [certified_solve._certify_one(w[i], x64, yy, lin[i], np.linalg.norm(lin[i]), loss=loss,
                                        h=0.5, l2_total=0.1) for i in range(4)]
    np.testing.assert_allclose(batch, one, rtol=1e-12)
    # and the gradient is the true one (finite differences in float64)
    v0, g = certified_solve.objective_and_grad(w[0], x64, yy, loss=loss, h=0.5, l2_total=0.1,
                                               linear_term=lin[0])
    e = np.zeros_like(w[0])
    e.flat[1] = 1e-6
    v1, _ = certified_solve.objective_and_grad(w[0] + e, x64, yy, loss=loss, h=0.5, l2_total=0.1,
                                               linear_term=lin[0])
    np.testing.assert_allclose((v1 - v0) / 1e-6, g.flat[1], rtol=1e-4, atol=1e-6)


# Default run: softmax (the loss of the XLA:CPU regression below) on a smaller problem; the
# regression's own size (N = 10,000, D = 50) and the binary losses under slow.
@pytest.mark.parametrize("loss, n, d", [
    ("softmax", 2_000, 20),
    pytest.param("softmax", 10_000, 50, marks=pytest.mark.slow),
    pytest.param("logistic", 10_000, 50, marks=pytest.mark.slow),
    pytest.param("huber", 10_000, 50, marks=pytest.mark.slow)])
def test_vmap_equals_map_over_linear_terms(loss, n, d):
  """Regression: under jit(vmap) over >= 4 problems, XLA:CPU miscompiled the softmax line search's
  ``phi(t) - phi(0)`` (``sum(y * t q)`` in one fusion), so vmapped fits stopped early with
  gradients 1e-4..1e-2 (and then needed the slow float64 repair). vmap and lax.map must agree."""
  rng = np.random.default_rng(0)
  c, m = 10, 8
  x = jnp.asarray(rng.normal(size=(n, d)) / np.sqrt(d), jnp.float32)
  if loss == "softmax":
    y = jnp.asarray(rng.integers(0, c, n))
    shape = (d, c)
  else:
    y = jnp.asarray(rng.integers(0, 2, n))
    shape = (d,)
  lin = jnp.asarray(rng.normal(size=(m,) + shape) * 3e-3, jnp.float32)
  fit = lambda b: glm_solver.minimize_glm(x, y, loss=loss, l2_total=1e-3, init=jnp.zeros(shape),
                                          linear_term=b, tol=1e-6)
  wv, iv = jax.jit(jax.vmap(fit))(lin)
  wm, im = jax.jit(lambda b: jax.lax.map(fit, b))(lin)
  assert np.all(np.asarray(im.grad_norm) <= 1e-6)
  assert np.all(np.asarray(iv.grad_norm) <= 1e-6), np.asarray(iv.grad_norm)
  np.testing.assert_array_equal(np.asarray(iv.num_iter), np.asarray(im.num_iter))
  np.testing.assert_allclose(np.asarray(wv), np.asarray(wm), atol=1e-4)


def test_batched_float64_polish_certifies_far_starts():
  """Route 1 (certify_minimizers' polish) runs all uncertified problems in jitted float64
  glm-solver calls (vmapped chunks): from the zero start with tol = 1e-9 (far below float32),
  every problem is certified by that polish (route 1) within tol/Lambda, and the certified
  points match a float64 scipy minimiser to the certified distance."""
  rng = np.random.default_rng(3)
  n, d, c, m = 400, 6, 3, 4
  x = rng.normal(size=(n, d))
  x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)
  y = rng.integers(0, c, n).astype(np.int32)
  lam, tol = 0.05, 1e-9
  lin = rng.normal(size=(m, d, c)) * 1e-2
  cert = certified_solve.certify_minimizers(np.zeros((m, d, c)), x, y, loss="softmax", h=0.5,
                                            l2_total=lam, tol=tol, linear_term=lin, batched=True)
  np.testing.assert_array_equal(cert.route, np.ones(m, np.int32))
  assert np.all(cert.distance <= cert.radius) and cert.radius == pytest.approx(tol / lam)
  for i in range(m):
    fun = lambda v, i=i: (lambda fg: (fg[0], fg[1].reshape(-1)))(certified_solve.objective_and_grad(
        v.reshape(d, c), x, y, loss="softmax", h=0.5, l2_total=lam, linear_term=lin[i]))
    ref = scipy.optimize.minimize(fun, cert.weights[i].reshape(-1), jac=True, method="L-BFGS-B",
                                  options=dict(maxiter=2000, gtol=1e-14, ftol=0.0)).x
    assert np.linalg.norm(cert.weights[i].reshape(-1) - ref) <= cert.distance[i] + 1e-10


def test_polish_chunks_are_equal_and_within_the_memory_budget():
  per = 8 * (2 * certified_solve._POLISH_MEMORY * 7840 + 6 * 60_000 * 10)
  for m, budget in ((100, 2 ** 31), (1000, 2 ** 31), (7, 3 * per), (5, 2 * per), (3, 1)):
    chunks = certified_solve.polish_num_chunks(m, 60_000, 7840, 10, budget)
    size = -(-m // chunks)  # batching.map_in_chunks' equal chunks
    assert size * per <= max(budget, per)  # one problem per chunk at least
    assert chunks * size - m < chunks  # equal chunks: the padding is under one per chunk
  assert certified_solve.polish_num_chunks(100, 60_000, 7840, 10) == 2


# Default run: logistic (the chunking does not depend on the loss; softmax's batched polish is
# also checked by test_batched_float64_polish_certifies_far_starts); softmax under slow.
@pytest.mark.parametrize("loss", [pytest.param("softmax", marks=pytest.mark.slow), "logistic"])
def test_chunked_polish_equals_one_chunk(loss):
  """Chunks of 2 (the last one padded by repeating its final problem) give the same polished
  points and iteration counts as all 5 problems in one vmapped chunk, each certified."""
  rng = np.random.default_rng(4)
  n, d, c, m = 300, 5, 3, 5
  x = rng.normal(size=(n, d))
  x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)
  if loss == "softmax":
    y, shape = rng.integers(0, c, n).astype(np.int32), (d, c)
  else:
    y, shape = rng.integers(0, 2, n).astype(np.int32), (d,)
  lam, tol = 0.05, 1e-9
  lin = rng.normal(size=(m,) + shape) * 1e-2
  w0 = rng.normal(size=(m,) + shape) * 0.1
  kw = dict(loss=loss, h=0.5, l2_total=lam, tol=tol)
  outputs = c if loss == "softmax" else 1
  per = 8 * (2 * certified_solve._POLISH_MEMORY * int(np.prod(shape)) + 6 * n * outputs)
  w_one, it_one = certified_solve._polish64_batched(w0, x, y, lin, **kw)
  w_two, it_two = certified_solve._polish64_batched(w0, x, y, lin, chunk_bytes=2 * per, **kw)
  assert w_two.shape == w0.shape and it_two.shape == (m,)
  np.testing.assert_array_equal(it_one, it_two)
  np.testing.assert_allclose(w_two, w_one, rtol=1e-9, atol=1e-12)
  g = certified_solve._certify_batch(w_two, x, y, lin, loss=loss, h=0.5, l2_total=lam)
  assert np.all(g <= tol)
