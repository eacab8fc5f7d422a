"""Tests of the jitted, vmappable L-BFGS driver (jaxdp/training/lbfgs.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.training.lbfgs import minimize_lbfgs


def _quadratic_problem(seed: int, d: int = 6):
  rng = np.random.default_rng(seed)
  m = rng.normal(size=(d, d))
  a = m @ m.T / d + 0.5 * np.eye(d)
  b = rng.normal(size=d)
  return jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)


def test_quadratic_minimum_matches_linear_solve():
  a, b = _quadratic_problem(0)
  fun = lambda w: 0.5 * w @ a @ w - b @ w
  w, info = jax.jit(lambda: minimize_lbfgs(fun, jnp.zeros(6), tol=1e-5))()
  expected = np.linalg.solve(np.asarray(a, np.float64), np.asarray(b, np.float64))
  np.testing.assert_allclose(w, expected, rtol=1e-4, atol=1e-4)
  assert bool(info.converged)
  assert float(info.grad_norm) <= 1e-5
  assert 0 < int(info.num_iter) < 100


def test_pytree_params_and_rosenbrock():
  fun = lambda p: (1.0 - p["x"]) ** 2 + 100.0 * (p["y"] - p["x"] ** 2) ** 2
  p, info = minimize_lbfgs(fun, {"x": jnp.asarray(-1.2), "y": jnp.asarray(1.0)}, tol=1e-4,
                           max_iter=300)
  assert bool(info.converged)
  np.testing.assert_allclose([p["x"], p["y"]], [1.0, 1.0], atol=1e-3)


def test_iteration_cap_reports_not_converged():
  a, b = _quadratic_problem(1, d=20)
  fun = lambda w: 0.5 * w @ a @ w - b @ w
  _, info = minimize_lbfgs(fun, jnp.zeros(20), tol=1e-8, max_iter=2)
  assert int(info.num_iter) == 2
  assert not bool(info.converged)
  assert float(info.grad_norm) > 1e-8


def test_vmap_equals_loop():
  problems = [_quadratic_problem(s) for s in range(4)]
  a = jnp.stack([p[0] for p in problems])
  b = jnp.stack([p[1] for p in problems])

  def solve(ai, bi):
    return minimize_lbfgs(lambda w: 0.5 * w @ ai @ w - bi @ w, jnp.zeros(6), tol=1e-6)

  w_batch, info_batch = jax.jit(jax.vmap(solve))(a, b)
  solve_one = jax.jit(solve)
  for i in range(4):
    w_i, info_i = solve_one(a[i], b[i])
    np.testing.assert_allclose(w_batch[i], w_i, rtol=1e-5, atol=1e-5)
    assert bool(info_batch.converged[i]) and bool(info_i.converged)


def test_negative_max_iter_raises():
  with pytest.raises(ValueError, match="max_iter"):
    minimize_lbfgs(lambda w: jnp.sum(w ** 2), jnp.zeros(2), max_iter=-1)
