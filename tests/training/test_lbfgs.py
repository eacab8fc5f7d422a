"""Tests of the jitted, vmappable L-BFGS driver (jaxdp/training/lbfgs.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.training.lbfgs import minimize_lbfgs


@functools.partial(jax.jit, static_argnames=("max_iter",))
def _solve_quadratic(a, b, tol, max_iter=500):
  """argmin 0.5 w^T A w - b^T w from zero; one compilation per shape, shared by the tests."""
  return minimize_lbfgs(lambda w: 0.5 * w @ a @ w - b @ w, jnp.zeros(b.shape), tol=tol,
                        max_iter=max_iter)


def _quadratic_problem(seed: int, d: int = 6):
  rng = np.random.default_rng(seed)
  m = rng.normal(size=(d, d))
  a = m @ m.T / d + 0.5 * np.eye(d)
  b = rng.normal(size=d)
  return jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)


def test_quadratic_minimum_matches_linear_solve():
  a, b = _quadratic_problem(0)
  w, info = _solve_quadratic(a, b, 1e-5)
  expected = np.linalg.solve(np.asarray(a, np.float64), np.asarray(b, np.float64))
  np.testing.assert_allclose(w, expected, rtol=1e-4, atol=1e-4)
  assert bool(info.converged)
  assert float(info.grad_norm) <= 1e-5
  assert 0 < int(info.num_iter) < 100


def test_pytree_params_and_rosenbrock():
  fun = lambda p: (1.0 - p["x"]) ** 2 + 100.0 * (p["y"] - p["x"] ** 2) ** 2
  # jitted: one compilation instead of the eager dispatch of the code around the loop.
  p, info = jax.jit(lambda p0: minimize_lbfgs(fun, p0, tol=1e-4, max_iter=300))(
      {"x": jnp.asarray(-1.2), "y": jnp.asarray(1.0)})
  assert bool(info.converged)
  np.testing.assert_allclose([p["x"], p["y"]], [1.0, 1.0], atol=1e-3)


def test_iteration_cap_reports_not_converged():
  a, b = _quadratic_problem(1, d=20)
  _, info = _solve_quadratic(a, b, 1e-8, max_iter=2)
  assert int(info.num_iter) == 2
  assert not bool(info.converged)
  assert float(info.grad_norm) > 1e-8


def test_vmap_equals_loop():
  problems = [_quadratic_problem(s) for s in range(4)]
  a = jnp.stack([p[0] for p in problems])
  b = jnp.stack([p[1] for p in problems])

  # vmap of the jitted solver (one batched compilation); the loop reuses the single-problem
  # compilation of test_quadratic_minimum_matches_linear_solve (same shapes).
  w_batch, info_batch = jax.vmap(_solve_quadratic, in_axes=(0, 0, None))(a, b, 1e-6)
  for i in range(4):
    w_i, info_i = _solve_quadratic(a[i], b[i], 1e-6)
    np.testing.assert_allclose(w_batch[i], w_i, rtol=1e-5, atol=1e-5)
    assert bool(info_batch.converged[i]) and bool(info_i.converged)


def test_negative_max_iter_raises():
  with pytest.raises(ValueError, match="max_iter"):
    minimize_lbfgs(lambda w: jnp.sum(w ** 2), jnp.zeros(2), max_iter=-1)
