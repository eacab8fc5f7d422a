"""Clipped gradient sums of one chunk (``method="vmap"`` and ``"reweight"``) and the microbatch scan.

Each chunk function returns ``(grad_sum, loss_sum, norms, num_clipped,
num_clipped_per_group, aux)`` for the ``(B,)`` mask of the chunk, with the
rules of :mod:`jaxdp.dpsgd.clipping`: ``grad_sum = sum_n mask_n sum_k C_{n,k}
g_{n,k}``, ``C_{n,k} = min(1, c_k' / ||g_{n,k}||)`` (``min(1/D, ...)`` with a
``unit_inverse`` ``1/D``), and an example whose gradient holds an inf or NaN
contributing EXACTLY zero (a ``jnp.where``, never a product), counted as
clipped with norm ``inf``.

Norms. The vmap method gives every example's group two sums of squares in one variadic
reduction (:func:`~jaxdp.dpsgd.clip_factors.group_sum_squares`): the plain
``fl(sum g^2)`` and ``fl(sum (2^-k g)^2)``, whose terms cannot overflow for
any finite float32 ``g``; the second is used only where the first overflowed,
and the clipped gradient is ``(g p) f`` with ``p = 2^-k`` there (else 1), so a
finite gradient of any size is clipped correctly
(:func:`~jaxdp.dpsgd.clip_factors.factor_from_sums`). A masked or non-finite
example gets factor 0, and ``(g p) f`` is then 0 but for NaN at the entries
where ``g`` is not finite (``inf * 0``).

The vmap method removes those NaN in one of two forms, chosen by platform at
lowering (``jax.lax.platform_dependent``). Off XLA:CPU a ``where`` on each
entry's own value maps them to 0, so no ``jax.lax.cond`` is needed: XLA:GPU
reads a conditional's predicate on the host, a stall in every step (on an
H200 the earlier form, with a ``cond`` for huge or non-finite examples, made
the SmallCNN's vmap step 1.41x and the MLP's 1.22x slower than the same step
without it). On XLA:CPU that ``where`` keeps the batch sum from fusing with
the product (the MLP's vmap step at batch 256: 1.85 s against 1.10 s on 2
cores), so there the sum is formed without it and a ``cond`` redoes it with
the ``where`` only when it is not finite. The reweight method's batched
backward pass cannot keep a zero-weighted non-finite example's ``0 * inf``
out of its sum, so it needs a ``cond`` on every platform anyway; it computes
the plain sums alone, and a chunk with a non-finite sum, or with an example
whose plain sum overflowed or whose factor flushed to zero, is redone by the
vmap method inside that ``cond``. Only small operands (params, the batch, a
mask) enter a ``cond``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jaxdp.dpsgd import clip_factors as cf

PyTree = Any

# Which form method="vmap" lowers to: "auto" (by platform, ChunkClipper.vmap), or, for tests,
# "inline" (every platform's form elsewhere than XLA:CPU) or "repaired" (XLA:CPU's).
_VMAP_FORM = "auto"


class ChunkClipper:
  """The per-chunk clipped sums of one ``clipped_grad`` configuration.

  Attributes mirror the arguments of ``clipping._build_clipped_grad``;
  ``uinv`` is the traced ``1/D`` of adaptive clipping or None.
  """

  def __init__(self, loss_fn: Callable[..., Any], *, clip_spec: Any, even_split: bool,
               per_layer: bool, batch_argnums: tuple[int, ...], has_aux: bool, method: str,
               uinv: Any = None):
    self.loss_fn = loss_fn
    self.clip_spec = clip_spec
    self.even_split = even_split
    self.per_layer = per_layer
    self.batch_argnums = batch_argnums
    self.has_aux = has_aux
    self.method = method
    self.uinv = uinv

  def _in_axes(self, args: tuple) -> list:
    return [None, 0] + [0 if i in self.batch_argnums else None for i in range(1, len(args) + 1)]

  def _value_and_grad_one(self, params, *args):
    out, grads = jax.value_and_grad(self.loss_fn, has_aux=self.has_aux)(params, *args)
    loss, aux = out if self.has_aux else (out, None)
    return loss.astype(cf._compute_dtype(loss.dtype)), aux, cf._upcast(grads)  # pylint: disable=protected-access

  def _groups(self, params) -> tuple[list, list]:
    group_of, clips = cf.leaf_groups(params, self.per_layer, self.clip_spec, self.even_split)
    return [[i for i, g in enumerate(group_of) if g == k] for k in range(len(clips))], clips

  def __call__(self, params, mask, args):
    if self.method == "reweight":
      return self.reweight(params, mask, args)
    if self.method == "ghost":
      from jaxdp.dpsgd import ghost_norms  # pylint: disable=g-import-not-at-top
      return ghost_norms.ghost_chunk_sums(
          self.loss_fn, params, mask, args, batch_argnums=self.batch_argnums,
          has_aux=self.has_aux, per_layer=self.per_layer, clip_spec=self.clip_spec,
          even_split=self.even_split, unit_inverse=self.uinv)
    return self.vmap(params, mask, args)

  def vmap(self, params, mask, args):
    """Materialised per-example gradients, clipped group-wise and summed.

    XLA:CPU runs :meth:`_vmap_repaired`, every other platform the same sum with
    each non-finite entry zeroed in place and no ``cond``
    (``jax.lax.platform_dependent``, chosen at lowering; module docstring).
    """
    if _VMAP_FORM == "inline":
      return self._vmap_sum(params, mask, args, True)
    if _VMAP_FORM == "repaired":
      return self._vmap_repaired(params, mask, args)
    return jax.lax.platform_dependent(params, mask, args, cpu=self._vmap_repaired,
                                      default=lambda *ops: self._vmap_sum(*ops, True))

  def _vmap_repaired(self, params, mask, args):
    """The sum without the per-entry ``where``; a non-finite sum is redone with it (``cond``)."""
    fast = self._vmap_sum(params, mask, args, False)
    bad = _not_finite(fast[0])
    gsum = _redone_if(bad, lambda ops: self._vmap_sum(*ops, True)[0], (params, mask, args),
                      fast[0])
    return (gsum,) + tuple(fast[1:])

  def _vmap_sum(self, params, mask, args, zero_entries: bool):
    groups, clips = self._groups(params)
    keep = mask > 0
    clipped, loss, norm, per_group, aux = jax.vmap(
        self._clip_one(groups, clips, zero_entries), in_axes=self._in_axes(args))(
            params, mask, *args)
    gsum = jax.tree.map(lambda g: jnp.sum(g, axis=0), clipped)
    per_group = jnp.logical_and(keep[:, None], per_group)
    counts = jnp.sum(per_group.astype(jnp.int32), axis=0) if self.per_layer else None
    n_clipped = jnp.sum(jnp.any(per_group, axis=1).astype(jnp.int32))
    return (gsum, jnp.sum(jnp.where(keep, loss, 0.0)), jnp.where(keep, norm, 0.0), n_clipped,
            counts, aux)

  def _clip_one(self, groups: list, clips: list, zero_entries: bool) -> Callable[..., Any]:
    """One example's clipped gradient ``(g p) f`` from its plain and scaled sums (module docstring).

    Returns ``(clipped, loss, norm, scaled per group (G,), aux)``. A masked or
    non-finite example gets factor 0; a non-finite one counts as scaled in
    every group and has norm ``inf``. ``(g p) f`` is finite exactly when ``g``
    is (``|g p f| <= |g|`` up to the clip), so with ``zero_entries`` a
    ``where`` on each entry's own value maps the NaN of ``inf * 0`` to 0 and a
    non-finite example contributes exactly zero; without it the caller must
    redo a non-finite sum.
    """
    def one(params, m, *args):
      loss, aux, grads = self._value_and_grad_one(params, *args)
      leaves, treedef = jax.tree.flatten(grads)
      sums, lows, ks = cf.group_sum_squares(leaves, groups)
      factors, scaled, finite = [], [], jnp.array(True)
      for k, (idx, c) in enumerate(zip(groups, clips)):
        pre, f, sc, fin = cf.factor_from_sums(sums[k], lows[k], ks[k], [leaves[i] for i in idx],
                                              c, self.uinv)
        factors.append((pre, f))
        scaled.append(jnp.logical_and(sc, bool(idx)))
        finite = jnp.logical_and(finite, fin)
      use = jnp.logical_and(m > 0, finite)
      out: list = [None] * len(leaves)
      for idx, (pre, f) in zip(groups, factors):
        f = jnp.where(use, f, 0.0)
        for i in idx:
          dt = leaves[i].dtype
          v = (leaves[i] * pre.astype(dt)) * f.astype(dt)
          out[i] = jnp.where(jnp.abs(v) < jnp.inf, v, jnp.zeros_like(v)) if zero_entries else v
      per_group = (jnp.logical_or(jnp.stack(scaled), jnp.logical_not(finite)) if scaled
                   else jnp.zeros((0,), bool))
      return (jax.tree.unflatten(treedef, out), loss, cf.norm_from_sums(sums, lows, ks, finite),
              per_group, aux)
    return one

  def reweight(self, params, mask, args):
    """Vmapped norms, then ONE batched backward pass of the reweighted loss (flat clipping).

    ``sum_n C_n g_n = grad_theta sum_n stop_grad(C_n) loss_n(theta)``, the
    factors from the plain sums alone
    (:func:`~jaxdp.dpsgd.clip_factors.plain_sum_squares`). The chunk is
    recomputed by the vmap method inside a ``jax.lax.cond`` (module docstring)
    when a kept example's sum is not finite (an inf or NaN entry, or a finite
    gradient of norm above about ``1.8e19`` whose squares overflowed), when its
    factor was flushed to zero, or when the batched sum is not finite (``0 *
    inf`` in a zero-weighted example's backward pass); without the scaled sums
    the common step is 0.8x as long on 2 CPU cores.
    """
    in_axes = self._in_axes(args)
    keep = mask > 0

    def factor_one(p, *a):
      loss, aux, grads = self._value_and_grad_one(p, *a)
      leaves = jax.tree.leaves(grads)
      s = cf.plain_sum_squares(leaves)
      # With s_low = s and k = 0, fin is whether s is finite: False for an inf/NaN entry AND
      # for a finite gradient whose sum overflowed (||g|| > ~1.8e19); both are redone by vmap.
      _, f, sc, fin = cf.factor_from_sums(s, s, 0, leaves, self.clip_spec, self.uinv)
      norm = jnp.where(fin, jnp.sqrt(s), jnp.inf)
      fin = jnp.logical_and(fin, f > 0)  # f = 0: c' / ||g|| below the smallest normal float
      return f, sc, fin, norm, loss, aux

    f, sc, finite, norm, loss, aux = jax.vmap(lambda p, m, *a: factor_one(p, *a),
                                                    in_axes=in_axes)(params, mask, *args)
    factor = jax.lax.stop_gradient(jnp.where(jnp.logical_and(keep, finite), f, 0.0))

    def loss_only(p, *a):
      out = self.loss_fn(p, *a)
      return out[0] if self.has_aux else out

    def weighted_total(p):
      losses = jax.vmap(loss_only, in_axes=[None] + in_axes[2:])(p, *args)
      return jnp.sum(jnp.where(keep, factor * losses, 0.0))

    gsum = jax.grad(weighted_total)(params)
    norm = jnp.where(keep, norm, 0.0)
    n_clipped = jnp.sum(jnp.logical_and(keep, jnp.logical_or(sc, jnp.logical_not(finite)))
                        .astype(jnp.int32))
    bad = jnp.logical_or(_not_finite(gsum),
                         jnp.any(jnp.logical_and(keep, jnp.logical_not(finite))))

    def redo(ops):  # the vmap method: a non-finite example's contribution is a where's zero
      out = self._vmap_sum(*ops, True)
      return out[0], out[2], out[3]

    gsum, norm, n_clipped = _redone_if(bad, redo, (params, mask, args), (gsum, norm, n_clipped))
    return gsum, jnp.sum(jnp.where(keep, loss, 0.0)), norm, n_clipped, None, aux


def _redone_if(bad: jax.Array, redo: Callable[..., Any], ops: tuple, current: PyTree) -> PyTree:
  """``redo(ops)`` where ``bad``, else ``current``; ``redo`` runs in a ``jax.lax.cond`` only then.

  Only ``ops`` (params, the mask, the batch: small) enter the ``cond``, not
  ``current`` (module docstring).
  """
  shapes = jax.eval_shape(lambda: current)
  redone = jax.lax.cond(bad, redo,
                        lambda _: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes), ops)
  return jax.tree.map(lambda c, r: jnp.where(bad, r.astype(c.dtype), c), current, redone)


def _not_finite(tree: PyTree) -> jax.Array:
  """Whether any entry of ``tree`` is inf or NaN (a scalar bool)."""
  return jnp.logical_not(jnp.all(jnp.stack([jnp.all(jnp.isfinite(g))
                                            for g in jax.tree.leaves(tree)] or [True])))


def microbatched(chunk_sums: Callable[..., Any], params: PyTree, mask: jax.Array, rest: tuple, *,
                 batch_argnums: Sequence[int], microbatch_size: int, n_groups: int):
  """``chunk_sums`` over chunks of ``microbatch_size`` rows with ``jax.lax.scan``.

  B need not be a multiple of the chunk size: the tail is padded and masked.
  Returns the chunk tuple for the whole batch (norms and aux in batch order).
  """
  b, mb = mask.shape[0], microbatch_size
  n_chunks = -(-b // mb)
  pad = n_chunks * mb - b

  def reshape(x):
    return jax.tree.map(lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)).reshape(
        (n_chunks, mb) + a.shape[1:]), x)

  batched_idx = [i for i in range(len(rest)) if (i + 1) in batch_argnums]
  static_rest = {i: x for i, x in enumerate(rest) if (i + 1) not in batch_argnums}
  mask_c = jnp.pad(mask, (0, pad)).reshape(n_chunks, mb)

  def body(carry, xs):
    acc, loss_acc, clip_acc, group_acc = carry
    m, *batched = xs
    full = [None] * len(rest)
    for i, v in static_rest.items():
      full[i] = v
    for i, v in zip(batched_idx, batched):
      full[i] = v
    gsum_c, loss_c, norms_c, n_c, groups_c, aux_c = chunk_sums(params, m, tuple(full))
    acc = jax.tree.map(jnp.add, acc, gsum_c)
    if groups_c is not None:
      group_acc = group_acc + groups_c
    return (acc, loss_acc + loss_c, clip_acc + n_c, group_acc), (norms_c, aux_c)

  zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), cf._compute_dtype(jnp.result_type(p))),  # pylint: disable=protected-access
                       params)
  (gsum, loss_sum, n_clipped, group_counts), (norms, aux) = jax.lax.scan(
      body, (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32),
             jnp.zeros((n_groups,), jnp.int32)),
      (mask_c, *[reshape(rest[i]) for i in batched_idx]))
  norms = norms.reshape(-1)[:b]
  if aux is not None:
    aux = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:])[:b], aux)
  return gsum, loss_sum, norms, n_clipped, group_counts, aux
