"""The state a private training plan carries between steps, and what a step reports.

:class:`PrivateState` is the optax state of the plan's optimiser (noise key,
step count, optimiser moments): the only thing :meth:`.PrivateSGD.step`
threads from one update to the next, and what a checkpoint holds.
:class:`StepInfo` is the step's diagnostics; they are computed from private
data without noise, so every field is named ``nonprivate_*``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax


class _PrivateStateFields(NamedTuple):
  opt_state: Any


class PrivateState(_PrivateStateFields):
  """State of a :class:`.PrivateSGD` run: the optax state of ``PrivateSGD.optimizer``.

  ``opt_state[0]`` is the :class:`~.transforms.NoisyAggregateState` (the
  noise key, split every step, and the count of noisy updates applied).
  A pytree (save it with :meth:`.PrivateSGD.save` or any checkpointer). The
  states :meth:`.PrivateSGD.step` returns also remember their step count on
  the host, so the step check needs no device round trip.
  """

  @property
  def step(self) -> jax.Array:
    """Number of noisy updates applied so far (int32 scalar on device)."""
    return self.opt_state[0].count

  def _host_step(self) -> int:
    """The step count without a device sync when this state came from ``step``."""
    known = self.__dict__.get("_known_step")
    return int(self.step) if known is None else known


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """NON-PRIVATE diagnostics of one step (never publish them unaccounted).

  They depend on individual examples: the realised batch size differs between
  add/remove neighbours, and the loss sum and clip count are unnoised sums over
  the batch. Their names say so (``nonprivate_*``, the library's rule for every
  value computed from private data without noise).

  Attributes:
    nonprivate_loss_sum: sum of the per-example losses of the batch (before the update).
    nonprivate_num_examples: realised Poisson batch size.
    nonprivate_num_clipped: examples whose gradient was scaled down.
  """

  nonprivate_loss_sum: jax.Array
  nonprivate_num_examples: jax.Array
  nonprivate_num_clipped: jax.Array


jax.tree_util.register_dataclass(
    StepInfo,
    data_fields=["nonprivate_loss_sum", "nonprivate_num_examples", "nonprivate_num_clipped"],
    meta_fields=[])


__all__ = ["PrivateState", "StepInfo"]
