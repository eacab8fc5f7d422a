"""Gaussian mechanisms: analytic (Balle & Wang 2018), classic, and zCDP.

All three add ``N(0, sigma^2 I)`` to ``f(D)``; they differ in how ``sigma`` is
derived from the privacy target, for a function of L2 sensitivity
``Delta_2 = max_{D~D'} ||f(D) - f(D')||_2``:

* analytic Gaussian (B. Balle and Y.-X. Wang, "Improving the Gaussian
  mechanism for differential privacy", ICML 2018, Theorem 8 and Algorithm 1;
  ``../shared/papers/000_tradeoffs_of_private_prediction.md`` Appendix B,
  Algorithm 2, both branches): the smallest ``sigma`` with
  ``Phi(Delta/(2 sigma) - eps sigma/Delta) - e^eps Phi(-Delta/(2 sigma) - eps sigma/Delta) <= delta``,
  which is exact (necessary and sufficient) for every ``eps > 0``;
  computed in float64 by :func:`jaxdp.accounting.analytic_gaussian.analytic_gaussian_sigma`
  (re-exported here as ``analytic_gaussian_sigma``).
* classic Gaussian (Dwork & Roth 2014, Theorem A.1):
  ``sigma = Delta sqrt(2 ln(1.25/delta)) / eps``, proven only for ``eps < 1``
  (the theorem asks for ``c^2 > 2 ln(1.25/delta)``; using equality is safe
  because this sigma is always larger than the exact analytic sigma, which the
  tests check); ``classic_gaussian_sigma(epsilon, delta, sensitivity)`` is
  re-exported from :mod:`jaxdp.accounting.analytic_gaussian`.
* zCDP Gaussian (Bun & Steinke 2016, Proposition 1.6;
  ``../shared/papers/003_dp_confidence_intervals_for_erm.md`` Proposition 3):
  ``sigma = Delta / sqrt(2 rho)`` gives ``rho``-zCDP
  (``jaxdp.accounting.zcdp.gaussian_zcdp_sigma(rho, sensitivity)``).

The sigma helpers take ``(epsilon, delta, sensitivity)`` like the accounting
package; the mechanisms take ``(key, value, l2_sensitivity, epsilon, delta)``.
Sampling: Box-Muller with a 105-bit radius uniform (``|N(0, 1)| <= 12.06``;
:mod:`jaxdp.mechanisms._sampling`). A cut noise has infinite Renyi divergence,
so formally each guarantee above holds with ``delta`` increased by
``(1 + e^eps) ceil(d/2) 2^-105`` for ``d`` coordinates (the tail is stated,
not added to the events; ``_sampling.tail_delta`` computes it), and in real
arithmetic (the float-lattice caveat: ``docs/sharp_edges.md``, and the
discrete mechanisms of :mod:`jaxdp.mechanisms.discrete`).

Mechanisms refuse a zero sensitivity (a zero sensitivity means zero noise,
which is almost always a bug upstream; a truly constant function needs no
mechanism at all).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxdp import _validation
from jaxdp.accounting import events as _events
from jaxdp.accounting.analytic_gaussian import analytic_gaussian_sigma
from jaxdp.accounting.analytic_gaussian import classic_gaussian_sigma
from jaxdp.accounting.zcdp import gaussian_zcdp_sigma
from jaxdp.mechanisms import _common
from jaxdp.mechanisms import _sampling


def gaussian_noise(
    key: jax.Array,
    shape: _common.Shape,
    stddev: Any,
    dtype: Any = jnp.float32,
) -> jax.Array:
  """Draws i.i.d. ``N(0, stddev^2)`` noise.

  Raw sampler: ``stddev`` may be a traced array (vmap over it) broadcastable to
  ``shape``; concrete values are checked to be finite and >= 0 and are cast to
  ``dtype`` rounding *up* (never less noise than the float64 value).

  Args:
    key: a ``jax.random`` key, used once.
    shape: static output shape.
    stddev: standard deviation ``sigma``.
    dtype: floating dtype of the result.
  """
  _common.check_key(key)
  _common.check_dtype(dtype)
  _common.check_scale(stddev, "stddev")
  shape = _common.normalize_shape(shape)
  stddev = _common.noise_scale_as(stddev, dtype, round_up=True)
  return _sampling.standard_normal(key, shape, dtype) * stddev


def _add_gaussian(key: jax.Array, value: Any, sigma: float) -> jax.Array:
  # key and value are checked here, after the privacy parameters (by the caller).
  _common.check_key(key)
  _common.check_data(value, "value")
  value = jnp.asarray(value)
  dtype = _common.float_dtype_of(value)
  sigma = _common.round_scale_up(sigma, dtype)
  out = value.astype(dtype) + gaussian_noise(key, value.shape, sigma, dtype)
  return _common.poison_nonfinite(value, out)


def _static_args(**kwargs: Any) -> None:
  for name, v in kwargs.items():
    _common.require_static(v, name)


def _analytic_sigma(l2_sensitivity: Any, epsilon: Any, delta: Any) -> float:
  _static_args(epsilon=epsilon, delta=delta, l2_sensitivity=l2_sensitivity)
  eps = _validation.check_epsilon(epsilon, "epsilon")
  dlt = _validation.check_delta(delta, "delta", allow_zero=False)
  sens = _validation.check_positive(l2_sensitivity, "l2_sensitivity")
  return float(analytic_gaussian_sigma(eps, dlt, sensitivity=sens))


def _classic_sigma(l2_sensitivity: Any, epsilon: Any, delta: Any) -> float:
  _static_args(epsilon=epsilon, delta=delta, l2_sensitivity=l2_sensitivity)
  eps = _validation.check_epsilon(epsilon, "epsilon")
  dlt = _validation.check_delta(delta, "delta", allow_zero=False)
  sens = _validation.check_positive(l2_sensitivity, "l2_sensitivity")
  return float(classic_gaussian_sigma(eps, dlt, sensitivity=sens))


def _zcdp_sigma(l2_sensitivity: Any, rho: Any) -> float:
  _static_args(rho=rho, l2_sensitivity=l2_sensitivity)
  r = _validation.check_positive(rho, "rho")
  sens = _validation.check_positive(l2_sensitivity, "l2_sensitivity")
  return float(gaussian_zcdp_sigma(r, sensitivity=sens))


# ---------------------------------------------------------------- analytic


def gaussian_mechanism(
    key: jax.Array,
    value: Any,
    l2_sensitivity: float,
    epsilon: float,
    delta: float,
) -> jax.Array:
  """Releases ``value + N(0, sigma^2 I)`` with the analytic-Gaussian ``sigma``.

  ``(epsilon, delta)``-DP by Balle & Wang (2018) Theorem 8, for every
  ``epsilon > 0`` (no ``epsilon < 1`` restriction): ``sigma`` is the smallest
  value satisfying the exact condition
  ``Phi(Delta/(2 sigma) - eps sigma/Delta) - e^eps Phi(-Delta/(2 sigma) - eps sigma/Delta) <= delta``
  (paper 000, Appendix B, Algorithm 2 with both branches:
  ``sigma = alpha Delta / sqrt(2 eps)``). Describe the release with
  :func:`gaussian_mechanism_event`.

  Args:
    key: a ``jax.random`` key, used once.
    value: the exact answer ``f(D)`` (integer values are promoted to float).
      Concrete values with NaN/inf raise ``ValueError``; a traced ``value``
      with a NaN/inf entry gives an all-NaN output.
    l2_sensitivity: ``Delta_2 > 0`` of the released quantity.
    epsilon: in (0, inf).
    delta: in (0, 1); ``delta = 0`` is impossible with Gaussian noise.

  Raises:
    ValueError: for an argument outside its range.
    TypeError: for a traced privacy argument.
  """
  sigma = _analytic_sigma(l2_sensitivity, epsilon, delta)
  return _add_gaussian(key, value, sigma)


def gaussian_mechanism_event(
    l2_sensitivity: float, epsilon: float, delta: float,
    *, neighbouring: str = "add_remove", unit: str = "example"
) -> _events.GaussianDpEvent:
  """DpEvent of :func:`gaussian_mechanism`: ``GaussianDpEvent(sigma / Delta_2)``.

  The Gaussian event (not an ``ApproxDpEvent``) lets RDP/PLD accountants compose
  it tightly; for one use it is exactly ``(epsilon, delta)``-DP.

  ``neighbouring`` (default ``"add_remove"``, dp_accounting's default) is the
  relation the sensitivity was computed for, and ``unit`` the privacy unit;
  both are carried into the event, so an accountant refuses to compose it
  with events of another relation.
  """
  sigma = _analytic_sigma(l2_sensitivity, epsilon, delta)
  return _events.GaussianDpEvent(noise_multiplier=sigma / float(l2_sensitivity), neighbouring=neighbouring, unit=unit)


# ---------------------------------------------------------------- classic


def classic_gaussian_mechanism(
    key: jax.Array,
    value: Any,
    l2_sensitivity: float,
    epsilon: float,
    delta: float,
) -> jax.Array:
  """``value + N(0, sigma^2 I)``, ``sigma = Delta_2 sqrt(2 ln(1.25/delta))/epsilon``.

  ``(epsilon, delta)``-DP for ``0 < epsilon < 1`` only (Dwork & Roth 2014,
  Theorem A.1); ``epsilon >= 1`` raises ``ValueError``. Prefer
  :func:`gaussian_mechanism`, which is exact and never noisier.
  """
  sigma = _classic_sigma(l2_sensitivity, epsilon, delta)
  return _add_gaussian(key, value, sigma)


def classic_gaussian_mechanism_event(
    l2_sensitivity: float, epsilon: float, delta: float,
    *, neighbouring: str = "add_remove", unit: str = "example"
) -> _events.GaussianDpEvent:
  """DpEvent of :func:`classic_gaussian_mechanism`: ``GaussianDpEvent(sigma / Delta_2)``.

  ``neighbouring`` (default ``"add_remove"``, dp_accounting's default) is the
  relation the sensitivity was computed for, and ``unit`` the privacy unit;
  both are carried into the event, so an accountant refuses to compose it
  with events of another relation.
  """
  sigma = _classic_sigma(l2_sensitivity, epsilon, delta)
  return _events.GaussianDpEvent(noise_multiplier=sigma / float(l2_sensitivity), neighbouring=neighbouring, unit=unit)


# ---------------------------------------------------------------- zCDP


def zcdp_gaussian_mechanism(
    key: jax.Array,
    value: Any,
    l2_sensitivity: float,
    rho: float,
) -> jax.Array:
  """Releases ``value + N(0, sigma^2 I)``, ``sigma = Delta_2/sqrt(2 rho)``: ``rho``-zCDP.

  Paper 003 (``003_dp_confidence_intervals_for_erm.md``) Section 3,
  Proposition 3 (Bun & Steinke 2016 Prop. 1.6): the Renyi divergence of two
  Gaussians whose means are ``Delta`` apart is
  ``alpha Delta^2 / (2 sigma^2) = alpha rho``.
  """
  sigma = _zcdp_sigma(l2_sensitivity, rho)
  return _add_gaussian(key, value, sigma)


def zcdp_gaussian_mechanism_event(
    l2_sensitivity: float, rho: float,
    *, neighbouring: str = "add_remove", unit: str = "example"
) -> _events.GaussianDpEvent:
  """DpEvent of :func:`zcdp_gaussian_mechanism`.

  ``GaussianDpEvent(noise_multiplier = 1/sqrt(2 rho))``, which is exactly
  ``rho``-zCDP (a Gaussian with noise multiplier ``z`` is ``1/(2 z^2)``-zCDP)
  and lets RDP/PLD accountants compose it tightly.

  ``neighbouring`` (default ``"add_remove"``, dp_accounting's default) is the
  relation the sensitivity was computed for, and ``unit`` the privacy unit;
  both are carried into the event, so an accountant refuses to compose it
  with events of another relation.
  """
  sigma = _zcdp_sigma(l2_sensitivity, rho)
  return _events.GaussianDpEvent(noise_multiplier=sigma / float(l2_sensitivity), neighbouring=neighbouring, unit=unit)
