"""Argument checks shared by every jaxdp module.

Privacy parameters are checked eagerly, in Python, before any noise is drawn:
a bad argument must raise a clear ``ValueError`` that names the argument and
the allowed range, never silently produce a weaker guarantee.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _as_float(value: Any, name: str) -> float:
  try:
    out = float(value)
  except (TypeError, ValueError) as err:
    raise ValueError(f"{name} must be a real number, got {value!r}.") from err
  if math.isnan(out):
    raise ValueError(f"{name} must not be NaN.")
  return out


def check_epsilon(epsilon: Any, name: str = "epsilon", allow_inf: bool = False) -> float:
  """Checks ``epsilon`` is in (0, inf) (or (0, inf] with ``allow_inf``)."""
  eps = _as_float(epsilon, name)
  if eps <= 0:
    raise ValueError(f"{name} must be > 0, got {eps}.")
  if math.isinf(eps) and not allow_inf:
    raise ValueError(
        f"{name} must be finite (0 < {name} < inf) where noise is required, got inf."
    )
  return eps


def check_delta(delta: Any, name: str = "delta", allow_zero: bool = True) -> float:
  """Checks ``delta`` is in [0, 1) (or (0, 1) when ``allow_zero`` is False)."""
  d = _as_float(delta, name)
  if allow_zero:
    if not 0.0 <= d < 1.0:
      raise ValueError(f"{name} must be in [0, 1), got {d}.")
  elif not 0.0 < d < 1.0:
    raise ValueError(f"{name} must be in (0, 1), got {d}.")
  return d


def check_sample_rate(q: Any, name: str = "sample_rate") -> float:
  """Checks a sampling probability is in (0, 1]."""
  v = _as_float(q, name)
  if not 0.0 < v <= 1.0:
    raise ValueError(f"{name} must be in (0, 1], got {v}.")
  return v


def check_sensitivity(sensitivity: Any, name: str = "sensitivity") -> float:
  """Checks a sensitivity is finite and >= 0."""
  s = _as_float(sensitivity, name)
  if s < 0 or math.isinf(s):
    raise ValueError(f"{name} must be finite and >= 0, got {s}.")
  return s


def check_positive(value: Any, name: str, allow_inf: bool = False) -> float:
  """Checks a scalar is > 0 (and finite unless ``allow_inf``)."""
  v = _as_float(value, name)
  if v <= 0:
    raise ValueError(f"{name} must be > 0, got {v}.")
  if math.isinf(v) and not allow_inf:
    raise ValueError(f"{name} must be finite, got inf.")
  return v


def check_nonnegative(value: Any, name: str) -> float:
  """Checks a scalar is finite and >= 0."""
  v = _as_float(value, name)
  if v < 0 or math.isinf(v):
    raise ValueError(f"{name} must be finite and >= 0, got {v}.")
  return v


def check_positive_int(value: Any, name: str) -> int:
  """Checks an integer is >= 1."""
  try:
    ok = not isinstance(value, bool) and int(value) == value and int(value) >= 1
  except (TypeError, ValueError, OverflowError):
    ok = False
  if not ok:
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
  return int(value)


def check_finite_array(x: Any, name: str) -> np.ndarray:
  """Checks an array contains no NaN or inf; returns it as numpy (host) data."""
  arr = np.asarray(x)
  if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} contains NaN or inf values.")
  return arr


def check_unit_ball(x: Any, name: str = "x", tol: float = 1e-6) -> np.ndarray:
  """Checks every row of ``x`` has L2 norm <= 1 (as the sensitivity theorems need).

  Rows with norm in ``(1, 1 + tol]`` (float rounding of an explicit
  normalisation) are pulled back strictly inside the ball, so the returned
  array satisfies ``||x_i||_2 <= 1`` exactly and callers must use it; rows
  beyond ``1 + tol`` raise. Use :func:`jaxdp.data.normalize_rows` (or pass
  ``normalize=True`` where an estimator offers it) to project rows into the
  unit ball explicitly.

  Returns:
    ``x`` (same dtype) with every row in the closed unit ball.
  """
  arr = check_finite_array(x, name)
  flat = arr.reshape(arr.shape[0], -1) if arr.ndim else arr.reshape(1, -1)
  norms = np.linalg.norm(flat.astype(np.float64), axis=1)
  worst = float(norms.max()) if norms.size else 0.0
  if worst > 1.0 + tol:
    raise ValueError(
        f"rows of {name} must lie in the unit L2 ball (||x||_2 <= 1) for the "
        f"sensitivity bound to hold; the largest norm is {worst:.6g}. Call "
        "jaxdp.data.normalize_rows(x) first, or pass normalize=True to project "
        "rows explicitly."
    )
  if worst > 1.0:
    # Shrink by an extra 2^-22 so that rounding back to float32 (relative error
    # <= 2^-24 per coordinate) cannot push a row outside the ball again.
    factor = np.where(norms > 1.0, (1.0 - 2.0**-22) / np.maximum(norms, 1.0), 1.0)
    flat = (flat.astype(np.float64) * factor[:, None]).astype(arr.dtype)
    arr = flat.reshape(arr.shape)
  return arr
