"""Benchmark: multi-host DP-SGD (``jax.distributed``), steps/s and scaling efficiency.

The device-resident ``make_private`` path (Poisson batch sampled, gathered,
clipped and noised inside one jitted step; clipped sums ``psum``-reduced over
the mesh axis ``"data"``) on the MLP 784-512-512-10, expected batch 256,
N = 60,000 synthetic MNIST-shaped examples, clip 1, sigma 1, SGD, in two
layouts with the same total device count:

* ``1x2``: one process with 2 simulated CPU devices;
* ``2x1``: two processes with 1 device each (``jax.distributed`` on 127.0.0.1,
  collectives over gloo), data loaded with :func:`.multihost.process_rows` /
  :func:`.multihost.global_dataset`, process 0 paying the accountant.

Scaling efficiency = (steps/s of ``2x1``) / (steps/s of ``1x2``): 1 means the
processes cost nothing over devices of one process; the gap is the price of
the cross-process collectives (gloo over TCP on CPU) and of the per-step
payment broadcast. Each step pays on the accountant first (``sampler.sample()``),
as in a training loop.

On a machine with 2 CPU cores the 2 devices share those cores in both layouts
(two processes also run two XLA thread pools on them), so the numbers measure
the overhead of the process boundary, not a speed-up. Timing: each launch of a
layout runs ``rounds`` rounds of ``steps`` steps after 2 warm-up (compile)
steps, the layouts are launched ``repeats`` times in alternation (so both see
the same machine load), and the fastest round of a layout counts (process 0's
clock, after ``block_until_ready``). Default: 2 x 3 rounds of 20 steps;
``--quick``: 1 x 2 rounds of 5 steps. The LAST printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

N = 60_000
BATCH = 256.0
FEATURES = 784
WARMUP = 2


def _worker(args: argparse.Namespace) -> None:
  """One process of a layout: train ``WARMUP + rounds * steps`` steps, save the round times."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from jaxdp import models  # pylint: disable=g-import-not-at-top
  from jaxdp.accounting.accountant import PrivacyAccountant  # pylint: disable=g-import-not-at-top
  from jaxdp.dpsgd import make_private, multihost  # pylint: disable=g-import-not-at-top

  multihost.initialize(args.coordinator, num_processes=args.num_processes,
                       process_id=args.process_id)
  mesh = multihost.global_mesh()
  lo, hi = multihost.process_rows(N, mesh)
  rng = np.random.default_rng(args.process_id)  # timing does not depend on the values
  x = rng.standard_normal((hi - lo, FEATURES), dtype=np.float32)
  y = rng.integers(0, 10, hi - lo).astype(np.int32)
  data = multihost.global_dataset((x, y), num_examples=N, mesh=mesh)
  model = models.MLP(hidden_sizes=(512, 512), num_classes=10)
  params = model.init(jax.random.key(1), x[:1])["params"]

  def loss(p, xi, yi):
    logits = model.apply({"params": p}, xi[None])[0]
    return optax.softmax_cross_entropy_with_integer_labels(logits, yi)

  total = WARMUP + args.rounds * args.steps
  private = make_private(loss, l2_clip_norm=1.0, num_examples=N, expected_batch_size=BATCH,
                         noise_multiplier=1.0, delta=1e-5, steps=total, key=jax.random.key(0),
                         learning_rate=0.1)
  sampler = private.sampler(PrivacyAccountant(), data=data, mesh=mesh)
  state = private.init(params)
  start = time.perf_counter()
  for _ in range(WARMUP):
    params, state, _ = private.step(params, state, sampler.sample())
  jax.block_until_ready(params)
  compile_s = time.perf_counter() - start
  rounds = []
  for _ in range(args.rounds):
    start = time.perf_counter()
    for _ in range(args.steps):
      params, state, _ = private.step(params, state, sampler.sample())
    jax.block_until_ready(params)
    rounds.append(time.perf_counter() - start)
  np.savez(args.out, rounds=np.asarray(rounds), compile_s=compile_s)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="2 rounds of 5 steps")
  parser.add_argument("--steps", type=int, default=None, help="steps per round (default 20)")
  parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3)")
  parser.add_argument("--repeats", type=int, default=None,
                      help="launches of each layout, alternating (default 2; 1 with --quick)")
  parser.add_argument("--timeout", type=float, default=900.0, help="seconds per layout")
  # Set by the launcher in the worker processes.
  parser.add_argument("--coordinator")
  parser.add_argument("--num-processes", type=int)
  parser.add_argument("--process-id", type=int)
  parser.add_argument("--out")
  args = parser.parse_args()
  args.steps = args.steps or (5 if args.quick else 20)
  args.rounds = args.rounds or (2 if args.quick else 3)
  args.repeats = args.repeats or (1 if args.quick else 2)
  if args.coordinator is not None:
    _worker(args)
    return

  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests/dpsgd"))
  import _multihost_launch  # pylint: disable=g-import-not-at-top
  results = {"benchmark": "dpsgd_multihost", "model": "mlp 784-512-512-10",
             "num_examples": N, "expected_batch_size": BATCH, "steps_per_round": args.steps,
             "rounds": args.rounds, "repeats": args.repeats, "cpu_cores": os.cpu_count(),
             "layouts": {}}
  layouts = {"1x2": (1, 2), "2x1": (2, 1)}
  rounds = {name: [] for name in layouts}
  compile_s = {name: [] for name in layouts}
  # The layouts alternate (1x2, 2x1, 1x2, ...) so that both see the same machine load.
  for _ in range(args.repeats):
    for name, (procs, devices) in layouts.items():
      out = _multihost_launch.launch(
          __file__, num_processes=procs, devices_per_process=devices,
          args=["--steps", str(args.steps), "--rounds", str(args.rounds)], timeout=args.timeout)
      rounds[name] += [float(r) for r in out[0].out["rounds"]]
      compile_s[name].append(float(out[0].out["compile_s"]))
      print(f"{name}: rounds {np.round(out[0].out['rounds'], 3).tolist()} s of {args.steps} "
            f"steps, warm-up {compile_s[name][-1]:.1f} s", flush=True)
  for name, (procs, devices) in layouts.items():
    results["layouts"][name] = {
        "processes": procs, "devices_per_process": devices,
        "steps_per_s": args.steps / min(rounds[name]), "round_s": rounds[name],
        "warmup_compile_s": compile_s[name]}
  timed = results["layouts"]
  results["scaling_efficiency"] = timed["2x1"]["steps_per_s"] / timed["1x2"]["steps_per_s"]
  print(json.dumps(results))


if __name__ == "__main__":
  main()
