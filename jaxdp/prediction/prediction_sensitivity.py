"""Prediction sensitivity: noise on the logits of a non-private linear model.

Reference: ``../shared/papers/000_tradeoffs_of_private_prediction.md``
Section 3.2, Appendix C.1 (Algorithms 6 and 7, Theorems 5 and 6), Appendix A
(Lemma 1).

Sensitivity (paper 000 Lemma 1 and Eqs. 42-45). For the L2-regularised ERM
minimiser ``theta(D) = argmin (1/N) sum_n l(theta^T x_n, y_n) + lambda R(theta)``
with a K-Lipschitz loss, a 1-strongly convex ``R`` and inputs in the unit
ball, ``||theta(D) - theta(D')||_F <= 2K/(N lambda)`` under replace-one
neighbours, so for any query ``||x|| <= 1`` the logits ``theta^T x`` move by at
most ``Delta = 2K/(N lambda)`` in L2 (Cauchy-Schwarz, Eq. 42). The multi-class
logistic loss has ``K = sqrt(2)`` (paper 000 Section 3.1, Appendix D).

Pure DP (Algorithm 6, Theorem 5). Add ``b ~ p(b) ∝ exp(-beta ||b||_2)`` to the
logits with ``beta = N lambda eps / (2 K B)``: each query is ``(eps/B)``-DP and
B queries are ``eps``-DP by basic composition.

Approximate DP (Algorithm 7, Theorem 6). Add ``N(0, sigma^2 I)`` to the logits.
Three calibrations of ``sigma`` for B queries, all through the shared
accounting module (float64):

* ``"basic"``: ``sigma'`` = analytic Gaussian (Balle & Wang 2018, paper 000
  Algorithm 2) at ``(eps/B, delta/B)`` (basic composition);
* ``"advanced"``: ``sigma''`` from advanced composition with a search over the
  slack ``delta'`` (paper 000 Algorithm 7, Eqs. 48-52);
* ``"best"`` (the paper's choice): ``min(sigma', sigma'')``;
* ``"exact_gaussian_composition"`` (tighter, not in the paper): B Gaussian
  queries of L2 sensitivity ``Delta`` with the same std ``sigma`` compose,
  even adaptively, to exactly one Gaussian mechanism of sensitivity
  ``Delta sqrt(B)`` (Dong, Roth & Su 2019, Gaussian DP, Corollary 3.3:
  ``mu``-GDP composes to ``sqrt(sum mu_i^2)``-GDP; and ``mu``-GDP is exactly the
  analytic Gaussian ``(eps, delta(eps))`` curve, Balle & Wang 2018 Theorem 8 /
  Dong et al. Corollary 2.13). So ``sigma = analytic_gaussian_sigma(eps,
  delta, Delta sqrt(B))``.

Sharp edge: Lemma 1 assumes the *exact* minimiser; a solver stopped early can
have a larger sensitivity. Use weights certified to ``||theta - theta*|| <= tol/lambda``
(:mod:`jaxdp.training.certified_solve`, as
:meth:`~jaxdp.prediction.PredictionSensitivityPredictor.from_linear_model` does)
and calibrate to the FIXED ``tol``; never to the achieved gradient norm (data-dependent),
and never refuse unconverged fits (the refusal leaks).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxdp import _validation
from jaxdp.accounting import analytic_gaussian as _analytic
from jaxdp.accounting import composition as _composition
from jaxdp.accounting import events as _events
from jaxdp.mechanisms import _common
from jaxdp.mechanisms import gaussian as _gaussian
from jaxdp.mechanisms import l2_laplace as _l2_laplace
from jaxdp.training import output_perturbation as _output_perturbation

#: Lipschitz constant of the multi-class logistic loss w.r.t. the logits
#: (paper 000 Section 3.1 and Appendix D).
SOFTMAX_LIPSCHITZ = math.sqrt(2.0)

GAUSSIAN_METHODS = ("basic", "advanced", "best", "exact_gaussian_composition")


def logit_sensitivity(
    num_examples: int,
    l2_reg: float,
    lipschitz: float = SOFTMAX_LIPSCHITZ,
    solver_tol: float = 0.0,
) -> float:
  """L2 sensitivity of the logits ``theta(D)^T x``: ``Delta = 2K/(N lambda) + 2 tol/lambda``.

  Paper 000 Appendix A Lemma 1 (``||theta_1 - theta_2||_F <= 2K/(N lambda)``
  for the exact minimisers) and Appendix C.1 Eqs. 42 and 45
  (``||(theta_1 - theta_2)^T x||_2 <= ||theta_1 - theta_2||_F`` for
  ``||x||_2 <= 1``). A solver that stops at ``||grad J(theta)|| <= tol``
  returns a point within ``tol/lambda`` of the exact minimiser (J is
  lambda-strongly convex), so two released models differ by at most
  ``2K/(N lambda) + 2 tol/lambda``; pass the certified, data-independent
  tolerance as ``solver_tol`` (as
  :meth:`~jaxdp.prediction.PredictionSensitivityPredictor.from_linear_model`
  does; not the achieved gradient norm, which depends on the data). ``solver_tol = 0`` is the paper's exact-minimiser
  bound.

  Args:
    num_examples: training set size N (>= 1).
    l2_reg: regularisation lambda > 0 of ``lambda R(theta)``, ``R = ||.||^2/2``.
    lipschitz: Lipschitz constant K > 0 of the loss (``sqrt(2)`` for softmax).
    solver_tol: gradient-norm tolerance (>= 0) the weights were fitted to.

  >>> round(logit_sensitivity(1000, 0.01), 6)  # 2 sqrt(2) / 10
  0.282843
  """
  return _output_perturbation.minimizer_sensitivity(num_examples, l2_reg, lipschitz, solver_tol)


def l2_laplace_prediction_beta(
    epsilon: float,
    budget: int,
    num_examples: int,
    l2_reg: float,
    lipschitz: float = SOFTMAX_LIPSCHITZ,
    solver_tol: float = 0.0,
) -> float:
  """``beta = N lambda eps / (2 K B)`` (paper 000 Algorithm 6, Theorem 5), i.e. ``eps/(B Delta)``.

  Each query is then ``(beta Delta) = eps/B``-DP and B queries ``eps``-DP.
  """
  eps = _validation.check_epsilon(epsilon)
  b = _validation.check_positive_int(budget, "budget")
  return eps / (b * logit_sensitivity(num_examples, l2_reg, lipschitz, solver_tol))


def gaussian_prediction_sigma(
    epsilon: float,
    delta: float,
    budget: int,
    num_examples: int,
    l2_reg: float,
    lipschitz: float = SOFTMAX_LIPSCHITZ,
    method: str = "best",
    solver_tol: float = 0.0,
) -> float:
  """Std of the Gaussian logit noise for ``(eps, delta)``-DP over B queries.

  Paper 000 Algorithm 7 / Theorem 6 (``method`` in ``"basic"`` (sigma'),
  ``"advanced"`` (sigma''), ``"best"`` = ``min(sigma', sigma'')``), computed by
  :func:`jaxdp.accounting.composition.per_query_gaussian_sigma`; or
  ``"exact_gaussian_composition"``: ``analytic_gaussian_sigma(eps, delta,
  Delta sqrt(B))`` (Dong, Roth & Su 2019 GDP composition; Balle & Wang 2018
  Theorem 8), which is the smallest sigma for which B such queries are
  ``(eps, delta)``-DP.

  Args:
    epsilon: total epsilon in (0, inf).
    delta: total delta in (0, 1).
    budget: number of queries B >= 1.
    num_examples, l2_reg, lipschitz, solver_tol: see :func:`logit_sensitivity`.
    method: one of :data:`GAUSSIAN_METHODS`.
  """
  eps = _validation.check_epsilon(epsilon)
  dlt = _validation.check_delta(delta, allow_zero=False)
  b = _validation.check_positive_int(budget, "budget")
  sens = logit_sensitivity(num_examples, l2_reg, lipschitz, solver_tol)
  if method == "exact_gaussian_composition":
    return float(_analytic.analytic_gaussian_sigma(eps, dlt, sens * math.sqrt(b)))
  if method not in ("basic", "advanced", "best"):
    raise ValueError(f"method must be one of {GAUSSIAN_METHODS}, got {method!r}.")
  return float(_composition.per_query_gaussian_sigma(eps, dlt, b, sens, method=method).sigma)


@dataclasses.dataclass(frozen=True)
class PredictionSensitivityCalibration:
  """Noise calibration of the prediction-sensitivity method.

  Attributes:
    noise: ``"l2_laplace"`` (density ∝ exp(-scale ||b||), scale = beta) or
      ``"gaussian"`` (std = scale).
    scale: beta (L2-Laplace) or sigma (Gaussian).
    sensitivity: the L2 sensitivity ``Delta = 2K/(N lambda)`` of the logits.
    epsilon, delta, budget: the guarantee ``(eps, delta)`` over ``budget``
      queries that the scale was derived from.
    method: how a Gaussian sigma was chosen (``""`` for L2-Laplace).
  """

  noise: str
  scale: float
  sensitivity: float
  epsilon: float
  delta: float
  budget: int
  method: str = ""

  def query_event(self) -> _events.DpEvent:
    """DpEvent of ONE answered query (compose it ``count`` times).

    L2-Laplace: ``PureDpEvent(beta Delta)`` (= eps/B, paper 000 Eq. 44).
    Gaussian: ``GaussianDpEvent(noise_multiplier = sigma/Delta)``.
    Tagged ``neighbouring="replace_one"`` (Delta is the replace-one logit
    sensitivity, paper 000 Lemma 1).
    """
    if self.noise == "l2_laplace":
      return _events.PureDpEvent(self.scale * self.sensitivity, neighbouring="replace_one")
    return _events.GaussianDpEvent(noise_multiplier=self.scale / self.sensitivity,
                                   neighbouring="replace_one")


def calibrate_prediction_sensitivity(
    epsilon: float,
    delta: float,
    budget: int,
    num_examples: int,
    l2_reg: float,
    lipschitz: float = SOFTMAX_LIPSCHITZ,
    method: str = "best",
    solver_tol: float = 0.0,
) -> PredictionSensitivityCalibration:
  """Picks the noise: L2-Laplace (Alg. 6) if ``delta == 0``, else Gaussian (Alg. 7).

  ``solver_tol``: see :func:`logit_sensitivity` (the fitted weights' gradient-norm tolerance).
  """
  dlt = _validation.check_delta(delta)
  sens = logit_sensitivity(num_examples, l2_reg, lipschitz, solver_tol)
  b = _validation.check_positive_int(budget, "budget")
  eps = _validation.check_epsilon(epsilon)
  if dlt == 0.0:
    beta = l2_laplace_prediction_beta(eps, b, num_examples, l2_reg, lipschitz, solver_tol)
    return PredictionSensitivityCalibration("l2_laplace", beta, sens, eps, 0.0, b)
  sigma = gaussian_prediction_sigma(eps, dlt, b, num_examples, l2_reg, lipschitz, method, solver_tol)
  return PredictionSensitivityCalibration("gaussian", sigma, sens, eps, dlt, b, method)


def noisy_logits(
    key: jax.Array,
    logits: Any,
    noise: str,
    scale: Any,
) -> jax.Array:
  """Adds independent noise to each row (query) of ``logits`` of shape (M, C).

  Every query gets its own key (``jax.random.split(key, M)``) and its own noise
  vector in ``R^C`` (L2-Laplace with one radius per row, or isotropic Gaussian);
  noise shared between queries would break the per-query analysis (the
  difference of two answers would be noiseless).

  Args:
    key: a ``jax.random`` key, used once.
    logits: array (M, C) of non-private logits ``theta^T x``.
    noise: ``"l2_laplace"`` or ``"gaussian"``.
    scale: beta (L2-Laplace) or sigma (Gaussian); may be traced.
  """
  logits = jnp.asarray(logits)
  if logits.ndim != 2:
    raise ValueError(f"logits must have shape (num_queries, num_classes), got {logits.shape}.")
  _validation.check_key(key)
  return noisy_logits_from_keys(jax.random.split(key, logits.shape[0]), logits, noise, scale)


def noisy_logits_from_keys(
    keys: jax.Array,
    logits: Any,
    noise: str,
    scale: Any,
) -> jax.Array:
  """As :func:`noisy_logits` with one caller-supplied key per row (``keys`` of length M)."""
  logits = jnp.asarray(logits)
  if logits.ndim != 2:
    raise ValueError(f"logits must have shape (num_queries, num_classes), got {logits.shape}.")
  num_classes = logits.shape[1]
  dtype = logits.dtype if jnp.issubdtype(logits.dtype, jnp.floating) else jnp.float32
  # These answers are released as private: refuse a concrete scale that means "no noise"
  # (sigma = 0 or beta = inf), which the raw samplers accept for non-private baselines.
  if noise in ("l2_laplace", "gaussian"):
    _common.check_scale(scale, "scale", allow_zero=False, allow_inf=False)
  if noise == "l2_laplace":
    sample = lambda k: _l2_laplace.l2_laplace_noise(k, (num_classes,), scale, dtype)
  elif noise == "gaussian":
    sample = lambda k: _gaussian.gaussian_noise(k, (num_classes,), scale, dtype)
  else:
    raise ValueError(f"noise must be 'l2_laplace' or 'gaussian', got {noise!r}.")
  return logits.astype(dtype) + jax.vmap(sample)(keys)


__all__ = [
    "GAUSSIAN_METHODS", "PredictionSensitivityCalibration", "SOFTMAX_LIPSCHITZ",
    "calibrate_prediction_sensitivity", "gaussian_prediction_sigma",
    "l2_laplace_prediction_beta", "noisy_logits", "noisy_logits_from_keys",
    "logit_sensitivity",
]
