"""Benchmark: DP-SGD step time vs non-private SGD, vs Opacus, and ResNet-20.

Measured in ONE run (ratios are only meaningful within a run on a shared machine):

1. MNIST MLP (784-256-10) and SmallCNN at batch 256 on CPU: median step time of
   a jitted DP-SGD step (per-example clipping + noise + SGD update) over a
   jitted non-private SGD step on the same batch, for both clipping methods
   (``"vmap"``: materialised per-example gradients; ``"reweight"``: per-example
   norms, then one reweighted batched backward pass).
2. The same models, batch and clip/noise in Opacus (``GradSampleModule`` +
   ``DPOptimizer``) on CPU, run in a separate virtual environment
   (``--torch-python``, default ``/work/venv-torch/bin/python``) so that torch never
   enters jaxdp's environment: jaxdp step time over Opacus step time. Skipped,
   with the reason printed, when that interpreter or Opacus is unavailable.
3. ResNet-20 (GroupNorm, type-A shortcuts) on CIFAR-10-shaped inputs: private /
   non-private step-time ratio and examples per second (batch 16 with
   ``--quick``, 64 otherwise).

Timing: the compared steps are called round-robin and the minimum time per
call over the rounds is reported (robust to other processes on a shared
machine). Inputs are random tensors of the datasets' shapes (step time does not depend on
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


def _time_interleaved(fns: dict, reps: int, warmup: int = 2) -> dict[str, float]:
  """Best (minimum) wall time per call of each ``fn(*args)``, measured round-robin.

  The machine is shared, so calls of the compared functions are interleaved (each
  round times every function once) and the minimum over rounds is reported: the
  least-disturbed time, which is what a ratio of two step times should compare.
  """
  for fn, args in fns.values():
    for _ in range(warmup):
      jax.block_until_ready(fn(*args))
  times = {name: [] for name in fns}
  for _ in range(reps):
    for name, (fn, args) in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - t0)
  return {name: float(np.min(t)) for name, t in times.items()}


def jax_step_times(model, x_shape, batch: int, reps: int,
                   methods: tuple[str, ...] = ("vmap", "reweight")) -> dict[str, float]:
  """Median seconds per step: non-private SGD and DP-SGD (each clipping method), same batch."""
  key = jax.random.key(0)
  x = jax.random.normal(key, (batch,) + x_shape)
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
  fns = {"nonprivate": (plain_step, (params, sgd.init(params), x, y))}
  for method in methods:
    grad_fn = clipping.clipped_grad(per_example, l2_clip_norm=CLIP, batch_argnums=(1, 2),
                                    method=method)
    dp = transforms.dpsgd(LR, noise_multiplier=SIGMA, l2_sensitivity=grad_fn.sensitivity,
                          expected_batch_size=float(batch), key=jax.random.key(3))

    @jax.jit
    def private_step(p, s, xb, yb, grad_fn=grad_fn, dp=dp):
      g, _ = grad_fn(p, xb, yb, mask=mask)
      u, s = dp.update(g, s, p)
      return optax.apply_updates(p, u), s

    fns[method] = (private_step, (params, dp.init(params), x, y))
  best_times = _time_interleaved(fns, reps)
  t_plain = best_times["nonprivate"]
  out = {"nonprivate_s": t_plain}
  for method in methods:
    out[f"private_{method}_s"] = best_times[method]
    out[f"ratio_{method}"] = best_times[method] / t_plain
  best = min(methods, key=lambda m: out[f"private_{m}_s"])
  out["private_s"] = out[f"private_{best}_s"]
  out["ratio"] = out["private_s"] / t_plain
  out["best_method"] = best
  out["private_examples_per_s"] = batch / out["private_s"]
  return out


_OPACUS_SCRIPT = textwrap.dedent("""
  import json, sys, time, warnings
  warnings.filterwarnings("ignore")
  import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
  import opacus
  from opacus import GradSampleModule
  from opacus.optimizers import DPOptimizer
  torch.manual_seed(0)
  torch.set_num_threads(int(sys.argv[3]))
  batch, reps = int(sys.argv[1]), int(sys.argv[2])
  def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
  def cnn():
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 16, 8, 2, padding=3), nn.ReLU(),
                         nn.MaxPool2d(2, 1), nn.Conv2d(16, 32, 4, 2), nn.ReLU(), nn.MaxPool2d(2, 1),
                         nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.ReLU(), nn.Linear(32, 10))
  x = torch.randn(batch, 784); y = torch.randint(0, 10, (batch,))
  out = {"torch": torch.__version__, "opacus": opacus.__version__, "threads": torch.get_num_threads()}
  def best(steps):
    for _ in range(2):
      for st in steps: st()
    ts = [[] for _ in steps]
    for _ in range(reps):
      for t, st in zip(ts, steps):
        t0 = time.perf_counter(); st(); t.append(time.perf_counter() - t0)
    return [float(np.min(t)) for t in ts]
  for name, make in [("mlp", mlp), ("cnn", cnn)]:
    m = make(); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    def plain():
      opt.zero_grad(); F.cross_entropy(m(x), y).backward(); opt.step()
    gm = GradSampleModule(make())
    dopt = DPOptimizer(torch.optim.SGD(gm.parameters(), lr=0.1), noise_multiplier=1.0,
                       max_grad_norm=1.0, expected_batch_size=batch)
    def private():
      dopt.zero_grad(); F.cross_entropy(gm(x), y).backward(); dopt.step()
    t_plain, t_priv = best([plain, private])
    out[name] = {"nonprivate_s": t_plain, "private_s": t_priv}
  print(json.dumps(out))
""")


def opacus_step_times(python: str, batch: int, reps: int) -> tuple[dict | None, str]:
  """Runs the Opacus timing in ``python`` (a separate venv); returns (figures, note)."""
  if not pathlib.Path(python).exists():
    return None, f"Opacus comparison skipped: interpreter {python} not found."
  threads = str(os.cpu_count() or 1)
  try:
    proc = subprocess.run([python, "-c", _OPACUS_SCRIPT, str(batch), str(reps), threads],
                          capture_output=True, text=True, timeout=900)
  except subprocess.TimeoutExpired:
    return None, "Opacus comparison skipped: timed out."
  if proc.returncode != 0:
    return None, "Opacus comparison skipped: " + proc.stderr.strip().splitlines()[-1][:300]
  return json.loads(proc.stdout.strip().splitlines()[-1]), "ok"


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer repetitions, small ResNet batch")
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--torch-python", default="/work/venv-torch/bin/python")
  parser.add_argument("--skip-opacus", action="store_true")
  args = parser.parse_args(argv)
  reps = 7 if args.quick else 20
  resnet_batch = 16 if args.quick else 64
  print(f"backend={jax.default_backend()} devices={jax.device_count()} batch={args.batch} reps={reps}")
  results: dict = {"backend": jax.default_backend(), "batch": args.batch, "reps": reps,
                   "clip": CLIP, "noise_multiplier": SIGMA}
  for name, model, shape in [("mlp", models.MLP(hidden_sizes=(256,)), (784,)),
                             ("cnn", models.SmallCNN(), (784,))]:
    r = jax_step_times(model, shape, args.batch, reps)
    results[name] = r
    print(f"[jaxdp {name}] non-private {1e3 * r['nonprivate_s']:.2f} ms/step; private vmap "
          f"{1e3 * r['private_vmap_s']:.2f} ms/step (ratio {r['ratio_vmap']:.2f}), private reweight "
          f"{1e3 * r['private_reweight_s']:.2f} ms/step (ratio {r['ratio_reweight']:.2f})")
  if args.skip_opacus:
    note = "Opacus comparison skipped: --skip-opacus."
    op = None
  else:
    op, note = opacus_step_times(args.torch_python, args.batch, reps)
  results["opacus_note"] = note
  if op is not None:
    results["opacus"] = op
    for name in ("mlp", "cnn"):
      ratio = results[name]["private_s"] / op[name]["private_s"]
      results[name]["jaxdp_over_opacus"] = ratio
      results[name]["jaxdp_vmap_over_opacus"] = results[name]["private_vmap_s"] / op[name]["private_s"]
      print(f"[opacus {name}] non-private {1e3 * op[name]['nonprivate_s']:.2f} ms/step, private "
            f"{1e3 * op[name]['private_s']:.2f} ms/step; jaxdp ({results[name]['best_method']})/opacus "
            f"private step time = {ratio:.2f} (vmap: {results[name]['jaxdp_vmap_over_opacus']:.2f})")
  else:
    print(note)
  r = jax_step_times(models.ResNet20(), (32, 32, 3), resnet_batch, max(3, reps // 2))
  r["batch"] = resnet_batch
  results["resnet20"] = r
  print(f"[jaxdp resnet20 batch {resnet_batch}] non-private {1e3 * r['nonprivate_s']:.1f} ms/step, "
        f"private vmap {1e3 * r['private_vmap_s']:.1f} ms/step (ratio {r['ratio_vmap']:.2f}), "
        f"reweight {1e3 * r['private_reweight_s']:.1f} ms/step (ratio {r['ratio_reweight']:.2f}), "
        f"{r['private_examples_per_s']:.1f} private examples/s")
  print(json.dumps(results))
  return results


if __name__ == "__main__":
  main(sys.argv[1:])
