"""SGD workload A = S diag(eta) M and the fast Toeplitz error evaluation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.dpsgd.correlated import strategies
from jaxdp.dpsgd.correlated import workloads


def _dense_errors(a, inv):
  b = a @ inv
  sq = b * b
  n = a.shape[0]
  return {"total": sq.sum(), "mean": sq.sum() / n, "max": sq.sum(axis=1).max()}


def test_sgd_workload_matches_the_training_recursion():
  rng = np.random.default_rng(0)
  n, beta = 6, 0.7
  eta = rng.uniform(0.1, 1.0, n)
  g = rng.normal(size=n)
  m, theta, thetas = 0.0, 0.0, []
  for t in range(n):
    m = beta * m + g[t]
    theta = theta - eta[t] * m
    thetas.append(theta)
  a = workloads.sgd_workload(n, momentum=beta, learning_rates=eta)
  np.testing.assert_allclose(-a @ g, thetas, rtol=1e-12, atol=1e-12)
  np.testing.assert_array_equal(workloads.sgd_workload(4), np.tril(np.ones((4, 4))))
  assert a.dtype == np.float64


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("schedule", [False, True])
def test_fast_error_equals_dense(momentum, schedule):
  rng = np.random.default_rng(1)
  for n in (1, 9, 70) if momentum else (1, 9):  # 70: the FFT convolution path
    c = np.concatenate([[1.0], rng.uniform(-0.5, 0.5, n - 1)])
    inv = strategies.toeplitz_inverse_coefs(c, n)
    eta = rng.uniform(0.05, 2.0, n) if schedule else None
    a = workloads.sgd_workload(n, momentum=momentum, learning_rates=eta)
    want = _dense_errors(a, strategies.toeplitz_matrix(inv, n))
    for kind, value in want.items():
      got = workloads.workload_error(inv, momentum=momentum, learning_rates=eta, kind=kind)
      assert got.dtype == jnp.float64
      np.testing.assert_allclose(float(got), value, rtol=1e-12)


def test_error_of_identity_is_known_and_traceable():
  n = 10
  d = np.zeros(n)
  d[0] = 1.0
  # ||S||_F^2 = n(n+1)/2; the last row has n ones.
  assert float(workloads.workload_error(d, kind="total")) == pytest.approx(n * (n + 1) / 2)
  assert float(workloads.workload_error(d, kind="mean")) == pytest.approx((n + 1) / 2)
  assert float(workloads.workload_error(d, kind="max")) == pytest.approx(n)
  with jax.enable_x64(True):
    grad = jax.jit(jax.grad(lambda x: workloads.workload_error(x, kind="total")))(jnp.asarray(d))
  # d/dd_j of sum_k (n-k) p_k^2 with p = cumsum(d) = 1: 2 sum_{k>=j} (n-k).
  want = 2 * np.array([sum(n - k for k in range(j, n)) for j in range(n)], float)
  np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-12)


@pytest.mark.parametrize("method", ["newton", "solve"])
def test_toeplitz_inverse_matches_power_series(method):
  rng = np.random.default_rng(2)
  inverse = jax.jit(lambda c: workloads.toeplitz_inverse(c, method=method))
  for n in (1, 37):
    c = np.concatenate([[rng.uniform(0.5, 2.0)], rng.normal(0, 0.3, n - 1)])
    with jax.enable_x64(True):
      d = np.asarray(inverse(jnp.asarray(c)))
    np.testing.assert_allclose(d, strategies.toeplitz_inverse_coefs(c, n), rtol=1e-9, atol=1e-12)


def test_bad_arguments_are_refused():
  d = np.ones(4)
  with pytest.raises(ValueError, match="momentum"):
    workloads.workload_error(d, momentum=1.0)
  with pytest.raises(ValueError, match="momentum"):
    workloads.sgd_workload(4, momentum=-0.1)
  with pytest.raises(ValueError, match="momentum"):
    workloads.sgd_workload(4, momentum=float("nan"))
  with pytest.raises(TypeError, match="momentum"):
    workloads.sgd_workload(4, momentum=True)
  with pytest.raises(ValueError, match="learning_rates"):
    workloads.workload_error(d, learning_rates=np.ones(3))
  with pytest.raises(ValueError, match="learning_rates"):
    workloads.sgd_workload(4, learning_rates=[1.0, 0.0, 1.0, 1.0])
  with pytest.raises(ValueError, match="learning_rates"):
    workloads.sgd_workload(4, learning_rates=[1.0, np.inf, 1.0, 1.0])
  with pytest.raises(ValueError, match="kind"):
    workloads.workload_error(d, kind="rmse")
  with pytest.raises(ValueError, match="inverse_coefs"):
    workloads.workload_error(np.ones((2, 2)))
  with pytest.raises(ValueError, match="inverse_coefs"):
    workloads.workload_error([1.0, np.nan])
  with pytest.raises(ValueError, match="num_steps"):
    workloads.sgd_workload(0)
  with pytest.raises(ValueError, match="method"):
    workloads.toeplitz_inverse(jnp.ones(3), method="lu")
