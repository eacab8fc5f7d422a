"""Multiparty learning (paper 001): batched local fits vs a loop, and the Figure 3 sweep time.

Paper 001 = ``../shared/papers/001_learning_privately_from_multiparty_data.md``, Sec. 6.2
(KDD Cup 99, parties of 22 samples, lambda = 1e-4, d = 119 here).

1. **Local fits.** ``M`` local logistic regressions in ONE call of
   :func:`jaxdp.multiparty.fit_local_classifiers` (``lax.map`` on CPU,
   ``vmap``, both timed; compile time reported apart) vs a Python loop of
   :func:`jaxdp.training.linear.fit_linear` calls (one compiled shape, so the
   loop pays dispatch + per-call validation only). The loop is timed on
   ``loop_parties`` parties and extrapolated linearly to ``M`` (labelled).
2. **Figure 3 sweep.** Wall time of :func:`experiments.multiparty.run_point`
   (split, local fits, votes, the soft / vote minimisers, certified averaging,
   batch, indiv, and ``num_draws`` noisy releases x 8 values of 1/eps for the
   three private methods, all evaluated) for each ``M``.

``--quick`` (1-2 minutes on 2 CPU cores): ``M = 2,000`` for part 1 (loop on
100 parties), the sweep for ``M = 5,000`` only with 20 draws. Default: ``M =
20,000`` (loop on 500) and the sweep for ``M`` in {5K, 10K, 20K} with 100 draws.
Needs ``$JAXDP_DATA_DIR``. The LAST printed line is one JSON object.

Usage: python benchmarks/multiparty.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import time

import jax
import numpy as np

from jaxdp import data as jdata
from jaxdp import multiparty as mp
from jaxdp.results_io import strict_json
from jaxdp.training import linear

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _experiment():
  spec = importlib.util.spec_from_file_location("_mp_experiment", ROOT / "experiments" / "multiparty.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  cspec = importlib.util.spec_from_file_location("_mp_config", ROOT / "configs" / "multiparty_kdd.py")
  cmod = importlib.util.module_from_spec(cspec)
  cspec.loader.exec_module(cmod)
  return mod, cmod.get_config()


def local_fits(ds, m, loop_parties, lam=1e-4, n=22):
  sp = mp.split_parties(0, ds.x_train, ds.y_train, num_parties=m, samples_per_party=n,
                        num_aux=1000)
  # Compile once on the same shapes (timed apart), then time the batched call, in both modes.
  modes = {}
  for mode in ("map", "vmap"):
    t0 = time.perf_counter()
    jax.block_until_ready(mp.fit_local_classifiers(sp.xs, sp.ys, l2_reg=lam,
                                                   batch_mode=mode).weights)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    loc = mp.fit_local_classifiers(sp.xs, sp.ys, l2_reg=lam, batch_mode=mode)
    jax.block_until_ready(loc.weights)
    modes[mode] = (time.perf_counter() - t0, first)
  best = min(modes, key=lambda k: modes[k][0])
  batched, first = modes[best]
  loc = mp.fit_local_classifiers(sp.xs, sp.ys, l2_reg=lam, batch_mode=best)
  jax.block_until_ready(linear.fit_linear(sp.xs[0], sp.ys[0], l2_reg=lam, loss="logistic").weights)
  t0 = time.perf_counter()
  ws = []
  for i in range(loop_parties):
    ws.append(linear.fit_linear(sp.xs[i], sp.ys[i], l2_reg=lam, loss="logistic").weights)
  jax.block_until_ready(ws)
  loop = (time.perf_counter() - t0) * m / loop_parties
  diff = float(np.max(np.abs(np.stack(ws) - np.asarray(loc.weights[:loop_parties]))))
  return dict(num_parties=m, batched_seconds=batched, batched_first_call_seconds=first,
              best_batch_mode=best, map_seconds=modes["map"][0], vmap_seconds=modes["vmap"][0],
              loop_seconds_extrapolated=loop, loop_parties_timed=loop_parties,
              loop_over_batched=loop / batched, max_abs_weight_diff=diff,
              converged_fraction=float(np.mean(loc.info.converged)),
              backend=jax.default_backend())


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  ds = jdata.load_kddcup99()
  m_fit, loop_n = (2000, 100) if args.quick else (20000, 500)
  fits = local_fits(ds, m_fit, loop_n)
  print(f"[local fits, M={m_fit}, n=22, D={ds.x_train.shape[1]}] one call: lax.map "
        f"{fits['map_seconds']:.2f}s, vmap {fits['vmap_seconds']:.2f}s; best "
        f"{fits['batched_seconds']:.2f}s (first call incl. compile {fits['batched_first_call_seconds']:.2f}s); "
        f"loop {fits['loop_seconds_extrapolated']:.1f}s (extrapolated from {loop_n} parties); "
        f"loop/batched {fits['loop_over_batched']:.1f}x; max |diff| {fits['max_abs_weight_diff']:.1e}")
  exp, config = _experiment()
  config.num_draws = 20 if args.quick else 100
  config.eval_test_size = 50000
  data = exp.load_data(config)
  sweep = []
  for m in ((5000,) if args.quick else (5000, 10000, 20000)):
    t0 = time.perf_counter()
    rows = exp.run_point(config, data, m, 1e-4, 0, jax.random.key(m))
    secs = time.perf_counter() - t0
    r0 = rows[0]
    sweep.append(dict(num_parties=m, seconds=secs, **{k: r0[k] for k in r0 if k.endswith("_s")},
                      soft_acc_inv_eps_0=next(r["acc_mean"] for r in rows
                                              if r["method"] == "soft" and r["inv_epsilon"] == 0)))
    print(f"[Figure 3 point M={m}, {config.num_draws} draws x {len(config.inv_epsilons)} 1/eps] "
          f"{secs:.1f}s (local fits {r0['local_fits_s']:.1f}s, global fits "
          f"{r0['global_fits_s']:.1f}s, private sweep {r0['private_sweep_s']:.1f}s)")
  total = sum(s["seconds"] for s in sweep)
  print(f"[Figure 3 sweep] total {total:.1f}s")
  print(json.dumps(strict_json(dict(benchmark="multiparty", quick=args.quick,
                                    backend=jax.default_backend(), local_fits=fits,
                                    figure3_sweep=sweep, figure3_total_seconds=total))))


if __name__ == "__main__":
  main()
