"""Multi-host DP-SGD: one training run over the devices of several processes.

With ``jax.distributed`` every process of a job sees ALL the devices of the job
(``jax.devices()``) and addresses its own (``jax.local_devices()``). A mesh
over all of them turns the data-parallel DP-SGD step of :func:`.make_private`
into multi-host DP-SGD: every process runs the same program, the clipped
gradient sums of the devices are ``psum``-reduced over the mesh axis
``"data"`` (across processes too), and the Gaussian noise is drawn ONCE from
the replicated noise key, so every process holds the same noised update.
Nothing in the privacy analysis changes: the clipped SUM over the Poisson
batch has the same L2 sensitivity whichever device computes which part of it
(paper ``000_tradeoffs_of_private_prediction.md`` Section 3.1, Equation 4),
and the global batch is a Poisson sample of the whole dataset, the same as in
a single process for the same key.

This module holds the pieces around the step:

* :func:`initialize` -- start ``jax.distributed`` (one call per process, first thing);
* :func:`global_mesh` -- the 1-D mesh ``"data"`` over the devices of all processes;
* :func:`process_rows` -- the rows ``[lo, hi)`` of the dataset this process loads;
* :func:`global_dataset` -- the global, padded, ``P("data")``-sharded arrays built
  from every process's rows (``jax.make_array_from_process_local_data``);
* :func:`is_coordinator` / :func:`broadcast_from_coordinator` -- process 0 alone
  pays the privacy accountant (a ledger, a budget file) and tells the others
  the outcome, so a job of k processes pays T steps, not k T.

Layout of the global dataset. With N examples and D devices on the mesh axis
``"data"``, the global arrays have ``N_pad = D * ceil(N / D)`` rows
(:func:`padded_num_examples`), ``N_pad / D`` consecutive rows per device in
the device order of the mesh; the rows ``n >= N`` are zeros and are never
sampled. Process p holds the contiguous rows of its devices and loads the real
ones among them, ``process_rows(N, mesh)``.

Launching (every process runs the same script; only the process id differs):

* CPU, for tests on one machine: k processes, each with
  ``JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4``
  and ``initialize("127.0.0.1:PORT", num_processes=k, process_id=i)``
  (collectives over gloo, which :func:`initialize` selects).
* GPU nodes, one process per node driving all its GPUs:
  ``initialize("node0:PORT", num_processes=num_nodes, process_id=node_rank)``.
  One process per GPU: ``num_processes = num_nodes * gpus_per_node``,
  ``process_id = global rank`` and ``local_device_ids=[local_rank]`` (or
  ``CUDA_VISIBLE_DEVICES=local_rank``). Under SLURM or Open MPI,
  ``initialize()`` without arguments reads all of this from the environment.
* TPU pod slice: the same script on every host (for instance
  ``gcloud compute tpus tpu-vm ssh NAME --worker=all --command="python train.py"``),
  one process per host, ``initialize()`` without arguments.

Every process must pass the same hyper-parameters and the same ``key`` to
:func:`.make_private`: the noise key is replicated, and a process with another
key would add other noise than the one its peers and the accountant assume.
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdp import _validation
from jaxdp.errors import ArgumentTypeError
from jaxdp.dpsgd import device_sampling

PyTree = Any


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *,
               local_device_ids: int | Sequence[int] | None = None,
               cpu_collectives: str | None = "gloo", **kwargs: Any) -> None:
  """Starts ``jax.distributed`` for this process; call it once, before any other JAX call.

  A thin wrapper of ``jax.distributed.initialize`` (see the module docstring for
  how to launch on CPU, GPU nodes and TPU pod slices). Without arguments JAX
  detects the cluster (TPU pod slices, SLURM, Open MPI).

  Args:
    coordinator_address: ``"host:port"`` of process 0, reachable by every process.
    num_processes: number of processes of the job.
    process_id: this process's index in ``[0, num_processes)``; process 0 is the
      coordinator (:func:`is_coordinator`).
    local_device_ids: the local devices this process drives (one process per GPU:
      ``[local_rank]``); default all.
    cpu_collectives: implementation of the CPU backend's cross-process
      collectives (``jax_cpu_collectives_implementation``), set before JAX
      starts; ``"gloo"`` by default, ``None`` leaves the setting alone. It only
      concerns the CPU backend (GPU and TPU collectives are unaffected).
    **kwargs: passed to ``jax.distributed.initialize`` (``initialization_timeout``...).

  Raises:
    ValueError: an argument out of range or malformed (named), before anything starts.
    TypeError: ``process_id`` not an integer.
  """
  if coordinator_address is not None and (
      not isinstance(coordinator_address, str) or coordinator_address.rpartition(":")[0] == ""
      or not coordinator_address.rpartition(":")[2].isdigit()):
    raise ValueError(f"coordinator_address must be a 'host:port' string, got "
                     f"{coordinator_address!r}.")
  if num_processes is not None:
    num_processes = _validation.check_positive_int(num_processes, "num_processes")
  if process_id is not None:
    if isinstance(process_id, (bool, np.bool_)) or not isinstance(process_id, (int, np.integer)):
      raise ArgumentTypeError(f"process_id must be an integer, got {process_id!r}.")
    process_id = int(process_id)
    if process_id < 0 or (num_processes is not None and process_id >= num_processes):
      raise ValueError(f"process_id must be in [0, num_processes={num_processes}), got "
                       f"{process_id}.")
  if cpu_collectives is not None:
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id, local_device_ids=local_device_ids, **kwargs)


def global_mesh(axis_name: str = "data") -> Mesh:
  """The 1-D mesh ``axis_name`` over ``jax.devices()`` (all processes), grouped by process.

  The devices of each process are consecutive on the mesh (ordered by process
  index, then in ``jax.devices()`` order), so each process holds one contiguous
  block of the global dataset. With one process it is the mesh over the local devices.
  """
  devices = sorted(jax.devices(), key=lambda d: d.process_index)  # stable: keeps JAX's order
  return Mesh(np.asarray(devices), (axis_name,))


def _check_mesh(mesh: Any, axis_name: str | None) -> Mesh:
  if not isinstance(mesh, Mesh):
    raise ArgumentTypeError(f"mesh must be a jax.sharding.Mesh (global_mesh()), got "
                            f"{type(mesh).__name__}.")
  if axis_name is not None and axis_name not in mesh.axis_names:
    raise ValueError(f"mesh has no axis {axis_name!r} (its axes: {mesh.axis_names}); build it "
                     f"with global_mesh().")
  return mesh


def padded_num_examples(num_examples: int, mesh: Mesh, axis_name: str = "data") -> int:
  """``N_pad = D * ceil(N / D)``: rows of the global dataset, D devices on ``axis_name``.

  The rule the device-resident step samples by (:func:`.device_sampling.padded_num_rows`).
  """
  _validation.check_positive_int(num_examples, "num_examples")
  shards = _check_mesh(mesh, axis_name).shape[axis_name]
  return device_sampling.padded_num_rows(num_examples, shards)


def _process_block(num_examples: int, mesh: Mesh, axis_name: str) -> tuple[int, int, int]:
  """(start, stop, N_pad): the global rows (padding included) of this process's devices."""
  n_pad = padded_num_examples(num_examples, mesh, axis_name)
  sharding = NamedSharding(mesh, P(axis_name))
  slices = sorted({s[0].indices(n_pad)[:2]
                   for s in sharding.addressable_devices_indices_map((n_pad,)).values()})
  if not slices:
    raise ValueError(f"mesh holds none of the devices of process {jax.process_index()}; build it "
                     "with global_mesh().")
  for (_, stop), (start, _) in zip(slices[:-1], slices[1:]):
    if start != stop:
      raise ValueError(f"mesh: the devices of process {jax.process_index()} are not consecutive "
                       f"along axis {axis_name!r}, so its rows are not one block; build the mesh "
                       "with global_mesh().")
  return slices[0][0], slices[-1][1], n_pad


def process_rows(num_examples: int, mesh: Mesh | None = None,
                 axis_name: str = "data") -> tuple[int, int]:
  """The rows ``[lo, hi)`` of the dataset (``0 <= lo <= hi <= N``) this process must load.

  The slices of all processes partition ``[0, N)`` (a process whose devices hold
  only padding gets ``lo == hi``). Pass ``(x[lo:hi], y[lo:hi])`` to
  :func:`global_dataset`.

  Args:
    num_examples: N, the number of examples of the whole dataset.
    mesh: the training mesh (default :func:`global_mesh`).
    axis_name: the mesh axis the dataset is split over.
  """
  mesh = global_mesh(axis_name) if mesh is None else mesh
  start, stop, _ = _process_block(num_examples, mesh, axis_name)
  n = int(num_examples)
  return min(start, n), min(stop, n)


def _local_data(arrays: PyTree, num_examples: Any, mesh: Mesh,
                axis_name: str) -> tuple[list, Any, int, int, int, int]:
  """Checks this process's arrays; returns (leaves, treedef, lo, hi, block rows, N_pad)."""
  start, stop, n_pad = _process_block(num_examples, mesh, axis_name)
  n = int(num_examples)
  lo, hi = min(start, n), min(stop, n)
  leaves, treedef = jax.tree.flatten(arrays)
  if not leaves:
    raise ValueError("arrays must hold at least one array (for instance (x, y)).")
  names = ["arrays" + jax.tree_util.keystr(path)
           for path, _ in jax.tree_util.tree_flatten_with_path(arrays)[0]]
  out = []
  for name, leaf in zip(names, leaves):
    arr = _validation.check_numeric_array(leaf, name)
    if arr.ndim == 0:
      raise ValueError(f"{name} must have the examples on its first axis, got a scalar.")
    out.append(arr)
  rows = {a.shape[0] for a in out}
  if len(rows) > 1:
    raise ValueError("arrays have different numbers of rows: " + ", ".join(
        f"{name}: {a.shape[0]}" for name, a in zip(names, out)) + ".")
  if rows != {hi - lo}:
    raise ValueError(f"arrays have {rows.pop()} rows, but process {jax.process_index()} must "
                     f"provide rows [{lo}, {hi}) of the {n} examples, {hi - lo} rows "
                     "(process_rows(num_examples, mesh)).")
  return out, treedef, lo, hi, stop - start, n_pad


def global_dataset(arrays: PyTree, num_examples: int, mesh: Mesh | None = None,
                   axis_name: str = "data") -> PyTree:
  """Global ``jax.Array`` s of the whole dataset from every process's rows, padded and sharded.

  Every process calls it with its own rows ``[lo, hi) = process_rows(N, mesh)``
  of each array (same structure, dtypes and shapes after the first axis on
  every process). Each array becomes a global array of ``N_pad`` rows
  (:func:`padded_num_examples`) sharded ``P(axis_name)`` over ``mesh``, the rows
  ``n >= N`` zero-filled, built with ``jax.make_array_from_process_local_data``.
  With one process, pass the whole data.

  The inputs are checked on every process and the outcome is shared before
  anything is built, so a refusal raises on EVERY process (no process is left
  waiting in a collective for a peer that raised).

  Args:
    arrays: a pytree of arrays (e.g. ``(x_local, y_local)``), examples on the first axis.
    num_examples: N, the number of examples of the whole dataset.
    mesh: the training mesh (default :func:`global_mesh`).
    axis_name: the mesh axis the dataset is split over.

  Returns:
    The same pytree of global arrays, each of shape ``(N_pad,) + shape[1:]``.

  Raises:
    ValueError: ``num_examples`` not a positive integer, ``mesh`` without the
      axis, ``arrays`` with the wrong number of local rows (arrays of different
      lengths), or arrays whose structure, dtypes or trailing shapes differ
      between processes.
    TypeError: ``mesh`` not a ``Mesh``, or an array that is not numeric data.
  """
  error, local = None, None
  try:
    mesh = global_mesh(axis_name) if mesh is None else _check_mesh(mesh, axis_name)
    local = _local_data(arrays, num_examples, mesh, axis_name)
  except (TypeError, ValueError) as err:
    error = err
  if jax.process_count() > 1:
    described = "" if local is None else repr(
        (str(local[1]), [(a.shape[1:], a.dtype.str) for a in local[0]]))
    status = np.asarray([error is not None, zlib.crc32(described.encode()) & 0x7FFFFFFF], np.int32)
    everyone = np.asarray(multihost_utils.process_allgather(status))
    if error is None:
      failed = [int(p) for p in np.flatnonzero(everyone[:, 0])]
      if failed:
        error = ValueError(f"arrays were refused by process(es) {failed} (see their errors); "
                           "nothing was built.")
      elif len(set(everyone[:, 1].tolist())) > 1:
        error = ValueError("arrays differ between processes in structure, dtypes or shapes "
                           "after the first axis; every process must pass the same kind of arrays.")
  if error is not None:
    raise error
  leaves, treedef, lo, hi, block, n_pad = local
  sharding = NamedSharding(mesh, P(axis_name))
  out = []
  for arr in leaves:
    if block != hi - lo:
      padded = np.zeros((block,) + arr.shape[1:], arr.dtype)
      padded[:hi - lo] = arr
      arr = padded
    out.append(jax.make_array_from_process_local_data(sharding, arr, (n_pad,) + arr.shape[1:]))
  return jax.tree.unflatten(treedef, out)


def replicate(tree: PyTree, mesh: Mesh) -> PyTree:
  """``tree`` placed fully replicated (``P()``) on ``mesh``, with one or several processes.

  ``jax.device_put`` cannot place host or single-device values on a mesh that
  spans other processes' devices; here such leaves become global arrays with
  ``multihost_utils.host_local_array_to_global_array`` (each process gives its
  copy, which must be the same on every process: params, optimiser state,
  the noise key). Leaves that already are global arrays are resharded with
  ``jax.device_put``. With one process it is ``jax.device_put``.
  """
  sharding = NamedSharding(_check_mesh(mesh, None), P())
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)

  def place(leaf):
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      return jax.device_put(leaf, sharding)
    if not isinstance(leaf, (jax.Array, np.ndarray)):
      leaf = jax.numpy.asarray(leaf)  # Python scalars: the dtype jax.device_put gives them
    return multihost_utils.host_local_array_to_global_array(leaf, mesh, P())

  return jax.tree.map(place, tree)


def is_coordinator() -> bool:
  """True in process 0, the one that pays the accountant and writes files."""
  return jax.process_index() == 0


def broadcast_from_coordinator(value: PyTree) -> PyTree:
  """Process 0's ``value`` on every process (``multihost_utils.broadcast_one_to_all``).

  Every process must call it with a pytree of the same structure, dtypes and
  shapes (the values of the other processes are ignored). Leaves are sent as
  their bytes, so the result is bit-exact whatever ``jax_enable_x64`` says (a
  float64 epsilon stays float64). Python ``bool`` / ``int`` / ``float`` leaves
  come back as the same Python type, other leaves as numpy arrays.
  """
  leaves, treedef = jax.tree.flatten(value)
  arrays = []
  for i, leaf in enumerate(leaves):
    arr = np.asarray(leaf)
    if _validation._kind(arr.dtype) not in "biufc":  # pylint: disable=protected-access
      raise ArgumentTypeError(f"value: leaf {i} must be a number or a numeric array, got "
                              f"{type(leaf).__name__} of dtype {arr.dtype}.")
    arrays.append(arr)
  if jax.process_count() > 1:
    sent = multihost_utils.broadcast_one_to_all(
        [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays])
    arrays = [np.asarray(b, np.uint8).view(a.dtype).reshape(a.shape) for a, b in zip(arrays, sent)]
  out = [type(leaf)(a.item()) if isinstance(leaf, (bool, int, float)) else a
         for leaf, a in zip(leaves, arrays)]
  return jax.tree.unflatten(treedef, out)
