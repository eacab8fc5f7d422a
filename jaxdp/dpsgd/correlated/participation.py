"""Cyclic Poisson participation: at most k participations, any two at least b steps apart.

The sensitivity of a matrix mechanism depends on WHEN one example can
contribute (Choquette-Choo et al. 2023, "Multi-epoch matrix factorization
mechanisms for private machine learning", Section 2: (k, b)-participation).
:class:`CyclicPoissonSampler` realises the schema that both the sensitivity
(:mod:`.sensitivity`) and the amplified accounting (:mod:`.accounting`) assume,
"b-min-sep cyclic Poisson sampling" (Choquette-Choo et al. 2023, "(Amplified)
banded matrix factorization: a unified approach to private training",
Section 4):

* every example is assigned once, independently of all others and of the
  data, to one of b groups: ``group(n) = u_n mod b`` for i.i.d. 32-bit words
  ``u_n`` drawn from the plan's key (an add/remove neighbour leaves every
  other example's group unchanged in distribution);
* step t uses only group ``t mod b``: example n is in batch t iff
  ``group(n) = t mod b`` and ``v_{t,n} < floor(p 2^32)`` (the Poisson rule of
  :func:`jaxdp.dpsgd.poisson_sample_indices` with in-group rate p).

So an example can only take part in steps ``g, g + b, g + 2b, ...``: at most
``k = ceil(n / b)`` participations, any two exactly b apart, whatever the
keys: the schema holds by construction, and the sampler refuses steps
outside ``[0, num_steps)`` (the n the sensitivity and the accounting were
computed for). The expected batch size ``p N / b`` is a data-independent
constant (the divisor of the noisy sum). With ``b = 1`` every example is in
group 0 and the batches are exactly DP-SGD's Poisson batches for the same key.

The same batches on the device: :func:`cyclic_groups` is the group rule as a
traceable function. JAX's Threefry is partitionable
(``jax_threefry_partitionable``, the default), so the word ``u_n`` of
``jax.random.bits(group_key, (R,))`` depends on the key and on ``n`` alone,
not on R, on the mesh, or on the device or process that evaluates it
(:mod:`jaxdp.dpsgd.device_sampling`, whose inclusion bits rest on the same
fact). The device-resident path of ``make_private`` therefore draws batch t as
``inclusion_mask(step_key) & (cyclic_groups(group_key) == t mod b)``: row for
row the batch :meth:`CyclicPoissonSampler.indices` draws on the host for the
same keys, on any mesh and any number of processes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.errors import BudgetExceededError
from jaxdp.dpsgd import sampling as _sampling


def max_participations(num_steps: int, min_separation: int) -> int:
  """``k = ceil(n / b)``: the most steps one example can join under cyclic b-groups."""
  n = _validation.check_positive_int(num_steps, "num_steps")
  b = _validation.check_positive_int(min_separation, "min_separation")
  return int(math.ceil(n / b))


def cyclic_groups(group_key: jax.Array, num_rows: int, min_separation: int) -> jax.Array:
  """``(num_rows,)`` int32: the group ``u_n mod b`` of rows ``n = 0 .. num_rows - 1``.

  ``u = jax.random.bits(group_key, (num_rows,), uint32)``. Traceable (for use
  inside ``jax.jit``, also with the output sharded over a mesh); ``num_rows``
  and ``min_separation`` are static. Row n's group depends on the key and n
  only (partitionable Threefry; module docstring), so rows ``n < N`` get the
  groups of :func:`group_assignment` for any ``num_rows >= N`` (e.g. the
  ``N_pad`` rows of a sharded dataset, whose padding rows never join a batch).
  """
  b = int(min_separation)
  if b == 1:
    return jnp.zeros((num_rows,), jnp.int32)
  bits = jax.random.bits(group_key, (num_rows,), jnp.uint32)
  return (bits % jnp.uint32(b)).astype(jnp.int32)


def group_assignment(key: jax.Array, num_examples: int, min_separation: int) -> np.ndarray:
  """The group ``u_n mod b`` of each of the N examples (host int32; module docstring)."""
  _validation.check_key(key)
  n = _validation.check_positive_int(num_examples, "num_examples")
  b = _validation.check_positive_int(min_separation, "min_separation")
  return np.asarray(cyclic_groups(key, n, b))


class CyclicPoissonSampler:
  """b-min-sep cyclic Poisson batches over ``num_steps`` steps (module docstring).

  Args:
    num_examples: dataset size N.
    min_separation: number of groups b (the minimum separation of two
      participations of one example).
    sample_rate: in-group Poisson rate p in (0, 1].
    num_steps: n; steps outside ``[0, n)`` are refused.
    group_key: ``jax.random`` key of the group assignment (drawn once); kept
      as the attribute ``group_key`` (the device-resident path draws the same
      groups from it with :func:`cyclic_groups`).
    padded_size: chunk size P (default: the binomial bound of
      :func:`~jaxdp.dpsgd.padded_batch_size` at rate ``p / b``);
      larger batches are split into more chunks, never truncated.
    overflow_prob: target overflow probability of the default P.
  """

  def __init__(self, num_examples: int, min_separation: int, sample_rate: float,
               num_steps: int, group_key: jax.Array, *, padded_size: int | None = None,
               overflow_prob: float = 1e-9):
    self.num_examples = _validation.check_positive_int(num_examples, "num_examples")
    self.min_separation = _validation.check_positive_int(min_separation, "min_separation")
    if self.min_separation > self.num_examples:
      raise ValueError(f"min_separation (the number of groups) must be <= num_examples="
                       f"{self.num_examples}, got {self.min_separation}.")
    self.sample_rate = _validation.check_sample_rate(sample_rate)
    self.num_steps = _validation.check_positive_int(num_steps, "num_steps")
    if padded_size is None:
      padded_size = _sampling.padded_batch_size(
          self.num_examples, self.sample_rate / self.min_separation, overflow_prob)
    self.padded_size = _validation.check_positive_int(padded_size, "padded_size")
    self._groups = group_assignment(group_key, self.num_examples, self.min_separation)
    self.group_key = group_key

  @property
  def expected_batch_size(self) -> float:
    """``p N / b``: the constant the noisy sum is divided by."""
    return self.sample_rate * self.num_examples / self.min_separation

  @property
  def max_participations(self) -> int:
    """``k = ceil(n / b)``."""
    return max_participations(self.num_steps, self.min_separation)

  def indices(self, step: int, key: jax.Array) -> np.ndarray:
    """Rows of batch ``step`` (host int32): group ``step mod b``, each kept w.p. p.

    Raises:
      BudgetExceededError: ``step`` is outside ``[0, num_steps)`` (a participation
        the sensitivity and the accounting do not cover).
    """
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
      raise TypeError(f"step must be an int, got {type(step).__name__}.")
    if not 0 <= int(step) < self.num_steps:
      raise BudgetExceededError(
          f"step {step} is outside the {self.num_steps} steps of this participation schema "
          "(the strategy's sensitivity and the accounting cover exactly those).")
    sampled = _sampling.poisson_sample_indices(key, self.num_examples, self.sample_rate)
    if self.min_separation == 1:
      return sampled
    return sampled[self._groups[sampled] == int(step) % self.min_separation]

  def sample(self, step: int, key: jax.Array) -> list[_sampling.PaddedBatch]:
    """Batch ``step`` as padded chunks of size P (at least one, overflow split)."""
    return _sampling.pad_and_split(self.indices(step, key), self.padded_size, "split")

  def nonprivate_group_of(self, rows) -> np.ndarray:
    """The group of each row (depends only on the key; named so since it indexes private rows)."""
    return self._groups[np.asarray(rows)]


__all__ = ["CyclicPoissonSampler", "cyclic_groups", "group_assignment", "max_participations"]
