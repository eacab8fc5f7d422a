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
  return _calibrate_one_gaussian(
      target_epsilon, delta, ratio, accountant, tol,
      lambda sigma: mf_epsilon(strategy, noise_multiplier=sigma, num_steps=n, min_separation=b,
                               sample_rate=p, delta=delta, accountant=accountant,
                               neighbouring=relation))


def _calibrate_one_gaussian(target_epsilon: float, delta: float, ratio: float, accountant: str,
                            tol: float, epsilon_of) -> float:
  """Smallest sigma with ``epsilon_of(sigma) <= target`` for a run that is ``Gaussian(sigma / ratio)``.

  The Gaussian's multiplier ``mu`` is calibrated (``"pld"``: the exact analytic
  Gaussian, Balle & Wang 2018; ``"rdp"``: dp_accounting), ``sigma = mu * ratio``,
  then checked with ``epsilon_of`` and nudged up (doubling steps) until it holds.
  """
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
    if epsilon_of(sigma) <= target_epsilon:
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


# -- other batch selections: fixed-size subsets and Poisson-sampled users ------------------------
#
# Neither realises cyclic (k, b)-participation with b > 1, so the amplified analysis above
# (Choquette-Choo et al. 2023 Thm 4 needs b-min-sep cyclic Poisson with bands <= b) is out of
# reach for a banded C with more than one band. The DETERMINISTIC analysis needs nothing from
# the selection but that it is independent of the data: conditioned on the selected sets
# S_0, ..., S_{n-1}, the run is the Gaussian matrix mechanism ``C x + z`` (adaptive streams:
# Denisov et al. 2022, Thm 2.1), and the unit's participation pattern is the set of steps
# whose S_t holds it: any subset of {0, .., n-1}, i.e. (k, b) = (n, 1) participation
# (:func:`.sensitivity.sensitivity`, which maximises over ALL such patterns). The neighbouring
# datasets induce the same law of (S_t), so the mixture over the selections is no less
# private than the worst conditional Gaussian (joint convexity of the hockey-stick and Renyi
# divergences). Poisson-sampled users are DP-SGD's sampling with b = 1 and the user as the
# unit: exactly :func:`mf_event` at ``min_separation=1`` and ``sample_rate=q``
# (``UserPoissonSampler.mf_event``). Fixed-size subsets need their own entry points below.


def fixed_size_analysis(strategy, num_examples: int, batch_size: int) -> str:
  """Which analysis a fixed-size MF run gets: :func:`analysis` at ``b = 1``, ``p = B / N``.

  ``"amplified"`` exactly for a ONE-band strategy (``C`` diagonal: ``BandMF.dp_sgd()``, a
  one-band ``ColumnNormalizedBanded``) with ``B < N``: row t of ``C x + z`` is
  ``c_t x_t + z_t`` with ``|c_t| <= s_1``, independent across steps, i.e. fixed-size
  DP-SGD at noise multiplier sigma (amplification by sampling without replacement, Wang,
  Balle & Kasiviswanathan 2019). Otherwise ``"deterministic"`` (the section comment above).
  ``make_private`` may therefore keep calling ``analysis(strategy, 1, B / N)``.
  """
  _noise._check_strategy(strategy)  # pylint: disable=protected-access
  n, b = _check_fixed_size(num_examples, batch_size)
  return analysis(strategy, 1, b / n)


def _check_fixed_size(num_examples, batch_size) -> tuple[int, int]:
  n = _validation.check_positive_int(num_examples, "num_examples")
  b = _validation.check_positive_int(batch_size, "batch_size")
  if b > n:
    raise ValueError(f"batch_size must be <= num_examples={n} (a subset of distinct examples), "
                     f"got {b}.")
  return n, b


def _check_fixed_size_relation(neighbouring) -> str:
  relation = events.check_neighbouring(neighbouring)
  if relation != events.REPLACE_ONE:
    raise ValueError(
        "fixed-size batches are analysed for neighbouring='replace_one' only: N is public and "
        "the batch size B is exact, so adding or removing an example changes N (and the law of "
        "the subsets); no add/remove analysis of this selection exists here. Got "
        f"neighbouring={relation!r}.")
  return relation


def fixed_size_mf_event(strategy, *, noise_multiplier: float, num_steps: int,
                        num_examples: int, batch_size: int, unit: str = events.DEFAULT_UNIT,
                        neighbouring: str = events.REPLACE_ONE) -> events.DpEvent:
  """The DpEvent of a whole MF run on fixed-size batches (B of N without replacement, each step).

  Replace-one neighbours only (``neighbouring="add_remove"`` raises). With
  :func:`fixed_size_analysis`:

  * ``"amplified"`` (one band, ``B < N``):
    ``SelfComposed(SampledWithoutReplacement(N, B, Gaussian(sigma / 2)), n)`` tagged
    replace-one, i.e. :func:`jaxdp.accounting.dpsgd_accounting.fixed_size_dpsgd_event`
    (RDP only);
  * ``"deterministic"``: ``Gaussian(sigma s_1 / (2 sens_{n,1}(C)))`` tagged replace-one,
    exactly :func:`mf_event` at ``min_separation=1, sample_rate=1`` (the replaced example
    keeps its index, hence its participation pattern, and moves each participation's clipped
    contribution by at most ``2 S``: twice the add/remove sensitivity
    ``S sens_{n,1}(C)``; the sensitivity rule is :func:`run_sensitivity`'s).

  ``noise_multiplier`` sigma is per participation, as everywhere in this module (``z`` has
  std ``sigma S s_1``); 0 gives ``NonPrivateDpEvent``.
  """
  _noise._check_strategy(strategy)  # pylint: disable=protected-access
  n = strategy.check_num_steps(num_steps)
  num_examples, batch_size = _check_fixed_size(num_examples, batch_size)
  sigma = _validation.check_nonnegative(noise_multiplier, "noise_multiplier")
  unit = events.check_unit(unit)
  relation = _check_fixed_size_relation(neighbouring)
  if sigma == 0.0:
    return events.NonPrivateDpEvent()
  if fixed_size_analysis(strategy, num_examples, batch_size) == AMPLIFIED:
    return dpsgd_accounting.fixed_size_dpsgd_event(sigma, num_examples, batch_size, n, unit=unit)
  return mf_event(strategy, noise_multiplier=sigma, num_steps=n, min_separation=1,
                  sample_rate=1.0, unit=unit, neighbouring=relation)


def _fixed_size_mf_accountant(strategy, num_examples, batch_size, accountant) -> str:
  if accountant not in ("rdp", "pld"):
    raise ValueError(f"accountant must be 'rdp' or 'pld', got {accountant!r}.")
  if (accountant == "pld"
      and fixed_size_analysis(strategy, num_examples, batch_size) == AMPLIFIED):
    dpsgd_accounting.check_fixed_size_accountant(accountant)  # raises: RDP only
  return accountant


def fixed_size_mf_epsilon(strategy, *, noise_multiplier: float, num_steps: int,
                          num_examples: int, batch_size: int, delta: float,
                          accountant: str = "rdp") -> float:
  """Replace-one epsilon at ``delta`` of :func:`fixed_size_mf_event`, read by jaxdp's ledger.

  ``"rdp"`` for either analysis; ``"pld"`` for the deterministic one only (dp_accounting has
  no PLD of sampling without replacement). The ledger's reading of the replace-one Gaussian:
  dp_accounting's curve of the multiplier (already relative to the replace-one sensitivity).
  """
  _noise._check_strategy(strategy)  # pylint: disable=protected-access
  sigma = _validation.check_positive(noise_multiplier, "noise_multiplier")
  delta = _validation.check_delta(delta, allow_zero=False)
  num_examples, batch_size = _check_fixed_size(num_examples, batch_size)
  accountant = _fixed_size_mf_accountant(strategy, num_examples, batch_size, accountant)
  event = fixed_size_mf_event(strategy, noise_multiplier=sigma, num_steps=num_steps,
                              num_examples=num_examples, batch_size=batch_size)
  from jaxdp.accounting.accountant import PrivacyAccountant  # pylint: disable=g-import-not-at-top
  ledger = PrivacyAccountant()
  ledger.spend(event)
  return float(ledger.get_epsilon(delta, accountant))


def calibrate_fixed_size_mf_noise_multiplier(target_epsilon: float, delta: float, strategy, *,
                                             num_steps: int, num_examples: int, batch_size: int,
                                             accountant: str = "rdp",
                                             tol: float = 1e-4) -> float:
  """Smallest sigma (to ``tol``) whose fixed-size MF run is (target_epsilon, delta) replace-one DP.

  Amplified (one band): :func:`jaxdp.accounting.dpsgd_accounting.calibrate_fixed_size_noise_multiplier`
  (RDP; seconds). Deterministic: the Gaussian's multiplier ``mu`` calibrated (``"pld"``:
  analytic Gaussian; ``"rdp"``: dp_accounting), ``sigma = 2 mu sens_{n,1}(C) / s_1``, checked
  with :func:`fixed_size_mf_epsilon` and nudged up until it holds.
  """
  _noise._check_strategy(strategy)  # pylint: disable=protected-access
  n = strategy.check_num_steps(num_steps)
  num_examples, batch_size = _check_fixed_size(num_examples, batch_size)
  target_epsilon = _validation.check_epsilon(target_epsilon, "target_epsilon")
  delta = _validation.check_delta(delta, allow_zero=False)
  tol = _validation.check_positive(tol, "tol")
  accountant = _fixed_size_mf_accountant(strategy, num_examples, batch_size, accountant)
  if fixed_size_analysis(strategy, num_examples, batch_size) == AMPLIFIED:
    return dpsgd_accounting.calibrate_fixed_size_noise_multiplier(
        target_epsilon, delta, num_examples, batch_size, n, accountant, max(tol, 1e-3))
  ratio = 2.0 * run_sensitivity(strategy, n, 1)
  return _calibrate_one_gaussian(
      target_epsilon, delta, ratio, accountant, tol,
      lambda sigma: fixed_size_mf_epsilon(strategy, noise_multiplier=sigma, num_steps=n,
                                          num_examples=num_examples, batch_size=batch_size,
                                          delta=delta, accountant=accountant))


def fixed_size_adaptive_gradient_noise_multiplier(strategy, *, noise_multiplier: float,
                                                  count_noise_multiplier: float, num_steps: int,
                                                  num_examples: int, batch_size: int,
                                                  num_counts: int = 1) -> float:
  """sigma_Delta of the gradient stream of a fixed-size MF run with adaptive clipping.

  Andrew et al. 2021 Thm 1 by whitening, under REPLACE-ONE: per participation the normalised
  clipped gradient moves by at most 2 (not 1) and each of the G centred counts
  ``sum_i (b_i - 1/2)`` by at most 1 (``+1/2 -> -1/2``; not 1/2), so every term of the
  whitened squared sensitivity is exactly 4 times its add/remove value and the split that
  makes the add/remove run cost sigma makes the replace-one run cost sigma too (the event
  already carries the factor 2). Hence the add/remove formulas of
  :func:`adaptive_gradient_noise_multiplier` at ``b = 1, p = B / N``:

  * amplified (one band): ``gradient_noise_multiplier(sigma, sigma_b, participations=G)``;
  * deterministic: ``r gradient_noise_multiplier(sigma / r, sigma_b, participations=n G)``
    with ``r = sens_{n,1}(C) / s_1`` (every unit may take part in all n steps, each with its
    G counts).
  """
  from jaxdp.dpsgd import adaptive_clipping  # pylint: disable=g-import-not-at-top
  _noise._check_strategy(strategy)  # pylint: disable=protected-access
  n = strategy.check_num_steps(num_steps)
  num_examples, batch_size = _check_fixed_size(num_examples, batch_size)
  g = _validation.check_positive_int(num_counts, "num_counts")
  sigma = _validation.check_nonnegative(noise_multiplier, "noise_multiplier")
  if sigma == 0.0:
    return 0.0
  if fixed_size_analysis(strategy, num_examples, batch_size) == AMPLIFIED:
    return adaptive_clipping.gradient_noise_multiplier(sigma, count_noise_multiplier,
                                                       participations=g)
  ratio = run_sensitivity(strategy, n, 1)
  return ratio * adaptive_clipping.gradient_noise_multiplier(
      sigma / ratio, count_noise_multiplier, participations=n * g)


def steps_for_epochs(epochs: float, sample_rate: float, min_separation: int) -> int:
  """``ceil(epochs * b / p)``: steps for ``epochs`` expected passes (b groups, in-group rate p)."""
  epochs = _validation.check_positive(epochs, "epochs")
  p = _validation.check_sample_rate(sample_rate)
  b = _validation.check_positive_int(min_separation, "min_separation")
  return int(math.ceil(epochs / (p / b)))


__all__ = ["AMPLIFIED", "DETERMINISTIC", "adaptive_gradient_noise_multiplier", "analysis",
           "calibrate_fixed_size_mf_noise_multiplier", "calibrate_mf_noise_multiplier",
           "fixed_size_adaptive_gradient_noise_multiplier", "fixed_size_analysis",
           "fixed_size_mf_epsilon", "fixed_size_mf_event", "mf_epsilon", "mf_event",
           "run_sensitivity", "steps_for_epochs"]
