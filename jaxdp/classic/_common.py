"""Shared pieces of the classic models: declared bounds, sum sensitivities, spending.

Bounds policy (issue 16). A sensitivity that depends on a bound is only valid if
the bound was fixed *before* looking at the data. So every function here
requires the bounds explicitly: a missing bound raises ``ValueError`` (never a
silent data-dependent bound, the bug diffprivlib only warns about), values
outside the declared bounds raise ``ValueError`` unless the caller passes
``clip=True`` (then they are clipped, which is a data-independent map applied
to each record and keeps the sensitivity). A private bound can be estimated as
an explicit, budgeted step with :func:`jaxdp.classic.private_quantile`.

Sum statistics. Every statistic released by the models here is a sum over
records ``S(D) = sum_i f(x_i)`` of a per-record contribution with
``||f(x)||_p <= B``. Then (Dwork & Roth 2014, Def. 3.1 applied to a sum)

* add/remove one record: ``||S(D) - S(D')||_p <= B``;
* replace one record:    ``||S(D) - S(D')||_p = ||f(x) - f(x')||_p <= 2 B``.

:func:`sum_sensitivity` returns that bound; the ``neighbouring`` argument of
every model picks the relation, and the relation is written into the events.

Noise (issue 26). The low-dimensional releases (counts and sums of naive Bayes,
random trees, k-means) default to ``noise="discrete"``: the discrete Laplace
mechanism on a PUBLIC grid (:mod:`jaxdp.mechanisms.discrete`; C. Canonne, G.
Kamath, T. Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS
2020, Algorithm 2), whose set of possible outputs does not depend on the data;
``noise="continuous"`` is the float Laplace mechanism (Dwork & Roth Thm. 3.6),
kept to reproduce papers and for comparison (its float outputs carry the
lattice caveat of ``docs/sharp_edges.md``). Both spend the same ``epsilon``
per release under the same relation; the discrete release's event is the
``PureDpEvent(epsilon)`` of :func:`jaxdp.mechanisms.discrete_laplace_mechanism_event`
(the discrete Laplace with integer sensitivity has the privacy-loss distribution
of randomized response, which a ``LaplaceDpEvent`` would understate in an RDP
or PLD accountant).

* Counts are integers, so they already lie on the grid ``1 Z``: no rounding
  happens and the L1 sensitivity in grid units is the count sensitivity
  ``Delta`` itself (the ``+ (c - 1)`` of the rounding bound does not arise).
  Integer noise ``z`` of scale ``t/s >= Delta/eps`` (CKS Algorithm 2,
  :func:`discrete_count_parameters`) is added exactly: ``eps``-DP, and the
  noise scale equals the continuous one (no utility cost).
* A sum of real contributions is rounded to the grid ``g Z`` of a public
  power-of-two step (:func:`sum_grid_step`) by
  :func:`jaxdp.mechanisms.discrete_laplace_mechanism`, whose rounded L1
  sensitivity is ``K_1 = ceil(Delta_1/g) + (c - 1)`` grid steps when one record
  changes at most ``c`` coordinates (module docstring of
  :mod:`jaxdp.mechanisms.discrete`), with noise of scale ``t/s >= K_1/eps``
  grid steps: ``eps``-DP. With ``g <= Delta_1/(c 2^10)`` the noise scale in
  output units ``K_1 g/eps`` exceeds the continuous ``Delta_1/eps`` by less
  than ``c g/Delta_1 <= 2^-10`` relatively (``K_1 g < Delta_1 + c g``), plus
  the ``< 1/t`` of the integer ratio ``t/s``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from jaxdp import _estimator_checks
from jaxdp import _keys
from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.errors import ArgumentTypeError, BudgetExceededError
from jaxdp.mechanisms import discrete

NEIGHBOURING = (events.ADD_REMOVE, events.REPLACE_ONE)
NOISE_KINDS = ("discrete", "continuous")
GRID_COST = 2**-10        # target c g / Delta_1 of a rounded sum (module docstring)
MAX_GRID_SCALE = 2**19    # noise scale in grid steps above which the grid is coarsened
MAX_GRID_INDEX = 2**30 - 64  # |value|/g must stay below (jaxdp.mechanisms.discrete clamps there)


def check_noise(noise: Any) -> str:
  """``"discrete"`` or ``"continuous"``; anything else raises ValueError naming ``noise``."""
  if not isinstance(noise, str) or noise not in NOISE_KINDS:
    raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}.")
  return noise


def _largest_power_of_two_at_most(x: float) -> float:
  mantissa, exponent = math.frexp(x)  # x = mantissa 2^exponent, mantissa in [0.5, 1)
  del mantissa
  return math.ldexp(1.0, exponent - 1)


def sum_grid_step(l1_sensitivity: float, epsilon: float, changed: int) -> float:
  """Public power-of-two grid step of a sum released with the discrete Laplace.

  ``g`` is the largest power of two ``<= Delta_1/(c 2^10)`` (``c = changed``, the
  coordinates one record can change), so ``K_1 = ceil(Delta_1/g) + (c - 1)``
  grid steps costs less than a relative ``c g/Delta_1 <= 2^-10`` over
  ``Delta_1/g`` (module docstring); when the noise ``K_1/eps`` would exceed ``2^19`` grid steps (the
  sampler takes scales below ``2^20``), ``g`` doubles until it does not: the
  noise then spans ``>= 2^18`` grid steps and the relative cost is
  ``< c/(eps 2^18)``. A function of public parameters only.
  """
  sens = float(l1_sensitivity)
  eps = float(epsilon)
  c = int(changed)
  g = _largest_power_of_two_at_most(sens / (c * 2**10))
  for _ in range(2100):  # bounded: from 2^-1074 up to 2^1023
    if (math.ceil(sens / g) + c - 1) / eps <= MAX_GRID_SCALE:
      break
    g *= 2.0
  return g


def check_grid_range(max_abs_value: float, grid_step: float, what: str) -> None:
  """Refuses a discrete release whose values could reach ``2^30 - 64`` grid steps.

  :func:`jaxdp.mechanisms.discrete_laplace_mechanism` clamps the grid index
  there (a 1-Lipschitz map: private, but a wrong answer); ``max_abs_value`` is a
  bound on ``|value|`` from the declared bounds and the number of rows.
  """
  if max_abs_value / grid_step >= MAX_GRID_INDEX:
    raise ValueError(
        f"noise='discrete': {what} can reach {max_abs_value:.4g}, i.e. "
        f"{max_abs_value / grid_step:.4g} steps of the public grid {grid_step!r}, above the "
        f"supported {MAX_GRID_INDEX}; pass noise='continuous' (float Laplace) for data this large.")


def discrete_count_parameters(l1_sensitivity: float, epsilon: float) -> tuple[int, int]:
  """``(t, s)`` of the discrete Laplace noise of integer counts: ``t/s >= Delta/eps`` (grid 1).

  Counts lie on ``1 Z`` already, so the rounded sensitivity is ``Delta`` itself
  (``ceil(Delta/1)`` for an integer ``Delta``, one rounding, nothing to add:
  module docstring), and :func:`jaxdp.mechanisms.discrete_laplace_scale` is
  called with ``changed=1``.
  """
  if float(l1_sensitivity) != math.floor(float(l1_sensitivity)):
    raise ValueError(f"a count sensitivity is an integer, got {l1_sensitivity!r}.")
  return discrete.discrete_laplace_scale(l1_sensitivity, epsilon, 1.0, 1)


def check_relation(neighbouring: Any) -> str:
  """``"add_remove"`` or ``"replace_one"``; anything else raises ValueError."""
  return events.check_neighbouring(neighbouring)


def sum_sensitivity(per_record_bound: float, neighbouring: str) -> float:
  """Sensitivity of ``sum_i f(x_i)`` with ``||f(x)|| <= per_record_bound``.

  ``B`` under add/remove, ``2 B`` under replace-one (module docstring).
  """
  rel = check_relation(neighbouring)
  b = float(per_record_bound)
  return b if rel == events.ADD_REMOVE else 2.0 * b


def check_bounds(lower: Any, upper: Any, dim: int, name: str = "bounds") -> tuple[np.ndarray, np.ndarray]:
  """Declared per-feature bounds ``lower < upper`` as float64 arrays of shape ``(dim,)``.

  Scalars broadcast. ``None`` raises: a bound must be public, fixed before
  seeing the data (use :func:`jaxdp.classic.private_quantile` to estimate one
  privately).
  """
  if lower is None or upper is None:
    raise ValueError(
        f"{name}: lower and upper bounds are required (a bound read off the data "
        "would make the sensitivity data-dependent and the release not private). "
        "Declare public bounds, or estimate them privately with "
        "jaxdp.classic.private_quantile and spend that budget too.")
  lo = np.broadcast_to(_validation.check_finite_array(lower, f"{name} lower"), (dim,)).astype(np.float64)
  hi = np.broadcast_to(_validation.check_finite_array(upper, f"{name} upper"), (dim,)).astype(np.float64)
  if np.any(hi <= lo):
    j = int(np.argmax(hi <= lo))
    raise ValueError(f"{name}: need lower < upper for every feature; feature {j} has "
                     f"lower={float(lo[j])!r}, upper={float(hi[j])!r}.")
  return lo.copy(), hi.copy()


def check_data_in_bounds(x: Any, lower: np.ndarray, upper: np.ndarray, *, clip: bool,
                         name: str = "x") -> np.ndarray:
  """Validates a 2-D finite array against declared bounds.

  Values outside ``[lower, upper]`` raise ValueError naming ``name``, the row
  and the feature (never the value: a refusal message must not copy private
  data) unless ``clip=True``, which clips them (a per-record map that keeps the
  sensitivity).
  """
  arr = _validation.check_finite_array(x, name)
  if arr.dtype.kind == "c":  # astype(float64) would silently drop the imaginary part
    raise ArgumentTypeError(f"{name}: Complex data not supported (got dtype {arr.dtype}); pass "
                            "the real features.")
  if arr.ndim != 2:
    raise ValueError(f"{name} must be a 2-D array (examples, features), got shape {arr.shape}.")
  arr = arr.astype(np.float64)
  if clip:
    return np.clip(arr, lower, upper)
  bad = (arr < lower) | (arr > upper)
  if np.any(bad):
    i, j = np.argwhere(bad)[0]
    # The message names the rule and the entry, never the private value itself.
    raise ValueError(
        f"{name}[{i}, {j}] lies outside the declared bounds "
        f"[{float(lower[j])!r}, {float(upper[j])!r}] of feature {j}; the sensitivity assumes the bounds. "
        "Pass clip=True to clip values to the bounds explicitly.")
  return arr


def check_bounded_data(x: Any, lower: Any, upper: Any, *, clip: bool,
                       name: str = "x") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A non-empty ``(n, d)`` float64 array inside its declared bounds, and the bounds.

  :func:`check_bounds` on ``(lower, upper)`` for ``d`` features, then
  :func:`check_data_in_bounds` (out-of-bound values raise unless ``clip``).

  Returns:
    ``(x, lower, upper)``.
  """
  arr = _validation.check_finite_array(x, name)
  if arr.ndim != 2 or arr.shape[0] == 0:
    raise ValueError(f"{name} must be a non-empty 2-D array, got shape {arr.shape}.")
  lo, hi = check_bounds(lower, upper, arr.shape[1], f"{name} bounds")
  return check_data_in_bounds(arr, lo, hi, clip=clip, name=name), lo, hi


def check_labels(y: Any, num_classes: int, n: int, name: str = "y") -> np.ndarray:
  """Integer labels in ``{0, ..., num_classes - 1}`` (the public label set)."""
  arr = _validation.check_finite_array(y, name)
  if arr.shape != (n,):
    raise ValueError(f"{name} must have shape ({n},), got {arr.shape}.")
  not_integer = ~np.equal(np.mod(arr, 1), 0)
  if np.any(not_integer):
    raise ValueError(f"{name} must hold integer class indices; row {int(np.argmax(not_integer))} "
                     "does not.")
  arr = arr.astype(np.int64)
  outside = (arr < 0) | (arr >= num_classes)
  if np.any(outside):
    # Names the rule and the row, never the private label value.
    raise ValueError(f"{name} must lie in {{0, ..., {num_classes - 1}}} (num_classes={num_classes}); "
                     f"row {int(np.argmax(outside))} does not.")
  return arr


def check_query_x(x: Any, n_features: int, estimator: Any, name: str = "x") -> np.ndarray:
  """``x`` at predict/transform time: a real, finite 2-D array with the fitted feature count.

  :func:`jaxdp._estimator_checks.check_x`, then the number of columns against
  ``n_features`` (a public shape, set by ``fit`` as ``n_features_in_``).
  """
  arr = _estimator_checks.check_x(x, name)
  if arr.shape[1] != n_features:
    raise ValueError(f"{name} has {arr.shape[1]} features, but {type(estimator).__name__} is "
                     f"expecting {n_features} features as input (got shape {arr.shape}).")
  return arr


def check_accountant(accountant: Any) -> None:
  """``None`` or an object with ``spend(event)`` (a PrivacyAccountant or PrivacyBudget)."""
  if accountant is not None and not callable(getattr(accountant, "spend", None)):
    raise ArgumentTypeError(
        "accountant must be None, a jaxdp.accounting.PrivacyAccountant or a "
        f"jaxdp.accounting.PrivacyBudget (an object with spend(event)), got "
        f"{type(accountant).__name__}.")


def spend(accountant: Any, event: events.DpEvent) -> None:
  """Spends ``event`` on an accountant/budget; a budget refuses *before* any release.

  Call before computing the release: with a :class:`PrivacyBudget` a spend
  that would exceed the budget raises ``BudgetExceededError`` and nothing is
  released. Inside scikit-learn model selection (``GridSearchCV``,
  ``cross_validate``, ...) the refusal is raised as
  :class:`~jaxdp.errors.BudgetExhausted` instead (:func:`jaxdp._keys.budget_refusal`),
  so that the search ends rather than picking a winner among affordable fits.
  """
  if accountant is None:
    return
  check_accountant(accountant)
  try:
    accountant.spend(event)
  except BudgetExceededError as err:
    # Inside scikit-learn model selection the refusal ends the search (a BudgetExhausted,
    # which error_score cannot swallow); elsewhere it is raised unchanged.
    raise _keys.budget_refusal(err)

