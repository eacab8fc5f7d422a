"""Benchmark: audit trials per second, vmapped vs a Python loop.

Measures (compilation excluded; every timed call gets fresh keys):
* the Laplace mechanism (eps = 1): trials/s of the audit's vmapped, jitted
  trial function vs a Python loop over a jitted single-trial function, and
  one end-to-end ``audit_epsilon`` with its epsilon lower bound;
* one full loss-perturbation fit (paper 000 Alg. 4) on a tiny problem (N = 4,
  D = 2, C = 2): ``loss_perturbation`` called once with a batch of keys (one
  vmapped L-BFGS) vs called once per key in a Python loop.

Usage: python benchmarks/audit.py [--quick]. The last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import jax

from jaxdp import audit
from jaxdp import mechanisms
from jaxdp.training import objective_perturbation as op


def _time(fn, repeats: int) -> float:
  """Best wall-clock seconds of ``fn(i)`` over ``repeats`` calls (i = call index)."""
  best = float("inf")
  for i in range(repeats):
    start = time.perf_counter()
    fn(i)
    best = min(best, time.perf_counter() - start)
  return best


def bench_laplace(batch: int, loop_trials: int, audit_trials: int) -> dict:
  pair = audit.scalar_query_pair(1.0)
  mech = lambda k, d: mechanisms.laplace_mechanism(k, d, 1.0, 1.0)
  trial_fn = audit.make_trial_fn(mech)
  base = jax.random.key(0)
  trial_fn(jax.random.split(base, batch), pair.dataset).block_until_ready()  # compile
  t_vmap = _time(lambda i: trial_fn(jax.random.split(jax.random.fold_in(base, i + 1), batch),
                                    pair.dataset).block_until_ready(), 3)
  single = jax.jit(mech)
  single(base, pair.dataset).block_until_ready()  # compile

  def loop(i):
    keys = jax.random.split(jax.random.fold_in(base, 100 + i), loop_trials)
    out = [float(single(k, pair.dataset)) for k in keys]
    return out

  t_loop = _time(loop, 2)
  report = audit.audit_epsilon(mech, pair.dataset, pair.neighbour, key=jax.random.key(1),
                               num_trials=audit_trials, batch_size=batch, claimed_epsilon=1.0,
                               progress=False)
  return {
      "vmapped_trials_per_s": batch / t_vmap,
      "loop_trials_per_s": loop_trials / t_loop,
      "speedup": (batch / t_vmap) / (loop_trials / t_loop),
      "audit_trials_per_dataset": audit_trials,
      "audit_seconds": report.seconds,
      "audit_epsilon_lower_bound": report.epsilon_lower_bound,
  }


def bench_loss_perturbation(batch: int, loop_fits: int) -> dict:
  pair = audit.flipped_label_pair(4, 2, num_classes=2)
  x, y = pair.dataset
  kw = dict(num_classes=2, epsilon=1.0, neighbouring="replace_one", tol=1e-3, max_iter=1000)
  base = jax.random.key(2)
  op.loss_perturbation(jax.random.split(base, batch), x, y, **kw).weights.block_until_ready()
  t_vmap = _time(lambda i: op.loss_perturbation(
      jax.random.split(jax.random.fold_in(base, i + 1), batch), x, y, **kw
  ).weights.block_until_ready(), 3)
  op.loss_perturbation(base, x, y, **kw).weights.block_until_ready()  # compile single fit

  def loop(i):
    keys = jax.random.split(jax.random.fold_in(base, 100 + i), loop_fits)
    return [op.loss_perturbation(k, x, y, **kw).weights.block_until_ready() for k in keys]

  t_loop = _time(loop, 2)
  return {
      "vmapped_fits_per_s": batch / t_vmap,
      "loop_fits_per_s": loop_fits / t_loop,
      "speedup": (batch / t_vmap) / (loop_fits / t_loop),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller sizes (about a minute)")
  args = parser.parse_args()
  if args.quick:
    lap = bench_laplace(batch=100_000, loop_trials=500, audit_trials=200_000)
    lp = bench_loss_perturbation(batch=1_000, loop_fits=30)
  else:
    lap = bench_laplace(batch=500_000, loop_trials=3_000, audit_trials=1_000_000)
    lp = bench_loss_perturbation(batch=5_000, loop_fits=200)
  print(f"device: {jax.devices()[0].platform}, backend devices: {jax.device_count()}")
  print(f"Laplace mechanism: vmapped {lap['vmapped_trials_per_s']:,.0f} trials/s, "
        f"Python loop {lap['loop_trials_per_s']:,.0f} trials/s -> {lap['speedup']:,.0f}x")
  print(f"  audit_epsilon with {lap['audit_trials_per_dataset']:,} trials per dataset: "
        f"{lap['audit_seconds']:.2f} s, epsilon lower bound {lap['audit_epsilon_lower_bound']:.4f} (claim 1)")
  print(f"Loss-perturbation fit (N=4, D=2, C=2): vmapped {lp['vmapped_fits_per_s']:,.0f} fits/s, "
        f"Python loop {lp['loop_fits_per_s']:,.1f} fits/s -> {lp['speedup']:,.0f}x")
  print(json.dumps({"benchmark": "audit", "quick": bool(args.quick),
                    "device": jax.devices()[0].platform,
                    "laplace": lap, "loss_perturbation": lp}))


if __name__ == "__main__":
  main()
