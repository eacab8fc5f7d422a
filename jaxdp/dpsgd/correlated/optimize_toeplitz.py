r"""Optimised Toeplitz strategies: BandMF and BLT.

Both minimise the expected error ``sens(C)^2 * err(A C^{-1})`` of
:mod:`.optimize` (Choquette-Choo et al. 2023, Eq. (3); McKenna 2024, Sec. 2)
in float64 (inside ``jax.enable_x64(True)``; the global flag is left as it
is) with L-BFGS (SciPy's L-BFGS-B driving a jitted ``value_and_grad`` of L,
normalised by its value at the start; :mod:`.optimize_solver`). ``L`` is
invariant to rescaling C, so the diagonal is fixed to ``c_0 = 1``.

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

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from jaxdp import _validation
from jaxdp.dpsgd.correlated import workloads as _work
from jaxdp.dpsgd.correlated.optimize_solver import (_check_banded, _check_common, _check_solver,
                                                    _lbfgs, _pattern_steps)
from jaxdp.dpsgd.correlated.strategies import BLT, BandMF


def square_root_coefs(num_steps) -> np.ndarray:
  """Coefficients of the square root of the prefix-sum matrix, ``r_j = binom(2j, j) / 4^j`` (float64).

  ``r_0 = 1``, ``r_j = r_{j-1} (2j - 1) / (2j)``; the Toeplitz ``R`` has
  ``R R = S`` (Fichtenberger et al. 2023; Henzinger et al. 2023).
  """
  n = _validation.check_positive_int(num_steps, "num_steps")
  j = np.arange(1, n, dtype=np.float64)
  return np.concatenate([[1.0], np.cumprod((2 * j - 1) / (2 * j))])


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


__all__ = ["optimize_bandmf", "optimize_blt", "square_root_coefs"]
