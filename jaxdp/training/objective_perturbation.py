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

Gaussian noise for C > 1 (paper 000 Alg. 5, Eq. 38). The proof bounds
``log mu(b|D)/mu(b'|D') = (2<b, v> + ||v||^2) / (2 sigma^2)`` with ``v = b' - b``
(Eq. 30). Kifer et al.'s scalar tail bound on ``<b, v>`` assumes a fixed
direction, but ``v = grad l(theta_priv) (x) x'`` depends on the output (hence on
``b``). It does lie in a FIXED subspace ``S`` determined by the neighbouring pair
only: ``{u (x) x' : u in R^C}`` (dimension ``k = C``) under add/remove, and
``span{u (x) x', u (x) x}`` (``k <= 2C``) under replace-one. Hence
``|<b, v>| <= ||P_S b|| ||v|| <= ||P_S b|| Delta`` with ``Delta = K`` or ``2K``,
and ``||P_S b|| / sigma`` is chi-distributed with ``k`` degrees of freedom (``b``
is isotropic and ``S`` does not depend on it). With ``t = chi_k^{-1}(1 - delta)``
(exact float64 quantile, ``<= sqrt(k) + sqrt(2 log(1/delta))``), outside an
event of probability ``delta``: ``log ratio <= t Delta/sigma + Delta^2/(2 sigma^2)
<= eps/2`` iff ``sigma >= Delta (t + sqrt(t^2 + eps)) / eps``. We use
``sigma = max(paper, chi)``: for ``C = 1`` the chi value is never larger than the
paper's ``(Delta/eps) sqrt(8 log(2/delta) + 4 eps)`` (``k <= 2``, ``t <=
sqrt(2 log(2/delta))``, and ``t + sqrt(t^2+eps) <= 2 sqrt(t^2 + eps)``), so the
paper's constant is proven and kept there; for ``C > 1`` the chi value is larger
(e.g. ``C = 10``, replace-one, ``delta = 1e-5``: about 1.5x) and is used.

Approximate minimisers: Approximate Minima Perturbation (Iyengar et al. 2019).
The density arguments hold at the exact minimiser ``theta*_b`` of the perturbed
objective. The solver returns ``theta_hat`` with a certified
``||theta_hat - theta*_b|| <= r = tol / Lambda`` on every dataset
(:mod:`jaxdp.training.certified_solve`; ``Lambda = l2_reg + extra_l2`` is the
strong convexity of the PERTURBED objective), and we release
``Y = theta_hat + Z`` with output noise ``Z`` of L2 sensitivity ``2r``.
Split ``eps = eps1 + eps2``, ``delta = delta1 + delta2`` (``eps2 = f eps``,
``f = amp_fraction``). Proof: write ``theta_hat = theta*_b + e(b, D)``, with
``||e(b, D)|| <= r`` (the solver is deterministic given ``b`` and ``D``, and
``b -> theta*_b`` is a bijection for each ``D``, so ``e`` is a function of
``(theta*_b, D)``). The release is post-processing of the ADAPTIVE composition
of ``M1: D -> t = theta*_b``, ``(eps1, delta1)``-DP by paper 000 Thm 3/4 (or
paper 003 Thm 1), and ``M2: (t, D) -> t + e(t, D) + Z``, which for every fixed
``t`` is ``(eps2, delta2)``-DP because ``||e(t, D) - e(t, D')|| <= 2r`` (L2
sensitivity ``2r``). Basic composition: ``(eps1 + eps2, delta1 + delta2)``-DP.
With ``delta = 0`` both parts are pure (L2-Laplace ``Z``, ``beta2 = eps2/(2r)``);
with ``delta > 0``, ``delta2 = f delta`` and ``Z`` is the analytic Gaussian at
``(eps2, delta2)`` on ``2r`` (``delta1 = (1 - f) delta``). The event is
``ComposedDpEvent([objective event, output event])`` (replace-one, as today),
which any accountant composes as the two adaptive releases they are.

Warm starts (``init_weights=``). The solver may start anywhere, including at a
data-dependent point such as the non-private minimiser at the same ``lambda``:
the start only changes how many iterations L-BFGS takes and the deterministic
error ``e(b, D) = theta_hat - theta*_b``, and the proof above uses nothing about
``e`` but ``||e(b, D)|| <= r`` on every dataset, which the float64 certificate
guarantees whatever the start. So a warm-started release has the same
guarantee and the same law up to ``2r``: for one key (same ``B``, same ``Z``) the
warm and cold releases differ by at most ``||e_warm - e_cold|| <= 2r = 2 tol/Lambda``.
(Timing, i.e. how many iterations ran, is not protected either way.)

Default ``tol`` (``tol=None``): the output noise's expected norm is
``amp_noise_ratio`` (1%) of the expected norm of the objective noise's effect
``||B|| / (N Lambda)`` (:func:`amp_default_tol`; never below the float64 certification floor
:func:`~jaxdp.training.certified_solve.tol_floor`, which it meets at very large ``N``), so
with ``f = 0.01`` AMP costs
about 1% more objective noise (``eps1 = 0.99 eps``) and a negligible
independent output noise. That tol is usually below float32 L-BFGS's floor; the
float64 polish of :mod:`jaxdp.training.certified_solve` reaches it.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from scipy import stats

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.accounting.analytic_gaussian import analytic_gaussian_sigma
from jaxdp.mechanisms.gaussian import gaussian_noise
from jaxdp.mechanisms import noise_scale_as
from jaxdp.mechanisms.l2_laplace import l2_laplace_noise
from jaxdp.training import batching, certified_solve, glm_solver, linear, linear_losses

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
                                            neighbouring,
                                            events.PureDpEvent(eps, neighbouring=neighbouring))
  sigma = gaussian_loss_perturbation_sigma(eps, delta, num_classes=c, lipschitz=k,
                                           neighbouring=neighbouring)
  return ObjectivePerturbationCalibration("gaussian", sigma, rho / n, rho, eps / 2.0,
                                          neighbouring,
                                          events.ApproxDpEvent(eps, delta, neighbouring=neighbouring))


def gaussian_loss_perturbation_sigma(epsilon: float, delta: float, *, num_classes: int,
                                     lipschitz: float = linear_losses.SOFTMAX_LIPSCHITZ,
                                     neighbouring: str = "replace_one") -> float:
  """``sigma = max(paper, chi)`` of Gaussian loss perturbation (module docstring, item C > 1).

  ``Delta = K`` (add/remove) or ``2K`` (replace-one); paper 000 Alg. 5:
  ``(Delta/eps) sqrt(8 log(2/delta) + 4 eps)``; chi: ``Delta (t + sqrt(t^2 + eps))/eps``
  with ``t = chi_k^{-1}(1 - delta)``, ``k = C`` (add/remove) or ``2C`` (replace-one).
  """
  if neighbouring not in NEIGHBOURING:
    raise ValueError(f"neighbouring must be one of {NEIGHBOURING}, got {neighbouring!r}.")
  eps = _validation.check_epsilon(epsilon, "epsilon")
  dlt = _validation.check_delta(delta, "delta", allow_zero=False)
  c = _validation.check_positive_int(num_classes, "num_classes")
  sens = _validation.check_positive(lipschitz, "lipschitz") * (
      1.0 if neighbouring == "add_remove" else 2.0)
  paper = (sens / eps) * math.sqrt(8.0 * math.log(2.0 / dlt) + 4.0 * eps)
  k = c if neighbouring == "add_remove" else 2 * c
  t = float(stats.chi.isf(dlt, k))
  chi = sens * (t + math.sqrt(t * t + eps)) / eps
  return max(paper, chi)


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
                                            "replace_one",
                                            events.PureDpEvent(eps, neighbouring="replace_one"))
  if not allow_extra_l2:
    raise ValueError(
        f"l2_reg must be > t / (N (e^epsilon - 1)) = {t / (n * math.expm1(eps)):.6g} "
        f"(paper 003 Alg. 1: c = l2_reg/2 > t/(2n(e^eps - 1))), got {lam}; or allow_extra_l2=True.")
  extra = t / (n * math.expm1(eps / 2.0)) - lam
  return ObjectivePerturbationCalibration("l2_laplace", eps / 4.0, extra, None, eps / 2.0,
                                          "replace_one",
                                          events.PureDpEvent(eps, neighbouring="replace_one"))


class AmpCalibration(NamedTuple):
  """Approximate Minima Perturbation: the objective part and the output-noise part.

  Attributes:
    objective: :class:`ObjectivePerturbationCalibration` at ``(eps1, delta1)``.
    output_noise: ``"l2_laplace"`` (scale = beta2) or ``"gaussian"`` (scale = sigma2).
    output_scale: beta2 or sigma2.
    output_sensitivity: ``2 r = 2 tol / Lambda``.
    tol: the certified gradient-norm tolerance.
    radius: ``r = tol / Lambda``.
    strong_convexity: ``Lambda = l2_reg + extra_l2``.
    epsilon_split, delta_split: ``(eps1, eps2)``, ``(delta1, delta2)``.
    event: ``ComposedDpEvent([objective event, output event])``.
  """

  objective: ObjectivePerturbationCalibration
  output_noise: str
  output_scale: float
  output_sensitivity: float
  tol: float
  radius: float
  strong_convexity: float
  epsilon_split: tuple
  delta_split: tuple
  event: Any


def _check_fraction(f):
  f = float(f)
  if not 0.0 < f < 1.0:
    raise ValueError(f"amp_fraction must be in (0, 1), got {f}.")
  return f


def amp_default_tol(objective: ObjectivePerturbationCalibration, *, epsilon2: float,
                    delta2: float, num_examples: int, dim: int, noise_ratio: float = 0.01) -> float:
  """``tol`` making E||Z|| = ``noise_ratio`` * E||B||/(N Lambda) (module docstring).

  ``E||B|| = dim / beta1`` (L2-Laplace) or ``~ sigma1 sqrt(dim)`` (Gaussian); the output
  noise on sensitivity ``2 tol/Lambda`` has ``E||Z|| = (tol/Lambda) kappa2`` with
  ``kappa2 = 2 dim / eps2`` or ``sqrt(dim) sigma_AG(eps2, delta2, 2)``; ``Lambda`` cancels.
  """
  n = _validation.check_positive_int(num_examples, "num_examples")
  d = _validation.check_positive_int(dim, "dim")
  b_norm = d / objective.scale if objective.noise == "l2_laplace" else objective.scale * math.sqrt(d)
  if delta2 == 0.0:
    kappa2 = 2.0 * d / epsilon2
  else:
    kappa2 = math.sqrt(d) * float(analytic_gaussian_sigma(epsilon2, delta2, 2.0))
  return noise_ratio * b_norm / (n * kappa2)


def amp_calibration(objective_calibration_fn, *, epsilon: float, delta: float,
                    amp_fraction: float, tol: float | None, num_examples: int, dim: int,
                    l2_reg: float, loss: str, h: float = 0.5) -> AmpCalibration:
  """Splits ``(eps, delta)`` and calibrates both AMP parts (module docstring).

  ``objective_calibration_fn(eps1, delta1)`` returns the objective part; ``dim`` is the
  number of weights (``D C`` or ``D``).
  """
  f = _check_fraction(amp_fraction)
  eps = _validation.check_epsilon(epsilon, "epsilon")
  dlt = _validation.check_delta(delta, "delta")
  eps1, eps2 = (1.0 - f) * eps, f * eps
  d1, d2 = (1.0 - f) * dlt, f * dlt
  obj = objective_calibration_fn(eps1, d1)
  lam = float(l2_reg) + obj.extra_l2
  if not lam > 0:
    raise ValueError("l2_reg: the perturbed objective must be strongly convex "
                     "(l2_reg + extra_l2 > 0).")
  if tol is None:  # never below what float64 can certify (large N)
    tol = max(amp_default_tol(obj, epsilon2=eps2, delta2=d2, num_examples=num_examples, dim=dim),
              certified_solve.tol_floor(num_examples, dim, loss=loss, h=h))
  tol = certified_solve.check_tol(tol, num_examples=num_examples, dim=dim, loss=loss, h=h)
  r = tol / lam
  sens = 2.0 * r
  if dlt == 0.0:
    noise, scale, out_event = "l2_laplace", eps2 / sens, events.PureDpEvent(
        eps2, neighbouring=obj.neighbouring)  # same relation as the objective part
  else:
    noise, scale = "gaussian", float(analytic_gaussian_sigma(eps2, d2, sens))
    out_event = events.ApproxDpEvent(eps2, d2, neighbouring=obj.neighbouring)
  return AmpCalibration(obj, noise, scale, sens, tol, r, lam, (eps1, eps2), (d1, d2),
                        events.ComposedDpEvent([obj.event, out_event]))


def loss_perturbation_amp_calibration(
    *, epsilon: float, num_examples: int, num_classes: int, dim: int, delta: float = 0.0,
    rho: float | None = None, neighbouring: str = "replace_one", l2_reg: float = 0.0,
    amp_fraction: float = 0.01, tol: float | None = None) -> AmpCalibration:
  """AMP calibration of :func:`loss_perturbation` (``dim`` = number of features D)."""
  fn = lambda e1, d1: loss_perturbation_calibration(
      epsilon=e1, delta=d1, num_examples=num_examples, num_classes=num_classes, rho=rho,
      neighbouring=neighbouring, l2_reg=l2_reg)
  return amp_calibration(fn, epsilon=epsilon, delta=delta, amp_fraction=amp_fraction, tol=tol,
                         num_examples=num_examples, dim=int(dim) * int(num_classes),
                         l2_reg=l2_reg, loss="softmax")


def objective_perturbation_amp_calibration(
    *, epsilon: float, num_examples: int, dim: int, l2_reg: float, loss: str = "logistic",
    h: float = 0.5, allow_extra_l2: bool = True, amp_fraction: float = 0.01,
    tol: float | None = None) -> AmpCalibration:
  """AMP calibration of :func:`objective_perturbation` (pure DP; ``dim`` = D)."""
  fn = lambda e1, d1: objective_perturbation_calibration(
      epsilon=e1, num_examples=num_examples, l2_reg=l2_reg, loss=loss, h=h,
      allow_extra_l2=allow_extra_l2)
  return amp_calibration(fn, epsilon=epsilon, delta=0.0, amp_fraction=amp_fraction, tol=tol,
                         num_examples=num_examples, dim=int(dim), l2_reg=l2_reg, loss=loss, h=h)


def _perturbed_fit_impl(key, x, y, scale, extra_l2, l2_reg, h, tol, init=None, *, noise, loss,
                        num_classes, max_iter):
  """One perturbed fit: draws ``B`` from ``key`` and runs L-BFGS from ``init`` (zeros if None)."""
  n, d = x.shape
  shape = (d, num_classes) if loss == "softmax" else (d,)
  if noise == "l2_laplace":
    b = l2_laplace_noise(key, shape, scale, x.dtype)
  else:
    b = gaussian_noise(key, shape, scale, x.dtype)
  model = linear._fit_impl(x, y, l2_reg, h, b / n, extra_l2, tol, loss=loss,
                           num_classes=num_classes, max_iter=max_iter, has_linear=True, init=init)
  return model, b


_perturbed_fit = functools.partial(
    jax.jit, static_argnames=("noise", "loss", "num_classes", "max_iter"),
    compiler_options=glm_solver.COMPILER_OPTIONS)(_perturbed_fit_impl)


@functools.partial(jax.jit, static_argnames=("noise", "loss", "num_classes", "max_iter", "mode"),
                   compiler_options=glm_solver.COMPILER_OPTIONS)
def _perturbed_fit_many(keys, x, y, scale, extra_l2, l2_reg, h, tol, init=None, *, noise, loss,
                        num_classes, max_iter, mode):
  """:func:`_perturbed_fit` per key (one shared ``init``), ``vmap`` or ``lax.map`` (``mode``)."""
  fit = lambda k: _perturbed_fit_impl(k, x, y, scale, extra_l2, l2_reg, h, tol, init, noise=noise,
                                      loss=loss, num_classes=num_classes, max_iter=max_iter)
  return jax.vmap(fit)(keys) if mode == "vmap" else jax.lax.map(fit, keys)


@functools.partial(jax.jit, static_argnames=("shape", "kind", "batched"))
def _draw_output_noise(key, scale, *, shape, kind, batched):
  if kind == "l2_laplace":
    draw = lambda k: l2_laplace_noise(k, shape, scale, jnp.float32)
  else:
    draw = lambda k: gaussian_noise(k, shape, scale, jnp.float32)
  return jax.vmap(draw)(key) if batched else draw(key)


def _output_noise(key, shape, amp):
  """Float32 AMP output noise ``Z`` (one draw per key), scale rounded towards more noise."""
  scale = noise_scale_as(amp.output_scale, jnp.float32, round_up=amp.output_noise != "l2_laplace")
  return _draw_output_noise(key, scale, shape=tuple(shape), kind=amp.output_noise,
                            batched=linear.is_key_batch(key))


def _check_init(init_weights, shape):
  """``init_weights`` as a float32 array of the weights' ``shape`` (None stays None)."""
  if init_weights is None:
    return None
  init = _validation.check_finite_array(init_weights, "init_weights")
  if tuple(init.shape) != tuple(shape):
    raise ValueError(f"init_weights must have the weights' shape {tuple(shape)}, got "
                     f"{tuple(init.shape)}.")
  return jnp.asarray(init, jnp.float32)


def _float32_reaches(cal, w_shape, n, tol) -> bool:
  """Whether float32 L-BFGS can be expected to reach ``||grad|| <= tol`` without the float64 repair.

  The gradient holds the noise term ``B/N``, of expected norm ``E||B||/N``
  (``dim/beta`` for L2-Laplace, about ``sigma sqrt(dim)`` for Gaussian noise);
  float32 resolves the gradient only to about ``2^-24 E||B||/N``. When that is
  above ``tol`` the fits end in :mod:`jaxdp.training.certified_solve`'s float64
  repair, where solving the problems one at a time is faster than ``vmap``
  (which runs every problem for as many float32 iterations as the slowest).
  Measured on 2 CPU cores, 8 draws on the full MNIST, lambda = 1e-3, tol 1e-7:
  eps = 0.01 (repaired) map 11-13 s vs vmap 24-34 s; eps = 1, delta = 1e-5
  (float32 converged) map 18.5 s vs vmap 4.6 s. Only the speed depends on it.
  """
  dim = int(np.prod(w_shape))
  b_norm = dim / cal.scale if cal.noise == "l2_laplace" else cal.scale * math.sqrt(dim)
  return 2.0 ** -24 * b_norm / n < tol


def _run(key, x, y, amp, *, loss, num_classes, l2_reg, h, max_iter, normalize, batch_mode,
         init_weights=None, nonprivate=False):
  """Perturbed fit(s), float64 certificate/repair, then AMP output noise (module docstring).

  ``init_weights`` (shared by every key) only moves where L-BFGS starts: the
  released point is certified within ``r = tol/Lambda`` of the exact perturbed
  minimiser whatever the start (module docstring, "Warm starts").
  """
  # L-BFGS aims at the certificate's tol but not below the float32 floor (~1e-7);
  # the float64 polish of certified_solve takes it the rest of the way.
  lbfgs_tol = max(amp.tol, 1e-7)
  num_classes = linear._check_common(loss, num_classes, l2_reg, 0.0, h, max_iter, lbfgs_tol)
  x = linear.check_features(x, "x", normalize=normalize)
  y = linear.check_labels(y, loss, num_classes, np.shape(x)[0])
  n = np.shape(x)[0]
  cal = amp.objective
  xj, yj = jnp.asarray(x, jnp.float32), jnp.asarray(y)
  kw = dict(noise=cal.noise, loss=loss, num_classes=int(num_classes), max_iter=int(max_iter))
  # float64 -> float32 towards more noise: sigma rounded up, the L2-Laplace beta down.
  scale = noise_scale_as(cal.scale, jnp.float32, round_up=cal.noise != "l2_laplace")
  w_shape = (np.shape(x)[1], int(num_classes)) if loss == "softmax" else (np.shape(x)[1],)
  args = (xj, yj, scale, cal.extra_l2, l2_reg, h, lbfgs_tol, _check_init(init_weights, w_shape))
  batched = linear.is_key_batch(key)
  if batched:
    split = jax.vmap(jax.random.split)(key)  # (M, 2): independent objective / output keys
    obj_keys, out_keys = split[:, 0], split[:, 1]
    mode = linear.resolve_batch_mode(
        batch_mode, shared_data_bytes=(xj.size * xj.dtype.itemsize
                                       if _float32_reaches(cal, w_shape, n, lbfgs_tol) else None))
    # On a CPU the lax.map runs as one chunk per core, side by side (jaxdp.training.batching).
    model, b = batching.map_in_chunks(
        lambda k: _perturbed_fit_many(k, *args, mode=mode, **kw), obj_keys,
        batching.num_chunks(len(obj_keys), mode))
  else:
    obj_keys, out_keys = jax.random.split(key)
    model, b = _perturbed_fit(obj_keys, *args, **kw)
  cert = certified_solve.certify_minimizers(
      model.weights, x, y, loss=loss, h=h, l2_total=amp.strong_convexity, tol=amp.tol,
      linear_term=np.asarray(b, np.float64) / n, batched=batched)
  z = np.asarray(_output_noise(out_keys, tuple(np.shape(cert.weights))[int(batched):], amp),
                 np.float64)
  w = jnp.asarray((cert.weights + z).astype(np.float32))
  return linear.PrivateLinearModel(w, amp.event, amp,
                                   linear.nonprivate_diagnostics(nonprivate, model.info, cert))


def _non_private(key, x, y, *, loss, num_classes, l2_reg, h, max_iter, tol, normalize, cal,
                 nonprivate=False):
  model = linear.fit_linear(x, y, num_classes=num_classes, l2_reg=l2_reg, loss=loss, h=h,
                            max_iter=max_iter, tol=tol, normalize=normalize)
  w, info = model.weights, model.info
  if linear.is_key_batch(key):
    m = jnp.shape(key)[0]
    w = jnp.broadcast_to(w, (m,) + w.shape)
    info = jax.tree.map(lambda a: jnp.broadcast_to(a, (m,) + jnp.shape(a)), info)
  return linear.PrivateLinearModel(w, cal.event, cal,
                                   linear.nonprivate_diagnostics(nonprivate, info))


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
    tol: float | None = None,
    amp_fraction: float = 0.01,
    normalize: bool = False,
    batch_mode: str = "auto",
    init_weights: Any = None,
    return_nonprivate_diagnostics: bool = False,
) -> linear.PrivateLinearModel:
  """Multiclass loss perturbation (paper 000 Alg. 4 / Alg. 5) with Approximate Minima Perturbation.

  Minimises ``(1/N) sum l + (lambda/2)||theta||^2 + (1/N) tr(B^T theta) + (rho/(2N))||theta||^2``
  with ``B`` and ``rho`` from :func:`loss_perturbation_calibration` at
  ``(eps1, delta1) = (1 - f)(eps, delta)``, certifies the minimiser to within
  ``r = tol/Lambda`` (never refusing), and releases ``theta_hat + Z`` with output noise
  of sensitivity ``2r`` at ``(eps2, delta2) = f (eps, delta)``, ``f = amp_fraction``
  (module docstring; :func:`loss_perturbation_amp_calibration`). ``tol=None``
  picks the tol that makes ``Z`` about 1% of the objective noise's effect. The
  event is ``ComposedDpEvent([objective, output])``, totalling ``(eps, delta)``.
  A batch of keys trains one model per key in a single compiled call
  (``batch_mode``, see :func:`jaxdp.training.linear.resolve_batch_mode`).
  ``epsilon = inf`` returns exactly the non-private model (fitted to ``tol`` or 1e-6).
  Neighbouring relation: replace-one (default) or ``"add_remove"`` (only with
  ``l2_reg = 0``; module docstring). ``init_weights`` (``(D, C)``, shared by all
  keys; e.g. the non-private minimiser at the same ``l2_reg``) warm-starts
  L-BFGS; the guarantee is unchanged because the release is certified within
  ``tol/Lambda`` of the exact perturbed minimiser whatever the start (module
  docstring, "Warm starts"). ``return_nonprivate_diagnostics=True`` adds
  ``nonprivate_info`` (solver diagnostics and the certificate of the perturbed
  minimiser before the output noise ``Z``: NOT private,
  :class:`~jaxdp.training.linear.NonPrivateDiagnostics`); by default the result
  holds only the private weights, the event and the calibration.

  Raises:
    ValueError: bad privacy parameters, rows outside the unit ball (see
      :func:`jaxdp.data.normalize_rows` or ``normalize=True``), bad labels, bad tol.
    CertificationError: only through float64 round-off (see :mod:`jaxdp.training.certified_solve`).
  """
  _validation.check_key(key, allow_batch=True)
  n = int(np.shape(x)[0])
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  if math.isinf(eps):
    cal = loss_perturbation_calibration(epsilon=eps, delta=delta, num_examples=n,
                                        num_classes=num_classes, rho=rho,
                                        neighbouring=neighbouring, l2_reg=l2_reg)
    return _non_private(key, x, y, loss="softmax", num_classes=num_classes, l2_reg=l2_reg, h=0.5,
                        max_iter=max_iter, tol=1e-6 if tol is None else tol,
                        normalize=normalize, cal=cal, nonprivate=return_nonprivate_diagnostics)
  amp = loss_perturbation_amp_calibration(
      epsilon=eps, delta=delta, num_examples=n, num_classes=num_classes,
      dim=int(np.shape(x)[1]), rho=rho, neighbouring=neighbouring, l2_reg=l2_reg,
      amp_fraction=amp_fraction, tol=tol)
  return _run(key, x, y, amp, loss="softmax", num_classes=num_classes, l2_reg=l2_reg, h=0.5,
              max_iter=max_iter, normalize=normalize, batch_mode=batch_mode,
              init_weights=init_weights, nonprivate=return_nonprivate_diagnostics)


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
    tol: float | None = None,
    amp_fraction: float = 0.01,
    normalize: bool = False,
    batch_mode: str = "auto",
    init_weights: Any = None,
    return_nonprivate_diagnostics: bool = False,
) -> linear.PrivateLinearModel:
  """Binary objective perturbation (paper 003 Alg. 1; Chaudhuri et al. 2011) with AMP, eps-DP.

  Minimises ``(1/N) sum f(s_n theta^T x_n) + ((lambda + Delta)/2)||theta||^2 + (1/N) beta^T theta``,
  ``p(beta) ∝ exp(-gamma ||beta||)``, with ``gamma`` and ``Delta`` from
  :func:`objective_perturbation_calibration` at ``eps1 = (1 - f) eps``, then adds
  L2-Laplace output noise of sensitivity ``2 tol/Lambda`` at ``eps2 = f eps``
  (Approximate Minima Perturbation, module docstring). ``loss`` is ``"logistic"``
  or ``"huber"`` (width ``h``). Labels in ``{0, 1}`` or ``{-1, 1}``.
  ``init_weights`` (``(D,)``) warm-starts L-BFGS without changing the guarantee
  (module docstring, "Warm starts"). ``return_nonprivate_diagnostics`` as in
  :func:`loss_perturbation` (NOT private; off by default).
  """
  _validation.check_key(key, allow_batch=True)
  n = int(np.shape(x)[0])
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  if math.isinf(eps):
    cal = objective_perturbation_calibration(epsilon=eps, num_examples=n, l2_reg=l2_reg,
                                             loss=loss, h=h, allow_extra_l2=allow_extra_l2)
    return _non_private(key, x, y, loss=loss, num_classes=None, l2_reg=l2_reg, h=h,
                        max_iter=max_iter, tol=1e-6 if tol is None else tol,
                        normalize=normalize, cal=cal, nonprivate=return_nonprivate_diagnostics)
  amp = objective_perturbation_amp_calibration(
      epsilon=eps, num_examples=n, dim=int(np.shape(x)[1]), l2_reg=l2_reg, loss=loss, h=h,
      allow_extra_l2=allow_extra_l2, amp_fraction=amp_fraction, tol=tol)
  return _run(key, x, y, amp, loss=loss, num_classes=None, l2_reg=l2_reg, h=h,
              max_iter=max_iter, normalize=normalize, batch_mode=batch_mode,
              init_weights=init_weights, nonprivate=return_nonprivate_diagnostics)
