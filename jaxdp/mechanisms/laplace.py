"""The Laplace mechanism (L1 sensitivity, pure epsilon-DP).

Reference: C. Dwork and A. Roth, *The Algorithmic Foundations of Differential
Privacy* (2014), Definition 3.3 (Laplace mechanism) and Theorem 3.6: for a
function ``f`` with L1 sensitivity ``Delta_1 = max_{D~D'} ||f(D) - f(D')||_1``,
releasing ``f(D) + (Y_1, ..., Y_k)`` with ``Y_i`` i.i.d. ``Lap(b)``, density
``exp(-|y|/b) / (2b)``, ``b = Delta_1 / epsilon``, is ``(epsilon, 0)``-DP.

Proof sketch (the reason for the constant): the density ratio at any output
``z`` is ``exp((||z - f(D')||_1 - ||z - f(D)||_1) / b) <= exp(Delta_1 / b)``
by the triangle inequality.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxdp import _validation
from jaxdp.accounting import events as _events
from jaxdp.mechanisms import _common
from jaxdp.mechanisms import _sampling


def laplace_noise(
    key: jax.Array,
    shape: _common.Shape,
    scale: Any,
    dtype: Any = jnp.float32,
) -> jax.Array:
  """Draws i.i.d. ``Lap(scale)`` noise, density ``exp(-|x|/scale) / (2 scale)``.

  Raw sampler: ``scale`` may be a traced array (vmap over it) broadcastable to
  ``shape`` (e.g. one scale per coordinate); concrete scales are checked to be
  finite and >= 0 (``scale = 0`` gives zeros, e.g. for non-private baselines)
  and are cast to ``dtype`` rounding *up* (:func:`_common.noise_scale_as`).
  Mean 0, variance ``2 scale^2``, ``P(|X| > t) = exp(-t/scale)``. Drawn as
  ``sign * Exp(1)`` with a 127-bit uniform (two Threefry blocks), so float32
  samples reach ``88.03 scale`` and the cut-off mass is ``2^-127`` per
  coordinate (``jax.random.laplace`` stops near ``16.6 scale``, which leaks a
  ``delta`` of order ``1e-7``). The exact formal statement (a pure
  ``eps``-DP release of ``d`` coordinates is ``(eps, (d - 1 + e^eps)
  2^-127)``-DP in real arithmetic; the float grid is a separate caveat) is in
  :mod:`jaxdp.mechanisms._sampling`.

  Args:
    key: a ``jax.random`` key, used once.
    shape: static output shape.
    scale: Laplace scale ``b`` (not the standard deviation, which is ``sqrt(2) b``).
    dtype: floating dtype of the result.

  Returns:
    An array of ``shape`` and ``dtype``.
  """
  _common.check_key(key)
  _common.check_dtype(dtype)
  _common.check_scale(scale, "scale")
  shape = _common.normalize_shape(shape)
  unit = _sampling.standard_laplace(key, shape, dtype)
  return unit * _common.noise_scale_as(scale, dtype, round_up=True)


def laplace_scale(l1_sensitivity: float, epsilon: float) -> float:
  """The Laplace scale ``b = Delta_1 / epsilon`` of Dwork & Roth Theorem 3.6.

  Raises:
    ValueError: ``epsilon`` not in (0, inf) or ``l1_sensitivity`` not in (0, inf).
  """
  _common.require_static(epsilon, "epsilon")
  _common.require_static(l1_sensitivity, "l1_sensitivity")
  eps = _validation.check_epsilon(epsilon, "epsilon")
  sens = _validation.check_positive(l1_sensitivity, "l1_sensitivity")
  return sens / eps


def laplace_mechanism(
    key: jax.Array,
    value: Any,
    l1_sensitivity: float,
    epsilon: float,
) -> jax.Array:
  """Releases ``value + Lap(Delta_1/epsilon)^k``: ``(epsilon, 0)``-DP.

  Dwork & Roth (2014) Theorem 3.6. ``l1_sensitivity`` must bound
  ``||f(D) - f(D')||_1`` over neighbouring datasets *for the quantity actually
  released* (calibrating to the sensitivity of a sum but releasing the mean is a
  classic bug). Privacy parameters are validated eagerly and must be concrete;
  ``value`` may be traced. Describe the release to an accountant with
  :func:`laplace_mechanism_event`.

  Args:
    key: a ``jax.random`` key, used once.
    value: the exact answer ``f(D)`` (any shape; integer values are promoted to
      float). Concrete values with NaN/inf raise ``ValueError``; a traced
      ``value`` with a NaN/inf entry gives an all-NaN output (see
      :mod:`jaxdp.mechanisms._common`).
    l1_sensitivity: ``Delta_1 > 0``.
    epsilon: privacy parameter in (0, inf).

  Returns:
    ``value`` plus Laplace noise of scale ``Delta_1/epsilon``.
  """
  _common.check_key(key)
  scale = laplace_scale(l1_sensitivity, epsilon)
  _common.check_data(value, "value")
  value = jnp.asarray(value)
  dtype = _common.float_dtype_of(value)
  scale = _common.round_scale_up(scale, dtype)
  out = value.astype(dtype) + laplace_noise(key, value.shape, scale, dtype)
  return _common.poison_nonfinite(value, out)


def laplace_mechanism_event(
    l1_sensitivity: float, epsilon: float, *, neighbouring: str = "add_remove",
    unit: str = "example"
) -> _events.LaplaceDpEvent:
  """The DpEvent of :func:`laplace_mechanism`.

  ``LaplaceDpEvent(noise_multiplier = b / Delta_1 = 1/epsilon)`` (dp_accounting
  convention: Laplace scale over L1 sensitivity), which the RDP/PLD accountants
  compose more tightly than the pure ``epsilon`` bound.

  ``neighbouring`` (default ``"add_remove"``, dp_accounting's default) is the
  relation the sensitivity was computed for, and ``unit`` the privacy unit;
  both are carried into the event, so an accountant refuses to compose it
  with events of another relation.
  """
  scale = laplace_scale(l1_sensitivity, epsilon)
  return _events.LaplaceDpEvent(noise_multiplier=scale / float(l1_sensitivity), neighbouring=neighbouring, unit=unit)
