"""The "L2 Laplace" (spherical Laplace) mechanism: density ∝ exp(-beta ||b||_2).

This is the noise of the sensitivity methods of
``../shared/papers/000_tradeoffs_of_private_prediction.md`` (Appendix A,
Equation 12, ``p(B) ∝ exp(-beta ||B||_F)`` over a whole weight matrix, used by
Algorithm 1 with ``beta = N lambda eps / (2K)``) and of
``../shared/papers/003_dp_confidence_intervals_for_erm.md`` (Section 3,
Equation 3.2, ``v(beta) ∝ exp(-gamma ||beta||_2)``, from Chaudhuri, Monteleoni
and Sarwate 2011, JMLR, Section 4).

Sampling. In polar coordinates over ``R^d`` (``d = prod(shape)``) the density
``exp(-beta r)`` times the surface element ``r^(d-1) dr dOmega`` factorises:
the radius has density ``∝ r^(d-1) exp(-beta r)``, i.e. ``Gamma(shape=d,
scale=1/beta)``, and the direction is independent and uniform on the unit
sphere ``S^(d-1)``, which we draw as a normalised standard Gaussian vector.
So ``E||b|| = d/beta`` (the noise norm grows linearly with the dimension).

Privacy (paper 000 Appendix B.1, proof of Theorem 1, Eq. 14): for outputs
``z`` and neighbouring answers ``f(D), f(D')`` the density ratio is
``exp(beta (||z - f(D')|| - ||z - f(D)||)) <= exp(beta ||f(D) - f(D')||_2)``
by the triangle inequality, so ``beta = epsilon / Delta_2`` gives
``(epsilon, 0)``-DP.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxdp import _validation
from jaxdp.accounting import events as _events
from jaxdp.mechanisms import _common
from jaxdp.mechanisms import _sampling


def l2_laplace_radius(
    key: jax.Array,
    shape: _common.Shape,
    beta: Any,
    dtype: Any = jnp.float32,
) -> jax.Array:
  """Draws the norm ``||b||_2 ~ Gamma(d, scale=1/beta)``, ``d = prod(shape)``.

  ``Gamma(d, 1)`` for integer ``d`` is drawn exactly as a sum of ``d``
  i.i.d. ``Exp(1)`` (each from a 128-bit uniform, cut-off mass ``2^-128``;
  see :mod:`jaxdp.mechanisms._sampling` for the formal ``(eps, delta_tail)``
  statement), rather than with
  ``jax.random.gamma``, whose float32 rejection sampler builds on a normal
  truncated near ``5.4`` standard deviations (so the radius would stop about
  ``5.4 sqrt(d)/beta`` above its mean) and compiles slowly. Costs ``2d``
  Threefry blocks.
  """
  _common.check_key(key)
  _common.check_dtype(dtype)
  shape = _common.normalize_shape(shape)
  dim = _common.shape_size(shape)
  gamma = _sampling.standard_gamma_integer(key, dim, dtype)
  return gamma / _common.noise_scale_as(beta, dtype, round_up=False)


def uniform_direction(
    key: jax.Array,
    shape: _common.Shape,
    dtype: Any = jnp.float32,
) -> jax.Array:
  """A uniform point on the unit sphere of ``R^prod(shape)``, as an array of ``shape``.

  A standard Gaussian vector is rotation invariant, so ``g / ||g||`` is uniform
  on the sphere (Muller 1959). ``||g|| = 0`` has probability zero. ``g`` comes
  from the long-tailed Box-Muller sampler (``jax.random.normal`` truncates each
  coordinate near 5.42, which makes the direction very slightly anisotropic)
  and is normalised in at least float32.
  """
  _common.check_key(key)
  _common.check_dtype(dtype)
  shape = _common.normalize_shape(shape)
  cdt = jnp.promote_types(dtype, jnp.float32)
  g = _sampling.standard_normal(key, shape, cdt)
  return (g / jnp.linalg.norm(g.reshape(-1))).astype(dtype)


def l2_laplace_noise(
    key: jax.Array,
    shape: _common.Shape,
    beta: Any,
    dtype: Any = jnp.float32,
) -> jax.Array:
  """Draws ``b`` of ``shape`` with density ``∝ exp(-beta ||b||_2)`` (flattened norm).

  Paper 000 Appendix A Eq. 12 and paper 003 Eq. 3.2: radius ``~ Gamma(d,
  1/beta)`` with ``d = prod(shape)``, direction uniform on the sphere.

  Raw sampler: ``beta`` (a scalar) may be traced (vmap over it); concrete values
  are checked to be in (0, inf] (``beta = inf`` gives zeros) and are cast to
  ``dtype`` rounding *down* (never less noise than the float64 value).

  Args:
    key: a ``jax.random`` key, used once (split into radius and direction keys).
    shape: static output shape (e.g. ``(D, C)`` for a weight matrix: the whole
      matrix shares one radius, as Eq. 12 uses the Frobenius norm).
    beta: inverse scale ``beta > 0``; ``E||b|| = d/beta``.
    dtype: floating dtype of the result.
  """
  _common.check_key(key)
  _common.check_dtype(dtype)
  _common.check_scale(beta, "beta", allow_zero=False, allow_inf=True)
  if not _common.is_traced(beta) and jnp.ndim(beta) != 0:
    raise ValueError(f"beta must be a scalar (vmap over it for several betas), got shape {jnp.shape(beta)}.")
  shape = _common.normalize_shape(shape)
  radius_key, direction_key = jax.random.split(key)
  radius = l2_laplace_radius(radius_key, shape, beta, dtype)
  return radius * uniform_direction(direction_key, shape, dtype)


def l2_laplace_beta(l2_sensitivity: float, epsilon: float) -> float:
  """``beta = epsilon / Delta_2`` (paper 000 Appendix B.1, Theorem 1, Eq. 15).

  Raises:
    ValueError: ``epsilon`` not in (0, inf) or ``l2_sensitivity`` not in (0, inf).
  """
  _common.require_static(epsilon, "epsilon")
  _common.require_static(l2_sensitivity, "l2_sensitivity")
  eps = _validation.check_epsilon(epsilon, "epsilon")
  sens = _validation.check_positive(l2_sensitivity, "l2_sensitivity")
  return eps / sens


def l2_laplace_mechanism(
    key: jax.Array,
    value: Any,
    l2_sensitivity: float,
    epsilon: float,
) -> jax.Array:
  """Releases ``value + b``, ``b ∝ exp(-(epsilon/Delta_2) ||b||_2)``: ``(epsilon, 0)``-DP.

  Paper 000 Appendix B.1 Theorem 1 (model sensitivity; Chaudhuri et al. 2011
  output perturbation). ``l2_sensitivity`` bounds ``||f(D) - f(D')||_2`` over
  the *whole* released array (Frobenius norm for a matrix): one radius is drawn
  for the whole ``value``, so never apply this row by row with the full budget.
  Concrete values with NaN/inf raise ``ValueError``; a traced ``value`` with a
  NaN/inf entry gives an all-NaN output. Describe the release with :func:`l2_laplace_mechanism_event`.
  """
  _common.check_key(key)
  beta = l2_laplace_beta(l2_sensitivity, epsilon)
  _common.check_data(value, "value")
  value = jnp.asarray(value)
  dtype = _common.float_dtype_of(value)
  beta = _common.round_inverse_scale_down(beta, dtype)
  out = value.astype(dtype) + l2_laplace_noise(key, value.shape, beta, dtype)
  return _common.poison_nonfinite(value, out)


def l2_laplace_mechanism_event(
    l2_sensitivity: float, epsilon: float,
    *, neighbouring: str = "add_remove", unit: str = "example"
) -> _events.PureDpEvent:
  """DpEvent of :func:`l2_laplace_mechanism`: ``PureDpEvent(epsilon)``.

  ``neighbouring`` (default ``"add_remove"``, dp_accounting's default) is the
  relation the sensitivity was computed for, and ``unit`` the privacy unit;
  both are carried into the event, so an accountant refuses to compose it
  with events of another relation.
  """
  l2_laplace_beta(l2_sensitivity, epsilon)  # validates
  return _events.PureDpEvent(float(epsilon), neighbouring=neighbouring, unit=unit)
