"""The SGD workload matrix A and the error of a factorization ``A = B C``.

Training with momentum ``beta`` and learning rates ``eta_t`` (Denisov et al.
2022, "Improved differential privacy for SGD via optimal private linear
operators on adaptive streams", Sec. 2; Choquette-Choo et al. 2023,
"Multi-epoch matrix factorization mechanisms for private machine learning",
Sec. 2) runs

  m_t = beta m_{t-1} + g_t,    theta_t = theta_{t-1} - eta_t m_t,

so the parameters are the linear map ``theta_t - theta_0 = -(A g)_t`` of the
gradient stream with

  A = S diag(eta) M,

``S`` the n x n prefix-sum matrix (all ones on and below the diagonal) and
``M`` the lower-triangular Toeplitz matrix ``M[t, s] = beta^(t-s)``. With
``beta = 0`` and ``eta = 1``, ``A = S``.

The matrix mechanism with strategy ``C`` adds ``A C^{-1} z``, ``z ~ N(0, I)``,
to the parameters, so (for unit sensitivity) its squared error is

* ``"total"``: ``||A C^{-1}||_F^2`` (summed over the n steps),
* ``"mean"``: ``||A C^{-1}||_F^2 / n`` (per step; JAX Privacy's
  ``mean_error`` and the squared RMSE of McKenna 2024, "Scaling up the banded
  matrix factorization mechanism"),
* ``"max"``: ``max_t ||row_t(A C^{-1})||_2^2`` (the worst step; JAX Privacy's
  ``max_error``, the objective of Dvijotham et al. 2024 for BLTs).

:func:`workload_error` evaluates these for a Toeplitz ``C^{-1}`` given by its
coefficients without forming dense n x n products: ``M C^{-1}`` is Toeplitz
(a convolution of coefficients); with constant learning rates ``A C^{-1}`` is
Toeplitz too (O(n log n)); otherwise ``A C^{-1} = S diag(eta) (M C^{-1})`` is a
column-wise cumulative sum of an O(n^2) array.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation

ERROR_KINDS = ("total", "mean", "max")


def check_momentum(momentum) -> float:
  """Returns ``momentum`` as a float in [0, 1) or raises ValueError naming it."""
  if isinstance(momentum, (bool, np.bool_)) or momentum is None:
    raise TypeError(f"momentum must be a real number in [0, 1), got {momentum!r}.")
  try:
    beta = float(momentum)
  except (TypeError, ValueError) as err:
    raise TypeError(f"momentum must be a real number in [0, 1), got {momentum!r}.") from err
  if not (math.isfinite(beta) and 0.0 <= beta < 1.0):
    raise ValueError(f"momentum must lie in [0, 1), got {momentum!r}.")
  return beta


def check_learning_rates(learning_rates, num_steps: int) -> np.ndarray | None:
  """Returns the learning rates as a float64 vector of length ``num_steps`` (None stays None).

  None means the constant rate 1 (errors scale with ``eta^2``, so a constant
  rate does not change which strategy is best).
  """
  if learning_rates is None:
    return None
  try:
    eta = np.asarray(learning_rates, dtype=np.float64)
  except (TypeError, ValueError) as err:
    raise TypeError("learning_rates must be a 1-D array of positive numbers.") from err
  if eta.shape != (num_steps,):
    raise ValueError(f"learning_rates must have shape ({num_steps},) (one per step), got "
                     f"{eta.shape}.")
  if not np.all(np.isfinite(eta)) or np.any(eta <= 0):
    raise ValueError("learning_rates must be finite and > 0.")
  return eta


def check_error_kind(kind) -> str:
  if kind not in ERROR_KINDS:
    raise ValueError(f"error kind must be one of {ERROR_KINDS}, got {kind!r}.")
  return kind


def sgd_workload(num_steps, *, momentum=0.0, learning_rates=None) -> np.ndarray:
  """The dense n x n workload ``A = S diag(eta) M`` (float64; for tests and small n).

  Args:
    num_steps: n, the number of training steps.
    momentum: ``beta`` in [0, 1) (heavy-ball momentum ``m_t = beta m_{t-1} + g_t``).
    learning_rates: ``eta_1..eta_n`` (positive), or None for constant 1.

  Returns:
    ``A`` with ``theta_t - theta_0 = -(A g)_t``.
  """
  n = _validation.check_positive_int(num_steps, "num_steps")
  beta = check_momentum(momentum)
  eta = check_learning_rates(learning_rates, n)
  if eta is None:
    eta = np.ones(n)
  lag = np.arange(n)[:, None] - np.arange(n)[None, :]
  m = np.where(lag >= 0, beta ** np.clip(lag, 0, None), 0.0)
  if beta == 0.0:
    m = np.eye(n)
  s = np.tril(np.ones((n, n)))
  return s @ (eta[:, None] * m)


_DIRECT_MAX_N = 64  # below this, direct convolutions / triangular solves (cheaper to compile)


def _fft_conv(a: jax.Array, b: jax.Array, n: int) -> jax.Array:
  """First n entries of the full convolution of a and b (lengths <= n).

  Direct for short inputs, FFT (O(n log n)) otherwise.
  """
  if max(a.shape[0], b.shape[0]) <= _DIRECT_MAX_N:
    return jnp.convolve(a, b, mode="full", precision=jax.lax.Precision.HIGHEST)[:n]
  size = 1 << max(1, (a.shape[0] + b.shape[0] - 2).bit_length())
  fa = jnp.fft.rfft(a, size)
  fb = jnp.fft.rfft(b, size)
  return jnp.fft.irfft(fa * fb, size)[:n]


def toeplitz_inverse(coefs: jax.Array, *, method: str = "auto") -> jax.Array:
  """Coefficients of ``C^{-1}`` for lower-triangular Toeplitz ``C`` (jittable, differentiable).

  ``method="newton"``: Newton's iteration for power-series inversion,
  ``d <- d (2 - c d) mod x^(2m)`` (doubling the number of correct coefficients
  each step) with FFT convolutions, O(n log^2 n). ``method="solve"``: a dense
  triangular solve ``C d = e_0``, O(n^2) (cheaper to compile for small n).
  ``"auto"`` solves for n <= 64 and uses Newton above. ``coefs[0]`` must be
  nonzero.
  """
  n = coefs.shape[0]
  if method not in ("auto", "newton", "solve"):
    raise ValueError(f"method must be 'auto', 'newton' or 'solve', got {method!r}.")
  if method == "solve" or (method == "auto" and n <= _DIRECT_MAX_N):
    lag = jnp.arange(n)[:, None] - jnp.arange(n)[None, :]
    c = jnp.where(lag >= 0, coefs[jnp.clip(lag, 0, n - 1)], 0.0)
    e0 = jnp.zeros(n, coefs.dtype).at[0].set(1.0)
    return jax.scipy.linalg.solve_triangular(c, e0, lower=True)
  d = (1.0 / coefs[0])[None]
  m = 1
  while m < n:
    m = min(2 * m, n)
    cd = _fft_conv(coefs[:m], d, m)
    two_minus = -cd.at[0].add(-2.0)
    d = _fft_conv(d, two_minus, m)
  return d


def _momentum_filter(d: jax.Array, beta) -> jax.Array:
  """Coefficients of ``M D`` for Toeplitz D with coefficients d (``M[t,s] = beta^(t-s)``).

  ``beta`` is a Python float (0 skips the filter) or a traced scalar.
  """
  if isinstance(beta, (int, float)) and beta == 0.0:
    return d
  n = d.shape[0]
  powers = jnp.asarray(beta, d.dtype) ** jnp.arange(n, dtype=d.dtype)
  return _fft_conv(d, powers, n)


def _workload_error_impl(inverse_coefs, beta: float, eta, kind: str):
  n = inverse_coefs.shape[0]
  e = _momentum_filter(inverse_coefs, beta)  # coefficients of M C^{-1}
  if eta is None:
    p = jnp.cumsum(e)  # A C^{-1} = S (M C^{-1}) is Toeplitz with coefficients p
    if kind == "max":  # row t has squared norm sum_{k<=t} p_k^2, largest at t = n-1
      return jnp.sum(p * p)
    weights = jnp.arange(n, 0, -1, dtype=p.dtype)  # coefficient p_k appears n - k times
    total = jnp.sum(weights * p * p)
    return total / n if kind == "mean" else total
  eta = jnp.asarray(eta, dtype=inverse_coefs.dtype)
  lag = jnp.arange(n)[:, None] - jnp.arange(n)[None, :]
  q = jnp.where(lag >= 0, eta[:, None] * e[jnp.clip(lag, 0, n - 1)], 0.0)  # diag(eta) M C^{-1}
  p = jnp.cumsum(q, axis=0)  # S diag(eta) M C^{-1}
  sq = p * p
  if kind == "max":
    return jnp.max(jnp.sum(sq, axis=1))
  total = jnp.sum(sq)
  return total / n if kind == "mean" else total


def workload_error(inverse_coefs, *, momentum=0.0, learning_rates=None, kind="total"):
  """Squared error of ``A C^{-1}`` for Toeplitz ``C^{-1}`` (jittable in ``inverse_coefs``).

  Args:
    inverse_coefs: the n coefficients ``d_0..d_{n-1}`` of the lower-triangular
      Toeplitz ``C^{-1}`` (a jax or numpy vector; may be traced). Concrete
      inputs are evaluated in float64; traced ones in their own dtype (trace
      under ``jax.enable_x64(True)`` for float64, as the optimisers do).
    momentum: ``beta`` in [0, 1).
    learning_rates: length-n positive rates, or None for constant 1.
    kind: ``"total"`` (``||A C^{-1}||_F^2``), ``"mean"`` (that over n) or
      ``"max"`` (largest squared row norm), see the module docstring.

  Returns:
    A scalar jax array. Time and memory O(n log n) for constant learning rates,
    O(n^2) otherwise; no n x n matrix product is formed.
  """
  beta = check_momentum(momentum)
  kind = check_error_kind(kind)
  if isinstance(inverse_coefs, jax.core.Tracer):
    if inverse_coefs.ndim != 1:
      raise ValueError("inverse_coefs must be a 1-D vector.")
    n = inverse_coefs.shape[0]
    eta = check_learning_rates(learning_rates, n)
    return _workload_error_impl(inverse_coefs, beta, eta, kind)
  d = np.asarray(inverse_coefs, dtype=np.float64)
  if d.ndim != 1 or d.size == 0:
    raise ValueError(f"inverse_coefs must be a non-empty 1-D vector, got shape {d.shape}.")
  if not np.all(np.isfinite(d)):
    raise ValueError("inverse_coefs must be finite.")
  eta = check_learning_rates(learning_rates, d.size)
  with jax.enable_x64(True):
    return _workload_error_jit(jnp.asarray(d, jnp.float64), beta, eta, kind)


def _workload_error_jit(d, beta, eta, kind):
  eta_arg = None if eta is None else jnp.asarray(eta, jnp.float64)
  if beta == 0.0:
    total, worst = _jitted_errors(d, eta_arg)
  else:
    total, worst = _jitted_errors_momentum(d, eta_arg, jnp.asarray(beta, jnp.float64))
  return {"total": total, "mean": total / d.shape[0], "max": worst}[kind]


def _both_errors(d, beta, eta):
  return (_workload_error_impl(d, beta, eta, "total"), _workload_error_impl(d, beta, eta, "max"))


# One compiled program per (n, schedule or not, momentum or not) gives every kind.
_jitted_errors = jax.jit(lambda d, eta: _both_errors(d, 0.0, eta))
_jitted_errors_momentum = jax.jit(lambda d, eta, beta: _both_errors(d, beta, eta))


__all__ = ["ERROR_KINDS", "sgd_workload", "toeplitz_inverse", "workload_error"]
