"""Clipped gradient sums of one chunk (``method="vmap"`` and ``"reweight"``) and the microbatch scan.

Each chunk function returns ``(grad_sum, loss_sum, norms, num_clipped,
num_clipped_per_group, aux)`` for the ``(B,)`` mask of the chunk, with the
rules of :mod:`jaxdp.dpsgd.clipping`: ``grad_sum = sum_n mask_n sum_k C_{n,k}
g_{n,k}``, ``C_{n,k} = min(1, c_k' / ||g_{n,k}||)`` (``min(1/D, ...)`` with a
``unit_inverse`` ``1/D``), and an example whose gradient holds an inf or NaN
contributing EXACTLY zero (a ``jnp.where``, never a product), counted as
clipped with norm ``inf``.

Cost. The common case is the plain computation: one sum of squares per
example and group and one product per gradient entry
(:mod:`jaxdp.dpsgd.clip_factors`), the clipping done inside the vmapped
per-example function as before. An example whose plain sum is not finite -- a
huge gradient whose squares overflow, or an inf or NaN -- gets clip factor 0
there (its product is 0, or NaN for an inf or NaN entry), and a
``jax.lax.cond`` recomputes the per-example gradients of exactly those
examples and clips them by :func:`~jaxdp.dpsgd.clip_factors.clip_groups`
(power-of-two scaled: a finite gradient of any size is clipped correctly, a
non-finite one contributes zero); their contributions come from that
recomputation alone, norms included. When the batch sum is not finite (``inf *
0`` in the vmap method, or in a zero-weighted example's backward pass in the
reweight method) the recomputation replaces it for every kept example, so no
NaN or inf ever leaves the chunk. Only small arrays (params, the batch, a
mask) enter the ``cond``: on XLA:CPU heavy work or large operands inside a
conditional cost several times more.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jaxdp.dpsgd import clip_factors as cf

PyTree = Any



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
    """Materialised per-example gradients, clipped group-wise and summed."""
    groups, clips = self._groups(params)
    keep = mask > 0
    clipped, loss, norm, per_group, plain, aux = jax.vmap(
        self._plain_one(groups, clips), in_axes=self._in_axes(args))(params, mask, *args)
    gsum = jax.tree.map(lambda g: jnp.sum(g, axis=0), clipped)
    per_group = jnp.logical_and(keep[:, None], per_group)
    bad = _not_finite(gsum)
    subset = jnp.where(bad, keep, jnp.logical_and(keep, jnp.logical_not(plain)))
    gsum, norm, per_group = self._with_rare(params, args, gsum, jnp.where(keep, norm, 0.0),
                                            per_group, subset, bad)
    counts = jnp.sum(per_group.astype(jnp.int32), axis=0) if self.per_layer else None
    n_clipped = jnp.sum(jnp.any(per_group, axis=1).astype(jnp.int32))
    return gsum, jnp.sum(jnp.where(keep, loss, 0.0)), norm, n_clipped, counts, aux

  def _plain_one(self, groups: list, clips: list) -> Callable[..., Any]:
    """One example's clipped gradient from its plain sums (factor 0 where they are not finite).

    Returns ``(clipped, loss, norm, scaled per group (G,), plain, aux)``. A
    gradient holding an inf or NaN gives NaN here (``inf * 0``); the caller finds it
    in the batch sum and recomputes every kept example (module docstring). The mask
    is applied by a ``where`` on the mask alone and the finiteness through the
    scalar factor: a ``where`` on a predicate computed from the norm costs XLA:CPU
    about 15% of the step.
    """
    def one(params, m, *args):
      loss, aux, grads = self._value_and_grad_one(params, *args)
      leaves, treedef = jax.tree.flatten(grads)
      sums = cf.group_sum_squares(leaves, groups)
      plain = jnp.all(jnp.isfinite(sums))
      keep = m > 0
      out: list = [None] * len(leaves)
      scaled = []
      for k, (idx, c) in enumerate(zip(groups, clips)):
        f, sc = cf.factor_from_sum(sums[k], [leaves[i] for i in idx], c, self.uinv)
        f = jnp.where(plain, f, 0.0)
        for i in idx:
          out[i] = jnp.where(keep, leaves[i] * f.astype(leaves[i].dtype),
                             jnp.zeros_like(leaves[i]))
        scaled.append(jnp.logical_and(sc, bool(idx)))
      per_group = jnp.stack(scaled) if scaled else jnp.zeros((0,), bool)
      return (jax.tree.unflatten(treedef, out), loss, jnp.sqrt(jnp.sum(sums)), per_group, plain,
              aux)
    return one

  def _with_rare(self, params, args, gsum, norm, per_group, subset, redo_all):
    """Adds the robust contributions of the ``subset`` examples (``jax.lax.cond``).

    The examples in ``subset`` (kept, plain sums not finite) are recomputed and
    clipped by :func:`clip_factors.clip_groups` (power-of-two scaled; zero for a
    non-finite gradient), their norms and flags replacing the plain ones; with
    ``redo_all`` the recomputed sum replaces ``gsum`` instead of adding to it.
    Nothing is recomputed when ``subset`` is empty.
    """
    groups, clips = self._groups(params)
    shapes = jax.eval_shape(lambda: gsum)
    in_axes = self._in_axes(args)

    def robust(ops):
      p, sub, a = ops

      def one(p_, s_, *a_):
        _, _, grads = self._value_and_grad_one(p_, *a_)
        leaves, treedef = jax.tree.flatten(grads)
        out, nrm, _, pg, _ = cf.clip_groups(leaves, groups, clips, self.uinv)
        out = [jnp.where(s_, v, jnp.zeros_like(v)) for v in out]
        return jax.tree.unflatten(treedef, out), nrm, jnp.logical_and(s_, pg)

      out, nrm, pg = jax.vmap(one, in_axes=in_axes)(p, sub, *a)
      return jax.tree.map(lambda g: jnp.sum(g, axis=0), out), nrm, pg.reshape(per_group.shape)

    def nothing(ops):
      return (jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes),
              jnp.zeros(norm.shape, norm.dtype), jnp.zeros(per_group.shape, bool))

    r_sum, r_norm, r_pg = jax.lax.cond(jnp.any(subset), robust, nothing, (params, subset, args))
    gsum = jax.tree.map(lambda g, r: jnp.where(redo_all, r, g + r.astype(g.dtype)), gsum, r_sum)
    norm = jnp.where(subset, r_norm, norm)
    per_group = jnp.where(subset[:, None], r_pg, per_group)
    return gsum, norm, per_group

  def reweight(self, params, mask, args):
    """Vmapped norms, then ONE batched backward pass of the reweighted loss (flat clipping).

    ``sum_n C_n g_n = grad_theta sum_n stop_grad(C_n) loss_n(theta)``. The
    examples whose plain sum of squares is not finite get factor 0 there and are
    recomputed by the vmap method; when the batched sum is not finite (``0 * inf``
    in a zero-weighted example's backward pass) every kept example is
    (module docstring).
    """
    in_axes = self._in_axes(args)
    keep = mask > 0

    def factor_one(p, *a):
      loss, aux, grads = self._value_and_grad_one(p, *a)
      leaves = jax.tree.leaves(grads)
      s = cf.group_sum_squares(leaves, [list(range(len(leaves)))])[0]
      f, sc = cf.factor_from_sum(s, leaves, self.clip_spec, self.uinv)
      return f, sc, s, loss, aux

    f, sc, s, loss, aux = jax.vmap(lambda p, m, *a: factor_one(p, *a), in_axes=in_axes)(
        params, mask, *args)
    plain = jnp.isfinite(s)
    factor = jax.lax.stop_gradient(jnp.where(jnp.logical_and(keep, plain), f, 0.0))

    def loss_only(p, *a):
      out = self.loss_fn(p, *a)
      return out[0] if self.has_aux else out

    def weighted_total(p):
      losses = jax.vmap(loss_only, in_axes=[None] + in_axes[2:])(p, *args)
      return jnp.sum(jnp.where(keep, factor * losses, 0.0))

    gsum = jax.grad(weighted_total)(params)
    bad = _not_finite(gsum)
    subset = jnp.where(bad, keep, jnp.logical_and(keep, jnp.logical_not(plain)))
    gsum, norm, per_group = self._with_rare(
        params, args, gsum, jnp.where(keep, jnp.sqrt(s), 0.0),
        jnp.logical_and(keep, sc)[:, None], subset, bad)
    n_clipped = jnp.sum(per_group[:, 0].astype(jnp.int32))
    return gsum, jnp.sum(jnp.where(keep, loss, 0.0)), norm, n_clipped, None, aux


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
