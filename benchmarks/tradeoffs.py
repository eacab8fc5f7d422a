"""Paper 000 Figure 1 wall time, and what batching the noise draws buys, measured in one run.

1. **Figure 1 end to end**: ``experiments/tradeoffs.py`` with
   ``configs/tradeoffs.py:fig1`` on MNIST (all five methods, delta in {0, 1e-5},
   B = 100, hyper-parameters chosen on a held-out split, ``--draws`` noise draws
   per point), written to a temporary folder (nothing resumed): total wall
   time and seconds per method (goal in issue 17: under 10 minutes on two CPU
   cores for 100 draws on the full MNIST).
2. **Batched vs one call per draw**, on the same data, for the two methods that
   solve one problem per draw:

   * DP-SGD: ``M`` runs of :func:`jaxdp.training.dpsgd.linear_dpsgd` in one call
     vs the library's general Flax loop (:func:`jaxdp.training.dpsgd.train_dpsgd`,
     ``LinearClassifier``, same epochs, batch size, clip, learning rate) run
     ``--loop-draws`` times and extrapolated to ``M`` (labelled);
   * loss perturbation: ``M`` keys in one ``loss_perturbation`` call vs
     ``--loop-draws`` single-key calls, extrapolated to ``M``.

``--quick``: MNIST subset (N = 10,000), epsilons {0.1, 1}, 20 draws (about two
minutes on 2 cores). Usage::

  JAXDP_DATA_DIR=/path/to/shared/data python benchmarks/tradeoffs.py [--quick]

The LAST line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import pathlib
import tempfile
import time

import jax
import numpy as np
import optax

from jaxdp import data as jdata
from jaxdp import models
from jaxdp.training import dpsgd, objective_perturbation

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(rel):
  spec = importlib.util.spec_from_file_location(rel.replace("/", "_")[:-3], ROOT / rel)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _timed(fn):
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - t0


def figure1(args):
  experiment = _load("experiments/tradeoffs.py")
  config = _load("configs/tradeoffs.py").get_config("fig1")
  config.dataset = "mnist"
  config.data_dir = args.data_dir or ""
  config.num_seeds = args.draws
  if args.quick:
    config.n_train = 10_000
    config.axis_values = (0.1, 1.0)
  with tempfile.TemporaryDirectory() as tmp:
    config.out_dir = tmp
    t0 = time.perf_counter()
    rows = experiment.main(config)
    total = time.perf_counter() - t0
  per_method = collections.defaultdict(float)
  for r in rows:
    per_method[r["method"]] += r["seconds"]
  return dict(figure1_seconds=round(total, 1), figure1_points=len(rows),
              figure1_draws=int(args.draws), figure1_n_train=int(rows[0]["n_train"]),
              figure1_epsilons=list(config.axis_values) or "preset",
              figure1_seconds_per_method={k: round(v, 1) for k, v in per_method.items()})


def batched_vs_loop(args):
  ds = jdata.load("mnist", data_dir=args.data_dir, unit_ball="project",
                  n_train=10_000 if args.quick else None)
  x, y = np.asarray(ds.x_train), np.asarray(ds.y_train)
  m, k = args.draws, args.loop_draws
  keys = jax.random.split(jax.random.key(0), m)
  kw = dict(epochs=3.0, expected_batch_size=1000.0 if not args.quick else 200.0)
  out = {}
  # DP-SGD: compile once for each path, then time.
  run = lambda ks: dpsgd.linear_dpsgd(ks, x, y, num_classes=10, epsilon=1.0, delta=1e-5,
                                      l2_clip_norm=0.5, learning_rate=1.0, momentum=0.9,
                                      **kw).weights
  run(keys[:m])
  _, t_batched = _timed(lambda: run(keys))
  model = models.LinearClassifier()

  def flax_run(i):
    res = dpsgd.train_dpsgd(model, x, y, key=jax.random.fold_in(jax.random.key(1), i),
                            epochs=kw["epochs"], delta=1e-5,
                            expected_batch_size=kw["expected_batch_size"], target_epsilon=1.0,
                            l2_clip_norm=0.5, optimizer=optax.sgd(1.0, momentum=0.9))
    return res.params
  flax_run(k)  # compile (a key of its own)
  t_loop = sum(_timed(lambda i=i: flax_run(i))[1] for i in range(k))
  out.update(dpsgd_batched_seconds=round(t_batched, 3),
             dpsgd_train_dpsgd_seconds_extrapolated=round(t_loop / k * m, 3),
             dpsgd_speedup=round(t_loop / k * m / t_batched, 2))
  # Loss perturbation: one call with M keys vs single-key calls.
  lp = lambda ks: objective_perturbation.loss_perturbation(
      ks, x, y, num_classes=10, l2_reg=1e-3, epsilon=1.0, delta=0.0, tol=1e-7).weights
  lp(keys[:m])
  _, t_lp = _timed(lambda: lp(keys))
  lp(keys[0])
  t_lp_loop = sum(_timed(lambda i=i: lp(keys[i]))[1] for i in range(k))
  out.update(loss_perturbation_batched_seconds=round(t_lp, 3),
             loss_perturbation_single_calls_seconds_extrapolated=round(t_lp_loop / k * m, 3),
             loss_perturbation_speedup=round(t_lp_loop / k * m / t_lp, 2))
  out["batched_vs_loop_draws"] = m
  out["batched_vs_loop_n_train"] = int(len(y))
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--draws", type=int, default=None, help="noise draws (default 100; quick 20)")
  parser.add_argument("--loop-draws", type=int, default=3, help="single calls timed per method")
  parser.add_argument("--data-dir", type=str, default=None)
  parser.add_argument("--skip-figure", action="store_true", help="only the batched-vs-loop part")
  args = parser.parse_args()
  args.draws = args.draws or (20 if args.quick else 100)
  result = dict(quick=bool(args.quick), backend=jax.default_backend(),
                devices=len(jax.devices()))
  result.update(batched_vs_loop(args))
  print(json.dumps(result))
  if not args.skip_figure:
    result.update(figure1(args))
  print(json.dumps(result))


if __name__ == "__main__":
  main()
