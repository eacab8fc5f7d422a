"""Argument checks shared by every jaxdp module.

Privacy parameters are checked eagerly, in Python, before any noise is drawn:
a bad argument must raise a clear ``ValueError`` that names the argument and
the allowed range, never silently produce a weaker guarantee.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any

import numpy as np

from jaxdp.errors import ArgumentTypeError


def _is_tracer(value: Any) -> bool:
  """True for a JAX tracer, without importing jax for host-only callers."""
  jax = sys.modules.get("jax")
  return jax is not None and isinstance(value, jax.core.Tracer)


def _is_key_dtype(dtype: Any) -> bool:
  """True for a typed ``jax.random`` key dtype (``jax.random.key``)."""
  jax = sys.modules.get("jax")
  return jax is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _kind(dtype: Any) -> str:
  """numpy dtype kind, with ml_dtypes' floats (bfloat16, float8...) reported as "f"."""
  dt = np.dtype(dtype)
  if dt.kind == "V":
    jnp = getattr(sys.modules.get("jax"), "numpy", None)
    if jnp is not None and jnp.issubdtype(dt, jnp.floating):
      return "f"
  return dt.kind


def _describe(value: Any) -> str:
  text = repr(value)
  if len(text) > 60:
    text = text[:57] + "..."
  return f"{text} of type {type(value).__name__}"


def _as_float(value: Any, name: str) -> float:
  """A real scalar as a Python float; bool/str/None/complex/arrays are refused.

  ``True`` is not ``1.0`` and ``"1.0"`` is not ``1.0`` here: a privacy
  parameter of the wrong type is almost always a mistake (an argument shifted
  by one, a flag passed for a number, an unparsed config string), so it raises
  :class:`~jaxdp.errors.ArgumentTypeError` (a ``TypeError`` and a
  ``ValueError``) naming the argument instead of being coerced. Numpy and
  concrete JAX 0-d arrays of an integer or floating dtype are accepted.
  """
  if _is_tracer(value):
    raise ArgumentTypeError(
        f"{name} is a traced JAX value; it must be a concrete real number so it "
        "can be validated (close over it with functools.partial instead of "
        "passing it through jit/vmap)."
    )
  if isinstance(value, (bool, np.bool_)):
    raise ArgumentTypeError(f"{name} must be a real number, got the bool {value!r}.")
  if isinstance(value, numbers.Real):
    out = float(value)
  elif value is None or isinstance(value, (str, bytes)) or not hasattr(value, "dtype"):
    raise ArgumentTypeError(f"{name} must be a real number, got {_describe(value)}.")
  else:
    kind = _kind(value.dtype) if not _is_key_dtype(value.dtype) else "V"
    if kind not in "iuf":
      raise ArgumentTypeError(
          f"{name} must be a real number, got an array of dtype {value.dtype}."
      )
    if np.ndim(value) != 0:
      raise ValueError(f"{name} must be a scalar, got an array of shape {np.shape(value)}.")
    out = float(value)
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
  """Checks an integer is >= 1 (bools, strings and None are refused)."""
  if value is None or isinstance(value, (bool, np.bool_, str, bytes, complex, np.complexfloating)):
    raise ArgumentTypeError(f"{name} must be an integer >= 1, got {_describe(value)}.")
  try:
    ok = int(value) == value and int(value) >= 1
  except (TypeError, ValueError, OverflowError):
    ok = False
  if not ok:
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
  return int(value)


def check_finite_array(x: Any, name: str) -> np.ndarray:
  """Checks a numeric array contains no NaN or inf; returns it as numpy (host) data.

  Strings, objects and other non-numeric data raise
  :class:`~jaxdp.errors.ArgumentTypeError` naming ``name``; a traced array
  (which cannot be inspected) raises it too.
  """
  arr = check_numeric_array(x, name)
  if _kind(arr.dtype) in "fc" and not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} contains NaN or inf values (the first at index "
                     f"{first_index(~np.isfinite(arr))}).")
  return arr


def first_index(bad: np.ndarray) -> tuple[int, ...] | int:
  """Index of the first True entry of ``bad`` (an int for 1-D arrays), for error messages.

  Refusal messages name the rule and WHERE it is broken, never the offending value:
  an error message is a release too (it is logged, shown, stored), and a copied
  entry, norm or label of private data would leak it outside any guarantee.
  """
  bad = np.asarray(bad)
  flat = int(np.argmax(bad.reshape(-1)))
  if bad.ndim <= 1:
    return flat
  return tuple(int(i) for i in np.unravel_index(flat, bad.shape))


def check_numeric_array(x: Any, name: str) -> np.ndarray:
  """:func:`check_finite_array` without the NaN/inf scan (for a caller that scans anyway)."""
  if _is_tracer(x):
    raise ArgumentTypeError(f"{name} is a traced JAX value; it must be concrete to be validated.")
  if x is None or isinstance(x, (str, bytes)):
    raise ArgumentTypeError(f"{name} must be a numeric array, got {_describe(x)}.")
  try:
    arr = np.asarray(x)
  except (TypeError, ValueError) as err:
    raise ArgumentTypeError(f"{name} must be a numeric array, got {_describe(x)}.") from err
  if _kind(arr.dtype) not in "biufc":
    raise ArgumentTypeError(f"{name} must be a numeric array, got dtype {arr.dtype}.")
  return arr


def check_finite_if_concrete(x: Any, name: str, allow_neg_inf: bool = False) -> None:
  """Checks a real (non-complex) array has no NaN/inf when it is concrete.

  The check that JAX-facing public functions run on their data arguments
  (``value``, ``scores``, ``counts``): concrete arrays (Python scalars, numpy,
  JAX arrays outside ``jit``) are inspected on the host; a traced array (under
  ``jit``/``vmap``/``grad``) cannot be, and passes here -- the caller must then
  make the output deterministic in the bad case (see
  :mod:`jaxdp.mechanisms._common`). Bools/ints are accepted as numeric data;
  strings, objects and complex numbers (real noise would leave the imaginary
  part unprotected) raise :class:`~jaxdp.errors.ArgumentTypeError`.

  Args:
    x: the data.
    name: the argument's name, for the message.
    allow_neg_inf: also accept ``-inf`` (e.g. scores of excluded candidates).
  """
  if hasattr(x, "dtype") and _is_key_dtype(x.dtype):
    raise ArgumentTypeError(f"{name} must be a real numeric array, got a jax.random key.")
  if _is_tracer(x):
    dtype = np.dtype(x.dtype)
  else:
    if x is None or isinstance(x, (str, bytes)):
      raise ArgumentTypeError(f"{name} must be a real numeric array, got {_describe(x)}.")
    try:
      arr = np.asarray(x)
    except (TypeError, ValueError) as err:
      raise ArgumentTypeError(f"{name} must be a real numeric array, got {_describe(x)}.") from err
    dtype = arr.dtype
  if _kind(dtype) not in "biuf":
    raise ArgumentTypeError(f"{name} must be a real numeric array, got dtype {dtype}.")
  if _is_tracer(x) or _kind(dtype) != "f":
    return
  arr = arr.astype(np.float64)
  bad = np.isnan(arr) | (np.isposinf(arr) if allow_neg_inf else np.isinf(arr))
  if np.any(bad):
    what = "NaN or +inf" if allow_neg_inf else "NaN or inf"
    raise ValueError(
        f"{name} contains {what} values (the first at index {first_index(bad)}); a "
        "mechanism's input must be finite for its sensitivity bound to hold."
    )


def check_float_dtype(dtype: Any, name: str = "dtype") -> np.dtype:
  """Checks ``dtype`` is a real floating dtype (noise must not be truncated to integers)."""
  try:
    if dtype is None:  # np.dtype(None) would silently be float64
      raise TypeError("None")
    dt = np.dtype(dtype)
  except TypeError as err:
    raise ArgumentTypeError(f"{name} must be a floating dtype, got {_describe(dtype)}.") from err
  if _kind(dt) != "f":
    raise ArgumentTypeError(
        f"{name} must be a real floating dtype (e.g. jnp.float32), got {dt}; "
        "integer or complex noise would not have the proven distribution."
    )
  return dt


def check_shape(shape: Any, name: str = "shape") -> tuple[int, ...]:
  """A static shape (an int or a sequence of ints, each >= 0) as a tuple of ints."""
  def is_int(s: Any) -> bool:
    return isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_))

  if is_int(shape):
    shape = (shape,)
  if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
    raise ArgumentTypeError(f"{name} must be an int or a sequence of ints, got {_describe(shape)}.")
  out = tuple(shape)
  if not all(is_int(s) for s in out):
    raise ArgumentTypeError(f"{name} must contain only ints, got {shape!r}.")
  out = tuple(int(s) for s in out)
  if any(s < 0 for s in out):
    raise ValueError(f"{name} must have non-negative entries, got {shape!r}.")
  return out


_RAW_KEY_SHAPE: tuple[int, ...] | None = None


def _raw_key_shape() -> tuple[int, ...]:
  """Shape of the raw uint32 data of one key of the default PRNG implementation."""
  global _RAW_KEY_SHAPE
  if _RAW_KEY_SHAPE is None:
    import jax  # pylint: disable=g-import-not-at-top

    _RAW_KEY_SHAPE = tuple(jax.random.key_data(jax.random.key(0)).shape)
  return _RAW_KEY_SHAPE


def check_key(key: Any, name: str = "key", allow_batch: bool = False) -> Any:
  """Checks ``key`` is a ``jax.random`` key; returns it unchanged.

  Policy (one for the whole library): both kinds of JAX key are accepted,

  * typed keys, ``jax.random.key(seed)`` (dtype ``key<impl>``), of shape ``()``;
  * legacy raw keys, ``jax.random.PRNGKey(seed)``: ``uint32`` arrays whose
    shape is that of the default implementation's key data (``(2,)`` for
    threefry),

  and everything else -- an int seed (``key=0``), ``None``, floats, other
  integer dtypes, wrong shapes -- raises :class:`~jaxdp.errors.ArgumentTypeError`
  (a ``TypeError``) or ``ValueError`` naming ``name``. With ``allow_batch`` a
  batch of keys (typed keys of any shape, raw keys of shape ``(..., 2)``) is
  accepted too; otherwise a batch raises ``ValueError`` (``jax.vmap`` over the
  keys instead). Only dtype and shape are inspected, so traced keys (under
  ``jit``/``vmap``) are checked as well. Whether a key was used before cannot
  be checked: never reuse one (docs/sharp_edges.md).
  """
  seed_hint = "jax.random.key(seed) or jax.random.PRNGKey(seed)"
  dtype = getattr(key, "dtype", None)
  shape = getattr(key, "shape", None)
  if dtype is None or shape is None or isinstance(key, (bool, int, float, str)):
    raise ArgumentTypeError(f"{name} must be a jax.random key ({seed_hint}), got {_describe(key)}.")
  shape = tuple(shape)
  if _is_key_dtype(dtype):
    if shape and not allow_batch:
      raise ValueError(
          f"{name} must be a single jax.random key, got a batch of shape {shape} "
          "(jax.vmap over the keys instead)."
      )
    return key
  if np.dtype(dtype) != np.uint32:
    raise ArgumentTypeError(
        f"{name} must be a jax.random key ({seed_hint}); got an array of dtype "
        f"{dtype} (raw keys are uint32)."
    )
  raw = _raw_key_shape()
  ok = shape == raw or (allow_batch and len(shape) > len(raw) and shape[-len(raw):] == raw)
  if not ok:
    expected = f"{raw}" + (f" or (..., {', '.join(map(str, raw))})" if allow_batch else "")
    raise ValueError(
        f"{name} must be a jax.random key; a raw uint32 key has shape {expected}, "
        f"got shape {shape}."
    )
  return key


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
  arr = check_numeric_array(x, name)
  if _kind(arr.dtype) == "c":
    check_finite_array(arr, name)
  flat = arr.reshape(arr.shape[0], -1) if arr.ndim else arr.reshape(1, -1)
  norms = row_norms_float64(flat)
  worst = float(norms.max()) if norms.size else 0.0
  if not math.isfinite(worst):
    # A NaN or inf entry makes its row's norm NaN or inf (one scan for both checks); a
    # finite row whose squares overflow is a norm error below.
    check_finite_array(arr, name)
  if worst > 1.0 + tol:
    raise ValueError(
        f"rows of {name} must lie in the unit L2 ball (||x||_2 <= 1) for the "
        f"sensitivity bound to hold; row {int(np.argmax(norms > 1.0 + tol))} does not. Call "
        "jaxdp.data.normalize_rows(x) first, or pass normalize=True to project "
        "rows explicitly."
    )
  if worst > 1.0:
    # Shrink by an extra 2^-22 so that rounding back to float32 (relative error
    # <= 2^-24 per coordinate) cannot push a row outside the ball again. Only the
    # rows outside the ball are touched (a copy: the caller's array is not modified).
    out = np.array(flat, copy=True)
    rows = np.flatnonzero(norms > 1.0)
    factor = (1.0 - 2.0**-22) / norms[rows]
    out[rows] = (flat[rows].astype(np.float64) * factor[:, None]).astype(arr.dtype)
    arr = out.reshape(arr.shape)
  return arr


def row_norms_float64(flat: np.ndarray, block_rows: int = 4096) -> np.ndarray:
  """Euclidean norms of the rows of a 2-D array, accumulated in float64.

  Converts ``block_rows`` rows at a time (cache-sized blocks), so a large
  float32 matrix is never copied to float64 as a whole; the result is the
  float64 norm of the exact float32 values (what the sensitivity bounds need).
  """
  n = flat.shape[0]
  out = np.empty(n, np.float64)
  ones = np.ones((flat.shape[1],), np.float64)
  for start in range(0, n, block_rows):
    block = np.asarray(flat[start:start + block_rows], np.float64)
    if flat.shape[1] <= 64:  # about 2x einsum's speed for narrow rows
      out[start:start + block_rows] = (block * block) @ ones
    else:
      out[start:start + block_rows] = np.einsum("ij,ij->i", block, block)
  return np.sqrt(out)
