"""Adaptive clipping: clip to a privately estimated quantile of the gradient norms.

Andrew, Thakkar, McMahan & Ramaswamy 2021, "Differentially private learning
with adaptive clipping" (NeurIPS), Algorithm 1 and Theorem 1. A fixed clip
norm C must be tuned: too small biases every step, too large drowns the
gradient in noise ``sigma C / (q N)``. Adaptive clipping instead tracks the
gamma-quantile of the per-example gradient norms, privately, at a negligible
privacy cost, and clips to it.

Step t, with clip norm C_t (public: a function of earlier noisy releases only):

1. Gradients in NORMALISED space. Every per-example gradient is clipped to
   C_t and divided by C_t, ``gbar_i = (g_i / C_t) min(1, C_t / ||g_i||)``,
   so the sum ``sum_i gbar_i`` has L2 sensitivity 1 whatever C_t is (add or
   remove one example moves it by one vector of norm <= 1). The clip comes
   first (:func:`adaptive_clipped_grad`; ``g_i / C_t`` is never formed for an
   unclipped ``g_i``, which could overflow for a small C_t), every clipping
   method supports it, and a non-finite ``g_i`` contributes zero
   (:mod:`jaxdp.dpsgd.clipping`).
2. The noise transform given as ``inner`` (``noisy_aggregate`` for DP-SGD, or
   a correlated-noise transform) adds Gaussian noise of std ``sigma_Delta``
   (sensitivity 1) to that sum and divides by the expected batch size ``q N``;
   the result is multiplied by C_t (post-processing), so the released update is
   ``C_t (sum_i gbar_i + z) / (q N)``: the usual DP-SGD update at clip norm
   C_t with noise std ``sigma_Delta C_t`` on the sum.
3. The unclipped indicator ``b_i = 1[||g_i|| <= C_t]`` is released as a noisy
   count of the CENTERED indicators, ``sum_i (b_i - 1/2) + N(0, sigma_b^2)``:
   one example adds ``+1/2`` or ``-1/2``, so the sensitivity is 1/2 (Andrew
   et al.'s centring, which halves the sensitivity of ``sum_i b_i``; it is
   where the ``2 sigma_b`` of their Theorem 1 comes from).
   ``btilde = (noisy + qN/2) / (qN)`` estimates the fraction
   of unclipped examples (``qN`` is the public expected batch size, never the
   realised one), and the clip norm moves geometrically towards the target
   quantile gamma (Andrew et al., Algorithm 1, geometric update):

     C_{t+1} = C_t exp(-eta_C (btilde - gamma)).

   If more than gamma of the examples are unclipped, C shrinks; if fewer, it
   grows; the fixed point is ``P(||g|| <= C) = gamma``. C is clamped to the
   config's public floor and ceiling (:class:`AdaptiveClipNorm`;
   post-processing, no privacy cost).

Closed loop (why C can run away, with DP-SGD or correlated noise). The noise
on the update is proportional to C_t, and for many models (an MLP without
normalisation) the per-example gradient norms grow with the parameter norm,
which the noise inflates: a C_t that starts below the gradient norms climbs,
adds noise, inflates the norms it tracks, and climbs further. On digits (MLP
64-64-10, q N = 64, 118 steps, eps = 2, SGD 0.1 with momentum 0.9) C went
0.1 -> 48 with BandMF-4 (accuracy 0.43; fixed C = 1: 0.875) and 0.1 -> 10.5
with DP-SGD. The matrix mechanism's cancellation itself is NOT broken by a
clip norm that drifts or jitters as adaptive clipping's does: for this run's
strategy the parameter noise ``||A D C^{-1}||`` (D = diag(C_t)) stays 0.89 of
DP-SGD's for a constant, a 400x geometric, or a 1.6%/step random-walk D
(only an i.i.d. 20% per-step jitter, far from what the geometric update
produces, raises it to 1.6x). A ceiling near the fixed clip norm one would
use removes the runaway: ``max_clip_norm=1.0`` gave 0.872 for BandMF-4 +
adaptive (C ended at 0.83, tracking the median below the ceiling).

Privacy (Andrew et al. 2021, Theorem 1): one step releases two Gaussians,
``(sum gbar + N(0, sigma_Delta^2 I), sum (b - 1/2) + N(0, sigma_b^2))``,
whose sensitivities are 1 and 1/2. Dividing the second by ``sigma_b /
sigma_Delta`` (whitening; invertible, so it changes no privacy curve) gives ONE
isotropic Gaussian of std sigma_Delta whose sensitivity is
``sqrt(1 + (sigma_Delta / (2 sigma_b))^2)``, i.e. the Gaussian mechanism
with noise multiplier

  sigma = (sigma_Delta^-2 + (2 sigma_b)^-2)^-1/2.

Every accountant for Gaussian noise (Poisson subsampling included, which only
sees the whitened shift of the one example that is added or removed) applies
unchanged with this sigma, so an accountant calibrated for sigma pays for
adaptive clipping when the gradient uses :func:`gradient_noise_multiplier`
``(sigma, sigma_b)``. Replace-one neighbours double both sensitivities (2 and
1): the same ratio, the same formula. C_t is chosen from earlier releases only,
so the steps compose adaptively, as the accountant assumes.

Defaults: the settings Andrew et al. 2021 recommend for every task (their
experiments; repeated in the documentation of TensorFlow Privacy's
``QuantileAdaptiveClipSumQuery`` and of Flower's adaptive-clipping
strategies): target quantile gamma = 0.5 (the median), learning rate
eta_C = 0.2 with the geometric update, initial clip norm C_0 = 0.1, count
noise ``sigma_b = expected_batch_size / 20``. With
``sigma_b = qN/20`` the count costs almost nothing: at ``qN = 256`` and
sigma = 1, ``sigma_Delta = 1.00076``.

Custom loop (DP-SGD with adaptive clipping; each step's mask is a Poisson
sample of rate q, and ``dpsgd_epsilon(1.0, q, T, delta)`` is its guarantee):

>>> import jax, jax.numpy as jnp, optax
>>> from jaxdp.dpsgd import adaptive_clipping as ac
>>> n, q = 512, 0.125
>>> x = jax.random.normal(jax.random.key(0), (n, 3))
>>> y = x @ jnp.array([1.0, -2.0, 0.5]) + 0.3 * jax.random.normal(jax.random.key(1), (n,))
>>> loss = lambda w, xi, yi: 0.5 * (jnp.dot(w, xi) - yi) ** 2
>>> tx = optax.chain(
...     ac.adaptive_noisy_aggregate(ac.AdaptiveClipNorm(initial=0.1), noise_multiplier=1.0,
...                                 expected_batch_size=q * n, key=jax.random.key(2)),
...     optax.sgd(0.5))
>>> @jax.jit
... def step(w, state, key):
...   mask = jax.random.bernoulli(key, q, (n,))   # Poisson sample of rate q
...   grad_fn = ac.adaptive_clipped_grad(loss, ac.current_clip_norm(state),
...                                      batch_argnums=(1, 2))
...   g, info = grad_fn(w, x, y, mask=mask)
...   count = ac.centered_unclipped_count(info.num_examples, info.num_clipped)
...   updates, state = tx.update((g, count), state, w)
...   return optax.apply_updates(w, updates), state
>>> w = jnp.zeros(3)
>>> state = tx.init(w)
>>> for key in jax.random.split(jax.random.key(3), 100):
...   w, state = step(w, state, key)
>>> int(state[0].count)
100
>>> bool(jnp.mean((x @ w - y) ** 2) < 0.15)   # the noise level 0.3^2 = 0.09
True

The clip norm has moved from 0.1 to about the median of the per-example
gradient norms ``|w.x_i - y_i| ||x_i||`` at the trained w:

>>> norms = jnp.abs(x @ w - y) * jnp.linalg.norm(x, axis=1)
>>> bool(abs(jnp.mean(norms <= ac.current_clip_norm(state)) - 0.5) < 0.15)
True
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validation
from jaxdp import mechanisms
from jaxdp.dpsgd import clipping, transforms

PyTree = Any

# Relative margin added to sigma_Delta so that rounding in the float64 formula can
# only ADD noise (the joint multiplier is then >= the one calibrated, never below).
_NOISE_MARGIN = 1e-12
# Default count noise: sigma_b = expected_batch_size / _DEFAULT_COUNT_DIVISOR
# (Andrew et al. 2021's recommendation).
_DEFAULT_COUNT_DIVISOR = 20.0


_F32 = np.finfo(np.float32)
# Default floor and ceiling of the clip norm, relative to the initial one (clamped to
# [_BOUND_LIMIT_LO, _BOUND_LIMIT_HI]); see AdaptiveClipNorm.
_DEFAULT_RANGE = 1e6
_BOUND_LIMIT_LO, _BOUND_LIMIT_HI = 1e-30, 1e30


def _check_normal_float32(value: Any, name: str) -> float:
  """A positive finite float whose float32 rounding is a positive finite NORMAL float32.

  ``1e-50`` (0 in float32), ``1e-40`` (subnormal, flushed to 0 on most
  accelerators) and ``1e39`` (inf in float32) are refused: the clip norm is
  stored, multiplied and inverted in float32.
  """
  v = _validation.check_positive(value, name)
  with np.errstate(over="ignore", under="ignore"):
    f = float(np.float32(v))
  if not (float(_F32.tiny) <= f < math.inf):
    raise ValueError(f"{name} must be representable as a positive finite normal float32 (in "
                     f"[{float(_F32.tiny):.4g}, {float(_F32.max):.4g}]), got {v!r} (float32: "
                     f"{f!r}).")
  return v


@dataclasses.dataclass(frozen=True)
class AdaptiveClipNorm:
  """Configuration of adaptive clipping (Andrew et al. 2021, Algorithm 1).

  Attributes:
    initial: clip norm C_0 > 0 of the first step (Andrew et al. use 0.1; any
      value works, the clip norm moves by a factor up to ``exp(learning_rate)``
      per step, so start within a few e-folds of the target). It must be a
      positive normal float32 (``ValueError`` otherwise, e.g. for ``1e-50``,
      which is 0 in float32, or ``1e39``, which is inf).
    target_quantile: gamma in (0, 1), the fraction of per-example gradients
      that should be UNCLIPPED (0.5: clip to the median norm, the paper's
      recommendation).
    learning_rate: eta_C > 0 of the geometric update
      ``C <- C exp(-eta_C (btilde - gamma))`` (0.2 recommended).
    count_noise_multiplier: sigma_b > 0, the std of the Gaussian added to the
      centered unclipped count (sensitivity 1/2), or ``None`` for Andrew et
      al.'s ``expected_batch_size / 20`` (:meth:`resolved_count_noise_multiplier`).
    min_clip_norm: floor of the clip norm, or ``None`` for ``initial * 1e-6``
      (at least 1e-30). A positive normal float32 ``<= initial``.
    max_clip_norm: ceiling of the clip norm, or ``None`` for ``initial * 1e6``
      (at most 1e30). A positive normal float32 ``>= initial``.

  Floor and ceiling. The geometric update has no fixed point when more than
  gamma of the gradients are exactly zero (a fitted model, a dead layer): C
  shrinks by ``exp(-eta_C gamma')`` per step for ever and reaches 0 (or, when
  the counts say "clipped" for ever, inf) in float32 after some hundred
  steps, after which ``1/C`` and the clipped sum are inf/NaN. The update is
  therefore ``C_{t+1} = clip(C_t exp(-eta_C (btilde - gamma)), min_clip_norm,
  max_clip_norm)``. The bounds are public constants fixed before training
  (from ``initial`` only, never from data), so the clamp is post-processing
  of the noisy count and changes no privacy guarantee. Default range: a
  factor 1e6 either side of C_0 -- wider than the range of clip norms seen
  in Andrew et al. 2021 (a few orders of magnitude from C_0 = 0.1), so it
  does not bind in ordinary training, it keeps ``1/C`` and ``C * noise``
  far inside float32, and a clip norm stuck at a bound recovers in at most
  ``ln(1e6) / (eta_C min(gamma, 1 - gamma))`` steps (138 at the defaults) of
  counts that say so. Relative (not absolute) because the scale of gradient
  norms is the loss's (a loss measured in other units moves every norm).
  """

  initial: float
  target_quantile: float = 0.5
  learning_rate: float = 0.2
  count_noise_multiplier: float | None = None
  min_clip_norm: float | None = None
  max_clip_norm: float | None = None

  def __post_init__(self):
    c0 = _check_normal_float32(self.initial, "AdaptiveClipNorm.initial")
    gamma = _validation._as_float(  # pylint: disable=protected-access
        self.target_quantile, "AdaptiveClipNorm.target_quantile")
    if not 0.0 < gamma < 1.0:
      raise ValueError(f"AdaptiveClipNorm.target_quantile must be in (0, 1) (the fraction of "
                       f"unclipped examples), got {gamma}.")
    _validation.check_positive(self.learning_rate, "AdaptiveClipNorm.learning_rate")
    if self.count_noise_multiplier is not None:
      _validation.check_positive(self.count_noise_multiplier,
                                 "AdaptiveClipNorm.count_noise_multiplier")
    if self.min_clip_norm is not None:
      lo = _check_normal_float32(self.min_clip_norm, "AdaptiveClipNorm.min_clip_norm")
      if np.float32(lo) > np.float32(c0):
        raise ValueError(f"AdaptiveClipNorm.min_clip_norm={lo} must be <= initial={c0}.")
    if self.max_clip_norm is not None:
      hi = _check_normal_float32(self.max_clip_norm, "AdaptiveClipNorm.max_clip_norm")
      if np.float32(hi) < np.float32(c0):
        raise ValueError(f"AdaptiveClipNorm.max_clip_norm={hi} must be >= initial={c0}.")

  def clip_norm_bounds(self) -> tuple[float, float]:
    """``(floor, ceiling)`` of the clip norm as float32 values (class docstring).

    >>> AdaptiveClipNorm(initial=0.5).clip_norm_bounds() == (
    ...     float(np.float32(5e-7)), float(np.float32(5e5)))
    True
    """
    c0 = float(self.initial)
    lo = (max(c0 / _DEFAULT_RANGE, min(_BOUND_LIMIT_LO, c0)) if self.min_clip_norm is None
          else float(self.min_clip_norm))
    hi = (min(c0 * _DEFAULT_RANGE, max(_BOUND_LIMIT_HI, c0)) if self.max_clip_norm is None
          else float(self.max_clip_norm))
    lo = max(float(np.float32(lo)), float(_F32.tiny))
    return lo, float(np.float32(hi))

  def resolved_count_noise_multiplier(self, expected_batch_size: float,
                                      num_groups: int = 1) -> float:
    """sigma_b: the configured value, or ``sqrt(G) expected_batch_size / 20`` when it is ``None``.

    ``num_groups`` G: one count per clip group (:func:`per_layer_adaptive_clip_noise`);
    the ``sqrt(G)`` keeps the G counts' share of the budget, ``G / (2 sigma_b)^2``,
    equal to that of Andrew et al.'s single count.

    >>> AdaptiveClipNorm(initial=0.1).resolved_count_noise_multiplier(256)
    12.8
    """
    qn = _validation.check_positive(expected_batch_size, "expected_batch_size")
    g = _validation.check_positive_int(num_groups, "num_groups")
    if self.count_noise_multiplier is not None:
      return float(self.count_noise_multiplier)
    return math.sqrt(g) * qn / _DEFAULT_COUNT_DIVISOR


def joint_noise_multiplier(gradient_noise_multiplier: float, count_noise_multiplier: float, *,
                           participations: int = 1) -> float:
  """The single Gaussian multiplier equivalent to gradient and count noise together.

  ``(sigma_Delta^-2 + k (2 sigma_b)^-2)^-1/2`` (Andrew et al. 2021, Theorem 1
  for k = 1; see :func:`gradient_noise_multiplier` for k > 1), float64.
  The inverse of :func:`gradient_noise_multiplier`.

  >>> round(joint_noise_multiplier(1.0, 12.8), 6)
  0.999238
  """
  s = _validation.check_nonnegative(gradient_noise_multiplier, "gradient_noise_multiplier")
  b = _validation.check_positive(count_noise_multiplier, "count_noise_multiplier")
  k = _validation.check_positive_int(participations, "participations")
  if s == 0.0:
    return 0.0
  return (s ** -2 + k / (2.0 * b) ** 2) ** -0.5


def gradient_noise_multiplier(total_noise_multiplier: float, count_noise_multiplier: float, *,
                              participations: int = 1) -> float:
  """sigma_Delta for the gradient so that gradient and count noise together cost sigma.

  Returns ``sigma_Delta = (sigma^-2 - k (2 sigma_b)^-2)^-1/2`` in float64
  (rounded up by a relative 1e-12 so rounding never removes noise), where
  sigma is ``total_noise_multiplier`` (the multiplier the accountant is
  calibrated for), sigma_b is ``count_noise_multiplier`` and k is
  ``participations``.

  Derivation. Whitening: release ``(X + Z_1, Y + Z_2)`` with ``Z_1 ~ N(0,
  s_1^2 I)``, ``Z_2 ~ N(0, s_2^2 I)`` independent; dividing each block by its
  std is invertible, so the pair has the privacy curve of ``(X/s_1, Y/s_2) +
  N(0, I)``, the Gaussian mechanism with sensitivity ``mu`` where ``mu^2 =
  Delta_X^2 / s_1^2 + Delta_Y^2 / s_2^2`` (the largest whitened shift; the
  privacy loss of a Gaussian with shift v is ``N(||v||^2/2, ||v||^2)`` and
  depends on v only through ``||v||``). A Gaussian of sensitivity mu is the
  Gaussian mechanism with noise multiplier ``1/mu``.

  * k = 1, DP-SGD (independent noise, amplified by Poisson sampling or not):
    one step, one example: ``Delta_X = 1`` (normalised clipped sum, noise std
    sigma_Delta) and ``Delta_Y = 1/2`` (centered count, std sigma_b), so
    ``sigma^-2 = sigma_Delta^-2 + (2 sigma_b)^-2`` (Andrew et al. 2021,
    Theorem 1). The subsampled accountants see only the whitened shift of the
    one added example, of norm 1/sigma, as for plain DP-SGD at sigma. Use the
    per-step multiplier the DP-SGD accountant is calibrated for. The same
    holds for any accountant whose unit is ONE participation, with sigma in
    units of that participation's sensitivity.
  * k > 1, matrix-factorisation (correlated) noise with deterministic
    participation, accounted as ONE Gaussian mechanism for the whole run
    (Denisov et al. 2022; Choquette-Choo et al. 2023): the gradient stream
    releases ``C x + z`` with ``z ~ N(0, s^2 I)``; under (k, b)-participation
    an example changes ``C x`` by at most ``sens_C`` (the strategy's
    sensitivity for unit-norm contributions: here the normalised gradients
    have norm <= 1). The counts are k independent per-step Gaussians on which
    the example moves the centered count by 1/2 each, so
    ``Delta_Y^2 / sigma_b^2 = k / (2 sigma_b)^2``. The run is the Gaussian
    mechanism with ``mu^2 = sens_C^2 / s^2 + k / (2 sigma_b)^2``, and with
    ``sigma = 1 / mu`` the multiplier the run is calibrated for (``mu =
    sens_C / s_0`` without adaptive clipping), ``s / sens_C = (sigma^-2 - k
    (2 sigma_b)^-2)^-1/2``, the value returned. So: the correlated noise of
    std ``s = sens_C * gradient_noise_multiplier(sigma, sigma_b,
    participations=k)`` per unit sensitivity, i.e. pass the returned value
    wherever the calibrated ``sigma = s_0 / sens_C`` would have gone. The
    inputs at step t depend on earlier outputs; Denisov et al. 2022 (Theorem
    2.1) show the Gaussian matrix mechanism on adaptive streams has the
    nonadaptive privacy, and the joint (gradient, count) stream is one such
    mechanism (block strategy ``diag(C, I)``).

  With :mod:`jaxdp.dpsgd.correlated` (whose ``noise_multiplier`` sigma is
  per participation: ``z`` has std ``sigma S s_1``): the amplified BandMF
  analysis accounts per participation (disjoint blocks, each with its own
  count), so ``gradient_noise_multiplier(sigma, sigma_b)``; the deterministic
  analysis accounts the run as ``Gaussian(sigma / r)`` with ``r = sens_{k,b}(C)
  / s_1`` (``accounting.run_sensitivity``), so the gradient's multiplier is
  ``r * gradient_noise_multiplier(sigma / r, sigma_b, participations=k)``
  with k the most participations.

  Args:
    total_noise_multiplier: sigma >= 0 (0: non-private, returns 0).
    count_noise_multiplier: sigma_b > 0 (std of the count noise).
    participations: k >= 1, the most steps one example takes part in under
      the accounting (1 for DP-SGD and per-participation accountants).

  Raises:
    ValueError: ``2 sigma_b / sqrt(k) <= sigma``: the count noise alone would
      reveal more than the whole budget allows (no finite sigma_Delta works).

  >>> round(gradient_noise_multiplier(1.0, 12.8), 6)
  1.000764
  >>> round(joint_noise_multiplier(gradient_noise_multiplier(1.0, 12.8), 12.8), 9)
  1.0
  """
  sigma = _validation.check_nonnegative(total_noise_multiplier, "total_noise_multiplier")
  b = _validation.check_positive(count_noise_multiplier, "count_noise_multiplier")
  k = _validation.check_positive_int(participations, "participations")
  if sigma == 0.0:
    return 0.0
  inv_sq = sigma ** -2 - k / (2.0 * b) ** 2
  if inv_sq <= 0.0:
    raise ValueError(
        f"count_noise_multiplier={b} is too small for total_noise_multiplier={sigma} with "
        f"participations={k}: the count noise must satisfy 2 * count_noise_multiplier / "
        f"sqrt(participations) > total_noise_multiplier (here {2.0 * b / math.sqrt(k):.6g} <= "
        f"{sigma:.6g}), or the noisy counts alone cost more than the whole budget. Use "
        f"count_noise_multiplier > {sigma * math.sqrt(k) / 2.0:.6g} (Andrew et al. use "
        "expected_batch_size / 20).")
  return inv_sq ** -0.5 * (1.0 + _NOISE_MARGIN)


class AdaptiveClipState(NamedTuple):
  """State of :func:`adaptive_clip_noise`.

  Attributes:
    inner: the inner noise transform's state (its own noise key).
    clip_norm: C_t, the clip norm of the NEXT update (float32 scalar). Public:
      a function of the noisy counts only, safe to log.
    key: ``jax.random`` key of the count noise, split every step.
    count: number of updates applied (int32), the step counter.
  """

  inner: Any
  clip_norm: jax.Array
  key: jax.Array
  count: jax.Array


def current_clip_norm(state: Any) -> jax.Array:
  """C_t from an :class:`AdaptiveClipState` or an optax chain state whose first entry is one."""
  if isinstance(state, AdaptiveClipState):
    return state.clip_norm
  if isinstance(state, (tuple, list)) and state and isinstance(state[0], AdaptiveClipState):
    return state[0].clip_norm
  raise TypeError(f"expected an AdaptiveClipState or an optax.chain state starting with one, got "
                  f"{type(state).__name__}.")


def reseed_state(state: AdaptiveClipState, key: jax.Array, count: int) -> AdaptiveClipState:
  """``state`` continuing at step ``count`` with fresh keys for BOTH noises.

  For resuming from an older checkpoint when later steps were already run
  with the checkpoint's keys: replacing only ``state.key`` would leave the
  inner (gradient) noise key as it was, and the replayed steps would reuse its
  noise. The count key becomes ``fold_in(key, 0)``, the inner key
  ``fold_in(key, 1)``; ``count`` is set on both. The inner state must have
  ``key`` and ``count`` fields (``NoisyAggregateState`` does). The clip norm
  is kept (it is public).
  """
  if not isinstance(state, AdaptiveClipState):
    raise TypeError(f"state must be an AdaptiveClipState, got {type(state).__name__}.")
  _validation.check_key(key)
  inner = state.inner
  if not all(hasattr(inner, f) for f in ("key", "count", "_replace")):
    raise TypeError(f"the inner state {type(inner).__name__} has no key/count fields to reseed.")
  inner = inner._replace(key=jax.random.fold_in(key, 1),
                         count=jnp.asarray(count, jnp.asarray(inner.count).dtype))
  return state._replace(inner=inner, key=jax.random.fold_in(key, 0),
                        count=jnp.asarray(count, state.count.dtype))


def _key_data(key: Any) -> np.ndarray | None:
  """Host copy of a concrete key's bits (None when traced)."""
  if _validation._is_tracer(key):  # pylint: disable=protected-access
    return None
  with jax.ensure_compile_time_eval():  # a concrete key stays concrete inside jit
    if jax.dtypes.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
      key = jax.random.key_data(key)
  if _validation._is_tracer(key):  # pylint: disable=protected-access
    return None
  return np.asarray(key)


def _is_transformation(x: Any) -> bool:
  return isinstance(x, optax.GradientTransformation) or (
      hasattr(x, "init") and hasattr(x, "update"))


def _resolve_inner(inner: Any, *, noise_multiplier: float | None, sigma_b: float,
                   participations: int, sensitivity_ratio: float, num_counts: int) -> Any:
  """The inner noise transform, BUILT (factory) or CHECKED against sigma_Delta.

  ``sigma_Delta = r gradient_noise_multiplier(sigma / r, sigma_b,
  participations=k G)`` (Andrew et al. 2021 Thm 1 with k participations of G
  counts each; :func:`gradient_noise_multiplier`).
  """
  sigma_delta = None
  inner_arg = inner
  if noise_multiplier is not None:
    sigma = _validation.check_nonnegative(noise_multiplier, "noise_multiplier")
    r = _validation.check_positive(sensitivity_ratio, "sensitivity_ratio")
    k = _validation.check_positive_int(participations, "participations")
    sigma_delta = (0.0 if sigma == 0.0 else
                   r * gradient_noise_multiplier(sigma / r, sigma_b, participations=k * num_counts))
  if not _is_transformation(inner):
    if not callable(inner):
      raise TypeError(f"inner must be a factory gradient_noise_multiplier -> noise transform (or "
                      f"a transform built by transforms.noisy_aggregate), got "
                      f"{type(inner).__name__}.")
    if sigma_delta is None:
      raise TypeError("an inner factory needs noise_multiplier= (the sigma the accountant is "
                      "calibrated for): the wrapper builds the inner noise with sigma_Delta.")
    built = inner(sigma_delta)
    if not _is_transformation(built):
      raise TypeError(f"the inner factory must return an optax GradientTransformation, got "
                      f"{type(built).__name__}.")
    inner = built
  from_factory = sigma_delta is not None and not _is_transformation(inner_arg)
  meta_sigma = getattr(inner, "noise_multiplier", None)
  meta_sens = getattr(inner, "l2_sensitivity", None)
  if meta_sens is not None and float(meta_sens) != 1.0:
    raise ValueError(f"the inner noise transform is calibrated for l2_sensitivity={meta_sens}; "
                     "adaptive clipping feeds it the NORMALISED clipped sum, of sensitivity 1: "
                     "build it with l2_sensitivity=1.0.")
  if sigma_delta is not None:
    if from_factory and meta_sigma is None:
      return inner  # built here with sigma_Delta
    if meta_sigma is None:
      raise TypeError("the inner noise transform does not state its noise multiplier, so it "
                      "cannot be checked against the gradient's sigma_Delta: pass a factory "
                      "(lambda s: correlated_noise(strategy, n, s, 1.0, qN, key)) instead.")
    if float(meta_sigma) < sigma_delta * (1.0 - 4 * _NOISE_MARGIN):  # sigma_delta is rounded up
      raise ValueError(
          f"the inner noise transform adds noise_multiplier={float(meta_sigma):.6g}, but with "
          f"the counts' share the gradient needs sigma_Delta={sigma_delta:.6g} for a total "
          f"noise_multiplier={noise_multiplier} (joint multiplier "
          f"{joint_noise_multiplier(float(meta_sigma), sigma_b, participations=participations * num_counts):.4g} "
          f"< {noise_multiplier}): build it with gradient_noise_multiplier(...) -- or pass a "
          "factory and let the wrapper build it.")
    return inner
  warnings.warn(
      "adaptive_clip_noise was given a built inner transform without noise_multiplier=: its "
      "noise cannot be checked against the count noise's share (an inner built with the "
      "TOTAL sigma leaves the counts unpaid). Pass noise_multiplier= (and a factory for the "
      "correlated noise); this will become an error.", FutureWarning, stacklevel=3)
  return inner


def _check_pair(updates: Any, count_shape: tuple) -> tuple[Any, jax.Array]:
  if not isinstance(updates, (tuple, list)) or len(updates) != 2:
    got = type(updates).__name__
    if isinstance(updates, (tuple, list)):
      got += f" of length {len(updates)}"
    raise TypeError("adaptive_clip_noise's update takes the pair (normalised clipped gradient "
                    f"sum, centered unclipped count), got a {got}.")
  grad_sum, centered = updates
  centered = jnp.asarray(centered)
  if centered.shape != count_shape:
    what = "a scalar" if count_shape == () else f"of shape {count_shape} (one per clip group)"
    raise ValueError(f"the centered unclipped count (second entry of updates) must be {what}, "
                     f"got shape {centered.shape}.")
  if not (jnp.issubdtype(centered.dtype, jnp.floating)
          or jnp.issubdtype(centered.dtype, jnp.integer)):
    raise TypeError(f"the centered unclipped count must be a real number, got dtype "
                    f"{centered.dtype}.")
  return grad_sum, centered


def per_layer_normalisation(clip_norms: PyTree) -> tuple[jax.Array, PyTree]:
  """``(D, nu)``: the common unit ``D >= sqrt(sum_l C_l^2)`` and the normalised group clips.

  Per-layer adaptive clipping clips group l of every per-example gradient to
  ``C_l`` and divides the whole vector by D (:func:`adaptive_clipped_grad`
  with ``per_layer=True``): in units of D, group l is clipped to ``nu_l ~=
  C_l / D``, so the normalised sum has sensitivity ``sqrt(sum_l nu_l^2) <= 1``
  (McMahan et al. 2018, Sec. 3: per-layer bounds compose as the Pythagorean
  sum), whatever the C_l are. Rounding: D is computed as ``m sqrt(sum (C_l /
  m)^2)`` (``m = max C_l``, no overflow), inflated by ``(1 + r)^(L + 8)`` and
  every ``nu_l`` deflated by ``(1 - r)^3`` (r = 2^-24), so ``D`` is at least
  the exact Pythagorean sum of the float32 ``C_l`` and ``sum nu_l^2 <= 1``
  exactly. Both :func:`adaptive_clipped_grad` and the noise wrapper call this
  on the same state, so they use the same D.
  """
  leaves, treedef = jax.tree.flatten(clip_norms)
  if not leaves:
    raise ValueError("clip_norms must hold at least one clip norm.")
  c = jnp.stack([jnp.asarray(x, jnp.float32).reshape(()) for x in leaves])
  n = len(leaves)
  r = 2.0 ** -24
  up = transforms._round_up((1.0 + r) ** (n + 8), np.float32)  # pylint: disable=protected-access
  down = np.float32(clipping.float32_at_most((1.0 - r) ** 3))
  m = jnp.max(c)
  d = m * jnp.sqrt(jnp.sum(jnp.square(c / m))) * jnp.float32(up)
  nus = [(ci / d) * down for ci in c]
  return d, jax.tree.unflatten(treedef, nus)


def _adaptive_wrapper(inner: Any, config: AdaptiveClipNorm, *, qn: float, key: jax.Array,
                      sigma_b: float, groups: Any, per_layer: bool) -> optax.GradientTransformation:
  """The shared transform of :func:`adaptive_clip_noise` and :func:`per_layer_adaptive_clip_noise`."""
  _validation.check_key(key)
  dtype = jnp.float32
  std_b = transforms._round_up(sigma_b, dtype)  # pylint: disable=protected-access
  gamma = float(config.target_quantile)
  eta = float(config.learning_rate)
  lo, hi = config.clip_norm_bounds()
  lo32, hi32 = np.float32(lo), np.float32(hi)
  initial = np.asarray(config.initial, np.float32)

  def initial_clip_norms(params):
    if not per_layer:
      return jnp.asarray(initial)
    if groups is None:
      return jax.tree.map(lambda _: jnp.asarray(initial), params)
    clipping.leaf_groups(params, True, groups, False)  # named error for a wrong structure
    return jax.tree.map(lambda c: jnp.asarray(np.float32(c)), groups)

  def init_fn(params):
    inner_state = inner.init(params)
    inner_key = getattr(inner_state, "key", None)
    if inner_key is not None:
      a, b = _key_data(inner_key), _key_data(key)
      if a is not None and b is not None and a.shape == b.shape and np.array_equal(a, b):
        raise ValueError("the inner noise transform and adaptive_clip_noise were given the same "
                         "key: the gradient and count noises would share randomness. Split the "
                         "key (jax.random.split(key)) and give each its own part.")
    return AdaptiveClipState(inner=inner_state, clip_norm=initial_clip_norms(params),
                             key=key, count=jnp.zeros((), jnp.int32))

  def update_fn(updates, state, params=None):
    clip_leaves, clip_def = jax.tree.flatten(state.clip_norm)
    shape = (len(clip_leaves),) if per_layer else ()
    grad_sum, centered = _check_pair(updates, shape)
    noisy_avg, inner_state = inner.update(grad_sum, state.inner, params)
    if per_layer:
      unit, _ = per_layer_normalisation(state.clip_norm)
      clip = jnp.stack([jnp.asarray(x, dtype) for x in clip_leaves])
    else:
      unit = clip = jnp.asarray(state.clip_norm, dtype)
    out = jax.tree.map(lambda u: u * unit.astype(u.dtype), noisy_avg)
    next_key, noise_key = jax.random.split(state.key)
    noisy = centered.astype(dtype) + mechanisms.gaussian_noise(noise_key, shape, std_b, dtype)
    btilde = (noisy + qn / 2.0) / qn
    # Geometric update (Andrew et al. 2021 Alg. 1), clamped to the public floor/ceiling
    # (post-processing of the noisy count).
    new_clip = jnp.clip((clip * jnp.exp(-eta * (btilde - gamma))).astype(dtype), lo32, hi32)
    if per_layer:
      new_clip = jax.tree.unflatten(clip_def, list(new_clip))
    return out, AdaptiveClipState(inner_state, new_clip, next_key, state.count + 1)

  return optax.GradientTransformation(init_fn, update_fn)


def _common_args(config, expected_batch_size, count_noise_multiplier, num_groups):
  if not isinstance(config, AdaptiveClipNorm):
    raise TypeError(f"config must be an AdaptiveClipNorm, got {type(config).__name__}.")
  qn = _validation.check_positive(expected_batch_size, "expected_batch_size")
  if count_noise_multiplier is None:
    sigma_b = config.resolved_count_noise_multiplier(qn, num_groups)
  else:
    sigma_b = _validation.check_positive(count_noise_multiplier, "count_noise_multiplier")
    if config.count_noise_multiplier is not None and config.count_noise_multiplier != sigma_b:
      raise ValueError(f"count_noise_multiplier={sigma_b} differs from the config's "
                       f"count_noise_multiplier={config.count_noise_multiplier}; give one.")
  return qn, sigma_b


def adaptive_clip_noise(
    inner: Any,
    config: AdaptiveClipNorm,
    *,
    expected_batch_size: float,
    key: jax.Array,
    noise_multiplier: float | None = None,
    count_noise_multiplier: float | None = None,
    participations: int = 1,
    sensitivity_ratio: float = 1.0,
) -> optax.GradientTransformation:
  """Adaptive clipping around a noise transform (Andrew et al. 2021, Algorithm 1).

  ``update((grad_sum, centered_count), state)`` with

  * ``grad_sum``: the sum of the NORMALISED clipped per-example gradients
    (each ``g_i`` clipped to norm C_t, then divided by C_t;
    :func:`adaptive_clipped_grad` with ``current_clip_norm(state)``),
    sensitivity 1;
  * ``centered_count``: ``sum_i (b_i - 1/2)`` over the batch, ``b_i = 1`` for
    an unclipped example (:func:`centered_unclipped_count`), sensitivity 1/2;

  returns ``C_t * inner(grad_sum)`` (``inner`` adds its noise and divides by
  ``q N``; the product with the public C_t is post-processing) and the state
  with ``C_{t+1} = clip(C_t exp(-eta_C (btilde - gamma)), floor, ceiling)``,
  ``btilde = (centered_count + N(0, sigma_b^2) + qN/2) / (qN)`` (module
  docstring; floor and ceiling from :meth:`AdaptiveClipNorm.clip_norm_bounds`,
  public constants, so the clamp is post-processing). The count noise is
  drawn with :func:`jaxdp.mechanisms.gaussian_noise` (full float32 tails), its
  std rounded up to float32, from the state's own key, split every step.

  The inner noise must be that of the GRADIENT's share, ``sigma_Delta =
  r gradient_noise_multiplier(sigma / r, sigma_b, participations=k)`` for the
  sigma the accountant is calibrated for (Andrew et al. 2021 Thm 1; k and r
  for the unamplified matrix mechanism, :func:`gradient_noise_multiplier`),
  never sigma itself (the counts would then go unpaid: at sigma_b = qN/20 and
  qN = 4, sigma = 1, the joint multiplier would be 0.894, not 1). So the
  wrapper builds or checks it:

  * ``inner`` a FACTORY ``sigma_Delta -> transform`` (recommended; e.g.
    ``lambda s: noisy_aggregate(s, 1.0, qN, k_g)`` or ``lambda s:
    correlated_noise(strategy, n, s, 1.0, qN, k_g)``) with
    ``noise_multiplier=sigma``: the wrapper computes sigma_Delta and builds it;
  * ``inner`` a built :class:`~jaxdp.dpsgd.transforms.NoiseTransformation`
    (``noisy_aggregate``'s result) with ``noise_multiplier=sigma``: its stated
    multiplier must be at least sigma_Delta and its sensitivity 1
    (``ValueError`` otherwise); a built transform that does not state its
    noise is refused (``TypeError``);
  * legacy: a built transform without ``noise_multiplier`` is accepted with a
    ``FutureWarning`` (unchecked; only its sensitivity, when stated, is checked).

  Args:
    inner: factory or noise transform (above) taking a clipped SUM of
      sensitivity 1 and returning the noisy average, with a key independent
      of ``key``.
    config: :class:`AdaptiveClipNorm`.
    expected_batch_size: ``q N`` > 0, the public divisor of the count (the
      same as the inner transform's).
    key: ``jax.random`` key of the count noise; never the inner transform's.
    noise_multiplier: sigma >= 0, the multiplier the accountant is calibrated
      for (gradient and counts together).
    count_noise_multiplier: sigma_b > 0; ``None`` takes the config's value
      (``expected_batch_size / 20`` when that is ``None`` too).
    participations: k >= 1: the counts one example moves under the
      accounting (the unamplified matrix mechanism's most participations; 1
      for DP-SGD and per-participation accountants).
    sensitivity_ratio: r > 0 (``accounting.run_sensitivity`` for the
      unamplified matrix mechanism; 1 otherwise).

  Raises:
    TypeError / ValueError: a bad argument or an inner noise below
      sigma_Delta (before anything runs); at ``init``, the inner state's key
      equal to ``key`` (the two noises would share their randomness); at
      ``update``, ``updates`` not a pair ``(pytree, scalar)``.
  """
  qn, sigma_b = _common_args(config, expected_batch_size, count_noise_multiplier, 1)
  _validation.check_key(key)
  inner = _resolve_inner(inner, noise_multiplier=noise_multiplier, sigma_b=sigma_b,
                         participations=participations, sensitivity_ratio=sensitivity_ratio,
                         num_counts=1)
  return _adaptive_wrapper(inner, config, qn=qn, key=key, sigma_b=sigma_b, groups=None,
                           per_layer=False)


def per_layer_adaptive_clip_noise(
    inner: Any,
    config: AdaptiveClipNorm,
    *,
    noise_multiplier: float,
    expected_batch_size: float,
    key: jax.Array,
    groups: Any = None,
    num_groups: int | None = None,
    count_noise_multiplier: float | None = None,
    participations: int = 1,
    sensitivity_ratio: float = 1.0,
) -> optax.GradientTransformation:
  """Per-layer adaptive clipping: one clip norm ``C_t^l`` and one noisy count per group.

  Andrew et al. 2021 Algorithm 1 run for every clip group l (a layer, or any
  group of parameter leaves; per-layer clipping as in McMahan et al. 2018,
  Sec. 3). The state's clip norm is a pytree of float32 scalars
  (``current_clip_norm(state)``): the structure of ``groups``, or of params
  (one group per leaf) when ``groups`` is None. One step:

  1. Gradient: group l of each per-example gradient is clipped to ``C_l`` and
     the whole vector is divided by ``D = sqrt(sum_l C_l^2)``
     (:func:`per_layer_normalisation`; :func:`adaptive_clipped_grad` with
     ``per_layer=True``), so the normalised sum has sensitivity 1; the inner
     transform adds noise of std sigma_Delta and the output is multiplied by
     D (post-processing): the update of per-layer clipping at ``C_t^l`` with
     noise std ``sigma_Delta D`` on the sum, as for fixed per-layer clip norms.
  2. Counts: ``sum_i (b_i^l - 1/2)`` with ``b_i^l = 1[||g_i^l|| <= C_l]``, one
     per group (``info.num_clipped_per_group``), each with Gaussian noise of
     std sigma_b; ``C_l`` follows the geometric update with its own count,
     clamped to the config's floor and ceiling.

  Budget (Andrew et al. 2021 Thm 1, whitening, with G counts): one example
  moves each of the G counts by 1/2, so the count vector has L2 sensitivity
  ``sqrt(G)/2`` and the pair costs ``sigma^-2 = sigma_Delta^-2 + G (2
  sigma_b)^-2``: ``sigma_Delta = gradient_noise_multiplier(sigma, sigma_b,
  participations=G)`` (times k for the unamplified matrix mechanism). The
  default ``sigma_b = sqrt(G) qN / 20`` keeps the counts' share equal to
  that of one flat count (so sigma_Delta is the flat one). The wrapper builds
  or checks the inner noise as :func:`adaptive_clip_noise` does.

  Args:
    inner: factory ``sigma_Delta -> transform`` or a checked built transform
      (see :func:`adaptive_clip_noise`), noise for a sum of sensitivity 1.
    config: :class:`AdaptiveClipNorm` (its ``initial`` starts every group
      unless ``groups`` gives per-group values; one floor and ceiling).
    noise_multiplier: sigma >= 0 the accountant is calibrated for.
    expected_batch_size: ``q N`` > 0.
    key: the count noise's key (never the inner transform's).
    groups: ``None`` (one group per params leaf; then give ``num_groups``,
      the number of params leaves, so the noise can be sized before
      ``init``) or a pytree PREFIX of params whose leaves are the groups'
      initial clip norms (positive normal float32 within the config's
      bounds), e.g. ``{"Dense_0": 0.1, "Dense_1": 0.1}``.
    num_groups: G when ``groups`` is None (checked at ``init``).
    count_noise_multiplier: sigma_b of EACH count; ``None`` for the config's
      or ``sqrt(G) qN / 20``.
    participations, sensitivity_ratio: as for :func:`adaptive_clip_noise`.

  The loop feeds ``(grad_sum, centered_unclipped_count(info.num_examples,
  info.num_clipped_per_group))`` from
  ``adaptive_clipped_grad(loss, current_clip_norm(state), per_layer=True)``.
  """
  if groups is None:
    if num_groups is None:
      raise ValueError("give groups (a pytree prefix of params) or num_groups (the number of "
                       "params leaves, one group each).")
    g = _validation.check_positive_int(num_groups, "num_groups")
  else:
    values = jax.tree.leaves(groups)
    if not values:
      raise ValueError("groups must hold at least one initial clip norm.")
    lo, hi = config.clip_norm_bounds() if isinstance(config, AdaptiveClipNorm) else (0.0, math.inf)
    for v in values:
      c = _check_normal_float32(v, "groups entry (initial clip norm)")
      if not lo <= float(np.float32(c)) <= hi:
        raise ValueError(f"groups entry {c} is outside the config's clip norm bounds "
                         f"[{lo:.4g}, {hi:.4g}].")
    g = len(values)
    if num_groups is not None and _validation.check_positive_int(num_groups, "num_groups") != g:
      raise ValueError(f"num_groups={num_groups} but groups holds {g} clip norms.")
  qn, sigma_b = _common_args(config, expected_batch_size, count_noise_multiplier, g)
  _validation.check_key(key)
  if noise_multiplier is None:
    raise TypeError("noise_multiplier is required (the sigma the accountant is calibrated for).")
  inner = _resolve_inner(inner, noise_multiplier=noise_multiplier, sigma_b=sigma_b,
                         participations=participations, sensitivity_ratio=sensitivity_ratio,
                         num_counts=g)
  tx = _adaptive_wrapper(inner, config, qn=qn, key=key, sigma_b=sigma_b, groups=groups,
                         per_layer=True)

  def init_fn(params):
    state = tx.init(params)
    got = len(jax.tree.leaves(state.clip_norm))
    if got != g:
      raise ValueError(f"num_groups={g} but params has {got} leaves (one group each).")
    return state

  return optax.GradientTransformation(init_fn, tx.update)


def adaptive_noisy_aggregate(
    config: AdaptiveClipNorm,
    *,
    noise_multiplier: float,
    expected_batch_size: float,
    key: jax.Array,
    per_layer: bool = False,
    groups: Any = None,
    num_groups: int | None = None,
) -> optax.GradientTransformation:
  """DP-SGD noise with adaptive clipping, costing ``noise_multiplier`` per step.

  ``adaptive_clip_noise(lambda s: noisy_aggregate(s, 1.0, qN, k_g), config,
  noise_multiplier=sigma, key=k_b)`` with ``k_b, k_g = jax.random.split(key)``:
  the gradient gets ``sigma_Delta = gradient_noise_multiplier(sigma,
  sigma_b)`` -- NOT sigma, which is the joint multiplier of gradient and count
  (Andrew et al. 2021, Theorem 1). Each step is as private as DP-SGD with
  noise multiplier ``noise_multiplier``, so account it exactly like that
  (e.g. ``dpsgd_epsilon(noise_multiplier, q, steps, delta)``). With
  ``per_layer=True``: :func:`per_layer_adaptive_clip_noise` (``groups`` /
  ``num_groups`` as there; sigma_Delta then covers the G counts).
  """
  if not isinstance(config, AdaptiveClipNorm):
    raise TypeError(f"config must be an AdaptiveClipNorm, got {type(config).__name__}.")
  qn = _validation.check_positive(expected_batch_size, "expected_batch_size")
  _validation.check_nonnegative(noise_multiplier, "noise_multiplier")
  _validation.check_key(key)
  count_key, grad_key = jax.random.split(key)

  def factory(sigma_delta):
    return transforms.noisy_aggregate(sigma_delta, 1.0, qn, grad_key)

  if per_layer:
    return per_layer_adaptive_clip_noise(
        factory, config, noise_multiplier=noise_multiplier, expected_batch_size=qn,
        key=count_key, groups=groups, num_groups=num_groups)
  if groups is not None or num_groups is not None:
    raise ValueError("groups / num_groups need per_layer=True.")
  return adaptive_clip_noise(factory, config, noise_multiplier=noise_multiplier,
                             expected_batch_size=qn, key=count_key)


def centered_unclipped_count(num_examples: Any, num_clipped: Any) -> jax.Array:
  """``sum_i (b_i - 1/2) = num_examples / 2 - num_clipped`` (float32), NOT private.

  From the :class:`~jaxdp.dpsgd.clipping.ClippedGradInfo` of the
  normalised clipped gradient: ``centered_unclipped_count(info.num_examples,
  info.num_clipped)`` (``num_examples`` counts the unmasked examples,
  ``num_clipped`` those among them whose gradient was scaled down). Summed over
  several chunks of one batch it is the batch's value (it is additive). One
  example moves it by exactly 1/2, the sensitivity :func:`adaptive_clip_noise`
  noises it for. An example counts as unclipped when its normalised gradient
  norm is at most the float32-safe clip bound (a few ulps below 1).

  >>> float(centered_unclipped_count(10.0, 3))
  2.0
  """
  n = jnp.asarray(num_examples, jnp.float32)
  c = jnp.asarray(num_clipped, jnp.float32)
  return n / 2.0 - c


def normalized_loss(loss_fn: Callable[..., Any], clip_norm: Any, *,
                    has_aux: bool = False) -> Callable[..., Any]:
  """``loss_fn / clip_norm``: its per-example gradient is ``g_i / C``.

  ``clip_norm`` may be a traced scalar (the state's C_t inside ``jit``). With
  ``has_aux`` only the loss is divided. A concrete ``clip_norm`` must be
  finite and > 0.
  """
  if not callable(loss_fn):
    raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}.")
  if not _validation._is_tracer(clip_norm):  # pylint: disable=protected-access
    _validation.check_positive(clip_norm, "clip_norm")

  def fn(params, *args):
    out = loss_fn(params, *args)
    if has_aux:
      value, aux = out
      return value / clip_norm, aux
    return out / clip_norm

  return fn


def adaptive_clipped_grad(
    loss_fn: Callable[..., Any],
    clip_norm: Any,
    *,
    batch_argnums: int | Sequence[int] = 1,
    microbatch_size: int | None = None,
    has_aux: bool = False,
    method: str = "auto",
    per_layer: bool = False,
) -> clipping.ClippedGradFn:
  """Sum of per-example gradients clipped to C and divided by C (sensitivity 1).

  ``sum_i (g_i / C) min(1, C / ||g_i||)``, what :func:`adaptive_clip_noise`
  takes. The clip comes FIRST: the factor on ``g_i`` is ``min(1/C, c'/||g_i||)``
  computed from the power-of-two-scaled gradient
  (:func:`jaxdp.dpsgd.clipping.clip_groups`), so ``g_i / C`` is never formed
  for a huge unclipped ``g_i`` (a tiny C and a large gradient cannot overflow);
  a non-finite ``g_i`` contributes zero and counts as clipped (the clipping
  module's rule). Build it inside the jitted step with
  ``current_clip_norm(state)`` (construction is cheap and traces once);
  every ``method`` (``"auto"``, ``"vmap"``, ``"reweight"``, ``"ghost"``) and
  ``microbatch_size`` work with a traced C. ``info.loss_sum`` and
  ``info.per_example_norms`` are in units of C (multiply by C for the loss).

  ``per_layer=True``: ``clip_norm`` is the pytree of per-group clip norms
  ``C_l`` of :func:`per_layer_adaptive_clip_noise`'s state (a prefix of
  params); group l is clipped to ``C_l`` and everything is divided by
  :func:`per_layer_normalisation`'s D (sensitivity 1);
  ``info.num_clipped_per_group`` gives the per-group counts.
  """
  if per_layer:
    probe = clipping.clipped_grad(loss_fn, l2_clip_norm=1.0, batch_argnums=batch_argnums,
                                  microbatch_size=microbatch_size, has_aux=has_aux,
                                  method=method, per_layer=True)
    for c in jax.tree.leaves(clip_norm):
      if not _validation._is_tracer(c):  # pylint: disable=protected-access
        _check_normal_float32(float(np.asarray(c)), "clip_norm entry")
    unit, spec = per_layer_normalisation(clip_norm)
  else:
    probe = clipping.clipped_grad(loss_fn, l2_clip_norm=1.0, batch_argnums=batch_argnums,
                                  microbatch_size=microbatch_size, has_aux=has_aux,
                                  method=method)
    if not _validation._is_tracer(clip_norm):  # pylint: disable=protected-access
      _check_normal_float32(float(np.asarray(clip_norm)), "clip_norm")
    unit, spec = jnp.asarray(clip_norm, jnp.float32), 1.0
  return clipping._build_clipped_grad(  # pylint: disable=protected-access
      loss_fn, clip_spec=spec, even_split=False, per_layer=per_layer, sensitivity=1.0,
      l2_clip_norm=clip_norm, batch_argnums=probe.batch_argnums,
      microbatch_size=probe.microbatch_size, has_aux=has_aux, method=probe.method,
      unit_inverse=1.0 / unit)


__all__ = [
    "AdaptiveClipNorm", "AdaptiveClipState", "adaptive_clip_noise", "adaptive_clipped_grad",
    "adaptive_noisy_aggregate", "centered_unclipped_count", "current_clip_norm",
    "gradient_noise_multiplier", "joint_noise_multiplier", "normalized_loss",
    "per_layer_adaptive_clip_noise", "per_layer_normalisation", "reseed_state",
]
