"""Accounting of a private plan: the noise multiplier it is calibrated to, and its one DpEvent.

The event a plan pays is derived from its parts, never stated separately:

* Poisson sampling, independent noise (Abadi et al. 2016; Mironov, Talwar &
  Zhang 2019): each step is ``PoissonSampled(q, Gaussian(sigma))`` for
  add/remove neighbours, or ``PoissonSampled(q, Gaussian(sigma / 2))`` for
  replace-one (the sensitivity is 2S), the run ``T x`` that event
  (:func:`~jaxdp.accounting.dpsgd_accounting.dpsgd_event`);
* fixed-size batches: ``SampledWithoutReplacement(N, B, Gaussian(sigma / 2))``
  per step, replace-one, by RDP (Wang, Balle & Kasiviswanathan 2019);
* correlated noise: ONE event for the whole run
  (:func:`~jaxdp.dpsgd.correlated.mf_event`: amplified BandMF, ``k x
  PoissonSampled(p, Gaussian(sigma))``, or the Gaussian of the strategy's
  (k, b)-participation sensitivity; Choquette-Choo et al. 2023); on fixed-size
  batches :func:`~jaxdp.dpsgd.correlated.accounting.fixed_size_mf_event`
  (unamplified: ``Gaussian(sigma s_1 / (2 sens_{T,1}(C)))`` replace-one; one
  band: fixed-size DP-SGD), on Poisson-sampled users ``mf_event`` at b = 1 and
  the user rate, unit ``"user"``;
* an adaptive clip norm (flat or per-layer, any selection) changes no event:
  its gradient and count noises are split so that together they cost sigma
  (Andrew et al. 2021 Thm 1; whitened, the step is the same DP-SGD step,
  :func:`~jaxdp.dpsgd.fixed_size_sampling.adaptive_dpsgd_event`,
  :meth:`~jaxdp.dpsgd.user_sampling.UserPoissonSampler.adaptive_event`).

:func:`calibrate` resolves sigma (given, or the smallest that meets
``(target_epsilon, delta)`` by the plan's ``accountant_method``, float64) by
the same analysis that gives :func:`epsilon`, so the reported epsilon of the
planned T steps never exceeds the target. :func:`step_event`,
:func:`run_event`, :func:`epsilon` and :func:`guarantee` serve the methods of
:class:`.PrivateSGD` of the same names.
"""

from __future__ import annotations

import math
from typing import Any

from jaxdp import _validation
from jaxdp.accounting import dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.dpsgd import fixed_size_sampling


def _mf_accounting():
  """:mod:`jaxdp.dpsgd.correlated.accounting` (imported late: that package builds on this one)."""
  from jaxdp.dpsgd.correlated import accounting  # pylint: disable=g-import-not-at-top
  return accounting


def check_arguments(delta: Any, allow_extra_steps: Any) -> float | None:
  """Checks the accounting arguments of :func:`.make_private`; returns ``delta`` (or None).

  ``delta`` in (0, 1) (None: only with a noise multiplier, epsilon then needs
  a delta per call); ``allow_extra_steps`` a bool (steps past T are paid and
  accounted like the others).
  """
  if delta is not None:
    delta = _validation.check_delta(delta, allow_zero=False)
  if not isinstance(allow_extra_steps, bool):
    raise TypeError(f"allow_extra_steps must be a bool, got {allow_extra_steps!r}.")
  return delta


def _fixed_size_noise_multiplier(selection: Any, target_epsilon: Any, noise_multiplier: Any,
                                 delta: Any, steps: int, noise_strategy: Any = None,
                                 accountant_method: str = "rdp") -> float:
  """sigma for a fixed-size plan: given, or calibrated to (target_epsilon, delta).

  Independent noise (any clip rule): RDP of ``SampledWithoutReplacement``
  (Wang, Balle & Kasiviswanathan 2019). Correlated noise: the run's event
  ``FixedSizeSampler.mf_event`` (unamplified matrix mechanism, or fixed-size
  DP-SGD for one band), by ``accountant_method``.
  """
  if noise_strategy is None:
    calibrate = lambda eps, d: selection.calibrate_noise_multiplier(eps, d, steps)
  else:
    calibrate = lambda eps, d: selection.calibrate_mf_noise_multiplier(
        noise_strategy, eps, d, steps, accountant_method)
  return dpsgd_accounting.resolve_with(target_epsilon, noise_multiplier, delta, calibrate)


def calibrate(selection: Any, noise_strategy: Any, *, target_epsilon: Any, noise_multiplier: Any,
              delta: Any, accountant_method: str) -> float:
  """sigma of the plan: ``noise_multiplier``, or calibrated to ``(target_epsilon, delta)``.

  ``selection`` is the plan's :class:`~.plan_selection.Selection`: the
  calibration is the analysis of its batches (Poisson, fixed-size, or the
  correlated-noise run over cyclic Poisson groups) at its q, T, relation.
  """
  q, steps, relation = selection.sample_rate, selection.steps, selection.neighbouring
  if isinstance(selection.batch_selection, fixed_size_sampling.FixedSizeSampler):
    return _fixed_size_noise_multiplier(selection.batch_selection, target_epsilon,
                                        noise_multiplier, delta, steps, noise_strategy,
                                        accountant_method)
  if noise_strategy is None:
    return dpsgd_accounting.resolve_noise_multiplier(target_epsilon, noise_multiplier, delta, q,
                                                     steps, accountant=accountant_method,
                                                     neighbouring=relation)
  from jaxdp.dpsgd import correlated  # pylint: disable=g-import-not-at-top
  return dpsgd_accounting.resolve_with(
      target_epsilon, noise_multiplier, delta,
      lambda eps, d: correlated.calibrate_mf_noise_multiplier(
          eps, d, noise_strategy, num_steps=steps, min_separation=selection.min_separation,
          sample_rate=q, accountant=accountant_method, neighbouring=relation))


def step_event(plan: Any) -> events.DpEvent:
  """The event of ONE step of ``plan`` (:meth:`.PrivateSGD.step_event`)."""
  if plan.noise_multiplier == 0.0:
    return events.NonPrivateDpEvent()
  if plan.noise_strategy is not None:
    raise ValueError("a correlated-noise run has no per-step event: its steps form one "
                     "mechanism, paid once (run_event()).")
  if isinstance(plan.batch_selection, fixed_size_sampling.FixedSizeSampler):
    return plan.batch_selection.event(plan.noise_multiplier, 1, unit=plan.unit).event
  return dpsgd_accounting.dpsgd_event(plan.noise_multiplier, plan.sample_rate, 1,
                                      neighbouring=plan.neighbouring, unit=plan.unit).event


def run_event(plan: Any) -> events.DpEvent:
  """The DpEvent of the whole run of ``plan`` (:meth:`.PrivateSGD.run_event`)."""
  if plan.noise_strategy is None:
    event = plan.step_event()
    return event if plan.steps == 1 else events.SelfComposedDpEvent(event, plan.steps)
  if isinstance(plan.batch_selection, fixed_size_sampling.FixedSizeSampler):
    return plan.batch_selection.mf_event(plan.noise_strategy, plan.noise_multiplier, plan.steps,
                                         unit=plan.unit)
  return _mf_accounting().mf_event(plan.noise_strategy, noise_multiplier=plan.noise_multiplier,
                                   num_steps=plan.steps, min_separation=plan.min_separation,
                                   sample_rate=plan.sample_rate, unit=plan.unit,
                                   neighbouring=plan.neighbouring)


def epsilon(plan: Any, steps: int, delta: float | None = None) -> float:
  """Epsilon of ``steps`` paid steps of ``plan`` (:meth:`.PrivateSGD.epsilon`)."""
  if delta is None:
    if plan.delta is None:
      raise ValueError("give delta: the plan was made with a noise multiplier and no delta.")
    delta = plan.delta
  steps = int(steps)
  if steps < 0:
    raise ValueError(f"steps must be >= 0, got {steps}.")
  if steps == 0:
    return 0.0
  if plan.noise_multiplier == 0.0:
    return math.inf
  fixed_size = isinstance(plan.batch_selection, fixed_size_sampling.FixedSizeSampler)
  if plan.noise_strategy is not None and fixed_size:
    return plan.batch_selection.mf_epsilon(plan.noise_strategy, plan.noise_multiplier,
                                           plan.steps, delta, plan.accountant_method)
  if plan.noise_strategy is not None:
    return _mf_accounting().mf_epsilon(
        plan.noise_strategy, noise_multiplier=plan.noise_multiplier, num_steps=plan.steps,
        min_separation=plan.min_separation, sample_rate=plan.sample_rate, delta=delta,
        accountant=plan.accountant_method, neighbouring=plan.neighbouring)
  if fixed_size:
    return plan.batch_selection.epsilon(plan.noise_multiplier, steps, delta,
                                        plan.accountant_method)
  return dpsgd_accounting.dpsgd_epsilon(plan.noise_multiplier, plan.sample_rate, steps,
                                        delta, plan.accountant_method, plan.neighbouring)


def guarantee(plan: Any, steps: int, delta: float | None = None) -> Any:
  """:func:`epsilon` as a ``PrivacyGuarantee`` (:meth:`.PrivateSGD.guarantee`)."""
  from jaxdp.accounting.accountant import PrivacyGuarantee  # pylint: disable=g-import-not-at-top
  eps = plan.epsilon(steps, delta)
  return PrivacyGuarantee(eps, float(plan.delta if delta is None else delta),
                          plan.neighbouring, plan.unit, plan.accountant_method)


__all__ = ["calibrate", "check_arguments", "epsilon", "guarantee", "run_event", "step_event"]
