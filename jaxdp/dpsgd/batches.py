"""The batches of a private plan: paid index chunks, gathered chunks, device-side steps.

A batch exists only after its step was paid (:class:`.PaidSampler` spends
before it hands one out), and :meth:`.PrivateSGD.step` accepts nothing else:

* :class:`PoissonBatch` -- the sampled index chunks of one paid step (host);
  ``gather(x, y)`` takes their rows;
* :class:`PrivateBatch` -- the gathered chunks ``(K, P, ...)`` with their
  ``(K, P)`` mask (padding never enters the clipped sum);
* :class:`DeviceBatch` -- a paid step of a device-resident sampler: only the
  step's sampling key; the batch is drawn inside the jitted step.

A batch whose ``gather`` or ``step`` refused its inputs stays usable: the
sampler hands it out again, so a refused call never wastes a paid step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp.dpsgd import _inputs, sampling


class PoissonBatch:
  """The index chunks of one paid Poisson batch (host side); see :meth:`gather`.

  A batch is consumed only by a successful :meth:`.PrivateSGD.step`. A
  :meth:`gather` or ``step`` that refuses its inputs leaves it usable: gather it
  again (or call ``sampler.sample()``, which hands the same paid batch out
  again), so a failed call never wastes a paid step.

  Attributes:
    step_index: the step this batch was paid for (0-based).
    chunks: list of :class:`~.sampling.PaddedBatch` of size P (more than one
      only when the batch overflowed P, or with a small ``physical_batch_size``).
  """

  def __init__(self, plan: "PrivateSGD", step_index: int, chunks: list[sampling.PaddedBatch],
               sampler: "PaidSampler | None" = None):
    self._plan = plan
    self._sampler = sampler
    self.step_index = step_index
    self.chunks = chunks
    self._used = False

  @property
  def num_examples(self) -> int:
    """Realised batch size (NON-PRIVATE: do not publish it)."""
    return int(sum(c.num_examples for c in self.chunks))

  def _kept(self) -> str:
    return (f" Nothing was spent by this call: the paid batch of step {self.step_index} is kept "
            "for a corrected call (sampler.sample() hands it out again).")

  def _refused(self) -> None:
    """Marks the batch for reuse after a refused gather/step (the next sample() returns it)."""
    if self._sampler is not None and not self._used:
      self._sampler._hand_out_again(self)  # pylint: disable=protected-access

  def gather(self, *arrays: Any) -> "PrivateBatch":
    """The batch's examples of ``arrays`` (dataset on the leading axis), stacked per chunk.

    One argument per batch argument of the per-example loss (``batch_argnums``),
    e.g. ``gather(x, y)``. Every array must be real numeric data with exactly
    ``num_examples`` rows (the N that q and ``q N`` were computed from), finite
    in the sampled rows, and integer labels for a loss made by
    :func:`~.train.make_per_example_loss` (the checks of
    :func:`~.train.train_dpsgd`, shared in ``_inputs``). A refused call leaves
    the batch usable (class docstring).
    """
    try:
      return self._gather(arrays)
    except (TypeError, ValueError):
      self._refused()
      raise

  def _gather(self, arrays: tuple) -> "PrivateBatch":
    plan = self._plan
    kept = self._kept()
    if len(arrays) != len(plan.batch_argnums):
      raise ValueError(f"gather needs {len(plan.batch_argnums)} arrays (one per batch argument "
                       f"of the loss, batch_argnums={plan.batch_argnums}), got {len(arrays)}."
                       + kept)
    names = tuple(f"gather argument {i}" for i in range(len(arrays)))
    label = plan._label_position()  # pylint: disable=protected-access
    if label is not None:
      _inputs.check_label_dtype(arrays[label], names[label] + " (labels)", kept)
      _inputs.check_label_shape(arrays[label], names[label] + " (labels)", kept)
    slots = [c.slots_and_mask() for c in self.chunks]
    idx = np.stack([i for i, _ in slots])  # (K, P)
    mask = np.stack([m for _, m in slots])  # (K, P)
    # Index where the data lives (host numpy or device), then move only the batch.
    taken = _inputs.check_examples(arrays, names, plan.num_examples, take=idx, where=kept)
    if self._sampler is not None:
      try:
        self._sampler._bind_data(arrays, self.step_index)  # pylint: disable=protected-access
      except ValueError as err:
        raise ValueError(f"{err}{kept}") from None
    host_labels = taken[label] if label is not None else None
    taken = jax.tree.map(jnp.asarray, taken)
    return PrivateBatch(self, sampling.MaskedBatch(taken, jnp.asarray(mask)), host_labels)


class PrivateBatch:
  """A gathered :class:`PoissonBatch`: stacked chunks ``(K, P, ...)`` with their ``(K, P)`` mask.

  The only batch type :meth:`.PrivateSGD.step` accepts; usable once.
  """

  def __init__(self, ticket: PoissonBatch, masked: sampling.MaskedBatch, host_labels: Any = None):
    self._ticket = ticket
    self.masked = masked
    self._host_labels = host_labels

  @property
  def step_index(self) -> int:
    return self._ticket.step_index

  @property
  def num_chunks(self) -> int:
    return int(self.masked.mask.shape[0])


class DeviceBatch(PrivateBatch):
  """A paid step of a sampler with device-resident data (``sampler(..., data=)``).

  Holds only the step's sampling key: the Poisson batch is drawn, gathered
  and padded inside the jit-compiled :meth:`.PrivateSGD.step`
  (:mod:`.device_sampling`). Usable once, like :class:`PrivateBatch`.
  """

  def __init__(self, ticket: "PoissonBatch", step_key_data: np.ndarray):
    super().__init__(ticket, None, None)
    self._step_key_data = step_key_data

  @property
  def num_chunks(self) -> int:
    raise AttributeError("a DeviceBatch is sampled inside the step; it has no host chunks.")

  def gather(self, *arrays: Any) -> "DeviceBatch":
    """Refused: a device-resident sampler already holds the data (nothing is consumed)."""
    del arrays
    raise TypeError(
        "a DeviceBatch needs no gather: the sampler holds the data (sampler(accountant, "
        "data=...)) and PrivateSGD.step samples and gathers inside the jitted update. Pass the "
        f"batch to step as it is. Nothing was spent: the paid batch of step {self.step_index} "
        "is still usable.")


__all__ = ["DeviceBatch", "PoissonBatch", "PrivateBatch"]
