"""Noise of a private plan: independent or correlated Gaussian noise on the clipped sum, with its state.

Independent noise (DP-SGD; paper ``000_tradeoffs_of_private_prediction.md``
Section 3.1 Equation 4) adds ``N(0, (sigma S)^2 I)`` to each step's clipped
SUM (:func:`~.transforms.noisy_aggregate`). Correlated noise (BandMF, BLT;
Choquette-Choo et al. 2023, Dvijotham et al. 2024) adds the streamed
``C^{-1} z`` of a strategy C, ``z ~ N(0, (sigma S s_1)^2 I)``
(:func:`~.correlated.correlated_noise`). With an adaptive clip norm (Andrew et
al. 2021 Theorem 1) the gradient noise gets sigma_Delta and the unclipped
count sigma_b, with ``sigma_Delta^-2 + (2 sigma_b)^-2 = sigma^-2`` so that
together they cost the calibrated sigma (for the unamplified matrix mechanism,
the run-level version of :func:`~.adaptive_clipping.gradient_noise_multiplier`).

The noise key and the noise history (correlated noise) live in the optimiser
state; :func:`fresh_noise_state` gives a resumed run keys no earlier step
used (:mod:`.keys`). :func:`build` makes the :class:`Noise` part from the
calibrated sigma; :func:`strategy_digest` identifies the strategy in a
checkpoint's plan fingerprint.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp.dpsgd import adaptive_clipping, transforms


class Noise(NamedTuple):
  """The noise part of a plan.

  Attributes:
    transform: the optax transform adding the noise to the clipped SUM and
      dividing by the expected batch size (first in the plan's optimiser chain).
    gradient_noise_multiplier: the multiplier of the gradient noise: sigma, or
      sigma_Delta with an adaptive clip norm (per-layer: for one group).
    count_noise_multiplier: sigma_b of the unclipped count (adaptive), or None.
    noise_stddev: the std of the gradient noise (``sigma S``; correlated:
      ``sigma S s_1`` of z; adaptive: in units of the current clip norm).
    split: per-layer adaptive clipping only (else None): ``G -> (sigma_Delta,
      sigma_b, noise_stddev)`` for G clip groups, the split the transform
      makes at ``init`` when it reads G from the params.
  """

  transform: optax.GradientTransformation
  gradient_noise_multiplier: float
  count_noise_multiplier: float | None
  noise_stddev: float
  split: Any = None


def check_strategy(noise_strategy: Any, allow_extra_steps: bool) -> None:
  """Refuses a ``noise_strategy`` that is not a correlated-noise strategy, or extra steps with one."""
  if noise_strategy is None:
    return
  from jaxdp.dpsgd import correlated  # pylint: disable=g-import-not-at-top
  if not isinstance(noise_strategy, correlated.Strategy):
    raise TypeError(f"noise_strategy must be a jaxdp.dpsgd.correlated strategy (BandMF, BLT, "
                    f"...), got {type(noise_strategy).__name__}.")
  if allow_extra_steps:
    raise ValueError(
        "allow_extra_steps=True is refused with noise_strategy: the strategy C is a T x T "
        "matrix and the run's sensitivity and event cover exactly its T steps; a step T + 1 "
        "has no row in C, so its noise would not be part of the mechanism that was paid. "
        "Plan more steps (steps=/epochs=) instead.")


def build(noise_strategy: Any, adaptive: Any, *, sigma: float, sensitivity: float,
          selection: Any, run_keys: Any, per_layer: bool = False) -> Noise:
  """The noise part for the calibrated ``sigma`` (see the module docstring).

  Refuses an infinite sensitivity with ``sigma > 0`` (no noise can cover it).
  ``selection`` is the plan's :class:`~.plan_selection.Selection` (divisor,
  T, b, q); ``run_keys`` the run's :mod:`.keys` (the gradient and the count
  noise have disjoint keys). ``per_layer`` with an adaptive clip norm: one
  clip norm and one noisy count per params leaf, G read at ``init``.
  """
  if sigma > 0 and math.isinf(sensitivity):
    raise ValueError("l2_clip_norm must be finite for private training (noise_multiplier > 0).")
  expected, steps = selection.expected_batch_size, selection.steps
  count_key = None if adaptive is None else run_keys.count_noise
  k, r = _participations_and_ratio(noise_strategy, adaptive, steps, selection)
  tx = _noise_transform(noise_strategy, adaptive, sigma=sigma, sensitivity=sensitivity,
                        expected=expected, steps=steps, participations=k, ratio=r,
                        grad_key=run_keys.gradient_noise, count_key=count_key,
                        per_layer=per_layer)

  def split(g: int) -> tuple[float, float | None, float]:
    grad_sigma, count_sigma = sigma, None
    if adaptive is not None:
      # Andrew et al. 2021 Thm 1 with G counts (whitening): the gradient and the G counts
      # together cost sigma; k, r of the unamplified matrix mechanism (1, 1 otherwise).
      count_sigma = adaptive.resolved_count_noise_multiplier(expected, g)
      grad_sigma = adaptive_clipping.per_layer_gradient_noise_multiplier(
          sigma, count_sigma, g, participations=k, sensitivity_ratio=r)
    if noise_strategy is None:
      return grad_sigma, count_sigma, transforms.noise_stddev(grad_sigma, sensitivity)
    from jaxdp.dpsgd import correlated  # pylint: disable=g-import-not-at-top
    return grad_sigma, count_sigma, correlated.noise_stddev(noise_strategy, steps, grad_sigma,
                                                            sensitivity)

  grad_sigma, count_sigma, stddev = split(1)
  per_group = split if adaptive is not None and per_layer else None
  return Noise(tx, grad_sigma, count_sigma, stddev, per_group)


def _participations_and_ratio(strategy: Any, adaptive: Any, steps: int,
                              selection: Any) -> tuple[int, float]:
  """``(k, r)`` of the count split: 1, 1 unless the run is the unamplified matrix mechanism.

  Unamplified (:func:`~.correlated.accounting.analysis` is deterministic at the plan's b
  and q; fixed-size and user selections have b = 1 and q = B / N or the user rate, where
  ``fixed_size_analysis`` and the users' analysis agree with it): an example takes part in
  up to ``k = ceil(T / b)`` steps, each moving its counts, and the run's sensitivity ratio
  is ``r = sens_{k,b}(C) / s_1`` (``fixed_size_adaptive_gradient_noise_multiplier``,
  ``correlated.accounting.adaptive_gradient_noise_multiplier``).
  """
  if adaptive is None or strategy is None:
    return 1, 1.0
  from jaxdp.dpsgd import correlated  # pylint: disable=g-import-not-at-top
  b, q = selection.min_separation, selection.sample_rate
  if correlated.accounting.analysis(strategy, b, q) != correlated.accounting.DETERMINISTIC:
    return 1, 1.0
  return (correlated.max_participations(steps, b),
          correlated.accounting.run_sensitivity(strategy, steps, b))


def _noise_transform(strategy: Any, adaptive: Any, *, sigma: float, sensitivity: float,
                     expected: float, steps: int, participations: int, ratio: float,
                     grad_key: jax.Array, count_key: Any,
                     per_layer: bool) -> optax.GradientTransformation:
  """The plan's noise: independent or correlated, wrapped by adaptive clipping's count noise.

  With an adaptive clip norm the wrapper BUILDS the gradient noise from the total
  sigma (Andrew et al. 2021 Thm 1: ``sigma_Delta`` leaves room for the count
  noise; for the unamplified matrix mechanism with k participations and run
  sensitivity ratio r, :func:`~.adaptive_clipping.per_layer_gradient_noise_multiplier`),
  so the counts can never go unpaid. Per-layer: one count per params leaf, G
  read from the params at ``init`` (``num_groups="params"``) with the count
  noise of the config for G groups (``count_noise_multiplier=None``: the
  config's value, or ``sqrt(G) qN / 20``, which keeps the split independent of G).
  """
  from jaxdp.dpsgd import correlated  # pylint: disable=g-import-not-at-top

  def inner(noise_multiplier: float, s: float = sensitivity):
    if strategy is None:
      return transforms.noisy_aggregate(noise_multiplier, s, expected, grad_key)
    # The plan's sampler refuses a step beyond T on the host, before any update is computed.
    return correlated.correlated_noise(strategy, steps, noise_multiplier, s, expected, grad_key,
                                       step_check="caller")

  if adaptive is None:
    return inner(sigma)
  args = dict(noise_multiplier=sigma, expected_batch_size=expected, key=count_key,
              count_noise_multiplier=None, participations=participations,
              sensitivity_ratio=ratio)
  if per_layer:
    return adaptive_clipping.per_layer_adaptive_clip_noise(
        lambda s: inner(s, 1.0), adaptive, num_groups="params", **args)
  return adaptive_clipping.adaptive_clip_noise(lambda s: inner(s, 1.0), adaptive, **args)


def fresh_noise_state(noise: Any, gradient_key: jax.Array, count_key: jax.Array,
                      paid: int) -> Any:
  """The noise state at slot ``paid`` with keys no earlier step used (:meth:`.PrivateSGD.restore`)."""
  if isinstance(noise, adaptive_clipping.AdaptiveClipState):
    inner = fresh_noise_state(noise.inner, gradient_key, count_key, paid)
    return noise._replace(inner=inner, key=count_key,
                          count=jnp.asarray(paid, noise.count.dtype))
  return noise._replace(key=gradient_key, count=jnp.asarray(paid, noise.count.dtype))


def strategy_digest(strategy: Any, steps: int) -> str | None:
  """SHA-256 of a correlated-noise strategy (its class and its T x T coefficients), or None."""
  if strategy is None:
    return None
  h = hashlib.sha256(type(strategy).__name__.encode())
  h.update(np.asarray(strategy.fingerprint(steps), np.float64).tobytes())
  return h.hexdigest()


__all__ = ["Noise", "build", "check_strategy", "fresh_noise_state", "strategy_digest"]
