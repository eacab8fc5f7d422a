r"""Certified approximate minimisers of the strongly convex linear-model objectives.

The privacy proofs of model sensitivity (paper 000 App. A, Lemma 1) and of
objective/loss perturbation (paper 000 App. B.2, Thm 3/4; paper 003 App. A.1)
are about the EXACT minimiser ``theta*`` of

.. math::
   J(\theta) = \frac1N \sum_n \ell(\theta^\top x_n, y_n) + \frac{\Lambda}{2}\|\theta\|_F^2
     + \langle b, \theta\rangle ,

(``Lambda`` = ``l2_reg + extra_l2``, ``b`` the mean-normalised linear term).
A solver returns some ``theta_hat`` instead. This module returns, for EVERY
dataset that meets the assumptions (``||x_n|| <= 1``, ``Lambda > 0``), a point
with the data-independent guarantee

.. math::  \|\hat\theta - \theta^*\|_F \le r := \mathrm{tol} / \Lambda ,

so the callers never refuse a fit (a refusal that depends on whether the
solver converged on ``D`` leaks; review item 4), and calibrate to ``r``
(output perturbation: ``Delta = 2K/(N lambda) + 2r``; objective perturbation:
an extra output noise of sensitivity ``2r``, Approximate Minima Perturbation).

Certificate (strong convexity). ``J`` is ``Lambda``-strongly convex, so for
any ``theta``: ``Lambda ||theta - theta*||^2 <= <grad J(theta) - grad J(theta*),
theta - theta*> <= ||grad J(theta)|| ||theta - theta*||``, i.e.
``||theta - theta*|| <= ||grad J(theta)|| / Lambda``. The gradient is evaluated
on the host in float64 at the float64 point that is released (noise is added
in float64 and the sum rounded to float32 afterwards, which is post-processing),
so float32 round-off never enters the certificate. The float64 round-off of the
certificate itself is bounded DETERMINISTICALLY (worst case over every input
and every summation order, FMA or not) by :func:`certificate_rounding_bound`
(Higham 2002, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
Lemma 3.1 and Eq. (3.4): ``|fl(a^T b) - a^T b| <= gamma_n |a|^T |b|``,
``gamma_n = n u / (1 - n u)``, ``u = 2^-53``) and ADDED to the gradient norm.
A certificate that is NaN (NaN or inf weights, or data) FAILS (every test is
``not g <= tol``): such a point is repaired from a data-independent start or,
for non-finite data, a :class:`CertificationError` is raised; NaN never passes.

Routes (``route`` codes: 0 L-BFGS, 1 float64 L-BFGS polish, 2 accelerated gradient):

0. the float32 L-BFGS iterate (:func:`jaxdp.training.lbfgs.minimize_lbfgs`),
   when its float64 certificate holds (the normal path; no extra cost but one
   float64 pass over ``X``);
1. otherwise a float64 L-BFGS polish started there — a heuristic, cheap near
   the optimum (a few passes) — re-certified: first all such problems at once
   in jitted float64 calls of :func:`jaxdp.training.glm_solver.minimize_glm`
   (``vmap`` over the problems in memory-bounded chunks, under ``jax.enable_x64``), then scipy's
   L-BFGS-B for any still above ``tol``. Which optimiser runs changes nothing
   in the guarantee: only the float64 certificate of the returned point counts;
2. otherwise Nesterov's accelerated gradient method (constant step scheme
   for strongly convex functions, Nesterov 2004, *Introductory Lectures*,
   scheme (2.2.19) with ``gamma_0 = mu``, Thm 2.2.3): for ``mu``-strongly
   convex, ``L``-smooth ``J``,
   ``J(x_k) - J* <= (1 - sqrt(mu/L))^k (J(x_0) - J* + mu/2 ||x_0 - x*||^2)``, so with
   ``J(x_0) - J* <= L/2 ||x_0 - x*||^2`` and ``mu/2 ||x_k - x*||^2 <= J(x_k) - J*``:

   .. math::  \|x_k - x^*\|^2 \le \frac{L + \mu}{\mu} (1 - \sqrt{\mu/L})^k \|x_0 - x^*\|^2 .

   ``mu = Lambda``, ``L = c + Lambda`` with ``c`` the loss's output-curvature
   bound (1/2 softmax, 1/4 logistic, 1/(2h) Huber; ``||x|| <= 1``). The start
   ``x_0`` is the projection onto the ball ``||theta|| <= R = (K + ||b||)/Lambda``
   that contains ``theta*`` (stationarity: ``Lambda theta* = -grad_data - b`` and
   ``||grad_data|| <= K``), so ``||x_0 - x*|| <= min(2R, ||grad J(x_pre)||/Lambda)``
   (projection onto a convex set containing ``x*`` is non-expansive towards it).
   ``||grad J(x_k)|| <= L ||x_k - x*||``, so after

   .. math::  T = \Big\lceil \frac{\log\big(\frac{L+\mu}{\mu} d_0^2 L^2 / (\mathrm{tol}/2)^2\big)}
              {-\log(1 - \sqrt{\mu/L})} \Big\rceil

   iterations ``||grad J|| <= tol/2`` and the certificate holds (the rounding
   bound is far below ``tol/2`` for every ``tol`` accepted by :func:`check_tol`).
   It stops as soon as the certificate holds. Worst case, softmax on
   MNIST (``N = 60000``, ``D C = 7840``, ``lambda = 1e-4``, ``tol = 1e-6``, cold
   start ``d_0 = 2R = 2 sqrt 2 / lambda``): ``L/mu = 5001``,
   ``-log(1 - sqrt(mu/L)) = 0.0142``, ``T ~ 3,900`` float64 passes over ``X``
   (minutes on a CPU); from an L-BFGS iterate with ``||grad J|| = 1e-5`` it is
   ``T ~ 1,200``. It is a worst-case guarantee, never the normal path.

If the certificate still fails after ``T`` iterations (possible only through
float64 round-off, i.e. for a ``tol`` at the float64 floor, which
:func:`check_tol` rejects up front) a :class:`CertificationError` is raised;
see docs/sharp_edges.md.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from jaxdp.training import batching, glm_solver, linear_losses

ROUTES = ("lbfgs", "lbfgs64_polish", "accelerated_gradient")
_U64 = 2.0 ** -53


class CertificationError(FloatingPointError):
  """The float64 certificate failed after the guaranteed iteration count (round-off only)."""


class CertifiedSolution(NamedTuple):
  """Certified approximate minimiser(s); leading batch axis when the input had one.

  Attributes:
    weights: float64 numpy weights (the point the certificate is for).
    grad_norm: float64 ``||grad J(weights)||`` (plus its rounding bound).
    distance: certified bound ``(grad_norm)/Lambda >= ||weights - theta*||``.
    radius: the data-independent bound ``r = tol/Lambda`` that ``distance`` never exceeds.
    route: int codes into :data:`ROUTES` (which route certified each fit).
    iterations: extra float64 iterations spent (0 on the L-BFGS route).
  """

  weights: np.ndarray
  grad_norm: np.ndarray
  distance: np.ndarray
  radius: Any
  route: np.ndarray
  iterations: np.ndarray


def _loss_grad(scores, y, loss, h, need_value=True):
  """``(value per example or None, d loss / d scores)`` in float64 (``scores`` is overwritten)."""
  if loss == "softmax":
    # In place, one (..., N, C) buffer: this is the host-side cost of certifying M fits.
    yi = np.asarray(y, np.int64)
    rows = np.arange(scores.shape[-2])
    m = scores.max(axis=-1, keepdims=True)
    val = None
    if need_value:
      val = m[..., 0] - scores[..., rows, yi]
    scores -= m
    np.exp(scores, out=scores)
    s = scores.sum(axis=-1, keepdims=True)
    scores /= s
    scores[..., rows, yi] -= 1.0  # p - onehot
    if need_value:
      val = val + np.log(s[..., 0])
    return val, scores
  sign = np.where(y > 0, 1.0, -1.0)
  z = sign * scores
  if loss == "logistic":
    val = np.logaddexp(0.0, -z) if need_value else None
    dz = -0.5 * (1.0 - np.tanh(0.5 * z))  # -sigmoid(-z), no overflow
  else:
    val = np.where(z > 1 + h, 0.0, np.where(z < 1 - h, 1 - z, (1 + h - z) ** 2 / (4 * h))) \
        if need_value else None
    dz = np.where(z > 1 + h, 0.0, np.where(z < 1 - h, -1.0, -(1 + h - z) / (2 * h)))
  return val, sign * dz


def objective_and_grad(w, x, y, *, loss, h, l2_total, linear_term=None):
  """``(J(w), grad J(w))`` in float64 numpy for one problem (``w`` of shape (D, C) or (D,))."""
  w = np.asarray(w, np.float64)
  scores = x @ w
  val, g = _loss_grad(scores, y, loss, h)
  n = x.shape[0]
  value = val.mean() + 0.5 * l2_total * np.sum(w * w)
  grad = x.T @ g / n + l2_total * w
  if linear_term is not None:
    value = value + np.sum(linear_term * w)
    grad = grad + linear_term
  return value, grad


def _gamma(k: float) -> float:
  """Higham (2002) Eq. (3.4): ``gamma_k = k u / (1 - k u)`` in float64 (inf once ``k u >= 1/2``)."""
  ku = float(k) * _U64
  return math.inf if ku >= 0.5 else ku / (1.0 - ku)


def certificate_rounding_bound(num_examples: int, dim: int, weights_norm, linear_norm,
                               *, loss: str, h: float, l2_total: float) -> np.ndarray:
  r"""Deterministic bound on ``| ||grad J(w)||_computed - ||grad J(w)||_exact |`` in float64.

  Worst case over every input with ``||x_n||_2 <= 1`` and every summation order
  (blocked BLAS, FMA, XLA); no probabilistic model. With ``u = 2^-53``,
  ``gamma_k = k u/(1 - k u)`` (Higham 2002, Lemma 3.1, Eq. (3.4):
  ``|fl(a^T b) - a^T b| <= gamma_n |a|^T |b|`` for an inner product of length
  ``n`` in any order), ``N`` examples, ``m = dim`` weights (``D C``; ``D <= m``,
  ``C <= m``), ``K``/``c`` the loss's Lipschitz and output-curvature bounds, and
  ``W``, ``b`` the TRUE norms (the computed norms passed in are divided by
  ``1 - gamma_{m+2}``, the relative error of a computed 2-norm):

  1. scores ``s_n = W^T x_n`` (inner length ``D``):
     ``||s^_n - s_n||_2 <= gamma_D ||x_n|| ||W||_F <= gamma_m ||W||``;
  2. loss derivative ``G_n = l'(s_n)``: ``l'`` is ``c``-Lipschitz in the 2-norm
     (softmax Jacobian ``diag(p) - p p^T`` has norm <= 1/2; ``sigma' <= 1/4``;
     Huber ``1/(2h)``), so the score error moves it by ``c gamma_m ||W||``; its
     own evaluation (shift by the max, exp, a sum of ``C`` terms, a division,
     ``-1``; or ``tanh``, ``1 -``, halving) errs by at most
     ``eta = 8 gamma_{m+4}`` in the 2-norm of a row (``8 gamma_{m+4} / (2h)``
     for Huber with ``h < 1/2``), assuming ``exp``, ``log`` and ``tanh`` are
     accurate to 4 ulp (glibc documents <= 2 ulp on x86-64). So
     ``||G^_n||_2 <= rho := K + c gamma_m ||W|| + eta``;
  3. data gradient ``X^T G^ / N`` (inner length ``N``): entry ``(d, c)`` errs by
     ``gamma_N sum_n |x_nd| |G^_nc| / N``; by Minkowski over the rows, the
     Frobenius norm of the error is ``<= gamma_N sum_n ||x_n|| ||G^_n|| / N <=
     gamma_N rho``. With step 2: ``E_data = c gamma_m ||W|| + eta + gamma_N rho``
     (no ``sqrt(dim)`` factor);
  4. assembly ``fl(fl(fl(a/N) + fl(Lambda w)) + b)``: four roundings per entry,
     each relative to a sum of at most ``|a/N| + Lambda |w| + |b|``:
     ``E_asm = 4.01 u A`` with ``A = rho + E_data + Lambda ||W|| + ||b||``
     (``>= ||`` the computed gradient ``||``);
  5. the computed norm of the computed gradient ``g^``:
     ``||g^|| <= fl(||g^||) + gamma_{m+2} (A + E_asm)``.

  The certificate's triangle inequality then gives ``||grad J(w)|| <=
  fl(||g^||) + E_data + E_asm + gamma_{m+2} (A + E_asm)``; the result is that
  sum times ``1 + 2^-20`` (the bound's own float64 evaluation). It is affine in
  ``(||W||, ||b||)`` and costs no pass over ``X``. For ``N = 60000``,
  ``K = sqrt 2``, ``W = b = 0``: about ``N u K = 9.4e-12``.
  """
  k = linear_losses.lipschitz_constant(loss)
  c = linear_losses.curvature_bound(loss, h)
  m = max(int(dim), 1)
  g_norm = _gamma(m + 2)
  wn = np.asarray(weights_norm, np.float64) / (1.0 - g_norm)
  ln = np.asarray(linear_norm, np.float64) / (1.0 - g_norm)
  eta = 8.0 * _gamma(m + 4) * (max(1.0, 1.0 / (2.0 * h)) if loss == "huber" else 1.0)
  score = c * _gamma(m) * wn
  rho = k + score + eta
  e_data = score + eta + _gamma(max(int(num_examples), 1)) * rho
  a_sum = rho + e_data + float(l2_total) * wn + ln
  e_asm = 4.01 * _U64 * a_sum
  return (e_data + e_asm + g_norm * (a_sum + e_asm)) * (1.0 + 2.0 ** -20)


def tol_floor(num_examples: int, dim: int, *, loss: str, h: float = 0.5) -> float:
  """The smallest ``tol`` :func:`check_tol` accepts (its docstring): the float64
  certification floor for ``num_examples`` rows and ``dim`` weights."""
  return max(1e3 * math.sqrt(dim) * 8.0 * math.sqrt(num_examples + 4.0) * _U64 *
             linear_losses.lipschitz_constant(loss),
             8.0 * float(certificate_rounding_bound(num_examples, dim, 0.0, 0.0, loss=loss,
                                                    h=h, l2_total=0.0)))


def check_tol(tol: float, *, num_examples: int, dim: int, loss: str, h: float = 0.5) -> float:
  """Validates a certificate tolerance: positive, finite, and far above float64 round-off.

  Requires ``tol >= max(1e3 sqrt(dim) 8 sqrt(N + 4) u K, 8 B_0)`` with ``B_0`` the
  deterministic rounding bound at ``W = b = 0`` (:func:`certificate_rounding_bound`,
  about ``N u K``): data-independent, so the rounding bound of the certificate
  is a small part of ``tol`` (the first term is the historical floor, kept so
  that no tol accepted before is refused now unless the worst case needs it).
  """
  tol = float(tol)
  if not (math.isfinite(tol) and tol > 0):
    raise ValueError(f"tol must be a positive finite number, got {tol}.")
  floor = tol_floor(num_examples, dim, loss=loss, h=h)
  if tol < floor:
    raise ValueError(f"tol={tol:.3g} is below the float64 certification floor {floor:.3g} for "
                     f"N={num_examples}, D*C={dim}; use a larger tol.")
  return tol


def _nan_fails(certificate):
  """NaN certificates (NaN/inf weights or data) become +inf, so that every ``g <= tol`` fails."""
  certificate = np.asarray(certificate, np.float64)
  return np.where(np.isnan(certificate), np.inf, certificate)


def _certify_one(w, x, y, lin, lin_norm, *, loss, h, l2_total):
  _, g = objective_and_grad(w, x, y, loss=loss, h=h, l2_total=l2_total, linear_term=lin)
  err = certificate_rounding_bound(x.shape[0], w.size, np.linalg.norm(w), lin_norm, loss=loss,
                                   h=h, l2_total=l2_total)
  return float(_nan_fails(np.linalg.norm(g) + err))


def _softmax_deriv_inplace(scores, y):
  """``softmax - onehot`` in place on ``scores`` of layout ``(N, M, C)`` (M problems), float64."""
  scores -= scores.max(axis=-1, keepdims=True)
  np.exp(scores, out=scores)
  scores /= scores.sum(axis=-1, keepdims=True)
  scores[np.arange(scores.shape[0]), :, np.asarray(y, np.int64)] -= 1.0
  return scores


def _certify_chunk(wc, x, y, lin, *, loss, h, l2_total):
  """Certificates ``||grad J|| + rounding bound`` of the problems ``wc`` (leading axis)."""
  mc, n, d = wc.shape[0], x.shape[0], x.shape[1]
  # One BLAS GEMM per pass over X for the whole chunk (an einsum or a loop of
  # matmuls over the problems was the bottleneck of certifying M fits).
  if wc.ndim == 3:
    c = wc.shape[-1]
    # Layout (N, M, C) end to end: no transposed copies of the N x M x C buffer.
    scores = (x @ wc.transpose(1, 0, 2).reshape(d, mc * c)).reshape(n, mc, c)
    if loss == "softmax":
      gs = _softmax_deriv_inplace(scores, y)
    else:
      gs = _loss_grad(np.ascontiguousarray(scores.transpose(1, 0, 2)), y, loss, h,
                      need_value=False)[1].transpose(1, 0, 2)
    grad = (x.T @ gs.reshape(n, mc * c)).reshape(d, mc, c).transpose(1, 0, 2)
  else:
    _, gs = _loss_grad(wc @ x.T, y, loss, h, need_value=False)
    grad = gs @ x
  grad = grad / n + l2_total * wc
  lin_norm = 0.0
  if lin is not None:
    grad = grad + lin
    lin_norm = np.linalg.norm(lin.reshape(mc, -1), axis=1)
  wn = np.linalg.norm(wc.reshape(mc, -1), axis=1)
  err = certificate_rounding_bound(n, wc[0].size, wn, lin_norm, loss=loss, h=h, l2_total=l2_total)
  return _nan_fails(np.linalg.norm(grad.reshape(mc, -1), axis=1) + err)


def _certify_batch(w, x, y, lin, *, loss, h, l2_total, chunk_elems=2 ** 21):
  """Vectorised :func:`_certify_one` over the leading axis of ``w``.

  Chunked to bound memory (``chunk_elems`` float64 scores per chunk), the
  chunks in threads, one per core (numpy's element-wise work is
  single-threaded and releases the GIL). The same float64 operations as
  :func:`_certify_one` per problem, so the same rounding bound.
  """
  m = w.shape[0]
  n = x.shape[0]
  per = max(1, chunk_elems // max(1, n * (w.shape[-1] if w.ndim == 3 else 1)))
  starts = list(range(0, m, per))
  run = lambda s: _certify_chunk(w[s:s + per], x, y, None if lin is None else lin[s:s + per],
                                 loss=loss, h=h, l2_total=l2_total)
  workers = min(len(starts), batching.cpu_workers())
  if workers <= 1:
    return np.concatenate([run(s) for s in starts])
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    return np.concatenate(list(pool.map(run, starts)))


def accelerated_gradient_iterations(mu: float, smooth: float, dist0: float, tol: float) -> int:
  """``T`` of the module docstring: AGD iterations after which ``||grad J|| <= tol/2``."""
  q = math.sqrt(mu / smooth)
  if dist0 <= 0:
    return 0
  num = math.log((smooth + mu) / mu) + 2.0 * math.log(dist0 * smooth / (0.5 * tol))
  return max(0, math.ceil(num / -math.log1p(-q)))


def _polish64(w0, x, y, lin, *, loss, h, l2_total, tol, max_iter=200):
  shape = w0.shape
  fun = lambda v: objective_and_grad(v.reshape(shape), x, y, loss=loss, h=h, l2_total=l2_total,
                                     linear_term=lin)
  wrapped = lambda v: (lambda fg: (fg[0], fg[1].reshape(-1)))(fun(v))
  res = scipy.optimize.minimize(wrapped, w0.reshape(-1), jac=True, method="L-BFGS-B",
                                options=dict(maxiter=max_iter, maxcor=20, ftol=0.0,
                                             gtol=0.1 * tol / math.sqrt(w0.size)))
  return res.x.reshape(shape), int(res.nit)


_POLISH_MEMORY = 50  # L-BFGS pairs of the polish (minimize_glm's default)


def polish_num_chunks(num_problems: int, num_examples: int, weights_size: int, num_outputs: int,
                      chunk_bytes: int = 2 ** 31) -> int:
  """Equal vmapped chunks of :func:`_polish64_batched`, each within ``chunk_bytes`` of float64
  solver state (``2 * memory`` L-BFGS pairs of the weights' size and about six ``(N, C)``
  score-sized buffers per problem)."""
  per = 8 * (2 * _POLISH_MEMORY * weights_size + 6 * num_examples * num_outputs)
  most = max(1, int(chunk_bytes) // per)
  return -(-int(num_problems) // most)


def _polish64_batched(w0, x, y, lin, *, loss, h, l2_total, tol, max_iter=200, chunk_bytes=2 ** 31):
  """Float64 glm-solver polish of ``M`` problems, ``vmap``ped in equal chunks.

  Stops each problem at ``||grad||_2 <= tol / 4`` (the float64 certificate adds
  its round-off bound on top). Returns the polished ``(M, ...)`` weights (float64)
  and iteration counts. A heuristic like :func:`_polish64`: the caller
  re-certifies every returned point.

  ``vmap``, not ``lax.map``: the problems share ``X``, so each pass over it is one wide
  float64 product for the whole chunk (loss perturbation on MNIST, 100 draws at
  eps = 0.1: 40-43 s for this route's certify step vs 58-62 s with ``lax.map``, the same
  iterates). A polish starts next to the optimum, so the problems take similar numbers of
  iterations (1-5 there) and the ``vmap``ped loop wastes little on the slowest one.
  Chunks bound the memory (:func:`polish_num_chunks`) and run one after the other
  (:func:`jaxdp.training.batching.map_in_chunks`, which pads the last one so that one
  compiled shape serves every chunk).
  """
  w0 = np.asarray(w0, np.float64)
  chunks = polish_num_chunks(w0.shape[0], x.shape[0], w0[0].size,
                             w0.shape[-1] if w0.ndim == 3 else 1, chunk_bytes)
  with jax.enable_x64(True):
    xj = jnp.asarray(x, jnp.float64)
    yj = jnp.asarray(y)
    w0j = jnp.asarray(w0)
    lins = jnp.zeros_like(w0j) if lin is None else jnp.asarray(lin, jnp.float64)
    scalars = (jnp.asarray(l2_total, jnp.float64), jnp.asarray(h, jnp.float64),
               jnp.asarray(tol / 4.0, jnp.float64))
    polish = lambda wl: _polish64_jit(*wl, xj, yj, *scalars, loss=loss, max_iter=int(max_iter))
    out_w, info = batching.map_in_chunks(polish, (w0j, lins), chunks, max_workers=1)
    return np.asarray(out_w, np.float64), np.asarray(info.num_iter, np.int64)


@functools.partial(jax.jit, static_argnames=("loss", "max_iter"),
                   compiler_options=glm_solver.COMPILER_OPTIONS)
def _polish64_jit(w0, lins, x, y, l2_total, h, tol, *, loss, max_iter):
  fit = lambda w, lin: glm_solver.minimize_glm(x, y, loss=loss, l2_total=l2_total, init=w,
                                               linear_term=lin, h=h, max_iter=max_iter, tol=tol,
                                               memory_size=_POLISH_MEMORY)
  return jax.vmap(fit)(w0, lins)


def _agd64(w_pre, gnorm_pre, x, y, lin, lin_norm, *, loss, h, l2_total, tol, check_every=10):
  mu = l2_total
  smooth = linear_losses.curvature_bound(loss, h) + mu
  radius = (linear_losses.lipschitz_constant(loss) + lin_norm) / mu
  nrm = np.linalg.norm(w_pre)
  if not np.isfinite(nrm):  # NaN/inf weights: the data-independent start 0, ||0 - x*|| <= radius
    w_pre, nrm, gnorm_pre = np.zeros_like(w_pre), 0.0, math.inf
  x0 = w_pre if nrm <= radius else w_pre * (radius / nrm)
  dist0 = min(2.0 * radius, gnorm_pre / mu)
  t_max = accelerated_gradient_iterations(mu, smooth, dist0, tol)
  q = math.sqrt(mu / smooth)
  mom = (1.0 - q) / (1.0 + q)
  xk, yk = x0, x0
  kw = dict(loss=loss, h=h, l2_total=l2_total)
  for k in range(1, t_max + 1):
    _, g = objective_and_grad(yk, x, y, linear_term=lin, **kw)
    if not np.all(np.isfinite(g)):  # only non-finite data (x, y or the linear term) gets here
      raise CertificationError(
          "the float64 gradient is not finite from a finite point: the data (x, y or the "
          "linear term) contain NaN or inf. Nothing is released.")
    x_new = yk - g / smooth
    yk = x_new + mom * (x_new - xk)
    xk = x_new
    if k % check_every == 0 and _certify_one(xk, x, y, lin, lin_norm, **kw) <= tol:  # NaN fails
      return xk, k
  return xk, t_max


def certify_minimizers(weights: Any, x: Any, y: Any, *, loss: str, h: float, l2_total: float,
                       tol: float, linear_term: Any = None, batched: bool = False,
                       polish: bool = True) -> CertifiedSolution:
  """Certifies ``weights`` (float32 L-BFGS output) and repairs uncertified ones (module docstring).

  Args:
    weights: ``(D, C)``/``(D,)`` or, with ``batched``, ``(M, D, C)``/``(M, D)``.
    x, y: the training data (shared by all ``M`` problems).
    loss, h: the loss (see :mod:`jaxdp.training.linear_losses`).
    l2_total: ``Lambda > 0``, the strong convexity of ``J`` (``l2_reg + extra_l2``).
    tol: the gradient-norm tolerance; the guarantee is ``||w - theta*|| <= tol/Lambda``.
    linear_term: the mean-normalised ``b`` (same shape as ``weights``) or None.
    batched: whether ``weights`` (and ``linear_term``) carry a leading problem axis.
    polish: try the float64 L-BFGS polish before the accelerated-gradient fallback.

  Returns:
    :class:`CertifiedSolution` (every returned ``distance <= radius``).

  Raises:
    CertificationError: only through float64 round-off (module docstring).
  """
  l2_total = float(l2_total)
  if not l2_total > 0:
    raise ValueError(f"l2_total (the strong convexity Lambda) must be > 0, got {l2_total}.")
  x = np.asarray(x, np.float64)
  y = np.asarray(y)
  w = np.array(weights, np.float64)
  if not batched:
    w = w[None]
  m = w.shape[0]
  if linear_term is None:
    lins = [None] * m
  else:
    lin = np.asarray(linear_term, np.float64)
    lins = list(lin) if batched else [lin]
  radius = tol / l2_total
  gn = np.zeros(m)
  route = np.zeros(m, np.int32)
  iters = np.zeros(m, np.int64)
  kw = dict(loss=loss, h=h, l2_total=l2_total)
  lin_stack = None if linear_term is None else np.stack(lins)
  g_all = _certify_batch(w, x, y, lin_stack, **kw)  # NaN certificates are +inf: they fail
  pending = np.flatnonzero(~(g_all <= tol)) if polish else np.zeros(0, np.int64)
  if pending.size:
    # Route 1, first try: all uncertified problems in jitted float64 calls (vmapped chunks).
    wp, nit = _polish64_batched(w[pending], x, y, None if lin_stack is None else lin_stack[pending],
                                tol=tol, **kw)
    gp = _certify_batch(wp, x, y, None if lin_stack is None else lin_stack[pending], **kw)
    better = gp < g_all[pending]
    idx = pending[better]
    w[idx], g_all[idx] = wp[better], gp[better]
    iters[pending] += nit
    route[pending] = 1
  for i in range(m):
    lin_i = lins[i]
    lin_norm = 0.0 if lin_i is None else float(np.linalg.norm(lin_i))
    wi = w[i]
    g = float(g_all[i])
    if not g <= tol and polish and np.all(np.isfinite(wi)):  # batched polish failed: scipy
      wp, nit = _polish64(wi, x, y, lin_i, tol=tol, **kw)
      gp = _certify_one(wp, x, y, lin_i, lin_norm, **kw)
      iters[i] += nit
      if gp < g:
        wi, g = wp, gp
      route[i] = 1
    if not g <= tol:
      wi, nit = _agd64(wi, g, x, y, lin_i, lin_norm, tol=tol, **kw)
      g = _certify_one(wi, x, y, lin_i, lin_norm, **kw)
      iters[i] += nit
      route[i] = 2
      if not g <= tol:
        raise CertificationError(
            f"the float64 gradient certificate still exceeds tol={tol:.3g} after the "
            "guaranteed accelerated-gradient iterations; this can only happen through float64 "
            "round-off (tol too close to the float64 floor). Nothing is released; use a larger tol.")
    w[i] = wi
    gn[i] = g
  dist = gn / l2_total
  if not batched:
    return CertifiedSolution(w[0], gn[0], dist[0], radius, route[0], iters[0])
  return CertifiedSolution(w, gn, dist, radius, route, iters)
