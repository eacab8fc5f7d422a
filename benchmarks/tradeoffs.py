"""Paper 000 Figure 1 wall time, and what batching the noise draws buys, measured in one run.

1. **Figure 1 end to end**: ``experiments/tradeoffs.py`` with
   ``configs/tradeoffs.py:fig1`` on MNIST (all five methods, delta in {0, 1e-5},
   B = 100, hyper-parameters chosen on a held-out split, ``--draws`` noise draws
   per point), written to a temporary folder (nothing resumed): total wall
   time and seconds per method (goal in issue 17: under 10 minutes on two CPU
   cores for 100 draws on the full MNIST).
2. **Batched vs one call per draw**, on the same data, for the two methods that
   solve one problem per draw:

   * DP-SGD: ``M`` runs of :func:`jaxdp.dpsgd.linear_dpsgd` in one call
     vs the library's general Flax loop (:func:`jaxdp.dpsgd.train_dpsgd`,
     ``LinearClassifier``, same epochs, batch size, clip, learning rate) run
     ``--loop-draws`` times and extrapolated to ``M`` (labelled);
   * loss perturbation: ``M`` keys in one ``loss_perturbation`` call vs
     ``--loop-draws`` single-key calls, extrapolated to ``M``.

3. **Linear DP-SGD vs Opacus** (the strongest outside baseline), same model (softmax
   linear, no bias), data, Poisson sampling, clip, noise multiplier, steps, heavy-ball SGD:
   one Opacus 1.x run per grad-sample mode (``hooks``, ``ghost`` clipping) in its own venv
   (``--torch-python`` or ``$JAXDP_OPACUS_PYTHON``, default
   ``/work/opacus-venv/bin/python``; torch never enters jaxdp's environment) vs one
   :func:`~jaxdp.dpsgd.linear_dpsgd` run (warm; given the noise multiplier, as
   Opacus is; also timed with its epsilon-to-noise calibration) and the per-run time of
   ``M`` runs in one call; test accuracies side by side as a check that both train the
   same model.

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
import os
import pathlib
import subprocess
import tempfile
import time

import jax
import numpy as np
import optax

from jaxdp import data as jdata
from jaxdp import models
from jaxdp import dpsgd
from jaxdp.training import objective_perturbation

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


_OPACUS_LINEAR = """
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np, torch, torch.nn as nn
import opacus
from opacus import PrivacyEngine
folder, z, clip, batch, steps, lr, mom, threads, device = sys.argv[1:10]
torch.set_num_threads(int(threads)); torch.manual_seed(0); device = torch.device(device)
def sync():
  if device.type == "cuda":
    torch.cuda.synchronize()
x = torch.from_numpy(np.load(folder + "/x.npy")); y = torch.from_numpy(np.load(folder + "/y.npy"))
xt = torch.from_numpy(np.load(folder + "/xt.npy")); yt = np.load(folder + "/yt.npy")
n = len(y); batch, steps = float(batch), int(steps)
out = {"torch": torch.__version__, "opacus": opacus.__version__}
for mode in ("hooks", "ghost"):
  model = nn.Linear(x.shape[1], 10, bias=False).to(device); nn.init.zeros_(model.weight)
  loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                       batch_size=int(round(batch)))
  opt = torch.optim.SGD(model.parameters(), lr=float(lr), momentum=float(mom))
  made = PrivacyEngine().make_private(
      module=model, optimizer=opt, data_loader=loader, criterion=nn.CrossEntropyLoss(),
      noise_multiplier=float(z), max_grad_norm=float(clip), poisson_sampling=True,
      grad_sample_mode=mode)
  if len(made) == 4:  # ghost clipping wraps the criterion
    m, o, crit, dl = made
  else:
    (m, o, dl), crit = made, nn.CrossEntropyLoss()
  sync(); done, t0 = 0, time.perf_counter()
  while done < steps:
    for xb, yb in dl:  # batches are drawn on the host and moved, as a user's loop does
      xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
      o.zero_grad(); loss = crit(m(xb), yb); loss.backward(); o.step(); done += 1
      if done == steps:
        break
  sync(); secs = time.perf_counter() - t0
  with torch.no_grad():
    acc = float((m(xt.to(device)).argmax(1).cpu().numpy() == yt).mean())
  out[mode] = {"seconds": secs, "test_accuracy": acc}
print(json.dumps(out))
"""


def opacus_linear(args) -> dict:
  """Section 3 of the module docstring."""
  ds = jdata.load("mnist", data_dir=args.data_dir, unit_ball="project",
                  n_train=10_000 if args.quick else None)
  x, y = np.asarray(ds.x_train, np.float32), np.asarray(ds.y_train)
  xt, yt = np.asarray(ds.x_test, np.float32), np.asarray(ds.y_test)
  kw = dict(epochs=3.0, expected_batch_size=200.0 if args.quick else 1000.0, l2_clip_norm=0.5,
            learning_rate=1.0, momentum=0.9)
  calibrated = lambda k: dpsgd.linear_dpsgd(k, x, y, num_classes=10, epsilon=1.0, delta=1e-5,
                                            **kw)
  jax.block_until_ready(calibrated(jax.random.key(0)).weights)
  res, t_calibrated = _timed(lambda: calibrated(jax.random.key(1)))
  # Opacus gets the noise multiplier (no calibration search); so does jaxdp here.
  run = lambda ks: dpsgd.linear_dpsgd(ks, x, y, num_classes=10, delta=1e-5,
                                      noise_multiplier=res.noise_multiplier, **kw)
  jax.block_until_ready(run(jax.random.key(2)).weights)
  res, t_one = _timed(lambda: run(jax.random.key(3)))
  m = args.draws
  keys = jax.random.split(jax.random.key(4), m)
  run(keys)
  batch_res, t_batch = _timed(lambda: run(keys))
  acc = float(np.mean(np.argmax(xt @ np.asarray(res.weights), 1) == yt))
  out = dict(linear_dpsgd_single_run_seconds=round(t_one, 3),
             linear_dpsgd_single_run_with_epsilon_calibration_seconds=round(t_calibrated, 3),
             linear_dpsgd_batched_per_run_seconds=round(t_batch / m, 4),
             linear_dpsgd_test_accuracy=round(acc, 4), linear_dpsgd_steps=int(res.steps),
             linear_dpsgd_noise_multiplier=round(float(res.noise_multiplier), 4))
  del batch_res
  if not os.path.exists(args.torch_python):
    out["opacus_note"] = f"no Opacus venv at {args.torch_python}: comparison skipped"
    return out
  with tempfile.TemporaryDirectory() as folder:
    for name, arr in (("x", x), ("y", y.astype(np.int64)), ("xt", xt), ("yt", yt)):
      np.save(f"{folder}/{name}.npy", arr)
    proc = subprocess.run(
        [args.torch_python, "-c", _OPACUS_LINEAR, folder, repr(float(res.noise_multiplier)),
         str(kw["l2_clip_norm"]), str(kw["expected_batch_size"]), str(int(res.steps)),
         str(kw["learning_rate"]), str(kw["momentum"]), str(os.cpu_count() or 1),
         args.opacus_device],
        capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    out["opacus_note"] = "Opacus worker failed: " + proc.stderr.strip().splitlines()[-1][:300]
    return out
  op = json.loads(proc.stdout.strip().splitlines()[-1])
  best = min(("hooks", "ghost"), key=lambda k: op[k]["seconds"])
  out.update(opacus_versions=f"torch {op['torch']}, opacus {op['opacus']}",
             opacus_device=args.opacus_device,
             opacus_hooks_seconds=round(op["hooks"]["seconds"], 3),
             opacus_ghost_seconds=round(op["ghost"]["seconds"], 3),
             opacus_hooks_test_accuracy=round(op["hooks"]["test_accuracy"], 4),
             opacus_ghost_test_accuracy=round(op["ghost"]["test_accuracy"], 4),
             opacus_best_mode=best,
             opacus_best_over_linear_dpsgd_single=round(op[best]["seconds"] / t_one, 2),
             opacus_best_over_linear_dpsgd_batched_per_run=round(op[best]["seconds"] * m / t_batch,
                                                                 2))
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--draws", type=int, default=None, help="noise draws (default 100; quick 20)")
  parser.add_argument("--loop-draws", type=int, default=3, help="single calls timed per method")
  parser.add_argument("--data-dir", type=str, default=None)
  parser.add_argument("--skip-figure", action="store_true", help="skip the Figure 1 run")
  parser.add_argument("--skip-opacus", action="store_true", help="skip the Opacus comparison")
  parser.add_argument("--skip-batched", action="store_true",
                      help="skip the batched-vs-one-call-per-draw comparison")
  parser.add_argument("--opacus-device", default="cpu",
                      help="torch device of the Opacus runs ('cuda' on a GPU machine)")
  parser.add_argument("--torch-python", default=os.environ.get(
      "JAXDP_OPACUS_PYTHON", "/work/opacus-venv/bin/python"))
  args = parser.parse_args()
  args.draws = args.draws or (20 if args.quick else 100)
  result = dict(quick=bool(args.quick), backend=jax.default_backend(),
                devices=len(jax.devices()))
  if not args.skip_batched:
    result.update(batched_vs_loop(args))
  print(json.dumps(result))
  if not args.skip_opacus:
    result.update(opacus_linear(args))
    print(json.dumps(result))
  if not args.skip_figure:
    result.update(figure1(args))
  print(json.dumps(result))


if __name__ == "__main__":
  main()
