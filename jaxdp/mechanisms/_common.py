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

Keys go through :func:`jaxdp._validation.check_key` (typed and legacy raw keys
accepted; ints, ``None`` and other arrays refused naming ``key``). Data
arguments (``value``, ``scores``, ``counts``) go through :func:`check_data`:
when concrete, NaN/inf raise ``ValueError`` naming the argument. Under
``jit``/``vmap`` with *traced* data that check cannot run, so the mechanisms
make the bad case deterministic instead of leaking where the bad entries are:
additive mechanisms return an all-NaN output when any entry of ``value`` is
non-finite (:func:`poison_nonfinite`), argmax mechanisms return ``-1`` for a
row containing NaN or ``+inf`` (:func:`invalid_rows_to_minus_one`). Either
way the output no longer depends on the noise or on the finite entries, and
never on the position of the bad entries; it reveals only the single bit
"the input was not finite".
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.errors import ArgumentTypeError

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


def check_key(key: Any, name: str = "key") -> Any:
  """A single ``jax.random`` key (typed or legacy uint32); see :func:`jaxdp._validation.check_key`."""
  return _validation.check_key(key, name)


def check_data(x: Any, name: str, allow_neg_inf: bool = False) -> None:
  """Refuses non-numeric/complex data, and NaN/inf in concrete data (``ValueError`` naming ``name``)."""
  _validation.check_finite_if_concrete(x, name, allow_neg_inf=allow_neg_inf)


def poison_nonfinite(value: jax.Array, out: jax.Array) -> jax.Array:
  """``out``, or all-NaN when a *traced* ``value`` has a NaN/inf entry.

  Concrete values were already refused by :func:`check_data`; this is the
  deterministic fallback under ``jit``/``vmap``, where no error can be raised.
  """
  if not is_traced(value) or not jnp.issubdtype(value.dtype, jnp.floating):
    return out
  return jnp.where(jnp.all(jnp.isfinite(value)), out, jnp.asarray(jnp.nan, out.dtype))


def invalid_rows_to_minus_one(scores: jax.Array, index: jax.Array) -> jax.Array:
  """``index``, or ``-1`` for rows of a *traced* ``scores`` containing NaN or ``+inf``.

  ``argmax`` would otherwise return the position of the first NaN/+inf entry
  whatever the noise (a deterministic, data-revealing answer).
  """
  if not is_traced(scores) or not jnp.issubdtype(scores.dtype, jnp.floating):
    return index
  bad = jnp.any(jnp.isnan(scores) | (scores == jnp.inf), axis=-1)
  return jnp.where(bad, jnp.asarray(-1, index.dtype), index)


def check_dtype(dtype: Any) -> Any:
  """Refuses a non-floating noise ``dtype`` (integer noise would be truncated)."""
  _validation.check_float_dtype(dtype, "dtype")
  return dtype


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
  if scale is None or isinstance(scale, (bool, np.bool_, str, bytes)):
    raise ArgumentTypeError(f"{name} must be a real number or array, got {scale!r}.")
  try:
    arr = np.asarray(scale)
  except (TypeError, ValueError) as err:
    raise ArgumentTypeError(f"{name} must be a real number or array, got {scale!r}.") from err
  if arr.dtype.kind not in "iuf":
    raise ArgumentTypeError(f"{name} must be a real number or array, got dtype {arr.dtype}.")
  arr = arr.astype(np.float64)
  if np.any(np.isnan(arr)):
    raise ValueError(f"{name} must not be NaN.")
  low = "0 <=" if allow_zero else "0 <"
  high = f"{name} <= inf" if allow_inf else f"{name} < inf"
  bad_low = np.any(arr < 0) if allow_zero else np.any(arr <= 0)
  bad_high = (not allow_inf) and np.any(np.isinf(arr))
  if bad_low or bad_high:
    raise ValueError(f"{name} must satisfy {low} {high}, got {scale!r}.")


def normalize_shape(shape: Shape) -> tuple[int, ...]:
  """Returns ``shape`` as a tuple of non-negative Python ints (static).

  Floats, bools and strings are refused (``int(1.5)`` would silently give 1).
  """
  return _validation.check_shape(shape, "shape")


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
