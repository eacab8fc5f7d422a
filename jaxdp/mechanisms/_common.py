"""Shared helpers of :mod:`jaxdp.mechanisms` (argument handling, not math).

Two kinds of argument reach a mechanism:

* *privacy parameters* (``epsilon``, ``delta``, ``rho``, sensitivities) from
  which a noise scale is derived by a theorem.  They are checked eagerly, in
  Python, with :mod:`jaxdp._validation`, and must be concrete scalars: a traced
  value cannot be checked, so it is refused with a ``TypeError`` that points to
  the raw samplers.
* *noise scales* (``scale``, ``stddev``, ``beta``) taken by the raw samplers and
  by report-noisy-max.  They may be traced arrays (so that one can ``jax.vmap``
  over them); when they are concrete they are checked eagerly too.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Shape = int | Sequence[int]


def is_traced(x: Any) -> bool:
  """True when ``x`` is a JAX tracer (inside ``jit``/``vmap``/``grad``)."""
  return isinstance(x, jax.core.Tracer)


def require_static(value: Any, name: str) -> None:
  """Refuses a traced privacy parameter (it could not be validated)."""
  if is_traced(value):
    raise TypeError(
        f"{name} is a traced JAX value; privacy parameters must be concrete "
        "Python/numpy scalars so they can be validated before any noise is "
        "drawn. Close over them (functools.partial) instead of passing them "
        "through jit/vmap, or vmap over the raw samplers (laplace_noise, "
        "gaussian_noise, l2_laplace_noise), which take the noise scale as an array."
    )


def check_scale(
    scale: Any,
    name: str,
    allow_zero: bool = True,
    allow_inf: bool = False,
) -> None:
  """Checks a (possibly array-valued) noise scale when it is concrete.

  Traced scales pass unchecked (they cannot be inspected); concrete ones must
  be real, not NaN, >= 0 (> 0 unless ``allow_zero``) and finite (unless
  ``allow_inf``).
  """
  if is_traced(scale):
    return
  try:
    arr = np.asarray(scale, dtype=np.float64)
  except (TypeError, ValueError) as err:
    raise ValueError(f"{name} must be a real number or array, got {scale!r}.") from err
  if np.any(np.isnan(arr)):
    raise ValueError(f"{name} must not be NaN.")
  low = "0 <=" if allow_zero else "0 <"
  high = f"{name} <= inf" if allow_inf else f"{name} < inf"
  bad_low = np.any(arr < 0) if allow_zero else np.any(arr <= 0)
  bad_high = (not allow_inf) and np.any(np.isinf(arr))
  if bad_low or bad_high:
    raise ValueError(f"{name} must satisfy {low} {high}, got {scale!r}.")


def normalize_shape(shape: Shape) -> tuple[int, ...]:
  """Returns ``shape`` as a tuple of non-negative Python ints (static)."""
  if isinstance(shape, (int, np.integer)):
    shape = (int(shape),)
  out = tuple(int(s) for s in shape)
  if any(s < 0 for s in out):
    raise ValueError(f"shape must have non-negative entries, got {shape!r}.")
  return out


def shape_size(shape: tuple[int, ...]) -> int:
  """Number of entries of an array of this shape (1 for a scalar)."""
  return int(math.prod(shape))


def float_dtype_of(value: jax.Array) -> jnp.dtype:
  """Floating dtype in which noise is added to ``value``.

  Floating values keep their dtype; integer/bool values (e.g. vote counts) are
  promoted to JAX's default float dtype.
  """
  if jnp.issubdtype(value.dtype, jnp.floating):
    return value.dtype
  return jnp.result_type(float)


def round_scale_up(scale: float, dtype: Any) -> np.ndarray:
  """``scale`` as a ``dtype`` scalar, rounded *up* (never less noise than proven).

  Noise scales are derived in float64; casting to float32 rounds to nearest,
  which can shave up to half an ulp (~6e-8 relative) off the proven scale.
  """
  dtype = np.dtype(dtype)
  out = np.asarray(scale, dtype=dtype)
  if float(out) < scale:
    out = np.nextafter(out, np.asarray(np.inf, dtype=dtype))
  return out


def round_inverse_scale_down(beta: float, dtype: Any) -> np.ndarray:
  """``beta`` (an inverse scale) as a ``dtype`` scalar, rounded *down*."""
  dtype = np.dtype(dtype)
  out = np.asarray(beta, dtype=dtype)
  if float(out) > beta:
    out = np.nextafter(out, np.asarray(0.0, dtype=dtype))
  return out


def noise_scale_as(scale: Any, dtype: Any, round_up: bool = True) -> jax.Array:
  """A (scalar or array) noise parameter as a ``dtype`` array, rounded towards more noise.

  Concrete values are derived in float64; a plain cast to float32 rounds to
  nearest and can shave up to half an ulp off a proven scale. Scales
  (``scale``, ``stddev``) are rounded *up* (``round_up=True``), inverse scales
  (``beta``) *down* (``round_up=False``). Traced values are only cast (they
  cannot be inspected; callers that trace scales should round them first, as
  :mod:`jaxdp.prediction.predictor` does).
  """
  if is_traced(scale):
    return jnp.asarray(scale, dtype=dtype)
  dtype = np.dtype(dtype)
  exact = np.asarray(scale, dtype=np.float64)
  out = exact.astype(dtype)
  if round_up:
    bad = out.astype(np.float64) < exact
    toward = np.asarray(np.inf, dtype=dtype)
  else:
    bad = out.astype(np.float64) > exact
    toward = np.asarray(0.0, dtype=dtype)
  if np.any(bad):
    out = np.where(bad, np.nextafter(out, toward), out).astype(dtype)
  return jnp.asarray(out, dtype=dtype)
