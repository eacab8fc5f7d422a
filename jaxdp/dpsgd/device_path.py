"""The device-resident execution of a private plan: sample, gather, clip, noise and update in one jit.

``plan.sampler(accountant, data=(x, y), mesh=None)`` places the dataset on the
device(s) once (sharded over a 1-D ``"data"`` mesh, possibly spanning
several processes, :mod:`.multihost`); each paid step then hands out only its
sampling key (:class:`~.batches.DeviceBatch`), and :func:`step` draws the
batch where the rows live and updates in ONE jit-compiled call, with the same
batches as the host path for the same key (:mod:`.device_sampling`). Every
selection and clip rule of the host path has its device form here: Poisson
batches, cyclic Poisson groups (computed once where the rows live; step t
samples group ``t mod b``, t the noise state's step count), fixed-size and
user-level batches (the sampler's own device path), and an adaptive clip norm
(flat or per-layer, with any selection) read from the state. The clipped sums of the devices are ``psum``-reduced and
the noise is added ONCE to the total (the sensitivity of the clipped sum does
not depend on which device computes which part of it).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp.dpsgd import (_inputs, adaptive_clipping, device_sampling, host_path, multihost,
                         user_sampling)
from jaxdp.dpsgd.plan_state import PrivateState


class _DevicePath(NamedTuple):
  data: tuple
  update: Callable[..., Any]
  replicated: Any  # NamedSharding for params/state on the mesh, or None
  host_labels: Any  # this process's labels, for the first step's range check


def _local_rows(a: jax.Array) -> np.ndarray:
  """This process's rows of a global array sharded along its leading axis (host copy)."""
  shards = sorted(a.addressable_shards, key=lambda sh: sh.index[0].start or 0)
  seen, parts = set(), []
  for sh in shards:
    start = sh.index[0].start or 0
    if start not in seen:
      seen.add(start)
      parts.append(np.asarray(sh.data))
  return np.concatenate(parts)


def build(plan: Any, data: Any, mesh: Any) -> _DevicePath:
  """Checks and places ``data``; builds the jitted sample-and-update (:meth:`.PrivateSGD._device_path`).

  Every sampler and clipper of the host path: with ``noise_strategy`` the
  batch of step t is the cyclic Poisson batch of
  :class:`~.correlated.CyclicPoissonSampler` (Poisson bits of the step key
  AND group ``t mod b`` of :func:`~.correlated.participation.cyclic_groups`,
  computed once where the rows live; t is the noise state's step count,
  which :meth:`.PrivateSGD.step` checks equals the batch's paid step); with an
  adaptive ``l2_clip_norm`` the gradients are clipped in units of the state's
  C_t and the centred unclipped count goes with the sum to the noise, as in
  the host update (:mod:`.host_path`).
  """
  arrays = tuple(data) if isinstance(data, (tuple, list)) else (data,)
  names, label = plan._data_names(arrays, "data needs", "data[{}]")  # pylint: disable=protected-access
  local = _checked_local_rows(plan, arrays, names, mesh)
  if mesh is not None:
    if device_sampling.DATA_AXIS not in mesh.axis_names or len(mesh.axis_names) != 1:
      raise ValueError(f"mesh must be 1-D with axis {device_sampling.DATA_AXIS!r}, got "
                       f"{mesh.axis_names}.")
    shards = mesh.shape[device_sampling.DATA_AXIS]
  else:
    shards = 1
  # Chunk size P: the binomial bound at the batch's rate (p / b for cyclic Poisson).
  padded = (plan.padded_size if mesh is None else device_sampling.local_padded_size(
      plan.num_examples, plan.sample_rate / plan.min_separation, shards,
      plan._physical_batch_size, plan._overflow_prob))  # pylint: disable=protected-access
  placed, clipped_sum, checked = _placed_and_clipped_sum(plan, arrays, mesh, padded)
  update_with = _jitted_update(plan, clipped_sum, _cyclic_groups(plan, mesh))

  def update(params, opt_state, key_data, arrays):
    # (user-level sampling: ``arrays`` are the shapes step() checked; the data is ``placed``)
    return update_with(params, opt_state, key_data, placed if checked is not None else arrays)

  replicated = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  host_labels = None if label is None else local[label]
  return _DevicePath(placed if checked is None else checked, update, replicated, host_labels)


def _checked_local_rows(plan: Any, arrays: tuple, names: tuple, mesh: Any) -> tuple:
  """This process's rows of ``arrays`` (all of them for host or addressable arrays), checked."""
  leaves = jax.tree.leaves(arrays)
  if all(not isinstance(a, jax.Array) or a.is_fully_addressable for a in leaves):
    _inputs.check_examples(arrays, names, plan.num_examples)
    return arrays
  if mesh is None:
    raise ValueError("global (multi-process) data arrays need the mesh they are sharded over.")
  if isinstance(plan.batch_selection, user_sampling.UserPoissonSampler):
    raise ValueError("batch_selection=UserPoissonSampler with data= lays the data out "
                     "user-major on the host: pass the N-row host arrays (and a mesh), not "
                     "global arrays.")
  local = tuple(jax.tree.map(_local_rows, a) for a in arrays)
  _inputs.check_examples(local, names, int(jax.tree.leaves(local[0])[0].shape[0]))
  return local


def _placed_and_clipped_sum(plan: Any, arrays: tuple, mesh: Any, padded: int) -> tuple:
  """``(placed data, clipped_sum(params, key, arrays, ...), shapes step() checks or None)``."""
  selection = plan.batch_selection
  make_grad_fn = _adaptive_grad_fn(plan) if plan.adaptive_clip_norm is not None else None
  grad_fn = plan.clipped_grad_fn if make_grad_fn is None else None
  checked = None  # what step()'s model check sees, when not the placed arrays
  if selection is not None:
    # Fixed-size subsets / Poisson users, sampled in jit by the sampler's own device path:
    # the batches of its host sample() for the same key; an adaptive clip norm enters each
    # call as clip_norm= (make_grad_fn).
    placed = selection.place_data(arrays, mesh)
    clipped_sum = selection.device_clipped_sum_fn(grad_fn, mesh=mesh,
                                                  overflow_prob=plan._overflow_prob,  # pylint: disable=protected-access
                                                  make_grad_fn=make_grad_fn)
    if isinstance(selection, user_sampling.UserPoissonSampler):
      # The placed data is user-major (U, K, ...) plus the example mask; step() probes the
      # loss on the example layout, so it gets the N-row shapes and update uses the placed.
      checked = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), _inputs._dtype_of(a)),  # pylint: disable=protected-access
                             arrays)
    return placed, clipped_sum, checked
  placed = device_sampling.place_data(arrays, plan.num_examples, mesh)
  clipped_sum = device_sampling.clipped_sum_fn(
      grad_fn, num_examples=plan.num_examples, sample_rate=plan.sample_rate,
      padded_size=padded, mesh=mesh, make_grad_fn=make_grad_fn)
  return placed, clipped_sum, checked


def _adaptive_grad_fn(plan: Any) -> Callable[[Any], Any]:
  """``clip -> clipped-gradient function`` of an adaptive plan (:func:`.host_path.adaptive_grad_fn`).

  Per-layer, the clip norm crosses the sampler's ``shard_map`` as ONE (G,)
  vector (the leaves of the state's C_t^l, in ``jax.tree.leaves`` order,
  rebuilt here into the params' structure: one group per leaf), and the
  per-group clipped counts come back as the ``num_clipped`` statistic, a
  ``(1 + G,)`` vector ``[examples clipped, clipped per group]`` summed (and
  ``psum``-reduced) like the scalar it replaces; :func:`_jitted_update`
  splits it.
  """
  users = isinstance(plan.batch_selection, user_sampling.UserPoissonSampler)
  make = host_path.adaptive_grad_fn(plan.per_example_loss, plan.clipped_grad_fn,
                                    batch_argnums=plan.batch_argnums, users=users)
  if not getattr(plan.clipped_grad_fn, "per_layer", False):
    return make

  def make_per_layer(clip_vector):
    def grad_fn(params, masked):
      leaves = [clip_vector[i] for i in range(len(jax.tree.leaves(params)))]
      g, info = make(jax.tree.unflatten(jax.tree.structure(params), leaves))(params, masked)
      counts = jnp.concatenate([jnp.reshape(info.num_clipped, (1,)),
                                info.num_clipped_per_group])
      return g, dataclasses.replace(info, num_clipped=counts)
    return grad_fn

  return make_per_layer


def _cyclic_groups(plan: Any, mesh: Any) -> Any:
  """The cyclic Poisson group of every row, computed where the rows live (None: no groups)."""
  b = plan.min_separation
  if plan.noise_strategy is None or b <= 1:
    return None
  from jaxdp.dpsgd.correlated import participation  # pylint: disable=g-import-not-at-top
  group_key = plan._participation.group_key  # pylint: disable=protected-access
  group_data = np.asarray(jax.random.key_data(group_key))
  group_impl = jax.random.key_impl(group_key)
  return device_sampling.computed_rows(
      lambda rows: participation.cyclic_groups(
          jax.random.wrap_key_data(jnp.asarray(group_data), impl=group_impl), rows, b),
      plan.num_examples, mesh)


def _jitted_update(plan: Any, clipped_sum: Callable[..., Any], groups: Any) -> Callable[..., Any]:
  """``(params, opt_state, key_data, arrays) -> (params, opt_state, StepInfo)``, one jit."""
  tx, b = plan.optimizer, plan.min_separation
  adaptive = plan.adaptive_clip_norm is not None
  per_layer = adaptive and getattr(plan.clipped_grad_fn, "per_layer", False)
  impl = jax.random.key_impl(plan._sample_key)  # pylint: disable=protected-access
  # As the host update: a correlated-noise plan donates its state (the noise history).
  donate = (1,) if plan.noise_strategy is not None and plan.noise_strategy.state_size else ()

  @functools.partial(jax.jit, donate_argnums=donate)
  def update_with(params, opt_state, key_data, arrays, groups):
    step_key = jax.random.wrap_key_data(key_data, impl=impl)
    row_mask = None
    if groups is not None:  # step t samples group t mod b (t: the state's step count)
      row_mask = groups == (opt_state[0].count % b).astype(groups.dtype)
    clip = adaptive_clipping.current_clip_norm(opt_state) if adaptive else None
    extra = {} if row_mask is None else {"row_mask": row_mask}
    if adaptive:  # per-layer: the (G,) vector of the C_t^l (_adaptive_grad_fn)
      extra["clip_norm"] = (jnp.stack(jax.tree.leaves(clip)) if per_layer else clip)
    gsum, (loss, num, clipped) = clipped_sum(params, step_key, arrays, **extra)
    groups = None
    if per_layer:  # [examples clipped, clipped per group] (_adaptive_grad_fn)
      clipped, groups = clipped[0], clipped[1:]
    return host_path.noisy_update(tx, params, opt_state, gsum, loss, num, clipped, clip, groups)

  return lambda params, opt_state, key_data, arrays: update_with(
      params, opt_state, key_data, arrays, groups)


def step(plan: Any, params: Any, state: PrivateState, batch: Any, kept: str) -> tuple:
  """The update of a paid :class:`~.batches.DeviceBatch`: ``(params, opt_state, info)``.

  Checks the model on the placed data's shapes and, at the first step, this
  process's labels against the model's classes (``kept``: what a refusal
  says about the paid batch); params and state are replicated over the mesh.
  """
  sampler = batch._ticket._sampler  # pylint: disable=protected-access
  dev = sampler._device  # pylint: disable=protected-access
  label = plan._label_position()  # pylint: disable=protected-access
  classes = plan._check_model(params, dev.data, kept)  # pylint: disable=protected-access
  if label is not None and dev.host_labels is not None:
    _inputs.check_labels(dev.host_labels, f"data[{label}] (labels)", classes, kept)
    sampler._device = dev._replace(host_labels=None)  # pylint: disable=protected-access
  opt_state = state.opt_state
  if dev.replicated is not None:  # one process: jax.device_put; several: global arrays
    params, opt_state = multihost.replicate((params, opt_state), dev.replicated.mesh)
  return dev.update(params, opt_state, batch._step_key_data, dev.data)  # pylint: disable=protected-access


__all__ = ["build", "step"]
