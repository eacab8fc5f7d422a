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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxdp import _validation
from jaxdp.accounting import events

NEIGHBOURING = (events.ADD_REMOVE, events.REPLACE_ONE)


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


def spend(accountant: Any, event: events.DpEvent) -> None:
  """Spends ``event`` on an accountant/budget; a budget refuses *before* any release.

  Call before computing the release: with a :class:`PrivacyBudget` a spend
  that would exceed the budget raises ``BudgetExceededError`` and nothing is
  released.
  """
  if accountant is None:
    return
  accountant.spend(event)

