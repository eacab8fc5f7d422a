r"""Differentially private confidence intervals for ERM parameters (paper 003, Algorithms 3 and 5).

Paper 003 = ``../shared/papers/003_dp_confidence_intervals_for_erm.md`` (Wang, Kifer & Lee).
Binary logistic regression and Huberized SVM (``loss="logistic" | "huber"``), the objective
(paper 003 Eq. 3.1) ``(1/n) sum f(y theta^T x) + (Lambda/2)||theta||^2`` with ``Lambda =
l2_reg = 2c`` (the paper's ``c = 0.001`` is ``l2_reg = 0.002``), rows with ``||x|| <= 1``
(including any intercept feature) and labels in ``{-1, +1}`` or ``{0, 1}``.

Pipeline (one interval; :func:`confidence_intervals`, :func:`confidence_intervals_batched`):

1. ``theta~`` with privacy parameter ``phi_1``:

   * ``perturbation="objective"``: paper 003 **Algorithm 1** (improved constant
     ``eps' = eps - log(1 + t/(2nc))``, noise ``gamma = eps'/2``, Theorem 1), calibrated by
     :func:`jaxdp.training.objective_perturbation.objective_perturbation_amp_calibration`
     (which implements exactly paper 003's Alg. 1 for the binary losses; paper 000's
     multiclass loss perturbation differs in its constants and is not used here), with its
     Approximate Minima Perturbation: the certified minimiser is released with a small
     extra L2-Laplace noise of sensitivity ``2 tol/Lambda`` (``amp_fraction`` of ``phi_1``).
     zCDP: Algorithm 1 run at ``eps_1 = sqrt(2 rho_1)`` (Prop. 1: ``eps^2/2``-zCDP).
   * ``perturbation="output"``: paper 003 **Algorithm 4** (Chaudhuri et al. 2011), calibrated
     by :func:`jaxdp.training.output_perturbation.output_perturbation_calibration`
     (sensitivity ``1/(nc) = 2/(n Lambda)`` plus ``2 tol/Lambda`` for the certified solve):
     L2-Laplace (pure) or Gaussian (zCDP, ``sigma = Delta / sqrt(2 rho_1)``).

   The minimiser is found by a jitted float64 damped Newton solve
   (:mod:`jaxdp.inference.newton`) and certified in float64 (``||grad J|| + rounding
   bound <= tol``, :mod:`jaxdp.training.certified_solve`); a fit that misses the
   certificate is repaired on the host by :func:`certified_solve.certify_minimizers`
   (never refused: a refusal would depend on the data).
2. ``H~ = PrivSPDMat(H(theta~), Lemma 3/5, phi_2)`` and ``Sigma~ = PrivSPDMat(Sigma(theta~),
   Lemma 2/4, phi_3)`` (**Algorithm 2**, :mod:`jaxdp.inference.spd_release`), both evaluated at
   the RELEASED ``theta~``.
3. Post-processing only (no data access):

   * objective perturbation (**Algorithm 3**, Eq. 4.1): ``theta0 - theta~ ~ H~^{-1}(G + beta/sqrt n)
     / sqrt n - Z`` with ``G ~ N(0, Sigma~)``, ``beta`` the objective noise (``gamma = eps'/2``)
     and ``Z`` the AMP output noise; ``m`` Monte Carlo draws, equal-tailed quantiles;
   * output perturbation (**Algorithm 5**, Eq. 5.2): ``theta0 - theta~ ~ H~^{-1} G / sqrt n - beta``;
     Monte Carlo for pure DP, and for zCDP the closed form ``theta~ +- z_{alpha/2} sqrt(U_jj)``,
     ``U = sigma^2 I + H~^{-1} Sigma~ H~^{-1} / n`` (Alg. 5 lines 18-22).

   The paper takes equal-tailed quantiles of ``m`` Monte Carlo draws of these laws
   (``quantiles="monte_carlo"``). Both laws are Gaussian scale mixtures (an L2-Laplace
   vector is ``sqrt(V) N(0, I)/beta`` with ``V ~ chi^2_{d+1}``), so by default
   (``quantiles="exact"``) the same quantiles are computed by Gauss-Laguerre quadrature and
   Newton (:mod:`jaxdp.inference.mixture_quantiles`): no Monte Carlo error (about 1% of the
   half-width at the paper's ``m = 10,000``) and much cheaper.

Privacy (replace-one neighbours, unit = example; the relation of Theorem 1, Theorem 3 and
Lemmas 2-5): **Theorem 2** (objective) ``phi_1 + phi_2 + phi_3``-DP or ``phi_1^2/2 + phi_2 +
phi_3``-zCDP; **Theorem 4** (output) ``phi_1 + phi_2 + phi_3`` in either. The event reported
is ``ComposedDpEvent([theta event, PrivSPDMat event, PrivSPDMat event])`` of
``PureDpEvent``/``ZCDpEvent`` leaves (for objective perturbation under zCDP the theta part is
the pure ``eps_1`` it really is, which the accountant converts to ``eps_1^2/2 = rho_1``).

Bootstrap replicates (``counts`` or ``indices``) and group privacy. A replicate is the
multiset of ``n`` records in which row ``i`` of ``x`` appears ``k_i`` times: given as row
multiplicities (``counts``, ``k_i = counts[i]``, ``n = sum(counts)``) or as the ``n`` row
indices drawn (``indices``, ``k_i`` = the occurrences of ``i``). The two are the same
problem (the loss is a sum over records); with indices (and with counts of total ``n <=
N/2``, converted to indices) the jitted program gathers the ``n`` rows of each replicate, so
every Newton, Hessian and covariance pass costs ``O(n d)`` instead of ``O(N d)``. The
privacy unit stays one row of ``x`` (one person): replacing row ``i`` replaces ``k_i`` of
the ``n`` records at once, so the sensitivities above (computed for ONE replaced record; a
row used ``k_i`` times moves each statistic by up to ``k_i`` times as much, e.g. the Hessian
by ``k_i/(2n)``) do not cover it. The guarantee is the group-privacy one at ``k = max_i
k_i`` (:func:`_group_privacy_event`): every ``phi``-DP leaf becomes ``k phi``-DP (Dwork &
Roth 2014, Thm 2.2: datasets at replace-distance ``k`` are joined by a chain of ``k``
neighbours of the same size ``n``, and the calibration depends on ``n`` only) and every
``rho``-zCDP leaf ``k^2 rho``-zCDP (Bun & Steinke 2016, Prop. 27), which is what is spent
and reported (``Calibration.event``, ``Calibration.group_size``). ``M`` replicates
(:func:`confidence_intervals_batched`) are ``M`` releases, each charged at the largest
multiplicity over all replicates (a person in ``c_j`` copies of replicate ``j`` loses
``sum_j c_j phi <= M k phi``, resp. ``sum_j c_j^2 rho <= M k^2 rho``, by composition).

Privacy parameter: exactly one of ``epsilon=`` (pure ``epsilon``-DP, Theorems 2 and 4) or
``rho=`` (``rho``-zCDP); the notion follows from which is given and is recorded as
``Calibration.privacy`` (``"pure"`` or ``"zcdp"``). Split of the total ``phi`` (``epsilon``
or ``rho``) into ``(phi_1, phi_2, phi_3)`` (``fractions``): default paper 003 **Table 2**
(:data:`TABLE2_FRACTIONS`). ``epsilon=inf`` (or ``rho=inf``) switches every privacy noise
off (the intervals are then the classical sandwich intervals
``theta^ +- z sqrt((H^{-1} Sigma H^{-1})_jj / n)``, up to Monte Carlo error).

Eigenvalue floors (``floor``). Algorithm 2 floors both released matrices at ``2c = Lambda``
(``floor="paper"``, the default). ``floor="psd"`` keeps ``Lambda`` for the Hessian (which
really is ``>= Lambda I`` and is inverted) but floors the gradient covariance at 0 (its true
eigenvalues can be far smaller than ``Lambda``: about 3e-4 on Adult): the released
``Sigma~`` is still PSD and the intervals are shorter, but they under-cover. Both floors are
functions of the privately released noisy matrix only (post-processing): Lemma 1's ``phi_3``
guarantee (and Theorems 2 and 4) hold unchanged. Measured on Adult, logistic regression
and Huberized SVM, ``k = 1,000`` replicates per cell
(``docs/data/confidence_intervals_adult_grid.csv``, ``experiments/confidence_intervals.py``):
with ``"paper"`` 5 of the 72 logistic cells are below 0.95, 4 of them where the library warns
(objective perturbation at ``n eps^2 <= 2,000``: 0.896-0.938) and one within its standard
error (0.948 +- 0.005); with ``"psd"`` 17 (to 0.889); the Huber cells under-cover with either
floor (24 and 36 of 72).

Coverage warnings. The intervals rest on the normal (sandwich) approximation of the
minimiser and, for objective perturbation, on the noise ``b/n`` being small. Where either
is known to fail, :func:`confidence_intervals` and :func:`confidence_intervals_batched`
emit one :class:`CoverageWarning` before any work (:func:`coverage_warning` states the
rule from public quantities): the Huberized hinge (``loss="huber"``: down to 0.868 on Adult
with either floor), and objective perturbation with ``n eps^2 < OBJECTIVE_MIN_N_EPS_SQUARED``
(``eps`` the total budget in pure-DP terms; the privacy part of the minimiser's error, of
order ``1/(n eps)``, is then not small against its sampling part, of order ``1/sqrt(n)``;
paper 003 Sec. 7.4: objective perturbation "had more difficulty with small n and eps").
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.inference import mixture_quantiles, newton, sensitivities, spd_release
from jaxdp.mechanisms import _sampling
from jaxdp.mechanisms.gaussian import gaussian_noise
from jaxdp.mechanisms.l2_laplace import l2_laplace_noise
from jaxdp.training import batching, certified_solve, glm_solver, linear, linear_losses
from jaxdp.training.objective_perturbation import objective_perturbation_amp_calibration
from jaxdp.training.output_perturbation import output_perturbation_calibration

PERTURBATIONS = ("objective", "output")
QUANTILES = ("exact", "monte_carlo")
PRIVACY = spd_release.PRIVACY
FLOORS = ("paper", "psd")
OBJECTIVE_MIN_N_EPS_SQUARED = 10_000.0
"""Objective perturbation under-covers below this ``n eps^2`` (:func:`coverage_warning`)."""
# The options of confidence_intervals that confidence_intervals_batched passes on as **kwargs.
_SINGLE_CALL_OPTIONS = frozenset(
    ("loss", "perturbation", "l2_reg", "h", "alpha", "quantiles", "num_samples", "floor",
     "fractions", "amp_fraction", "tol"))

TABLE2_FRACTIONS: dict[tuple[str, str], tuple[float, float, float]] = {
    ("objective", "pure"): (0.65, 0.175, 0.175),
    ("output", "pure"): (0.8, 0.1, 0.1),
    ("objective", "zcdp"): (0.9, 0.05, 0.05),
    ("output", "zcdp"): (0.9, 0.05, 0.05),
}
"""Paper 003 Table 2: ``(phi_1, phi_2, phi_3) / phi`` per (perturbation, privacy)."""


class BudgetSplit(NamedTuple):
  """``phi_1`` (parameters), ``phi_2`` (Hessian), ``phi_3`` (covariance); epsilons or rhos."""

  theta: float
  hessian: float
  covariance: float


def _privacy_parameter(epsilon: float | None = None, rho: float | None = None
                      ) -> tuple[float, str]:
  """``(phi, privacy)`` from exactly one of ``epsilon`` (pure DP) or ``rho`` (zCDP).

  ``phi`` is the total of paper 003 Theorems 2 and 4 (``epsilon`` or ``rho``; ``inf``: no
  noise) and ``privacy`` is ``"pure"`` or ``"zcdp"``, whichever was given.

  Raises:
    ValueError: naming ``epsilon`` and ``rho`` when both or neither are given, or the one
      given when it is not ``> 0`` (a non-number raises ArgumentTypeError naming it).
  """
  if (epsilon is None) == (rho is None):
    raise ValueError("give exactly one of epsilon= (pure DP) or rho= (zCDP), got "
                     + ("both." if epsilon is not None else "neither."))
  if epsilon is not None:
    return _validation.check_positive(epsilon, "epsilon", allow_inf=True), "pure"
  return _validation.check_positive(rho, "rho", allow_inf=True), "zcdp"


def budget_split(*, epsilon: float | None = None, rho: float | None = None, perturbation: str,
                 fractions: Any = None) -> BudgetSplit:
  """Splits the total ``epsilon`` (pure DP) or ``rho`` (zCDP) into ``(phi_1, phi_2, phi_3)``.

  Exactly one of ``epsilon`` and ``rho`` (:func:`_privacy_parameter`). ``fractions`` defaults
  to paper 003 Table 2 for ``perturbation`` and the notion given (``epsilon``: ``"pure"``,
  ``rho``: ``"zcdp"``); otherwise three positive numbers summing to 1 (checked to 1e-9). A
  total of ``inf`` gives ``(inf, inf, inf)``.
  """
  total, privacy = _privacy_parameter(epsilon, rho)
  _check_choice(perturbation, PERTURBATIONS, "perturbation")
  if fractions is None:
    fractions = TABLE2_FRACTIONS[(perturbation, privacy)]
  fr = tuple(float(f) for f in fractions)
  if len(fr) != 3 or not all(math.isfinite(f) and f > 0 for f in fr) or abs(sum(fr) - 1) > 1e-9:
    raise ValueError(f"fractions must be three positive numbers summing to 1, got {fractions}.")
  return BudgetSplit(*(total * f for f in fr))


class CoverageWarning(UserWarning):
  """The requested intervals are known to cover ``theta_0`` less often than ``1 - alpha``.

  Emitted once per :func:`confidence_intervals` / :func:`confidence_intervals_batched` call,
  before any work or spend, by the rule of :func:`coverage_warning`. The privacy guarantee
  is unaffected; only the statistical claim (nominal coverage) is.
  """


def coverage_warning(*, loss: str, perturbation: str, num_examples: int,
                     epsilon: float) -> str | None:
  r"""Why intervals of this configuration under-cover, or None (public quantities only).

  The rule behind :class:`CoverageWarning` (the measurements are paper 003's Sec. 7.4 and
  ours, ``k = 1,000`` replicates per cell at the Table 2 split: Adult over ``n x d``,
  ``docs/data/confidence_intervals_adult_grid.csv``, and KDD Cup 99 over ``n x eps``,
  ``docs/data/confidence_intervals_kddcup99_epsilon_grid.csv``):

  * ``loss="huber"``: the normal (sandwich) approximation of the Huberized hinge's minimiser
    under-covers (down to 0.868 on Adult with either floor; the loss is not twice
    differentiable at the kinks).
  * ``perturbation="objective"`` with ``num_examples * epsilon^2 <
    OBJECTIVE_MIN_N_EPS_SQUARED``: the privacy part of the minimiser's error (the noise
    ``b/n``, of order ``d/(n eps)``) is then not small against its sampling part (of order
    ``1/sqrt(n)``): their ratio is of order ``1/sqrt(n eps^2)``, and Algorithm 3's interval,
    which linearises the minimiser around ``theta~``, under-covers (paper 003 Sec. 7.4: "more
    difficulty with small n and eps or rho"; Fig. 9: 95% from ``n ~ 4,500`` at ``d = 1``).
    Measured (logistic, paper floor): on KDD Cup 99 (``d = 10``) every cell below 0.95
    (0.827-0.949) has ``n eps^2 <= 5,000`` and every cell from 10,000 covers (at least
    0.958); on Adult the cells below 0.95 at ``n eps^2 <= 2,000`` (``d = 1``: 0.896-0.938). ``epsilon = inf`` (no privacy noise) never warns for
    this reason.

  Args:
    loss: ``"logistic"`` or ``"huber"``.
    perturbation: ``"objective"`` or ``"output"``.
    num_examples: ``n``, the number of records of one replicate.
    epsilon: the total budget in pure-DP terms: ``epsilon`` under pure DP, ``sqrt(2 rho)``
      under zCDP (the paper's comparison, ``rho = eps^2/2``); ``inf``: no privacy noise.

  Returns:
    The warning's message, or None when the configuration is not in a known under-covering
    regime.
  """
  sensitivities.check_loss(loss)
  _check_choice(perturbation, PERTURBATIONS, "perturbation")
  n = _validation.check_positive_int(num_examples, "num_examples")
  eps = _validation.check_positive(epsilon, "epsilon", allow_inf=True)
  reasons = []
  if loss == "huber":
    reasons.append("loss='huber': the normal (sandwich) approximation of the Huberized "
                   "hinge's minimiser under-covers (down to 0.868 measured on Adult); prefer "
                   "loss='logistic' where coverage matters")
  if (perturbation == "objective" and math.isfinite(eps)
      and n * eps * eps < OBJECTIVE_MIN_N_EPS_SQUARED):
    reasons.append(
        f"objective perturbation with n * eps^2 = {n} * {eps:.4g}^2 = {n * eps * eps:.4g} "
        f"below OBJECTIVE_MIN_N_EPS_SQUARED = {OBJECTIVE_MIN_N_EPS_SQUARED:g}: the privacy "
        f"noise of the minimiser is not small against its sampling noise and the intervals "
        f"under-cover (paper 003 Sec. 7.4); use perturbation='output', or a larger n or "
        f"epsilon/rho")
  if not reasons:
    return None
  return "confidence intervals below nominal coverage: " + "; ".join(reasons) + "."


def _pure_epsilon(cal: "Calibration") -> float:
  """The total budget of ``cal`` in pure-DP terms (``epsilon``, or ``sqrt(2 rho)`` under
  zCDP)."""
  total = math.fsum(cal.split)
  return total if cal.privacy == "pure" or math.isinf(total) else math.sqrt(2.0 * total)


def _check_choice(value, choices, name):
  if value not in choices:
    raise ValueError(f"{name} must be one of {choices}, got {value!r}.")
  return value


class Calibration(NamedTuple):
  """Host-side (float64) calibration of one confidence-interval method.

  Attributes:
    loss, h, l2_reg, perturbation, privacy, num_examples, dim: the problem.
    split: :class:`BudgetSplit` (eps or rho).
    objective_gamma: ``gamma = eps'/2`` of the objective noise (inf: none / output perturbation).
    release_noise: ``"l2_laplace"`` or ``"gaussian"``: the noise added to the minimiser.
    release_scale: its ``beta`` (L2-Laplace; inf = none) or ``sigma`` (Gaussian).
    tol: certified gradient-norm tolerance; ``||theta^ - theta*|| <= tol / l2_reg``.
    hessian_sensitivity: Lemma 3 / 5 (the covariance's, Lemma 2, depends on ``theta~``).
    hessian_floor, covariance_floor: eigenvalue floors of :func:`spd_release.symmetrize_and_floor`.
    alpha: ``1 - alpha`` intervals.
    quantiles: ``"exact"`` (Gauss-Laguerre, :mod:`jaxdp.inference.mixture_quantiles`) or
      ``"monte_carlo"`` (the paper's ``num_samples`` draws); unused by the closed form.
    num_samples: Monte Carlo draws ``m`` (``quantiles="monte_carlo"``).
    rounding: ``(a0, a_theta, a_lin)``: the float64 certificate rounding bound is
      ``a0 + a_theta ||theta|| + a_lin ||b||`` (:func:`certified_solve.certificate_rounding_bound`).
    event: the DpEvent of one interval (Theorem 2 / 4), for the privacy unit ``example`` =
      one row of ``x``; with ``counts`` or ``indices`` (a row used ``k`` times) it is the
      group-privacy event of :func:`_group_privacy_event` at ``k = group_size`` (what is
      spent per interval).
    group_size: the largest row multiplicity ``k`` (1 without ``counts``/``indices``).
  """

  loss: str
  h: float
  l2_reg: float
  perturbation: str
  privacy: str
  num_examples: int
  dim: int
  split: BudgetSplit
  objective_gamma: float
  release_noise: str
  release_scale: float
  tol: float
  hessian_sensitivity: float
  hessian_floor: float
  covariance_floor: float
  alpha: float
  quantiles: str
  num_samples: int
  rounding: tuple
  event: Any
  group_size: int = 1


def calibrate(*, num_examples: int, dim: int, epsilon: float | None = None,
              rho: float | None = None, loss: str = "logistic",
              perturbation: str = "objective", l2_reg: float = 0.002, h: float = 0.5,
              alpha: float = 0.05, quantiles: str = "exact",
              num_samples: int = 10_000, floor: str = "paper", fractions: Any = None,
              amp_fraction: float = 0.01, tol: float | None = None,
              num_rows: int | None = None) -> Calibration:
  """Validates the arguments and calibrates every noise of the pipeline (module docstring).

  Exactly one of ``epsilon`` (pure DP) or ``rho`` (zCDP) is the total ``phi``;
  ``Calibration.privacy`` records which.

  Raises:
    ValueError: naming the argument: both or neither of ``epsilon``/``rho``, either
      ``<= 0``, ``l2_reg <= 0`` (the sensitivities divide by it) or too small for Algorithm 1
      (``c <= t/(2n(e^eps - 1))``), ``h <= 0``, ``alpha`` outside (0, 1), unknown
      ``loss``/``perturbation``/``floor``, ...
  """
  _, privacy = _privacy_parameter(epsilon, rho)
  sensitivities.check_loss(loss)
  _check_choice(perturbation, PERTURBATIONS, "perturbation")
  _check_choice(floor, FLOORS, "floor")
  _check_choice(quantiles, QUANTILES, "quantiles")
  n = _validation.check_positive_int(num_examples, "num_examples")
  d = _validation.check_positive_int(dim, "dim")
  lam = _validation.check_positive(l2_reg, "l2_reg")
  h = sensitivities.check_huber_width(h)
  alpha = float(alpha)
  if not 0.0 < alpha < 1.0:
    raise ValueError(f"alpha must be in (0, 1), got {alpha}.")
  m = _validation.check_positive_int(num_samples, "num_samples")
  split = budget_split(epsilon=epsilon, rho=rho, perturbation=perturbation, fractions=fractions)
  private = math.isfinite(split.theta)
  k = linear_losses.lipschitz_constant(loss)
  rows = max(n, int(num_rows or n))
  # 2 tol / Lambda = 0.1% of the minimiser sensitivity 2K/(n Lambda), but never below what
  # float64 can certify on these rows (very large n).
  default_tol = max(1e-3 * k / n, certified_solve.tol_floor(rows, d, loss=loss, h=h))
  gamma = math.inf
  release_noise, release_scale = "l2_laplace", math.inf
  if not private:
    if perturbation == "output" and privacy == "zcdp":  # closed form: sigma = 0
      release_noise, release_scale = "gaussian", 0.0
    tol = certified_solve.check_tol(default_tol if tol is None else tol, num_examples=rows,
                                    dim=d, loss=loss, h=h)
    theta_event = events.NonPrivateDpEvent()
  elif perturbation == "objective":
    eps1 = split.theta if privacy == "pure" else math.sqrt(2.0 * split.theta)
    amp = objective_perturbation_amp_calibration(
        epsilon=eps1, num_examples=n, dim=d, l2_reg=lam, loss=loss, h=h, allow_extra_l2=False,
        amp_fraction=amp_fraction, tol=tol)
    gamma, release_scale, tol = amp.objective.scale, amp.output_scale, amp.tol
    theta_event = amp.event
  else:
    tol = certified_solve.check_tol(default_tol if tol is None else tol, num_examples=rows,
                                    dim=d, loss=loss, h=h)
    kw = dict(epsilon=split.theta) if privacy == "pure" else dict(rho=split.theta)
    out = output_perturbation_calibration(num_examples=n, l2_reg=lam, lipschitz=k,
                                          solver_tol=tol, **kw)
    release_noise, release_scale = out.noise, out.scale
    theta_event = out.event
  spd_events = [spd_release.priv_spd_matrix_event(phi, privacy=privacy)
                for phi in (split.hessian, split.covariance)]
  event = events.ComposedDpEvent([theta_event] + spd_events) if private else (
      events.NonPrivateDpEvent())
  bound = lambda wn, ln: float(certified_solve.certificate_rounding_bound(
      rows, d, wn, ln, loss=loss, h=h, l2_total=lam))
  a0 = bound(0.0, 0.0)
  rounding = (a0, bound(1.0, 0.0) - a0, bound(0.0, 1.0) - a0)
  return Calibration(
      loss=loss, h=h, l2_reg=lam, perturbation=perturbation, privacy=privacy, num_examples=n,
      dim=d, split=split, objective_gamma=gamma, release_noise=release_noise,
      release_scale=float(release_scale), tol=float(tol),
      hessian_sensitivity=float(sensitivities.hessian_sensitivity(loss, n, h)),
      hessian_floor=lam, covariance_floor=lam if floor == "paper" else 0.0,
      alpha=alpha, quantiles=quantiles, num_samples=m, rounding=rounding, event=event)


@functools.lru_cache(maxsize=256)
def _calibrate_cached(items: tuple) -> Calibration:
  return calibrate(**dict(items))


def _calibrate_memo(**kw) -> Calibration:
  """:func:`calibrate`, memoised on its (hashable) arguments: a pure function of scalars, and
  about 0.1 ms of host time per call, which a single interval's few ms notice."""
  items = tuple(sorted(kw.items()))
  try:
    hash(items)
  except TypeError:  # e.g. fractions given as a list
    return calibrate(**kw)
  return _calibrate_cached(items)


class ConfidenceIntervals(NamedTuple):
  """Private ``1 - alpha`` confidence intervals (leading batch axis in the batched call).

  Every field is a private release (or post-processing of one).

  Attributes:
    lower, upper: ``(d,)`` interval end points for ``theta_0``.
    theta: ``(d,)`` the private parameters ``theta~``.
    hessian, covariance: ``(d, d)`` the released ``H~`` and ``Sigma~``.
  """

  lower: jax.Array
  upper: jax.Array
  theta: jax.Array
  hessian: jax.Array
  covariance: jax.Array


_PARAM_NAMES = ("gamma", "release_scale", "tol", "l2", "h", "phi2", "phi3", "hess_sens",
                "floor_h", "floor_s", "q_lo", "q_hi", "z", "r0", "r_theta", "r_lin")


def _params(cal: Calibration) -> np.ndarray:
  """The float64 scalars of the jitted stages as one vector (one host-to-device transfer;
  the static choices stay in the Calibration). :func:`_unpack` names them inside the jit."""
  vals = dict(gamma=cal.objective_gamma, release_scale=cal.release_scale, tol=cal.tol,
              l2=cal.l2_reg, h=cal.h, phi2=cal.split.hessian, phi3=cal.split.covariance,
              hess_sens=cal.hessian_sensitivity, floor_h=cal.hessian_floor,
              floor_s=cal.covariance_floor, q_lo=cal.alpha / 2, q_hi=1 - cal.alpha / 2,
              z=special.ndtri(1 - cal.alpha / 2), r0=cal.rounding[0], r_theta=cal.rounding[1],
              r_lin=cal.rounding[2])
  return np.array([vals[k] for k in _PARAM_NAMES], np.float64)


def _unpack(pvec: jax.Array) -> dict:
  return {k: pvec[i] for i, k in enumerate(_PARAM_NAMES)}


_STATIC = ("loss", "perturbation", "privacy", "release_noise", "quantiles", "num_samples")


def _stage_keys(key):
  return jax.random.split(key, 5)


def _solve(key, x, y, w, p, layouts, init=None, *, loss, perturbation):
  """Stage 1 (data access: the perturbed minimisation). Returns ``(theta^, b/n, certificate)``.

  ``layouts``: :func:`_layouts` of ``x``. ``init``: None, or Newton's starting point and a
  Hessian for its first step (the warm start of :func:`_warm_start_jit`); only the
  certificate of the returned point enters the guarantee, so any start keeps it
  (:func:`newton.newton_minimize`).
  """
  xt, x32, x32t = layouts
  n = jnp.sum(w)
  d = x.shape[1]
  if perturbation == "objective":
    lin = l2_laplace_noise(_stage_keys(key)[0], (d,), p["gamma"], x.dtype) / n
  else:
    lin = jnp.zeros((d,), x.dtype)
  res = newton.newton_minimize(x, y, w, p["l2"], lin, loss=loss, h=p["h"],
                               grad_tol=0.1 * p["tol"], x_hessian=x32, xt=xt,
                               xt_hessian=x32t,
                               init=None if init is None else init[0],
                               init_hessian=None if init is None else init[1])
  cert = (res.grad_norm + p["r0"] + p["r_theta"] * jnp.linalg.norm(res.theta)
          + p["r_lin"] * jnp.linalg.norm(lin))
  return res.theta, lin, cert


def _l2_laplace_rows(key, rows, dim, beta, dtype):
  """``rows`` i.i.d. draws of density ``∝ exp(-beta ||b||)`` in ``R^dim`` (Monte Carlo only).

  Same law as :func:`jaxdp.mechanisms.l2_laplace_noise` (radius ``Gamma(dim, 1/beta)``,
  uniform direction), drawn for many rows at once: for the integer shape ``dim`` the
  radius is a sum of ``dim`` standard exponentials ``-log U`` (exact), which is much
  cheaper on a CPU than ``rows`` rejection-sampled gammas. Both output words of each
  Threefry block are used (two exponentials per block, ``U`` on a ``2^-23`` grid in
  ``(0, 1]``), and the direction uses the library's Box-Muller sampler (about twice as fast
  as ``jax.random.normal`` on a CPU). Used only for the post-processing draws of
  Algorithms 3 and 5, never to protect data.
  """
  k_r, k_d = jax.random.split(key)
  half = (dim + 1) // 2
  w0, w1 = _sampling.threefry_word_pairs(k_r, (rows, half))
  words = jnp.concatenate([w0, w1], axis=1)[:, :dim]
  u = ((words >> 9) + 1).astype(dtype) * dtype(2.0 ** -23)          # (0, 1]
  radius = -jnp.sum(jnp.log(u), axis=1, keepdims=True) / beta.astype(dtype)
  direction = _sampling.standard_normal(k_d, (rows, dim), dtype)
  direction = direction / jnp.linalg.norm(direction, axis=1, keepdims=True)
  return radius * direction


def order_statistic(samples: jax.Array, k: Any, iters: int = 40) -> jax.Array:
  """Column-wise ``k``-th smallest values (1-based) of ``samples`` ``(m, d)`` by bisection.

  ``k`` is a scalar (returns ``(d,)``) or a vector of ``K`` ranks (returns ``(K, d)``: all
  ranks share each pass over ``samples``). XLA's CPU sort is slow (about 50 ms for
  ``10,000 x 11``); counting ``#{s <= t}`` while bisecting ``t`` over ``[min, max]`` costs
  ``iters`` cheap passes and returns each order statistic to within ``(max - min) 2^-iters``
  (from above: the returned ``hi`` always has at least ``k`` samples at or below it).
  """
  k = jnp.asarray(k)
  ks = jnp.atleast_1d(k)[:, None]                                   # (K, 1)
  lo = jnp.broadcast_to(jnp.min(samples, axis=0), (ks.shape[0], samples.shape[1]))
  hi = jnp.broadcast_to(jnp.max(samples, axis=0), (ks.shape[0], samples.shape[1]))

  def body(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)                                           # (K, d)
    counts = jnp.sum(samples[None] <= mid[:, None, :], axis=1)      # (K, d)
    enough = counts >= ks
    return jnp.where(enough, lo, mid), jnp.where(enough, mid, hi)

  out = jax.lax.fori_loop(0, iters, body, (lo, hi))[1]
  return out[0] if k.ndim == 0 else out


def _intervals(key, theta_hat, x, y, w, p, xt=None, *, loss, perturbation, privacy,
               release_noise, quantiles, num_samples):
  """Stage 2: release ``theta~``, PrivSPDMat of ``H`` and ``Sigma`` at ``theta~``, intervals."""
  n = jnp.sum(w)
  d = x.shape[1]
  dt = x.dtype
  _, k_rel, k_h, k_s, k_mc = _stage_keys(key)
  if release_noise == "gaussian":
    theta = theta_hat + gaussian_noise(k_rel, (d,), p["release_scale"], dt)
  else:
    theta = theta_hat + l2_laplace_noise(k_rel, (d,), p["release_scale"], dt)
  hess, cov = sensitivities.hessian_and_covariance(theta, x, y, loss=loss, l2_reg=p["l2"],
                                                   h=p["h"], counts=w, xt=xt)
  cov_sens = sensitivities.covariance_sensitivity(loss, n, jnp.linalg.norm(theta), p["h"])
  h_rel, lam_h, vec_h = spd_release.symmetrize_and_floor(
      hess + spd_release.spd_noise(k_h, d, p["hess_sens"], p["phi2"], privacy=privacy, dtype=dt),
      p["floor_h"])
  s_rel, lam_s, vec_s = spd_release.symmetrize_and_floor(
      cov + spd_release.spd_noise(k_s, d, cov_sens, p["phi3"], privacy=privacy, dtype=dt),
      p["floor_s"])
  h_inv = (vec_h / lam_h) @ vec_h.T
  if perturbation == "output" and privacy == "zcdp":
    # Algorithm 5 lines 18-22: closed form.
    u = p["release_scale"] ** 2 * jnp.eye(d, dtype=dt) + h_inv @ s_rel @ h_inv / n
    half = p["z"] * jnp.sqrt(jnp.diag(u))
    return ConfidenceIntervals(theta - half, theta + half, theta, h_rel, s_rel)
  if quantiles == "exact":
    # The laws of Eq. 4.1 / Eq. 5.2 are Gaussian scale mixtures (mixture_quantiles): their
    # quantiles are computed, not estimated from m draws.
    a = jnp.diag(h_inv @ s_rel @ h_inv) / n
    inv_release2 = jnp.where(jnp.isinf(p["release_scale"]), 0.0, p["release_scale"] ** -2.0)
    if perturbation == "objective":
      inv_gamma2 = jnp.where(jnp.isinf(p["gamma"]), 0.0, p["gamma"] ** -2.0)
      mixing = (jnp.sum(h_inv * h_inv, axis=0) * inv_gamma2 / (n * n), inv_release2)
    else:
      mixing = (inv_release2,)
    half = mixture_quantiles.interval_half_widths(a, mixing, dim=d, alpha=2 * p["q_lo"],
                                                  gaussian_z=p["z"])
    return ConfidenceIntervals(theta - half, theta + half, theta, h_rel, s_rel)
  # Monte Carlo in float32: post-processing, and its error (~1/sqrt(m)) dwarfs float32's.
  k_g, k_b, k_z = jax.random.split(k_mc, 3)
  f32 = jnp.float32
  sq_n = jnp.sqrt(n).astype(f32)
  h_inv32 = h_inv.astype(f32)
  g = (_sampling.standard_normal(k_g, (num_samples, d), f32) * jnp.sqrt(lam_s).astype(f32)) @ (
      vec_s.T.astype(f32))
  if perturbation == "objective":
    # Algorithm 3 lines 7-11 (Eq. 4.1), minus the AMP output noise Z.
    beta = _l2_laplace_rows(k_b, num_samples, d, p["gamma"], f32)
    z_amp = _l2_laplace_rows(k_z, num_samples, d, p["release_scale"], f32)
    samples = (g + beta / sq_n) @ h_inv32 / sq_n - z_amp
  else:
    # Algorithm 5 lines 7-11 (Eq. 5.2).
    beta = _l2_laplace_rows(k_b, num_samples, d, p["release_scale"], f32)
    samples = g @ h_inv32 / sq_n - beta
  # Equal-tailed interval: order statistics ceil(m alpha/2) and ceil(m (1 - alpha/2)).
  # 24 bisection steps: each end point within (max - min) 2^-24 above the order statistic,
  # at the float32 resolution of the samples and far below the Monte Carlo error ~1/sqrt(m).
  lo, hi = order_statistic(samples, jnp.ceil(num_samples * jnp.stack([p["q_lo"], p["q_hi"]])),
                           iters=24)
  return ConfidenceIntervals(theta + lo.astype(dt), theta + hi.astype(dt), theta, h_rel, s_rel)


BATCH_MODES = ("auto", "map", "vmap")


def _layouts(x):
  """``(X^T, X in float32, its transpose)``, materialised once per program (outside the map
  over replicates): XLA:CPU contracts ``X``'s leading axis about 4x slower than ``X^T``."""
  x32 = x.astype(jnp.float32)
  barrier = lambda a: jax.lax.optimization_barrier(jnp.transpose(a))
  return barrier(x), x32, barrier(x32)


def _replicate(x, y, rep, layouts, gather):
  """One replicate's problem ``(x, y, w, layouts)``.

  ``gather=False``: ``rep`` is the ``(N,)`` row multiplicities over the shared rows (and
  ``layouts`` those of ``x``). ``gather=True``: ``rep`` is the ``(n,)`` row indices of the
  replicate; its rows are gathered (row ``i`` once per occurrence) with unit weights, so
  every later pass is over ``n`` rows, and their layouts are materialised here.
  """
  if not gather:
    return x, y, rep, layouts
  xi, yi = jnp.take(x, rep, axis=0), jnp.take(y, rep, axis=0)
  return xi, yi, jnp.ones(rep.shape, x.dtype), _layouts(xi)


def _solve_and_intervals(key, x, y, w, p, layouts, init=None, *, static):
  """Both stages for one key: ``(intervals, theta^, b/n, certificate)``.

  Run together so that the rows stay in cache; the intervals are only RETURNED by
  :func:`_run` when the certificate holds (otherwise the minimiser is repaired on the host
  and stage 2 re-run on it).
  """
  th, lin, cert = _solve(key, x, y, w, p, layouts, init, loss=static["loss"],
                         perturbation=static["perturbation"])
  return _intervals(key, th, x, y, w, p, layouts[0], **static), th, lin, cert


def _batched(fn, batched, *mapped):
  """``fn`` over the leading axis of every argument in ``mapped`` (keys, multiplicities,
  ...): ``jax.vmap``, ``jax.lax.map``, or a single call (``batched`` False)."""
  if batched == "vmap":
    return jax.vmap(fn)(*mapped)
  if batched == "map":
    return jax.lax.map(lambda a: fn(*a), mapped)
  return fn(*mapped)


@functools.partial(jax.jit, static_argnames=_STATIC + ("batched", "gather"),
                   compiler_options=glm_solver.COMPILER_OPTIONS)
def _pipeline_jit(keys, x, y, rep, pvec, init=None, *, batched, gather, **static):
  """Both stages over the replicates ``rep`` (multiplicities, or indices if ``gather``)."""
  p = _unpack(pvec)
  if rep is None:  # unweighted single problem: no host transfer of a vector of ones
    rep = jnp.ones((x.shape[0],), x.dtype)
  layouts = None if gather else _layouts(x)

  def one(k, r):
    xi, yi, wi, lay = _replicate(x, y, r, layouts, gather)
    return _solve_and_intervals(k, xi, yi, wi, p, lay, init, static=static)

  return _batched(one, batched, keys, rep)


@functools.partial(jax.jit, static_argnames=("loss",), compiler_options=glm_solver.COMPILER_OPTIONS)
def _warm_start_jit(x, y, pvec, *, loss):
  """The unperturbed, unweighted minimiser over the pool (a start close to every bootstrap
  replicate's) and the Hessian there (for each replicate's first, chord, step: one Hessian
  pass saved)."""
  p = _unpack(pvec)
  w = jnp.ones((x.shape[0],), x.dtype)
  theta = newton.newton_minimize(x, y, w, p["l2"], jnp.zeros((x.shape[1],), x.dtype), loss=loss,
                                 h=p["h"], grad_tol=0.1 * p["tol"],
                                 x_hessian=x.astype(jnp.float32)).theta
  return theta, sensitivities.hessian(theta, x, y, loss=loss, l2_reg=p["l2"], h=p["h"])


@functools.partial(jax.jit, static_argnames=_STATIC + ("batched", "gather"),
                   compiler_options=glm_solver.COMPILER_OPTIONS)
def _intervals_jit(keys, theta_hat, x, y, rep, pvec, *, batched, gather, **static):
  """Stage 2 alone, for minimisers repaired on the host."""
  p = _unpack(pvec)
  layouts = None if gather else _layouts(x)

  def one(k, r, th):
    xi, yi, wi, lay = _replicate(x, y, r, layouts, gather)
    return _intervals(k, th, xi, yi, wi, p, lay[0], **static)

  return _batched(one, batched, keys, rep, theta_hat)


def _group_privacy_event(event: Any, group_size: int) -> Any:
  r"""The event of ``event``'s mechanism when ``group_size`` records change at once.

  Leafwise: ``PureDpEvent(eps) -> PureDpEvent(k eps)`` (Dwork & Roth 2014, Thm 2.2: an
  ``eps``-DP mechanism is ``k eps``-DP for datasets at replace-distance ``k``, through the
  chain of ``k`` intermediate neighbours) and ``ZCDpEvent(rho) -> ZCDpEvent(k^2 rho)`` (Bun &
  Steinke 2016, Prop. 27). Composition commutes with the map (``k sum eps_i = sum k eps_i``;
  ``k^2 sum rho_i``), and a pure ``eps`` leaf that an accountant converts to ``eps^2/2``-zCDP
  (Prop. 1) gives ``(k eps)^2/2 = k^2 eps^2/2`` either way. ``group_size = 1`` returns
  ``event`` unchanged.
  """
  k = int(group_size)
  if k == 1 or isinstance(event, (events.NonPrivateDpEvent, events.NoOpDpEvent)):
    return event
  if isinstance(event, events.ComposedDpEvent):
    return events.ComposedDpEvent([_group_privacy_event(e, k) for e in event.events])
  if isinstance(event, events.PureDpEvent):
    return events.PureDpEvent(k * event.epsilon, neighbouring=event.neighbouring, unit=event.unit)
  if isinstance(event, events.ZCDpEvent):
    return events.ZCDpEvent(k * k * event.rho, neighbouring=event.neighbouring,
                            unit=event.unit)
  raise ValueError(f"no group-privacy rule for {type(event).__name__} in this module.")


def _releases(keys: Any, batched: bool) -> int:
  """The number of independent releases of one call: one interval per key (``M`` batched)."""
  return int(keys.shape[0]) if batched else 1


def _check_shapes(x, y):
  """Shapes before any work: ``x`` (N, d) with N, d >= 1; ``y`` (N,)."""
  if x.ndim != 2:
    raise ValueError(f"x must be (N, d), got shape {x.shape}.")
  if x.shape[0] == 0 or x.shape[1] == 0:
    raise ValueError(f"x must have at least one row and one column, got shape {x.shape} "
                     "(empty data).")
  if np.ndim(y) != 1 or np.shape(y)[0] != x.shape[0]:
    raise ValueError(f"y must be (N,) with one label per row of x (N = {x.shape[0]}), got "
                     f"shape {np.shape(y)}.")


# Counts of total n are converted to row indices (the gathered O(n d) program) when n is at
# most this fraction of the N rows. Measured on Adult (N = 30,162, d = 10, 1,000 logistic
# replicates, 2 CPU cores): gathering is faster up to n = 15,000 (15 vs 21 ms per interval)
# and slower from n = 20,000 (21 vs 18 ms): each replicate's gathered rows and their
# layouts are materialised, and the weighted program shares the pool's.
_GATHER_AT_MOST = 0.5


def _max_multiplicity(idx: np.ndarray) -> int:
  """The largest number of occurrences of one row in any replicate (row of ``idx``)."""
  srt = np.sort(idx.reshape(-1, idx.shape[-1]), axis=1)
  new_run = np.ones(srt.shape, bool)
  new_run[:, 1:] = srt[:, 1:] != srt[:, :-1]  # every replicate starts a run
  starts = np.flatnonzero(new_run.ravel())
  return int(np.max(np.diff(np.append(starts, srt.size))))


def _check_indices(indices, num_rows, batched, num_keys):
  """``indices`` as an int32 array, checked: integers in ``[0, N)`` of shape ``(n,)``, or
  ``(M, n)`` with ``M`` the number of keys (batched); ``n >= 1``."""
  idx = np.asarray(indices)
  if idx.dtype == bool or not np.issubdtype(idx.dtype, np.integer):
    raise ValueError(f"indices must be an integer array of row indices of x, got dtype "
                     f"{idx.dtype}.")
  want = f"({num_keys}, n)" if batched else "(n,)"
  if idx.ndim != (2 if batched else 1) or idx.shape[-1] == 0 or (
      batched and idx.shape[0] != num_keys):
    raise ValueError(f"indices must have shape {want} with n >= 1 (one replicate of n row "
                     f"indices{' per key' if batched else ''}), got shape {idx.shape}.")
  if np.any(idx < 0) or np.any(idx >= num_rows):
    raise ValueError(f"indices must be row indices of x, in [0, {num_rows}).")
  return idx.astype(np.int32)


def _prepare(x, y, counts, indices, batched, num_keys=1):
  """Validates the data and the replicates before any work.

  Returns ``(x, y, rep, n, group_size, gather)``: ``rep`` is None (every row once), the
  float64 row multiplicities ``(N,)`` / ``(M, N)`` (``gather`` False) or the int32 row
  indices ``(n,)`` / ``(M, n)`` (``gather`` True; counts of total ``n <= N/2`` are
  converted to them).
  """
  if counts is not None and indices is not None:
    raise ValueError("give at most one of counts= (row multiplicities) and indices= (row "
                     "indices) for the replicates, got both.")
  x = _validation.check_numeric_array(x, "x")
  _check_shapes(x, y)
  x = _validation.check_unit_ball(x.astype(np.float64), "x")
  ys = sensitivities.as_signed_labels(y, "y")
  num_rows = x.shape[0]
  if indices is not None:
    idx = _check_indices(indices, num_rows, batched, num_keys)
    return x, ys, idx, idx.shape[-1], _max_multiplicity(idx), True
  if counts is None:
    return x, ys, None, num_rows, 1, False
  w = np.asarray(counts)
  integral = np.issubdtype(w.dtype, np.integer) or (
      np.issubdtype(w.dtype, np.floating) and np.all(np.isfinite(w) & (w == np.round(w))))
  if w.dtype == bool or not integral:
    raise ValueError("counts must be finite non-negative integers (row multiplicities).")
  want = (num_rows,) if not batched else (num_keys, num_rows)
  if w.shape != want or np.any(w < 0):
    raise ValueError(f"counts must be non-negative integers of shape {want} (one row per key "
                     f"in the batched call), got shape {w.shape}.")
  tot = w.sum(axis=-1)
  if np.any(tot != np.ravel(tot)[0]) or np.ravel(tot)[0] <= 0:
    raise ValueError("counts: every replicate must have the same positive total n "
                     "(the calibration depends on n).")
  n = int(np.ravel(tot)[0])
  group = max(1, int(np.max(w)))
  if n <= _GATHER_AT_MOST * num_rows:  # the same problem over its n gathered rows
    reps = w.reshape(-1, num_rows).astype(np.int64)
    idx = np.repeat(np.tile(np.arange(num_rows, dtype=np.int32), reps.shape[0]), reps.ravel())
    return x, ys, idx.reshape(w.shape[:-1] + (n,)), n, group, True
  return x, ys, w.astype(np.float64), n, group, False


def _repair(theta_hat, lin, cert, cal, x, y, rep, gather=False):
  """Host fallback for fits that miss the float64 certificate (normally none).

  ``rep``: the replicates as :func:`_prepare` returns them (multiplicities, or row indices if
  ``gather``), one per row of ``theta_hat`` when it is ``(M, d)``.
  """
  theta_hat = np.array(theta_hat)
  rep = np.asarray(rep)
  bad = np.flatnonzero(np.atleast_1d(np.asarray(cert)) > cal.tol)
  for i in bad:
    ri = np.asarray(rep[i] if rep.ndim == 2 else rep).astype(np.int64)
    rows = ri if gather else np.repeat(np.arange(x.shape[0]), ri)
    lin_i = np.asarray(lin[i] if np.ndim(lin) == 2 else lin)
    ti = theta_hat[i] if theta_hat.ndim == 2 else theta_hat
    sol = certified_solve.certify_minimizers(
        ti, x[rows], y[rows], loss=cal.loss, h=cal.h, l2_total=cal.l2_reg, tol=cal.tol,
        linear_term=lin_i)
    if theta_hat.ndim == 2:
      theta_hat[i] = sol.weights
    else:
      theta_hat = sol.weights
  return theta_hat


def _run(keys, x, y, counts, indices, batched, chunk_size, accountant, kw, batch_mode="map",
         workers=1):
  x, ys, rep, n, group, gather = _prepare(x, y, counts, indices, batched,
                                          _releases(keys, batched))
  cal = _calibrate_memo(num_examples=n, dim=x.shape[1], num_rows=x.shape[0], **kw)
  message = coverage_warning(loss=cal.loss, perturbation=cal.perturbation, num_examples=n,
                             epsilon=_pure_epsilon(cal))
  if message is not None:  # once per call, before any spend or work
    warnings.warn(message, CoverageWarning, stacklevel=3)
  # Group privacy for repeated rows (module docstring): the charge per interval.
  cal = cal._replace(event=_group_privacy_event(cal.event, group), group_size=group)
  if accountant is not None:  # spend before anything is released: one event per interval
    accountant.spend(cal.event, count=_releases(keys, batched))
  static = dict(loss=cal.loss, perturbation=cal.perturbation, privacy=cal.privacy,
                release_noise=cal.release_noise, quantiles=cal.quantiles,
                num_samples=cal.num_samples)
  with jax.enable_x64(True):
    p = jax.device_put(_params(cal))
    xj = jax.device_put(x)
    yj = jax.device_put(ys)

    def run(kc, rc, init, mode):
      out, th, lin, cert = _pipeline_jit(kc, xj, yj, rc, p, init, batched=mode, gather=gather,
                                         **static)
      if np.any(np.asarray(cert) > cal.tol):  # never released: repair, re-run stage 2
        rc = jnp.ones((x.shape[0],)) if rc is None else rc
        th = jnp.asarray(_repair(th, lin, cert, cal, x, ys, np.asarray(rc), gather))
        out = _intervals_jit(kc, th, xj, yj, rc, p, batched=mode, gather=gather, **static)
      return out

    if not batched:
      rj = None if rep is None else jnp.asarray(rep)
      return jax.tree.map(np.asarray, run(keys, rj, None, False)), cal
    if rep is None:  # M keys on the same rows: a view, each chunk copied on its own
      rep = np.broadcast_to(np.ones(x.shape[0]), (keys.shape[0], x.shape[0]))
    # Many problems on the same rows: Newton starts every replicate at the unweighted,
    # unperturbed minimiser over all N rows (computed once), about half the steps of a
    # start at 0; the released points are certified as always, so the start does not enter
    # the guarantee.
    init = _warm_start_jit(xj, yj, p, loss=cal.loss) if keys.shape[0] > 1 else None

    def run_chunk(s):
      kc, rc = keys[s:s + chunk_size], jnp.asarray(rep[s:s + chunk_size])
      if kc.shape[0] < chunk_size and s > 0:  # pad to the compiled chunk shape
        pad = chunk_size - kc.shape[0]
        kc = jnp.concatenate([kc, jnp.repeat(kc[-1:], pad, axis=0)])
        rc = jnp.concatenate([rc, jnp.repeat(rc[-1:], pad, axis=0)])
      out = run(kc, rc, init, batch_mode)
      take = min(chunk_size, keys.shape[0] - s)
      return jax.tree.map(lambda a: np.asarray(a[:take]), out)

    # On a CPU the chunks run side by side, one host thread per core (as
    # jaxdp.training.batching does: one small problem keeps XLA:CPU only about half busy).
    # Every chunk runs the same compiled program on its own replicates, so the intervals are
    # bit-identical to one chunk after another (tested). enable_x64 is thread-local: each
    # worker enters it.
    starts = list(range(0, keys.shape[0], chunk_size))

    def in_x64(s):
      with jax.enable_x64(True):
        return run_chunk(s)

    if workers > 1 and len(starts) > 1:
      with concurrent.futures.ThreadPoolExecutor(min(workers, len(starts))) as pool:
        parts = list(pool.map(in_x64, starts))
    else:
      parts = [run_chunk(s) for s in starts]
    return ConfidenceIntervals(*(np.concatenate(f) for f in zip(*parts))), cal


def confidence_intervals(key: jax.Array, x: Any, y: Any, *, epsilon: float | None = None,
                         rho: float | None = None, loss: str = "logistic",
                         perturbation: str = "objective", l2_reg: float = 0.002, h: float = 0.5,
                         alpha: float = 0.05, quantiles: str = "exact",
                         num_samples: int = 10_000, floor: str = "paper",
                         fractions: Any = None, counts: Any = None, indices: Any = None,
                         amp_fraction: float = 0.01,
                         tol: float | None = None,
                         accountant: Any = None) -> tuple[ConfidenceIntervals, Calibration]:
  """Private ``1 - alpha`` confidence intervals for ``theta_0`` (paper 003 Alg. 3 / Alg. 5).

  Args:
    key: a ``jax.random`` key, used once (split into the five noises of the pipeline).
    x: ``(N, d)`` features with ``||x_i|| <= 1`` (intercept included), checked.
    y: ``(N,)`` labels in ``{-1, +1}`` or ``{0, 1}``.
    epsilon: total ``epsilon`` of pure ``epsilon``-DP (Theorems 2 and 4); ``inf`` = no noise.
    rho: total ``rho`` of ``rho``-zCDP (Theorems 2 and 4); ``inf`` = no noise. Give exactly
      one of ``epsilon`` and ``rho``: it selects the privacy notion (``Calibration.privacy``).
    loss: ``"logistic"`` (logistic regression) or ``"huber"`` (Huberized SVM, width ``h``).
    perturbation: ``"objective"`` (Alg. 1 + Alg. 3) or ``"output"`` (Alg. 4 + Alg. 5).
    l2_reg: ``Lambda = 2c`` of ``(Lambda/2)||theta||^2`` (paper ``c = 0.001``: 0.002).
    alpha: ``1 - alpha`` is the nominal coverage.
    quantiles: ``"exact"`` (default: the quantiles of the law that Algorithms 3 and 5 sample,
      computed by Gauss-Laguerre quadrature, :mod:`jaxdp.inference.mixture_quantiles`; no
      Monte Carlo error) or ``"monte_carlo"`` (the paper: ``num_samples`` draws).
    num_samples: Monte Carlo draws ``m`` (paper: 10,000; ``quantiles="monte_carlo"`` only).
    floor: ``"paper"`` (default: both matrices floored at ``2c = Lambda``, Algorithm 2) or
      ``"psd"`` (the covariance at 0, the Hessian at ``Lambda``): both are post-processing.
      ``"psd"`` gives shorter intervals that under-cover more often (on Adult, logistic
      regression: 17 of 72 cells below 0.95, down to 0.889, against 5 of 72 with
      ``"paper"``, 4 of them flagged by :class:`CoverageWarning`; module docstring): use
      it only where length matters more than nominal coverage, or to compare with it.
    fractions: ``(phi_1, phi_2, phi_3) / phi`` of the total ``phi`` (``epsilon`` or ``rho``;
      default: paper 003 Table 2).
    counts: optional ``(N,)`` integer row multiplicities (the dataset in which row ``i``
      appears ``counts[i]`` times, e.g. a bootstrap replicate); ``n = sum(counts)``. The
      privacy unit stays one row of ``x``: the event is the group-privacy one at
      ``k = max(counts)`` (``k phi`` pure, ``k^2 rho`` zCDP; module docstring).
    indices: optional ``(n,)`` integer row indices in ``[0, N)`` of the replicate (row ``i``
      used once per occurrence; the same replicate as the ``counts`` of its occurrences),
      charged the same way at ``k`` = the most occurrences of one row. The ``n`` rows are
      gathered, so the cost is that of ``n`` rows, not ``N`` (counts of total ``n <= N/2``
      are converted to indices; above ``N/2`` counts are the faster form). At most one of
      ``counts`` and ``indices``.
    amp_fraction, tol: Approximate Minima Perturbation share of ``phi_1`` and the certified
      gradient tolerance (objective perturbation; :mod:`jaxdp.training.objective_perturbation`).
    accountant: optional :class:`jaxdp.accounting.PrivacyAccountant` or
      :class:`jaxdp.accounting.PrivacyBudget`; the event is spent BEFORE anything is computed.

  Returns:
    ``(ConfidenceIntervals, Calibration)``; ``Calibration.event`` is the DpEvent spent.

  Raises:
    ValueError: both or neither of ``epsilon``/``rho``, or the one given ``<= 0``, before any
      work or spend; other invalid arguments name themselves (:func:`calibrate`).

  Warns:
    CoverageWarning: once, before any work or spend, where the intervals are known to
      under-cover (:func:`coverage_warning`: ``loss="huber"``, or objective perturbation
      with ``n eps^2 < OBJECTIVE_MIN_N_EPS_SQUARED``).
  """
  _validation.check_key(key)
  _privacy_parameter(epsilon, rho)
  kw = dict(epsilon=epsilon, rho=rho, loss=loss, perturbation=perturbation, l2_reg=l2_reg,
            h=h, alpha=alpha, quantiles=quantiles, num_samples=num_samples, floor=floor,
            fractions=fractions, amp_fraction=amp_fraction, tol=tol)
  return _run(key, x, y, counts, indices, False, None, accountant, kw)


def confidence_intervals_batched(keys: jax.Array, x: Any, y: Any, *,
                                 epsilon: float | None = None, rho: float | None = None,
                                 counts: Any = None, indices: Any = None,
                                 chunk_size: int | None = None,
                                 batch_mode: str = "auto", accountant: Any = None,
                                 **kwargs) -> tuple[ConfidenceIntervals, Calibration]:
  """:func:`confidence_intervals` for ``M`` keys (seeds) and optionally ``M`` replicates.

  The two jitted stages are mapped over ``keys`` and the replicates: ``counts`` (``(M, N)``
  bootstrap multiplicities over the shared ``x``, ``y``, all with the same total ``n``) or
  ``indices`` (``(M, n)`` row indices of the replicates; row ``i`` used once per occurrence).
  Indices, and counts of total ``n <= N/2`` (converted to indices), gather each replicate's
  ``n`` rows inside the jitted program, so a replicate costs ``O(n d)`` per pass, not
  ``O(N d)``. They run in chunks of at most ``chunk_size`` replicates (memory ~
  ``chunk_size * max(n, N)``; default 64 on a
  CPU backend, 512 on an accelerator, where a vmapped chunk is one launch); on a CPU with
  ``batch_mode="map"`` the chunks run side by side, one per core
  (:func:`jaxdp.training.batching.cpu_workers`, ``$JAXDP_CPU_WORKERS``), with results
  bit-identical to running them one after another. Each replicate is a separate release;
  an ``accountant`` is charged ``M`` times the event (``counts=None`` included: ``M`` keys
  are ``M`` independent releases on the same rows), BEFORE anything is computed; with
  ``counts`` or ``indices`` the event is the group-privacy one at the largest multiplicity
  of one row in any replicate (module docstring). Returns numpy arrays with a leading axis
  ``M``. A :class:`CoverageWarning` is emitted once per call, before any work or spend, by
  the rule of :func:`coverage_warning`.

  ``batch_mode``: ``"map"`` (``jax.lax.map`` over the chunk inside one jit: on a CPU about
  3x faster per interval than ``"vmap"``, whose batched while-loops run every replicate to
  the slowest one's iteration count and whose ``chunk x m x d`` Monte Carlo arrays leave
  the cache), ``"vmap"`` (``jax.vmap``: on a GPU one launch serves the whole chunk, where
  ``"map"`` pays a chain of small launches per replicate) or ``"auto"`` (default:
  ``"map"`` on a CPU backend, else ``"vmap"``).

  ``epsilon``/``rho`` (exactly one) and ``kwargs`` (``loss``, ``perturbation``, ``l2_reg``,
  ...) are those of :func:`confidence_intervals`, checked before any work or spend.
  """
  unknown = sorted(set(kwargs) - _SINGLE_CALL_OPTIONS)
  if unknown:
    raise TypeError(f"confidence_intervals_batched got unexpected keyword arguments {unknown}; "
                    f"it takes those of confidence_intervals: {sorted(_SINGLE_CALL_OPTIONS)}.")
  _privacy_parameter(epsilon, rho)
  # The library's one rule for "auto" (map on a CPU, vmap on an accelerator); it validates too.
  batch_mode = linear.resolve_batch_mode(batch_mode)
  _validation.check_key(keys, "keys", allow_batch=True)
  key_ndim = keys.ndim - (0 if jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key) else 1)
  if key_ndim != 1 or keys.shape[0] == 0:
    raise ValueError(f"keys must be a one-dimensional batch of at least one key (M keys: M "
                     f"intervals), got a batch of shape {keys.shape}.")
  num = keys.shape[0]
  if chunk_size is None:
    chunk_size = 64 if jax.default_backend() == "cpu" else 512
  chunk = _validation.check_positive_int(chunk_size, "chunk_size")
  workers = batching.num_chunks(num, batch_mode)  # host threads: one per core on a CPU map
  chunk = min(chunk, -(-num // workers))  # every core gets a chunk
  return _run(keys, x, y, counts, indices, True, chunk, accountant,
              dict(epsilon=epsilon, rho=rho, **kwargs),
              batch_mode=batch_mode, workers=workers)
