"""Adaptive clipping's configuration and its clip-norm update (Andrew et al. 2021, Alg. 1).

:class:`AdaptiveClipNorm` holds the public constants of Andrew, Thakkar,
McMahan & Ramaswamy 2021 ("Differentially private learning with adaptive
clipping", NeurIPS), Algorithm 1: the initial clip norm C_0, the target
quantile gamma, the learning rate eta_C, the count noise sigma_b, and a public
floor and ceiling of the clip norm. Its constructor checks every value (the
clip norm is stored, multiplied and inverted in float32, so every clip norm
must be a positive normal float32).

:func:`_geometric_update` is the clip-norm step of Algorithm 1 (geometric
update), from the NOISY centered unclipped count:

  btilde = (noisy + qN/2) / (qN),   C_{t+1} = clip(C_t exp(-eta_C (btilde - gamma)), floor, ceiling),

``qN`` the public expected batch size. It reads the noisy count and public
constants only, so it is post-processing (no privacy cost); the noise itself
is added by :mod:`jaxdp.dpsgd.adaptive_state`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation

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

    ``num_groups`` G: one count per clip group
    (:func:`~jaxdp.dpsgd.adaptive_noise.per_layer_adaptive_clip_noise`);
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


def _geometric_update(config: AdaptiveClipNorm, clip: jax.Array, noisy: jax.Array,
                      qn: float) -> jax.Array:
  """``C_{t+1}`` from ``C_t`` and the NOISY centered count(s) (module docstring), float32.

  Andrew et al. 2021 Alg. 1 (geometric update), clamped to the config's public
  floor and ceiling (:meth:`AdaptiveClipNorm.clip_norm_bounds`): post-processing
  of ``noisy``. ``clip`` and ``noisy`` are float32 arrays of one shape (a scalar,
  or one entry per clip group).
  """
  dtype = jnp.float32
  gamma = float(config.target_quantile)
  eta = float(config.learning_rate)
  lo, hi = config.clip_norm_bounds()
  lo32, hi32 = np.float32(lo), np.float32(hi)
  btilde = (noisy + qn / 2.0) / qn
  return jnp.clip((clip * jnp.exp(-eta * (btilde - gamma))).astype(dtype), lo32, hi32)


__all__ = ["AdaptiveClipNorm"]
