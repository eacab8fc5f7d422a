"""Per-example gradient norms without per-example gradients (ghost norms, book-keeping).

DP-SGD clips every per-example gradient ``g_n`` (paper
``000_tradeoffs_of_private_prediction.md`` Section 3.1, Equation 4; survey
``004_dp_machine_learning_survey.md`` Section 4.2, Algorithm 1, line 7). The
clip factor ``min(1, c / ||g_n||)`` needs only the NORM of ``g_n``, and for the
layers that hold almost all parameters that norm follows from the layer's
input activation ``a_n`` and the cotangent ``delta_n`` of its output, which one
ordinary batched forward + backward pass provides:

* Dense ``z = a W + b`` on T tokens (``a_n`` of shape (T, d), ``delta_n`` of
  shape (T, p)): ``grad_W = a_n^T delta_n``, so (Goodfellow 2015, "Efficient
  per-example gradient computations"; Li et al. 2022, "Large language models
  can be strong differentially private learners", Section 4, "ghost clipping")

    ||grad_W||_F^2 = ||a_n||^2 ||delta_n||^2                      (T = 1)
                   = sum_{t,s} (a_n a_n^T)_{ts} (delta_n delta_n^T)_{ts}   (Gram form),

  and ``grad_b = sum_t delta_{n,t}``.
* Conv: the same identity on the unfolded input (patches of size
  ``d = k_1 ... k_r c_in`` at the T output positions).
* Embed (ids ``i_t``): ``||grad_E||^2 = sum_{t,s} [i_t = i_s] <delta_t, delta_s>``.
* GroupNorm / LayerNorm (and Dense/Conv whenever it is cheaper): the layer's
  own per-example gradient, materialised for that layer only from
  ``(a_n, delta_n)`` with a per-layer ``jax.vjp``.

For Dense/Conv the Gram form costs ``T^2 (d + p)`` per example and the
per-layer materialisation ``T d p``; each layer uses the cheaper one ("mixed
ghost clipping", Bu et al. 2022, "Scalable and efficient training of large
convolutional neural networks with differential privacy", Section 3, Eq. 3.2
and the layerwise decision rule ``2 T^2 < p d``).

Book-keeping (Bu et al. 2023, "Differentially private optimization on large
model at small cost", Algorithm 1): the clipped sum needs no second backward
pass either, because for every covered layer

    sum_n C_n grad_W(n) = vjp_W[layer](a, C * delta),

one weight-gradient contraction of the stored activations with the reweighted
output cotangents (``C_n`` the clip factor of example n, or of the clip group
the parameter belongs to under per-layer clipping).

Capture is functional: the per-example loss is run under
``flax.linen.intercept_methods``; each call of a supported layer records its
input and returns ``output + eps`` with a zero "perturbation" ``eps`` whose
gradient is ``delta`` (the Flax ``perturb`` idea). Parameters the capture does
not cover -- parameters of unsupported layers, of layers called more than
once, layers inside lifted transforms, or parameters that ``loss_fn`` also
uses outside their layer -- get exact per-example gradients from ``jax.vmap``
in the SAME pass (the vmap fallback restricted to those parameters). Coverage
is checked, not assumed: with every covered layer re-run on
``stop_gradient`` of its own parameters, the JVP of the loss with respect to
all covered parameters must be a symbolic zero, i.e. they reach the loss only
through their own layer call; every leaf that fails is demoted to the vmap
fallback.

Floating point: the clip must never be too weak because the norm was
computed a little too small. The squared norm used for the clip factor is an
upper bound of the exact squared norm of ``a_n^T delta_n`` for the computed
``a_n, delta_n``: sums of nonnegative terms (||a||^2 ||delta||^2,
materialised gradients) are inflated by ``gamma_n = n u / (1 - n u)`` for
their longest reduction n (Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., Section 3.1 Lemma 3.1 and Eq. 4.4), and the Gram
forms, whose terms have both signs, get the absolute bound
``gamma_n (sum_t ||a_t|| ||delta_t||)^2`` (|G^a_ts G^d_ts| <=
||a_t|| ||a_s|| ||delta_t|| ||delta_s||). Like ``method="reweight"``, the
clipped sum itself is one batched contraction, with the rounding of an
ordinary backward pass.

Huge and non-finite gradients (as in :mod:`jaxdp.dpsgd.clipping`): the norms
are computed the robust way (:func:`~jaxdp.dpsgd.ghost_layers.layer_sq_norms_scaled`):
every array whose squares are summed -- ``a_n``, ``delta_n``, materialised and
fallback gradients -- is first scaled per example by the power of two
``2^-k`` just above its largest entry (exact), so the norms of finite
gradients never overflow (entries of 1e30 in float32 are clipped correctly);
each leaf's squared norm is carried as ``4^k (sq + err)``, and leaves are
combined exactly by their exponents, the clip factor being
``min(1, 2^-E c' / sqrt(S))`` (set to 0 if it falls below the smallest normal
float32). Terms that underflow after the scaling are covered by an absolute
``2^-100`` per summed term in ``err``. An example with an inf or NaN in a ghost
layer's ``a_n`` or ``delta_n`` or in its materialised or fallback gradients
(which every inf or NaN of a materialised layer's ``a_n`` or ``delta_n`` that the
layer reads reaches, ``x * 0`` being NaN) contributes EXACTLY ZERO (its
activations and cotangents are replaced by zeros with ``jnp.where`` before the
book-keeping contraction), counts as clipped and has norm ``inf`` in the
non-private diagnostics.

Every chunk takes this rule; there is no cheaper plain rule for the whole
chunk behind a ``jax.lax.cond`` taken only for huge or non-finite values. Such
a cond was measured slower on both backends: XLA:GPU reads a conditional's
predicate on the host, a stall inside every step (on an H200, jax 0.11.2,
``benchmarks/compare_trees.py``: ResNet-20 GN's ghost step at batch 600 took
1.22x the time of the same step without the cond, the MLP's at batch 256 1.38x,
the SmallCNN's 1.42x, while the robust rule for every chunk cost ResNet-20
1.05x); on 2 CPU cores the plan's bare SmallCNN ghost step (357 rows) took
77.5 ms with the cond against 61.6 ms with the robust rule inline. Only the
row sums of squares of dense layers with one token and of materialised
gradients take a platform-dependent form
(``jaxdp.dpsgd.ghost_layers._scaled_rows_sumsq``): on XLA:CPU the plain
sums, written exactly as ``4^k (s 4^-k)``, with a narrow ``cond`` that redoes
scaled only the arrays holding a row whose plain sum is not finite (the MLP's
clipped gradient at 357 rows: 8.8 ms against 9.6 ms with every row scaled
first); elsewhere every row is scaled first, as above.
"""


from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jaxdp.dpsgd import clip_factors as _cf
# _Call and _conv_patches are re-exported for the tests of the capture.
from jaxdp.dpsgd.ghost_layers import (  # pylint: disable=unused-import
    _UNDERFLOW_SLACK, _combine, _conv_patches, _f32, _gamma, _layer_sq_norms, _leaf_groups,
    _own_params, _row_scale, _row_terms, _rows_sumsq, _safe_factor, _scaled_rows_sumsq,
    layer_grads, layer_sq_norms_scaled)
from jaxdp.dpsgd.ghost_plan import (  # pylint: disable=unused-import
    GhostPlan, _Call, _capture, make_plan)

PyTree = Any


def per_example_sq_norms(loss_fn: Callable[..., Any], params: PyTree, *args: Any,
                         batch_argnums: int | Sequence[int] = 1, has_aux: bool = False,
                         plan: GhostPlan | None = None) -> PyTree:
  """Per-example squared gradient norm of every parameter leaf, without per-example gradients.

  Returns a pytree like ``params`` whose leaves are (B,) float32 arrays
  ``||d loss_fn(params, example_n) / d leaf||^2`` (ghost norms for covered
  layers, vmap for the rest; module docstring).
  """
  if isinstance(batch_argnums, int):
    batch_argnums = (batch_argnums,)
  batch_argnums = tuple(batch_argnums)
  if plan is None:
    plan = make_plan(loss_fn, params, *args, batch_argnums=batch_argnums, has_aux=has_aux)
  b = jax.tree.leaves(args[batch_argnums[0] - 1])[0].shape[0]
  mask = jnp.ones((b,), jnp.float32)
  leaves, treedef = jax.tree.flatten(params)
  _, acts, deltas, fb_grads, _ = _capture(loss_fn, plan, params, mask, args, batch_argnums, has_aux)
  sq = [None] * len(leaves)
  for c, a, d in zip(plan.calls, acts, deltas):
    for i, (s, _, k, _) in _layer_sq_norms(c, leaves, a, d)[0].items():
      sq[i] = jnp.ldexp(s, 2 * k)
  for i, g in zip(plan.fallback_leaves, fb_grads):
    s, _, k, _ = _scaled_rows_sumsq(g)
    sq[i] = jnp.ldexp(s, 2 * k)
  return jax.tree.unflatten(treedef, sq)


def ghost_chunk_sums(loss_fn: Callable[..., Any], params: PyTree, mask: jax.Array, args: tuple, *,
                     batch_argnums: Sequence[int], has_aux: bool, per_layer: bool, clip_spec: Any,
                     even_split: bool, unit_inverse: Any = None):
  """Clipped gradient sum of one chunk by ghost norms + book-keeping.

  Returns ``(grad_sum, loss_sum, norms, num_clipped, num_clipped_per_group, aux)``
  with the meaning of ``clipping.clipped_grad``'s chunk sums: ``grad_sum = sum_n
  mask_n sum_k C_{n,k} g_{n,k}`` with ``C_{n,k} = min(1, c_k / ||g_{n,k}||)`` for
  clip group k (one group for flat clipping; ``min(1/D, ...)`` with
  ``unit_inverse = 1/D``), ``norms`` the global pre-clip norms (0 for masked
  slots, ``inf`` for non-finite examples, which contribute zero),
  ``num_clipped_per_group`` a (G,) count under per-layer clipping (else None).
  """
  batch_argnums = tuple(batch_argnums)
  plan = make_plan(loss_fn, params, *args, batch_argnums=batch_argnums, has_aux=has_aux)
  group_of, clips = _leaf_groups(params, per_layer, clip_spec, even_split)

  leaves, treedef = jax.tree.flatten(params)
  keep = mask > 0
  loss, acts, deltas, fb_grads, aux = _capture(loss_fn, plan, params, mask, args,
                                               batch_argnums, has_aux)
  mats = [layer_grads(c, leaves, a, d) for c, a, d in zip(plan.calls, acts, deltas)]
  ctx = _FactorContext(plan, leaves, group_of, clips, unit_inverse, mask.shape[0])
  factors, scaled, finite, norm = ctx.factors(acts, deltas, fb_grads, mats)
  use = jnp.logical_and(keep, finite)
  factors = jnp.where(use[None, :], factors, 0.0)
  per_group = jnp.logical_and(keep[None, :],
                              jnp.logical_or(scaled, jnp.logical_not(finite)[None, :]))
  per_group = jnp.logical_and(per_group, jnp.asarray(ctx.nonempty)[:, None])
  gsum = _bookkeeping(plan, leaves, acts, deltas, fb_grads, mats, factors, use, group_of)
  was_scaled = jnp.any(per_group, axis=0)
  counts = jnp.sum(per_group.astype(jnp.int32), axis=1) if per_layer else None
  return (jax.tree.unflatten(treedef, gsum), jnp.sum(jnp.where(keep, _f32(loss), 0.0)),
          jnp.where(keep, norm, 0.0), jnp.sum(was_scaled.astype(jnp.int32)), counts, aux)


class _FactorContext:
  """Per-group clip factors of one chunk, from the scaled per-layer rules.

  :meth:`factors` returns ``(factors (G, B), scaled (G, B), finite (B,), norm (B,))``: the
  factor ``min(cap, c_k' / bound)`` of group k (before masking), whether it is
  below the cap, whether the example is finite, and its global pre-clip norm
  (``inf`` if not finite). ``nonempty`` marks the groups with a parameter.
  """

  def __init__(self, plan: GhostPlan, leaves: list, group_of: list, clips: list,
               unit_inverse: Any, batch: int):
    self.plan, self.leaves, self.group_of, self.clips = plan, leaves, group_of, clips
    self.b = batch
    self.cap = unit_inverse
    self.nonempty = [any(g == k for g in group_of) for k in range(len(clips))]

  def _finish(self, parts_g: list, finite, factor_of, diag) -> tuple:
    b = self.b
    for parts in parts_g:  # non-finite sums (e.g. a gram of non-finite inputs) are caught too
      for _, v in parts:
        finite = jnp.logical_and(finite, jnp.isfinite(v))
    factors, scaled = [], []
    for g, parts in enumerate(parts_g):
      if not parts:
        factors.append(jnp.zeros((b,), jnp.float32))
        scaled.append(jnp.zeros((b,), bool))
        continue
      f, sc = factor_of(parts, self.clips[g])
      factors.append(f)
      scaled.append(sc)
    stack = lambda xs, dt: jnp.stack(xs) if xs else jnp.zeros((0, b), dt)
    return stack(factors, jnp.float32), stack(scaled, bool), finite, jnp.where(finite, diag, jnp.inf)

  def factors(self, acts, deltas, fb_grads, mats) -> tuple:
    """The factors from :func:`layer_sq_norms_scaled` (finite at any float32 magnitude)."""
    b = self.b
    parts_g: list = [[] for _ in self.clips]
    diag_parts: list = []  # (k, sq) without the error bounds: the reported norms
    finite = jnp.ones((b,), bool)
    for c, a, d, m in zip(self.plan.calls, acts, deltas, mats):
      out, fin = layer_sq_norms_scaled(c, self.leaves, a, d, m)
      finite = jnp.logical_and(finite, fin)
      for i, (s, e, k, _) in out.items():
        parts_g[self.group_of[i]].append((k, s + e))
        diag_parts.append((k, s))
    for i, gr in zip(self.plan.fallback_leaves, fb_grads):
      s, gam, k, fin = _scaled_rows_sumsq(gr)
      finite = jnp.logical_and(finite, fin)
      parts_g[self.group_of[i]].append((k, s + s * gam + _UNDERFLOW_SLACK * _row_terms(gr)))
      diag_parts.append((k, s))
    n = len(self.leaves)

    def factor_of(parts, clip):
      big, total = _combine(parts)
      # Summing the K nonnegative leaf terms adds at most gamma_K (relative); the terms
      # lost to underflow in the combination add at most 2^-100 each.
      bound = (total + _UNDERFLOW_SLACK * len(parts)) * (1.0 + _gamma(n + 2))
      return _safe_factor(big, bound, clip, self.cap)

    if diag_parts:
      big, total = _combine(diag_parts)
      diag = _cf._scaled_norm(big, total)  # pylint: disable=protected-access
    else:
      diag = jnp.zeros((b,), jnp.float32)
    return self._finish(parts_g, finite, factor_of, diag)


def _bookkeeping(plan: GhostPlan, leaves: list, acts, deltas, fb_grads, mats, factors, use,
                 group_of: list) -> list:
  """The clipped sum per leaf: ``vjp_W(layer)(a, C * delta)`` per layer and clip group.

  ``a`` and ``delta`` of unused (masked or non-finite) examples are replaced
  by zeros, never multiplied (``inf * 0`` is NaN), and materialised and
  fallback leaves are summed as ``sum_n [use_n] C_n g_n``.
  """
  b = use.shape[0]
  out = [None] * len(leaves)
  materialised = {i: g for m in mats for i, g in m.items()}
  for c, a, d in zip(plan.calls, acts, deltas):
    own_f32 = jax.tree.map(_f32, _own_params(c, leaves))
    a_safe = jnp.where(use.reshape((b,) + (1,) * (a.ndim - 1)), a, jnp.zeros_like(a))
    kd = use.reshape((b,) + (1,) * (d.ndim - 1))
    groups = sorted({group_of[i] for i in c.leaves.values() if i not in materialised})
    names_by_group = {g: [n for n, i in c.leaves.items()
                          if group_of[i] == g and i not in materialised] for g in groups}
    for g in groups:
      f = factors[g].reshape((b,) + (1,) * (d.ndim - 1))
      wd = jnp.where(kd, _f32(d) * f, 0.0)

      def batched(p, module=c.module, a_safe=a_safe):
        return jax.vmap(lambda ai: module.apply({"params": p}, ai))(a_safe)

      _, vjp = jax.vjp(batched, own_f32)
      grads = vjp(wd.astype(jax.eval_shape(batched, own_f32).dtype))[0]
      for path, gv in jax.tree_util.tree_flatten_with_path(grads)[0]:
        name = jax.tree_util.keystr(path)
        if name in names_by_group[g]:
          out[c.leaves[name]] = gv
  for i, gr in list(zip(plan.fallback_leaves, fb_grads)) + list(materialised.items()):
    f = factors[group_of[i]].reshape((b,) + (1,) * (gr.ndim - 1))
    kg = use.reshape((b,) + (1,) * (gr.ndim - 1))
    out[i] = jnp.sum(jnp.where(kg, _f32(gr) * f, 0.0), axis=0)
  return out


__all__ = ["GhostPlan", "ghost_chunk_sums", "make_plan", "per_example_sq_norms"]
