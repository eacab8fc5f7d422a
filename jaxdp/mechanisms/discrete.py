"""Discrete Laplace and discrete Gaussian mechanisms on a public grid (the hardened path).

A float mechanism ``f(D) + noise`` releases a float whose low-order bits
depend on ``f(D)``: its set of possible outputs moves with the data, an
infinite privacy loss in principle (Mironov 2012, "On significance of the
least significant bits for differential privacy"; Jin et al. 2022, "Are we
there yet? Timing and floating-point attacks on differential privacy
systems"). The mechanisms here release values on the PUBLIC grid
``grid_step * Z`` instead, and draw integer noise with exact rejection
samplers in integer arithmetic (C. Canonne, G. Kamath, T. Steinke, "The
Discrete Gaussian for Differential Privacy", NeurIPS 2020, ``CKS`` below):

1. round the statistic to the grid: ``k = floor(f(D)/g + 1/2)`` per
   coordinate (an integer; ``g = grid_step``), clamped to ``|k| < 2^30`` (a
   1-Lipschitz map: it cannot increase the sensitivity);
2. add integer noise ``z`` (discrete Laplace or discrete Gaussian, in grid
   units);
3. return ``(k + z) * g``: a deterministic function of the integer
   ``k + z``, so the support is ``{fl(j g): j in Z}`` whatever the data.

Sensitivity after rounding (proved for the statistic, not per record). The
rounding ``x -> floor(x/g + 1/2)`` maps ``x`` into ``(x/g - 1/2, x/g + 1/2]``,
so for two values ``|x - y| = delta`` the rounded integers differ by an integer
``< delta/g + 1``, i.e. by at most ``ceil(delta/g)`` (and by 0 when
``delta = 0``; ties are broken upwards consistently, which round-half-even
would not: ``0.5 -> 0``, ``1.5 -> 2`` moves by 2 for ``delta = 1``). If at
most ``c`` coordinates change between neighbours (``max_changed_coordinates``,
default: all of them), summing over them gives, in grid units,

* ``K_1 = sum_i ceil(delta_i/g) <= ceil(Delta_1/g) + (c - 1)``
  (``ceil`` of a sum of ``c`` terms loses less than ``c - 1``), and
* ``K_2 = ||ceil(delta/g)||_2 <= Delta_2/g + sqrt(c)`` (``ceil(a) < a + 1`` and
  the triangle inequality), and ``<= ceil(Delta_2/g)`` when ``c = 1``.

For integer counts with ``g = 1`` and one changed coordinate this is exactly
``Delta``: the grid costs nothing. ``Delta/g`` is evaluated exactly
(``fractions.Fraction`` of the two floats). The division ``f(D)/g`` is
computed in floating point: exact for integer data and a power-of-two ``g``
(use one for a fully exact statement); for other steps a value within a
relative ``2^-24`` (float32) of a rounding boundary can round to either side,
which the bound above ignores.

Noise and guarantees (per release of a ``d``-vector, ``d`` independent draws):

* discrete Laplace ``P(z) ∝ exp(-|z|/b)`` (CKS Algorithm 2, with the
  ``Bernoulli(exp(-gamma))`` sampler of their Algorithm 1 and their
  geometric draw), with ``b = t/s >= K_1/eps`` a ratio of integers: the
  output pmfs on neighbours differ by a factor ``exp(sum_i |m_i|/b) <=
  exp(K_1/b) <= e^eps`` at every grid point (``m`` the shift of the rounded
  statistic), so the release is ``eps``-DP (``PureDpEvent``);
* discrete Gaussian ``P(z) ∝ exp(-z^2/(2 sigma^2))`` (CKS Algorithm 3),
  ``sigma^2 = n >= K_2^2/(2 rho)`` an integer: ``rho``-zCDP with
  ``rho = K_2^2/(2 sigma^2)`` (CKS Theorem 4, and their Theorem 14 for
  independent coordinates; ``ZCDpEvent``). For ``(eps, delta)`` convert with
  the accountant (Bun & Steinke 2016 Prop. 1.3, or CKS Theorem 7 / Corollary 9
  which is tighter: both are implied by zCDP accounting).

Exactness. Every draw uses 32-bit words and exact integer comparisons
(uniform integers by rejection, ``Bernoulli(a/b)`` as ``U_b < a``). Two
caps keep every integer inside int32/uint32 and are the only departures
from the exact laws: the geometric loop of Algorithm 2 stops after
``V_max = floor((2^30 - 1)/t) - 1`` steps (``V_max >= 1022`` for the scales
allowed here; reached with probability ``e^-V_max <= e^-1022 < 2^-1474``),
and the discrete Gaussian's acceptance exponent is capped at ``2^16`` when
``||z| - c| >= 2^16`` (changing an acceptance probability below
``e^-65536``). By the coupling argument of :mod:`jaxdp.mechanisms._sampling`
these make an ``eps``-DP release ``(eps, (1 + e^eps) d 2^-1474)``-DP, a
``delta`` smaller than any other effect in the library; we state it and do
not account it. Parameter ranges: the discrete Laplace scale must be below
``2^20`` grid units and the discrete Gaussian ``sigma^2`` at most ``2^15``
grid units squared (``sigma <= 181`` steps); a coarser ``grid_step`` fixes a
``ValueError`` (noise of more than a few hundred grid steps means the grid is
finer than the answer's accuracy anyway).

All samplers are jittable and vmappable over keys: each coordinate runs one
flat state machine over the steps of Algorithms 1-3 that reads one 32-bit
word per step from its own key's stream (expected ``O(1)`` steps, CKS Section
5); the coordinates are worked through as a queue by a fixed set of lanes
(see ``_run_queue``: every draw equals the one its own ``lax.while_loop``
returns); privacy parameters and ``grid_step`` are static. Uniform
integers in ``[0, m)`` are ``w mod m`` for a word ``w`` below the largest
multiple of ``m`` (a rejected word is redrawn), and ``Bernoulli(a/b)`` is
``U_b < a``: exact.
"""

from __future__ import annotations

import fractions
import functools
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry2x32_p as _threefry2x32_p

from jaxdp import _validation
from jaxdp.accounting import events as _events
from jaxdp.errors import ArgumentTypeError
from jaxdp.mechanisms import _common
from jaxdp.mechanisms import _sampling

_U32 = jnp.uint32
_ALL_ONES = np.uint32(0xFFFFFFFF)
MAX_LAPLACE_SCALE = 2**20  # grid units
MAX_GAUSSIAN_VARIANCE = 2**15  # grid units squared
_MAX_ABS_GRID_INDEX = 2**30 - 1
_EXPONENT_CAP = 2**16


# ------------------------------------------------------------------ random words
# Word i of a coordinate's stream is Threefry block (0, i) under the coordinate's
# key (or bits(fold_in(key, i)) for another PRNG), so draws are independent and the
# stream never repeats within a coordinate.


def _word(key: jax.Array, counter: jax.Array) -> tuple[jax.Array, jax.Array]:
  if key.dtype == _U32:  # raw Threefry key data (see _per_coordinate): one block per word
    w, _ = _threefry2x32_p.bind(key[0], key[1], _U32(0), counter)
    return w, counter + 1
  return jax.random.bits(jax.random.fold_in(key, counter), (), _U32), counter + 1


# ------------------------------------------------------------------ exact samplers as one flat loop
# CKS Algorithms 1-3 written as a state machine that draws exactly one 32-bit
# word per step. Nested while loops would be correct too, but under vmap every
# loop runs until its slowest lane finishes, so nested loops cost the PRODUCT
# of the per-level maxima; one flat loop costs the maximum over lanes of the
# total number of words a lane needs (a few tens for the scales allowed here).

_PROPOSE = 0  # draw U uniform in [0, t) (rejection: retry on a rejected word)
_ALG1_A = 1  # Algorithm 1, Bernoulli(a/b) half of Bernoulli(gamma/K) (uniform in [0, b))
_ALG1_B = 2  # Algorithm 1, Bernoulli(1/K) half (uniform in [0, K))
_SIGN = 3  # Algorithm 2 steps 6-8: Y = floor((U + t V)/s), the sign bit, reject -0
_DONE = 4

_RET_EXP_U = 0  # D = Bernoulli(exp(-U/t)) of Algorithm 2 step 2
_RET_GEOMETRIC = 1  # one Bernoulli(exp(-1)) of the geometric V (Algorithm 2 step 4)
_RET_WHOLE = 2  # one of the floor(gamma) Bernoulli(exp(-1)) of the discrete Gaussian's test
_RET_FRACTION = 3  # Bernoulli(exp(-frac(gamma))) of the discrete Gaussian's test


def _rejection_threshold(m):
  """Largest accepted word for a uniform integer in [0, m): 2^32 - 1 - (2^32 mod m) (uint32)."""
  return _U32(_ALL_ONES) - (_U32(0) - m) % m


def _select(pred, new, old):
  return {name: jnp.where(pred, new[name], old[name]) for name in old}


def _start_alg1(state, a, b, ret):
  return dict(state, phase=jnp.int32(_ALG1_A), a=jnp.asarray(a, _U32), b=jnp.asarray(b, _U32),
              k=_U32(1), ret=jnp.int32(ret))


def _machine(t: int, s: int, c_mid: Optional[int]):
  """The state machine of one exact draw: ``(init, step)``.

  Discrete Laplace of scale ``t/s`` (``c_mid`` None) or the discrete Gaussian
  of variance ``t c_mid`` (CKS Algorithm 3 with the Algorithm 2 proposal of
  scale ``t``, ``s = 1``). ``step(key, state)`` reads word ``state["counter"]``
  of the key's stream and advances one step; the draw is ``state["z"]`` (int32)
  once ``state["phase"] == _DONE``. A step on a finished state only advances
  the counter (no phase matches), so extra steps never change ``z``.
  """
  v_max = _MAX_ABS_GRID_INDEX // t - 1
  tt, ss = _U32(t), _U32(s)
  threshold_t = _rejection_threshold(tt)
  gaussian = c_mid is not None
  n2 = _U32(2 * t * c_mid) if gaussian else _U32(1)

  def after_alg1(state, result):
    """Algorithm 1 finished with ``result``: continue the caller named by ``ret``."""
    ret = state["ret"]
    # Algorithm 2 step 2: D = 0 restarts; D = 1 starts the geometric V at 0
    exp_u = _select(result, _start_alg1(dict(state, v=_U32(0)), 1, 1, _RET_GEOMETRIC),
                    dict(state, phase=jnp.int32(_PROPOSE)))
    # Algorithm 2 step 4: A = 1 counts (until the cap v_max), A = 0 stops
    v_next = state["v"] + 1
    more = _start_alg1(dict(state, v=v_next), 1, 1, _RET_GEOMETRIC)
    capped = dict(state, v=v_next, phase=jnp.int32(_SIGN))
    geometric = _select(result, _select(v_next < v_max, more, capped),
                        dict(state, phase=jnp.int32(_SIGN)))
    out = _select(ret == _RET_EXP_U, exp_u, geometric)
    if gaussian:
      # floor(gamma) Bernoulli(exp(-1)) then Bernoulli(exp(-frac)); any 0 rejects the proposal
      i_next = state["i"] + 1
      whole = _select(i_next < state["whole"],
                      _start_alg1(dict(state, i=i_next), 1, 1, _RET_WHOLE),
                      _start_alg1(dict(state, i=i_next), state["frac"], n2, _RET_FRACTION))
      whole = _select(result, whole, dict(state, phase=jnp.int32(_PROPOSE)))
      fraction = dict(state, phase=jnp.where(result, jnp.int32(_DONE), jnp.int32(_PROPOSE)))
      out = _select(ret == _RET_WHOLE, whole, out)
      out = _select(ret == _RET_FRACTION, fraction, out)
    return out

  def step(key, state):
    w, counter = _word(key, state["counter"])
    state = dict(state, counter=counter)
    phase = state["phase"]
    # _PROPOSE
    u = w % tt
    propose = _select(w <= threshold_t, _start_alg1(dict(state, u=u), u, tt, _RET_EXP_U), state)
    # _ALG1_A: Bernoulli(a/b); 0 ends Algorithm 1 with K
    b = state["b"]
    k_odd = (state["k"] & 1) == 1
    first = (w % b) < state["a"]
    alg1_a = _select(first, dict(state, phase=jnp.int32(_ALG1_B)), after_alg1(state, k_odd))
    alg1_a = _select(w <= _rejection_threshold(b), alg1_a, state)
    # _ALG1_B: Bernoulli(1/K); 1 increments K, 0 ends Algorithm 1 with K
    k = state["k"]
    second = (w % k) == 0
    alg1_b = _select(second, dict(state, k=k + 1, phase=jnp.int32(_ALG1_A)),
                     after_alg1(state, k_odd))
    alg1_b = _select(w <= _rejection_threshold(k), alg1_b, state)
    # _SIGN: Algorithm 2 steps 6-9
    y = (state["u"] + tt * state["v"]) // ss
    negative = (w & 1) == 1
    yi = y.astype(jnp.int32)
    z = jnp.where(negative, -yi, yi)
    drawn = dict(state, z=z, phase=jnp.int32(_DONE))
    if gaussian:
      # accept Y with probability exp(-(|Y| - c)^2/(2n)) = exp(-(whole + frac/(2n)))
      m = jnp.abs(jnp.abs(z) - c_mid).astype(_U32)
      small = m < _U32(_EXPONENT_CAP)
      sq = jnp.where(small, m, _U32(0)) ** 2
      whole_n = jnp.where(small, sq // n2, _U32(_EXPONENT_CAP))
      frac_n = jnp.where(small, sq % n2, _U32(0))
      drawn = dict(drawn, whole=whole_n, frac=frac_n, i=_U32(0))
      drawn = _select(whole_n > 0, _start_alg1(drawn, 1, 1, _RET_WHOLE),
                      _start_alg1(drawn, frac_n, n2, _RET_FRACTION))
    sign = _select(negative & (y == 0), dict(state, phase=jnp.int32(_PROPOSE)), drawn)
    out = state
    for code, candidate in ((_PROPOSE, propose), (_ALG1_A, alg1_a), (_ALG1_B, alg1_b),
                            (_SIGN, sign)):
      out = _select(phase == code, candidate, out)
    return out

  init = dict(phase=jnp.int32(_PROPOSE), counter=_U32(0), u=_U32(0), v=_U32(0), a=_U32(0),
              b=_U32(1), k=_U32(1), ret=jnp.int32(0), z=jnp.int32(0), whole=_U32(0),
              frac=_U32(0), i=_U32(0))
  return init, step


def _sampler_one(key, t: int, s: int, c_mid: Optional[int]):
  """One exact draw (see :func:`_machine`) by its own ``while_loop``, as int32.

  The reference semantics of :func:`_run_queue`, which returns the same
  integers for the same keys."""
  init, step = _machine(t, s, c_mid)
  final = jax.lax.while_loop(lambda st: st["phase"] != _DONE,
                             functools.partial(step, key), init)
  return final["z"]


# ------------------------------------------------------------------ many draws: a work queue
# Under vmap a while_loop runs every lane until the slowest of them finishes, so
# n draws cost n * (max steps over n lanes): the maximum of n geometric-tailed
# step counts grows like log n (for the discrete Gaussian at n = 10^5 it is
# several times the mean). Instead w <= n lanes (w = max(n/16, 256), at most n)
# work through the n coordinates as a queue: each iteration steps every lane
# once; a lane whose draw is done writes it to its coordinate's slot and
# restarts from the initial state on the next unstarted coordinate (its key
# gathered by index); lanes idle once the queue is empty. Each coordinate still
# reads its own stream word by word through the same state machine from the same
# initial state, only in another lane, so every draw is the integer
# _sampler_one returns for its key (tests/mechanisms/test_discrete_mechanisms.py
# checks equality): the law is unchanged. The cost is about n (mean steps) + w
# (max steps) lane-steps instead of n (max steps), and one copy of the step in
# the compiled program, as before.

_QUEUE_SHRINK = 16
_MIN_LANES = 256


def _run_queue(keys: jax.Array, t: int, s: int, c_mid: Optional[int]) -> jax.Array:
  """``_sampler_one(keys[i], t, s, c_mid)`` for every ``i`` (int32 of ``keys.shape[:1]``)."""
  init, step = _machine(t, s, c_mid)
  vstep = jax.vmap(step)
  n = keys.shape[0]
  w = min(n, max(_MIN_LANES, n // _QUEUE_SHRINK))
  fresh = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (w,)), init)

  def body(carry):
    state, idx, nxt, out = carry
    state = vstep(keys[jnp.minimum(idx, n - 1)], state)
    done = (state["phase"] == _DONE) & (idx < n)
    out = out.at[jnp.where(done, idx, n)].set(state["z"], mode="drop")
    new_idx = jnp.where(done, nxt + jnp.cumsum(done, dtype=jnp.int32) - 1, idx)  # int32 under x64 too
    refill = done & (new_idx < n)
    state = _select(refill, fresh, state)
    return state, new_idx, nxt + jnp.sum(done, dtype=jnp.int32), out

  carry = (fresh, jnp.arange(w, dtype=jnp.int32), jnp.int32(w), jnp.zeros((n,), jnp.int32))
  carry = jax.lax.while_loop(lambda c: jnp.any(c[0]["phase"] != _DONE), body, carry)
  return carry[3]


def _per_coordinate(key: jax.Array, shape: tuple[int, ...], t: int, s: int,
                    c_mid: Optional[int]) -> jax.Array:
  size = _common.shape_size(shape)
  keys = jax.random.split(key, max(size, 1))[:size]
  if _sampling._is_threefry_key(key):
    keys = (jax.random.key_data(keys) if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)
            else keys).astype(_U32)
  if size == 0:
    return jnp.zeros(shape, jnp.int32)
  return _run_queue(keys, t, s, c_mid).reshape(shape)


@functools.partial(jax.jit, static_argnames=("shape", "t", "s"))
def _laplace_draws(key, shape, t, s):
  return _per_coordinate(key, shape, t, s, None)


@functools.partial(jax.jit, static_argnames=("shape", "t", "c"))
def _gaussian_draws(key, shape, t, c):
  return _per_coordinate(key, shape, t, 1, c)


# ------------------------------------------------------------------ raw samplers


def _check_positive_int(value: Any, name: str, upper: int) -> int:
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise ArgumentTypeError(f"{name} must be a positive Python int, got {value!r}.")
  if not 1 <= int(value) <= upper:
    raise ValueError(f"{name} must satisfy 1 <= {name} <= {upper}, got {value!r}.")
  return int(value)


def discrete_laplace_noise(key: jax.Array, shape: _common.Shape, t: int, s: int = 1) -> jax.Array:
  """I.i.d. discrete Laplace integers, ``P(z) = (1 - q)/(1 + q) q^|z|``, ``q = exp(-s/t)`` (int32).

  Scale ``t/s`` (a ratio of static positive ints, ``t <= 2^20``, ``s <= 2^20``);
  CKS Algorithm 2 in exact integer arithmetic (see the module docstring for
  the ``e^-1022`` cap).
  """
  _common.check_key(key)
  t = _check_positive_int(t, "t", MAX_LAPLACE_SCALE)
  s = _check_positive_int(s, "s", MAX_LAPLACE_SCALE)
  shape = _common.normalize_shape(shape)
  return _laplace_draws(key, shape, t, s)


def discrete_gaussian_noise(key: jax.Array, shape: _common.Shape, t: int, c: int) -> jax.Array:
  """I.i.d. discrete Gaussian integers, ``P(z) ∝ exp(-z^2/(2 n))``, ``n = t c`` (int32).

  CKS Algorithm 3 with the proposal scale ``t`` and ``n/t = c`` (static
  positive ints, ``n <= 2^15``); expected ``O(1)`` proposals when
  ``t ≈ sqrt(n)``.
  """
  _common.check_key(key)
  t = _check_positive_int(t, "t", MAX_GAUSSIAN_VARIANCE)
  c = _check_positive_int(c, "c", MAX_GAUSSIAN_VARIANCE)
  if t * c > MAX_GAUSSIAN_VARIANCE:
    raise ValueError(f"t * c (the variance n) must be <= {MAX_GAUSSIAN_VARIANCE}, got {t * c}.")
  shape = _common.normalize_shape(shape)
  return _gaussian_draws(key, shape, t, c)


# ------------------------------------------------------------------ calibration (public parameters)


def _grid_units(sensitivity: float, grid_step: float) -> fractions.Fraction:
  return fractions.Fraction(float(sensitivity)) / fractions.Fraction(float(grid_step))


def _check_grid_step(grid_step: Any) -> float:
  _common.require_static(grid_step, "grid_step")
  return _validation.check_positive(grid_step, "grid_step")


def _check_changed(max_changed: Any, size: int) -> int:
  if max_changed is None:
    return max(size, 1)
  return _check_positive_int(max_changed, "max_changed_coordinates", 2**31 - 1)


def rounded_l1_sensitivity(l1_sensitivity: float, grid_step: float, changed: int = 1) -> int:
  """``K_1 = ceil(Delta_1/g) + (changed - 1)``: L1 sensitivity of the rounded statistic in grid units."""
  sens = _validation.check_positive(l1_sensitivity, "l1_sensitivity")
  g = _check_grid_step(grid_step)
  return math.ceil(_grid_units(sens, g)) + (changed - 1)


def rounded_l2_sensitivity(l2_sensitivity: float, grid_step: float, changed: int = 1) -> float:
  """``K_2``: ``ceil(Delta_2/g)`` for one changed coordinate, else ``Delta_2/g + sqrt(changed)``."""
  sens = _validation.check_positive(l2_sensitivity, "l2_sensitivity")
  g = _check_grid_step(grid_step)
  units = _grid_units(sens, g)
  if changed == 1:
    return float(math.ceil(units))
  # two float roundings (units, sqrt) and the sum: a relative 2^-50 covers them, upwards
  return (float(units) + math.sqrt(changed)) * (1.0 + 2.0**-50)


def discrete_laplace_scale(l1_sensitivity: float, epsilon: float, grid_step: float,
                           changed: int = 1) -> tuple[int, int]:
  """``(t, s)`` with ``t/s >= K_1/eps`` (grid units), ``s`` the largest power of two ``<= 2^20`` keeping ``t <= 2^20``.

  The discrete Laplace of scale ``b = t/s`` is ``K_1/b <= eps``-DP on the
  rounded statistic (module docstring); ``t/s`` exceeds ``K_1/eps`` by a
  relative ``< 1/t``.

  Raises:
    ValueError: for parameters out of range, or when ``K_1/eps >= 2^20`` grid
      units (use a coarser ``grid_step``).
  """
  _common.require_static(epsilon, "epsilon")
  _common.require_static(l1_sensitivity, "l1_sensitivity")
  eps = _validation.check_epsilon(epsilon, "epsilon")
  k1 = rounded_l1_sensitivity(l1_sensitivity, grid_step, changed)
  target = fractions.Fraction(k1) / fractions.Fraction(eps)
  if target >= MAX_LAPLACE_SCALE:
    raise ValueError(
        f"grid_step is too fine for the discrete Laplace: the noise scale would be "
        f"{float(target):.4g} grid steps, above the supported {MAX_LAPLACE_SCALE}; "
        f"use grid_step >= {float(grid_step) * float(target) / MAX_LAPLACE_SCALE:.4g}.")
  s = 1
  while 2 * s <= MAX_LAPLACE_SCALE and math.ceil(target * 2 * s) <= MAX_LAPLACE_SCALE:
    s *= 2
  t = max(1, math.ceil(target * s))
  return t, s


def discrete_gaussian_variance(l2_sensitivity: float, rho: float, grid_step: float,
                               changed: int = 1) -> tuple[int, int]:
  """``(t, c)`` with ``n = t c >= K_2^2/(2 rho)`` (grid units squared), ``t`` near ``sigma``.

  Among ``t`` in ``[sigma/2, 2 sigma + 1]`` picks the smallest ``n = t ceil(sigma^2/t)``
  (ties: ``t`` nearest ``sigma``, the proposal scale with the fewest expected rejections);
  the discrete Gaussian of variance parameter ``n`` is ``K_2^2/(2n) <= rho``-zCDP
  (CKS Theorem 4).

  Raises:
    ValueError: for parameters out of range, or when ``n`` would exceed
      ``2^15`` (``sigma > 181`` grid steps: use a coarser ``grid_step``).
  """
  _common.require_static(rho, "rho")
  _common.require_static(l2_sensitivity, "l2_sensitivity")
  r = _validation.check_positive(rho, "rho")
  k2 = rounded_l2_sensitivity(l2_sensitivity, grid_step, changed)
  target = fractions.Fraction(k2) ** 2 / (2 * fractions.Fraction(r))  # sigma^2 in grid units^2
  if target > MAX_GAUSSIAN_VARIANCE:
    raise ValueError(
        f"grid_step is too fine for the discrete Gaussian: sigma would be "
        f"{math.sqrt(target):.4g} grid steps, above the supported "
        f"{math.sqrt(MAX_GAUSSIAN_VARIANCE):.4g}; use grid_step >= "
        f"{float(grid_step) * math.sqrt(target / MAX_GAUSSIAN_VARIANCE):.4g}.")
  sigma = math.sqrt(target)
  best = None
  for t in range(max(1, int(sigma // 2)), int(2 * sigma) + 2):
    c = max(1, math.ceil(target / t))
    # smallest variance n = t c; among equal n, t nearest sigma (fewest expected proposals)
    if best is None or (t * c, abs(t - sigma)) < (best[0] * best[1], abs(best[0] - sigma)):
      best = (t, c)
  t, c = best
  if t * c > MAX_GAUSSIAN_VARIANCE:
    raise ValueError(f"grid_step is too fine for the discrete Gaussian (variance {t * c} grid "
                     f"units squared > {MAX_GAUSSIAN_VARIANCE}); use a coarser grid_step.")
  return t, c


# ------------------------------------------------------------------ mechanisms


def _grid_index(value: jax.Array, grid_step: float) -> jax.Array:
  """``floor(v + 1/2)`` for ``v = value/g``, clamped to ``|k| <= 2^30 - 64`` (1-Lipschitz), int32.

  Computed as ``floor(v) + [v - floor(v) >= 1/2]`` (``v - floor(v)`` is exact
  in floating point): ``fl(v + 0.5)`` would round to even for ``|v| >= 2^23``
  in float32 and move a neighbour by two grid steps.
  """
  dtype = _common.float_dtype_of(value)
  v = jnp.nan_to_num(value.astype(dtype) / jnp.asarray(grid_step, dtype))
  low = jnp.floor(v)
  k = low + jnp.where(v - low >= 0.5, 1.0, 0.0).astype(dtype)
  bound = float(_MAX_ABS_GRID_INDEX - 63)  # 2^30 - 64 is a float32
  return jnp.clip(k, -bound, bound).astype(jnp.int32)


def _release_on_grid(value: jax.Array, noise: jax.Array, grid_step: float) -> jax.Array:
  dtype = _common.float_dtype_of(value)
  index = _grid_index(value, grid_step) + noise  # |.| <= 2^31 - 1: no overflow
  out = index.astype(dtype) * jnp.asarray(grid_step, dtype)
  return _common.poison_nonfinite(value, out)


def discrete_laplace_mechanism(key: jax.Array, value: Any, l1_sensitivity: float, epsilon: float,
                               grid_step: float, *,
                               max_changed_coordinates: Optional[int] = None) -> jax.Array:
  """Releases ``(round(value/g) + z) g`` with discrete Laplace ``z``: ``eps``-DP on the grid ``g Z``.

  CKS 2020 Algorithm 2 noise of scale ``t/s >= K_1/eps`` grid units, where
  ``K_1 = ceil(Delta_1/g) + (c - 1)`` bounds the L1 sensitivity of the rounded
  statistic (``c = max_changed_coordinates``, default ``value.size``; pass 1
  for a histogram under add/remove). The pmf ratio on neighbours is at most
  ``exp(K_1 s/t) <= e^eps`` at every grid point, so the release is
  ``eps``-DP with a data-independent support (module docstring; spend
  :func:`discrete_laplace_mechanism_event`).

  Args:
    key: a ``jax.random`` key, used once.
    value: the exact answer ``f(D)`` (any shape). Concrete NaN/inf raise
      ``ValueError``; a traced non-finite value gives an all-NaN output.
    l1_sensitivity: ``Delta_1 > 0`` of ``f`` (before rounding).
    epsilon: in (0, inf).
    grid_step: the public grid step ``g > 0`` of the output.
    max_changed_coordinates: at most this many coordinates of ``f`` change
      between neighbours (a privacy claim, like the sensitivity).

  Returns:
    A float array of ``value``'s shape whose entries are ``j * grid_step``
    for integers ``j``.
  """
  _common.check_key(key)
  _common.check_data(value, "value")
  value = jnp.asarray(value)
  changed = _check_changed(max_changed_coordinates, value.size)
  t, s = discrete_laplace_scale(l1_sensitivity, epsilon, grid_step, changed)
  noise = discrete_laplace_noise(key, value.shape, t, s)
  return _release_on_grid(value, noise, float(grid_step))


def discrete_laplace_mechanism_event(l1_sensitivity: float, epsilon: float, grid_step: float, *,
                                     max_changed_coordinates: int = 1,
                                     neighbouring: str = "add_remove",
                                     unit: str = "example") -> _events.PureDpEvent:
  """DpEvent of :func:`discrete_laplace_mechanism`: ``PureDpEvent(epsilon)``.

  Validates the parameters the mechanism would use (pass the same
  ``max_changed_coordinates``; the event does not depend on it).
  """
  changed = _check_changed(max_changed_coordinates, 1)
  discrete_laplace_scale(l1_sensitivity, epsilon, grid_step, changed)
  return _events.PureDpEvent(float(epsilon), neighbouring=neighbouring, unit=unit)


def discrete_gaussian_mechanism(key: jax.Array, value: Any, l2_sensitivity: float, rho: float,
                                grid_step: float, *,
                                max_changed_coordinates: Optional[int] = None) -> jax.Array:
  """Releases ``(round(value/g) + z) g`` with discrete Gaussian ``z``: ``rho``-zCDP on the grid ``g Z``.

  CKS 2020 Algorithm 3 noise with variance parameter ``n >= K_2^2/(2 rho)``
  (grid units squared), ``K_2`` the L2 sensitivity of the rounded statistic
  (module docstring): ``K_2^2/(2n) <= rho``-zCDP by CKS Theorem 4 (Theorem 14
  for the independent coordinates). Spend
  :func:`discrete_gaussian_mechanism_event`; for ``(eps, delta)`` convert the
  zCDP guarantee with the accountant.

  Args: as :func:`discrete_laplace_mechanism`, with ``l2_sensitivity`` and
    ``rho > 0`` instead of ``l1_sensitivity`` and ``epsilon``.
  """
  _common.check_key(key)
  _common.check_data(value, "value")
  value = jnp.asarray(value)
  changed = _check_changed(max_changed_coordinates, value.size)
  t, c = discrete_gaussian_variance(l2_sensitivity, rho, grid_step, changed)
  noise = discrete_gaussian_noise(key, value.shape, t, c)
  return _release_on_grid(value, noise, float(grid_step))


def discrete_gaussian_mechanism_event(l2_sensitivity: float, rho: float, grid_step: float, *,
                                      max_changed_coordinates: int = 1,
                                      neighbouring: str = "add_remove",
                                      unit: str = "example") -> _events.ZCDpEvent:
  """DpEvent of :func:`discrete_gaussian_mechanism`: ``ZCDpEvent(rho)``."""
  changed = _check_changed(max_changed_coordinates, 1)
  discrete_gaussian_variance(l2_sensitivity, rho, grid_step, changed)
  return _events.ZCDpEvent(float(rho), neighbouring=neighbouring, unit=unit)
