"""jaxdp.inference.newton: the damped Newton solver (float64), cold and warm starts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.inference import newton


@pytest.mark.parametrize("loss", ["logistic", "huber"])
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
    solve = lambda ww, b, init=None: newton.newton_minimize(
        *args, jnp.asarray(ww), 0.01, jnp.asarray(b), loss=loss, grad_tol=1e-12, init=init)
    start = solve(np.ones(3000), np.zeros(5)).theta  # the unweighted, unperturbed minimiser
    cold = solve(w, lin)
    warm = solve(w, lin, start)
    assert float(cold.grad_norm) <= 1e-12 and float(warm.grad_norm) <= 1e-12
    # Lambda-strong convexity: both within grad_norm / Lambda of the same minimiser.
    np.testing.assert_allclose(np.asarray(warm.theta), np.asarray(cold.theta), atol=2e-10)
    assert int(warm.num_iter) < int(cold.num_iter)


@pytest.mark.parametrize("loss", ["logistic", "huber"])
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
    base = newton.newton_minimize(xj, yj, jnp.ones(n), 0.01, jnp.zeros(d), loss=loss,
                                  grad_tol=1e-13).theta
    _, h_base = newton.grad_and_hessian(base, xj, yj, jnp.ones(n), 0.01, jnp.zeros(d),
                                        loss=loss, h=0.5)
    cold = newton.newton_minimize(xj, yj, jnp.asarray(w), 0.01, jnp.asarray(lin), loss=loss,
                                  grad_tol=1e-12)
    chord = newton.newton_minimize(xj, yj, jnp.asarray(w), 0.01, jnp.asarray(lin), loss=loss,
                                   grad_tol=1e-12, init=base, init_hessian=h_base,
                                   x_hessian=xj.astype(jnp.float32))
    for res in (cold, chord):
      assert float(res.grad_norm) <= 1e-12
    np.testing.assert_allclose(np.asarray(chord.theta), np.asarray(cold.theta), atol=2e-10)
    # The exact gradient at the result (not the solver's own report) is small.
    g, _ = newton.grad_and_hessian(chord.theta, xj, yj, jnp.asarray(w), 0.01, jnp.asarray(lin),
                                   loss=loss, h=0.5)
    assert float(jnp.linalg.norm(g)) <= 1e-11
