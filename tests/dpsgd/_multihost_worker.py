"""One process of the multi-host test job (``_multihost_launch.launch``; see test_multihost.py).

Checks the :mod:`jaxdp.dpsgd.multihost` pieces on a job of k
processes and, with ``--e2e``, trains with ``make_private`` on the global
mesh; writes what it saw to ``--out`` (one ``.npz`` per process). The
assertions live in the test, which compares the processes' outputs with each
other and with a single-process run.
"""

import argparse
import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxdp.accounting.accountant import PrivacyAccountant, PrivacyBudget
from jaxdp.dpsgd import make_private, multihost


def dataset(n: int) -> tuple[np.ndarray, np.ndarray]:
  """The test dataset (every process and the test build the same one)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n, 6)).astype(np.float32)
  y = ((x[:, :3].argmax(1) + (rng.random(n) < 0.2)) % 3).astype(np.int32)
  return x, y


def linear_loss(params, x, y):
  """Softmax cross-entropy of a linear model on one example."""
  return -jax.nn.log_softmax(x @ params["w"] + params["b"])[y]


def initial_params() -> dict:
  rng = np.random.default_rng(1)
  return {"w": (0.3 * rng.normal(size=(6, 3))).astype(np.float32), "b": np.zeros(3, np.float32)}


E2E = dict(l2_clip_norm=0.5, expected_batch_size=40.0, noise_multiplier=1.0, delta=1e-5,
           steps=5, learning_rate=0.5)
E2E_KEY = 3


def bandmf_plan(n: int):
  """A correlated-noise plan (BandMF, 2 bands = 2 cyclic groups) with an adaptive clip norm."""
  from jaxdp.dpsgd.adaptive_clipping import AdaptiveClipNorm  # pylint: disable=g-import-not-at-top
  from jaxdp.dpsgd.correlated import BandMF  # pylint: disable=g-import-not-at-top
  return make_private(linear_loss, num_examples=n, key=jax.random.key(E2E_KEY + 1),
                      **{**E2E, "l2_clip_norm": AdaptiveClipNorm(initial=0.3, learning_rate=0.5)},
                      noise_strategy=BandMF(np.array([1.0, 0.5])))


def _message(fn) -> str:
  try:
    fn()
  except ValueError as err:
    return f"ValueError: {err}"
  return "no error"


def infrastructure(n: int) -> dict:
  """Mesh, rows, global dataset, a cross-process psum, broadcast and refusals."""

  x, y = dataset(n)
  mesh = multihost.global_mesh()
  lo, hi = multihost.process_rows(n, mesh)
  data = multihost.global_dataset((x[lo:hi], y[lo:hi]), num_examples=n, mesh=mesh)
  gx, gy = multihost_utils.process_allgather(data, tiled=True)
  # A reduction across processes: per-device sums psum-reduced over "data".
  summed = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a.sum(0), "data"), mesh=mesh,
                                 in_specs=P("data"), out_specs=P()),
                   out_shardings=NamedSharding(mesh, P()))(data[0])
  sent = multihost.broadcast_from_coordinator(
      {"ok": jax.process_index() == 0, "eps": 1.0 / 3.0 + jax.process_index(),
       "arr": np.arange(3, dtype=np.int64) * (jax.process_index() + 7)})
  placed = multihost.replicate({"w": np.arange(3, dtype=np.float32), "key": jax.random.key(5),
                                "lr": 0.5}, mesh)
  placed = multihost.replicate(placed, mesh)  # global leaves stay as they are
  last = jax.process_count() - 1
  short = hi - (jax.process_index() == last)  # the last process drops its last row
  wrong_rows = _message(lambda: multihost.global_dataset((x[lo:short], y[lo:short]),
                                                         num_examples=n, mesh=mesh))
  wrong_dtype = _message(lambda: multihost.global_dataset(
      (x[lo:hi].astype(np.float16) if jax.process_index() == last else x[lo:hi], y[lo:hi]),
      num_examples=n, mesh=mesh))
  return {
      "process_index": jax.process_index(), "process_count": jax.process_count(),
      "num_devices": len(mesh.devices.reshape(-1)),
      "mesh_processes": np.asarray([d.process_index for d in mesh.devices.reshape(-1)]),
      "rows": np.asarray([lo, hi]), "shape": np.asarray(data[0].shape),
      "gathered_x": np.asarray(gx), "gathered_y": np.asarray(gy),
      "psum": np.asarray(summed.addressable_data(0)),
      "is_coordinator": multihost.is_coordinator(),
      "bcast_ok": sent["ok"], "bcast_ok_type": type(sent["ok"]).__name__,
      "bcast_eps": np.float64(sent["eps"]), "bcast_arr": sent["arr"],
      "replicated_w": np.asarray(placed["w"].addressable_data(0)),
      "replicated_key": np.asarray(jax.random.key_data(placed["key"]).addressable_data(0)),
      "replicated_lr": np.asarray(placed["lr"].addressable_data(0)),
      "replicated_global": all(a.sharding.is_fully_replicated and not a.is_fully_addressable
                               for a in jax.tree.leaves(placed)),
      "wrong_rows": wrong_rows, "wrong_dtype": wrong_dtype,
  }


def end_to_end(n: int, budget_path: str) -> dict:
  """make_private on the global mesh: T steps, once with a ledger, once with a durable budget.

  Every process passes its own accountant object, as the same script on every
  host would; only process 0 spends on it (the others mirror an in-memory ledger).
  """

  x, y = dataset(n)
  mesh = multihost.global_mesh()
  lo, hi = multihost.process_rows(n, mesh)
  data = multihost.global_dataset((x[lo:hi], y[lo:hi]), num_examples=n, mesh=mesh)
  out = {}
  for name, accountant in (("ledger", PrivacyAccountant()),
                           ("budget", PrivacyBudget(epsilon=50.0, delta=1e-5, path=budget_path))):
    private = make_private(linear_loss, num_examples=n, key=jax.random.key(E2E_KEY), **E2E)
    sampler = private.sampler(accountant, data=data, mesh=mesh)
    if name == "budget":
      sampler.pay(private.steps)  # one durable write (the ledger run pays step by step)
    params = initial_params()
    state = private.init(params)
    sizes = []
    for _ in range(private.steps):
      params, state, info = private.step(params, state, sampler.sample())
      sizes.append(float(np.asarray(info.nonprivate_num_examples.addressable_data(0))))
    ledger = accountant.ledger if name == "ledger" else accountant.accountant.ledger
    out[f"{name}_w"] = np.asarray(params["w"].addressable_data(0))
    out[f"{name}_b"] = np.asarray(params["b"].addressable_data(0))
    out[f"{name}_sizes"] = np.asarray(sizes)
    out[f"{name}_entries"] = len(ledger)
    out[f"{name}_count"] = sum(c for _, c in ledger)
  # Cyclic Poisson batches and an adaptive clip norm, sampled inside the step on the mesh.
  private = bandmf_plan(n)
  sampler = private.sampler(PrivacyAccountant(), data=data, mesh=mesh)
  params = initial_params()
  state = private.init(params)
  sizes = []
  for _ in range(private.steps):
    params, state, info = private.step(params, state, sampler.sample())
    sizes.append(float(np.asarray(info.nonprivate_num_examples.addressable_data(0))))
  out["bandmf_w"] = np.asarray(params["w"].addressable_data(0))
  out["bandmf_sizes"] = np.asarray(sizes)
  out["bandmf_clip"] = np.float64(private.clip_norm(state))
  stored = PrivacyBudget.load(budget_path).accountant.ledger
  out["budget_file_entries"] = len(stored)
  out["budget_file_count"] = sum(c for _, c in stored)
  # A process with another key would add noise its peers do not assume: refused on all.
  other = make_private(linear_loss, num_examples=n,
                       key=jax.random.key(E2E_KEY + jax.process_index()), **E2E)
  refused_acc = PrivacyAccountant()
  try:
    other.sampler(refused_acc, data=data, mesh=mesh)
    out["other_key_refused"] = False
  except ValueError as err:
    out["other_key_refused"] = "different plans" in str(err) and refused_acc.ledger == ()
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--coordinator", required=True)
  parser.add_argument("--num-processes", type=int, required=True)
  parser.add_argument("--process-id", type=int, required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--num-examples", type=int, default=203)
  parser.add_argument("--e2e", action="store_true")
  args = parser.parse_args()

  multihost.initialize(args.coordinator, num_processes=args.num_processes,
                       process_id=args.process_id)
  out = infrastructure(args.num_examples)
  if args.e2e:
    budget_path = os.path.join(os.path.dirname(args.out), "budget.json")
    out.update(end_to_end(args.num_examples, budget_path))
  np.savez(args.out, **out)


if __name__ == "__main__":
  main()
