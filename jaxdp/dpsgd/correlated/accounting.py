"""Privacy accounting of matrix-factorization training: one DpEvent per run.

Notation: n steps, cyclic groups ``b = min_separation`` with in-group Poisson
rate p (:mod:`.participation`), at most ``k = ceil(n / b)`` participations
per example, a strategy C (:class:`~.strategies.Strategy`) with
single-participation sensitivity ``s_1 = max_t ||C[:, t]||`` and noise ``z ~ N(0, (sigma S s_1)^2 I)`` on ``C x``
(:mod:`.noise`; S is the clip norm). Two sound analyses, both add/remove of
one ``unit``:

* **Amplified** (a banded strategy -- ``BandMF`` or ``ColumnNormalizedBanded``
  -- with ``bands <= b`` and ``p < 1``): Choquette-Choo et al. 2023, "(Amplified)
  banded matrix factorization", Theorem 4, which holds for any lower-triangular
  b-banded C (Toeplitz or not). Column t of a b-banded C is supported on rows ``t .. t + b - 1``, so the k possible
  participations of one example (steps ``g, g + b, ...``) touch disjoint
  blocks of ``C x + z``. Each block is a Poisson-subsampled Gaussian (the
  mixture ``(1 - p) N(0, s^2) + p N(C[:, t] g, s^2)`` against ``N(0, s^2)``) with
  ``||C[:, t] g|| <= S s_1`` (s_1 the largest column norm), i.e. noise
  multiplier sigma; adaptivity is covered
  by the theorem. The run is exactly k compositions of
  ``PoissonSampled(p, Gaussian(sigma))``: DP-SGD's event with q = p and k
  steps (:func:`jaxdp.accounting.dpsgd_event`), accounted by dp_accounting's
  PLD or RDP of that mixture.
* **Deterministic** (any strategy, any p; sampling is not credited): the
  whole run is one Gaussian mechanism on ``C x`` (Denisov et al. 2022,
  Theorem 2.1 for adaptive streams) with sensitivity
  ``S * sens_{k,b}(C)`` (:func:`.sensitivity.sensitivity`), i.e.
  ``Gaussian(sigma * s_1 / sens_{k,b}(C))``.

:func:`mf_event` picks the amplified analysis exactly when it applies. For
one band (``BandMF.dp_sgd()``, ``b = 1``): amplified gives
``SelfComposed(PoissonSampled(q, Gaussian(sigma)), n)``, DP-SGD's event
itself; with p = 1 the deterministic event ``Gaussian(sigma / sqrt(n))`` has
DP-SGD's full-batch epsilon (n Gaussians compose to one).

All numbers are float64 (numpy, dp_accounting).
"""

from __future__ import annotations

import functools
import math

import dp_accounting
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.dpsgd.correlated import noise as _noise
from jaxdp.dpsgd.correlated import participation as _participation
from jaxdp.dpsgd.correlated import sensitivity as _sensitivity
from jaxdp.dpsgd.correlated import strategies as _strategies

AMPLIFIED = "amplified"
DETERMINISTIC = "deterministic"


def analysis(strategy, min_separation: int, sample_rate: float) -> str:
  """``"amplified"`` for a banded strategy with ``bands <= b`` and ``p < 1``, else ``"deterministic"``."""
  b = _validation.check_positive_int(min_separation, "min_separation")
  p = _validation.check_sample_rate(sample_rate)
  if (isinstance(strategy, _strategies.Strategy) and strategy.bands is not None
      and strategy.bands <= b and p < 1.0):
    return AMPLIFIED
  return DETERMINISTIC


def run_sensitivity(strategy, num_steps: int, min_separation: int) -> float:
  """``sens_{k,b}(C) / s_1``: the run's L2 sensitivity in units of one participation's."""
  k = _participation.max_participations(num_steps, min_separation)
  sens = _sensitivity.sensitivity(strategy, num_steps, max_participations=k,
                                  min_separation=min_separation)
  return float(sens) / _noise.single_participation_sensitivity(strategy, num_steps)


def _checked(strategy, num_steps, min_separation, sample_rate):
  _noise._check_strategy(strategy)  # pylint: disable=protected-access
  n = strategy.check_num_steps(num_steps)
  b = _validation.check_positive_int(min_separation, "min_separation")
  p = _validation.check_sample_rate(sample_rate)
  return n, b, p


def mf_event(strategy, *, noise_multiplier: float, num_steps: int, min_separation: int,
             sample_rate: float, unit: str = events.DEFAULT_UNIT,
             neighbouring: str = events.ADD_REMOVE) -> events.DpEvent:
  """The DpEvent of a whole MF run (module docstring), tagged ``neighbouring`` per ``unit``.

  Add/remove -- amplified: ``SelfComposed(PoissonSampled(p, Gaussian(sigma)), k)``;
  deterministic: ``Gaussian(sigma s_1 / sens_{k,b}(C))``.

  Replace-one: a replaced record keeps its index, hence its cyclic group, and
  moves each participation's clipped contribution by at most ``2 S`` (the
  replace-one sensitivity of a clipped sum). Amplified: in the proof of
  Choquette-Choo et al. 2023 Thm 4 each of the k blocks of ``C x + z`` is then
  the replace-one Poisson-subsampled Gaussian, the mixture pair of one
  replace-one DP-SGD step (Zhu, Dong & Wang 2022), i.e.
  ``SelfComposed(PoissonSampled(p, Gaussian(sigma / 2)), k)`` tagged
  replace-one (:func:`jaxdp.accounting.dpsgd_event`, accounted by PLD);
  deterministic: one Gaussian of twice the add/remove sensitivity,
  ``Gaussian(sigma s_1 / (2 sens_{k,b}(C)))``. ``noise_multiplier = 0``
  gives ``NonPrivateDpEvent``.
  """
  n, b, p = _checked(strategy, num_steps, min_separation, sample_rate)
  sigma = _validation.check_nonnegative(noise_multiplier, "noise_multiplier")
  unit = events.check_unit(unit)
  relation = events.check_neighbouring(neighbouring)
  if sigma == 0.0:
    return events.NonPrivateDpEvent()
  if analysis(strategy, b, p) == AMPLIFIED:
    return dpsgd_accounting.dpsgd_event(sigma, p, _participation.max_participations(n, b),
                                        neighbouring=relation, unit=unit)
  scale = 2.0 if relation == events.REPLACE_ONE else 1.0
  return events.GaussianDpEvent(sigma / (scale * run_sensitivity(strategy, n, b)),
                                neighbouring=relation, unit=unit)


def mf_epsilon(strategy, *, noise_multiplier: float, num_steps: int, min_separation: int,
               sample_rate: float, delta: float, accountant: str = "rdp",
               neighbouring: str = events.ADD_REMOVE) -> float:
  """Epsilon at ``delta`` of the run's event (:func:`mf_event`) by dp_accounting's ``"rdp"`` or ``"pld"``.

  Replace-one needs ``"pld"`` (the replace-one sampled Gaussian, as for DP-SGD).
  """
  n, b, p = _checked(strategy, num_steps, min_separation, sample_rate)
  sigma = _validation.check_positive(noise_multiplier, "noise_multiplier")
  delta = _validation.check_delta(delta, allow_zero=False)
  relation = dpsgd_accounting.check_relation_and_accountant(neighbouring, accountant)
  event = mf_event(strategy, noise_multiplier=sigma, num_steps=n, min_separation=b,
                   sample_rate=p, neighbouring=relation)
  if relation == events.REPLACE_ONE:
    # jaxdp's shared accountant: the ledger's own reading of the tagged replace-one event
    # (a sampled Gaussian by the dominating pair of Zhu, Dong & Wang 2022; a plain Gaussian
    # whose multiplier is already relative to the replace-one sensitivity).
    from jaxdp.accounting.accountant import PrivacyAccountant  # pylint: disable=g-import-not-at-top
    ledger = PrivacyAccountant()
    ledger.spend(event)
    return float(ledger.get_epsilon(delta, accountant))
  acc = dpsgd_accounting.make_accountant(accountant, relation)
  acc.compose(event)
  return float(acc.get_epsilon(delta))


def adaptive_gradient_noise_multiplier(strategy, *, noise_multiplier: float,
                                       count_noise_multiplier: float, num_steps: int,
                                       min_separation: int, sample_rate: float) -> float:
  """sigma_Delta of the gradient stream when adaptive clipping's counts share the run's sigma.

  Andrew et al. 2021 Theorem 1 (whitening; :mod:`jaxdp.dpsgd.adaptive_clipping`):

  * amplified: each round is a sampled Gaussian of the block of ``C x + z`` and
    that step's count, so ``sigma^-2 = sigma_Delta^-2 + (2 sigma_b)^-2`` as in DP-SGD;
  * deterministic: the run is one Gaussian with ``r = sens_{k,b}(C) / s_1`` and k
    counts, ``r^2 / sigma^2 = r^2 / sigma_Delta^2 + k / (2 sigma_b)^2``, i.e.
    ``sigma_Delta = r * gradient_noise_multiplier(sigma / r, sigma_b, participations=k)``.
  """
  from jaxdp.dpsgd import adaptive_clipping  # pylint: disable=g-import-not-at-top
  n, b, p = _checked(strategy, num_steps, min_separation, sample_rate)
  if analysis(strategy, b, p) == AMPLIFIED:
    return adaptive_clipping.gradient_noise_multiplier(noise_multiplier, count_noise_multiplier)
  ratio = run_sensitivity(strategy, n, b)
  return ratio * adaptive_clipping.gradient_noise_multiplier(
      noise_multiplier / ratio, count_noise_multiplier,
      participations=_participation.max_participations(n, b))


def calibrate_mf_noise_multiplier(target_epsilon: float, delta: float, strategy, *,
                                  num_steps: int, min_separation: int, sample_rate: float,
                                  accountant: str = "rdp", tol: float = 1e-4,
                                  neighbouring: str = events.ADD_REMOVE) -> float:
  """Smallest sigma (to ``tol``) whose run is (target_epsilon, delta)-DP by ``accountant``.

  Amplified runs use DP-SGD's calibration with q = p and k steps
  (:func:`jaxdp.accounting.calibrate_noise_multiplier`); deterministic runs
  calibrate the Gaussian's multiplier ``mu`` with dp_accounting and return
  ``sigma = mu * sens_{k,b}(C) / s_1``. The result is checked (and nudged
  up) so that :func:`mf_epsilon` ``<= target_epsilon``.
  """
  n, b, p = _checked(strategy, num_steps, min_separation, sample_rate)
  target_epsilon = _validation.check_epsilon(target_epsilon, "target_epsilon")
  delta = _validation.check_delta(delta, allow_zero=False)
  tol = _validation.check_positive(tol, "tol")
  relation = dpsgd_accounting.check_relation_and_accountant(neighbouring, accountant)
  if analysis(strategy, b, p) == AMPLIFIED:
    return dpsgd_accounting.calibrate_noise_multiplier(
        target_epsilon, delta, p, _participation.max_participations(n, b), accountant=accountant,
        tol=tol, neighbouring=relation)
  # Replace-one doubles the run's sensitivity (mf_event).
  ratio = run_sensitivity(strategy, n, b) * (2.0 if relation == events.REPLACE_ONE else 1.0)
  if accountant == "pld":
    # The exact Gaussian (Balle & Wang 2018); PLD's pessimistic rounding is nudged below.
    from jaxdp.accounting import analytic_gaussian  # pylint: disable=g-import-not-at-top
    mu = float(analytic_gaussian.analytic_gaussian_sigma(float(target_epsilon), float(delta),
                                                          1.0))
  else:
    mu = _gaussian_multiplier(float(target_epsilon), float(delta), accountant, float(tol))
  sigma = mu * ratio
  step = tol * ratio
  for _ in range(200):  # upward only, with doubling steps: a few accountant calls
    if mf_epsilon(strategy, noise_multiplier=sigma, num_steps=n, min_separation=b,
                  sample_rate=p, delta=delta, accountant=accountant,
                  neighbouring=relation) <= target_epsilon:
      return float(sigma)
    sigma += step
    step *= 2.0
  raise RuntimeError("noise calibration failed to reach the target epsilon.")  # pragma: no cover


@functools.lru_cache(maxsize=128)
def _gaussian_multiplier(target_epsilon: float, delta: float, accountant: str,
                         tol: float) -> float:
  """Smallest Gaussian noise multiplier with epsilon <= target by ``accountant`` (memoised)."""
  return float(dp_accounting.calibrate_dp_mechanism(
      lambda: dpsgd_accounting.make_accountant(accountant), dp_accounting.GaussianDpEvent,
      target_epsilon, delta,
      bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=tol))


def steps_for_epochs(epochs: float, sample_rate: float, min_separation: int) -> int:
  """``ceil(epochs * b / p)``: steps for ``epochs`` expected passes (b groups, in-group rate p)."""
  epochs = _validation.check_positive(epochs, "epochs")
  p = _validation.check_sample_rate(sample_rate)
  b = _validation.check_positive_int(min_separation, "min_separation")
  return int(math.ceil(epochs / (p / b)))


__all__ = ["AMPLIFIED", "DETERMINISTIC", "adaptive_gradient_noise_multiplier", "analysis", "calibrate_mf_noise_multiplier",
           "mf_epsilon", "mf_event", "run_sensitivity", "steps_for_epochs"]
