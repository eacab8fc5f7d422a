"""Input checks shared by every DP-SGD entry point (train_dpsgd, make_private, clipped_grad).

The two training paths (:func:`.train.train_dpsgd` and the custom loop of
:func:`.private_step.make_private`) and the low-level :func:`.clipping.clipped_grad`
check the SAME things with the SAME functions, on the host, before any
gradient, noise or privacy spend:

* :func:`check_examples`: every data array (or pytree leaf) is real numeric
  data (no strings, objects or complex numbers: real noise on a complex input
  would leave its imaginary part unprotected), has exactly the N rows that q
  and the divisor ``q N`` were computed from, and holds no NaN or inf (a
  non-finite example gives a non-finite gradient, whose clipped norm is not
  bounded by the clip norm);
* :func:`check_labels`: integer class labels in ``[0, num_classes)``
  (out-of-range labels make softmax cross-entropy NaN);
* :func:`probe_loss`: the per-example loss, evaluated abstractly
  (``jax.eval_shape``: shapes only, no FLOPs, no data values) on ONE example,
  returns a scalar; a model with BatchNorm in training mode (its statistics mix
  examples, so the per-example clip no longer bounds one example's influence)
  is refused with a pointer to GroupNorm; any error from inside jax, optax or
  flax (wrong feature count, float labels for an integer-label loss, a batch
  argument missing from ``batch_argnums``) is re-raised as a ``ValueError``
  that names the argument and the fix.

Messages name the rule and WHERE it is broken (an index), never a value of the
data: an error message is a release too (``_validation.first_index``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.errors import ArgumentTypeError

_BATCHNORM_HINT = (
    "BatchNorm in training mode normalises with statistics of the whole batch, so one "
    "example's 'per-example' gradient depends on the others and clipping no longer bounds "
    "its influence (docs/sharp_edges.md, 'Cross-example layers'). Use GroupNorm or LayerNorm "
    "(flax.linen.GroupNorm / flax.nnx.GroupNorm), or BatchNorm with use_running_average=True "
    "and statistics fixed before training.")


def _dtype_of(leaf: Any) -> np.dtype:
  dtype = getattr(leaf, "dtype", None)
  if dtype is None:
    dtype = np.asarray(leaf).dtype
  return dtype


def _spec(shape: Any, leaf: Any) -> jax.ShapeDtypeStruct:
  """Abstract value of ``leaf`` with ``shape``, in the dtype JAX computes in (canonicalised)."""
  return jax.ShapeDtypeStruct(tuple(shape), jax.dtypes.canonicalize_dtype(_dtype_of(leaf)))


def _check_real(leaf: Any, name: str, where: str = "") -> None:
  if leaf is None or isinstance(leaf, (str, bytes)):
    raise ArgumentTypeError(f"{name} must be a real numeric array, got "
                            f"{type(leaf).__name__}.{where}")
  if _validation._is_tracer(leaf):  # pylint: disable=protected-access
    raise ArgumentTypeError(f"{name} is a traced JAX value; pass concrete arrays (outside jit).")
  try:
    dtype = _dtype_of(leaf)
  except (TypeError, ValueError) as err:
    raise ArgumentTypeError(f"{name} must be a real numeric array, got "
                            f"{type(leaf).__name__}.") from err
  if hasattr(jax.dtypes, "prng_key") and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    raise ArgumentTypeError(f"{name} must be a real numeric array, got a jax.random key.")
  kind = _validation._kind(dtype)  # pylint: disable=protected-access
  if kind == "c":
    raise ArgumentTypeError(
        f"{name} must be real, got the complex dtype {dtype}: the Gaussian noise is real, so "
        "the imaginary part of the gradients would be released without noise. Split real and "
        "imaginary parts into separate features." + where)
  if kind not in "biuf":
    raise ArgumentTypeError(f"{name} must be a real numeric array, got dtype {dtype}.{where}")


def _leaves(a: Any, name: str) -> list:
  leaves = jax.tree.leaves(a)
  if not leaves:
    raise ValueError(f"{name} holds no arrays.")
  return leaves


def check_examples(arrays: Sequence[Any], names: Sequence[str], num_examples: int, *,
                   take: Any = None, where: str = "") -> tuple:
  """Checks dataset arrays and returns them (or their rows ``take``), see the module docstring.

  Args:
    arrays: arrays or pytrees of arrays with the dataset on the leading axis.
    names: the argument name of each (for the messages).
    num_examples: N, the number of rows each leaf must have.
    take: optional index array: return ``a[take]`` for every leaf and check
      finiteness on those rows only (``gather``: the sampled rows).
    where: extra text appended to every message (e.g. what happens to the batch).

  Returns:
    the tuple of (taken) arrays, leaves unchanged in type (numpy or jax).

  Raises:
    ArgumentTypeError: non-numeric, complex or traced data.
    ValueError: wrong number of rows, or NaN/inf values.
  """
  out = []
  for a, name in zip(arrays, names):
    for leaf in _leaves(a, name):
      _check_real(leaf, name, where)
      rows = np.shape(leaf)[0] if np.ndim(leaf) else None
      if rows != num_examples:
        raise ValueError(
            f"{name} has {'no leading axis' if rows is None else f'{rows} rows'} but "
            f"num_examples={num_examples} (the N that the sampling rate q and the divisor q N "
            f"were computed from): every data array needs one row per example.{where}")
  for a, name in zip(arrays, names):
    taken = a if take is None else jax.tree.map(lambda leaf: leaf[take], a)
    for leaf in jax.tree.leaves(taken):
      if _validation._kind(_dtype_of(leaf)) != "f":  # pylint: disable=protected-access
        continue
      xp = np if isinstance(leaf, np.ndarray) else jnp
      if not bool(xp.all(xp.isfinite(leaf))):
        bad = ~np.isfinite(np.asarray(leaf))
        rows = "the sampled rows" if take is not None else "its rows"
        raise ValueError(
            f"{name} holds NaN or inf values in {rows} (the first at index "
            f"{_validation.first_index(bad)}): a non-finite example has a non-finite gradient, "
            f"which no clip norm bounds.{where}")
    out.append(taken)
  return tuple(out)


def check_label_dtype(y: Any, name: str, where: str = "") -> None:
  """Integer class labels (the default softmax cross-entropy takes them as indices)."""
  for leaf in _leaves(y, name):
    _check_real(leaf, name, where)
    kind = _validation._kind(_dtype_of(leaf))  # pylint: disable=protected-access
    if kind not in "iu":
      raise ArgumentTypeError(
          f"{name} must hold integer class labels for the default softmax cross-entropy, got "
          f"dtype {_dtype_of(leaf)} (cast whole-number labels with .astype(np.int32), or pass "
          f"a loss for other targets).{where}")


def check_label_shape(y: Any, name: str, where: str = "") -> None:
  """A dataset's integer labels: one per example, shape ``(N,)``."""
  for leaf in _leaves(y, name):
    if len(np.shape(leaf)) != 1:
      raise ValueError(
          f"{name} must be a 1-D array with one integer class label per example, got shape "
          f"{tuple(np.shape(leaf))} (flatten a column of labels with .reshape(-1)).{where}")


def check_labels(y: Any, name: str, num_classes: int, where: str = "") -> None:
  """Integer labels in ``[0, num_classes)`` (see the module docstring)."""
  check_label_dtype(y, name, where)
  for leaf in jax.tree.leaves(y):
    arr = np.asarray(leaf)
    bad = (arr < 0) | (arr >= num_classes)
    if np.any(bad):
      raise ValueError(
          f"{name} holds labels outside [0, {num_classes}) (the first at index "
          f"{_validation.first_index(bad)}); the model has {num_classes} outputs, and an "
          f"out-of-range label makes the softmax cross-entropy NaN.{where}")


def example_spec(arrays: Any) -> Any:
  """Shapes and dtypes of ONE example of arrays with a leading example axis (no data read)."""
  return jax.tree.map(lambda a: _spec(np.shape(a)[1:], a), arrays)


def num_classes_of(logits_fn: Callable[..., Any], params: Any, x_example: Any) -> int:
  """Number of model outputs: the last axis of ``logits_fn(params, x_example[None])`` (abstract).

  ``x_example``: one example (an array or its :func:`example_spec`).
  """
  spec = lambda a: _spec((1,) + tuple(np.shape(a)), a)
  out = _eval_shape_checked(logits_fn, _abstract(params), jax.tree.map(spec, x_example),
                            what="the model", names=("x",), hint="")
  shape = np.shape(out)
  if len(shape) < 1 or shape[-1] < 1:
    raise ValueError(f"the model must return logits with a class axis, got shape {shape}.")
  return int(shape[-1])


def _abstract(tree: Any) -> Any:
  return jax.tree.map(lambda a: _spec(np.shape(a), a), tree)


class _BatchNormInTraining(Exception):
  pass


def _linen_interceptor(next_fun, args, kwargs, context):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  module = context.module
  if isinstance(module, nn.BatchNorm) and context.method_name == "__call__":
    ura = kwargs.get("use_running_average")
    if ura is None and len(args) > 1:
      ura = args[1]
    if ura is None:
      ura = module.use_running_average
    if not ura:
      raise _BatchNormInTraining(module.name)
  return next_fun(*args, **kwargs)


def _intercept_batchnorm():
  try:
    import flax.linen as nn  # pylint: disable=g-import-not-at-top
  except ImportError:  # pragma: no cover
    return contextlib.nullcontext()
  return nn.intercept_methods(_linen_interceptor)


def batchnorm_error(where: str) -> ValueError:
  return ValueError(f"{where} uses BatchNorm in training mode: {_BATCHNORM_HINT}")


def refuse_batchnorm_nnx(model: Any, name: str = "model") -> None:
  """Refuses an nnx module holding a BatchNorm in training mode."""
  try:
    from flax import nnx  # pylint: disable=g-import-not-at-top
  except ImportError:  # pragma: no cover
    return
  if not isinstance(model, nnx.Module):
    return
  iterate = getattr(nnx, "iter_modules", None)
  modules = iterate(model) if iterate is not None else model.iter_modules()
  for _, sub in modules:
    if isinstance(sub, nnx.BatchNorm) and not sub.use_running_average:
      raise batchnorm_error(name)


def _eval_shape_checked(fn: Callable[..., Any], *args: Any, what: str, names: Sequence[str],
                        hint: str) -> Any:
  try:
    with _intercept_batchnorm():
      return jax.eval_shape(fn, *args)
  except _BatchNormInTraining:
    raise batchnorm_error(what) from None
  except Exception as err:  # pylint: disable=broad-except
    text = str(err)
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    if "batch_stats" in text or "BatchStat" in text:
      raise batchnorm_error(what) from err
    if type(err).__name__ == "ScopeParamShapeError":
      hint = (f" The params do not fit the shape of one example of {names[0]} (a different "
              "number of features than the model was initialised with?)." + hint)
    raise ValueError(
        f"{what} cannot be evaluated on one example of {', '.join(names)}: "
        f"{type(err).__name__}: {first[:300]}.{hint}") from err


def probe_loss(loss_fn: Callable[..., Any], params: Any, args: Sequence[Any], *,
               batch_argnums: Sequence[int], has_aux: bool = False,
               names: Sequence[str] | None = None, what: str = "the per-example loss") -> None:
  """Evaluates ``loss_fn(params, *one example)`` abstractly; refuses what cannot work.

  ``args`` are the positional arguments after ``params`` as the clipped-gradient
  function receives them (batch axis on the ``batch_argnums`` positions). Only
  shapes and dtypes are used (``jax.eval_shape``): no data value is read and no
  FLOP is spent. Works on tracers too (inside ``jit``).

  Raises:
    ValueError: the loss fails on one example (the original error is chained
      and summarised), is not a scalar, or the model uses BatchNorm in
      training mode. The message names the argument and, when a non-batch
      argument has the batch size on its leading axis, the ``batch_argnums``
      to pass.
  """
  batch_argnums = tuple(sorted(batch_argnums))
  if names is None:
    names = [f"argument {i}" for i in batch_argnums]
  batch_leaves = [leaf for i in batch_argnums for leaf in jax.tree.leaves(args[i - 1])]
  b = np.shape(batch_leaves[0])[0] if batch_leaves and np.ndim(batch_leaves[0]) else None
  suspects = [i + 1 for i, a in enumerate(args) if (i + 1) not in batch_argnums
              and any(np.ndim(leaf) and np.shape(leaf)[0] == b for leaf in jax.tree.leaves(a))]
  hint = ""
  if suspects:
    want = tuple(sorted(set(batch_argnums) | set(suspects)))
    hint = (f" batch_argnums={batch_argnums} batches only positional argument(s) "
            f"{list(batch_argnums)}, but argument(s) {suspects} also have the batch size {b} on "
            f"their leading axis: if they hold one row per example, pass batch_argnums={want}.")

  def one(a, batched):
    if not batched:
      return _abstract(a)
    return jax.tree.map(lambda leaf: _spec(np.shape(leaf)[1:], leaf), a)

  example = [one(a, (i + 1) in batch_argnums) for i, a in enumerate(args)]
  out = _eval_shape_checked(loss_fn, _abstract(params), *example, what=what, names=names,
                            hint=hint)
  loss = out[0] if has_aux and isinstance(out, (tuple, list)) else out
  shape = np.shape(loss) if hasattr(loss, "shape") else None
  if shape != ():
    raise ValueError(
        f"{what} must return a scalar for ONE example (params, *example), got "
        f"{'shape ' + str(shape) if shape is not None else type(loss).__name__}.{hint}")
