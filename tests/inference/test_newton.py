"""jaxdp.inference.newton: the damped Newton solver (float64), cold and warm starts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.inference import newton

# Each function as ONE compiled program per configuration (called op by op, every primitive
# and the solver's while loop would be dispatched and compiled separately).
_minimize = jax.jit(newton.newton_minimize,
                    static_argnames=("loss", "h", "grad_tol", "max_iter", "max_backtracks"))
_grad_and_hessian = jax.jit(newton.grad_and_hessian, static_argnames=("loss", "h"))
_objective = jax.jit(newton.objective, static_argnames=("loss", "h"))


# Each loss is covered always-on by one of the two tests below; the other under ``slow``.
@pytest.mark.parametrize("loss", ["logistic", pytest.param("huber", marks=pytest.mark.slow)])
def test_warm_start_reaches_the_same_minimiser_in_fewer_steps(loss):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3000, 5))
  x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
  y = np.where(x @ np.array([2.0, -1.0, 0.5, 0.0, 1.0]) + 0.3 * rng.normal(size=3000) > 0,
               1.0, -1.0)
  w = rng.multinomial(3000, np.full(3000, 1 / 3000)).astype(float)  # a bootstrap replicate
  lin = 1e-3 * rng.normal(size=5)
  with jax.enable_x64(True):
    args = (jnp.asarray(x), jnp.asarray(y))
    solve = lambda ww, b, init=None: _minimize(
        *args, jnp.asarray(ww), 0.01, jnp.asarray(b), loss=loss, grad_tol=1e-12, init=init)
    start = solve(np.ones(3000), np.zeros(5)).theta  # the unweighted, unperturbed minimiser
    cold = solve(w, lin)
    warm = solve(w, lin, start)
    assert float(cold.grad_norm) <= 1e-12 and float(warm.grad_norm) <= 1e-12
    # Lambda-strong convexity: both within grad_norm / Lambda of the same minimiser.
    np.testing.assert_allclose(np.asarray(warm.theta), np.asarray(cold.theta), atol=2e-10)
    assert int(warm.num_iter) < int(cold.num_iter)


@pytest.mark.parametrize("loss", [pytest.param("logistic", marks=pytest.mark.slow), "huber"])
def test_chord_first_step_and_cold_starts_reach_the_minimiser(loss):
  """init_hessian (a nearby problem's Hessian for the first step) and the default starts."""
  rng = np.random.default_rng(1)
  n, d = 4000, 6
  x = rng.normal(size=(n, d))
  x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
  y = np.where(x @ rng.normal(size=d) + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
  w = rng.multinomial(n, np.full(n, 1 / n)).astype(float)
  lin = 1e-3 * rng.normal(size=d)
  with jax.enable_x64(True):
    xj, yj = jnp.asarray(x), jnp.asarray(y)
    base = _minimize(xj, yj, jnp.ones(n), 0.01, jnp.zeros(d), loss=loss,
                                  grad_tol=1e-13).theta
    _, h_base = _grad_and_hessian(base, xj, yj, jnp.ones(n), 0.01, jnp.zeros(d),
                                        loss=loss, h=0.5)
    cold = _minimize(xj, yj, jnp.asarray(w), 0.01, jnp.asarray(lin), loss=loss,
                                  grad_tol=1e-12)
    chord = _minimize(xj, yj, jnp.asarray(w), 0.01, jnp.asarray(lin), loss=loss,
                                   grad_tol=1e-12, init=base, init_hessian=h_base,
                                   x_hessian=xj.astype(jnp.float32))
    for res in (cold, chord):
      assert float(res.grad_norm) <= 1e-12
    np.testing.assert_allclose(np.asarray(chord.theta), np.asarray(cold.theta), atol=2e-10)
    # The exact gradient at the result (not the solver's own report) is small.
    g, _ = _grad_and_hessian(chord.theta, xj, yj, jnp.asarray(w), 0.01, jnp.asarray(lin),
                                   loss=loss, h=0.5)
    assert float(jnp.linalg.norm(g)) <= 1e-11


def test_logistic_trapezoid_bound_used_for_step_acceptance_holds():
  """J(theta + s) - J(theta) <= (phi'(0) + phi'(1))/2 + max|x.s|^3 / (6 sqrt 3) / 12."""
  rng = np.random.default_rng(5)
  n, d = 500, 4
  x = rng.normal(size=(n, d))
  x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
  y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
  w = rng.integers(0, 3, size=n).astype(float)
  worst, worst_no_cube = -np.inf, -np.inf
  with jax.enable_x64(True):
    lin = jnp.asarray(1e-3 * rng.normal(size=d))
    args = (jnp.asarray(x), jnp.asarray(y), jnp.asarray(w), 0.01, lin)
    for scale in (0.1, 1.0, 3.0, 10.0):
      for _ in range(20):
        theta, step = rng.normal(size=d), scale * rng.normal(size=d)
        j0 = float(_objective(jnp.asarray(theta), *args, loss="logistic", h=0.5))
        j1 = float(_objective(jnp.asarray(theta + step), *args, loss="logistic", h=0.5))
        g0, _ = _grad_and_hessian(jnp.asarray(theta), *args, loss="logistic", h=0.5)
        g1, _ = _grad_and_hessian(jnp.asarray(theta + step), *args, loss="logistic", h=0.5)
        trapezoid = 0.5 * float(g0 @ step + g1 @ step)
        bound = trapezoid + np.max(np.abs(x @ step)) ** 3 / (6 * np.sqrt(3)) / 12
        worst = max(worst, (j1 - j0) - bound)
        worst_no_cube = max(worst_no_cube, (j1 - j0) - trapezoid)
  assert worst <= 1e-12
  # The cubic term is needed: the trapezoid value alone is exceeded somewhere.
  assert worst_no_cube > 0
