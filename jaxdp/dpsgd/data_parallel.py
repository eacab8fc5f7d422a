"""Data-parallel DP-SGD: per-example clipped sums reduced across devices.

Each device computes the sum of clipped per-example gradients of its shard of
the (padded, masked) Poisson batch with ``jax.shard_map``; the shard sums are
added with ``jax.lax.psum``. Because the clipped SUM is linear in the set of
examples, the reduced sum is the same quantity that one device would compute
(up to floating-point reassociation), with the same L2 sensitivity
``l2_clip_norm``: data parallelism changes nothing in the privacy analysis
(paper ``000_tradeoffs_of_private_prediction.md`` Section 3.1, Equation 4).

Noise is added ONCE, after the reduction: :func:`noisy_aggregate` runs on the
replicated reduced sum outside ``shard_map``, so every device draws the SAME
noise from the same key (the computation is replicated, not repeated with
different keys). Adding independent noise on each device before the psum would
give ``sqrt(D)`` times the intended standard deviation (too much noise, fine
for privacy but not what the accountant was told); adding the same-key noise
on each device before the psum would multiply it by D. Neither happens here.
With the same key the result equals single-device training.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdp.dpsgd.clipping import ClippedGradFn, ClippedGradInfo


def make_data_mesh(num_devices: int | None = None, axis_name: str = "data") -> Mesh:
  """A 1-D mesh over the first ``num_devices`` devices (default: all)."""
  devices = jax.devices()
  if num_devices is None:
    num_devices = len(devices)
  if not 1 <= num_devices <= len(devices):
    raise ValueError(f"num_devices must be in [1, {len(devices)}], got {num_devices}.")
  return Mesh(np.asarray(devices[:num_devices]), (axis_name,))


def data_parallel_clipped_grad(grad_fn: ClippedGradFn, mesh: Mesh,
                               axis_name: str = "data") -> ClippedGradFn:
  """Wraps a :func:`clipped_grad` function to run data-parallel over ``mesh``.

  The returned function has the same signature, output and ``.sensitivity`` as
  ``grad_fn``; batch arguments (and the mask) are split along their leading
  axis over ``axis_name`` (the batch size must be a multiple of the number of
  devices on that axis; :class:`PoissonSampler` ``multiple_of`` does this),
  params and non-batch arguments are replicated, and the gradient sum, loss
  sum and counts are ``psum``-reduced. ``per_example_norms`` and ``aux`` keep
  their batch layout.
  """
  if axis_name not in mesh.axis_names:
    raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh {mesh.axis_names}.")
  n_dev = mesh.shape[axis_name]
  batch_argnums = grad_fn.batch_argnums
  batch_spec = P(axis_name)

  def local(params, mask, *args):
    g, info = grad_fn(params, *args, mask=mask)
    g = jax.lax.psum(g, axis_name)
    info = ClippedGradInfo(
        loss_sum=jax.lax.psum(info.loss_sum, axis_name),
        per_example_norms=info.per_example_norms,
        num_clipped=jax.lax.psum(info.num_clipped, axis_name),
        num_examples=jax.lax.psum(info.num_examples, axis_name),
        aux=info.aux)
    return g, info

  def fn(*args: Any, mask: jax.Array | None = None):
    params, rest = args[0], args[1:]
    b = jax.tree.leaves(args[batch_argnums[0]])[0].shape[0]
    if b % n_dev:
      raise ValueError(f"the batch size ({b}) must be a multiple of the number of devices "
                       f"({n_dev}) on mesh axis {axis_name!r}.")
    if mask is None:
      mask = jax.numpy.ones((b,), jax.numpy.float32)
    in_specs = (P(), batch_spec) + tuple(
        batch_spec if (i + 1) in batch_argnums else P() for i in range(len(rest)))
    out_info_spec = ClippedGradInfo(loss_sum=P(), per_example_norms=batch_spec, num_clipped=P(),
                                    num_examples=P(), aux=batch_spec)
    mapped = jax.shard_map(local, mesh=mesh, in_specs=in_specs,
                           out_specs=(P(), out_info_spec), check_vma=False)
    return mapped(params, mask, *rest)

  return ClippedGradFn(fn, grad_fn.sensitivity, grad_fn.l2_clip_norm, grad_fn.per_layer,
                       grad_fn.microbatch_size, batch_argnums)


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Places a pytree fully replicated on ``mesh``."""
  return jax.device_put(tree, NamedSharding(mesh, P()))
