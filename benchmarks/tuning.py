"""Benchmark: private hyper-parameter tuning (repeat-and-select, jaxdp issue 41).

1. Time of ``repeat_and_select`` with the K runs as ONE ``jax.vmap`` call
   (``vectorize=True``) vs a Python loop over the runs, for a small private
   mechanism (a linear model scored by a Laplace-noised validation accuracy).
2. Epsilon of tuning over a grid of C candidates at an equal per-run mechanism
   (DP-SGD-like Poisson-sampled Gaussian run + Laplace score): repeat-and-select
   with a random K of mean C (RDP, Papernot & Steinke 2022 Thms 2 and 6) vs
   running all C candidates and releasing them (composition of C runs, RDP),
   and the pure-DP version (Laplace runs: Liu-Talwar 3 eps vs C eps).
3. Accuracy at equal total epsilon on digits (linear softmax model, model
   sensitivity, paper 000's protocol of ``experiments/tradeoffs.py``): the
   hyper-parameter (lambda) chosen (a) by repeat-and-select (private), (b) by
   basic composition over the C x V candidates (private), (c) by the argmax of
   held-out accuracies, not accounted (NOT private). ``--quick``: 2 epsilons,
   2 lambdas, 3 seeds.

Prints a line per measurement and, as its last line, one JSON object.

  python benchmarks/tuning.py [--quick]
"""

import argparse
import importlib.util
import json
import pathlib
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import tuning
from jaxdp.accounting import PrivacyAccountant, dpsgd_event, events


def _mechanism_factory(x_val, y_val, event):
  def mechanism(key, candidate):
    k_w, k_s = jax.random.split(key)
    w = candidate["scale"] * jax.random.normal(k_w, (x_val.shape[1], 2))  # a "trained" model
    correct = jnp.sum(jnp.argmax(x_val @ w, axis=1) == y_val).astype(jnp.float32)
    score = (correct + 2.0 * jax.random.laplace(k_s, ())) / x_val.shape[0]
    return w, score, event
  return mechanism


def _time_calls(fn, keys, warmup_keys):
  for k in warmup_keys:  # compile every padded size K lands in (powers of two)
    fn(k)
  start = time.perf_counter()
  for k in keys:
    fn(k)
  return (time.perf_counter() - start) / len(keys)


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true", help="fewer calls and settings")
  args = parser.parse_args()
  calls = 10 if args.quick else 50
  rng = np.random.default_rng(0)
  x_val = jnp.asarray(rng.normal(size=(512, 32)).astype(np.float32))
  y_val = jnp.asarray((rng.normal(size=512) > 0).astype(np.int32))
  event = events.LaplaceDpEvent(2.0, neighbouring="replace_one")
  mech = _mechanism_factory(x_val, y_val, event)
  candidates = [{"scale": s} for s in (0.1, 0.3, 1.0, 3.0)]
  figures = {"calls": calls}
  for mean in ((16.0,) if args.quick else (4.0, 16.0, 64.0)):
    law = tuning.GeometricRepetitions(mean)
    keys = jax.random.split(jax.random.key(1), calls)
    warm = jax.random.split(jax.random.key(2), 40)
    t_loop = _time_calls(lambda k: tuning.repeat_and_select(
        k, mech, candidates, repetitions=law, event=event), keys, warm[:3])
    t_vec = _time_calls(lambda k: tuning.repeat_and_select(
        k, mech, candidates, repetitions=law, event=event, vectorize=True), keys, warm)
    print(f"mean K = {mean:g}: loop {t_loop * 1e3:.1f} ms, vmapped {t_vec * 1e3:.1f} ms per "
          f"tuning ({t_loop / t_vec:.1f}x)")
    figures[f"mean{mean:g}_loop_seconds"] = t_loop
    figures[f"mean{mean:g}_vmapped_seconds"] = t_vec
    figures[f"mean{mean:g}_speedup"] = t_loop / t_vec

  delta = 1e-5
  run = events.ComposedDpEvent([dpsgd_event(1.0, 256 / 60_000, 2000),
                                events.LaplaceDpEvent(2.0, neighbouring="add_remove")])
  pure_run = events.PureDpEvent(0.5, neighbouring="add_remove")
  for grid in ((8, 64) if args.quick else (4, 8, 16, 64, 256)):
    single = PrivacyAccountant()
    single.spend(run)
    composed = PrivacyAccountant()
    composed.spend(run, grid)
    row = {"one_run": single.get_epsilon(delta, "rdp"),
           "composition": composed.get_epsilon(delta, "rdp")}
    for name, law in (("geometric", tuning.GeometricRepetitions(float(grid))),
                      ("logarithmic", tuning.LogarithmicRepetitions(float(grid))),
                      ("poisson", tuning.PoissonRepetitions(float(grid)))):
      acc = PrivacyAccountant()
      acc.spend(law.event(run))
      row[name] = acc.get_epsilon(delta, "rdp")
    lt = PrivacyAccountant()
    lt.spend(tuning.GeometricRepetitions(float(grid)).event(pure_run))
    row["pure_geometric"] = lt.get_epsilon(0.0, "pure")
    row["pure_composition"] = grid * 0.5
    print(f"C = {grid}: eps at delta={delta}: one run {row['one_run']:.3f}, all C composed "
          f"{row['composition']:.3f}, repeat-and-select (E[K] = C) geometric "
          f"{row['geometric']:.3f}, logarithmic {row['logarithmic']:.3f}, Poisson "
          f"{row['poisson']:.3f}; pure eps_run=0.5: {row['pure_geometric']:.2f} vs "
          f"{row['pure_composition']:.1f}")
    figures[f"grid{grid}"] = row
  figures["accuracy_digits"] = accuracy_table(args.quick)
  print(json.dumps(figures))


_ROOT = pathlib.Path(__file__).resolve().parents[1]
SELECTIONS = {"repeat_and_select": "a", "composition": "b", "none": "c"}


def _load(relative: str, name: str):
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, _ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  return sys.modules[name]


def accuracy_table(quick: bool) -> dict:
  """Test accuracy (mean, s.d. over seeds) of (a)/(b)/(c) selection at equal total epsilon."""
  experiment = _load("experiments/tradeoffs.py", "tradeoffs")
  configs = _load("configs/tradeoffs.py", "tradeoffs_config")
  table: dict = {"dataset": "digits", "method": "model_sensitivity", "delta": 0.0}
  with tempfile.TemporaryDirectory() as out:
    for selection, letter in SELECTIONS.items():
      config = configs.get_config("fig1")
      config.methods = ("model_sensitivity",)
      config.deltas = (0.0,)
      config.axis_values = (3.0, 30.0) if quick else (1.0, 3.0, 10.0, 30.0)
      config.num_seeds = 3 if quick else 10
      if quick:
        config.l2_regs = (1e-2, 1e-1)
      config.selection = selection
      config.out_dir = out
      start = time.perf_counter()
      rows = experiment.main(config)
      table[f"{letter}_{selection}_seconds"] = time.perf_counter() - start
      for r in rows:
        table[f"{letter}_{selection}_eps{r['epsilon']:g}"] = [r["test_accuracy_mean"],
                                                               r["test_accuracy_std"]]
  table["num_seeds"] = 3 if quick else 10
  for eps in ((3.0, 30.0) if quick else (1.0, 3.0, 10.0, 30.0)):
    cells = [table[f"{letter}_{sel}_eps{eps:g}"][0] for sel, letter in SELECTIONS.items()]
    print(f"digits, eps = {eps:g} (delta = 0): (a) repeat-and-select {cells[0]:.3f}, (b) basic "
          f"composition {cells[1]:.3f}, (c) not accounted (not private) {cells[2]:.3f}")
  return table


if __name__ == "__main__":
  main()
