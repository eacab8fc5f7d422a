"""Fixed-size batches: a uniformly random subset of exactly B of the N examples per step.

DP-SGD's default batch selection is Poisson sampling (:mod:`.sampling`): a
random batch size, accounted for add/remove neighbours. This module draws
instead, at every step and independently of the other steps, a subset
``S_t`` of exactly ``B`` distinct examples, uniformly among the
``binom(N, B)`` subsets ("sampling without replacement"). N is then public and
the neighbouring relation is REPLACE-ONE (one example replaced by another;
add/remove would change N and with it the law of the subset). Replacing one
example moves the clipped sum by at most ``2C`` (its clipped gradient ``g`` is
replaced by ``g'``, ``||g - g'|| <= 2C``), and the divisor of the noisy sum is
the exact, public batch size ``B``.

Privacy: amplification by sampling without replacement under replace-one
(Balle, Barthe & Gaboardi 2018, "Privacy amplification by subsampling: tight
analyses via couplings and divergences", Thm 10: a uniform B-subset of N gives
``(log(1 + (B/N)(e^eps - 1)), (B/N) delta)`` for an ``(eps, delta)`` base), and
its Renyi-DP bound for the Gaussian (Wang, Balle & Kasiviswanathan 2019,
"Subsampled Renyi differential privacy and analytical moments accountant",
Thms 9 and 27), which dp_accounting's RDP accountant computes in its
``REPLACE_ONE`` mode for ``SampledWithoutReplacementDpEvent(N, B,
Gaussian(z / 2))``: :func:`jaxdp.accounting.dpsgd_accounting.fixed_size_dpsgd_event`
(``z = sigma / C``; ``z / 2`` is the noise over the replace-one sensitivity
``2C``, the convention of :mod:`jaxdp.accounting.events`). dp_accounting has
no PLD of this event, so only ``"rdp"`` bounds it. The WBK bound is loose for
the Gaussian: at the same z a fixed-size run is charged much more epsilon than a
Poisson run of the same expected batch size (e.g. N = 60,000, B = 256, z = 1.1,
1,000 steps, delta = 1e-5: 7.86 vs 0.97 for replace-one Poisson by PLD).

The subset (host and device compute the same one for the same key):

* **Words.** Row ``n`` gets the 64-bit word ``w_n = (hi_n, lo_n)`` with
  ``(hi, lo) = jax.random.bits(fold_in(key, a), (rows, 2), uint32)[n]`` for
  attempt ``a = 0, 1, ...``. JAX's Threefry is partitionable (the default): the
  words of row ``n`` are a function of the key and of ``n`` alone, not of
  ``rows``, the mesh, or which device computes them.
* **Selection.** ``S`` is the set of the B rows with the smallest words
  (lexicographic in ``(hi, lo)``). If the B-th and (B+1)-th smallest words are
  equal (a "boundary tie"), the attempt is rejected and attempt ``a + 1``
  draws fresh words. The loop ends with probability 1; a boundary tie needs
  two equal 64-bit words, probability at most ``N^2 / 2^65`` per attempt.
* **Claim:** the accepted ``S`` is uniform over the B-subsets of the N rows,
  exactly. *Proof.* Modelled as a random function, Threefry gives i.i.d.
  uniform words, so their law is invariant under every permutation ``pi`` of
  the rows. The event A = "no boundary tie" is permutation invariant, and on A
  the B smallest rows of ``w o pi`` are ``pi^{-1}(S(w))``. Hence
  ``Pr[S = s | A] = Pr[S = pi(s) | A]`` for every ``pi``: uniform. Attempts use
  distinct keys (``fold_in`` tags), so the accepted attempt has the law of S
  given A. The rejection depends on the random words only, never on the data
  (unlike resampling an oversized Poisson batch, which would change the
  mechanism). ∎

Static shapes: the host path (:class:`FixedSizeSampler`) returns the sorted
indices as ``ceil(B / P)`` padded chunks of size ``P`` (default ``P = B``,
one chunk, nothing padded): the :class:`~jaxdp.dpsgd.sampling.PaddedBatch`
of the Poisson path. The device path (:func:`clipped_sum_fn`) computes the
inclusion mask of S inside jit (:func:`inclusion_mask`; a sort of the N words,
``O(N log N)`` per step) and reuses
:func:`~jaxdp.dpsgd.device_sampling.local_clipped_sum` (rank by ``cumsum``,
chunks of size P, a ``lax.while_loop`` over the chunks). With a mesh each
device clips its own selected rows (a hypergeometric count, processed in full,
never truncated) and the sums are ``psum``-reduced; the noise is added once
outside, as in :mod:`.device_sampling`.

Other parts of a plan with fixed-size batches (derivations in the docstrings named; all
replace-one):

* **Adaptive clip norm** (Andrew et al. 2021, Thm 1): :func:`adaptive_dpsgd_event`. Under
  replace-one both sensitivities double (gradient 2, centred count 1), so the joint
  multiplier of the add/remove split is the replace-one multiplier too: the step is
  fixed-size DP-SGD at the joint sigma, the event :meth:`FixedSizeSampler.event` already
  gives.
* **Correlated noise** (BandMF, BLT, ColumnNormalizedBanded): no amplification theorem for
  more than one band (fixed-size selection gives no minimum separation); the unamplified
  matrix-mechanism analysis with every unit in up to all n steps,
  :meth:`FixedSizeSampler.mf_event` (:func:`jaxdp.dpsgd.correlated.accounting.fixed_size_mf_event`).
* **Per-layer clipping / ``microbatch_size``**: no change to the event. Per-layer clipping's
  sum has add/remove sensitivity ``sqrt(sum_g C_g^2)`` (its ``.sensitivity``), so replace-one
  ``2 sqrt(sum_g C_g^2)``, and sigma is relative to it exactly as for a flat C;
  ``microbatch_size`` only processes the same per-example clipped sum in chunks (memory).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from scipy import stats

from jaxdp import _validation
from jaxdp.accounting import dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.dpsgd import device_sampling
from jaxdp.dpsgd import sampling

PyTree = Any
_MAX_ROWS = 2 ** 31 - 1  # int32 row indices


def check_fixed_size(num_examples: Any, batch_size: Any) -> tuple[int, int]:
  """Validates ``(N, B)``: integers with ``1 <= B <= N < 2^31``; returns them.

  Raises:
    ArgumentTypeError / ValueError: naming ``num_examples`` or ``batch_size``.
  """
  n = _validation.check_positive_int(num_examples, "num_examples")
  b = _validation.check_positive_int(batch_size, "batch_size")
  if n > _MAX_ROWS:
    raise ValueError(f"num_examples must be < 2^31 (int32 row indices), got {n}.")
  if b > n:
    raise ValueError(f"batch_size must be <= num_examples={n} (a subset of distinct examples), "
                     f"got {b}.")
  return n, b


def _check_mesh(mesh: Any) -> None:
  if mesh is not None and device_sampling.DATA_AXIS not in mesh.axis_names:
    raise ValueError(f"mesh must have an axis named {device_sampling.DATA_AXIS!r}, got "
                     f"{mesh.axis_names}.")


def _words(key: jax.Array, attempt: Any, num_rows: int) -> jax.Array:
  """(num_rows, 2) uint32: the words ``(hi_n, lo_n)`` of attempt ``attempt`` (module docstring)."""
  return jax.random.bits(jax.random.fold_in(key, attempt), (num_rows, 2), jnp.uint32)


def sample_indices(key: jax.Array, num_examples: int, batch_size: int) -> np.ndarray:
  """The B rows of a uniformly random B-subset of ``range(N)``, increasing (host int32).

  The subset of the module docstring (the same as :func:`inclusion_mask` for
  the same key). ``B = N`` returns every row (no randomness needed).
  """
  _validation.check_key(key)
  n, b = check_fixed_size(num_examples, batch_size)
  if b == n:
    return np.arange(n, dtype=np.int32)
  for attempt in itertools.count():
    w = np.asarray(_words(key, attempt, n)).astype(np.uint64)
    v = (w[:, 0] << np.uint64(32)) | w[:, 1]
    part = np.partition(v, (b - 1, b))
    if part[b - 1] != part[b]:  # no boundary tie: exactly b words <= the b-th smallest
      return np.flatnonzero(v <= part[b - 1]).astype(np.int32)
  raise AssertionError("unreachable")  # pragma: no cover


def inclusion_mask(step_key: jax.Array, num_examples: int, batch_size: int,
                   num_rows: int | None = None) -> jax.Array:
  """(num_rows,) bool: row n is in the step's B-subset (traceable; module docstring).

  Rows ``N <= n < num_rows`` (mesh padding) are never selected. The same
  subset as :func:`sample_indices` for the same key, on any mesh.
  """
  n, b = int(num_examples), int(batch_size)
  rows = n if num_rows is None else int(num_rows)
  if rows < n:
    raise ValueError(f"num_rows must be >= num_examples={n}, got {rows}.")
  real = jnp.arange(rows) < n
  if b == n:
    return real

  def draw(attempt):
    w = _words(step_key, attempt, rows)
    hi, lo = w[:, 0], w[:, 1]
    s_hi, s_lo = jax.lax.sort((hi[:n], lo[:n]), num_keys=2)
    t_hi, t_lo = s_hi[b - 1], s_lo[b - 1]
    tie = (s_hi[b] == t_hi) & (s_lo[b] == t_lo)
    return attempt, hi, lo, t_hi, t_lo, tie

  def next_attempt(carry):
    return draw(carry[0] + 1)

  _, hi, lo, t_hi, t_lo, _ = jax.lax.while_loop(lambda c: c[-1], next_attempt,
                                                draw(jnp.zeros((), jnp.uint32)))
  return real & ((hi < t_hi) | ((hi == t_hi) & (lo <= t_lo)))


def local_padded_size(num_examples: int, batch_size: int, num_shards: int,
                      physical_batch_size: int | None = None,
                      overflow_prob: float = 1e-9) -> int:
  """Static chunk size P per shard of the device path.

  ``ceil(physical_batch_size / D)`` when given. Otherwise, with one shard, B
  (one chunk); with D shards of ``m = N_pad / D`` rows, the smallest k with
  ``Pr[Hypergeometric(N, m, B) > k] <= overflow_prob`` (the number of the B
  selected rows that fall on one shard; scipy, float64). A larger local count
  is processed in several chunks, exactly: an overflow costs time, not privacy.
  """
  n, b = check_fixed_size(num_examples, batch_size)
  d = _validation.check_positive_int(num_shards, "num_shards")
  if physical_batch_size is not None:
    return -(-_validation.check_positive_int(physical_batch_size, "physical_batch_size") // d)
  if d == 1:
    return b
  p = _validation._as_float(overflow_prob, "overflow_prob")  # pylint: disable=protected-access
  if not 0.0 < p < 1.0:
    raise ValueError(f"overflow_prob must be in (0, 1), got {p}.")
  m = min(device_sampling.padded_num_rows(n, d) // d, n)
  dist = stats.hypergeom(n, m, b)
  k = int(max(0.0, dist.isf(p)))
  while k < min(m, b) and dist.sf(k) > p:
    k += 1
  while k > 0 and dist.sf(k - 1) <= p:
    k -= 1
  return max(k, 1)


def clipped_sum_fn(grad_fn: Callable[..., Any] | None, *, num_examples: int, batch_size: int,
                   padded_size: int, mesh: Any = None,
                   make_grad_fn: Callable[[jax.Array], Callable[..., Any]] | None = None
                   ) -> Callable[..., Any]:
  """``(params, step_key, arrays, *, clip_norm) -> (grad_sum, stats)``: select the B-subset in jit, clip, sum.

  The fixed-size twin of :func:`.device_sampling.clipped_sum_fn` (same
  arguments, same outputs, same data layout: N rows without ``mesh``, ``N_pad``
  rows sharded ``P("data")`` with it; :func:`.device_sampling.place_data`).
  ``grad_fn`` is a :func:`~jaxdp.dpsgd.clipped_grad` function; or, for a clip
  norm that changes every step (adaptive clipping), ``make_grad_fn``
  (``clip_norm -> grad_fn``, e.g. ``lambda c: adaptive_clipped_grad(loss, c)``)
  and then every call passes ``clip_norm=`` (traced). ``stats`` are the
  NON-PRIVATE ``(loss_sum, num_examples, num_clipped)``. Traceable.
  """
  if (grad_fn is None) == (make_grad_fn is None):
    raise ValueError("give exactly one of grad_fn (a fixed clip norm) or make_grad_fn (a clip "
                     "norm per step).")
  n, b = check_fixed_size(num_examples, batch_size)
  padded_size = _validation.check_positive_int(padded_size, "padded_size")

  def grad_fn_for(clip_norm):
    if make_grad_fn is None:
      if clip_norm is not None:
        raise ValueError("clip_norm is only accepted with make_grad_fn (a fixed-clip grad_fn "
                         "clips to its own norm).")
      return grad_fn
    if clip_norm is None:
      raise ValueError("clip_norm is required: this clipped sum builds its clipped gradient "
                       "function from the clip norm of the step (make_grad_fn).")
    return make_grad_fn(clip_norm)

  if mesh is None:
    def fn(params, step_key, arrays, *, clip_norm=None):
      step_grad_fn = grad_fn_for(clip_norm)
      keep = inclusion_mask(step_key, n, b, n)
      return device_sampling.local_clipped_sum(step_grad_fn, params, keep, arrays, padded_size)
    return fn

  _check_mesh(mesh)
  axis = device_sampling.DATA_AXIS
  rows = device_sampling.padded_num_rows(n, mesh.shape[axis])
  row_sharding = NamedSharding(mesh, P(axis))

  def local(params, keep, arrays, *clip):
    step_grad_fn = grad_fn_for(clip[0] if clip else None)
    gsum, (loss, num, clipped) = device_sampling.local_clipped_sum(step_grad_fn, params, keep,
                                                                   arrays, padded_size)
    psum = lambda v: jax.lax.psum(v, axis)
    return jax.tree.map(psum, gsum), (psum(loss), psum(num), psum(clipped))

  def fn(params, step_key, arrays, *, clip_norm=None):
    grad_fn_for(clip_norm)  # the argument check, before tracing the map
    keep = jax.lax.with_sharding_constraint(inclusion_mask(step_key, n, b, rows), row_sharding)
    clip = () if clip_norm is None else (jnp.asarray(clip_norm),)  # replicated, like params
    mapped = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(axis), P(axis)) + (P(),) * len(clip),
                           out_specs=(P(), (P(), P(), P())), check_vma=False)
    return mapped(params, keep, arrays, *clip)

  return fn


def _mf_accounting():
  from jaxdp.dpsgd.correlated import accounting  # pylint: disable=g-import-not-at-top
  return accounting


def adaptive_dpsgd_event(num_examples: int, batch_size: int, *, gradient_noise_multiplier: float,
                         count_noise_multiplier: float, steps: int = 1, num_counts: int = 1,
                         neighbouring: str = events.REPLACE_ONE,
                         unit: str = events.DEFAULT_UNIT) -> events.DpEvent:
  """Event of fixed-size DP-SGD with adaptive clipping, from its parts (sigma_Delta, sigma_b).

  One step releases (Andrew et al. 2021, Algorithm 1; :mod:`jaxdp.dpsgd.adaptive_clipping`)

    ( sum_{i in S} gbar_i + N(0, sigma_Delta^2 I),  sum_{i in S} (b_i - 1/2) + N(0, sigma_b^2 I_G) )

  for a uniform B-subset S, with ``gbar_i`` example i's gradient clipped to C_t and divided
  by C_t (norm <= 1; C_t public, from earlier releases) and ``b_i in {0, 1}^G`` its unclipped
  indicators (G = ``num_counts`` clip groups; 1 for flat clipping).

  Derivation (replace-one). Replacing example i by i' (same index, so the same S) moves the
  gradient block by ``gbar_i - gbar_i'`` (norm <= 2) and each count by ``b - b'`` in
  ``{-1, 0, 1}``. Whitening (divide each block by its noise std; invertible) makes the release
  an isotropic unit Gaussian whose mean moves by a vector of squared norm at most
  ``4 / sigma_Delta^2 + G / sigma_b^2 = 4 (sigma_Delta^-2 + G (2 sigma_b)^-2) = 4 / sigma^2``,
  ``sigma = joint_noise_multiplier(sigma_Delta, sigma_b, participations=G)`` (Andrew et al.
  2021, Thm 1: the add/remove sensitivities are 1 and 1/2, whose whitened norm is 1/sigma;
  replace-one doubles BOTH, so the ratio, hence the split, is unchanged). Equivalently the
  whitened step IS a fixed-size DP-SGD step on ``d + G`` coordinates whose per-example vector
  ``w_i = (gbar_i / sigma_Delta, (b_i - 1/2) / sigma_b)`` has norm <= ``1 / sigma`` under unit
  noise, i.e. noise multiplier sigma; the guarantee of fixed-size DP-SGD holds for any
  per-example vectors in that ball (the unclipped gradient is arbitrary), so it covers
  ``w_i``. Its event is :func:`jaxdp.accounting.dpsgd_accounting.fixed_size_dpsgd_event`
  ``(sigma, N, B, steps)``: ``SelfComposed(SampledWithoutReplacement(N, B, Gaussian(sigma / 2,
  replace_one)), steps)`` (Wang, Balle & Kasiviswanathan 2019, Thms 9/27, whose bound depends
  on the base mechanism's Renyi curve ``alpha / (2 (sigma / 2)^2)`` only). Adaptive choice of
  C_t is covered by adaptive composition of RDP.

  Raises:
    ValueError: ``neighbouring="add_remove"`` (a fixed-size batch is analysed for replace-one
      only: add/remove changes N and the law of S), a count noise too small for any split,
      or bad arguments.
  """
  from jaxdp.dpsgd import adaptive_clipping  # pylint: disable=g-import-not-at-top
  n, b = check_fixed_size(num_examples, batch_size)
  if events.check_neighbouring(neighbouring) != events.REPLACE_ONE:
    raise ValueError("fixed-size batches with an adaptive clip norm are analysed for "
                     "neighbouring='replace_one' only (N is public; add/remove would change N "
                     "and the law of the B-subset), got neighbouring='add_remove'.")
  sigma_delta = _validation.check_positive(gradient_noise_multiplier, "gradient_noise_multiplier")
  sigma = adaptive_clipping.joint_noise_multiplier(sigma_delta, count_noise_multiplier,
                                                   participations=num_counts)
  return dpsgd_accounting.fixed_size_dpsgd_event(sigma, n, b, steps, unit=unit)


class FixedSizeSampler:
  """Uniform B-subsets of N examples (without replacement), as static padded chunks.

  The drop-in twin of :class:`~jaxdp.dpsgd.PoissonSampler` for fixed-size
  batches (module docstring): ``sample(key)`` returns ``ceil(B / P)`` chunks
  (:class:`~jaxdp.dpsgd.sampling.PaddedBatch`, masks included), the divisor
  is the exact batch size B, and the guarantee is replace-one DP by RDP
  (:meth:`event`, :meth:`epsilon`).

  Args:
    num_examples: dataset size N (public).
    batch_size: B, ``1 <= B <= N``.
    padded_size: chunk size P (default B: one chunk, no padding); a smaller P
      is a physical batch (gradient accumulation over ``ceil(B / P)`` chunks).
    multiple_of: round the default P up to a multiple of this (devices).

  >>> import jax
  >>> s = FixedSizeSampler(10, 4)
  >>> [c.num_examples for c in s.sample(jax.random.key(0))]
  [4]
  """

  neighbouring = events.REPLACE_ONE

  def __init__(self, num_examples: int, batch_size: int, *, padded_size: int | None = None,
               multiple_of: int = 1):
    self.num_examples, self.batch_size = check_fixed_size(num_examples, batch_size)
    m = _validation.check_positive_int(multiple_of, "multiple_of")
    if padded_size is None:
      padded_size = -(-self.batch_size // m) * m
    else:
      padded_size = _validation.check_positive_int(padded_size, "padded_size")
      if padded_size % m:
        raise ValueError(f"padded_size must be a multiple of multiple_of={m}, got {padded_size}.")
    self.padded_size = int(padded_size)

  @property
  def expected_batch_size(self) -> float:
    """B: the exact (public) batch size, the divisor of the noisy sum."""
    return float(self.batch_size)

  @property
  def sample_rate(self) -> float:
    """``B / N``: each example's inclusion probability (for reference; not a Poisson rate)."""
    return self.batch_size / self.num_examples

  @property
  def num_chunks(self) -> int:
    """``ceil(B / P)``: the chunks of every batch (a constant)."""
    return -(-self.batch_size // self.padded_size)

  def sample(self, key: jax.Array) -> list[sampling.PaddedBatch]:
    """One uniformly random B-subset as ``ceil(B / P)`` padded chunks (rows increasing)."""
    return sampling.pad_and_split(sample_indices(key, self.num_examples, self.batch_size),
                                  self.padded_size, "split")

  def event(self, noise_multiplier: float, steps: int = 1, *,
            unit: str = events.DEFAULT_UNIT) -> events.DpEvent:
    """:func:`~jaxdp.accounting.dpsgd_accounting.fixed_size_dpsgd_event` for ``steps`` steps.

    ``steps = 1`` gives ``SelfComposed(SampledWithoutReplacement(N, B,
    Gaussian(z / 2, replace_one)), 1)``; a per-step ledger entry is its ``.event``.
    """
    return dpsgd_accounting.fixed_size_dpsgd_event(noise_multiplier, self.num_examples,
                                                   self.batch_size, steps, unit=unit)

  def epsilon(self, noise_multiplier: float, steps: int, delta: float,
              accountant: str = "rdp") -> float:
    """Replace-one epsilon of ``steps`` steps (RDP only; ``"pld"`` raises)."""
    return dpsgd_accounting.fixed_size_dpsgd_epsilon(noise_multiplier, self.num_examples,
                                                     self.batch_size, steps, delta, accountant)

  def calibrate_noise_multiplier(self, target_epsilon: float, delta: float, steps: int,
                                 accountant: str = "rdp", tol: float = 1e-3) -> float:
    """Smallest ``z = sigma / C`` meeting ``(target_epsilon, delta)`` replace-one DP in ``steps``."""
    return dpsgd_accounting.calibrate_fixed_size_noise_multiplier(
        target_epsilon, delta, self.num_examples, self.batch_size, steps, accountant, tol)

  def place_data(self, arrays: tuple, mesh: Any = None) -> tuple:
    """:func:`.device_sampling.place_data` for N rows (device-resident path)."""
    return device_sampling.place_data(arrays, self.num_examples, mesh)

  def device_clipped_sum_fn(self, grad_fn: Callable[..., Any] | None = None, *, mesh: Any = None,
                            physical_batch_size: int | None = None,
                            overflow_prob: float = 1e-9,
                            make_grad_fn: Callable[[jax.Array], Callable[..., Any]] | None = None
                            ) -> Callable[..., Any]:
    """:func:`clipped_sum_fn` for this sampler (P per shard: :func:`local_padded_size`).

    Without ``mesh`` and ``physical_batch_size`` the chunk size is this
    sampler's P, so host and device process the same chunks. ``make_grad_fn``
    instead of ``grad_fn``: a clip norm per step (adaptive clipping; calls pass
    ``clip_norm=``).
    """
    _check_mesh(mesh)
    shards = 1 if mesh is None else mesh.shape[device_sampling.DATA_AXIS]
    if mesh is None and physical_batch_size is None:
      padded = self.padded_size
    else:
      padded = local_padded_size(self.num_examples, self.batch_size, shards,
                                 physical_batch_size, overflow_prob)
    return clipped_sum_fn(grad_fn, num_examples=self.num_examples, batch_size=self.batch_size,
                          padded_size=padded, mesh=mesh, make_grad_fn=make_grad_fn)

  # -- the other parts of a plan: adaptive clipping, correlated noise (module docstring) --------

  def adaptive_event(self, gradient_noise_multiplier: float, count_noise_multiplier: float,
                     steps: int = 1, *, num_counts: int = 1,
                     neighbouring: str = events.REPLACE_ONE,
                     unit: str = events.DEFAULT_UNIT) -> events.DpEvent:
    """:func:`adaptive_dpsgd_event` for this sampler's N and B."""
    return adaptive_dpsgd_event(self.num_examples, self.batch_size,
                                gradient_noise_multiplier=gradient_noise_multiplier,
                                count_noise_multiplier=count_noise_multiplier, steps=steps,
                                num_counts=num_counts, neighbouring=neighbouring, unit=unit)

  def adaptive_gradient_noise_multiplier(self, noise_multiplier: float,
                                         count_noise_multiplier: float, *,
                                         num_counts: int = 1, noise_strategy: Any = None,
                                         steps: int | None = None) -> float:
    """sigma_Delta that makes gradient and counts together cost ``noise_multiplier`` sigma.

    Independent noise: :func:`~jaxdp.dpsgd.adaptive_clipping.gradient_noise_multiplier`
    ``(sigma, sigma_b, participations=G)`` (the replace-one split equals the add/remove one:
    :func:`adaptive_dpsgd_event`). With ``noise_strategy`` (and ``steps``, the run's n):
    :func:`jaxdp.dpsgd.correlated.accounting.fixed_size_adaptive_gradient_noise_multiplier`.
    """
    if noise_strategy is None:
      from jaxdp.dpsgd import adaptive_clipping  # pylint: disable=g-import-not-at-top
      return adaptive_clipping.gradient_noise_multiplier(noise_multiplier, count_noise_multiplier,
                                                         participations=num_counts)
    if steps is None:
      raise ValueError("steps (the run's number of steps n) is required with noise_strategy.")
    return _mf_accounting().fixed_size_adaptive_gradient_noise_multiplier(
        noise_strategy, noise_multiplier=noise_multiplier,
        count_noise_multiplier=count_noise_multiplier, num_steps=steps,
        num_examples=self.num_examples, batch_size=self.batch_size, num_counts=num_counts)

  def mf_event(self, strategy: Any, noise_multiplier: float, steps: int, *,
               unit: str = events.DEFAULT_UNIT,
               neighbouring: str = events.REPLACE_ONE) -> events.DpEvent:
    """The whole correlated-noise run's event: :func:`jaxdp.dpsgd.correlated.accounting.fixed_size_mf_event`."""
    return _mf_accounting().fixed_size_mf_event(
        strategy, noise_multiplier=noise_multiplier, num_steps=steps,
        num_examples=self.num_examples, batch_size=self.batch_size, unit=unit,
        neighbouring=neighbouring)

  def mf_epsilon(self, strategy: Any, noise_multiplier: float, steps: int, delta: float,
                 accountant: str = "rdp") -> float:
    """Replace-one epsilon of :meth:`mf_event` (:func:`~jaxdp.dpsgd.correlated.accounting.fixed_size_mf_epsilon`)."""
    return _mf_accounting().fixed_size_mf_epsilon(
        strategy, noise_multiplier=noise_multiplier, num_steps=steps,
        num_examples=self.num_examples, batch_size=self.batch_size, delta=delta,
        accountant=accountant)

  def calibrate_mf_noise_multiplier(self, strategy: Any, target_epsilon: float, delta: float,
                                    steps: int, accountant: str = "rdp",
                                    tol: float = 1e-4) -> float:
    """Smallest sigma meeting ``(target_epsilon, delta)`` for :meth:`mf_event`."""
    return _mf_accounting().calibrate_fixed_size_mf_noise_multiplier(
        target_epsilon, delta, strategy, num_steps=steps, num_examples=self.num_examples,
        batch_size=self.batch_size, accountant=accountant, tol=tol)

  def __repr__(self) -> str:
    return (f"FixedSizeSampler(num_examples={self.num_examples}, batch_size={self.batch_size}, "
            f"padded_size={self.padded_size})")


__all__ = ["FixedSizeSampler", "adaptive_dpsgd_event", "check_fixed_size", "clipped_sum_fn", "inclusion_mask",
           "local_padded_size", "sample_indices"]
