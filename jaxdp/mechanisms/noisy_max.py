"""Report-noisy-max over vote histograms: LNMax (Laplace) and GNMax (Gaussian).

Both release only ``argmax_i (n_i + Z_i)`` of a histogram ``n`` of votes, e.g.
the votes of ``T`` teachers over ``C`` classes in PATE.

Neighbouring relation (PATE): teachers are trained on disjoint partitions, so
changing one training example changes at most one teacher's vote: one count
drops by 1 and another rises by 1. The histogram therefore has L1 sensitivity
2 and L2 sensitivity ``sqrt(2)``. (If instead a teacher's vote is added or
removed, only one count moves: L1 = L2 = 1; pass that sensitivity to the
companion functions.)

* LNMax (Papernot, Abadi, Erlingsson, Goodfellow, Talwar, "Semi-supervised
  knowledge transfer for deep learning from private training data", ICLR 2017,
  Section 2.1 and Section 3): ``Z_i ~ Lap(1/gamma)``; each answer is
  ``(2 gamma, 0)``-DP. With Laplace scale ``b = 1/gamma`` that is
  ``epsilon = 2/b``: the noisy histogram itself is ``(2/b)``-DP by the Laplace
  mechanism with ``Delta_1 = 2`` (Dwork & Roth Thm 3.6) and the argmax is
  post-processing. The bound is tight: with two classes and the vote moving
  away from the output class, the probability ratio tends to ``exp(2/b)`` as the
  margin grows (``tests/mechanisms/test_report_noisy_max.py`` computes it exactly).
  Dwork & Roth's Claim 3.9 (``1/b`` for report-noisy-max) assumes *monotone*
  neighbours, which a moved vote is not. The DpEvent is
  ``LaplaceDpEvent(noise_multiplier = b / Delta_1)``; dp_accounting's RDP for it
  (Mironov 2017, Proposition 6) is that of a one-coordinate shift ``Delta_1/b``,
  which dominates the two-coordinate shift ``(1, -1)/b`` of a moved vote
  because the Laplace RDP curve is convex in the shift (checked numerically in
  the tests).
* GNMax (Papernot, Song, Mironov, Raghunathan, Talwar, Erlingsson, "Scalable
  private learning with PATE", ICLR 2018, Section 4.1 and Proposition 8):
  ``Z_i ~ N(0, sigma^2)``; the noisy histogram is a Gaussian mechanism with
  ``Delta_2 = sqrt(2)``, i.e. ``GaussianDpEvent(noise_multiplier=sigma/sqrt(2))``,
  ``(lambda, lambda/sigma^2)``-RDP, equivalently ``1/sigma^2``-zCDP. (PATE
  2018's data-dependent, smooth-sensitivity analysis is not implemented here.)
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxdp import _validation
from jaxdp.accounting import events as _events
from jaxdp.mechanisms import _common
from jaxdp.mechanisms.gaussian import gaussian_noise
from jaxdp.mechanisms.laplace import laplace_noise

VOTE_SWAP_L1_SENSITIVITY = 2.0
VOTE_SWAP_L2_SENSITIVITY = math.sqrt(2.0)


def _noisy_argmax(counts: jax.Array, noise: jax.Array) -> jax.Array:
  index = jnp.argmax(counts + noise, axis=-1).astype(jnp.int32)
  return _common.invalid_rows_to_minus_one(counts, index)


def _check_counts(counts: Any) -> None:
  # Concrete NaN/inf counts raise; traced ones give -1 rows (_noisy_argmax).
  _common.check_data(counts, "counts")


def _scale_for_batch(scale: Any, dtype: Any) -> jax.Array:
  # A scale is a scalar or broadcastable to the batch shape counts.shape[:-1].
  return _common.noise_scale_as(scale, dtype, round_up=True)[..., None]


def report_noisy_max_laplace(key: jax.Array, counts: Any, scale: Any) -> jax.Array:
  """LNMax: ``argmax_i (counts_i + Lap(scale))`` over the last axis.

  ``(2/scale)``-DP per answer when one vote moves between two classes (PATE
  2017, ``gamma = 1/scale``); see :func:`report_noisy_max_laplace_event`.
  Batched over leading axes (``(..., C) -> (...)`` int32; each row is a
  separate release).

  Args:
    key: a ``jax.random`` key, used once.
    counts: vote histogram(s), shape ``(..., C)``. Concrete counts with NaN or
      inf raise ``ValueError``; traced ones give ``-1`` for such rows.
    scale: Laplace scale ``b > 0`` (scalar or broadcastable to the batch shape);
      may be traced (vmap over it); concrete values are checked.
  """
  _common.check_key(key)
  _common.check_scale(scale, "scale", allow_zero=False)
  _check_counts(counts)
  counts = jnp.asarray(counts)
  dtype = _common.float_dtype_of(counts)
  counts = counts.astype(dtype)
  noise = laplace_noise(key, counts.shape, 1.0, dtype) * _scale_for_batch(scale, dtype)
  return _noisy_argmax(counts, noise)


def report_noisy_max_gaussian(key: jax.Array, counts: Any, stddev: Any) -> jax.Array:
  """GNMax: ``argmax_i (counts_i + N(0, stddev^2))`` over the last axis.

  PATE 2018 Proposition 8: ``(lambda, lambda/stddev^2)``-RDP per answer; see
  :func:`report_noisy_max_gaussian_event`. Batched like
  :func:`report_noisy_max_laplace`.
  """
  _common.check_key(key)
  _common.check_scale(stddev, "stddev", allow_zero=False)
  _check_counts(counts)
  counts = jnp.asarray(counts)
  dtype = _common.float_dtype_of(counts)
  counts = counts.astype(dtype)
  noise = gaussian_noise(key, counts.shape, 1.0, dtype) * _scale_for_batch(stddev, dtype)
  return _noisy_argmax(counts, noise)


def _static_positive(value: Any, name: str) -> float:
  _common.require_static(value, name)
  return _validation.check_positive(value, name)


def report_noisy_max_laplace_epsilon(
    scale: float, l1_sensitivity: float = VOTE_SWAP_L1_SENSITIVITY
) -> float:
  """Pure ``epsilon = Delta_1 / scale`` of one LNMax answer (``2/scale`` for a moved vote)."""
  b = _static_positive(scale, "scale")
  s = _static_positive(l1_sensitivity, "l1_sensitivity")
  return s / b


def report_noisy_max_laplace_event(
    scale: float, l1_sensitivity: float = VOTE_SWAP_L1_SENSITIVITY,
    *, neighbouring: str = "add_remove", unit: str = "example"
) -> _events.LaplaceDpEvent:
  """DpEvent of one LNMax answer: ``LaplaceDpEvent(noise_multiplier = scale / Delta_1)``.

  ``neighbouring`` (default ``"add_remove"``, dp_accounting's default) is the
  relation the sensitivity was computed for, and ``unit`` the privacy unit;
  both are carried into the event, so an accountant refuses to compose it
  with events of another relation.
  """
  b = _static_positive(scale, "scale")
  s = _static_positive(l1_sensitivity, "l1_sensitivity")
  return _events.LaplaceDpEvent(noise_multiplier=b / s, neighbouring=neighbouring, unit=unit)


def report_noisy_max_gaussian_rho(
    stddev: float, l2_sensitivity: float = VOTE_SWAP_L2_SENSITIVITY
) -> float:
  """zCDP ``rho = Delta_2^2 / (2 stddev^2)`` of one GNMax answer (``1/stddev^2`` for a moved vote)."""
  sigma = _static_positive(stddev, "stddev")
  s = _static_positive(l2_sensitivity, "l2_sensitivity")
  return s * s / (2.0 * sigma * sigma)


def report_noisy_max_gaussian_event(
    stddev: float, l2_sensitivity: float = VOTE_SWAP_L2_SENSITIVITY,
    *, neighbouring: str = "add_remove", unit: str = "example"
) -> _events.GaussianDpEvent:
  """DpEvent of one GNMax answer: ``GaussianDpEvent(noise_multiplier = stddev / Delta_2)``.

  With the default ``Delta_2 = sqrt(2)`` this is ``stddev / sqrt(2)``.

  ``neighbouring`` (default ``"add_remove"``, dp_accounting's default) is the
  relation the sensitivity was computed for, and ``unit`` the privacy unit;
  both are carried into the event, so an accountant refuses to compose it
  with events of another relation.
  """
  sigma = _static_positive(stddev, "stddev")
  s = _static_positive(l2_sensitivity, "l2_sensitivity")
  return _events.GaussianDpEvent(noise_multiplier=sigma / s, neighbouring=neighbouring, unit=unit)
