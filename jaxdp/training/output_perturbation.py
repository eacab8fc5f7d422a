"""Output perturbation ("model sensitivity"): train non-privately, add noise to the weights.

Multiclass (paper 000 = ``../shared/papers/000_tradeoffs_of_private_prediction.md``,
App. B.1, Algorithms 1 and 3): for ``J(theta) = (1/N) sum l + lambda R(theta)``
with 1-strongly convex ``R`` (here ``R = 1/2 ||theta||_F^2``), a K-Lipschitz
loss and ``||x|| <= 1``, the minimiser has replace-one sensitivity
``Delta = 2K / (N lambda)`` in Frobenius norm (Lemma 1). Then

* ``(eps, 0)``-DP: ``theta + B``, ``p(B) ∝ exp(-beta ||B||_F)``, ``beta = N lambda eps / (2K)``
  (Algorithm 1, Theorem 1);
* ``(eps, delta)``-DP: ``B ~ N(0, sigma^2 I)`` with the analytic Gaussian
  ``sigma = 2K alpha / (N lambda sqrt(2 eps))`` (Algorithm 3, Theorem 2; Balle &
  Wang 2018 Thm 8/9), computed by :func:`jaxdp.accounting.analytic_gaussian_sigma`.

``K = sqrt(2)`` for the softmax loss (paper 000 Thm 9).

Binary (paper 003 = ``../shared/papers/003_dp_confidence_intervals_for_erm.md``,
Sec. 5.1, Algorithm 4, from Chaudhuri et al. 2011): paper 003 writes the
objective as ``(1/n) sum [f + c ||theta||^2]``, i.e. our ``lambda = 2c``; the
sensitivity ``1/(nc) = 2/(N lambda)`` is Lemma 1 with ``K = |f'| <= 1``. Then
``gamma = n c eps`` (eps-DP, L2-Laplace) or ``N(0, I / (2 rho (nc)^2))``
(rho-zCDP, Bun & Steinke Prop. 3: ``sigma = Delta / sqrt(2 rho)``).

Inexact minimisation. Lemma 1 bounds the distance between *exact* minimisers.
The released point ``theta_hat`` is certified by
:func:`jaxdp.training.certified_solve.certify_minimizers` to lie within
``r = tol / lambda`` of the exact minimiser on EVERY dataset meeting the
assumptions (float64 certificate ``||grad J(theta_hat)|| <= tol`` and, when the
float32 L-BFGS iterate does not pass it, a float64 polish / accelerated
gradient fallback with a data-independent iteration bound). By the triangle
inequality ``||theta_hat(D) - theta_hat(D')|| <= 2r + 2K/(N lambda)``, so we
calibrate to ``Delta = 2K/(N lambda) + 2 tol / lambda`` (the paper's formula
is the ``tol -> 0`` limit, ``solver_tol=0`` in the calibration). Nothing is
refused: a refusal that depends on whether the solver converged on ``D``
would itself leak. The noise is added to the float64 certified point and the
sum rounded to float32 (post-processing).
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
from jaxdp.accounting.analytic_gaussian import analytic_gaussian_sigma
from jaxdp.mechanisms.gaussian import gaussian_noise
from jaxdp.mechanisms import noise_scale_as
from jaxdp.mechanisms.l2_laplace import l2_laplace_noise
from jaxdp.training import certified_solve, linear, linear_losses


class OutputPerturbationCalibration(NamedTuple):
  """Host-side (float64) calibration of output perturbation.

  Attributes:
    noise: ``"l2_laplace"`` (scale = beta, density ∝ exp(-beta ||B||_F)),
      ``"gaussian"`` (scale = sigma, i.i.d. N(0, sigma^2)) or ``"none"``.
    scale: beta or sigma (0.0 for ``"none"``).
    sensitivity: L2 sensitivity of the released weights.
    event: the DpEvent of one release.
  """

  noise: str
  scale: float
  sensitivity: float
  event: Any


def minimizer_sensitivity(num_examples: int, l2_reg: float, lipschitz: float,
                          solver_tol: float = 0.0) -> float:
  """``2K/(N lambda) + 2 tol/lambda``: replace-one L2 sensitivity of the (tol-approximate) minimiser.

  Paper 000 App. A, Lemma 1 (``tol = 0``); the ``2 tol / lambda`` term covers
  the two inexact solves (lambda-strong convexity: ``||theta - theta*|| <=
  ||grad J(theta)|| / lambda``).
  """
  n = _validation.check_positive_int(num_examples, "num_examples")
  lam = _validation.check_positive(l2_reg, "l2_reg")
  k = _validation.check_positive(lipschitz, "lipschitz")
  tol = _validation.check_nonnegative(solver_tol, "solver_tol")
  return 2.0 * k / (n * lam) + 2.0 * tol / lam


def output_perturbation_calibration(
    *,
    num_examples: int,
    l2_reg: float,
    epsilon: float | None = None,
    delta: float = 0.0,
    rho: float | None = None,
    lipschitz: float = linear_losses.SOFTMAX_LIPSCHITZ,
    solver_tol: float = 0.0,
) -> OutputPerturbationCalibration:
  """Noise for output perturbation (paper 000 Alg. 1/3, paper 003 Alg. 4).

  Exactly one of ``epsilon`` (with ``delta``) or ``rho`` (zCDP) must be given.

  * ``epsilon = inf``: no noise, ``NonPrivateDpEvent``.
  * ``delta = 0``: ``beta = epsilon / Delta`` (= ``N lambda eps / (2K)`` at tol 0), ``PureDpEvent(eps)``.
  * ``delta > 0``: analytic Gaussian ``sigma`` on ``Delta``,
    ``GaussianDpEvent(noise_multiplier = sigma / Delta)`` (exactly (eps, delta)-DP).
  * ``rho``: ``sigma = Delta / sqrt(2 rho)``, ``ZCDpEvent(rho)``.

  Events are tagged ``neighbouring="replace_one"``: Delta is the replace-one
  sensitivity of the minimiser (paper 000 Lemma 1).
  """
  if (epsilon is None) == (rho is None):
    raise ValueError("give exactly one of epsilon (with delta) or rho (zCDP).")
  sens = minimizer_sensitivity(num_examples, l2_reg, lipschitz, solver_tol)
  if rho is not None:
    rho = _validation.check_positive(rho, "rho")
    return OutputPerturbationCalibration("gaussian", sens / math.sqrt(2.0 * rho), sens,
                                         events.ZCDpEvent(rho, neighbouring="replace_one"))
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  delta = _validation.check_delta(delta, "delta")
  if math.isinf(eps):
    return OutputPerturbationCalibration("none", 0.0, sens, events.NonPrivateDpEvent())
  if delta == 0.0:
    return OutputPerturbationCalibration("l2_laplace", eps / sens, sens,
                                         events.PureDpEvent(eps, neighbouring="replace_one"))
  sigma = float(analytic_gaussian_sigma(eps, delta, sens))
  return OutputPerturbationCalibration("gaussian", sigma, sens,
                                       events.GaussianDpEvent(noise_multiplier=sigma / sens,
                                                              neighbouring="replace_one"))


@functools.partial(jax.jit, static_argnames=("noise",))
def _add_noise(key: jax.Array, weights: jax.Array, scale: jax.Array, noise: str) -> jax.Array:
  if noise == "l2_laplace":
    return weights + l2_laplace_noise(key, weights.shape, scale, weights.dtype)
  if noise == "gaussian":
    return weights + gaussian_noise(key, weights.shape, scale, weights.dtype)
  return weights


def perturb_weights(key: jax.Array, weights: jax.Array,
                    calibration: OutputPerturbationCalibration) -> jax.Array:
  """Adds the calibrated noise to ``weights`` (one radius for the whole matrix).

  ``key`` may be a batch of keys: returns one noisy copy per key (leading axis).
  """
  _validation.check_key(key, allow_batch=True)
  weights = jnp.asarray(weights)
  if calibration.noise == "none":
    if linear.is_key_batch(key):
      return jnp.broadcast_to(weights, (jnp.shape(key)[0],) + weights.shape)
    return weights
  # float64 -> float32 towards more noise: sigma rounded up, the L2-Laplace beta down.
  scale = noise_scale_as(calibration.scale, weights.dtype,
                         round_up=calibration.noise != "l2_laplace")
  if linear.is_key_batch(key):
    return jax.vmap(lambda k: _add_noise(k, weights, scale, calibration.noise))(key)
  return _add_noise(key, weights, scale, calibration.noise)


def output_perturbation(
    key: jax.Array,
    x: Any,
    y: Any,
    *,
    l2_reg: float,
    loss: str = "softmax",
    num_classes: int | None = None,
    epsilon: float | None = None,
    delta: float = 0.0,
    rho: float | None = None,
    h: float = 0.5,
    max_iter: int = 500,
    tol: float = 1e-6,
    normalize: bool = False,
    return_nonprivate_diagnostics: bool = False,
) -> linear.PrivateLinearModel:
  """Output perturbation for any of the linear losses (paper 000 Alg. 1/3, paper 003 Alg. 4).

  Trains ``argmin (1/N) sum l + (lambda/2)||theta||^2`` once (float32 L-BFGS),
  certifies the result in float64 (repairing it if needed, so it is always within
  ``tol/lambda`` of the exact minimiser; see
  :mod:`jaxdp.training.certified_solve`), and adds noise calibrated by
  :func:`output_perturbation_calibration` with ``K = lipschitz_constant(loss)``
  and ``solver_tol = tol``. With a batch of keys, returns one independent
  release per key (``count = M`` events). ``epsilon = inf`` returns exactly the
  (certified) non-private model.

  Returns:
    :class:`~jaxdp.training.linear.PrivateLinearModel`: the private weights, the
    event and the calibration; ``nonprivate_info`` (the float32 solver's
    diagnostics and the certificate, whose ``weights`` are the non-private
    minimiser: NOT private) only with ``return_nonprivate_diagnostics=True``.

  Raises:
    ValueError: bad privacy parameters, ``l2_reg <= 0``, rows outside the unit
      ball (see :func:`jaxdp.data.normalize_rows` or ``normalize=True``), bad
      labels, ``tol`` at the float64 floor.
    CertificationError: only through float64 round-off (never for a valid ``tol``).
  """
  _validation.check_key(key, allow_batch=True)
  _validation.check_positive(l2_reg, "l2_reg")
  n = int(jnp.shape(x)[0])
  cal = output_perturbation_calibration(
      num_examples=n, l2_reg=l2_reg, epsilon=epsilon, delta=delta, rho=rho,
      lipschitz=linear_losses.lipschitz_constant(loss), solver_tol=tol)
  model, cert = certified_fit(x, y, l2_reg=l2_reg, loss=loss, num_classes=num_classes, h=h,
                              max_iter=max_iter, tol=tol, normalize=normalize)
  return linear.PrivateLinearModel(
      add_noise_float64(key, cert.weights, cal), cal.event, cal,
      linear.nonprivate_diagnostics(return_nonprivate_diagnostics, model.info, cert))


def certified_fit(
    x: Any,
    y: Any,
    *,
    l2_reg: float,
    loss: str = "softmax",
    num_classes: int | None = None,
    h: float = 0.5,
    max_iter: int = 500,
    tol: float = 1e-6,
    normalize: bool = False,
) -> tuple[linear.LinearModel, certified_solve.CertifiedSolution]:
  """The non-private minimiser output perturbation adds noise to, certified within ``tol/lambda``.

  ``argmin (1/N) sum l + (lambda/2)||theta||^2`` by float32 L-BFGS, then
  :func:`jaxdp.training.certified_solve.certify_minimizers` in float64: the
  returned ``cert.weights`` (float64) satisfy ``||theta - theta*|| <= tol/lambda``
  on every dataset (repaired by the float64 polish / accelerated gradient when
  L-BFGS stopped short, e.g. at ``max_iter``), so never refused. Noise calibrated
  by :func:`output_perturbation_calibration` with ``solver_tol = tol``
  (``Delta = 2K/(N lambda) + 2 tol/lambda``) and added with
  :func:`add_noise_float64` makes any number of releases around ONE such fit
  exactly :func:`output_perturbation`'s mechanism (experiments share the fit
  across epsilons and noise draws this way).

  Returns:
    ``(model, cert)``: the L-BFGS :class:`~jaxdp.training.linear.LinearModel`
    (diagnostics only) and the :class:`~jaxdp.training.certified_solve.CertifiedSolution`.

  Raises:
    ValueError: ``l2_reg <= 0``, bad data (rows outside the unit ball, labels), a
      ``tol`` at the float64 floor (:func:`~jaxdp.training.certified_solve.check_tol`).
  """
  lam = _validation.check_positive(l2_reg, "l2_reg")
  n = int(np.shape(x)[0])
  model = linear.fit_linear(x, y, num_classes=num_classes, l2_reg=lam, loss=loss, h=h,
                            max_iter=max_iter, tol=tol, normalize=normalize)
  x_c = linear.check_features(x, "x", normalize=normalize)
  y_c = linear.check_labels(y, loss, num_classes, n)
  certified_solve.check_tol(tol, num_examples=n, dim=int(np.size(model.weights)), loss=loss, h=h)
  cert = certified_solve.certify_minimizers(model.weights, x_c, y_c, loss=loss, h=h,
                                            l2_total=lam, tol=float(tol))
  return model, cert


def add_noise_float64(key: jax.Array, weights64: np.ndarray,
                      calibration: OutputPerturbationCalibration) -> jax.Array:
  """``float32(weights64 + noise)``: the noise is drawn as :func:`perturb_weights` draws it.

  The sum is formed in float64 (the certified point is float64) and rounded to
  float32 afterwards, which is post-processing of the noisy release.
  """
  w64 = np.asarray(weights64, np.float64)
  noise = np.asarray(perturb_weights(key, jnp.zeros(w64.shape, jnp.float32), calibration),
                     np.float64)
  return jnp.asarray((w64 + noise).astype(np.float32))


def model_sensitivity(
    key: jax.Array,
    x: Any,
    y: Any,
    *,
    num_classes: int,
    l2_reg: float,
    epsilon: float,
    delta: float = 0.0,
    max_iter: int = 500,
    tol: float = 1e-6,
    normalize: bool = False,
    return_nonprivate_diagnostics: bool = False,
) -> linear.PrivateLinearModel:
  """Multiclass model sensitivity (paper 000 App. B.1, Algorithm 1 for delta = 0, 3 for delta > 0).

  Softmax loss, ``K = sqrt(2)``; ``beta = N lambda eps / (2K)`` (L2-Laplace on
  the whole ``(D, C)`` weight matrix) or the analytic Gaussian on ``2K/(N lambda)``
  (plus the ``2 tol/lambda`` solver slack, see the module docstring).
  ``return_nonprivate_diagnostics`` as in :func:`output_perturbation` (NOT private).
  """
  return output_perturbation(key, x, y, l2_reg=l2_reg, loss="softmax", num_classes=num_classes,
                             epsilon=epsilon, delta=delta, max_iter=max_iter, tol=tol,
                             normalize=normalize,
                             return_nonprivate_diagnostics=return_nonprivate_diagnostics)
