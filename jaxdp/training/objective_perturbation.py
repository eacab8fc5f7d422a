r"""Objective (loss) perturbation: minimise a randomly perturbed, extra-regularised objective.

Multiclass loss perturbation (paper 000 = ``../shared/papers/000_tradeoffs_of_private_prediction.md``,
App. B.2, Algorithms 4 and 5, Theorems 3 and 4; Chaudhuri et al. 2011 and Kifer
et al. 2012 generalised to ``theta in R^{D x C}``). The privacy proofs invert
the stationarity condition of

.. math::
   J_{priv}(\theta) = \frac{1}{N}\Big[\sum_n \ell(\theta^\top x_n, y_n) + \lambda_0 R(\theta)
     + \mathrm{tr}(B^\top\theta) + \frac{\rho}{2}\|\theta\|_F^2\Big]

(proof of Thm 3, Eq. 21: ``b = -lambda grad R - sum grad l (x) x - rho w``), so
the extra L2 term is ``rho / (2N) ||theta||^2`` as in **Algorithm 4**, *not*
``rho/2 ||theta||^2`` as in the main text's Eq. 3; we follow the proof. In
our mean-normalised solver objective this is ``linear_term = B / N`` and
``extra_l2 = rho / N`` on top of the user's ``(lambda/2)||theta||^2`` (any
convex regulariser is allowed by Thm 3; ``lambda = lambda_0 / N``).

* ``rho >= 2 L C / eps`` with ``L = 1/2`` (softmax Hessian bound, Thm 10)
  bounds the Jacobian-determinant ratio by ``(1 + L/rho)^C <= e^{eps/2}``
  (Eqs. 26-29, Lemma 2).
* ``(eps, 0)``: ``p(B) ∝ exp(-beta ||B||_F)``, ``beta = eps / (2K)``, ``K = sqrt 2``
  (Eqs. 31-33: ``||b' - b|| <= K``).
* ``(eps, delta)``: ``B ~ N(0, sigma^2 I)``, ``sigma = (K/eps) sqrt(8 log(2/delta) + 4 eps)``
  (Algorithm 5, Eq. 38-39, from Kifer et al. 2012 Thm 2).

Neighbouring relation. The proof of Thm 3 takes ``D' = D ∪ {(x', y')}``
(add/remove one example), so ``||b' - b|| <= K``. Under replace-one
neighbours (the relation of Lemma 1 / model sensitivity) ``||b' - b|| <= 2K``
while the determinant bound is unchanged (``det(A0+E1)/det(A0+E2) <=
det(A0+E1)/det(A0)``), so ``neighbouring="replace_one"`` halves beta (doubles
sigma). The paper's constants are ``neighbouring="add_remove"``; the default
is ``"replace_one"``, the relation of every other linear method here (model
sensitivity, paper 003 Alg. 1 and 4), so events spent in one accountant refer
to one relation, and ``l2_reg > 0`` is valid (next paragraph).

Regulariser under add/remove. The proof needs every term of the summed
objective other than the loss of the added example to be the same for D and
D'. Paper 000's ``lambda_0 R(theta)`` sits inside the sum (Eq. 3: ``lambda/N``
in the mean), so it is data-independent. Our solver's ``(lambda/2)||theta||^2``
is in the *mean*, i.e. ``N lambda/2 ||theta||^2`` in the sum: adding one
example adds ``lambda theta`` to Eq. 30, ``||b' - b|| <= K + lambda ||theta||``,
which is unbounded, so the (eps, 0) (and (eps, delta)) proof fails. Hence
``neighbouring="add_remove"`` requires ``l2_reg = 0``; extra regularisation
is obtained from a larger ``rho`` (``rho/(2N)||theta||^2`` in the mean is
``rho/2 ||theta||^2`` in the sum, data-independent; any ``rho >= 2LC/eps`` is
allowed, so ``rho = 2LC/eps + lambda_0`` is the paper's ``lambda_0 R``).
Under ``"replace_one"`` N is fixed and ``l2_reg > 0`` is fine.

Binary objective perturbation (paper 003 = ``../shared/papers/003_dp_confidence_intervals_for_erm.md``,
Sec. 4.1, Algorithm 1, Theorem 1, proof App. A.1; replace-one neighbours):
objective ``(1/n) sum [f + c ||theta||^2] + (1/n) beta^T theta`` with
``|f'| <= 1, |f''| <= t``; ``eps' = eps - log(1 + t/(2nc))``, ``gamma = eps'/2``,
valid when ``c > t / (2n (e^eps - 1))`` (i.e. ``eps' > 0``). Our ``lambda = 2c``,
so ``eps' = eps - log(1 + t/(N lambda))``. When the condition fails we follow
Chaudhuri et al. 2011 Algorithm 2's fallback adapted to the improved constant:
add ``Delta/2 ||theta||^2`` so that the total ``lambda + Delta = t / (N (e^{eps/2} - 1))``,
and use ``eps' = eps/2`` (the same proof then gives ``e^{eps/2} e^{eps/2}``).
``t = 1/4`` (logistic), ``1/(2h)`` (Huberized hinge, paper 003 Sec. 6).

Exact minimisation. These guarantees hold at the exact minimiser; we refuse
to release a solution whose gradient norm exceeds ``tol``. The residual
``tol`` itself is not accounted for (as in the papers); keep it small.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.mechanisms.gaussian import gaussian_noise
from jaxdp.mechanisms import noise_scale_as
from jaxdp.mechanisms.l2_laplace import l2_laplace_noise
from jaxdp.training import linear, linear_losses

NEIGHBOURING = ("add_remove", "replace_one")


class ObjectivePerturbationCalibration(NamedTuple):
  """Host-side (float64) calibration of an objective-perturbation method.

  Attributes:
    noise: ``"l2_laplace"`` (scale = beta: density ∝ exp(-beta ||B||)),
      ``"gaussian"`` (scale = sigma) or ``"none"``.
    scale: beta / gamma, or sigma (0.0 for ``"none"``).
    extra_l2: coefficient ``lambda_extra`` of the extra ``(lambda_extra/2)||theta||^2``
      in the mean-normalised objective (``rho/N`` for loss perturbation, ``Delta`` for
      the binary fallback).
    rho: loss perturbation's ``rho`` (None for the binary method).
    epsilon_noise: the part of epsilon spent by the noise density (``eps/2`` for
      loss perturbation, ``eps'`` for binary objective perturbation).
    neighbouring: the neighbouring relation the guarantee is proven for.
    event: the DpEvent of one release.
  """

  noise: str
  scale: float
  extra_l2: float
  rho: float | None
  epsilon_noise: float
  neighbouring: str
  event: Any


def loss_perturbation_rho(epsilon: float, num_classes: int,
                          hessian_bound: float = linear_losses.SOFTMAX_HESSIAN_BOUND) -> float:
  """Smallest admissible ``rho = 2 L C / eps`` (paper 000 Alg. 4, Eq. 28)."""
  eps = _validation.check_epsilon(epsilon, "epsilon")
  c = _validation.check_positive_int(num_classes, "num_classes")
  return 2.0 * _validation.check_positive(hessian_bound, "hessian_bound") * c / eps


def loss_perturbation_calibration(
    *,
    epsilon: float,
    num_examples: int,
    num_classes: int,
    delta: float = 0.0,
    rho: float | None = None,
    lipschitz: float = linear_losses.SOFTMAX_LIPSCHITZ,
    hessian_bound: float = linear_losses.SOFTMAX_HESSIAN_BOUND,
    neighbouring: str = "replace_one",
    l2_reg: float = 0.0,
) -> ObjectivePerturbationCalibration:
  """Calibration of multiclass loss perturbation (paper 000 Alg. 4 / 5).

  ``beta = eps/(2K)`` (delta = 0) or ``sigma = (K/eps) sqrt(8 log(2/delta) + 4 eps)``
  (delta > 0), both for ``neighbouring="add_remove"`` (default ``"replace_one"``:
  beta/2, 2 sigma);
  ``rho`` defaults to ``2 L C / eps`` and must not be smaller;
  ``extra_l2 = rho / N``. ``epsilon = inf``: no noise, no extra term.
  ``l2_reg`` (the solver's mean-normalised ``lambda``) must be 0 under
  ``"add_remove"`` (module docstring: it is not data-independent there).
  """
  if neighbouring not in NEIGHBOURING:
    raise ValueError(f"neighbouring must be one of {NEIGHBOURING}, got {neighbouring!r}.")
  lam = _validation.check_nonnegative(l2_reg, "l2_reg")
  if neighbouring == "add_remove" and lam > 0.0 and not math.isinf(
      _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)):
    raise ValueError(
        f"l2_reg must be 0 with neighbouring='add_remove', got {lam}: the mean-normalised "
        "(l2_reg/2)||theta||^2 is N*l2_reg/2 ||theta||^2 in the summed objective, which changes "
        "when one example is added, and the proof of paper 000 Thm 3 no longer bounds ||b' - b||. "
        "Regularise through a larger rho (data-independent rho/(2N)||theta||^2, any rho >= 2LC/eps) "
        "or use neighbouring='replace_one'.")
  n = _validation.check_positive_int(num_examples, "num_examples")
  c = _validation.check_positive_int(num_classes, "num_classes")
  k = _validation.check_positive(lipschitz, "lipschitz")
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  delta = _validation.check_delta(delta, "delta")
  if math.isinf(eps):
    return ObjectivePerturbationCalibration("none", 0.0, 0.0, 0.0, math.inf, neighbouring,
                                            events.NonPrivateDpEvent())
  rho_min = loss_perturbation_rho(eps, c, hessian_bound)
  if rho is None:
    rho = rho_min
  else:
    rho = _validation.check_positive(rho, "rho")
    if rho < rho_min * (1.0 - 1e-12):
      raise ValueError(f"rho must be >= 2 L C / epsilon = {rho_min:.6g}, got {rho}.")
  factor = 1.0 if neighbouring == "add_remove" else 2.0  # ||b' - b|| <= K or 2K
  if delta == 0.0:
    beta = eps / (2.0 * k * factor)
    return ObjectivePerturbationCalibration("l2_laplace", beta, rho / n, rho, eps / 2.0,
                                            neighbouring, events.PureDpEvent(eps))
  sigma = factor * (k / eps) * math.sqrt(8.0 * math.log(2.0 / delta) + 4.0 * eps)
  return ObjectivePerturbationCalibration("gaussian", sigma, rho / n, rho, eps / 2.0,
                                          neighbouring, events.ApproxDpEvent(eps, delta))


def objective_perturbation_calibration(
    *,
    epsilon: float,
    num_examples: int,
    l2_reg: float,
    loss: str = "logistic",
    h: float = 0.5,
    allow_extra_l2: bool = True,
) -> ObjectivePerturbationCalibration:
  """Calibration of binary objective perturbation (paper 003 Alg. 1, improved constant).

  With ``t = curvature_bound(loss, h)``, ``c = lambda/2``:
  ``eps' = eps - log(1 + t/(2nc))``; if ``eps' > 0`` (validity condition
  ``c > t/(2n(e^eps - 1))``) the noise has ``gamma = eps'/2`` and no extra term;
  otherwise (if ``allow_extra_l2``) ``extra_l2 = t/(N (e^{eps/2} - 1)) - lambda``
  and ``gamma = eps/4`` (see the module docstring), else ValueError.
  """
  if loss not in ("logistic", "huber"):
    raise ValueError(f"loss must be 'logistic' or 'huber' for binary objective perturbation, got {loss!r}.")
  n = _validation.check_positive_int(num_examples, "num_examples")
  lam = _validation.check_nonnegative(l2_reg, "l2_reg")
  t = linear_losses.curvature_bound(loss, h)
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  if math.isinf(eps):
    return ObjectivePerturbationCalibration("none", 0.0, 0.0, None, math.inf, "replace_one",
                                            events.NonPrivateDpEvent())
  eps_prime = eps - math.log1p(t / (n * lam)) if lam > 0 else -math.inf
  if eps_prime > 0:
    return ObjectivePerturbationCalibration("l2_laplace", eps_prime / 2.0, 0.0, None, eps_prime,
                                            "replace_one", events.PureDpEvent(eps))
  if not allow_extra_l2:
    raise ValueError(
        f"l2_reg must be > t / (N (e^epsilon - 1)) = {t / (n * math.expm1(eps)):.6g} "
        f"(paper 003 Alg. 1: c = l2_reg/2 > t/(2n(e^eps - 1))), got {lam}; or allow_extra_l2=True.")
  extra = t / (n * math.expm1(eps / 2.0)) - lam
  return ObjectivePerturbationCalibration("l2_laplace", eps / 4.0, extra, None, eps / 2.0,
                                          "replace_one", events.PureDpEvent(eps))


@functools.partial(jax.jit, static_argnames=("noise", "loss", "num_classes", "max_iter"))
def _perturbed_fit(key, x, y, scale, extra_l2, l2_reg, h, tol, *, noise, loss, num_classes,
                   max_iter):
  n, d = x.shape
  shape = (d, num_classes) if loss == "softmax" else (d,)
  if noise == "l2_laplace":
    b = l2_laplace_noise(key, shape, scale, x.dtype)
  else:
    b = gaussian_noise(key, shape, scale, x.dtype)
  return linear._fit(x, y, l2_reg, h, b / n, extra_l2, tol, loss=loss, num_classes=num_classes,
                     max_iter=max_iter, has_linear=True)


@functools.partial(jax.jit, static_argnames=("noise", "loss", "num_classes", "max_iter", "mode"))
def _perturbed_fit_many(keys, x, y, scale, extra_l2, l2_reg, h, tol, *, noise, loss, num_classes,
                        max_iter, mode):
  fit = lambda k: _perturbed_fit(k, x, y, scale, extra_l2, l2_reg, h, tol, noise=noise, loss=loss,
                                 num_classes=num_classes, max_iter=max_iter)
  return jax.vmap(fit)(keys) if mode == "vmap" else jax.lax.map(fit, keys)


def _run(key, x, y, cal, *, loss, num_classes, l2_reg, h, max_iter, tol, normalize, method,
         batch_mode):
  num_classes = linear._check_common(loss, num_classes, l2_reg, 0.0, h, max_iter, tol)
  x = linear.check_features(x, "x", normalize=normalize)
  y = linear.check_labels(y, loss, num_classes, np.shape(x)[0])
  if cal.noise == "none":
    model = linear.fit_linear(x, y, num_classes=num_classes, l2_reg=l2_reg, loss=loss, h=h,
                              max_iter=max_iter, tol=tol)
    w, info = model.weights, model.info
    if linear.is_key_batch(key):
      m = jnp.shape(key)[0]
      w = jnp.broadcast_to(w, (m,) + w.shape)
      info = jax.tree.map(lambda a: jnp.broadcast_to(a, (m,) + jnp.shape(a)), info)
  else:
    xj, yj = jnp.asarray(x, jnp.float32), jnp.asarray(y)
    kw = dict(noise=cal.noise, loss=loss, num_classes=int(num_classes), max_iter=int(max_iter))
    # float64 -> float32 towards more noise: sigma rounded up, the L2-Laplace beta down.
    scale = noise_scale_as(cal.scale, jnp.float32, round_up=cal.noise != "l2_laplace")
    args = (xj, yj, scale, cal.extra_l2, l2_reg, h, tol)
    if linear.is_key_batch(key):
      model = _perturbed_fit_many(key, *args, mode=linear.resolve_batch_mode(batch_mode), **kw)
    else:
      model = _perturbed_fit(key, *args, **kw)
    w, info = model.weights, model.info
  linear.require_converged(info, method)
  return linear.PrivateLinearModel(w, info, cal.event, cal)


def loss_perturbation(
    key: jax.Array,
    x: Any,
    y: Any,
    *,
    num_classes: int,
    epsilon: float,
    delta: float = 0.0,
    l2_reg: float = 0.0,
    rho: float | None = None,
    neighbouring: str = "replace_one",
    max_iter: int = 500,
    tol: float = 1e-6,
    normalize: bool = False,
    batch_mode: str = "auto",
) -> linear.PrivateLinearModel:
  """Multiclass loss perturbation (paper 000 Alg. 4 for delta = 0, Alg. 5 for delta > 0).

  Minimises ``(1/N) sum l + (lambda/2)||theta||^2 + (1/N) tr(B^T theta) + (rho/(2N))||theta||^2``
  with ``B`` and ``rho`` from :func:`loss_perturbation_calibration`. A batch of
  keys trains one model per key in a single compiled call (``batch_mode``:
  ``"vmap"``, ``"map"`` or ``"auto"``, see
  :func:`jaxdp.training.linear.resolve_batch_mode`). ``epsilon = inf`` returns
  exactly the non-private model. The guarantee is for replace-one neighbours
  (default) or, with ``neighbouring="add_remove"`` (the paper's beta = eps/(2K),
  half the noise), for add/remove neighbours; ``l2_reg > 0`` is only allowed
  with ``"replace_one"`` (under add/remove regularise with ``rho``; module docstring).

  Raises:
    ValueError: bad privacy parameters, rows outside the unit ball (see
      :func:`jaxdp.data.normalize_rows` or ``normalize=True``), bad labels.
    RuntimeError: a fit did not reach ``tol`` (nothing is released).
  """
  cal = loss_perturbation_calibration(epsilon=epsilon, delta=delta, num_examples=int(np.shape(x)[0]),
                                      num_classes=num_classes, rho=rho, neighbouring=neighbouring,
                                      l2_reg=l2_reg)
  return _run(key, x, y, cal, loss="softmax", num_classes=num_classes, l2_reg=l2_reg, h=0.5,
              max_iter=max_iter, tol=tol, normalize=normalize, method="loss_perturbation",
              batch_mode=batch_mode)


def objective_perturbation(
    key: jax.Array,
    x: Any,
    y: Any,
    *,
    epsilon: float,
    l2_reg: float,
    loss: str = "logistic",
    h: float = 0.5,
    allow_extra_l2: bool = True,
    max_iter: int = 500,
    tol: float = 1e-6,
    normalize: bool = False,
    batch_mode: str = "auto",
) -> linear.PrivateLinearModel:
  """Binary objective perturbation (paper 003 Alg. 1; Chaudhuri et al. 2011), eps-DP.

  Minimises ``(1/N) sum f(s_n theta^T x_n) + ((lambda + Delta)/2)||theta||^2 + (1/N) beta^T theta``,
  ``p(beta) ∝ exp(-gamma ||beta||)``, with ``gamma`` and ``Delta`` from
  :func:`objective_perturbation_calibration`. ``loss`` is ``"logistic"`` or
  ``"huber"`` (width ``h``). Labels in ``{0, 1}`` or ``{-1, 1}``.
  """
  cal = objective_perturbation_calibration(epsilon=epsilon, num_examples=int(np.shape(x)[0]),
                                           l2_reg=l2_reg, loss=loss, h=h,
                                           allow_extra_l2=allow_extra_l2)
  return _run(key, x, y, cal, loss=loss, num_classes=None, l2_reg=l2_reg, h=h, max_iter=max_iter,
              tol=tol, normalize=normalize, method="objective_perturbation",
              batch_mode=batch_mode)
