"""Noise mechanisms: pure functions of a ``jax.random`` key.

Every sampler and mechanism here is jittable and vmappable: over keys (always)
and over noise scales (through the raw samplers and report-noisy-max, whose
scale arguments may be traced arrays). Shapes are static.

Two kinds of argument:

* privacy parameters (``epsilon``, ``delta``, ``rho``, sensitivities) from which
  a noise scale is derived by a theorem. They are validated eagerly in Python
  (``ValueError`` naming the argument and its range) and must be concrete
  scalars; close over them with ``functools.partial`` before ``jit``/``vmap``.
* noise scales (``scale``, ``stddev``, ``beta``) of the raw samplers, the
  exponential mechanism and report-noisy-max; they may be traced.

Every mechanism has a companion ``*_event`` returning the DpEvent to spend on a
:class:`jaxdp.accounting.PrivacyAccountant`.

Noise-scale helpers: :func:`laplace_scale`, :func:`l2_laplace_beta`,
:func:`analytic_gaussian_sigma`, :func:`classic_gaussian_sigma` and
:func:`gaussian_zcdp_sigma` (the last three re-exported from
:mod:`jaxdp.accounting`, float64).

Rounding: :func:`noise_scale_as` casts a float64 noise scale to the noise
dtype rounding towards more noise (up for ``scale``/``stddev``, down for
``beta``); the samplers do it for concrete scales, and callers that pass a scale
*through* ``jax.jit`` (where it is traced) should call it first.

Samplers: :func:`laplace_noise`, :func:`gaussian_noise`,
:func:`l2_laplace_noise`, :func:`gumbel_max`.
Mechanisms: :func:`laplace_mechanism`, :func:`gaussian_mechanism` (analytic),
:func:`classic_gaussian_mechanism`, :func:`zcdp_gaussian_mechanism`,
:func:`l2_laplace_mechanism`, :func:`exponential_mechanism`,
:func:`report_noisy_max_laplace`, :func:`report_noisy_max_gaussian`.

Hardened path (:mod:`jaxdp.mechanisms.discrete`): :func:`discrete_laplace_mechanism`
(``eps``-DP) and :func:`discrete_gaussian_mechanism` (``rho``-zCDP) release on a
public grid ``grid_step * Z`` with exact integer noise (Canonne, Kamath &
Steinke 2020), so their support does not depend on the data; prefer them for
low-dimensional releases (counts, quantiles, means, predictions). The
continuous samplers' formal ``(eps, delta_tail)`` statement is in
:mod:`jaxdp.mechanisms._sampling`.
"""

from jaxdp.mechanisms._common import noise_scale_as
from jaxdp.mechanisms.discrete import discrete_gaussian_mechanism
from jaxdp.mechanisms.discrete import discrete_gaussian_mechanism_event
from jaxdp.mechanisms.discrete import discrete_gaussian_noise
from jaxdp.mechanisms.discrete import discrete_gaussian_variance
from jaxdp.mechanisms.discrete import discrete_laplace_mechanism
from jaxdp.mechanisms.discrete import discrete_laplace_mechanism_event
from jaxdp.mechanisms.discrete import discrete_laplace_noise
from jaxdp.mechanisms.discrete import discrete_laplace_scale
from jaxdp.mechanisms.exponential import exponential_mechanism
from jaxdp.mechanisms.exponential import exponential_mechanism_beta
from jaxdp.mechanisms.exponential import exponential_mechanism_epsilon
from jaxdp.mechanisms.exponential import exponential_mechanism_event
from jaxdp.mechanisms.exponential import exponential_mechanism_probs
from jaxdp.mechanisms.exponential import exponential_mechanism_zcdp_rho
from jaxdp.mechanisms.exponential import gumbel_max
from jaxdp.mechanisms.gaussian import analytic_gaussian_sigma
from jaxdp.mechanisms.gaussian import classic_gaussian_mechanism
from jaxdp.mechanisms.gaussian import classic_gaussian_mechanism_event
from jaxdp.mechanisms.gaussian import classic_gaussian_sigma
from jaxdp.mechanisms.gaussian import gaussian_mechanism
from jaxdp.mechanisms.gaussian import gaussian_mechanism_event
from jaxdp.mechanisms.gaussian import gaussian_noise
from jaxdp.mechanisms.gaussian import gaussian_zcdp_sigma
from jaxdp.mechanisms.gaussian import zcdp_gaussian_mechanism
from jaxdp.mechanisms.gaussian import zcdp_gaussian_mechanism_event
from jaxdp.mechanisms.l2_laplace import l2_laplace_beta
from jaxdp.mechanisms.l2_laplace import l2_laplace_mechanism
from jaxdp.mechanisms.l2_laplace import l2_laplace_mechanism_event
from jaxdp.mechanisms.l2_laplace import l2_laplace_noise
from jaxdp.mechanisms.l2_laplace import l2_laplace_radius
from jaxdp.mechanisms.l2_laplace import uniform_direction
from jaxdp.mechanisms.laplace import laplace_mechanism
from jaxdp.mechanisms.laplace import laplace_mechanism_event
from jaxdp.mechanisms.laplace import laplace_noise
from jaxdp.mechanisms.laplace import laplace_scale
from jaxdp.mechanisms.noisy_max import report_noisy_max_gaussian
from jaxdp.mechanisms.noisy_max import report_noisy_max_gaussian_event
from jaxdp.mechanisms.noisy_max import report_noisy_max_gaussian_rho
from jaxdp.mechanisms.noisy_max import report_noisy_max_laplace
from jaxdp.mechanisms.noisy_max import report_noisy_max_laplace_epsilon
from jaxdp.mechanisms.noisy_max import report_noisy_max_laplace_event

__all__ = [
    "noise_scale_as",
    "discrete_gaussian_mechanism",
    "discrete_gaussian_mechanism_event",
    "discrete_gaussian_noise",
    "discrete_gaussian_variance",
    "discrete_laplace_mechanism",
    "discrete_laplace_mechanism_event",
    "discrete_laplace_noise",
    "discrete_laplace_scale",
    "analytic_gaussian_sigma",
    "classic_gaussian_mechanism",
    "classic_gaussian_mechanism_event",
    "classic_gaussian_sigma",
    "exponential_mechanism",
    "exponential_mechanism_beta",
    "exponential_mechanism_epsilon",
    "exponential_mechanism_event",
    "exponential_mechanism_probs",
    "exponential_mechanism_zcdp_rho",
    "gaussian_mechanism",
    "gaussian_mechanism_event",
    "gaussian_noise",
    "gaussian_zcdp_sigma",
    "gumbel_max",
    "l2_laplace_beta",
    "l2_laplace_mechanism",
    "l2_laplace_mechanism_event",
    "l2_laplace_noise",
    "l2_laplace_radius",
    "laplace_mechanism",
    "laplace_mechanism_event",
    "laplace_noise",
    "laplace_scale",
    "report_noisy_max_gaussian",
    "report_noisy_max_gaussian_event",
    "report_noisy_max_gaussian_rho",
    "report_noisy_max_laplace",
    "report_noisy_max_laplace_epsilon",
    "report_noisy_max_laplace_event",
    "uniform_direction",
    "zcdp_gaussian_mechanism",
    "zcdp_gaussian_mechanism_event",
]
