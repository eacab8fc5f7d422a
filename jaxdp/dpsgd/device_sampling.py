"""Poisson sampling inside the jitted DP-SGD step, from device-resident data.

The host path (:mod:`.sampling`) draws the Poisson batch on the host, pads it
to static chunks and copies the chunk to the device every step; for a model
whose step takes milliseconds that costs as much as the step. Here the whole
dataset lives on the device(s) and ONE jit-compiled function samples, gathers,
clips, sums, adds the noise and applies the optimiser. The batch is the same
Poisson sample the host path draws for the same key, and the same the
accountant analyses (``PoissonSampled(q, Gaussian(sigma))``; paper
``000_tradeoffs_of_private_prediction.md`` Section 3.1; survey
``004_dp_machine_learning_survey.md`` Section 4.2 Algorithm 1 line 3):

* **Inclusion.** Row ``n`` joins the batch iff ``u_n < floor(q 2^32)`` with
  ``u = jax.random.bits(step_key, (N_pad,), uint32)`` and ``n < N`` (rows
  ``N <= n < N_pad`` are padding and never join). JAX's Threefry is
  partitionable (``jax_threefry_partitionable``, the default): ``u_n`` is a
  function of the key and of ``n`` alone, so it does not depend on ``N_pad``,
  on the mesh, or on which device or process computes it, and with a sharded
  ``u`` every device computes only the bits of its own rows.
  **Claim:** the global batch is exactly a Poisson sample of the N examples
  with the rate :func:`.sampling.effective_sample_rate` ``(q) <= q``, the
  same batch as :func:`.sampling.poisson_sample_indices` for the same key, and
  the same on one process or many. *Proof.* Threefry-2x32 is a keyed
  bijection of the 64-bit counter (Salmon et al. 2011); modelled as a random
  function, the words ``u_n`` for distinct ``n`` are i.i.d. uniform on
  ``{0, ..., 2^32 - 1}``, so the events ``u_n < floor(q 2^32)`` are
  independent with probability ``floor(q 2^32) / 2^32`` each, i.e. a Poisson
  sample; the partition of the rows over devices or processes only decides who
  evaluates which ``u_n``, not its value. Distinct steps use distinct keys
  (``split(sampling_key, T)[t]``), so no two steps, devices or processes share
  a word. Rounding the rate down is conservative (amplification by sampling is
  monotone in q).
* **Static shapes, exact overflow.** Each device numbers its sampled rows in
  row order (``rank = cumsum(mask)``) and processes them in chunks of a static
  size ``P``: chunk k holds the rows of rank ``kP + 1 .. (k + 1) P`` (found by
  ``searchsorted`` on the rank, ``O(P log n)``), padded and masked. A
  ``lax.while_loop`` runs ``ceil(count / P)`` chunks, so a batch larger than P
  is processed in full (never truncated, never resampled): the summed clipped
  gradient is that of exactly the Poisson batch, with sensitivity S. The usual
  batch takes one chunk; P is the binomial bound at ``overflow_prob`` (an
  overflow only costs time).
* **One noise draw.** With a mesh, the chunk sums of all devices (of all
  processes) are ``psum``-reduced and the Gaussian noise is added ONCE to the
  reduced sum by :func:`.transforms.noisy_aggregate`, outside ``shard_map``, from
  the replicated key: every device computes the same noise, as in
  :mod:`.data_parallel`.

* **Extra mask factor.** ``row_mask`` (a (rows,) bool, sharded like the
  data) is AND-ed into the inclusion bits before anything is gathered: cyclic
  Poisson sampling of a correlated-noise plan (``row_mask = cyclic_groups ==
  t mod b``, :mod:`.correlated.participation`) keeps row n iff it is in the
  step's group AND its Poisson bit is set -- the batch
  ``CyclicPoissonSampler.indices(t, step_key)`` draws on the host. The group
  words come from their own key by the same partitionable Threefry, so they
  too are the same on any mesh; :func:`computed_rows` evaluates them where the
  rows live, once.
* **Clip norm per step.** With ``make_grad_fn`` (adaptive clipping, Andrew et
  al. 2021), the clipped-gradient function is built inside the jitted step
  from the current clip norm C_t (a traced scalar, replicated into the
  ``shard_map``), clipping in units of C_t exactly as the host path does; the
  fixed-clip path is the same program as before.

Padding rule (shared with :mod:`.multihost`): with D shards, the arrays hold
``N_pad = D ceil(N / D)`` rows, sharded contiguously along the mesh axis
``"data"``; rows ``>= N`` are zero padding.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxdp import _validation
from jaxdp.dpsgd import sampling

PyTree = Any
DATA_AXIS = "data"


def padded_num_rows(num_examples: int, num_shards: int) -> int:
  """``N_pad = D ceil(N / D)``: rows of the device-resident arrays over D shards."""
  n = _validation.check_positive_int(num_examples, "num_examples")
  d = _validation.check_positive_int(num_shards, "num_shards")
  return d * -(-n // d)


def local_padded_size(num_examples: int, sample_rate: float, num_shards: int,
                      physical_batch_size: int | None = None,
                      overflow_prob: float = 1e-9) -> int:
  """Static chunk size P per shard.

  ``ceil(physical_batch_size / D)`` when given; otherwise the binomial bound
  :func:`.sampling.padded_batch_size` for one shard's ``N_pad / D`` rows at
  ``overflow_prob`` (a larger batch is processed in several chunks, exactly).
  """
  d = _validation.check_positive_int(num_shards, "num_shards")
  if physical_batch_size is not None:
    return -(-_validation.check_positive_int(physical_batch_size, "physical_batch_size") // d)
  rows = padded_num_rows(num_examples, d) // d
  return sampling.padded_batch_size(rows, sample_rate, overflow_prob)


def inclusion_mask(step_key: jax.Array, num_examples: int, sample_rate: float,
                   num_rows: int) -> jax.Array:
  """(num_rows,) bool: row n joins the batch iff ``bits_n < floor(q 2^32)`` and ``n < N``.

  The same words as :func:`.sampling.poisson_sample_indices` (module docstring);
  traceable, for use inside ``jax.jit``.
  """
  if sample_rate == 1.0:
    return jnp.arange(num_rows) < num_examples
  bits = jax.random.bits(step_key, (num_rows,), jnp.uint32)
  keep = bits < jnp.uint32(math.floor(sample_rate * 2.0 ** 32))
  if num_rows > num_examples:
    keep = keep & (jnp.arange(num_rows) < num_examples)
  return keep


def chunk_slots(rank: jax.Array, count: jax.Array, chunk: jax.Array,
                padded_size: int) -> tuple[jax.Array, jax.Array]:
  """Row indices and mask of chunk ``chunk`` of a sample numbered by ``rank = cumsum(mask)``.

  Slot j of chunk k holds the sampled row of rank ``kP + j + 1`` (rows in
  increasing order, as :func:`.sampling.pad_and_split` lays them out); slots
  past the sample are index 0 and masked out.
  """
  want = chunk * padded_size + jnp.arange(1, padded_size + 1, dtype=rank.dtype)
  valid = want <= count
  idx = jnp.searchsorted(rank, want, side="left")
  idx = jnp.where(valid, idx, 0).astype(jnp.int32)
  return idx, valid


def local_clipped_sum(grad_fn: Callable[..., Any], params: PyTree, keep: jax.Array,
                      arrays: tuple, padded_size: int) -> tuple[PyTree, tuple]:
  """Sum of the clipped gradients of the sampled rows ``keep`` of ``arrays`` (one shard).

  Returns ``(grad_sum, (loss_sum, num_examples, num_clipped))``; the counts
  are NON-PRIVATE diagnostics. Runs ``ceil(count / P)`` chunks of size P.
  """
  rank = jnp.cumsum(keep.astype(jnp.int32))
  count = rank[-1]
  n_chunks = (count + padded_size - 1) // padded_size
  zeros = jax.tree.map(
      lambda p: jnp.zeros(jnp.shape(p), jnp.promote_types(jnp.result_type(p), jnp.float32)),
      params)

  def cond(carry):
    return carry[0] < n_chunks

  def body(carry):
    k, acc, loss, num, clipped = carry
    idx, valid = chunk_slots(rank, count, k, padded_size)
    chunk = tuple(jax.tree.map(lambda a: jnp.take(a, idx, axis=0), arr) for arr in arrays)
    g, info = grad_fn(params, sampling.MaskedBatch(chunk, valid))
    return (k + 1, jax.tree.map(jnp.add, acc, g), loss + info.loss_sum,
            num + info.num_examples, clipped + info.num_clipped)

  # Chunk 0 as straight-line code (the usual batch is one chunk; XLA optimises a loop body
  # less well), the overflow chunks 1 .. ceil(count / P) - 1 in the while loop. An empty
  # sample gives chunk 0 with every slot masked: a zero sum.
  init = (jnp.zeros((), jnp.int32), zeros, jnp.zeros((), jnp.float32),
          jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
  _, gsum, loss, num, clipped = jax.lax.while_loop(cond, body, body(init))
  return gsum, (loss, num, clipped)


def clipped_sum_fn(grad_fn: Callable[..., Any] | None, *, num_examples: int,
                   sample_rate: float, padded_size: int, mesh: Any = None,
                   make_grad_fn: Callable[[jax.Array], Callable[..., Any]] | None = None
                   ) -> Callable[..., Any]:
  """``(params, step_key, arrays, *, row_mask, clip_norm) -> (grad_sum, stats)``: sample in-jit, clip, sum.

  Without ``mesh``: one device, ``arrays`` hold exactly N rows. With a mesh
  (axis ``"data"``, D devices, of one or several processes): ``arrays`` hold
  ``N_pad`` rows sharded ``P("data")``; each device samples, gathers and clips
  its own rows and the sums are ``psum``-reduced (module docstring). Traceable.

  Args:
    grad_fn: the clipped-gradient function ``(params, MaskedBatch) -> (sum, info)``
      of a fixed clip norm; None with ``make_grad_fn``.
    num_examples: N.
    sample_rate: the rate q of the Poisson inclusion bits (with cyclic groups,
      the in-group rate p).
    padded_size: the static chunk size P per device.
    mesh: optional 1-D mesh with axis ``"data"``.
    make_grad_fn: ``clip_norm -> grad_fn`` for a clip norm that changes every
      step (adaptive clipping): the returned function then needs
      ``clip_norm=`` (a scalar, traced inside the step) and builds the clipped
      gradient function from it inside the jitted call.

  The returned function takes ``row_mask`` (optional (rows,) bool, N rows or
  ``N_pad`` sharded rows): an extra factor of the inclusion mask (cyclic
  groups). ``stats`` is ``(loss_sum, num_examples, num_clipped)``, NON-PRIVATE.
  """
  if (grad_fn is None) == (make_grad_fn is None):
    raise ValueError("give exactly one of grad_fn (a fixed clip norm) or make_grad_fn (a clip "
                     "norm per step).")
  n, q = int(num_examples), float(sample_rate)
  per_step = make_grad_fn is not None

  def grad_fn_for(clip_norm):
    if per_step:
      if clip_norm is None:
        raise ValueError("clip_norm is required: this clipped sum builds its clipped gradient "
                         "function from the clip norm of the step (make_grad_fn).")
      return make_grad_fn(clip_norm)
    if clip_norm is not None:
      raise ValueError("clip_norm is only accepted with make_grad_fn (a fixed-clip grad_fn "
                       "clips to its own norm).")
    return grad_fn

  if mesh is None:
    def fn(params, step_key, arrays, *, row_mask=None, clip_norm=None):
      step_grad_fn = grad_fn_for(clip_norm)
      keep = inclusion_mask(step_key, n, q, n)
      if row_mask is not None:
        keep = keep & row_mask
      return local_clipped_sum(step_grad_fn, params, keep, arrays, padded_size)
    return fn

  if DATA_AXIS not in mesh.axis_names:
    raise ValueError(f"mesh must have an axis named {DATA_AXIS!r}, got {mesh.axis_names}.")
  d = mesh.shape[DATA_AXIS]
  rows = padded_num_rows(n, d)
  row_sharding = NamedSharding(mesh, P(DATA_AXIS))

  def local(params, keep, arrays, *clip):
    step_grad_fn = make_grad_fn(clip[0]) if clip else grad_fn
    gsum, (loss, num, clipped) = local_clipped_sum(step_grad_fn, params, keep, arrays,
                                                   padded_size)
    psum = lambda v: jax.lax.psum(v, DATA_AXIS)
    return jax.tree.map(psum, gsum), (psum(loss), psum(num), psum(clipped))

  def fn(params, step_key, arrays, *, row_mask=None, clip_norm=None):
    grad_fn_for(clip_norm)  # argument check
    keep = inclusion_mask(step_key, n, q, rows)
    if row_mask is not None:
      keep = keep & row_mask
    keep = jax.lax.with_sharding_constraint(keep, row_sharding)
    # The clip norm (adaptive) enters replicated, like the params.
    extra = () if clip_norm is None else (jnp.asarray(clip_norm),)
    mapped = jax.shard_map(local, mesh=mesh,
                           in_specs=(P(), P(DATA_AXIS), P(DATA_AXIS)) + (P(),) * len(extra),
                           out_specs=(P(), (P(), P(), P())), check_vma=False)
    return mapped(params, keep, arrays, *extra)

  return fn


def computed_rows(fn: Callable[[int], jax.Array], num_examples: int, mesh: Any = None) -> jax.Array:
  """``fn(R)``, a ``(R, ...)`` per-row array, computed on the device(s) where the rows live.

  ``R = N`` without ``mesh`` (default device); with a mesh ``R = N_pad``, the
  output sharded ``P("data")`` like the data of :func:`place_data`, each
  device computing its own rows (also on several processes: ``fn`` must be
  the same on each and depend on nothing but its closed-over constants). For
  per-row values drawn from a key by partitionable Threefry, e.g. the cyclic
  groups of :func:`.correlated.participation.cyclic_groups`: the values do not
  depend on R or the mesh (module docstring). Computed once, then passed to
  every step as ``row_mask`` material.
  """
  n = _validation.check_positive_int(num_examples, "num_examples")
  if mesh is None:
    return jax.jit(lambda: fn(n))()
  rows = padded_num_rows(n, mesh.shape[DATA_AXIS])
  return jax.jit(lambda: fn(rows), out_shardings=NamedSharding(mesh, P(DATA_AXIS)))()


def place_data(arrays: tuple, num_examples: int, mesh: Any = None) -> tuple:
  """Device-resident copies of ``arrays`` (pytrees, N rows per leaf) for the in-jit sampler.

  Without ``mesh``: ``jax.device_put`` on the default device (N rows). With a
  mesh: rows padded with zeros to ``N_pad`` and sharded ``P("data")``. Leaves
  that are already global ``jax.Array`` s with ``N_pad`` rows (e.g. from
  :func:`.multihost.global_dataset` on several processes) are kept as they are.
  """
  n = int(num_examples)
  if mesh is None:
    return tuple(jax.tree.map(jax.device_put, a) for a in arrays)
  d = mesh.shape[DATA_AXIS]
  rows = padded_num_rows(n, d)
  sharding = NamedSharding(mesh, P(DATA_AXIS))

  def place(a):
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
      if a.shape[0] != rows:
        raise ValueError(f"a global data array must have N_pad = {rows} rows "
                         f"(multihost.global_dataset), got {a.shape[0]}.")
      return a
    a = np.asarray(a)
    if a.shape[0] != rows:
      a = np.concatenate([a, np.zeros((rows - a.shape[0],) + a.shape[1:], a.dtype)])
    return jax.device_put(a, sharding)

  return tuple(jax.tree.map(place, a) for a in arrays)


__all__ = ["chunk_slots", "clipped_sum_fn", "computed_rows", "inclusion_mask", "local_clipped_sum",
           "local_padded_size", "padded_num_rows", "place_data"]
