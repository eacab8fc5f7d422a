r"""Optimised BandMF and BLT strategies, and their expected error.

The expected squared error of the matrix mechanism with strategy C, noise
multiplier 1 and clipping norm 1 is (Choquette-Choo et al. 2023, "Multi-epoch
matrix factorization mechanisms for private machine learning", Eq. (3);
McKenna 2024, "Scaling up the banded matrix factorization mechanism", Sec. 2)

  L(C) = sens(C)^2 * err(A C^{-1}),

with ``sens`` from :mod:`.sensitivity` and ``err`` one of the three norms of
:mod:`.workloads` (``"total"`` = ``||A C^{-1}||_F^2``, ``"mean"`` = that over
n, ``"max"`` = the largest squared row norm). The ``"mean"`` and ``"max"``
values are JAX Privacy's ``mean_error`` / ``max_error`` losses
(``sens^2 * error``); the RMSE that McKenna 2024 reports is
``sqrt(expected_error(..., error="mean"))``. ``L`` is invariant to rescaling C,
so the diagonal is fixed to ``c_0 = 1``.

Both families are optimised in float64 (inside ``jax.enable_x64(True)``; the
global flag is left as it is) with L-BFGS (SciPy's L-BFGS-B driving a jitted
``value_and_grad`` of L, normalised by its value at the start):

* :func:`optimize_bandmf` -- ``c_1..c_{bands-1}`` free, initialised at the
  square-root factorization ``r_j = binom(2j, j) / 4^j`` truncated to the
  bands (Fichtenberger, Henzinger & Upadhyay 2023, "Constant matters:
  fine-grained error bound on differentially private continual observation";
  Henzinger, Upadhyay & Upadhyay 2023). With several participations the
  separation must be at least ``bands``, where the sensitivity is exactly
  ``sum_{m<k} ||C[:, m b]||^2`` (the ``"orthogonal"`` case).
* :func:`optimize_blt` -- ``theta_i = sigmoid(a_i)`` in (0, 1) and
  ``omega = softmax(w)[:buffers]`` (so ``omega >= 0`` and ``sum(omega) < 1``):
  the coefficients are then nonnegative and non-increasing and the
  ``"monotone"`` sensitivity ``||C 1_q||^2`` is exact. Initialised by a
  nonnegative least-squares fit of ``omega`` to the square-root coefficients on
  a log-spaced grid of ``theta``.

* :func:`optimize_column_normalized_banded` -- the general (non-Toeplitz)
  banded C with unit columns (:class:`~.strategies.ColumnNormalizedBanded`;
  McKenna 2024, Sec. 4; JAX Privacy's ``banded.optimize``): the free
  parameters are the n x bands band table, every column divided by its norm.
  With ``bands <= b`` the sensitivity is exactly ``sqrt(k')``,
  ``k' = min(k, ceil(n / b))``, a constant, so L is ``k'`` times the workload
  error. Its gradient is explicit: with ``P = A C^{-1}``, row weights ``w``
  (``"total"``: 1, ``"mean"``: 1/n, ``"max"``: the indicator of the worst row)
  and ``E = sum_t w_t ||P_t||^2``, ``dE/dC = -2 P^T diag(w) P C^{-T}``, read on
  the band only; ``P`` (``P C = A``, backward over columns) and
  ``R^T = C^{-1} (diag(w) P)^T`` (forward over rows) are banded triangular
  solves, so one value and gradient costs O(n^2 bands) time and O(n^2)
  memory, in float64. Initialised at the optimised Toeplitz BandMF with its
  columns normalised.

:func:`optimize_blt` guards against a known failure of a single start: two
buffers can merge (equal ``theta``) into a one-buffer solution. It runs
several starts and keeps the best: buffers added one at a time, each start
warm from the previous optimum plus one new buffer with ``theta`` spread over
(0, 1), and the log-spaced least-squares start. ``buffers="auto"`` searches
1, 2, ... ``max_buffers`` and keeps adding while the loss falls by the factor
``rtol`` (JAX Privacy's ``buffered_toeplitz.optimize`` rule).

The workload error uses :func:`.workloads.toeplitz_inverse` (Newton iteration
with FFTs) and the O(n log n) (constant learning rate) or O(n^2) (schedule)
error evaluation, so one evaluation at n = 2000 takes about a millisecond.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from jaxdp import _validation
from jaxdp.dpsgd.correlated import sensitivity as _sens
from jaxdp.dpsgd.correlated import workloads as _work
from jaxdp.dpsgd.correlated.strategies import BLT, BandMF, ColumnNormalizedBanded, Strategy


def square_root_coefs(num_steps) -> np.ndarray:
  """Coefficients of the square root of the prefix-sum matrix, ``r_j = binom(2j, j) / 4^j`` (float64).

  ``r_0 = 1``, ``r_j = r_{j-1} (2j - 1) / (2j)``; the Toeplitz ``R`` has
  ``R R = S`` (Fichtenberger et al. 2023; Henzinger et al. 2023).
  """
  n = _validation.check_positive_int(num_steps, "num_steps")
  j = np.arange(1, n, dtype=np.float64)
  return np.concatenate([[1.0], np.cumprod((2 * j - 1) / (2 * j))])


def _check_common(num_steps, momentum, learning_rates, max_participations, min_separation,
                  error):
  n = _validation.check_positive_int(num_steps, "num_steps")
  beta = _work.check_momentum(momentum)
  eta = _work.check_learning_rates(learning_rates, n)
  k = _validation.check_positive_int(max_participations, "max_participations")
  if min_separation is not None:
    min_separation = _validation.check_positive_int(min_separation, "min_separation")
  error = _work.check_error_kind(error)
  return n, beta, eta, k, min_separation, error


def _check_solver(max_iterations, tol):
  max_iterations = _validation.check_positive_int(max_iterations, "max_iterations")
  tol = _validation.check_positive(tol, "tol")
  return max_iterations, tol


def expected_error(strategy, num_steps, *, momentum=0.0, learning_rates=None,
                   max_participations=1, min_separation=1, error="total") -> float:
  """``sens(C)^2 * err(A C^{-1})`` for a Toeplitz strategy (float64), see the module docstring.

  Args:
    strategy: :class:`BandMF`, :class:`BLT` or :class:`ColumnNormalizedBanded`.
    num_steps: n (at most ``strategy.max_steps``).
    momentum: ``beta`` in [0, 1).
    learning_rates: length-n positive rates, or None (constant 1).
    max_participations: k.
    min_separation: b.
    error: ``"total"``, ``"mean"`` or ``"max"``.

  Returns:
    The expected squared error (``"total"``: summed over the n steps;
    ``"mean"``: per step; ``"max"``: the worst step). Uses the exact
    sensitivity where :func:`.sensitivity.sensitivity_case` is exact, else its
    upper bound.
  """
  n, beta, eta, k, b, error = _check_common(num_steps, momentum, learning_rates,
                                            max_participations, min_separation, error)
  if b is None:
    raise ValueError("min_separation must be an integer >= 1, got None.")
  if not isinstance(strategy, Strategy):
    raise TypeError(f"strategy must be a BandMF, BLT or ColumnNormalizedBanded, got "
                    f"{type(strategy).__name__}.")
  n = strategy.check_num_steps(n)
  sens = _sens.sensitivity(strategy, n, max_participations=k, min_separation=b)
  if isinstance(strategy, ColumnNormalizedBanded):
    a_t = _work.sgd_workload(n, momentum=beta, learning_rates=eta).T
    with jax.enable_x64(True):
      per_row = np.asarray(_banded_row_errors(jnp.asarray(strategy.band_table(n)),
                                              jnp.asarray(a_t)))
    err = {"total": per_row.sum(), "mean": per_row.sum() / n, "max": per_row.max()}[error]
    return sens * sens * float(err)
  c = np.asarray(strategy.coefficients(n), np.float64)
  with jax.enable_x64(True):
    d = np.asarray(_inverse_jit(jnp.asarray(c, jnp.float64)))
  err = float(_work.workload_error(d, momentum=beta, learning_rates=eta, kind=error))
  return sens * sens * err


_inverse_jit = jax.jit(_work.toeplitz_inverse)


def _pattern_steps(n: int, k: int, b: int) -> np.ndarray:
  return np.arange(min(k, -(-n // b))) * b


# ---------------------------------------------------------------------------
# BandMF


def _bandmf_loss(x, eta, *, n, beta, kind, steps):
  c = jnp.zeros(n, x.dtype).at[0].set(1.0).at[1:1 + x.shape[0]].set(x)
  col_norm2 = jnp.cumsum(c * c)[::-1]  # ||C[:, i]||^2
  sens2 = jnp.sum(col_norm2[np.asarray(steps)])
  d = _work.toeplitz_inverse(c)
  return sens2 * _work._workload_error_impl(d, beta, eta, kind)  # pylint: disable=protected-access


@functools.partial(jax.jit, static_argnames=("n", "beta", "kind", "steps"))
def _bandmf_value_and_grad(x, eta, scale, *, n, beta, kind, steps):
  value, grad = jax.value_and_grad(_bandmf_loss)(x, eta, n=n, beta=beta, kind=kind, steps=steps)
  return value / scale, grad / scale


def _lbfgs(value_and_grad, x0, max_iterations, tol):
  # L-BFGS on log(loss): the loss spans many orders of magnitude (a trial step can make C
  # nearly singular, loss ~1e58), and a line search on the raw value would stop at x0.
  def fun(x):
    v, g = value_and_grad(jnp.asarray(x, jnp.float64))
    v = float(v)
    if not (np.isfinite(v) and v > 0):
      return np.inf, np.zeros_like(np.asarray(x, np.float64))
    return math.log(v), np.asarray(g, np.float64) / v

  res = scipy.optimize.minimize(fun, np.asarray(x0, np.float64), jac=True, method="L-BFGS-B",
                                options={"maxiter": max_iterations, "ftol": tol,
                                         "gtol": tol, "maxcor": 20})
  x = np.asarray(res.x, np.float64)
  if not np.all(np.isfinite(x)):
    raise RuntimeError("strategy optimisation diverged (non-finite parameters).")
  return x


def _check_banded(num_steps, bands, momentum, learning_rates, max_participations,
                  min_separation, error, max_iterations, tol, *, why: str):
  """The checks of the banded optimisers; b defaults to ``bands`` (1 for one participation).

  Returns ``(n, beta, eta, k, b, error, bands, max_iterations, tol)`` with ``k`` capped at
  ``ceil(n / b)``; ``why`` ends the message refusing ``b < bands`` with several participations.
  """
  n, beta, eta, k, b, error = _check_common(num_steps, momentum, learning_rates,
                                            max_participations, min_separation, error)
  bands = _validation.check_positive_int(bands, "bands")
  if bands > n:
    raise ValueError(f"bands must be <= num_steps ({n}), got {bands}.")
  max_iterations, tol = _check_solver(max_iterations, tol)
  if b is None:
    b = bands if k > 1 else 1
  k = min(k, -(-n // b))
  if k > 1 and b < bands:
    raise ValueError(f"min_separation ({b}) must be >= bands ({bands}) when an example can "
                     f"participate more than once: {why}")
  return n, beta, eta, k, b, error, bands, max_iterations, tol


def optimize_bandmf(num_steps, bands, *, momentum=0.0, learning_rates=None, max_participations=1,
                    min_separation=None, error="total", max_iterations=500,
                    tol=1e-10) -> BandMF:
  """The BandMF strategy minimising ``sens(C)^2 * err(A C^{-1})`` (module docstring).

  Args:
    num_steps: n, the number of training steps.
    bands: number of bands (``1 <= bands <= n``); one band is DP-SGD.
    momentum: ``beta`` in [0, 1) folded into the workload.
    learning_rates: length-n positive rates, or None (constant 1).
    max_participations: k, the most steps one example takes part in.
    min_separation: b, steps between two participations. Default ``bands``
      when ``k > 1`` (and irrelevant for ``k = 1``). Must be ``>= bands`` when
      ``k > 1`` (and more than one participation fits): the exact sensitivity
      used here needs columns at distance ``>= b`` to be orthogonal.
    error: ``"total"``/``"mean"`` (same optimum) or ``"max"``.
    max_iterations: L-BFGS iteration cap.
    tol: relative tolerance on the (normalised) loss decrease and gradient.

  Returns:
    ``BandMF`` with ``coefs[0] = 1``.
  """
  n, beta, eta, k, b, error, bands, max_iterations, tol = _check_banded(
      num_steps, bands, momentum, learning_rates, max_participations, min_separation, error,
      max_iterations, tol, why="BandMF's exact sensitivity needs it.")
  if bands == 1:
    return BandMF.dp_sgd()
  steps = tuple(int(s) for s in _pattern_steps(n, k, b))
  x0 = square_root_coefs(bands)[1:]
  with jax.enable_x64(True):
    eta_j = None if eta is None else jnp.asarray(eta, jnp.float64)
    kw = dict(n=n, beta=beta, kind=error, steps=steps)
    scale = float(_bandmf_value_and_grad(jnp.asarray(x0), eta_j, 1.0, **kw)[0])
    vg = lambda x: _bandmf_value_and_grad(x, eta_j, scale, **kw)
    x = _lbfgs(vg, x0, max_iterations, tol)
  return BandMF(np.concatenate([[1.0], x]))


# ---------------------------------------------------------------------------
# BLT


def _blt_params(p, buffers, active=None):
  """``theta = sigmoid(p[:B])``, ``omega = softmax(p[B:])[:B]``; inactive buffers get omega = 0."""
  theta = jax.nn.sigmoid(p[:buffers])
  logits = p[buffers:]
  if active is not None:  # one compiled loss serves every number of buffers <= B
    logits = jnp.where(jnp.append(active, True), logits, -jnp.inf)
  omega = jax.nn.softmax(logits)[:buffers]
  return theta, omega


def _blt_coefs(theta, omega, n):
  j = jnp.arange(n - 1, dtype=theta.dtype)
  powers = jnp.exp(j[:, None] * jnp.log(theta)[None, :])
  return jnp.concatenate([jnp.ones(1, theta.dtype), powers @ omega])


def _blt_loss(p, active, eta, *, n, buffers, beta, kind, steps):
  theta, omega = _blt_params(p, buffers, active)
  c = _blt_coefs(theta, omega, n)
  if len(steps) == 1:
    sens2 = jnp.sum(c * c)
  else:  # "monotone" case: ||C 1_q||^2
    q = np.zeros(n)
    q[np.asarray(steps)] = 1.0
    v = _work._fft_conv(c, jnp.asarray(q, c.dtype), n)  # pylint: disable=protected-access
    sens2 = jnp.sum(v * v)
  d = _work.toeplitz_inverse(c)
  return sens2 * _work._workload_error_impl(d, beta, eta, kind)  # pylint: disable=protected-access


@functools.partial(jax.jit, static_argnames=("n", "buffers", "beta", "kind", "steps"))
def _blt_value_and_grad(p, active, eta, scale, *, n, buffers, beta, kind, steps):
  value, grad = jax.value_and_grad(_blt_loss)(p, active, eta, n=n, buffers=buffers, beta=beta,
                                              kind=kind, steps=steps)
  return value / scale, grad / scale


def _blt_init(n: int, buffers: int) -> np.ndarray:
  """Logits of a BLT fitted to the square-root coefficients (nonnegative least squares)."""
  target = square_root_coefs(n)[1:]
  gaps = np.logspace(np.log10(1.0 / max(n, 4)), np.log10(0.5), buffers)  # 1 - theta_i
  theta = 1.0 - gaps
  design = theta[None, :] ** np.arange(n - 1)[:, None]
  if n > 1:
    omega, _ = scipy.optimize.nnls(design, target)
  else:
    omega = np.full(buffers, 0.5 / buffers)
  omega = np.maximum(omega, 1e-6)
  total = omega.sum()
  if total > 0.99:
    omega *= 0.99 / total
  logits_w = np.concatenate([np.log(omega), [np.log(1.0 - omega.sum())]])
  logits_theta = np.log(theta) - np.log1p(-theta)
  return np.concatenate([logits_theta, logits_w])


def _blt_logits(theta: np.ndarray, omega: np.ndarray) -> np.ndarray:
  """Logits of :func:`_blt_params` for given ``theta`` in (0, 1), ``omega > 0``, ``sum < 1``."""
  omega = np.maximum(np.asarray(omega, np.float64), 1e-8)
  if omega.sum() > 0.995:
    omega = omega * 0.995 / omega.sum()
  theta = np.clip(np.asarray(theta, np.float64), 1e-6, 1.0 - 1e-9)
  logits_w = np.concatenate([np.log(omega), [np.log1p(-omega.sum())]])
  return np.concatenate([np.log(theta) - np.log1p(-theta), logits_w])


_NEW_BUFFER_THETAS = (0.2, 0.5, 0.8)  # decays tried for a buffer added to a warm start


def _blt_starts(n: int, buffers: int, previous) -> list[np.ndarray]:
  """Starting logits: the least-squares start, and ``previous`` (theta, omega) plus one buffer."""
  starts = [_blt_init(n, buffers)]
  if previous is not None:
    theta, omega = previous
    free = max(1.0 - omega.sum(), 1e-3)
    for new in _NEW_BUFFER_THETAS:
      # keep the decays distinct: a new buffer on top of an existing one would merge into it
      new = new if np.all(np.abs(theta - new) > 1e-3) else 0.5 * new
      starts.append(_blt_logits(np.append(theta, new), np.append(omega, 0.25 * free)))
  return starts


def _embed(p0: np.ndarray, buffers: int, top: int) -> np.ndarray:
  """Logits of ``buffers`` buffers placed in the ``top``-buffer layout (the rest inactive)."""
  out = np.zeros(2 * top + 1)
  out[:buffers] = p0[:buffers]
  out[top:top + buffers] = p0[buffers:2 * buffers]
  out[-1] = p0[-1]
  return out


def _optimize_blt_fixed(n, buffers, top, previous, eta, beta, error, steps, max_iterations, tol):
  """Best (loss, theta, omega) over the starts of :func:`_blt_starts` (float64).

  The loss is compiled once for ``top`` buffers; the ``top - buffers`` unused
  ones have omega = 0 (masked logits) and a zero gradient.
  """
  best = None
  with jax.enable_x64(True):
    eta_j = None if eta is None else jnp.asarray(eta, jnp.float64)
    active = jnp.arange(top) < buffers
    kw = dict(n=n, buffers=top, beta=beta, kind=error, steps=steps)
    for p0 in _blt_starts(n, buffers, previous):
      p0 = _embed(p0, buffers, top)
      scale = float(_blt_value_and_grad(jnp.asarray(p0), active, eta_j, 1.0, **kw)[0])
      if not (np.isfinite(scale) and scale > 0):
        continue
      vg = lambda p, scale=scale: _blt_value_and_grad(p, active, eta_j, scale, **kw)
      try:
        p = _lbfgs(vg, p0, max_iterations, tol)
      except RuntimeError:
        continue
      loss = float(_blt_value_and_grad(jnp.asarray(p), active, eta_j, 1.0, **kw)[0])
      if np.isfinite(loss) and (best is None or loss < best[0]):
        theta, omega = (np.asarray(a, np.float64)[:buffers]
                        for a in _blt_params(jnp.asarray(p), top, active))
        best = (loss, theta, omega)
  if best is None:
    raise RuntimeError(f"BLT optimisation with {buffers} buffers diverged from every start.")
  return best


def optimize_blt(num_steps, buffers, *, momentum=0.0, learning_rates=None, max_participations=1,
                 min_separation=None, error="total", max_iterations=500, tol=1e-10,
                 max_buffers=8, rtol=1.01) -> BLT:
  """The BLT strategy (``theta`` in (0,1), ``omega >= 0``, ``sum(omega) < 1``) minimising the loss.

  Several starts, best kept (module docstring): for ``buffers = B`` the optima
  for 1, ..., B buffers are found in turn, each warm-started from the previous
  one plus a new buffer (``theta`` in {0.2, 0.5, 0.8}) and from the
  log-spaced least-squares fit; so B buffers never do worse than B - 1 (a
  known failure of a single start, where two buffers merge).

  Args:
    num_steps: n.
    buffers: number of buffers (>= 1), or ``"auto"``: try 1, 2, ...,
      ``max_buffers`` and keep adding a buffer while it lowers the loss by at
      least the factor ``rtol`` (JAX Privacy's rule).
    momentum, learning_rates, error, max_iterations, tol: as
      :func:`optimize_bandmf`.
    max_participations: k.
    min_separation: b; default 1 (any k steps), the weakest assumption. The
      sensitivity is exact for every b (``"monotone"`` case).
    max_buffers: the largest number of buffers ``"auto"`` tries.
    rtol: ``"auto"`` keeps B + 1 buffers only if ``rtol * loss(B + 1) < loss(B)``.

  Returns:
    ``BLT(theta, omega)``.
  """
  n, beta, eta, k, b, error = _check_common(num_steps, momentum, learning_rates,
                                            max_participations, min_separation, error)
  auto = isinstance(buffers, str) and buffers == "auto"
  if auto:
    max_buffers = _validation.check_positive_int(max_buffers, "max_buffers")
    rtol = _validation.check_positive(rtol, "rtol")
    if rtol < 1:
      raise ValueError(f"rtol must be >= 1, got {rtol}.")
    top = max_buffers
  else:
    if isinstance(buffers, str):
      raise ValueError(f"buffers must be an integer >= 1 or 'auto', got {buffers!r}.")
    top = buffers = _validation.check_positive_int(buffers, "buffers")
  max_iterations, tol = _check_solver(max_iterations, tol)
  if b is None:
    b = 1
  steps = tuple(int(s) for s in _pattern_steps(n, k, b))
  kept, previous = None, None
  for count in range(1, top + 1):
    loss, theta, omega = _optimize_blt_fixed(n, count, top, previous, eta, beta, error, steps,
                                             max_iterations, tol)
    if previous is not None and loss > kept[0]:
      # Never worse than one buffer fewer: keep that optimum, with a zero-weight extra buffer
      # as the next warm start.
      loss, theta, omega = kept[0], np.append(kept[1], 0.5), np.append(kept[2], 0.0)
    if auto and kept is not None and not rtol * loss < kept[0]:
      break
    kept = (loss, theta, omega)
    previous = (theta, omega)
  _, theta, omega = kept
  if not auto:
    keep = np.ones(theta.size, bool)
  else:
    keep = omega > 0  # a zero-weight buffer carried over from a warm start does nothing
  theta = np.clip(theta[keep], np.finfo(np.float64).tiny, 1.0 - np.finfo(np.float64).epsneg)
  return BLT(theta, omega[keep])


# ---------------------------------------------------------------------------
# ColumnNormalizedBanded


_CNB_MIN_BLOCK = 32


def _block_layout(n: int, bands: int):
  """Block size s (>= bands - 1, so C is block lower-bidiagonal) and gather indices of the blocks.

  With ``N = ceil(n / s) s`` (padded columns: identity), block i of the
  diagonal is ``D_i[a, c] = C[is + a, is + c] = T[is + c, a - c]`` and of the
  sub-diagonal ``L_i[a, c] = C[is + a, (i-1)s + c] = T[(i-1)s + c, s + a - c]``
  (``T[j, r] = C[j + r, j]``, zero outside ``0 <= r < bands``). Returns
  ``(s, nb, diag_idx, diag_ok, sub_idx, sub_ok)`` with indices into ``T.ravel()``.
  """
  s = max(bands, min(_CNB_MIN_BLOCK, n))
  nb = -(-n // s)
  a = np.arange(s)[:, None]
  c = np.arange(s)[None, :]
  i = np.arange(nb)[:, None, None]
  r_d = a - c
  diag_ok = np.broadcast_to((r_d >= 0) & (r_d < bands), (nb, s, s))
  diag_idx = (i * s + c) * bands + np.clip(r_d, 0, bands - 1)
  r_s = s + a - c
  sub_ok = np.broadcast_to((r_s < bands) & (i >= 1), (nb, s, s))
  sub_idx = (np.maximum(i - 1, 0) * s + c) * bands + np.clip(r_s, 0, bands - 1)
  return s, nb, diag_idx, diag_ok, sub_idx, sub_ok


def _blocks(t_pad, layout):
  """Dense diagonal and sub-diagonal blocks of C from the padded table."""
  _, _, diag_idx, diag_ok, sub_idx, sub_ok = layout
  flat = t_pad.ravel()
  return jnp.where(diag_ok, flat[diag_idx], 0.0), jnp.where(sub_ok, flat[sub_idx], 0.0)


def _pad_table(t, layout):
  """The (N, bands) table: the padded columns are the identity (``C[j, j] = 1``)."""
  s, nb = layout[0], layout[1]
  n, bands = t.shape
  pad = jnp.zeros((nb * s - n, bands), t.dtype).at[:, 0].set(1.0)
  return jnp.concatenate([t, pad])


def _solve_forward(diag, sub, rhs):
  """``Y = C^{-1} rhs`` for block lower-bidiagonal C: ``Y_i = D_i^{-1} (rhs_i - L_i Y_{i-1})``."""
  def step(prev, blocks):
    d, l, b = blocks
    y = jax.scipy.linalg.solve_triangular(d, b - l @ prev, lower=True)
    return y, y

  _, ys = jax.lax.scan(step, jnp.zeros_like(rhs[0]), (diag, sub, rhs))
  return ys


def _solve_transposed(diag, sub, rhs):
  """``X = C^{-T} rhs``: ``X_i = D_i^{-T} (rhs_i - L_{i+1}^T X_{i+1})``, backward over blocks."""
  sub_next = jnp.concatenate([sub[1:], jnp.zeros_like(sub[:1])])

  def step(nxt, blocks):
    d, l, b = blocks
    x = jax.scipy.linalg.solve_triangular(d, b - l.T @ nxt, lower=True, trans=1)
    return x, x

  _, xs = jax.lax.scan(step, jnp.zeros_like(rhs[0]), (diag, sub_next, rhs), reverse=True)
  return xs


def _p_transposed(t, a_t, layout):
  """``P^T`` (blocks of rows, ``(nb, s, n)``), ``P = A C^{-1}``, i.e. ``C^T P^T = A^T``."""
  s, nb = layout[0], layout[1]
  n = t.shape[0]
  diag, sub = _blocks(_pad_table(t, layout), layout)
  rhs = jnp.concatenate([a_t, jnp.zeros((nb * s - n, a_t.shape[1]), a_t.dtype)])
  return diag, sub, _solve_transposed(diag, sub, rhs.reshape(nb, s, -1))


@functools.partial(jax.jit, static_argnames=("bands",))
def _banded_row_errors_impl(t, a_t, *, bands):
  layout = _block_layout(t.shape[0], bands)
  _, _, p_t = _p_transposed(t, a_t, layout)
  return jnp.sum(p_t * p_t, axis=(0, 1))


def _banded_row_errors(t, a_t):
  """``||row_t(A C^{-1})||^2`` for the banded C with ``t[j, r] = C[j + r, j]``."""
  return _banded_row_errors_impl(t, a_t, bands=int(t.shape[1]))


@functools.partial(jax.jit, static_argnames=("kind", "bands"))
def _cnb_value_and_grad(x, mask, a_t, sens2, scale, *, kind, bands=None):
  """``sens2 * E`` and its gradient in the free table x (module docstring), divided by ``scale``.

  ``P^T`` from ``C^T P^T = A^T`` and ``Y = C^{-1} (diag(w) P)^T`` are block
  triangular solves; ``dE / dC[j + r, j] = -2 sum_t P[t, j + r] Y[j, t]`` is
  read from the products of each block of Y with the rows of ``P^T`` of its
  block and the next.
  """
  n, bands = mask.shape
  layout = _block_layout(n, bands)
  s, nb = layout[0], layout[1]
  x = x.reshape(n, bands) * mask
  norms = jnp.sqrt(jnp.sum(x * x, axis=1))
  t = x / norms[:, None]
  diag, sub, p_t = _p_transposed(t, a_t, layout)  # p_t: (nb, s, n), padded rows zero
  per_row = jnp.sum(p_t * p_t, axis=(0, 1))
  if kind == "max":
    value = jnp.max(per_row)
    w = jax.nn.one_hot(jnp.argmax(per_row), n, dtype=t.dtype)
  else:
    total = jnp.sum(per_row)
    value = total / n if kind == "mean" else total
    w = jnp.full((n,), 1.0 / n if kind == "mean" else 1.0, t.dtype)
  y = _solve_forward(diag, sub, p_t * w[None, None, :])  # (nb, s, n)
  pairs = jnp.concatenate([p_t, jnp.concatenate([p_t[1:], jnp.zeros_like(p_t[:1])])], axis=1)
  m = jnp.einsum("isk,ick->isc", y, pairs)  # (nb, s, 2s): M_i[a, c] = sum_t Y[is+a, t] P^T[is+c, t]
  a_idx = np.arange(s)[:, None]
  r_idx = np.arange(bands)[None, :]
  g = m[:, a_idx, a_idx + r_idx].reshape(nb * s, bands)[:n]  # G[j, r] = M[j, j + r]
  g = -2.0 * g * mask
  g = (g - t * jnp.sum(t * g, axis=1, keepdims=True)) / norms[:, None]  # through c = x / ||x||
  return sens2 * value / scale, (sens2 * g * mask / scale).ravel()


def optimize_column_normalized_banded(num_steps, bands, *, momentum=0.0, learning_rates=None,
                                      max_participations=1, min_separation=None, error="total",
                                      max_iterations=500, tol=1e-10,
                                      init=None) -> ColumnNormalizedBanded:
  """The column-normalised banded C minimising ``sens(C)^2 * err(A C^{-1})`` (module docstring).

  The general (non-Toeplitz) counterpart of :func:`optimize_bandmf`, as JAX
  Privacy's ``banded.optimize`` (McKenna 2024): more free parameters (n x
  bands), a lower error (1-5% at n <= 2000, 16-64 bands), O(n^2 bands) per
  L-BFGS iteration.

  Args:
    num_steps: n; the strategy is defined for at most n steps.
    bands: number of bands (``1 <= bands <= n``).
    momentum, learning_rates, error, max_iterations, tol: as
      :func:`optimize_bandmf`.
    max_participations: k.
    min_separation: b; default ``bands`` when ``k > 1``; must be ``>= bands``
      when more than one participation fits (then ``sens = sqrt(k')`` exactly).
    init: a starting :class:`ColumnNormalizedBanded` with n steps and
      ``bands`` bands, or None (the optimised Toeplitz BandMF, columns
      normalised).

  Returns:
    A :class:`ColumnNormalizedBanded`.
  """
  n, beta, eta, k, b, error, bands, max_iterations, tol = _check_banded(
      num_steps, bands, momentum, learning_rates, max_participations, min_separation, error,
      max_iterations, tol, why="the exact sensitivity sqrt(k) needs it.")
  if init is not None:
    if not isinstance(init, ColumnNormalizedBanded) or init.n != n or init.bands != bands:
      raise ValueError(f"init must be a ColumnNormalizedBanded with n={n} and bands={bands}.")
    x0 = np.asarray(init.table)
  else:
    toeplitz = optimize_bandmf(n, bands, momentum=beta, learning_rates=eta, max_participations=k,
                               min_separation=b, error=error, max_iterations=max_iterations,
                               tol=tol)
    x0 = ColumnNormalizedBanded.from_toeplitz(toeplitz, n).table
  if bands == 1:
    return ColumnNormalizedBanded(x0)
  mask = (np.arange(n)[:, None] + np.arange(bands)[None, :]) < n
  a_t = _work.sgd_workload(n, momentum=beta, learning_rates=eta).T
  with jax.enable_x64(True):
    args = (jnp.asarray(mask, jnp.float64), jnp.asarray(a_t, jnp.float64), float(k))
    scale = float(_cnb_value_and_grad(jnp.asarray(x0.ravel()), *args, 1.0, kind=error)[0])
    vg = lambda x: _cnb_value_and_grad(x, *args, scale, kind=error)
    x = _lbfgs(vg, x0.ravel(), max_iterations, tol).reshape(n, bands)
  return ColumnNormalizedBanded(np.where(mask, x, 0.0))


__all__ = ["expected_error", "optimize_blt", "optimize_bandmf",
           "optimize_column_normalized_banded", "square_root_coefs"]
