"""Privacy accounting of DP-SGD (Abadi et al. 2016; paper 000 Section 3.1).

One DP-SGD step with Poisson sampling at rate q and Gaussian noise of
standard deviation ``noise_multiplier · clip_norm`` on the sum of clipped
per-example gradients is the event ``PoissonSampled(q, Gaussian(z))``;
T steps are its T-fold self-composition (:func:`dpsgd_event`). Epsilon is
computed by dp_accounting's RDP accountant (Mironov, Talwar & Zhang 2019) or
its PLD accountant (Koskela et al.; Doroshenko et al. 2022), in float64,
under the add-or-remove-one neighbouring relation that Poisson sampling
amplification assumes.
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


def dpsgd_event(noise_multiplier: float, sample_rate: float, steps: int, *,
                unit: str = events.DEFAULT_UNIT) -> events.DpEvent:
  """The DpEvent of ``steps`` Poisson-sampled Gaussian DP-SGD steps.

  Tagged ``neighbouring="add_remove"``: the Poisson subsampled Gaussian
  analysis (Abadi et al. 2016; Mironov, Talwar & Zhang 2019, the RDP that
  dp_accounting computes in its default ``ADD_OR_REMOVE_ONE`` mode) is for
  one unit added or removed, and the clip norm bounds the sum's sensitivity
  under that relation.
  """
  noise_multiplier = _validation.check_positive(noise_multiplier, "noise_multiplier")
  sample_rate = _validation.check_sample_rate(sample_rate)
  steps = _validation.check_positive_int(steps, "steps")
  gaussian = events.GaussianDpEvent(noise_multiplier, neighbouring=events.ADD_REMOVE, unit=unit)
  return events.SelfComposedDpEvent(events.PoissonSampledDpEvent(sample_rate, gaussian), steps)


def make_accountant(accountant: str = "rdp") -> dp_accounting.PrivacyAccountant:
  """A fresh dp_accounting accountant: ``"rdp"`` or ``"pld"``."""
  if accountant == "rdp":
    return rdp_privacy_accountant.RdpAccountant()
  if accountant == "pld":
    return pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=_PLD_DISCRETIZATION)
  raise ValueError(f"accountant must be 'rdp' or 'pld', got {accountant!r}.")


def dpsgd_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                  accountant: str = "rdp") -> float:
  """ε of DP-SGD after ``steps`` steps at (δ, q, z).

  >>> round(dpsgd_epsilon(1.5, 0.04, 2250, 1e-5), 4)  # Opacus pins 7.32911 (3e-5 relative)
  7.3293

  Args:
    noise_multiplier: z = σ / clip_norm (> 0).
    sample_rate: Poisson sampling probability q in (0, 1].
    steps: number of steps T ≥ 1.
    delta: target δ in (0, 1).
    accountant: ``"rdp"`` or ``"pld"``.

  Returns:
    ε in float64.
  """
  delta = _validation.check_delta(delta, allow_zero=False)
  event = dpsgd_event(noise_multiplier, sample_rate, steps)
  acc = make_accountant(accountant)
  acc.compose(event)
  return float(acc.get_epsilon(delta))


def calibrate_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                               accountant: str = "rdp", tol: float = 1e-4) -> float:
  """Smallest noise multiplier (to ``tol``) for which DP-SGD meets (ε, δ).

  Brent search of dp_accounting's ``calibrate_dp_mechanism``; the result is
  then checked, and nudged up if needed, so that
  ``dpsgd_epsilon(result, ...) <= target_epsilon`` always holds.
  """
  target_epsilon = _validation.check_epsilon(target_epsilon, "target_epsilon")
  delta = _validation.check_delta(delta, allow_zero=False)
  sample_rate = _validation.check_sample_rate(sample_rate)
  steps = _validation.check_positive_int(steps, "steps")
  tol = _validation.check_positive(tol, "tol")
  return _calibrate_noise_multiplier(float(target_epsilon), float(delta), float(sample_rate),
                                     int(steps), accountant, float(tol))


@functools.lru_cache(maxsize=256)
def _calibrate_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float,
                                steps: int, accountant: str, tol: float) -> float:
  """:func:`calibrate_noise_multiplier` on validated arguments, memoised.

  A deterministic function of public parameters (one Brent search costs 1-30 s
  of RDP/PLD compositions); a run that calibrates the same (eps, delta, q, T)
  twice (an experiment grid, a notebook cell re-run) pays for it once.
  """

  def make_event(z: float) -> events.DpEvent:
    return dpsgd_event(z, sample_rate, steps)

  # RDP is cheap and never tighter than PLD, so its answer brackets PLD's from
  # above; starting PLD from tiny multipliers would need enormous grids.
  z_rdp = dp_accounting.calibrate_dp_mechanism(
      lambda: make_accountant("rdp"), make_event, target_epsilon, delta,
      bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=tol)
  if accountant == "rdp":
    z = z_rdp
  else:
    z = dp_accounting.calibrate_dp_mechanism(
        lambda: make_accountant(accountant), make_event, target_epsilon, delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(0.5 * z_rdp, z_rdp + tol), tol=tol)
  z = float(z)
  for _ in range(10_000):
    if dpsgd_epsilon(z, sample_rate, steps, delta, accountant) <= target_epsilon:
      return z
    z += tol
  raise RuntimeError("noise calibration failed to reach the target epsilon.")  # pragma: no cover


def resolve_noise_multiplier(target_epsilon: float | None, noise_multiplier: float | None,
                             delta: float | None, sample_rate: float, steps: int,
                             accountant: str = "rdp") -> float:
  """The DP-SGD noise multiplier from exactly one of ``target_epsilon`` or ``noise_multiplier``.

  With ``target_epsilon``: :func:`calibrate_noise_multiplier` (the smallest ``sigma``
  whose ``steps`` Poisson-subsampled Gaussian steps at ``sample_rate`` are
  ``(target_epsilon, delta)``-DP; ``delta`` required). Otherwise ``noise_multiplier``
  itself, checked to be ``>= 0``.

  Raises:
    ValueError: both or neither given, ``target_epsilon`` without ``delta``, or bad values.
  """
  if (target_epsilon is None) == (noise_multiplier is None):
    raise ValueError("give exactly one of target_epsilon or noise_multiplier.")
  if target_epsilon is None:
    return _validation.check_nonnegative(noise_multiplier, "noise_multiplier")
  if delta is None:
    raise ValueError("delta is required with target_epsilon.")
  return calibrate_noise_multiplier(target_epsilon, delta, sample_rate, steps,
                                    accountant=accountant)


def expected_batch_size(sample_rate: float, dataset_size: int) -> float:
  """q · N, the batch size that DP-SGD's noisy sum is divided by."""
  return _validation.check_sample_rate(sample_rate) * _validation.check_positive_int(
      dataset_size, "dataset_size")


def steps_for_epochs(epochs: float, sample_rate: float) -> int:
  """ceil(epochs / q): the number of Poisson-sampled steps in ``epochs`` epochs."""
  epochs = _validation.check_positive(epochs, "epochs")
  return int(math.ceil(epochs / _validation.check_sample_rate(sample_rate)))


__all__ = [
    "calibrate_noise_multiplier",
    "dpsgd_epsilon",
    "dpsgd_event",
    "expected_batch_size",
    "make_accountant",
    "steps_for_epochs",
]
