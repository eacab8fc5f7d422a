r"""Private quantiles: an explicit, budgeted way to choose the bounds the models need.

The exponential mechanism (McSherry & Talwar 2007) over a fixed PUBLIC grid of
candidate outputs, the discrete version of Smith (2011), "Privacy-preserving
statistical estimation with optimal convergence rates", Sec. 3.

Mechanism. Given the public search range ``[a, b]`` and the public number of
grid points ``G + 1`` (``num_grid_points``), the candidates are
``o_k = a + k (b - a) / G``, ``k = 0, ..., G`` (computed in float64 from ``k``
alone: the same set for every dataset). The data are clipped to ``[a, b]`` (a
per-record map, part of the mechanism). The utility of a candidate is
``u_D(o) = -|r_D(o) - q n|`` with ``r_D(o) = #{i : x_i < o}`` its rank, and the
mechanism outputs ``o_k`` with probability
``p_D(o_k) = exp(beta u_D(o_k)) / sum_j exp(beta u_D(o_j))``, ``beta = epsilon / 2``
(Gumbel-max in float64, :func:`jaxdp.mechanisms.gumbel_max`).

Theorem (``epsilon``-DP, both relations). For neighbours ``D ~ D'`` and every
candidate ``o``, ``|u_D(o) - u_D'(o)| <= 1``: replacing a record changes each
indicator ``[x_i < o]`` of one record, so the rank by at most 1, with ``n``
fixed; adding a record changes the rank by 0 or 1 and ``q n`` by ``q``, and the
two moves have the same sign, so ``|u - u'| <= max(q, 1 - q) <= 1``. Then
``p_D(o) / p_D'(o) = exp(beta (u_D(o) - u_D'(o))) Z_D' / Z_D <= e^beta e^beta
= e^epsilon`` (McSherry & Talwar 2007, Thm. 6; Dwork & Roth 2014, Thm. 3.10).
The output support is the grid, the same for every dataset, and every grid
point has positive probability under every dataset: no output is possible on
``D`` and impossible on a neighbour (the previous release,
``edges[i] + u * lengths[i]`` in float32 with ``u`` on a ``2^-23`` grid, had a
support anchored at the records: infinite privacy loss). The event is
:func:`jaxdp.mechanisms.exponential_mechanism_event` (``beta = epsilon/2``,
``Delta = 1``); the float64 Gumbel's own cut is the library-wide residual of
:mod:`jaxdp.mechanisms.exponential`.

Accuracy (the grid's effect). The grid changes the output space, not the
guarantee. The mechanism is Smith's with every interval ``[z_i, z_{i+1})`` of
the sorted data weighted by the number of grid points in it instead of its
length, so the output is within one ``step = (b - a) / G`` of a draw of the
continuous mechanism's rank law; by Dwork & Roth Thm. 3.11, with probability
``>= 1 - e^{-t}`` the released candidate's rank error is at most
``OPT + (2 / epsilon)(ln(G + 1) + t)``, where ``OPT = min_k |r_D(o_k) - q n|``
is at most the number of records in one grid cell (0 when the data are spread
over more than one cell per record). The default ``G = 2^16`` gives a
resolution of ``(b - a) 2^-16`` and ``ln(G + 1) = 11.1`` (Smith's continuous
version pays ``ln((b - a) / gap)`` instead).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.classic import _common
from jaxdp.mechanisms import exponential_mechanism_event
from jaxdp.mechanisms import gumbel_max

DEFAULT_GRID_POINTS = 2**16 + 1
"""Default ``num_grid_points``: ``G = 2^16`` cells over the search range."""


def check_grid_points(num_grid_points: Any) -> int:
  """An integer ``G + 1 >= 2`` (the candidates include both ends of the range)."""
  g = _validation.check_positive_int(num_grid_points, "num_grid_points")
  if g < 2:
    raise ValueError(f"num_grid_points must be >= 2 (both ends of the range), got {g}.")
  return g


def quantile_grid(lower: float, upper: float, num_grid_points: int = DEFAULT_GRID_POINTS) -> np.ndarray:
  """The public candidates ``lower + k (upper - lower) / G``, ``k = 0..G`` (float64; data-free)."""
  g = check_grid_points(num_grid_points) - 1
  lo, hi = float(lower), float(upper)
  grid = lo + np.arange(g + 1, dtype=np.float64) * ((hi - lo) / g)
  grid[-1] = hi
  return grid


def _grid_utilities(x: np.ndarray, q: float, grid: np.ndarray) -> np.ndarray:
  """``u(o) = -|#{x_i < o} - q n|`` for every candidate (``x`` already clipped; float64)."""
  ranks = np.searchsorted(np.sort(x), grid, side="left")
  return -np.abs(ranks.astype(np.float64) - q * x.shape[0])


def _grid_logits(x: np.ndarray, q: float, lower: float, upper: float, beta: float,
                 num_grid_points: int) -> np.ndarray:
  """``beta u(o_k) - max_k beta u(o_k)`` (float64; the exponential mechanism's logits).

  The data are clipped to ``[lower, upper]`` here: the clip is part of the mechanism.
  """
  grid = quantile_grid(lower, upper, num_grid_points)
  logits = beta * _grid_utilities(np.clip(x, lower, upper), q, grid)
  return logits - logits.max()


def _draw_grid_index(key: jax.Array, logits: np.ndarray) -> np.ndarray:
  """Gumbel-max draw(s) over the last axis in float64 (rows independent)."""
  with jax.enable_x64(True):
    return np.asarray(gumbel_max(key, jnp.asarray(logits, jnp.float64)))


def _exponential_beta(epsilon: float) -> float:
  """``beta = epsilon / 2``: the exponential mechanism is ``2 beta Delta``-DP, ``Delta = 1``."""
  return epsilon / 2.0


def quantile_event(epsilon: float, *, neighbouring: str = "replace_one",
                   count: int = 1) -> events.DpEvent:
  """The event of ``count`` quantile draws at ``epsilon`` each (``beta = epsilon/2``, ``Delta = 1``)."""
  eps = _validation.check_epsilon(epsilon, "epsilon")
  ev = exponential_mechanism_event(eps / 2.0, 1.0, neighbouring=_common.check_relation(neighbouring))
  count = _validation.check_positive_int(count, "count")
  return ev if count == 1 else events.SelfComposedDpEvent(ev, count)


def _check_level(q: Any, name: str = "q") -> float:
  q = _validation._as_float(q, name)
  if not 0.0 <= q <= 1.0:
    raise ValueError(f"{name} must lie in [0, 1], got {q!r}.")
  return q


def private_quantile(key: jax.Array, x: Any, q: float, *, lower: float, upper: float,
                     epsilon: float, num_grid_points: int = DEFAULT_GRID_POINTS,
                     neighbouring: str = "replace_one", accountant: Any = None) -> float:
  """An ``epsilon``-DP estimate of the ``q``-quantile of ``x``, on a public grid of ``[lower, upper]``.

  Args:
    key: a ``jax.random`` key, used once.
    x: 1-D finite data (values outside ``[lower, upper]`` are clipped, as the
      mechanism defines).
    q: quantile level in [0, 1].
    lower, upper: the PUBLIC search range, ``lower < upper``.
    epsilon: privacy parameter in (0, inf).
    num_grid_points: ``G + 1``, the number of public candidates
      ``lower + k (upper - lower) / G`` (module docstring: resolution
      ``(upper - lower) / G``, rank error ``+ (2/epsilon) ln(G + 1)``).
    neighbouring: relation written in the event (``Delta = 1`` for both).
    accountant: optional accountant/budget; the event is spent before release.

  Returns:
    The private quantile, a float64 grid point.
  """
  _validation.check_key(key)
  arr = _validation.check_finite_array(x, "x").astype(np.float64)
  if arr.ndim != 1 or arr.size == 0:
    raise ValueError(f"x must be a non-empty 1-D array, got shape {arr.shape}.")
  q = _check_level(q)
  lo, hi = _common.check_bounds(lower, upper, 1, "quantile range")
  eps = _validation.check_epsilon(epsilon, "epsilon")
  g = check_grid_points(num_grid_points)
  _common.spend(accountant, quantile_event(eps, neighbouring=neighbouring))
  logits = _grid_logits(arr, q, lo[0], hi[0], _exponential_beta(eps), g)
  k = int(_draw_grid_index(key, logits))
  return float(quantile_grid(lo[0], hi[0], g)[k])


def private_bounds(key: jax.Array, x: Any, *, lower: Any, upper: Any, epsilon: float,
                   quantiles: tuple[float, float] = (0.01, 0.99),
                   num_grid_points: int = DEFAULT_GRID_POINTS,
                   neighbouring: str = "replace_one",
                   accountant: Any = None) -> tuple[np.ndarray, np.ndarray]:
  """Per-feature private bounds: the ``quantiles`` of every column of ``x``.

  ``2 d`` grid quantile draws (:func:`private_quantile`), each at
  ``epsilon / (2 d)``: every record takes part in all of them, so by basic
  composition (Dwork & Roth Thm. 3.16) the total is ``epsilon``-DP. The
  returned lower bound is ``<=`` the upper one (sorted, post-processing), and
  both lie on the public grid of their feature's search range.

  Args:
    key: a ``jax.random`` key, used once (split per feature).
    x: ``(n, d)`` finite data.
    lower, upper: public search ranges (scalars or shape ``(d,)``).
    epsilon: total privacy parameter of the ``2 d`` draws.
    quantiles: the two quantile levels.
    num_grid_points: ``G + 1`` public candidates per feature (:func:`private_quantile`).
    neighbouring: relation written in the events.
    accountant: optional accountant/budget, spent before release.

  Returns:
    ``(low, high)`` float64 arrays of shape ``(d,)``.
  """
  _validation.check_key(key)
  arr = _validation.check_finite_array(x, "x").astype(np.float64)
  if arr.ndim != 2 or arr.shape[0] == 0:
    raise ValueError(f"x must be a non-empty 2-D array, got shape {arr.shape}.")
  d = arr.shape[1]
  lo, hi = _common.check_bounds(lower, upper, d, "search range")
  eps = _validation.check_epsilon(epsilon, "epsilon")
  if len(tuple(quantiles)) != 2:
    raise ValueError(f"quantiles must be two levels (low, high), got {quantiles!r}.")
  q_lo, q_hi = (_check_level(v, "quantiles") for v in quantiles)
  if q_lo > q_hi:
    raise ValueError(f"quantiles must satisfy 0 <= low <= high <= 1, got {quantiles!r}.")
  g = check_grid_points(num_grid_points)
  eps_each = eps / (2 * d)
  _common.spend(accountant, quantile_event(eps_each, neighbouring=neighbouring, count=2 * d))
  keys = jax.random.split(key, d)
  low, high = np.empty(d), np.empty(d)
  for j in range(d):
    logits = np.stack([_grid_logits(arr[:, j], qq, lo[j], hi[j], _exponential_beta(eps_each), g)
                       for qq in (q_lo, q_hi)])
    a, b = quantile_grid(lo[j], hi[j], g)[_draw_grid_index(keys[j], logits)]
    low[j], high[j] = min(a, b), max(a, b)
  return low, high
