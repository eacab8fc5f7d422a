r"""Regularised ERM for linear models (softmax, binary logistic, Huberized hinge).

Objective (paper 000 Eq. 2/5 with R(theta) = 1/2 ||theta||_F^2, plus the extra
terms that objective/loss perturbation adds):

.. math::
   J(\theta) = \frac{1}{N}\sum_{n=1}^N \ell(\theta^\top x_n, y_n)
     + \frac{\lambda}{2}\|\theta\|_F^2 + \langle b, \theta\rangle
     + \frac{\lambda_{extra}}{2}\|\theta\|_F^2 ,

with ``l2_reg = lambda``, ``linear_term = b`` and ``extra_l2 = lambda_extra``.
The regulariser 1/2 ||theta||^2 is 1-strongly convex (paper 000 Assumption 2),
so the minimiser has replace-one sensitivity 2K/(N lambda) (paper 000 Lemma 1).
Paper 003 writes the same objective as (1/n) sum [f + c ||theta||^2], i.e.
``c = lambda / 2``.

Shapes: softmax weights are ``(D, C)`` and labels integers in ``[0, C)``;
binary losses (``"logistic"``, ``"huber"``) use weights ``(D,)`` and labels in
``{0, 1}`` or ``{-1, 1}`` (label 1 is the positive class; the margin is
``z = s w^T x`` with ``s = +1`` for label 1 and ``-1`` otherwise).

No bias: append a constant feature with :func:`append_bias_feature` (it keeps
rows in the unit ball).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.training import batching, glm_solver, linear_losses
from jaxdp.training.lbfgs import SolverInfo, minimize_lbfgs


class LinearModel(NamedTuple):
  """Weights ``(D, C)`` (softmax) or ``(D,)`` (binary) and the solver diagnostics."""

  weights: jax.Array
  info: SolverInfo


def _is_traced(x: Any) -> bool:
  return isinstance(x, jax.core.Tracer)


def check_features(x: Any, name: str = "x", normalize: bool = False) -> np.ndarray | jax.Array:
  """Checks rows of ``x`` are finite and in the unit L2 ball (or projects them).

  With ``normalize=True`` rows with norm > 1 are divided by their norm (the
  projection of :func:`jaxdp.data.normalize_rows` style helpers). Tracers are
  passed through unchecked (validate before ``jax.vmap``/``jax.jit``).
  """
  if _is_traced(x):
    return x
  arr = _validation.check_finite_array(x, name)
  if arr.ndim != 2:
    raise ValueError(f"{name} must be a 2-D array (N, D), got shape {arr.shape}.")
  if normalize:
    arr = np.asarray(arr, dtype=np.float32)
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    arr = arr / np.maximum(norms, 1.0)
  return _validation.check_unit_ball(arr, name)


def check_labels(y: Any, loss: str, num_classes: int | None, n: int, name: str = "y") -> Any:
  """Checks labels match the loss: ints in [0, C) (softmax) or {0,1}/{-1,1} (binary)."""
  if _is_traced(y):
    return y
  arr = _validation.check_finite_array(y, name)
  if arr.ndim != 1 or arr.shape[0] != n:
    raise ValueError(f"{name} must have shape ({n},), got {arr.shape}.")
  if loss == "softmax":
    if num_classes is None:
      raise ValueError("num_classes must be given for the softmax loss.")
    bad = (arr != np.round(arr)) | (arr < 0) | (arr >= num_classes)
    if np.any(bad):
      raise ValueError(f"{name} must hold integer labels in [0, {num_classes}); row "
                       f"{_validation.first_index(bad)} does not.")
    return arr.astype(np.int32)
  in_01 = (arr == 0) | (arr == 1)
  in_pm1 = (arr == -1) | (arr == 1)
  if not (np.all(in_01) or np.all(in_pm1)):
    # Name the row, never the label value: the first row outside {-1, 0, 1}, else (0 and -1
    # mixed) the first row holding -1.
    valid = in_01 | in_pm1
    row = _validation.first_index(~valid if not np.all(valid) else arr == -1)
    raise ValueError(f"{name} must hold binary labels, all in {{0, 1}} or all in {{-1, 1}}; "
                     f"row {row} does not.")
  return arr.astype(np.float32)


def append_bias_feature(x: Any) -> np.ndarray:
  """Returns ``[x, 1] / sqrt(2)``: a constant feature for a bias, rows stay in the unit ball."""
  arr = np.asarray(x, dtype=np.float32)
  return np.concatenate([arr, np.ones((arr.shape[0], 1), arr.dtype)], axis=1) / np.sqrt(2.0)


def linear_logits(weights: jax.Array, x: jax.Array) -> jax.Array:
  """``x @ W``: logits ``(N, C)`` for softmax weights or margins-before-label ``(N,)`` for binary."""
  return jnp.asarray(x) @ weights


def predict_labels(weights: jax.Array, x: jax.Array) -> jax.Array:
  """Argmax class ``(N,)`` for ``(D, C)`` weights; ``{0, 1}`` (score >= 0) for ``(D,)`` weights."""
  scores = linear_logits(weights, x)
  if weights.ndim == 1:
    return (scores >= 0).astype(jnp.int32)
  return jnp.argmax(scores, axis=-1)


def data_loss(weights: jax.Array, x: jax.Array, y: jax.Array, *, loss: str = "softmax",
              h: float | jax.Array = 0.5) -> jax.Array:
  """Mean per-example loss ``(1/N) sum_n l(theta^T x_n, y_n)``."""
  scores = x @ weights
  if loss == "softmax":
    return jnp.mean(linear_losses.softmax_cross_entropy(scores, y))
  signs = jnp.where(y > 0, 1.0, -1.0).astype(scores.dtype)
  if loss == "logistic":
    return jnp.mean(linear_losses.binary_logistic(signs * scores))
  return jnp.mean(linear_losses.huberized_hinge(signs * scores, h))


def linear_objective(weights: jax.Array, x: jax.Array, y: jax.Array, *, loss: str = "softmax",
                     l2_reg: float | jax.Array = 0.0, h: float | jax.Array = 0.5,
                     linear_term: jax.Array | None = None,
                     extra_l2: float | jax.Array = 0.0) -> jax.Array:
  r""":math:`J(\theta)` of the module docstring."""
  sq = jnp.sum(weights * weights)
  value = data_loss(weights, x, y, loss=loss, h=h) + 0.5 * (l2_reg + extra_l2) * sq
  if linear_term is not None:
    value = value + jnp.sum(linear_term * weights)
  return value


def _data_loss_diff(weights, delta, x, y, loss, h):
  """``data_loss(weights + delta) - data_loss(weights)`` with per-example differences."""
  a, da = x @ weights, x @ delta
  if loss == "softmax":
    p = jax.nn.softmax(a, axis=-1)
    onehot = jax.nn.one_hot(y, a.shape[-1], dtype=a.dtype)
    lse_diff = jnp.log1p(jnp.sum(p * jnp.expm1(da), axis=-1))
    return jnp.mean(lse_diff - jnp.sum(onehot * da, axis=-1))
  s = jnp.where(y > 0, 1.0, -1.0).astype(a.dtype)
  z, dz = s * a, s * da
  if loss == "logistic":
    # log(1 + e^{-z-dz}) - log(1 + e^{-z}) = log1p(sigmoid(-z) * expm1(-dz)).
    return jnp.mean(jnp.log1p(jax.nn.sigmoid(-z) * jnp.expm1(-dz)))
  # Same piece for z and z + dz: closed-form differences (no cancellation); else direct.
  direct = linear_losses.huberized_hinge(z + dz, h) - linear_losses.huberized_hinge(z, h)
  zn = z + dz
  both_quad = (jnp.abs(1.0 - z) <= h) & (jnp.abs(1.0 - zn) <= h)
  both_lin = (z < 1.0 - h) & (zn < 1.0 - h)
  both_zero = (z > 1.0 + h) & (zn > 1.0 + h)
  quad = dz * (dz - 2.0 * (1.0 + h - z)) / (4.0 * h)
  diff = jnp.where(both_quad, quad, jnp.where(both_lin, -dz, jnp.where(both_zero, 0.0, direct)))
  return jnp.mean(diff)


def linear_objective_diff(weights, delta, x, y, *, loss="softmax", l2_reg=0.0, h=0.5,
                          linear_term=None, extra_l2=0.0):
  """``linear_objective(weights + delta) - linear_objective(weights)`` without cancellation."""
  value = _data_loss_diff(weights, delta, x, y, loss, h)
  value = value + 0.5 * (l2_reg + extra_l2) * jnp.sum(delta * (2.0 * weights + delta))
  if linear_term is not None:
    value = value + jnp.sum(linear_term * delta)
  return value


SOLVERS = ("glm", "lbfgs")
"""``"glm"``: :func:`jaxdp.training.glm_solver.minimize_glm` (L-BFGS on the scores, two
passes over ``X`` per iteration; the default). ``"lbfgs"``: the generic
:func:`jaxdp.training.lbfgs.minimize_lbfgs` (optax.lbfgs + zoom line search)."""


def _check_solver(solver: str) -> str:
  if solver not in SOLVERS:
    raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}.")
  return solver


def _fit_impl(x, y, l2_reg, h, linear_term, extra_l2, tol, *, loss, num_classes, max_iter,
              has_linear, init=None, solver="glm"):
  """Minimises ``J``; ``init`` (weights' shape) warm-starts it, default zeros.

  A warm start changes only where the iterations begin: every private method
  certifies the result it releases (:mod:`jaxdp.training.certified_solve`), so
  any starting point, even a data-dependent one, keeps the guarantee.
  ``solver`` picks the minimiser (:data:`SOLVERS`).
  """
  d = x.shape[-1]
  shape = (d, num_classes) if loss == "softmax" else (d,)
  init = jnp.zeros(shape, x.dtype) if init is None else jnp.asarray(init, x.dtype).reshape(shape)
  if _check_solver(solver) == "glm":
    w, info = glm_solver.minimize_glm(
        x, y, loss=loss, l2_total=l2_reg + extra_l2, init=init,
        linear_term=linear_term if has_linear else None, h=h, max_iter=max_iter, tol=tol)
    return LinearModel(w, info)
  kw = dict(loss=loss, l2_reg=l2_reg, h=h, linear_term=linear_term if has_linear else None,
            extra_l2=extra_l2)
  fun = lambda w: linear_objective(w, x, y, **kw)
  diff = lambda w, d: linear_objective_diff(w, d, x, y, **kw)
  w, info = minimize_lbfgs(fun, init, max_iter=max_iter, tol=tol, value_diff=diff)
  return LinearModel(w, info)


# Top-level jitted fit (compiler options are allowed only on an outermost jit;
# jitted callers trace ``_fit_impl`` directly).
_fit = functools.partial(jax.jit, static_argnames=("loss", "num_classes", "max_iter", "has_linear",
                                                   "solver"),
                         compiler_options=glm_solver.COMPILER_OPTIONS)(_fit_impl)


def _check_common(loss, num_classes, l2_reg, extra_l2, h, max_iter, tol):
  linear_losses.check_loss(loss)
  if loss == "softmax":
    num_classes = _validation.check_positive_int(num_classes, "num_classes")
    if num_classes < 2:
      raise ValueError(f"num_classes must be >= 2, got {num_classes}.")
  else:
    num_classes = 2 if num_classes is None else num_classes
  if not _is_traced(l2_reg):
    _validation.check_nonnegative(l2_reg, "l2_reg")
  if not _is_traced(extra_l2):
    _validation.check_nonnegative(extra_l2, "extra_l2")
  if loss == "huber" and not _is_traced(h):
    _validation.check_positive(h, "h")
  _validation.check_positive_int(max_iter, "max_iter")
  if not _is_traced(tol):
    _validation.check_positive(tol, "tol")
  return num_classes


def fit_linear(
    x: Any,
    y: Any,
    *,
    num_classes: int | None = None,
    l2_reg: float | jax.Array,
    loss: str = "softmax",
    h: float | jax.Array = 0.5,
    max_iter: int = 500,
    tol: float | jax.Array = 1e-6,
    linear_term: jax.Array | None = None,
    extra_l2: float | jax.Array = 0.0,
    normalize: bool = False,
    solver: str = "glm",
) -> LinearModel:
  r"""Minimises :math:`J(\theta)` (module docstring) with jitted L-BFGS.

  Inputs are validated on the host (rows in the unit L2 ball, labels in range,
  no NaN); traced inputs (inside ``jax.vmap``/``jit``) skip the host checks,
  so validate before transforming or use :func:`fit_linear_batched`.

  Args:
    x: ``(N, D)`` features with ``||x_n||_2 <= 1`` (see ``normalize``).
    y: ``(N,)`` labels (see module docstring).
    num_classes: ``C`` for the softmax loss.
    l2_reg: ``lambda >= 0``.
    loss: ``"softmax"``, ``"logistic"`` or ``"huber"``.
    h: Huberized hinge width (``loss="huber"``).
    max_iter: L-BFGS iteration cap.
    tol: gradient-norm tolerance.
    linear_term: optional ``b`` with the weights' shape (objective perturbation).
    extra_l2: optional extra L2 coefficient (objective perturbation).
    normalize: project rows with norm > 1 onto the unit sphere instead of raising.
    solver: ``"glm"`` (default) or ``"lbfgs"`` (see :data:`SOLVERS`).

  Returns:
    :class:`LinearModel`.
  """
  _check_solver(solver)
  num_classes = _check_common(loss, num_classes, l2_reg, extra_l2, h, max_iter, tol)
  x = check_features(x, "x", normalize=normalize)
  y = check_labels(y, loss, num_classes, np.shape(x)[0])
  has_linear = linear_term is not None
  if not has_linear:
    linear_term = jnp.zeros((), jnp.float32)
  elif not _is_traced(linear_term):
    _validation.check_finite_array(linear_term, "linear_term")
  return _fit(jnp.asarray(x, jnp.float32), jnp.asarray(y), l2_reg, h, jnp.asarray(linear_term),
              extra_l2, tol, loss=loss, num_classes=int(num_classes), max_iter=int(max_iter),
              has_linear=has_linear, solver=solver)


def fit_linear_batched(
    xs: Any,
    ys: Any,
    *,
    num_classes: int | None = None,
    l2_reg: float | jax.Array,
    loss: str = "softmax",
    h: float | jax.Array = 0.5,
    max_iter: int = 500,
    tol: float | jax.Array = 1e-6,
    linear_term: jax.Array | None = None,
    extra_l2: float | jax.Array = 0.0,
    batch_mode: str = "vmap",
    solver: str = "glm",
) -> LinearModel:
  """``jax.vmap(fit_linear)`` over a leading axis: ``xs (M, N, D)``, ``ys (M, N)``.

  For T teachers / M parties / bootstrap replicates on equal-size subsets.
  ``l2_reg``, ``extra_l2`` and ``linear_term`` may be scalars/unbatched (shared)
  or carry the leading ``M`` axis (one per problem). All inputs are validated
  on the host first. Returns a :class:`LinearModel` whose leaves have leading
  axis ``M``. ``batch_mode="map"`` (or ``"auto"`` on CPU) runs the problems one
  after the other inside one compiled call (see :func:`resolve_batch_mode`).
  ``solver`` as in :func:`fit_linear`.
  """
  _check_solver(solver)
  num_classes = _check_common(loss, num_classes, 0.0, 0.0, h, max_iter, tol)
  xs_np = _validation.check_finite_array(xs, "xs")
  if xs_np.ndim != 3:
    raise ValueError(f"xs must have shape (M, N, D), got {xs_np.shape}.")
  m, n, _ = xs_np.shape
  xs_np = _validation.check_unit_ball(xs_np.reshape(m * n, -1), "xs").reshape(xs_np.shape)
  ys_np = check_labels(np.asarray(ys).reshape(-1), loss, num_classes, m * n, "ys").reshape(m, n)
  l2 = np.asarray(l2_reg, np.float32)
  ex = np.asarray(extra_l2, np.float32)
  if np.any(~np.isfinite(l2)) or np.any(l2 < 0):
    raise ValueError("l2_reg must be finite and >= 0.")
  if np.any(~np.isfinite(ex)) or np.any(ex < 0):
    raise ValueError("extra_l2 must be finite and >= 0.")
  has_linear = linear_term is not None
  w_shape = (xs_np.shape[2], num_classes) if loss == "softmax" else (xs_np.shape[2],)
  lin = jnp.zeros((), jnp.float32) if not has_linear else jnp.asarray(
      _validation.check_finite_array(linear_term, "linear_term"), jnp.float32)
  lin_axis = 0 if has_linear and lin.ndim == len(w_shape) + 1 else None
  l2 = jnp.broadcast_to(jnp.asarray(l2), (m,))
  ex = jnp.broadcast_to(jnp.asarray(ex), (m,))
  if has_linear and lin_axis is None:
    lin = jnp.broadcast_to(lin, (m,) + lin.shape)
  elif not has_linear:
    lin = jnp.zeros((m,), jnp.float32)
  mode = resolve_batch_mode(batch_mode)
  kw = dict(loss=loss, num_classes=int(num_classes), max_iter=int(max_iter),
            has_linear=has_linear, mode=mode, solver=solver)
  # On a CPU the lax.map runs as one chunk per core, side by side (jaxdp.training.batching).
  return batching.map_in_chunks(
      lambda t: _fit_many(t[0], t[1], t[2], h, t[3], t[4], tol, **kw),
      (jnp.asarray(xs_np, jnp.float32), jnp.asarray(ys_np), l2, lin, ex), batching.num_chunks(m, mode))


@functools.partial(jax.jit, static_argnames=("loss", "num_classes", "max_iter", "has_linear",
                                             "mode", "solver"),
                   compiler_options=glm_solver.COMPILER_OPTIONS)
def _fit_many(xs, ys, l2s, h, lins, exs, tol, *, loss, num_classes, max_iter, has_linear, mode,
              solver="glm"):
  fit = lambda x, y, l, b, e: _fit_impl(x, y, l, h, b, e, tol, loss=loss, num_classes=num_classes,
                                        max_iter=max_iter, has_linear=has_linear, solver=solver)
  if mode == "vmap":
    return jax.vmap(fit)(xs, ys, l2s, lins, exs)
  return jax.lax.map(lambda t: fit(*t), (xs, ys, l2s, lins, exs))


class NonPrivateDiagnostics(NamedTuple):
  """NOT PRIVATE: solver diagnostics of a private fit, computed from the data without noise.

  Returned (as ``PrivateLinearModel.nonprivate_info``) only when the caller
  passes ``return_nonprivate_diagnostics=True``; nothing in it is covered by the
  release's guarantee (compare DP-SGD's ``history``, whose training losses are
  documented as non-private diagnostics). Use it to debug a pipeline on public
  or synthetic data; publishing any field of it on private data voids the
  guarantee: ``certificate.weights`` is the exact non-private (certified)
  minimiser, ``solver.value`` the objective at the solver's iterate, and even
  iteration counts and the certifying route depend on the data.

  Attributes:
    solver: :class:`~jaxdp.training.lbfgs.SolverInfo` of the float32 fit(s)
      (for output perturbation: the non-private fit, before noise), or None.
    certificate: the :class:`~jaxdp.training.certified_solve.CertifiedSolution`
      of the minimiser(s) the noise was added to, or None.
  """

  solver: Any
  certificate: Any = None


class PrivateLinearModel(NamedTuple):
  """Output of a private training method: only private and public fields.

  Attributes:
    weights: released (private) weights; a leading axis ``M`` when ``M`` keys were given.
    event: the DpEvent describing the guarantee (spend it in a
      :class:`jaxdp.accounting.PrivacyAccountant`; one event per released
      model: ``M`` keys release ``M`` models, i.e. ``count=M``).
    calibration: the host-side (float64) calibration the noise was drawn with,
      a function of the public parameters only (it holds the certified radius
      ``tol/Lambda`` the sensitivity accounts for).
    nonprivate_info: None unless the caller asked for the NOT PRIVATE
      diagnostics (``return_nonprivate_diagnostics=True``):
      :class:`NonPrivateDiagnostics`.
  """

  weights: jax.Array
  event: Any
  calibration: Any
  nonprivate_info: Any = None


def nonprivate_diagnostics(requested: bool, solver: Any, certificate: Any = None
                           ) -> NonPrivateDiagnostics | None:
  """``NonPrivateDiagnostics(solver, certificate)`` if ``requested``, else None (the default)."""
  return NonPrivateDiagnostics(solver, certificate) if requested else None


def is_key_batch(key: Any) -> bool:
  """True for a batch of keys: typed keys with ndim >= 1 or raw uint32 keys with ndim 2."""
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    return key.ndim >= 1
  return key.ndim == 2


# On a CPU, "auto" vmaps the problems of one call when they share a data matrix at least this
# large (beyond the caches): see resolve_batch_mode.
VMAP_SHARED_DATA_BYTES = 32 * 2 ** 20


def resolve_batch_mode(batch_mode: str, shared_data_bytes: int | None = None) -> str:
  """``"vmap"`` or ``"map"``; ``"auto"`` picks by backend and by the data the problems share.

  Under ``jax.vmap`` the L-BFGS while loops run until every problem has
  stopped and the line search's ``lax.cond`` branches become selects that
  evaluate both sides, so on a CPU one problem at a time (``jax.lax.map``,
  still one compiled call) is faster for small data; on a GPU the batched
  matmuls win. On a CPU, when the ``M`` problems share one data matrix ``X`` of
  ``shared_data_bytes >= VMAP_SHARED_DATA_BYTES`` (e.g. ``M`` loss-perturbation
  draws on one dataset), each solver iteration is bound by reading ``X`` from
  memory (``X W`` and ``X^T R`` with a skinny ``W``); ``vmap`` reads it once per
  iteration for all ``M`` problems (one wide matmul) instead of ``M`` times.
  Measured on 2 CPU cores: 20 loss-perturbation draws on the full MNIST
  (``X`` 188 MB) took 36-41 s with ``vmap`` vs 96-97 s with ``map``; on
  MNIST-PCA-50 with N = 10,000 (2 MB) ``map`` is faster (issue 13's benchmark).
  """
  if batch_mode not in ("auto", "vmap", "map"):
    raise ValueError(f"batch_mode must be 'auto', 'vmap' or 'map', got {batch_mode!r}.")
  if batch_mode == "auto":
    if jax.default_backend() != "cpu":
      return "vmap"
    big = shared_data_bytes is not None and shared_data_bytes >= VMAP_SHARED_DATA_BYTES
    return "vmap" if big else "map"
  return batch_mode


def require_converged(info: SolverInfo, method: str) -> None:
  """Raises RuntimeError (releasing nothing) if any fit did not reach the gradient tolerance.

  Perturbed-objective and output-perturbation guarantees hold at the exact
  minimiser; a non-converged iterate carries no guarantee.
  """
  conv = np.asarray(info.converged)
  if not np.all(conv):
    raise RuntimeError(
        f"{method}: L-BFGS did not reach the gradient tolerance in {int(np.sum(~conv))} of "
        f"{conv.size} fit(s); the privacy guarantee only holds at the minimiser, so nothing is "
        "released. Increase max_iter or tol.")
