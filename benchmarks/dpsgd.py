"""Benchmark: DP-SGD step time and memory, jaxdp clipping methods vs non-private SGD and Opacus.

Measured in ONE run (ratios are only meaningful within a run on a shared machine):

1. MLP 784-512-512-10 and the Opacus MNIST CNN (``jaxdp.models.SmallCNN``) at
   batch 256: a jitted non-private SGD step and a jitted DP-SGD step (clipping +
   Gaussian noise, clip 1, sigma 1, SGD) for each clipping method of
   ``clipped_grad``: ``vmap`` (materialised per-example gradients),
   ``reweight`` (vmapped norms + one reweighted backward pass), ``ghost``
   (ghost norms + book-keeping, ``jaxdp.training.dpsgd.ghost_norms``).
2. The same models, batch, clip and noise in Opacus (non-private, hook-based
   ``GradSampleModule`` + ``DPOptimizer``, and ghost clipping
   ``grad_sample_mode="ghost"``) on CPU in a separate virtual environment
   (``--torch-python`` or ``$JAXDP_OPACUS_PYTHON``, default
   ``/work/opacus-venv/bin/python``), so torch never enters jaxdp's
   environment. It runs as a persistent worker process and its timing rounds
   alternate with jaxdp's, so both see the same machine load. Skipped, with the
   reason printed, when that interpreter or Opacus is unavailable.
3. ResNet-20 (GroupNorm, type-A shortcuts) on CIFAR-10-shaped inputs (jaxdp only).
4. Peak temporary memory of the compiled private step, vmap vs ghost, at batch
   256 and 1024 (``jax.jit(...).lower(...).compile().memory_analysis()``).

Timing: minimum over interleaved rounds (each round times every step once).
Inputs are random tensors of the datasets' shapes (step time does not depend on
pixel values). The last printed line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import models
from jaxdp.training.dpsgd import clipping, transforms

CLIP = 1.0
SIGMA = 1.0
LR = 0.1
METHODS = ("vmap", "reweight", "ghost")


def _model(name: str):
  if name == "mlp":
    return models.MLP(hidden_sizes=(512, 512)), (784,)
  if name == "cnn":
    return models.SmallCNN(), (784,)
  return models.ResNet20(), (32, 32, 3)


def jax_steps(name: str, batch: int, methods=METHODS) -> dict:
  """{mode: (jitted step, args)} for the non-private step and each private method."""
  model, x_shape = _model(name)
  x = jax.random.normal(jax.random.key(0), (batch,) + x_shape)
  y = jax.random.randint(jax.random.key(1), (batch,), 0, 10)
  params = jax.jit(model.init)(jax.random.key(2), x[:1])["params"]

  def mean_loss(p, xb, yb):
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, xb), yb))

  sgd = optax.sgd(LR)

  @jax.jit
  def plain_step(p, s, xb, yb):
    g = jax.grad(mean_loss)(p, xb, yb)
    u, s = sgd.update(g, s, p)
    return optax.apply_updates(p, u), s

  def per_example(p, xi, yi):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, xi[None])[0], yi)

  mask = jnp.ones((batch,), bool)
  steps = {"nonprivate": (plain_step, (params, sgd.init(params), x, y))}
  for method in methods:
    grad_fn = clipping.clipped_grad(per_example, l2_clip_norm=CLIP, batch_argnums=(1, 2),
                                    method=method)
    dp = transforms.private_sgd(LR, noise_multiplier=SIGMA, l2_sensitivity=grad_fn.sensitivity,
                          expected_batch_size=float(batch), key=jax.random.key(3))

    @jax.jit
    def private_step(p, s, xb, yb, grad_fn=grad_fn, dp=dp):
      g, _ = grad_fn(p, xb, yb, mask=mask)
      u, s = dp.update(g, s, p)
      return optax.apply_updates(p, u), s

    steps[method] = (private_step, (params, dp.init(params), x, y))
  return steps


def step_memory_mb(name: str, batch: int, methods=("vmap", "ghost")) -> dict:
  """Temporary (scratch) memory of the compiled private step, in MiB, per method."""
  out = {}
  for method, (fn, args) in jax_steps(name, batch, methods).items():
    if method == "nonprivate":
      continue
    analysis = fn.lower(*args).compile().memory_analysis()
    out[method] = None if analysis is None else analysis.temp_size_in_bytes / 2 ** 20
  return out


_OPACUS_WORKER = textwrap.dedent("""
  import json, sys, time, warnings
  warnings.filterwarnings("ignore")
  import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
  import opacus
  from opacus import GradSampleModule, PrivacyEngine
  from opacus.optimizers import DPOptimizer
  torch.manual_seed(0)
  torch.set_num_threads(int(sys.argv[2]))
  batch = int(sys.argv[1])
  def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))
  def cnn():
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 16, 8, 2, padding=3), nn.ReLU(),
                         nn.MaxPool2d(2, 1), nn.Conv2d(16, 32, 4, 2), nn.ReLU(), nn.MaxPool2d(2, 1),
                         nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.ReLU(), nn.Linear(32, 10))
  x = torch.randn(batch, 784); y = torch.randint(0, 10, (batch,))
  loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)
  steps = {}
  for name, make in [("mlp", mlp), ("cnn", cnn)]:
    m = make(); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    def plain(m=m, opt=opt):
      opt.zero_grad(); F.cross_entropy(m(x), y).backward(); opt.step()
    gm = GradSampleModule(make())
    dopt = DPOptimizer(torch.optim.SGD(gm.parameters(), lr=0.1), noise_multiplier=1.0,
                       max_grad_norm=1.0, expected_batch_size=batch)
    def hooks(gm=gm, dopt=dopt):
      dopt.zero_grad(); F.cross_entropy(gm(x), y).backward(); dopt.step()
    base = make()
    gmod, gopt, crit, _ = PrivacyEngine().make_private(
        module=base, optimizer=torch.optim.SGD(base.parameters(), lr=0.1), data_loader=loader,
        criterion=nn.CrossEntropyLoss(), noise_multiplier=1.0, max_grad_norm=1.0,
        grad_sample_mode="ghost", poisson_sampling=False)
    def ghost(gmod=gmod, gopt=gopt, crit=crit):
      gopt.zero_grad(); loss = crit(gmod(x), y); loss.backward(); gopt.step()
    steps[name] = {"nonprivate": plain, "hooks": hooks, "ghost": ghost}
  for per in steps.values():
    for st in per.values():
      st(); st()
  print(json.dumps({"torch": torch.__version__, "opacus": opacus.__version__,
                    "threads": torch.get_num_threads()}), flush=True)
  for line in sys.stdin:
    out = {}
    for name, per in steps.items():
      for mode, st in per.items():
        t0 = time.perf_counter(); st(); out[name + "/" + mode] = time.perf_counter() - t0
    print(json.dumps(out), flush=True)
""")


class OpacusWorker:
  """Opacus timing process in its own venv; ``round()`` times every mode once."""

  def __init__(self, python: str, batch: int):
    threads = str(os.cpu_count() or 1)
    self.proc = subprocess.Popen([python, "-c", _OPACUS_WORKER, str(batch), threads],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    line = self.proc.stdout.readline()
    if not line:
      err = self.proc.stderr.read().strip().splitlines()
      raise RuntimeError(err[-1][:300] if err else "worker exited")
    self.info = json.loads(line)

  def round(self) -> dict:
    self.proc.stdin.write("go\n")
    self.proc.stdin.flush()
    return json.loads(self.proc.stdout.readline())

  def close(self):
    self.proc.stdin.close()
    self.proc.wait(timeout=60)


def _time_round(steps: dict) -> dict:
  out = {}
  for key, (fn, args) in steps.items():
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    out[key] = time.perf_counter() - t0
  return out


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer rounds, small ResNet batch")
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--torch-python",
                      default=os.environ.get("JAXDP_OPACUS_PYTHON", "/work/opacus-venv/bin/python"))
  parser.add_argument("--skip-opacus", action="store_true")
  args = parser.parse_args(argv)
  rounds = 5 if args.quick else 15
  resnet_batch = 16 if args.quick else 64
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
  print(f"backend={jax.default_backend()} devices={jax.device_count()} batch={args.batch} "
        f"rounds={rounds} load_avg_1min={load}")
  results: dict = {"backend": jax.default_backend(), "batch": args.batch, "rounds": rounds,
                   "clip": CLIP, "noise_multiplier": SIGMA, "load_avg_1min_start": load}

  steps: dict = {}
  for name in ("mlp", "cnn"):
    for mode, st in jax_steps(name, args.batch).items():
      steps[f"{name}/{mode}"] = st
  for mode, st in jax_steps("resnet20", resnet_batch).items():
    steps[f"resnet20/{mode}"] = st
  for fn, a in steps.values():  # compile + warm up
    jax.block_until_ready(fn(*a))
    jax.block_until_ready(fn(*a))

  worker, note = None, "ok"
  if args.skip_opacus:
    note = "Opacus comparison skipped: --skip-opacus."
  elif not pathlib.Path(args.torch_python).exists():
    note = f"Opacus comparison skipped: interpreter {args.torch_python} not found."
  else:
    try:
      worker = OpacusWorker(args.torch_python, args.batch)
    except (RuntimeError, OSError, ValueError) as err:
      note = f"Opacus comparison skipped: {err}"
  results["opacus_note"] = note

  jax_times = {k: [] for k in steps}
  op_times: dict = {}
  for r in range(rounds):
    # The vmap MLP step is ~100x the others: time it every other round only in --quick.
    for k, v in _time_round({k: s for k, s in steps.items()
                             if not (args.quick and k == "mlp/vmap" and r % 2)}).items():
      jax_times[k].append(v)
    if worker is not None:
      for k, v in worker.round().items():
        op_times.setdefault(k, []).append(v)
  if worker is not None:
    results["opacus_versions"] = worker.info
    worker.close()

  for name in ("mlp", "cnn", "resnet20"):
    best = {m: float(np.min(jax_times[f"{name}/{m}"])) for m in ("nonprivate",) + METHODS}
    r = {f"{m}_ms": 1e3 * t for m, t in best.items()}
    for m in METHODS:
      r[f"ratio_{m}"] = best[m] / best["nonprivate"]
    fastest = min(METHODS, key=lambda m: best[m])
    r["best_method"] = fastest
    r["private_over_nonprivate"] = best[fastest] / best["nonprivate"]
    r["batch"] = resnet_batch if name == "resnet20" else args.batch
    print(f"[jaxdp {name} batch {r['batch']}] non-private {r['nonprivate_ms']:.2f} ms; "
          + "; ".join(f"{m} {r[m + '_ms']:.2f} ms (x{r['ratio_' + m]:.2f})" for m in METHODS))
    if name != "resnet20" and op_times:
      ob = {m: float(np.min(op_times[f"{name}/{m}"])) for m in ("nonprivate", "hooks", "ghost")}
      r["opacus"] = {f"{m}_ms": 1e3 * t for m, t in ob.items()}
      op_best = min(("hooks", "ghost"), key=lambda m: ob[m])
      r["opacus"]["private_over_nonprivate"] = ob[op_best] / ob["nonprivate"]
      r["jaxdp_best_over_opacus_best"] = best[fastest] / ob[op_best]
      print(f"[opacus {name}] non-private {1e3 * ob['nonprivate']:.2f} ms; hooks "
            f"{1e3 * ob['hooks']:.2f} ms; ghost {1e3 * ob['ghost']:.2f} ms; jaxdp best ({fastest}) / "
            f"Opacus best ({op_best}) = {r['jaxdp_best_over_opacus_best']:.2f}")
    results[name] = r
  if not op_times:
    print(note)

  memory = {}
  mem_models = ("mlp", "cnn") if args.quick else ("mlp", "cnn", "resnet20")
  for name in mem_models:
    for b in (256, 1024):
      memory[f"{name}/{b}"] = step_memory_mb(name, b)
      print(f"[memory {name} batch {b}] temp MiB: "
            + ", ".join(f"{m} {v:.1f}" for m, v in memory[f"{name}/{b}"].items() if v is not None))
  results["temp_memory_mib"] = memory
  results["load_avg_1min_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
  print(json.dumps(results))
  return results


if __name__ == "__main__":
  main(sys.argv[1:])
