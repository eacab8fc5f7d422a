r"""Private quantiles: an explicit, budgeted way to choose the bounds the models need.

Smith (2011), "Privacy-preserving statistical estimation with optimal
convergence rates", Sec. 3 (the exponential mechanism of McSherry & Talwar
over a continuous range). Given a public search range ``[a, b]`` and data
clipped to it, sort ``a = z_0 <= z_1 <= ... <= z_n <= z_{n+1} = b``. Every
output ``o`` in the interval ``[z_i, z_{i+1})`` has rank ``i`` (points below
it) and utility ``u(o) = -|i - q n|``. The mechanism samples ``o`` with density
``∝ exp(beta u(o))`` on ``[a, b]``: pick interval ``i`` with probability
``∝ (z_{i+1} - z_i) exp(beta u_i)`` (Gumbel-max over
``beta u_i + log(z_{i+1} - z_i)``, :func:`jaxdp.mechanisms.gumbel_max`), then a
uniform point in it.

Sensitivity of the utility is ``Delta = 1`` under both relations: replacing a
record moves each rank by at most 1 (``n`` is fixed); adding one moves a rank
by 0 or 1 and ``q n`` by ``q``, so ``|u - u'| <= max(q, 1 - q) <= 1``. The
exponential mechanism is then ``2 beta Delta``-DP (McSherry & Talwar 2007,
Thm. 6), so ``beta = epsilon / 2``; the event is
:func:`jaxdp.mechanisms.exponential_mechanism_event` (``beta``, ``Delta = 1``).

Clipping to the search range is part of the mechanism (a per-record map), not
a data-dependent choice.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.classic import _common
from jaxdp.mechanisms import exponential_mechanism_event
from jaxdp.mechanisms import gumbel_max


@functools.partial(jax.jit, static_argnames=())
def _quantile_core(key, x, q, lower, upper, beta):
  """One exponential-mechanism quantile draw (traced; arguments validated by the caller)."""
  n = x.shape[0]
  z = jnp.sort(jnp.clip(x, lower, upper))
  edges = jnp.concatenate([jnp.full((1,), lower, x.dtype), z, jnp.full((1,), upper, x.dtype)])
  lengths = edges[1:] - edges[:-1]                                 # (n + 1,)
  ranks = jnp.arange(n + 1, dtype=x.dtype)
  utility = -jnp.abs(ranks - q * n)
  logits = beta * utility + jnp.where(lengths > 0, jnp.log(jnp.maximum(lengths, 1e-300)), -jnp.inf)
  k_pick, k_unif = jax.random.split(key)
  i = gumbel_max(k_pick, logits)
  u = jax.random.uniform(k_unif, (), dtype=x.dtype)
  return edges[i] + u * lengths[i]


def quantile_event(epsilon: float, *, neighbouring: str = "replace_one",
                   count: int = 1) -> events.DpEvent:
  """The event of ``count`` quantile draws at ``epsilon`` each (``beta = epsilon/2``, ``Delta = 1``)."""
  eps = _validation.check_epsilon(epsilon, "epsilon")
  ev = exponential_mechanism_event(eps / 2.0, 1.0, neighbouring=_common.check_relation(neighbouring))
  count = _validation.check_positive_int(count, "count")
  return ev if count == 1 else events.SelfComposedDpEvent(ev, count)


def private_quantile(key: jax.Array, x: Any, q: float, *, lower: float, upper: float,
                     epsilon: float, neighbouring: str = "replace_one",
                     accountant: Any = None) -> float:
  """An ``epsilon``-DP estimate of the ``q``-quantile of ``x`` within ``[lower, upper]``.

  Args:
    key: a ``jax.random`` key, used once.
    x: 1-D finite data (values outside ``[lower, upper]`` are clipped, as the
      mechanism defines).
    q: quantile level in [0, 1].
    lower, upper: the PUBLIC search range, ``lower < upper``.
    epsilon: privacy parameter in (0, inf).
    neighbouring: relation written in the event (``Delta = 1`` for both).
    accountant: optional accountant/budget; the event is spent before release.

  Returns:
    The private quantile as a float.
  """
  _validation.check_key(key)
  arr = _validation.check_finite_array(x, "x").astype(np.float64)
  if arr.ndim != 1 or arr.size == 0:
    raise ValueError(f"x must be a non-empty 1-D array, got shape {arr.shape}.")
  q = _validation._as_float(q, "q")
  if not 0.0 <= q <= 1.0:
    raise ValueError(f"q must lie in [0, 1], got {q!r}.")
  lo, hi = _common.check_bounds(lower, upper, 1, "quantile range")
  eps = _validation.check_epsilon(epsilon, "epsilon")
  _common.spend(accountant, quantile_event(eps, neighbouring=neighbouring))
  out = _quantile_core(key, jnp.asarray(arr, jnp.float32), jnp.float32(q),
                       jnp.float32(lo[0]), jnp.float32(hi[0]), jnp.float32(eps / 2.0))
  return float(out)


def private_bounds(key: jax.Array, x: Any, *, lower: Any, upper: Any, epsilon: float,
                   quantiles: tuple[float, float] = (0.01, 0.99),
                   neighbouring: str = "replace_one",
                   accountant: Any = None) -> tuple[np.ndarray, np.ndarray]:
  """Per-feature private bounds: the ``quantiles`` of every column of ``x``.

  ``2 d`` quantile draws, each at ``epsilon / (2 d)``: every record takes part
  in all of them, so by basic composition (Dwork & Roth Thm. 3.16) the total is
  ``epsilon``-DP. The returned lower bound is ``<=`` the upper one (sorted).

  Args:
    key: a ``jax.random`` key, used once (split per draw).
    x: ``(n, d)`` finite data.
    lower, upper: public search ranges (scalars or shape ``(d,)``).
    epsilon: total privacy parameter of the ``2 d`` draws.
    quantiles: the two quantile levels.
    neighbouring: relation written in the events.
    accountant: optional accountant/budget, spent before release.

  Returns:
    ``(low, high)`` arrays of shape ``(d,)``.
  """
  _validation.check_key(key)
  arr = _validation.check_finite_array(x, "x").astype(np.float64)
  if arr.ndim != 2 or arr.shape[0] == 0:
    raise ValueError(f"x must be a non-empty 2-D array, got shape {arr.shape}.")
  d = arr.shape[1]
  lo, hi = _common.check_bounds(lower, upper, d, "search range")
  eps = _validation.check_epsilon(epsilon, "epsilon")
  q_lo, q_hi = (float(v) for v in quantiles)
  if not 0.0 <= q_lo <= q_hi <= 1.0:
    raise ValueError(f"quantiles must satisfy 0 <= low <= high <= 1, got {quantiles!r}.")
  eps_each = eps / (2 * d)
  _common.spend(accountant, quantile_event(eps_each, neighbouring=neighbouring, count=2 * d))
  keys = jax.random.split(key, 2 * d).reshape(2, d)
  xt = jnp.asarray(arr.T, jnp.float32)
  draw = jax.vmap(_quantile_core, in_axes=(0, 0, None, 0, 0, None))
  a = np.asarray(draw(keys[0], xt, jnp.float32(q_lo), jnp.asarray(lo, jnp.float32),
                      jnp.asarray(hi, jnp.float32), jnp.float32(eps_each / 2.0)), np.float64)
  b = np.asarray(draw(keys[1], xt, jnp.float32(q_hi), jnp.asarray(lo, jnp.float32),
                      jnp.asarray(hi, jnp.float32), jnp.float32(eps_each / 2.0)), np.float64)
  return np.minimum(a, b), np.maximum(a, b)
