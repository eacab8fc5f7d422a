"""How adaptive clipping splits the noise budget (Andrew et al. 2021, Theorem 1).

One step of adaptive clipping releases two independent Gaussians: the
normalised clipped gradient sum (sensitivity 1, noise std sigma_Delta) and G
centered unclipped counts (G = 1 flat, G = the number of clip groups
per-layer; sensitivity 1/2 each, noise std sigma_b each). Dividing each block
by its noise std (whitening; invertible, so it changes no privacy curve)
gives one isotropic Gaussian of unit std whose sensitivity mu satisfies

  mu^2 = sigma_Delta^-2 + G (2 sigma_b)^-2,

the Gaussian mechanism with noise multiplier ``sigma = 1 / mu`` (Andrew,
Thakkar, McMahan & Ramaswamy 2021, "Differentially private learning with
adaptive clipping", NeurIPS, Theorem 1, for G = 1). An accountant calibrated
for sigma therefore pays for the whole step when the gradient gets

  sigma_Delta = (sigma^-2 - G (2 sigma_b)^-2)^-1/2

(:func:`gradient_noise_multiplier`, :func:`per_layer_gradient_noise_multiplier`),
and :func:`joint_noise_multiplier` is the inverse map. The split exists only
when ``sigma^-2 > G (2 sigma_b)^-2``; otherwise the counts alone would cost
more than the whole budget and the functions raise. The unamplified matrix
mechanism (k participations, run sensitivity ratio r) enters as k G counts
and ``sigma / r`` (:func:`gradient_noise_multiplier` derives it). The noise
transforms that use these values are in :mod:`jaxdp.dpsgd.adaptive_noise`.
"""

from __future__ import annotations

import math

from jaxdp import _validation

# Relative margin added to sigma_Delta so that rounding in the float64 formula can
# only ADD noise (the joint multiplier is then >= the one calibrated, never below).
_NOISE_MARGIN = 1e-12


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


def per_layer_gradient_noise_multiplier(total_noise_multiplier: float,
                                        count_noise_multiplier: float, num_groups: int, *,
                                        participations: int = 1,
                                        sensitivity_ratio: float = 1.0) -> float:
  """sigma_Delta of adaptive clipping with G clip groups, each with its own noisy count.

  Returns ``r * gradient_noise_multiplier(sigma / r, sigma_b, participations=k G)``
  (float64, rounded up as there; 0 for sigma = 0), with sigma =
  ``total_noise_multiplier``, sigma_b = ``count_noise_multiplier`` (the std of
  EACH count), G = ``num_groups``, k = ``participations`` and r =
  ``sensitivity_ratio``. G = 1 is flat adaptive clipping.

  Derivation (Andrew et al. 2021 Theorem 1 with G counts; whitening as in
  :func:`gradient_noise_multiplier`). Per-layer adaptive clipping releases the
  normalised clipped sum (sensitivity 1: group l is clipped to C_l and the
  whole vector divided by ``D >= sqrt(sum_l C_l^2)``, McMahan et al. 2018
  Sec. 3) with noise std sigma_Delta, and G centered counts ``sum_i (b_i^l -
  1/2)``; one example moves EVERY count by exactly 1/2, so the count vector
  has L2 sensitivity ``sqrt(G) / 2`` and the whitened shift of one example is

    mu^2 = sigma_Delta^-2 + G (2 sigma_b)^-2.

  Calibrating ``mu = 1 / sigma`` gives ``sigma_Delta = (sigma^-2 - G (2
  sigma_b)^-2)^-1/2``; with k participations accounted as one Gaussian of
  run sensitivity ratio r (the unamplified matrix mechanism),
  ``(r / sigma)^2 = (r / sigma_Delta)^2 + k G (2 sigma_b)^-2``. The split is
  feasible (sigma_Delta finite and positive) if and only if

    (sigma / r)^-2 > k G (2 sigma_b)^-2,   i.e.   G < (2 r sigma_b / sigma)^2 / k.

  With the default count noise ``sigma_b = sqrt(G) qN / 20``
  (:meth:`~jaxdp.dpsgd.adaptive_clip_norm.AdaptiveClipNorm.resolved_count_noise_multiplier`)
  G cancels: the condition is ``sigma < r qN / (10 sqrt(k))`` for every G, and
  sigma_Delta equals the flat value (up to float64 rounding). With a fixed
  sigma_b the largest feasible G is finite, and sigma_Delta grows with G.

  Args:
    total_noise_multiplier: sigma >= 0, the multiplier the accountant is
      calibrated for (0: non-private, returns 0).
    count_noise_multiplier: sigma_b > 0, the std of each count's noise.
    num_groups: G >= 1, the number of clip groups (noisy counts per step).
    participations: k >= 1 (1 for DP-SGD and per-participation accountants).
    sensitivity_ratio: r > 0 (1 except for the unamplified matrix mechanism).

  Raises:
    ValueError: a bad argument, or G too large for sigma and sigma_b (the
      condition above), naming ``num_groups`` and ``count_noise_multiplier``.

  >>> round(per_layer_gradient_noise_multiplier(1.0, 12.8, 1), 6)
  1.000764
  >>> round(per_layer_gradient_noise_multiplier(1.0, 2.0 * 12.8, 4), 6)   # sigma_b = sqrt(4) 12.8
  1.000764
  """
  sigma = _validation.check_nonnegative(total_noise_multiplier, "total_noise_multiplier")
  b = _validation.check_positive(count_noise_multiplier, "count_noise_multiplier")
  g = _validation.check_positive_int(num_groups, "num_groups")
  k = _validation.check_positive_int(participations, "participations")
  r = _validation.check_positive(sensitivity_ratio, "sensitivity_ratio")
  if sigma == 0.0:
    return 0.0
  s = sigma / r
  if g > 1 and s ** -2 - (k * g) / (2.0 * b) ** 2 <= 0.0:
    limit = (2.0 * r * b / sigma) ** 2 / k
    raise ValueError(
        f"num_groups={g} clip groups are too many for total_noise_multiplier={sigma} with "
        f"count_noise_multiplier={b} (participations={k}, sensitivity_ratio={r}): the {g} "
        f"noisy counts alone would cost more than the whole budget. Per-layer adaptive "
        f"clipping needs num_groups < (2 r sigma_b / sigma)^2 / k = {limit:.6g} (Andrew et al. "
        f"2021 Thm 1 with G counts), i.e. count_noise_multiplier > "
        f"{sigma * math.sqrt(k * g) / (2.0 * r):.6g}; use fewer clip groups, a larger "
        "count_noise_multiplier, or the default count noise (count_noise_multiplier=None: "
        "sqrt(G) expected_batch_size / 20, feasible for every G when it is for one).")
  return r * gradient_noise_multiplier(s, b, participations=k * g)


__all__ = ["gradient_noise_multiplier", "joint_noise_multiplier",
           "per_layer_gradient_noise_multiplier"]
