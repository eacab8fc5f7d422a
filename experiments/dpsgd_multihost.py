"""Multi-host, resumable DP-SGD: one make_private run over the devices of several processes.

Every process runs this same script; each loads only its own rows of the data, the Poisson
batch is sampled on the devices that hold the rows, the clipped sums are reduced over all
devices of all processes, the noise is added once, and process 0 alone pays each step on the
durable privacy budget. With ``--checkpoint_dir`` a killed job started again with the same
command continues from its newest checkpoint (same batches, same noise, each step paid once).

Launch, on one machine (CPU, two processes with two simulated devices each)::

  for i in 0 1; do
    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
    python experiments/dpsgd_multihost.py --coordinator_address=127.0.0.1:29517 \\
        --num_processes=2 --process_id=$i &
  done; wait

On a GPU node: one process per GPU with ``--local_device=<local rank>`` (or one process for
all GPUs of the node); on a TPU pod slice: the same command on every host WITHOUT the three
flags (``jax.distributed`` reads the slice's topology). One process: run it without flags.

Data: scikit-learn's embedded ``digits`` (1,797 images of 8 x 8), an MLP, (epsilon, delta) =
(``--epsilon``, 1e-5). Writes ``<out_dir>/result.json`` (process 0): final test accuracy,
epsilon, the steps the budget holds, and the number of processes and devices.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys


def parse(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--coordinator_address", default=None)
  parser.add_argument("--num_processes", type=int, default=None)
  parser.add_argument("--process_id", type=int, default=None)
  parser.add_argument("--local_device", type=int, default=None,
                      help="one process per GPU: this process's local GPU index")
  parser.add_argument("--epsilon", type=float, default=4.0)
  parser.add_argument("--epochs", type=float, default=10.0)
  parser.add_argument("--batch", type=float, default=128.0, help="expected batch size q N")
  parser.add_argument("--checkpoint_dir", default="",
                      help="resumable run: Orbax checkpoints and the durable ledger of steps paid")
  parser.add_argument("--out_dir", default="results/dpsgd_multihost")
  parser.add_argument("--seed", type=int, default=0)
  return parser.parse_args(argv)


def main(argv=None) -> dict:
  args = parse(argv)
  import jax  # pylint: disable=import-outside-toplevel
  from jaxdp.dpsgd import multihost  # pylint: disable=import-outside-toplevel
  if args.coordinator_address or args.num_processes:
    multihost.initialize(args.coordinator_address, args.num_processes, args.process_id,
                         local_device_ids=None if args.local_device is None
                         else [args.local_device])
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
  from jaxdp import data as jdata, models  # pylint: disable=import-outside-toplevel
  from jaxdp.accounting import PrivacyBudget  # pylint: disable=import-outside-toplevel
  from jaxdp.dpsgd import make_per_example_loss, make_private  # pylint: disable=import-outside-toplevel

  out = pathlib.Path(args.out_dir).absolute()
  ds = jdata.load("digits")
  n = len(ds.y_train)
  mesh = multihost.global_mesh()
  lo, hi = multihost.process_rows(num_examples=n, mesh=mesh)  # the rows THIS process loads
  data = multihost.global_dataset((ds.x_train[lo:hi], ds.y_train[lo:hi]), num_examples=n,
                                  mesh=mesh)
  model = models.MLP(hidden_sizes=(64,))
  params = jax.jit(model.init)(jax.random.key(args.seed), ds.x_train[:1])["params"]
  loss = make_per_example_loss(lambda p, xb: model.apply({"params": p}, xb))
  private = make_private(
      loss, l2_clip_norm=1.0, num_examples=n, expected_batch_size=args.batch,
      target_epsilon=args.epsilon, delta=1e-5, epochs=args.epochs,
      optimizer=optax.adam(2e-3), key=jax.random.key(args.seed + 1),
      checkpoint_dir=args.checkpoint_dir or None)
  # The budget file is written by process 0 only; a resumed run reopens it.
  budget_path = (pathlib.Path(args.checkpoint_dir).absolute() / "budget.json"
                 if args.checkpoint_dir else None)
  budget = PrivacyBudget(args.epsilon * (1 + 1e-9), 1e-5, method="rdp", path=budget_path)
  params, state = (private.restore(params, data=data) if args.checkpoint_dir
                   else (params, private.init(params)))
  sampler = private.sampler(budget, data=data, mesh=mesh)
  lead = jax.process_index() == 0
  bar = tqdm(total=private.steps, initial=sampler.steps_sampled, desc="DP-SGD",
             disable=not lead)
  per_epoch = max(1, round(private.steps / args.epochs))
  while sampler.steps_remaining:
    if sampler.steps_paid == sampler.steps_sampled:  # one budget check per epoch
      sampler.pay(min(per_epoch, sampler.steps_remaining))
    params, state, _ = private.step(params, state, sampler.sample())
    bar.update()
  bar.close()
  private.close()
  # Parameters are replicated: every process holds a full copy of the same model.
  host_params = jax.tree.map(
      lambda a: np.asarray(a.addressable_data(0) if isinstance(a, jax.Array) else a), params)
  logits = model.apply({"params": host_params}, jnp.asarray(ds.x_test))
  result = dict(test_accuracy=float(np.mean(np.asarray(logits).argmax(-1) == ds.y_test)),
                epsilon=sampler.epsilon(), delta=1e-5, steps=private.steps,
                steps_paid=sampler.steps_paid, noise_multiplier=private.noise_multiplier,
                processes=jax.process_count(), devices=jax.device_count())
  if lead:
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
  return result


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  main(sys.argv[1:])
