"""Cost of each DP-SGD plan cell over the bare clipped step it wraps.

For one model and batch, every cell below is a ``make_private`` plan run as a
user runs it, with device-resident data (``sampler(acc, data=(x, y))``:
Poisson or cyclic-Poisson sampling, gather, clipping, noise and update in one
jitted call). Each is timed against the BARE step: the plan's jitted clipped
gradient and optimiser update on a batch already on the device, of the plan's
static size P (no sampling, no noise). Cells:

* ``independent``: DP-SGD (Poisson, fixed clip norm, i.i.d. Gaussian noise);
* ``bandmf``: BandMF with 4 bands over cyclic Poisson groups (b = 4);
* ``adaptive``: DP-SGD with an adaptive clip norm (Andrew et al. 2021);
* ``bandmf_adaptive``: both.

The ratios ``<cell>_over_bare`` and ``<cell>_over_independent`` come from one
run on one machine (min over rounds). On a GPU the default is paper 000
Fig. 7's ResNet-20 (GroupNorm) at batch 600 on 50,000 CIFAR-shaped rows; on a
CPU an MLP and a small CNN. ``--quick``: fewer rounds. The last line printed
is one JSON object.

Usage::

  python benchmarks/plan_cells.py --quick
  python benchmarks/plan_cells.py --model resnet20 --batch 600 --num-examples 50000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dpsgd as dpsgd_benchmark  # benchmarks/dpsgd.py: the same models and synthetic data
from jaxdp.accounting import PrivacyAccountant
from jaxdp.dpsgd import AdaptiveClipNorm, make_private
from jaxdp.dpsgd.correlated import BandMF

CLIP, SIGMA, LR = dpsgd_benchmark.CLIP, dpsgd_benchmark.SIGMA, dpsgd_benchmark.LR
BANDS = 4
CELLS = ("independent", "bandmf", "adaptive", "bandmf_adaptive")


def _plan(cell: str, loss, num_examples: int, batch: int, steps: int, method: str):
  kw = dict(l2_clip_norm=CLIP, num_examples=num_examples, expected_batch_size=batch,
            noise_multiplier=SIGMA, delta=1e-5, steps=steps, key=jax.random.key(3),
            learning_rate=LR, clipping_method=method)
  if cell.startswith("bandmf"):
    kw.update(noise_strategy=BandMF(0.5 ** np.arange(BANDS)), min_separation=BANDS)
  if cell.endswith("adaptive"):
    kw.update(l2_clip_norm=AdaptiveClipNorm(initial=CLIP))
  return make_private(loss, **kw)


def time_cells(name: str, batch: int, num_examples: int, rounds: int, reps: int,
               method: str) -> dict:
  """``{cell}_ms`` and ``bare_ms`` (min over rounds of the mean of ``reps`` calls)."""
  x, y, params, loss = dpsgd_benchmark.synthetic_problem(name, num_examples)
  steps = BANDS * (rounds * reps + 2 * reps + 4)
  plans = {cell: _plan(cell, loss, num_examples, batch, steps, method) for cell in CELLS}
  base = plans["independent"]
  grad_fn, tx = base.clipped_grad_fn, optax.sgd(LR)

  @jax.jit
  def bare(p, s, xb, yb, mask):
    g, _ = grad_fn(p, xb, yb, mask=mask)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  rows = base.padded_size
  bare_args = (params, tx.init(params), jnp.asarray(x[:rows]), jnp.asarray(y[:rows]),
               jnp.ones((rows,), bool))
  fns = {"bare": lambda: bare(*bare_args)[0]}
  for cell, plan in plans.items():
    sampler = plan.sampler(PrivacyAccountant(), data=(x, y))
    holder = {"params": params, "state": plan.init(params)}

    def one_step(plan=plan, sampler=sampler, holder=holder):
      holder["params"], holder["state"], _ = plan.step(holder["params"], holder["state"],
                                                       sampler.sample())
      return holder["params"]
    fns[cell] = one_step
  for fn in fns.values():  # compile and warm up
    jax.block_until_ready(fn())
    jax.block_until_ready(fn())
  times = {k: [] for k in fns}
  for _ in range(rounds):
    for k, fn in fns.items():
      t0 = time.perf_counter()
      for _ in range(reps):
        out = fn()
      jax.block_until_ready(out)
      times[k].append((time.perf_counter() - t0) / reps)
  best = {k: float(np.min(v)) for k, v in times.items()}
  out = {"model": name, "batch": batch, "num_examples": num_examples, "padded_size": rows,
         "clipping_method": method, **{f"{k}_ms": 1e3 * t for k, t in best.items()}}
  for cell in CELLS:
    out[f"{cell}_over_bare"] = best[cell] / best["bare"]
    out[f"{cell}_over_independent"] = best[cell] / best["independent"]
  return out


def main(argv: list[str]) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--model", action="append", default=None,
                      help="mlp, cnn or resnet20 (repeatable; default resnet20 on a GPU, else "
                           "mlp and cnn)")
  parser.add_argument("--batch", type=int, default=None, help="default 600 on a GPU, else 256")
  parser.add_argument("--num-examples", type=int, default=None,
                      help="default 50,000 on a GPU, else 20,000")
  parser.add_argument("--method", default="auto", help="clipping_method of every plan")
  args = parser.parse_args(argv)
  gpu = jax.default_backend() == "gpu"
  names = args.model or (["resnet20"] if gpu else ["mlp", "cnn"])
  for name in names:
    if name not in ("mlp", "cnn", "resnet20"):
      parser.error(f"--model must be mlp, cnn or resnet20, got {name!r}.")
  batch = args.batch or (600 if gpu else 256)
  n = args.num_examples or (50_000 if gpu else 20_000)
  rounds, reps = (3, 3) if args.quick else (10, 10)
  results = {"backend": jax.default_backend(),
             "device": str(jax.devices()[0].device_kind), "cells": {}}
  for name in names:
    r = time_cells(name, batch, n, rounds, reps, args.method)
    results["cells"][name] = r
    print(f"[{name} batch {batch} P={r['padded_size']} on {results['device']}] bare "
          f"{r['bare_ms']:.2f} ms; " + "; ".join(
              f"{c} {r[c + '_ms']:.2f} ms (x{r[c + '_over_bare']:.3f} bare, "
              f"x{r[c + '_over_independent']:.3f} DP-SGD)" for c in CELLS))
  results["load_avg_1min_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
  print(json.dumps(results))
  return results


if __name__ == "__main__":
  main(sys.argv[1:])
