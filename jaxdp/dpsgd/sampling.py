"""Poisson sampling with a static padded batch shape, as the accountant assumes.

The DP-SGD accountant (``jaxdp.accounting.dpsgd_accounting``; dp_accounting's
``PoissonSampledDpEvent``) analyses privacy amplification by POISSON sampling:
at every step each of the N examples joins the batch independently with
probability q, so the batch size is Binomial(N, q) and varies from step to
step (paper ``000_tradeoffs_of_private_prediction.md`` Section 3.1 cites the
amplification theorem; survey ``004_dp_machine_learning_survey.md`` Section 4.2
Algorithm 1 line 3 "take a random sample ... with sampling probability b/n").
Shuffling into fixed-size batches is a DIFFERENT mechanism whose guarantee the
Poisson accountant does not give.

Under ``jax.jit`` shapes must be static, so a sampled batch is stored as P
indices plus a 0/1 mask: slots beyond the realised size are padding, masked
out of the clipped sum (they contribute exactly zero). P is chosen from the
binomial tail so that a batch exceeds it with probability at most
``overflow_prob`` (default 1e-9):

  P = min { k : Pr[Binomial(N, q) > k] <= overflow_prob }   (float64, scipy).

Overflow (a batch larger than P) is handled honestly, never by truncating the
batch (which would silently drop examples and break the Poisson model):

* ``on_overflow="split"`` (default): the batch is returned as several padded
  chunks of size P; summing their clipped sums gives exactly the Poisson
  batch's sum, so the accountant's assumption holds with no extra delta. This
  is also how gradient accumulation over a large logical batch works.
* ``on_overflow="raise"``: :class:`BatchOverflowError` is raised before any
  gradient of that batch is computed. The abort IS a privacy event: whether a
  batch overflows depends on its size, which differs between add/remove
  neighbours, so the abort (and the step at which it happens) leaks. Let M be
  the exact ("split") mechanism, (epsilon, delta)-DP, and M' the aborting one.
  M' differs from M only on the event E = "some step overflows", whose
  probability under the dataset or any add/remove neighbour (at most N + 1
  examples) is at most ``eta = steps * p`` with
  ``p = Pr[Binomial(N + 1, q) > P]`` (:func:`overflow_probability`, exact in
  float64 with scipy's ``binom.sf``; union bound over the steps). Coupling M
  and M' on the same randomness gives, for every output set S,
  ``Pr[M'(D) in S] <= Pr[M(D) in S] + eta <= e^eps Pr[M(D') in S] + delta + eta
  <= e^eps Pr[M'(D') in S] + delta + (1 + e^eps) eta``, so M' is
  ``(epsilon, delta + (1 + e^epsilon) * steps * p)``-DP
  (:func:`abort_delta`). The ``e^epsilon`` factor is needed in general: the
  abort can remove probability mass from exactly the outputs that the
  neighbour favours.

Resampling an oversized batch is NOT offered: it conditions the sample on its
size and changes the mechanism the accountant analyses.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import numpy as np
from scipy import stats

from jaxdp import _validation


class BatchOverflowError(RuntimeError):
  """A Poisson batch exceeded the padded size with ``on_overflow="raise"``."""


@dataclasses.dataclass(frozen=True)
class MaskedBatch:
  """Batched arguments of a clipped-gradient function together with their mask.

  What :meth:`PaddedBatch.gather` returns and what a :func:`clipped_grad`
  function accepts in place of its batch arguments: the mask travels with the
  padded arrays, so a padded chunk cannot be summed without it (padding slots
  repeat example 0; summing them would count one example many times and break
  the sensitivity). A pytree (jit/vmap/shard_map friendly).

  Attributes:
    arrays: tuple with one entry per ``batch_argnums`` position of the
      clipped-gradient function, in that order; every leaf has leading axis P.
    mask: (P,) bool or 0/1, true for real examples.
  """

  arrays: tuple
  mask: Any

  def __post_init__(self):
    if not isinstance(self.arrays, tuple):
      object.__setattr__(self, "arrays", tuple(self.arrays) if isinstance(self.arrays, list)
                         else (self.arrays,))


jax.tree_util.register_dataclass(MaskedBatch, data_fields=["arrays", "mask"], meta_fields=[])


class PaddedIndices:
  """The P index slots of a padded chunk, padding included: usable only WITH the mask.

  Padding slots repeat example 0, so indexing a dataset with all P slots and
  summing the result counts one example many times (49 "examples" where 16
  were sampled) and breaks the sensitivity. This type therefore refuses to be
  converted to an array (``x[chunk.padded_indices]``, ``np.asarray(...)``
  raise ``TypeError``); use :meth:`PaddedBatch.gather` (the mask travels with
  the batch) or :attr:`PaddedBatch.indices` (the sampled examples only).
  Indexing it with the chunk's own mask (``padded_indices[chunk.mask]``) gives
  the sampled indices; :meth:`with_mask` returns the raw ``(indices, mask)``
  pair for code that applies the mask itself.

  Attributes:
    shape, dtype: of the (P,) int32 slots.
  """

  __slots__ = ("_slots", "_mask")

  def __init__(self, slots: np.ndarray, mask: np.ndarray):
    self._slots = np.asarray(slots, np.int32)
    self._mask = np.asarray(mask, bool)

  @property
  def shape(self) -> tuple[int, ...]:
    return self._slots.shape

  @property
  def dtype(self) -> np.dtype:
    return self._slots.dtype

  def __len__(self) -> int:
    return int(self._slots.shape[0])

  def with_mask(self) -> tuple[np.ndarray, np.ndarray]:
    """``(slots, mask)``: the (P,) indices (padding included) and the (P,) bool mask, together."""
    return self._slots.copy(), self._mask.copy()

  def __getitem__(self, item: Any) -> np.ndarray:
    sel = np.asarray(item)
    if sel.dtype == bool and sel.shape == self._mask.shape and not np.any(sel & ~self._mask):
      return self._slots[sel]
    raise TypeError("padded_indices can only be indexed with the chunk's mask "
                    "(padded_indices[chunk.mask], i.e. chunk.indices): the other slots are "
                    "padding.")

  def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
    raise TypeError(
        "a padded chunk's padded_indices include padding slots (copies of example 0) and cannot "
        "be used without the mask: build the batch with chunk.gather(x, y) (a MaskedBatch for "
        "clipped_grad), use chunk.indices for the sampled examples only, or "
        "chunk.padded_indices.with_mask() to get both.")

  def __repr__(self) -> str:
    return (f"PaddedIndices(P={len(self)}; includes padding slots, unusable without the mask: "
            "use chunk.gather(x, y) or chunk.indices)")


class PaddedBatch(NamedTuple):
  """One static-shape chunk of a Poisson batch.

  Use :meth:`gather` to build the (padded) batch: it returns a
  :class:`MaskedBatch` that carries the mask into :func:`clipped_grad`. The
  padded slots cannot be used without the mask (:class:`PaddedIndices`
  refuses to become an array).

  Attributes:
    padded_indices: :class:`PaddedIndices`: P example indices; padding slots
      hold index 0 (a real example, so every gathered input is finite) and MUST
      be masked.
    mask: (P,) bool, True for real examples.
  """

  padded_indices: PaddedIndices
  mask: np.ndarray

  @property
  def indices(self) -> np.ndarray:
    """The sampled example indices only (no padding; variable length)."""
    return self.padded_indices[self.mask]

  @property
  def num_examples(self) -> int:
    return int(self.mask.sum())

  def slots_and_mask(self) -> tuple[np.ndarray, np.ndarray]:
    """``(slots, mask)`` as (P,) int32 and (P,) bool arrays (padding included, with its mask)."""
    return self.padded_indices.with_mask()

  def gather(self, *arrays: Any) -> MaskedBatch:
    """``MaskedBatch((a[padded_indices] for a in arrays), mask)``: a static-shape batch.

    Each argument is an array (or pytree of arrays) with the dataset on its
    leading axis, one per ``batch_argnums`` position of the clipped-gradient
    function, e.g. ``chunk.gather(x, y)``.
    """
    if not arrays:
      raise ValueError("gather needs at least one array (the dataset on the leading axis).")
    idx, mask = self.slots_and_mask()
    taken = tuple(jax.tree.map(lambda a: a[idx], a) for a in arrays)
    return MaskedBatch(taken, mask)


def resolve_sample_rate(sample_rate: float | None, expected_batch_size: float | None,
                        num_examples: int) -> float:
  """The Poisson sampling rate ``q`` from exactly one of ``sample_rate`` or ``expected_batch_size``.

  ``q = expected_batch_size / num_examples`` (so ``E|batch| = q N``); the result is
  checked to lie in ``(0, 1]``.

  Raises:
    ValueError: both or neither given, an expected batch size outside ``(0, N]``, or
      a sample rate outside ``(0, 1]``.
  """
  if (sample_rate is None) == (expected_batch_size is None):
    raise ValueError("give exactly one of sample_rate or expected_batch_size.")
  if sample_rate is None:
    eb = _validation.check_positive(expected_batch_size, "expected_batch_size")
    if eb > num_examples:
      raise ValueError(f"expected_batch_size must be in (0, num_examples={num_examples}], "
                       f"got {eb}.")
    sample_rate = eb / num_examples
  return _validation.check_sample_rate(sample_rate)


def padded_batch_size(num_examples: int, sample_rate: float, overflow_prob: float = 1e-9,
                      multiple_of: int = 1) -> int:
  """Smallest P with ``Pr[Binomial(N, q) > P] <= overflow_prob``, rounded up.

  Computed in float64 with scipy's binomial survival function, then rounded up
  to a multiple of ``multiple_of`` (e.g. the number of devices).

  >>> padded_batch_size(60_000, 256 / 60_000)
  357
  """
  n = _validation.check_positive_int(num_examples, "num_examples")
  q = _validation.check_sample_rate(sample_rate)
  p = _validation._as_float(overflow_prob, "overflow_prob")
  if not 0.0 < p < 1.0:
    raise ValueError(f"overflow_prob must be in (0, 1), got {p}.")
  m = _validation.check_positive_int(multiple_of, "multiple_of")
  if q == 1.0:
    k = n
  else:
    k = int(max(0.0, stats.binom.isf(p, n, q)))
    while k < n and stats.binom.sf(k, n, q) > p:
      k += 1
    while k > 0 and stats.binom.sf(k - 1, n, q) <= p:
      k -= 1
  k = max(k, 1)
  return int(math.ceil(k / m) * m)


def overflow_probability(num_examples: int, sample_rate: float, padded_size: int) -> float:
  """Per-step abort probability ``p = Pr[Binomial(N + 1, q) > P]`` (float64, scipy).

  The probability that a Poisson batch of the dataset (N examples) or of any
  add/remove neighbour (at most N + 1 examples) exceeds the padded size P;
  the binomial tail is increasing in N, so N + 1 bounds both. Computed with
  ``scipy.stats.binom.sf`` at the nominal q (the sampler's effective rate is
  at most q, and the tail is increasing in q).

  >>> f"{overflow_probability(60_000, 256 / 60_000, 357):.3g}"  # P of padded_batch_size
  '9.54e-10'
  """
  n = _validation.check_positive_int(num_examples, "num_examples")
  q = _validation.check_sample_rate(sample_rate)
  p = _validation.check_positive_int(padded_size, "padded_size")
  return float(stats.binom.sf(p, n + 1, q))


def abort_delta(overflow_prob_per_step: float, steps: int, epsilon: float) -> float:
  """Extra delta of aborting on overflow: ``(1 + e^epsilon) * steps * p``.

  ``epsilon`` is the guarantee of the exact (never aborting) mechanism at its
  delta; the aborting mechanism is ``(epsilon, delta + abort_delta)``-DP (see
  the module docstring for the coupling argument; ``steps * p`` is the union
  bound on the probability of any abort). Returns 0 when ``p = 0`` and ``inf``
  when ``e^epsilon`` overflows.

  >>> abort_delta(1e-12, 100, 0.0)
  2e-10
  """
  p = _validation._as_float(overflow_prob_per_step, "overflow_prob_per_step")
  if not 0.0 <= p <= 1.0:
    raise ValueError(f"overflow_prob_per_step must be in [0, 1], got {p}.")
  t = _validation.check_positive_int(steps, "steps")
  eps = _validation._as_float(epsilon, "epsilon")
  if not eps >= 0.0:
    raise ValueError(f"epsilon must be >= 0 (inf allowed), got {eps}.")
  if p == 0.0:
    return 0.0
  try:
    factor = 1.0 + math.exp(eps)
  except OverflowError:
    return math.inf
  return factor * t * p


def poisson_sample_indices(key: jax.Array, num_examples: int, sample_rate: float) -> np.ndarray:
  """Indices of a Poisson sample: each example kept independently w.p. q.

  Example n is kept iff ``u_n < floor(q 2^32)`` for i.i.d. uniform 32-bit
  integers ``u_n`` (``jax.random.bits``), i.e. with probability
  :func:`effective_sample_rate` ``<= q`` (within ``2^-32``). Not
  ``jax.random.bernoulli``: it compares a float32 uniform on a ``2^-23`` grid
  with q, which rounds the inclusion probability UP (by up to ``1.2e-7``
  absolute: +3e-5 relative at q = 256/60000, x2 at q = 6e-8), i.e. more
  sampling than the accountant is told. Rounding down is conservative
  (amplification by sampling is monotone in q). Returned as host int32.
  """
  _validation.check_key(key)
  n = _validation.check_positive_int(num_examples, "num_examples")
  q = _validation.check_sample_rate(sample_rate)
  if q == 1.0:
    return np.arange(n, dtype=np.int32)
  bits = np.asarray(jax.random.bits(key, (n,), np.uint32))
  return np.flatnonzero(bits < np.uint32(_inclusion_threshold(q))).astype(np.int32)


def _inclusion_threshold(q: float) -> int:
  """``floor(q 2^32)`` for q in (0, 1) (exact in Python integers)."""
  return int(math.floor(q * 2.0 ** 32))


def effective_sample_rate(sample_rate: float) -> float:
  """Exact inclusion probability of :func:`poisson_sample_indices`: ``floor(q 2^32) / 2^32 <= q``."""
  q = _validation.check_sample_rate(sample_rate)
  return 1.0 if q == 1.0 else _inclusion_threshold(q) / 2.0 ** 32


def pad_and_split(indices: np.ndarray, padded_size: int,
                  on_overflow: str = "split") -> list[PaddedBatch]:
  """Pads sampled indices to chunks of static size P (see module docstring).

  An empty sample gives one all-masked chunk: the DP-SGD step must still run
  and add noise, because the accountant counts every step.
  """
  p = _validation.check_positive_int(padded_size, "padded_size")
  if on_overflow not in ("split", "raise"):
    raise ValueError(f"on_overflow must be 'split' or 'raise', got {on_overflow!r}.")
  indices = np.asarray(indices, dtype=np.int32)
  n = indices.shape[0]
  if n > p and on_overflow == "raise":
    raise BatchOverflowError(
        f"Poisson batch of {n} examples exceeds the padded size {p}; with "
        "on_overflow='raise' training stops here (see jaxdp.dpsgd.sampling).")
  n_chunks = max(1, -(-n // p))
  padded = np.zeros(n_chunks * p, np.int32)
  padded[:n] = indices
  mask = np.zeros(n_chunks * p, bool)
  mask[:n] = True
  return [PaddedBatch(PaddedIndices(padded[i * p:(i + 1) * p], mask[i * p:(i + 1) * p]),
                      mask[i * p:(i + 1) * p])
          for i in range(n_chunks)]


class PoissonSampler:
  """Poisson sampler returning static-shape padded chunks.

  Args:
    num_examples: dataset size N.
    sample_rate: q in (0, 1].
    padded_size: chunk size P; default :func:`padded_batch_size` at
      ``overflow_prob``. A smaller P (a "physical batch") turns large logical
      batches into several accumulated chunks (gradient accumulation).
    overflow_prob: target overflow probability for the default P.
    on_overflow: ``"split"`` or ``"raise"`` (see module docstring).
    multiple_of: round P up to a multiple of this (number of devices).
  """

  def __init__(self, num_examples: int, sample_rate: float, *, padded_size: int | None = None,
               overflow_prob: float = 1e-9, on_overflow: str = "split", multiple_of: int = 1):
    self.num_examples = _validation.check_positive_int(num_examples, "num_examples")
    self.sample_rate = _validation.check_sample_rate(sample_rate)
    m = _validation.check_positive_int(multiple_of, "multiple_of")
    if padded_size is None:
      padded_size = padded_batch_size(self.num_examples, self.sample_rate, overflow_prob, m)
    else:
      padded_size = _validation.check_positive_int(padded_size, "padded_size")
      if padded_size % m:
        raise ValueError(f"padded_size must be a multiple of multiple_of={m}, got {padded_size}.")
    if on_overflow not in ("split", "raise"):
      raise ValueError(f"on_overflow must be 'split' or 'raise', got {on_overflow!r}.")
    self.padded_size = int(padded_size)
    self.on_overflow = on_overflow

  @property
  def expected_batch_size(self) -> float:
    """q N: the constant the noisy sum is divided by."""
    return self.sample_rate * self.num_examples

  @property
  def overflow_probability(self) -> float:
    """Per-step ``Pr[Binomial(N + 1, q) > P]`` (see :func:`overflow_probability`).

    With ``on_overflow="raise"`` the aborting mechanism costs
    :func:`abort_delta` ``(p, steps, epsilon)`` extra delta; with ``"split"``
    nothing.
    """
    return overflow_probability(self.num_examples, self.sample_rate, self.padded_size)

  def sample(self, key: jax.Array) -> list[PaddedBatch]:
    """One Poisson batch as a list of padded chunks (at least one)."""
    idx = poisson_sample_indices(key, self.num_examples, self.sample_rate)
    return pad_and_split(idx, self.padded_size, self.on_overflow)
