"""Per-example gradient clipping in the spirit of ``jax.grad``.

DP-SGD (paper ``000_tradeoffs_of_private_prediction.md`` Section 3.1, Equation 4;
``004_dp_machine_learning_survey.md`` Section 4.2, Algorithm 1, line 7) bounds the
influence of one example on a gradient step by clipping its gradient ``g_n`` to
L2 norm at most ``nu`` (called ``l2_clip_norm`` here):

  g_n_clipped = g_n / max(1, ||g_n||_2 / nu) = g_n * min(1, nu / ||g_n||_2),

and releasing the SUM ``sum_n g_n_clipped`` plus Gaussian noise. Under add/remove
neighbouring datasets (the relation that Poisson-subsampled accounting uses)
adding or removing one example changes the sum by one clipped vector, so the L2
sensitivity of the sum is exactly ``nu``.

:func:`clipped_grad` returns a callable whose ``.sensitivity`` attribute carries
that bound, so the noise calibration (``jaxdp.dpsgd.transforms``) cannot
drift away from the clipping.

Per-layer (group-wise) clipping: the parameters are split into K groups (by
default every leaf is one group) and group ``k`` of each per-example gradient is
clipped to its own norm ``c_k``. The concatenation of the clipped groups then
has norm at most ``sqrt(sum_k c_k^2)``, which is the L2 sensitivity of the sum
(McMahan et al. 2018, "A general approach to adding differential privacy to
iterative training procedures", Section 3; the bound is the Pythagorean sum of
the per-group bounds).

Floating point: the bound must hold for the float32 numbers actually summed,
not only in exact arithmetic. Gradients are clipped and summed in at least
float32 (bfloat16/float16 per-example gradients are cast up first, exactly), and
the computed norm can be a few ulps BELOW the true one, so ``min(1, c/||g||)``
alone can leave a clipped norm a few ulps above c. The squared norm is
therefore reduced in blocks of at most ``_BLOCK = 256`` terms (L levels), so in
any summation order every term suffers at most ``E = 1 + L (B - 1) + (K - 1)``
roundings (squaring, L block reductions, K leaves; unit roundoff
``r = 2^-24``) and the computed norm satisfies
``||g||_hat >= ||g|| (1 - r)^(E/2 + 1)`` (Higham, "Accuracy and Stability of
Numerical Algorithms", 2nd ed., Section 4.2, Eq. 4.4, for sums of nonnegative
terms, plus one rounding of the square root). The clip uses
``c' = c (1 - r)^(E/2 + 1) / (1 + r)^2`` rounded down to float32 (the last
factor covers the rounding of ``c'/||g||_hat`` and of the product), so the
exact norm of every float32 clipped vector is ``<= c``. ``c' / c - 1`` is
about ``-1e-5`` for a million parameters: a negligible change of the clip norm.

Huge and non-finite gradients. The squared norm is computed plainly,
``fl(sum g_i^2)``; a square or partial sum that falls below the smallest normal
float32 may be flushed to zero, so the clip uses ``fl(S) + n 2^-125`` (``n``
terms), which after one more rounding (``E = 2 + L (B - 1) + (K - 1)``) bounds
``||g||^2 (1 - r)^E`` from above. That is valid whenever ``fl(S)`` is finite.
The same reduction sums the squares of ``2^-k g`` (``k`` about 64 plus half
the bits of ``n``: ``2^-k`` is exact, a change of exponent only), which cannot
overflow for any finite float32 ``g``; where ``fl(S)`` overflowed (entries of
1e20 and more in float32) the same bound holds for ``2^-k g``, and the clipped
vector is ``(2^-k g) min(2^k, c'/sqrt(S_k))``, so a finite gradient of any
size (entries of 1e30 in float32, a norm above the largest float32) is clipped
correctly to norm ``<= c``, with no second pass and no ``jax.lax.cond``
(:mod:`jaxdp.dpsgd.clip_factors`, :mod:`jaxdp.dpsgd.clip_chunks`).

A per-example gradient with an inf or NaN entry (overflow in the loss, an
inf input) cannot be clipped: ``min(1, c/inf) = 0`` and ``inf * 0 = NaN``, a
NaN sum exactly when that record is sampled, which its absence can never
produce. Such an example contributes EXACTLY ZERO (``jnp.where``, never a
product) on every path (``"vmap"``, ``"reweight"``, ``"ghost"``, flat and
per-layer, microbatched or not): a zero vector has norm ``0 <= c``, so the
sensitivity is unchanged and the sum stays finite. In the non-private
diagnostics the example counts as clipped (``num_clipped``) and its
``per_example_norms`` entry is ``inf``; its loss enters ``loss_sum`` as computed
(so a NaN loss stays visible there).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jaxdp import _validation
from jaxdp.dpsgd import _inputs
from jaxdp.dpsgd import clip_chunks
# Re-exported: the per-example norms and clip factors live in clip_factors.
from jaxdp.dpsgd.clip_factors import (  # pylint: disable=unused-import
    _BLOCK, _FLUSH_SLACK, _NO_EXPONENT, _UNIT_ROUNDOFF, _clip_factor,
    _combine_scaled, _compute_dtype, _exponent_range, _global_norm, _pow2, _reduction_levels,
    _safe_clip, _safe_clip_any, _safe_multiplier, _scaled_norm, _sum_squares, _upcast,
    clip_groups, factor_from_sums, float32_at_most, group_sum_squares, leaf_groups, num_terms,
    scaled_sum_squares)
from jaxdp.dpsgd.sampling import MaskedBatch

PyTree = Any


@dataclasses.dataclass(frozen=True)
class ClippedGradInfo:
  """Non-private diagnostics returned beside the clipped gradient sum.

  None of these fields are privatised: they depend on individual examples and
  must not be released (logged, used for decisions that are published) without
  accounting for them separately.

  Attributes:
    loss_sum: sum over the unmasked examples of the per-example loss.
    per_example_norms: (B,) L2 norms of the per-example gradients BEFORE
      clipping (global norm, also under per-layer clipping); 0 for masked slots.
    num_clipped: number of unmasked examples whose gradient was scaled down
      (in any group under per-layer clipping); an example whose gradient is
      not finite contributes zero and counts as clipped.
    num_examples: number of unmasked examples (sum of the mask).
    aux: per-example auxiliary outputs of ``loss_fn`` (leading axis B) when
      ``has_aux=True``, else ``None``.
    num_clipped_per_group: with per-layer clipping, a (G,) int32 vector: the
      unmasked examples whose group g was scaled down (non-finite examples
      count in every group), groups in the order of
      ``jax.tree.leaves(l2_clip_norm)`` (one per leaf for a float
      ``l2_clip_norm``); ``None`` for flat clipping.
  """

  loss_sum: jax.Array
  per_example_norms: jax.Array
  num_clipped: jax.Array
  num_examples: jax.Array
  aux: Any = None
  num_clipped_per_group: Any = None


jax.tree_util.register_dataclass(
    ClippedGradInfo,
    data_fields=["loss_sum", "per_example_norms", "num_clipped", "num_examples", "aux",
                 "num_clipped_per_group"],
    meta_fields=[],
)



class ClippedGradFn:
  """Callable returned by :func:`clipped_grad`; see that function.

  Attributes:
    sensitivity: L2 sensitivity of the returned gradient sum under add/remove
      neighbours: ``l2_clip_norm`` for flat clipping, ``sqrt(sum_k c_k^2)``
      for per-layer clipping (``inf`` when any clip norm is ``inf``).
    l2_clip_norm: the clip norm given (a float or a pytree of per-group norms).
    per_layer: whether group-wise clipping is used.
    microbatch_size: examples processed per vectorised chunk (None: all at once).
    batch_argnums: positional arguments that carry the batch axis.
    method: the clipping method used (``"vmap"``, ``"reweight"`` or
      ``"ghost"``; ``"auto"`` resolved), or None when not known.
  """

  def __init__(self, fn: Callable[..., Any], sensitivity: float, l2_clip_norm: Any,
               per_layer: bool, microbatch_size: int | None,
               batch_argnums: tuple[int, ...] = (1,), method: str | None = None):
    self._fn = fn
    self.method = method
    self.batch_argnums = batch_argnums
    self.sensitivity = sensitivity
    self.l2_clip_norm = l2_clip_norm
    self.per_layer = per_layer
    self.microbatch_size = microbatch_size

  def __call__(self, *args: Any, mask: jax.Array | None = None) -> tuple[PyTree, ClippedGradInfo]:
    args, mask = unpack_masked_batch(args, mask, self.batch_argnums)
    return self._fn(*args, mask=mask)

  def __repr__(self) -> str:
    return (f"ClippedGradFn(sensitivity={self.sensitivity}, per_layer={self.per_layer}, "
            f"microbatch_size={self.microbatch_size})")


def unpack_masked_batch(args: tuple, mask: Any, batch_argnums: Sequence[int]) -> tuple[tuple, Any]:
  """``(params, MaskedBatch, *others)`` -> ``(params, *positional args), mask``.

  The batch's arrays fill the ``batch_argnums`` positions (in increasing
  order), the remaining arguments fill the other positions in order. Passing
  ``mask=`` as well is an error: the batch carries its own mask.
  """
  where = [i for i, a in enumerate(args) if isinstance(a, MaskedBatch)]
  if not where:
    return tuple(args), mask
  if where != [1]:
    raise ValueError("pass at most one MaskedBatch, as the argument right after params "
                     f"(found MaskedBatch at positions {where}).")
  if mask is not None:
    raise ValueError("mask= was given together with a MaskedBatch, which carries its own mask; "
                     "pass only the MaskedBatch.")
  batch = args[1]
  positions = sorted(batch_argnums)
  if len(batch.arrays) != len(positions):
    raise ValueError(f"the MaskedBatch holds {len(batch.arrays)} arrays but the function has "
                     f"batch_argnums={tuple(batch_argnums)} ({len(positions)} batch arguments).")
  others = list(args[2:])
  total = 1 + len(positions) + len(others)
  if positions[-1] >= total:
    raise ValueError(f"batch_argnums={tuple(batch_argnums)} needs more positional arguments "
                     f"than the {len(others)} given after the MaskedBatch.")
  full: list[Any] = [args[0]] + [None] * (total - 1)
  for pos, arr in zip(positions, batch.arrays):
    full[pos] = arr
  rest = iter(others)
  for pos in range(1, total):
    if pos not in positions:
      full[pos] = next(rest)
  return tuple(full), batch.mask


def _check_clip_norms(l2_clip_norm: Any, per_layer: bool) -> tuple[Any, float]:
  """Validates clip norm(s) and returns (clip spec, sensitivity)."""
  if not per_layer:
    if jax.tree_util.treedef_is_leaf(jax.tree.structure(l2_clip_norm)) is False:
      raise ValueError("l2_clip_norm must be a positive float unless per_layer=True; "
                       "got a pytree.")
    c = _validation.check_positive(l2_clip_norm, "l2_clip_norm", allow_inf=True)
    return c, c
  leaves, treedef = jax.tree.flatten(l2_clip_norm)
  if not leaves:
    raise ValueError("l2_clip_norm must contain at least one positive clip norm.")
  checked = [_validation.check_positive(c, "l2_clip_norm (per-layer entry)", allow_inf=True)
             for c in leaves]
  sensitivity = math.sqrt(math.fsum(c * c for c in checked))
  return jax.tree.unflatten(treedef, checked), sensitivity


def per_layer_sensitivity(layer_clip_norms: Sequence[float]) -> float:
  """L2 sensitivity ``sqrt(sum_k c_k^2)`` of a per-layer clipped sum.

  Each group k of a per-example gradient has norm <= c_k after clipping, so the
  whole clipped vector has norm <= sqrt(sum_k c_k^2) (Pythagoras over disjoint
  coordinate blocks); adding or removing one example moves the sum by at most
  that much.

  >>> round(per_layer_sensitivity([3.0, 4.0]), 6)
  5.0
  """
  checked = [_validation.check_positive(c, "layer_clip_norms entry", allow_inf=True)
             for c in layer_clip_norms]
  if not checked:
    raise ValueError("layer_clip_norms must be non-empty.")
  return math.sqrt(math.fsum(c * c for c in checked))


def clipped_grad(
    loss_fn: Callable[..., Any],
    *,
    l2_clip_norm: Any,
    batch_argnums: int | Sequence[int] = 1,
    microbatch_size: int | None = None,
    per_layer: bool = False,
    has_aux: bool = False,
    method: str = "auto",
) -> ClippedGradFn:
  """Sum of per-example clipped gradients, like ``jax.grad`` over a batch.

  ``loss_fn(params, *example_args)`` computes the loss of ONE example (the
  arguments in ``batch_argnums`` hold one example each, without a batch axis).
  The returned function takes the same arguments with a leading batch axis B
  on every ``batch_argnums`` argument, plus an optional ``mask`` (B,) of 0/1
  (or bool), and returns ``(grad_sum, info)`` with

    grad_sum = sum_{n : mask_n = 1} g_n * min(1, nu / ||g_n||_2),
    g_n = d loss_fn(params, example_n) / d params,

  (paper 000 Section 3.1, Equation 4, the bracketed sum; survey 004 Section
  4.2 Algorithm 1 line 7), computed with ``jax.vmap``. Gradients are taken with
  respect to argument 0 (``params``). Masked slots contribute exactly zero (even
  if their gradient is NaN), which is how padded Poisson batches are handled.

  Padded batches: call it as ``f(params, chunk.gather(x, y))`` with a
  :class:`~jaxdp.dpsgd.sampling.MaskedBatch` (what
  ``PaddedBatch.gather`` returns) in place of the batch arguments; the mask
  travels with the batch, so it cannot be forgotten (padding slots repeat
  example 0, and summing them unmasked would break the sensitivity; the
  chunk's ``padded_indices`` therefore refuse to index an array without the
  mask). Giving ``mask=`` as well raises ``ValueError``. A plain array batch
  without ``mask`` means every row is a real example.

  Precision: per-example gradients are clipped and summed in at least float32
  (bfloat16/float16 params give a float32 ``grad_sum``), with the clip norm
  shrunk by a few float32 ulps so that every clipped vector has norm at most
  ``l2_clip_norm`` exactly (module docstring).

  Args:
    loss_fn: per-example loss ``(params, *args) -> scalar`` (or
      ``(scalar, aux)`` with ``has_aux=True``).
    l2_clip_norm: clip norm nu > 0 (``inf`` disables clipping; the sensitivity
      is then ``inf`` and no finite noise makes the sum private). With
      ``per_layer=True`` either a float C, split evenly over the L leaves of the
      gradient as ``c_k = C / sqrt(L)`` (so the sensitivity stays C), or a pytree
      that is a PREFIX of the params tree whose leaves are the per-group clip
      norms ``c_k`` (a subtree of params under one entry forms one group).
    batch_argnums: positional argument index/indices (>= 1) that carry the
      batch axis (default 1: ``loss_fn(params, x)``; ``(1, 2)`` for
      ``loss_fn(params, x, y)`` with per-example labels, as ``make_private``
      uses). A loss that cannot be evaluated on one example of the batch
      arguments raises ``ValueError`` naming the ``batch_argnums`` to pass.
    microbatch_size: if set, the batch is processed in chunks of this many
      examples with ``jax.lax.scan`` (bounded memory: one chunk's per-example
      gradients live at a time); B need not be a multiple (the tail is padded
      and masked).
    per_layer: group-wise clipping (see module docstring).
    has_aux: whether ``loss_fn`` returns ``(loss, aux)``.
    method: ``"vmap"`` (default) materialises the per-example gradients with
      ``jax.vmap(jax.grad)``, clips and sums them. ``"reweight"`` (flat clipping
      only) uses the identity
      ``sum_n min(1, nu/||g_n||) g_n = grad_theta sum_n stop_grad(c_n) loss_n(theta)``:
      a vmapped pass computes only the per-example norms (XLA can fuse the
      squared-norm reductions instead of storing every gradient), then ONE
      ordinary batched backward pass of the reweighted loss gives the clipped
      sum. Same result up to float rounding, often several times faster for
      dense layers. One batched backward pass cannot keep a non-finite
      example (or padding slot) out of the sum (``0 * NaN``), so a chunk whose
      sum is not finite is computed by the vmap method instead
      (``jax.lax.cond``; the module docstring's zero rule). ``"ghost"`` (flat or
      per-layer) computes the per-example norms WITHOUT per-example gradients
      from each supported Flax layer's input and output cotangent (Dense,
      Conv, Embed, GroupNorm/LayerNorm; ghost norms or per-layer
      materialisation, whichever is cheaper) and the clipped sum by
      book-keeping, all in one forward+backward pass; any parameter it cannot
      cover exactly falls back to vmap automatically
      (:mod:`jaxdp.dpsgd.ghost_norms`). ``"auto"`` (default) is
      ``"ghost"``, the fastest in ``benchmarks/dpsgd.py`` for every model
      measured (MLP, SmallCNN, ResNet-20); for a loss with no Flax layers it
      computes exactly what ``"vmap"`` does.

  Returns:
    A :class:`ClippedGradFn` with ``.sensitivity``. Its output ``grad_sum`` has
    the structure of ``params`` (dtype at least float32); its ``info`` is a
    :class:`ClippedGradInfo`.

  With flat clipping and nu = 2 the sensitivity is nu:

  >>> f = clipped_grad(lambda w, x: jnp.sum(w * x), l2_clip_norm=2.0)
  >>> f.sensitivity
  2.0
  >>> g, info = f(jnp.zeros(2), jnp.array([[3.0, 4.0], [0.3, 0.4]]))
  >>> [round(float(v), 4) for v in g]
  [1.5, 2.0]
  """
  if per_layer and isinstance(l2_clip_norm, (int, float)):
    even_split = True
    c_total = _validation.check_positive(l2_clip_norm, "l2_clip_norm", allow_inf=True)
    sensitivity = c_total
    clip_spec = c_total
  else:
    even_split = False
    clip_spec, sensitivity = _check_clip_norms(l2_clip_norm, per_layer)
  if isinstance(batch_argnums, int):
    batch_argnums = (batch_argnums,)
  batch_argnums = tuple(int(a) for a in batch_argnums)
  if not batch_argnums or min(batch_argnums) < 1:
    raise ValueError(f"batch_argnums must be indices >= 1 (argument 0 is params), got {batch_argnums}.")
  if microbatch_size is not None:
    microbatch_size = _validation.check_positive_int(microbatch_size, "microbatch_size")
  if method not in ("auto", "vmap", "reweight", "ghost"):
    raise ValueError(f"method must be 'auto', 'vmap', 'reweight' or 'ghost', got {method!r}.")
  if method == "auto":
    method = "ghost"
  if method == "reweight" and per_layer:
    raise ValueError("method='reweight' supports flat clipping only (per_layer=False): "
                     "per-group factors need one backward pass per group.")

  return _build_clipped_grad(
      loss_fn, clip_spec=clip_spec, even_split=even_split, per_layer=per_layer,
      sensitivity=sensitivity, l2_clip_norm=l2_clip_norm, batch_argnums=batch_argnums,
      microbatch_size=microbatch_size, has_aux=has_aux, method=method)



def _build_clipped_grad(loss_fn: Callable[..., Any], *, clip_spec: Any, even_split: bool,
                        per_layer: bool, sensitivity: float, l2_clip_norm: Any,
                        batch_argnums: tuple[int, ...], microbatch_size: int | None,
                        has_aux: bool, method: str, unit_inverse: Any = None) -> ClippedGradFn:
  """:func:`clipped_grad` after validation (also used by adaptive clipping).

  ``clip_spec`` as returned by the validation (per-layer entries may be traced
  float32 scalars here). With ``unit_inverse`` (a traced scalar ``1/D``) each
  example's clipped gradient is divided by D after clipping (never ``g/D``
  first; :func:`clip_groups`), and ``loss_sum`` and ``per_example_norms`` are
  reported divided by D as well.
  """
  uinv = None if unit_inverse is None else jnp.asarray(unit_inverse, jnp.float32)
  chunk_sums = clip_chunks.ChunkClipper(
      loss_fn, clip_spec=clip_spec, even_split=even_split, per_layer=per_layer,
      batch_argnums=batch_argnums, has_aux=has_aux, method=method, uinv=uinv)

  def fn(*args, mask=None):
    params, rest, mask = _check_call(loss_fn, args, mask, batch_argnums=batch_argnums,
                                     has_aux=has_aux, method=method, per_layer=per_layer,
                                     clip_spec=clip_spec, even_split=even_split)
    b = mask.shape[0]
    if microbatch_size is None or b <= microbatch_size:
      gsum, loss_sum, norms, n_clipped, group_counts, aux = chunk_sums(params, mask, rest)
    else:
      n_groups = len(leaf_groups(params, per_layer, clip_spec, even_split)[1])
      gsum, loss_sum, norms, n_clipped, group_counts, aux = clip_chunks.microbatched(
          chunk_sums, params, mask, rest, batch_argnums=batch_argnums,
          microbatch_size=microbatch_size, n_groups=n_groups)
    if not per_layer:
      group_counts = None
    if uinv is not None:  # report in units of D, like the clipped sum
      loss_sum = loss_sum * uinv
      norms = norms * uinv
    info = ClippedGradInfo(loss_sum=loss_sum, per_example_norms=norms, num_clipped=n_clipped,
                           num_examples=jnp.sum(mask), aux=aux if has_aux else None,
                           num_clipped_per_group=group_counts)
    return gsum, info

  return ClippedGradFn(fn, sensitivity, l2_clip_norm, per_layer, microbatch_size, batch_argnums,
                       method=method)


def _check_call(loss_fn: Callable[..., Any], args: tuple, mask: Any, *,
                batch_argnums: tuple[int, ...], has_aux: bool, method: str, per_layer: bool,
                clip_spec: Any, even_split: bool) -> tuple[PyTree, tuple, jax.Array]:
  """``(params, other args, float32 mask)`` of one call, or a named ``ValueError``."""
  if method == "reweight" and any(
      jnp.finfo(_compute_dtype(leaf.dtype)).bits > jnp.finfo(leaf.dtype).bits
      for leaf in jax.tree.leaves(args[0]) if jnp.issubdtype(leaf.dtype, jnp.floating)):
    raise ValueError("method='reweight' needs float32 (or wider) params: its clipped sum comes "
                     "from one backward pass in the params' dtype, so bfloat16/float16 params "
                     "would round the clipped gradients; use method='vmap'.")
  if len(args) < 1 + max(batch_argnums):
    raise ValueError(f"expected at least {1 + max(batch_argnums)} positional arguments "
                     f"(params and batch_argnums={batch_argnums}), got {len(args)}.")
  params, rest = args[0], args[1:]
  batch_leaves = [leaf for i in batch_argnums for leaf in jax.tree.leaves(args[i])]
  if not batch_leaves:
    raise ValueError("the batch_argnums arguments contain no arrays.")
  b = batch_leaves[0].shape[0]
  if any(leaf.shape[0] != b for leaf in batch_leaves):
    raise ValueError("all batch_argnums arrays must share the leading batch size.")
  # One abstract evaluation (shapes only) of the loss on one example: a named error for a
  # wrong feature count, a batch argument missing from batch_argnums, a non-scalar loss or
  # BatchNorm in training mode, instead of one from inside jax/optax/flax.
  _inputs.probe_loss(loss_fn, params, rest, batch_argnums=batch_argnums, has_aux=has_aux,
                     what="loss_fn")
  if per_layer:  # the group structure must match params (a named error otherwise)
    leaf_groups(params, per_layer, clip_spec, even_split)
  if mask is None:
    return params, rest, jnp.ones((b,), jnp.float32)
  mask = jnp.asarray(mask)
  if mask.shape != (b,):
    raise ValueError(f"mask must have shape ({b},) to match the batch, got {mask.shape}.")
  return params, rest, mask.astype(jnp.float32)
