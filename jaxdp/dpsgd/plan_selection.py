"""Batch selection of a private plan: which examples a step sees, at which rate, in which chunks.

Four selections, each with its own accounting (:mod:`.plan_accounting`):

* Poisson sampling of examples at rate q (Abadi et al. 2016; the default):
  add/remove or replace-one neighbours, divisor ``q N``;
* cyclic Poisson sampling over b groups (with a correlated-noise strategy,
  :class:`~.correlated.CyclicPoissonSampler`): step t samples group
  ``t mod b`` at the in-group rate q, so two participations of one example
  are at least b steps apart (Choquette-Choo et al. 2023);
* fixed-size batches, B of N without replacement
  (:class:`~.fixed_size_sampling.FixedSizeSampler`): replace-one neighbours,
  RDP of the subsampled Gaussian without replacement (Wang, Balle &
  Kasiviswanathan 2019), divisor B;
* Poisson sampling of users (:class:`~.user_sampling.UserPoissonSampler`):
  one clipped contribution per user, privacy unit ``"user"`` (McMahan et al.
  2018).

:func:`resolve` checks the selection arguments of :func:`.make_private` and
fixes q, T, b, the relation and the unit; :func:`with_chunks` fixes the static
chunk size P and the divisor; :func:`host_sampler` is the selection's host
form (the device form is in :mod:`.device_path`). The accountant is told the
same q the sampler draws with because both come from this one resolution.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np

from jaxdp import _validation
from jaxdp.accounting import dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.dpsgd import data_digest, fixed_size_sampling, sampling, user_sampling


class Selection(NamedTuple):
  """The batch selection of a plan (see the module docstring).

  Attributes:
    num_examples: N.
    neighbouring: the relation of the events (``events.ADD_REMOVE`` / ``REPLACE_ONE``).
    unit: the privacy unit of the events (``"user"`` with user-level sampling).
    sample_rate: q: the Poisson rate (in-group rate for cyclic Poisson; ``B / N`` fixed-size).
    steps: the planned number of steps T.
    min_separation: b, the cyclic groups (1 unless a correlated-noise strategy is used).
    cyclic: whether the batches are cyclic Poisson (a correlated-noise plan).
    batch_selection: the ``FixedSizeSampler`` / ``UserPoissonSampler``, or None.
    padded_size: the static chunk size P (None before :func:`with_chunks`).
    expected_batch_size: the divisor of the noisy sum (None before :func:`with_chunks`).
    participation: the :class:`~.correlated.CyclicPoissonSampler` of a cyclic plan, or None.
  """

  num_examples: int
  neighbouring: str
  unit: str
  sample_rate: float
  steps: int
  min_separation: int
  cyclic: bool
  batch_selection: Any
  padded_size: int | None = None
  expected_batch_size: float | None = None
  participation: Any = None


def check_batch_selection(selection: Any, n: int, *, relation: str, accountant_method: str,
                          unit: str, given: dict) -> tuple[float, str]:
  """Checks a ``batch_selection`` sampler against the plan; returns ``(rate, unit)``.

  * :class:`~.fixed_size_sampling.FixedSizeSampler` (B of N without
    replacement): replace-one neighbours only (N is public and B exact: the
    bounds below are replace-one results); the rate reported is ``B / N``.
    Every clip rule (fixed or adaptive, flat or per-layer, microbatches) and
    every noise: independent and adaptive-clip steps are
    ``SampledWithoutReplacement(N, B, Gaussian(sigma / 2))`` by RDP (Wang,
    Balle & Kasiviswanathan 2019; adaptive clipping whitened to the same
    step, ``fixed_size_sampling.adaptive_dpsgd_event``); correlated noise is
    the matrix mechanism WITHOUT amplification, every example in up to all T
    steps (``correlated.accounting.fixed_size_mf_event``; one band: fixed-size
    DP-SGD). dp_accounting has no PLD of sampling without replacement, so
    ``accountant_method="pld"`` is refused unless the run's event is the one
    Gaussian of a multi-band strategy.
  * :class:`~.user_sampling.UserPoissonSampler`: Poisson sampling of users,
    one clipped contribution per user; the privacy unit is ``"user"`` (the
    default unit becomes ``"user"``; another explicit unit is refused).
    Fixed or adaptive clip norms (Andrew et al. 2021 is stated for users),
    every noise (correlated: b = 1, amplified for one band only).

  Refused, with the reason: ``min_separation > 1`` with either (neither
  sampler guarantees any separation between two participations of a unit;
  amplified banded MF needs b-min-separated cyclic Poisson sampling,
  Choquette-Choo et al. 2023 Thm 4); ``per_layer`` and ``microbatch_size``
  with users (user-level clipping has neither feature).
  """
  fixed = isinstance(selection, fixed_size_sampling.FixedSizeSampler)
  if not fixed and not isinstance(selection, user_sampling.UserPoissonSampler):
    raise TypeError("batch_selection must be a FixedSizeSampler or a UserPoissonSampler (None: "
                    f"Poisson sampling at sample_rate), got {type(selection).__name__}.")
  name = type(selection).__name__
  for arg in ("sample_rate", "expected_batch_size"):
    if given[arg] is not None:
      raise ValueError(f"{arg} is fixed by batch_selection={name}; leave it out.")
  _check_separation(given["min_separation"], given["noise_strategy"], name)
  if not fixed:
    for arg, off in (("per_layer", False), ("microbatch_size", None)):
      if given[arg] != off:
        raise ValueError(
            f"{arg}={given[arg]!r} is not available with batch_selection={name}: user-level "
            "clipping clips each user's whole gradient as ONE vector (user_clipped_grad) and "
            "has no per-layer or microbatch mode (the analysis would be unchanged; the feature "
            "is missing). Memory per step is bounded by the user slots per chunk "
            "(UserPoissonSampler(padded_size=)).")
  if selection.num_examples != n:
    raise ValueError(f"batch_selection was built for {selection.num_examples} examples but "
                     f"num_examples={n}.")
  if fixed:
    if relation != events.REPLACE_ONE:
      raise ValueError("batch_selection=FixedSizeSampler needs neighbouring='replace_one': a "
                       "fixed-size batch reveals nothing about N only under replace-one, and the "
                       "subsampling-without-replacement bound is proven for it.")
    _check_fixed_size_accountant(selection, given["noise_strategy"], accountant_method)
    return selection.sample_rate, unit
  if unit not in (events.DEFAULT_UNIT, user_sampling.USER_UNIT):
    raise ValueError(f"batch_selection=UserPoissonSampler protects one user: unit must be "
                     f"{user_sampling.USER_UNIT!r}, got {unit!r}.")
  return selection.sample_rate, user_sampling.USER_UNIT


def _check_separation(min_separation: Any, noise_strategy: Any, name: str) -> None:
  """``min_separation`` with a batch_selection sampler: left out, or 1 with a noise_strategy."""
  if min_separation is None:
    return
  if noise_strategy is None:
    raise ValueError("min_separation needs noise_strategy (DP-SGD samples every example at "
                     "every step).")
  if _validation.check_positive_int(min_separation, "min_separation") > 1:
    raise ValueError(
        f"min_separation={min_separation} is not available with batch_selection={name}: the "
        "sampler gives no separation guarantee (an example or user may take part in any two "
        "consecutive steps), so cyclic groups and the amplified banded matrix mechanism "
        "(Choquette-Choo et al. 2023 Thm 4, b-min-separated cyclic Poisson sampling) do not "
        "apply; that would need a cyclic fixed-size or cyclic user sampler. Leave "
        "min_separation out (or 1): the run is accounted as the matrix mechanism without "
        "amplification, every unit in up to all T steps.")


def _check_fixed_size_accountant(selection: Any, noise_strategy: Any, accountant_method: str):
  """RDP for an event sampled without replacement; RDP or PLD for a multi-band MF run's Gaussian."""
  if noise_strategy is not None and accountant_method in ("rdp", "pld"):
    from jaxdp.dpsgd.correlated import accounting  # pylint: disable=g-import-not-at-top
    if accounting.fixed_size_analysis(noise_strategy, selection.num_examples,
                                      selection.batch_size) == accounting.DETERMINISTIC:
      return  # one Gaussian for the whole run: PLD and RDP both apply
  dpsgd_accounting.check_fixed_size_accountant(accountant_method, "accountant_method")


def resolve(num_examples: int, *, sample_rate: Any, expected_batch_size: Any, epochs: Any,
            steps: Any, neighbouring: Any, accountant_method: str, unit: Any,
            batch_selection: Any, noise_strategy: Any, min_separation: Any,
            refused: dict) -> Selection:
  """Checks the selection arguments of :func:`.make_private`; fixes relation, unit, q, T and b.

  ``refused`` holds the other parts' arguments a ``batch_selection`` sampler
  may refuse (``per_layer``, ``microbatch_size``: not with users). A
  ``noise_strategy`` (already checked by :func:`.plan_noise.check_strategy`)
  makes Poisson batches cyclic Poisson over ``min_separation`` groups; with a
  ``batch_selection`` sampler the batches stay the sampler's (b = 1).
  """
  n = _validation.check_positive_int(num_examples, "num_examples")
  if isinstance(batch_selection, fixed_size_sampling.FixedSizeSampler):
    # Fixed-size batches are accounted by RDP (the only bound for sampling without replacement).
    relation = events.check_neighbouring(neighbouring)
  else:
    relation = dpsgd_accounting.check_relation_and_accountant(neighbouring, accountant_method,
                                                              "accountant_method")
  unit = events.check_unit(unit)
  if batch_selection is None:
    q = sampling.resolve_sample_rate(sample_rate, expected_batch_size, n)
  else:
    q, unit = check_batch_selection(
        batch_selection, n, relation=relation, accountant_method=accountant_method, unit=unit,
        given=dict(sample_rate=sample_rate, expected_batch_size=expected_batch_size,
                   noise_strategy=noise_strategy, min_separation=min_separation, **refused))
  if (epochs is None) == (steps is None):
    raise ValueError("give exactly one of epochs or steps.")
  t_planned = (dpsgd_accounting.steps_for_epochs(epochs, q) if steps is None
               else _validation.check_positive_int(steps, "steps"))
  b = 1
  if noise_strategy is not None and batch_selection is not None:
    noise_strategy.check_num_steps(t_planned)  # b = 1: the sampler's own batches, no groups
  elif noise_strategy is not None:
    b, q, t_planned = _cyclic(noise_strategy, n, q, t_planned, sample_rate=sample_rate,
                              expected_batch_size=expected_batch_size, epochs=epochs,
                              steps=steps, min_separation=min_separation)
  elif min_separation is not None:
    raise ValueError("min_separation needs noise_strategy (DP-SGD samples every example at "
                     "every step).")
  cyclic = noise_strategy is not None and batch_selection is None
  return Selection(n, relation, unit, q, t_planned, b, cyclic, batch_selection)


def _cyclic(noise_strategy: Any, n: int, q: float, t_planned: int, *, sample_rate: Any,
            expected_batch_size: Any, epochs: Any, steps: Any,
            min_separation: Any) -> tuple[int, float, int]:
  """``(b, q, T)`` of cyclic Poisson sampling: b groups, in-group rate q, T for the strategy."""
  from jaxdp.dpsgd import correlated  # pylint: disable=g-import-not-at-top
  if min_separation is None:
    if noise_strategy.bands is None:
      raise ValueError("min_separation is required with a BLT noise_strategy (the number of "
                       "cyclic groups b; e.g. the steps of one epoch).")
    min_separation = noise_strategy.bands
  b = _validation.check_positive_int(min_separation, "min_separation")
  if b > n:
    raise ValueError(f"min_separation must be <= num_examples={n}, got {b}.")
  if sample_rate is None and expected_batch_size is not None:
    eb = _validation.check_positive(expected_batch_size, "expected_batch_size")
    if eb * b > n:
      raise ValueError(f"expected_batch_size must be in (0, num_examples / min_separation = "
                       f"{n / b}], got {eb}.")
    q = _validation.check_sample_rate(eb * b / n)
  t_planned = (correlated.accounting.steps_for_epochs(epochs, q, b) if steps is None
               else t_planned)
  noise_strategy.check_num_steps(t_planned)  # a strategy built for fewer steps is refused
  return b, q, t_planned


def with_chunks(selection: Selection, *, physical_batch_size: Any, overflow_prob: Any,
                group_key: Any) -> Selection:
  """The selection with its static chunk size P and its divisor (expected batch size).

  Poisson: P is the binomial bound at ``overflow_prob`` unless
  ``physical_batch_size`` fixes it (a larger batch is split into several
  chunks, never truncated), divisor ``q N``. Cyclic Poisson: the same at the
  in-group rate, groups drawn from ``group_key``, divisor ``q N / b``. A
  ``batch_selection`` sampler carries its own P and divisor.
  """
  n, q, participation = selection.num_examples, selection.sample_rate, None
  if selection.batch_selection is not None:
    if physical_batch_size is not None:
      raise ValueError("physical_batch_size is set on the batch_selection sampler "
                       "(padded_size=), not on make_private.")
    padded = selection.batch_selection.padded_size
    expected = selection.batch_selection.expected_batch_size
  elif not selection.cyclic:
    # Validates physical_batch_size / overflow_prob and fixes P once.
    padded = sampling.PoissonSampler(n, q, padded_size=physical_batch_size,
                                     overflow_prob=overflow_prob, on_overflow="split").padded_size
    expected = q * n
  else:
    from jaxdp.dpsgd import correlated  # pylint: disable=g-import-not-at-top
    participation = correlated.CyclicPoissonSampler(
        n, selection.min_separation, q, selection.steps, group_key,
        padded_size=physical_batch_size, overflow_prob=overflow_prob)
    padded = participation.padded_size
    expected = participation.expected_batch_size
  return selection._replace(padded_size=padded, expected_batch_size=expected,
                            participation=participation)


def host_sampler(plan: Any) -> Any:
  """The host form of ``plan``'s selection: the sampler :class:`.PaidSampler` draws batches from.

  The ``batch_selection`` sampler, cyclic Poisson (``sample(t, key)``), or a
  :class:`~.sampling.PoissonSampler` at rate q with chunks of size P whose
  overflow is split into extra chunks (``sample(key)``).
  """
  if plan.batch_selection is not None:
    return plan.batch_selection
  if plan.noise_strategy is not None:
    return plan._participation  # pylint: disable=protected-access
  return sampling.PoissonSampler(plan.num_examples, plan.sample_rate,
                                 padded_size=plan.padded_size, on_overflow="split")


def selection_digest(selection: Any) -> str | None:
  """What fixes a batch_selection sampler's batches: its parameters and (users) its user table."""
  if selection is None:
    return None
  h = hashlib.sha256(repr(selection).encode())
  if isinstance(selection, user_sampling.UserPoissonSampler):
    h.update(data_digest.digest(np.asarray(selection._rows)).encode())  # pylint: disable=protected-access
  return h.hexdigest()


__all__ = ["Selection", "check_batch_selection", "host_sampler", "resolve", "selection_digest",
           "with_chunks"]
