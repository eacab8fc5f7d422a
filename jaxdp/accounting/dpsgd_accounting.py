"""Privacy accounting of DP-SGD (Abadi et al. 2016; paper 000 Section 3.1).

One DP-SGD step with Poisson sampling at rate q and Gaussian noise of
standard deviation ``noise_multiplier · clip_norm`` on the sum of clipped
per-example gradients is the event ``PoissonSampled(q, Gaussian(z))``;
T steps are its T-fold self-composition (:func:`dpsgd_event`). Epsilon is
computed by dp_accounting's RDP accountant (Mironov, Talwar & Zhang 2019) or
its PLD accountant (Koskela et al.; Doroshenko et al. 2022), in float64.

Neighbouring relation (``neighbouring=``):

* ``"add_remove"`` (default; Abadi et al. 2016): one example added or removed
  changes the clipped sum by one clipped gradient, L2 sensitivity ``C``. RDP or PLD.
* ``"replace_one"``: one example replaced by another changes the sum by at most
  ``2C``; Poisson subsampling gives the pair
  ``(1 - q) N(0, s^2) + q N(+C, s^2)`` vs ``(1 - q) N(0, s^2) + q N(-C, s^2)``
  (Zhu, Dong & Wang 2022), accounted by dp_accounting's PLD in its
  ``REPLACE_ONE`` mode. PLD only (no RDP bound is used for it). The event is
  tagged ``replace_one`` with noise multiplier ``s / (2C) = z / 2`` (the
  convention of :mod:`jaxdp.accounting.events`: noise over the replace-one
  sensitivity ``2C``); :func:`jaxdp.accounting.events.replace_one_sampled_gaussian_std`
  maps it back to dp_accounting's ``z``. At the same ``z`` replace-one costs more
  epsilon (e.g. q = 0.01, z = 1, 1,000 steps, delta = 1e-5: 2.84 vs 1.83).
"""

from __future__ import annotations

import functools
import math

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from jaxdp import _validation
from jaxdp.accounting import events

_PLD_DISCRETIZATION = 1e-4
# The replace-one sampled Gaussian PLD is built point by point (~10x slower than
# add/remove at 1e-4); its calibration searches on a 10x coarser grid (still a
# pessimistic upper bound) and then checks the answer at _PLD_DISCRETIZATION.
_PLD_SEARCH_DISCRETIZATION_REPLACE_ONE = 1e-3


def check_relation_and_accountant(neighbouring, accountant: str,
                                  name: str = "accountant") -> str:
  """Validates ``neighbouring`` and its pairing with ``accountant``; returns the relation.

  ``name``: the accountant argument's name in the caller's signature (e.g.
  ``"accountant_method"``), used in the error messages.

  Raises:
    ValueError: an unknown relation or accountant, or ``replace_one`` with
      ``"rdp"`` (replace-one DP-SGD is accounted by PLD only).
  """
  if accountant not in ("rdp", "pld"):
    raise ValueError(f"{name} must be 'rdp' or 'pld', got {accountant!r}.")
  relation = events.check_neighbouring(neighbouring)
  if relation == events.REPLACE_ONE and accountant != "pld":
    raise ValueError(
        "neighbouring='replace_one' DP-SGD is accounted by PLD only (the replace-one "
        f"subsampled Gaussian, Zhu, Dong & Wang 2022): pass {name}='pld', got {accountant!r}.")
  return relation


def dpsgd_event(noise_multiplier: float, sample_rate: float, steps: int, *,
                neighbouring: str = events.ADD_REMOVE,
                unit: str = events.DEFAULT_UNIT) -> events.DpEvent:
  """The DpEvent of ``steps`` Poisson-sampled Gaussian DP-SGD steps at ``z = sigma / C``.

  ``neighbouring="add_remove"``: ``PoissonSampled(q, Gaussian(z))`` tagged
  add/remove (Abadi et al. 2016; Mironov, Talwar & Zhang 2019: one unit added
  or removed moves the clipped sum by at most ``C``).
  ``neighbouring="replace_one"``: ``PoissonSampled(q, Gaussian(z / 2))`` tagged
  replace-one (one unit replaced moves it by at most ``2C``; see the module
  docstring), which a :class:`~jaxdp.accounting.PrivacyAccountant` bounds by PLD.
  """
  noise_multiplier = _validation.check_positive(noise_multiplier, "noise_multiplier")
  sample_rate = _validation.check_sample_rate(sample_rate)
  steps = _validation.check_positive_int(steps, "steps")
  relation = events.check_neighbouring(neighbouring)
  z_event = noise_multiplier if relation == events.ADD_REMOVE else 0.5 * noise_multiplier
  gaussian = events.GaussianDpEvent(z_event, neighbouring=relation, unit=unit)
  return events.SelfComposedDpEvent(events.PoissonSampledDpEvent(sample_rate, gaussian), steps)


def make_accountant(accountant: str = "rdp", neighbouring: str = events.ADD_REMOVE, *,
                    pld_discretization: float = _PLD_DISCRETIZATION
                    ) -> dp_accounting.PrivacyAccountant:
  """A fresh dp_accounting accountant for DP-SGD: ``"rdp"`` or ``"pld"`` (replace-one: PLD only).

  ``pld_discretization``: the PLD's value discretisation interval (its
  estimates are pessimistic at any interval; smaller is tighter and slower).
  """
  relation = check_relation_and_accountant(neighbouring, accountant)
  if accountant == "rdp":
    return rdp_privacy_accountant.RdpAccountant()
  rel = (dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE if relation == events.ADD_REMOVE
         else dp_accounting.NeighboringRelation.REPLACE_ONE)
  return pld_privacy_accountant.PLDAccountant(
      neighboring_relation=rel,
      value_discretization_interval=_validation.check_positive(pld_discretization,
                                                               "pld_discretization"))


def _dpa_event(noise_multiplier: float, sample_rate: float, steps: int) -> events.DpEvent:
  """The untagged dp_accounting event at dp_accounting's ``z = sigma / C`` (either relation)."""
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(
          noise_multiplier)), steps)


def _epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
             accountant: str, relation: str,
             pld_discretization: float = _PLD_DISCRETIZATION) -> float:
  """:func:`dpsgd_epsilon` on validated arguments, at a given PLD discretisation."""
  acc = make_accountant(accountant, relation, pld_discretization=pld_discretization)
  acc.compose(_dpa_event(noise_multiplier, sample_rate, steps))
  return float(acc.get_epsilon(delta))


def dpsgd_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                  accountant: str = "rdp", neighbouring: str = events.ADD_REMOVE) -> float:
  """ε of DP-SGD after ``steps`` steps at (δ, q, z).

  >>> round(dpsgd_epsilon(1.5, 0.04, 2250, 1e-5), 4)  # Opacus pins 7.32911 (3e-5 relative)
  7.3293

  Args:
    noise_multiplier: z = σ / clip_norm (> 0).
    sample_rate: Poisson sampling probability q in (0, 1].
    steps: number of steps T ≥ 1.
    delta: target δ in (0, 1).
    accountant: ``"rdp"`` or ``"pld"`` (``"pld"`` only for replace-one).
    neighbouring: ``"add_remove"`` (default) or ``"replace_one"`` (module docstring).

  Returns:
    ε in float64.
  """
  delta = _validation.check_delta(delta, allow_zero=False)
  noise_multiplier = _validation.check_positive(noise_multiplier, "noise_multiplier")
  sample_rate = _validation.check_sample_rate(sample_rate)
  steps = _validation.check_positive_int(steps, "steps")
  relation = check_relation_and_accountant(neighbouring, accountant)
  return _epsilon(noise_multiplier, sample_rate, steps, delta, accountant, relation)


def calibrate_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                               accountant: str = "rdp", tol: float = 1e-4,
                               neighbouring: str = events.ADD_REMOVE) -> float:
  """Smallest noise multiplier ``z = sigma / C`` (to ``tol``) for which DP-SGD meets (ε, δ).

  Brent search of dp_accounting's ``calibrate_dp_mechanism``; the result is
  then checked, and nudged up if needed, so that
  ``dpsgd_epsilon(result, ..., neighbouring=neighbouring) <= target_epsilon``
  always holds. ``neighbouring="replace_one"`` needs ``accountant="pld"``.
  """
  target_epsilon = _validation.check_epsilon(target_epsilon, "target_epsilon")
  delta = _validation.check_delta(delta, allow_zero=False)
  sample_rate = _validation.check_sample_rate(sample_rate)
  steps = _validation.check_positive_int(steps, "steps")
  tol = _validation.check_positive(tol, "tol")
  relation = check_relation_and_accountant(neighbouring, accountant)
  return _calibrate_noise_multiplier(float(target_epsilon), float(delta), float(sample_rate),
                                     int(steps), accountant, float(tol), relation)


@functools.lru_cache(maxsize=256)
def _calibrate_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float,
                                steps: int, accountant: str, tol: float,
                                relation: str = events.ADD_REMOVE) -> float:
  """:func:`calibrate_noise_multiplier` on validated arguments, memoised.

  A deterministic function of public parameters (one Brent search costs 1-30 s
  of RDP/PLD compositions); a run that calibrates the same (eps, delta, q, T)
  twice (an experiment grid, a notebook cell re-run) pays for it once.
  """

  def make_event(z: float) -> events.DpEvent:
    return _dpa_event(z, sample_rate, steps)

  # RDP is cheap and never tighter than PLD, so its answer brackets PLD's from
  # above; starting PLD from tiny multipliers would need enormous grids. For
  # replace-one, the add/remove RDP answer at epsilon / 2 brackets from above:
  # add/remove (eps/2, delta/2) implies replace-one (eps, (1 + e^(eps/2)) delta/2)
  # by group privacy, so it is only a starting bracket, widened if it misses.
  rdp_eps, rdp_delta = ((target_epsilon, delta) if relation == events.ADD_REMOVE
                        else (0.5 * target_epsilon, 0.5 * delta))
  z_rdp = dp_accounting.calibrate_dp_mechanism(
      lambda: make_accountant("rdp"), make_event, rdp_eps, rdp_delta,
      bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=tol)
  if accountant == "rdp":
    z = z_rdp
  else:
    lower, upper = 0.5 * z_rdp, z_rdp + tol
    interval = _PLD_DISCRETIZATION
    if relation == events.REPLACE_ONE:
      # The RDP answer at (eps/2, delta/2) is only a starting bracket: widen it
      # (epsilon decreases in z) until it holds the root.
      interval = _PLD_SEARCH_DISCRETIZATION_REPLACE_ONE
      search = functools.partial(_epsilon, sample_rate=sample_rate, steps=steps, delta=delta,
                                 accountant=accountant, relation=relation,
                                 pld_discretization=interval)
      while search(upper) > target_epsilon:
        lower, upper = upper, 2.0 * upper
      while search(lower) <= target_epsilon:
        lower, upper = 0.5 * lower, lower
    z = dp_accounting.calibrate_dp_mechanism(
        lambda: make_accountant(accountant, relation, pld_discretization=interval),
        make_event, target_epsilon, delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(lower, upper), tol=tol)
  z = float(z)
  for _ in range(10_000):
    if _epsilon(z, sample_rate, steps, delta, accountant, relation) <= target_epsilon:
      return z
    z += tol
  raise RuntimeError("noise calibration failed to reach the target epsilon.")  # pragma: no cover


def resolve_noise_multiplier(target_epsilon: float | None, noise_multiplier: float | None,
                             delta: float | None, sample_rate: float, steps: int,
                             accountant: str = "rdp",
                             neighbouring: str = events.ADD_REMOVE) -> float:
  """The DP-SGD noise multiplier from exactly one of ``target_epsilon`` or ``noise_multiplier``.

  With ``target_epsilon``: :func:`calibrate_noise_multiplier` (the smallest ``sigma``
  whose ``steps`` Poisson-subsampled Gaussian steps at ``sample_rate`` are
  ``(target_epsilon, delta)``-DP; ``delta`` required). Otherwise ``noise_multiplier``
  itself, checked to be ``>= 0``.

  Raises:
    ValueError: both or neither given, ``target_epsilon`` without ``delta``, or bad values.
  """
  return resolve_with(target_epsilon, noise_multiplier, delta,
                      lambda eps, d: calibrate_noise_multiplier(eps, d, sample_rate, steps,
                                                                accountant=accountant,
                                                                neighbouring=neighbouring))


def resolve_with(target_epsilon: float | None, noise_multiplier: float | None,
                 delta: float | None, calibrate) -> float:
  """``noise_multiplier`` (checked ``>= 0``), or ``calibrate(target_epsilon, delta)``: exactly one.

  The argument rule every noise calibration of a plan shares (DP-SGD, fixed-size
  batches, correlated noise); ``calibrate`` is the mechanism's own calibration.

  Raises:
    ValueError: both or neither given, or ``target_epsilon`` without ``delta``.
  """
  if (target_epsilon is None) == (noise_multiplier is None):
    raise ValueError("give exactly one of target_epsilon or noise_multiplier.")
  if target_epsilon is None:
    return _validation.check_nonnegative(noise_multiplier, "noise_multiplier")
  if delta is None:
    raise ValueError("delta is required with target_epsilon.")
  return float(calibrate(target_epsilon, delta))


# -- fixed-size batches: sampling without replacement, replace-one neighbours ----------------------


def check_fixed_size_accountant(accountant: str, name: str = "accountant") -> str:
  """Validates the accountant of fixed-size (sampled without replacement) DP-SGD: ``"rdp"`` only.

  dp_accounting (0.6) analyses ``SampledWithoutReplacementDpEvent`` with its RDP
  accountant in ``REPLACE_ONE`` mode only (Wang, Balle & Kasiviswanathan 2019,
  Thm 27); its PLD accountant has no analysis of that event.

  Raises:
    ValueError: ``"pld"`` or any other value, naming ``name``.
  """
  if accountant == "pld":
    raise ValueError(
        f"fixed-size batches (sampling without replacement) are accounted by RDP only: "
        f"dp_accounting's PLD has no analysis of SampledWithoutReplacementDpEvent; pass "
        f"{name}='rdp', got 'pld'.")
  if accountant != "rdp":
    raise ValueError(f"{name} must be 'rdp' for fixed-size batches, got {accountant!r}.")
  return accountant


def _check_fixed_size(num_examples: int, batch_size: int) -> tuple[int, int]:
  n = _validation.check_positive_int(num_examples, "num_examples")
  b = _validation.check_positive_int(batch_size, "batch_size")
  if b > n:
    raise ValueError(f"batch_size must be <= num_examples={n} (a subset of distinct examples), "
                     f"got {b}.")
  return n, b


def fixed_size_dpsgd_event(noise_multiplier: float, num_examples: int, batch_size: int,
                           steps: int, *, unit: str = events.DEFAULT_UNIT) -> events.DpEvent:
  """The DpEvent of ``steps`` DP-SGD steps on fixed-size batches drawn without replacement.

  Each step sums the clipped gradients (norm <= C) of a uniformly random subset
  of exactly ``B = batch_size`` of the ``N = num_examples`` examples and adds
  ``N(0, (z C)^2 I)``. The dataset size N is public, so the relation is
  REPLACE-ONE (one example replaced by another; add/remove would change N and
  the subset law): replacing one example moves the sum by at most ``2C``. By
  the convention of :mod:`jaxdp.accounting.events` (noise over the sensitivity
  under the event's own relation) the Gaussian is ``Gaussian(z / 2)`` tagged
  replace-one, as in :func:`dpsgd_event` with ``neighbouring="replace_one"``;
  it is exactly the ``noise_multiplier`` dp_accounting's RDP accountant expects
  for ``SampledWithoutReplacementDpEvent`` (its base Gaussian RDP is
  ``alpha / (2 noise_multiplier^2)``, the Gaussian mechanism of replace-one
  sensitivity ``2C``; Wang, Balle & Kasiviswanathan 2019, "Subsampled Renyi
  differential privacy and analytical moments accountant", Thm 9 and Thm 27).
  Amplification by sampling without replacement under replace-one: Balle,
  Barthe & Gaboardi 2018, "Privacy amplification by subsampling", Thm 10.

  Returns:
    ``SelfComposed(SampledWithoutReplacement(N, B, Gaussian(z / 2, replace_one, unit)), T)``,
    which a :class:`~jaxdp.accounting.PrivacyAccountant` bounds by ``"rdp"``
    (not ``"pld"``: dp_accounting has no PLD of this event).
  """
  noise_multiplier = _validation.check_positive(noise_multiplier, "noise_multiplier")
  n, b = _check_fixed_size(num_examples, batch_size)
  steps = _validation.check_positive_int(steps, "steps")
  gaussian = events.GaussianDpEvent(0.5 * noise_multiplier, neighbouring=events.REPLACE_ONE,
                                    unit=unit)
  return events.SelfComposedDpEvent(events.SampledWithoutReplacementDpEvent(n, b, gaussian), steps)


def _dpa_fixed_size_event(noise_multiplier: float, num_examples: int, batch_size: int,
                          steps: int) -> events.DpEvent:
  """Untagged dp_accounting twin of :func:`fixed_size_dpsgd_event` (Gaussian ``z / 2``)."""
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.SampledWithoutReplacementDpEvent(
          num_examples, batch_size, dp_accounting.GaussianDpEvent(0.5 * noise_multiplier)), steps)


def _fixed_size_accountant() -> dp_accounting.PrivacyAccountant:
  return rdp_privacy_accountant.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)


def _fixed_size_epsilon(noise_multiplier: float, num_examples: int, batch_size: int, steps: int,
                        delta: float) -> float:
  acc = _fixed_size_accountant()
  acc.compose(_dpa_fixed_size_event(noise_multiplier, num_examples, batch_size, steps))
  return float(acc.get_epsilon(delta))


def fixed_size_dpsgd_epsilon(noise_multiplier: float, num_examples: int, batch_size: int,
                             steps: int, delta: float, accountant: str = "rdp") -> float:
  """Replace-one ε of ``steps`` fixed-size DP-SGD steps (:func:`fixed_size_dpsgd_event`) at δ.

  dp_accounting's RDP accountant in ``REPLACE_ONE`` mode (Wang, Balle &
  Kasiviswanathan 2019, Thm 27), float64. ``accountant="pld"`` raises.
  """
  delta = _validation.check_delta(delta, allow_zero=False)
  noise_multiplier = _validation.check_positive(noise_multiplier, "noise_multiplier")
  n, b = _check_fixed_size(num_examples, batch_size)
  steps = _validation.check_positive_int(steps, "steps")
  check_fixed_size_accountant(accountant)
  return _fixed_size_epsilon(noise_multiplier, n, b, steps, delta)


def calibrate_fixed_size_noise_multiplier(target_epsilon: float, delta: float, num_examples: int,
                                          batch_size: int, steps: int, accountant: str = "rdp",
                                          tol: float = 1e-3) -> float:
  """Smallest ``z = sigma / C`` (to ``tol``) whose fixed-size DP-SGD run is (ε, δ) replace-one DP.

  Brent search of dp_accounting's ``calibrate_dp_mechanism`` on
  :func:`fixed_size_dpsgd_epsilon`; the answer is then checked, and nudged up
  if needed, so ``fixed_size_dpsgd_epsilon(result, ...) <= target_epsilon``
  always holds. Each evaluation costs about 0.5 s (dp_accounting's RDP of
  sampling without replacement at its default orders), a calibration ~10 s;
  memoised.
  """
  target_epsilon = _validation.check_epsilon(target_epsilon, "target_epsilon")
  delta = _validation.check_delta(delta, allow_zero=False)
  n, b = _check_fixed_size(num_examples, batch_size)
  steps = _validation.check_positive_int(steps, "steps")
  tol = _validation.check_positive(tol, "tol")
  check_fixed_size_accountant(accountant)
  return _calibrate_fixed_size(float(target_epsilon), float(delta), n, b, steps, float(tol))


@functools.lru_cache(maxsize=64)
def _calibrate_fixed_size(target_epsilon: float, delta: float, num_examples: int,
                          batch_size: int, steps: int, tol: float) -> float:
  z = float(dp_accounting.calibrate_dp_mechanism(
      _fixed_size_accountant,
      lambda z: _dpa_fixed_size_event(z, num_examples, batch_size, steps),
      target_epsilon, delta,
      bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-2, 2.0), tol=tol))
  for _ in range(10_000):
    if _fixed_size_epsilon(z, num_examples, batch_size, steps, delta) <= target_epsilon:
      return z
    z += tol
  raise RuntimeError("noise calibration failed to reach the target epsilon.")  # pragma: no cover


def expected_batch_size(sample_rate: float, dataset_size: int) -> float:
  """q · N, the batch size that DP-SGD's noisy sum is divided by."""
  return _validation.check_sample_rate(sample_rate) * _validation.check_positive_int(
      dataset_size, "dataset_size")


def steps_for_epochs(epochs: float, sample_rate: float) -> int:
  """ceil(epochs / q): the number of Poisson-sampled steps in ``epochs`` epochs."""
  epochs = _validation.check_positive(epochs, "epochs")
  return int(math.ceil(epochs / _validation.check_sample_rate(sample_rate)))


__all__ = [
    "calibrate_fixed_size_noise_multiplier",
    "calibrate_noise_multiplier",
    "check_fixed_size_accountant",
    "check_relation_and_accountant",
    "dpsgd_epsilon",
    "dpsgd_event",
    "expected_batch_size",
    "fixed_size_dpsgd_epsilon",
    "fixed_size_dpsgd_event",
    "make_accountant",
    "steps_for_epochs",
]
