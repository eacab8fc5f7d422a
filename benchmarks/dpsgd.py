"""Benchmark: DP-SGD step time and memory, jaxdp clipping methods vs non-private SGD and Opacus.

Measured in ONE run (ratios are only meaningful within a run on a shared machine):

1. MLP 784-512-512-10 and the Opacus MNIST CNN (``jaxdp.models.SmallCNN``) at
   batch 256: a jitted non-private SGD step and a jitted DP-SGD step (clipping +
   Gaussian noise, clip 1, sigma 1, SGD) for each clipping method of
   ``clipped_grad``: ``vmap`` (materialised per-example gradients),
   ``reweight`` (vmapped norms + one reweighted backward pass), ``ghost``
   (ghost norms + book-keeping, ``jaxdp.dpsgd.ghost_norms``).
2. The same models, batch, clip and noise in Opacus (non-private, hook-based
   ``GradSampleModule`` + ``DPOptimizer``, and ghost clipping
   ``grad_sample_mode="ghost"``) on CPU (``--opacus-device=cuda`` on a GPU machine, where
   ResNet-20 is timed too) in a separate virtual environment (``--torch-python`` or
   ``$JAXDP_OPACUS_PYTHON``, default ``/work/opacus-venv/bin/python``), so torch never
   enters jaxdp's environment. It runs as a persistent worker process and its timing rounds
   alternate with jaxdp's, so both see the same machine load. Skipped, with the
   reason printed, when that interpreter or Opacus is unavailable.
3. ResNet-20 (GroupNorm, type-A shortcuts) on CIFAR-10-shaped inputs (Opacus only with
   ``--opacus-resnet`` or on CUDA).
4. Peak temporary memory of the compiled private step, vmap vs ghost, at batch
   256 and 1024 (``jax.jit(...).lower(...).compile().memory_analysis()``).
5. The training loop against its bare step (``loop_steps``): one full
   ``make_private`` step with device-resident data (Poisson sampling, gather,
   clipped gradient, noise, update in one jitted call) over the bare jitted
   private step at the same static batch size P, as ``loop_over_bare`` per
   model (MLP, CNN; ResNet-20 at batch 600 on a GPU); the host-sampled loop
   (``host_loop_over_bare``) and the cost of padding to P instead of the
   expected batch (``padding_cost``) beside it.

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
from jaxdp.dpsgd import clipping, transforms

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


def synthetic_problem(name: str, num_examples: int) -> tuple:
  """``(x, y, params, per_example_loss)``: random data of the model's input shape, 10 classes."""
  from jaxdp.dpsgd import make_per_example_loss  # pylint: disable=import-outside-toplevel
  model, x_shape = _model(name)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(num_examples,) + x_shape).astype(np.float32)
  y = rng.integers(0, 10, num_examples).astype(np.int32)
  params = jax.jit(model.init)(jax.random.key(2), x[:1])["params"]
  return x, y, params, make_per_example_loss(lambda p, xb: model.apply({"params": p}, xb))


def loop_steps(name: str, batch: int, num_examples: int, total_steps: int,
               method: str = "ghost") -> tuple[dict, dict]:
  """One full ``make_private`` step (device and host paths) and the bare jitted step it wraps.

  Returns ``({mode: (fn, args)}, info)`` with modes

  * ``loop_device``: ``private.step(params, state, sampler.sample())`` with
    ``sampler(data=(x, y))``: Poisson sampling, gather, clipped gradient,
    noise and update in one jitted call (``jaxdp.dpsgd.device_sampling``);
  * ``loop_host``: the host path, ``sampler.sample().gather(x, y)`` then ``step``;
  * ``bare_padded``: the same jitted clipped-gradient + noise + update on a batch
    already on the device, of the plan's static size P (the binomial bound);
  * ``bare_expected``: the same at exactly ``batch`` rows (the expected size);
    ``bare_padded / bare_expected`` is the cost of the overflow padding.
  """
  from jaxdp.accounting import PrivacyAccountant  # pylint: disable=import-outside-toplevel
  from jaxdp.dpsgd import make_private  # pylint: disable=import-outside-toplevel
  x, y, params, loss = synthetic_problem(name, num_examples)
  plans = {}
  for mode in ("loop_device", "loop_host"):
    plans[mode] = make_private(loss, l2_clip_norm=CLIP, num_examples=num_examples,
                               expected_batch_size=batch, noise_multiplier=SIGMA, delta=1e-5,
                               steps=total_steps, key=jax.random.key(3), learning_rate=LR,
                               clipping_method=method)
  private = plans["loop_device"]
  grad_fn, tx = private.clipped_grad_fn, private.optimizer

  @jax.jit
  def bare(p, s, xb, yb, mask):
    g, _ = grad_fn(p, xb, yb, mask=mask)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  steps: dict = {}
  for mode, rows in (("bare_padded", private.padded_size), ("bare_expected", batch)):
    xb, yb = jnp.asarray(x[:rows]), jnp.asarray(y[:rows])
    steps[mode] = (bare, (params, tx.init(params), xb, yb, jnp.ones((rows,), bool)))

  def looped(mode):
    plan = plans[mode]
    sampler = plan.sampler(PrivacyAccountant(), data=(x, y) if mode == "loop_device" else None)
    holder = {"params": params, "state": plan.init(params)}

    def one_step():
      batch_ = sampler.sample()
      if mode == "loop_host":
        batch_ = batch_.gather(x, y)
      holder["params"], holder["state"], _ = plan.step(holder["params"], holder["state"], batch_)
      return holder["params"]
    return one_step

  for mode in ("loop_device", "loop_host"):
    steps[mode] = (looped(mode), ())
  return steps, {"padded_size": private.padded_size, "num_examples": num_examples,
                 "expected_batch_size": batch, "clipping_method": method}


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
  batch, device, resnet_batch = int(sys.argv[1]), torch.device(sys.argv[3]), int(sys.argv[4])
  def sync():
    if device.type == "cuda":
      torch.cuda.synchronize()
  def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))
  def cnn():
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 16, 8, 2, padding=3), nn.ReLU(),
                         nn.MaxPool2d(2, 1), nn.Conv2d(16, 32, 4, 2), nn.ReLU(), nn.MaxPool2d(2, 1),
                         nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.ReLU(), nn.Linear(32, 10))
  class Block(nn.Module):  # jaxdp.models.resnet.BasicBlock: GroupNorm(min(32, C)), type-A shortcut
    def __init__(self, cin, cout, stride):
      super().__init__()
      self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
      self.g1 = nn.GroupNorm(min(32, cout), cout)
      self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
      self.g2 = nn.GroupNorm(min(32, cout), cout)
      self.stride, self.extra = stride, cout - cin
    def forward(self, x):
      out = self.g2(self.c2(F.relu(self.g1(self.c1(x)))))
      sc = x[:, :, ::self.stride, ::self.stride]
      if self.extra:
        sc = F.pad(sc, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))
      return F.relu(out + sc)
  class ResNet20(nn.Module):
    def __init__(self):
      super().__init__()
      layers, cin = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.GroupNorm(16, 16), nn.ReLU()], 16
      for stage, w in enumerate((16, 32, 64)):
        for b in range(3):
          layers.append(Block(cin, w, 2 if stage > 0 and b == 0 else 1)); cin = w
      self.body = nn.Sequential(*layers); self.fc = nn.Linear(64, 10)
    def forward(self, x):
      return self.fc(self.body(x).mean(dim=(2, 3)))
  models = [("mlp", mlp, (batch, 784)), ("cnn", cnn, (batch, 784))]
  if resnet_batch > 0:
    models.append(("resnet20", ResNet20, (resnet_batch, 3, 32, 32)))
  steps, errors = {}, {}
  for name, make, shape in models:
    x = torch.randn(*shape, device=device); y = torch.randint(0, 10, (shape[0],), device=device)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x.cpu(), y.cpu()),
                                         batch_size=shape[0])
    m = make().to(device); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    def plain(m=m, opt=opt, x=x, y=y):
      opt.zero_grad(); F.cross_entropy(m(x), y).backward(); opt.step()
    gm = GradSampleModule(make().to(device))
    dopt = DPOptimizer(torch.optim.SGD(gm.parameters(), lr=0.1), noise_multiplier=1.0,
                       max_grad_norm=1.0, expected_batch_size=shape[0])
    def hooks(gm=gm, dopt=dopt, x=x, y=y):
      dopt.zero_grad(); F.cross_entropy(gm(x), y).backward(); dopt.step()
    per = {"nonprivate": plain, "hooks": hooks}
    try:
      base = make().to(device)
      gmod, gopt, crit, _ = PrivacyEngine().make_private(
          module=base, optimizer=torch.optim.SGD(base.parameters(), lr=0.1), data_loader=loader,
          criterion=nn.CrossEntropyLoss(), noise_multiplier=1.0, max_grad_norm=1.0,
          grad_sample_mode="ghost", poisson_sampling=False)
      def ghost(gmod=gmod, gopt=gopt, crit=crit, x=x, y=y):
        gopt.zero_grad(); loss = crit(gmod(x), y); loss.backward(); gopt.step()
      ghost(); per["ghost"] = ghost
    except Exception as err:  # a layer without a ghost-norm rule: report, keep the other modes
      errors[name + "/ghost"] = repr(err)[:200]
    steps[name] = per
  for per in steps.values():
    for st in per.values():
      st(); st()
  sync()
  print(json.dumps({"torch": torch.__version__, "opacus": opacus.__version__,
                    "threads": torch.get_num_threads(), "device": str(device),
                    "errors": errors}), flush=True)
  for line in sys.stdin:
    out = {}
    for name, per in steps.items():
      for mode, st in per.items():
        sync(); t0 = time.perf_counter(); st(); sync()
        out[name + "/" + mode] = time.perf_counter() - t0
    print(json.dumps(out), flush=True)
""")


class OpacusWorker:
  """Opacus timing process in its own venv; ``round()`` times every mode once."""

  def __init__(self, python: str, batch: int, device: str = "cpu", resnet_batch: int = 0):
    threads = str(os.cpu_count() or 1)
    self.proc = subprocess.Popen([python, "-c", _OPACUS_WORKER, str(batch), threads, device,
                                  str(resnet_batch)],
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
  parser.add_argument("--opacus-device", default="cpu",
                      help="torch device of the Opacus runs ('cuda' on a GPU machine)")
  parser.add_argument("--resnet-batch", type=int, default=None,
                      help="ResNet-20 batch (default 16 with --quick, else 64)")
  parser.add_argument("--opacus-resnet", action="store_true",
                      help="also time ResNet-20 in Opacus (always on with --opacus-device=cuda)")
  args = parser.parse_args(argv)
  rounds = 5 if args.quick else 15
  resnet_batch = args.resnet_batch or (16 if args.quick else 64)
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
      opacus_resnet = args.opacus_resnet or args.opacus_device != "cpu"
      worker = OpacusWorker(args.torch_python, args.batch, args.opacus_device,
                            resnet_batch if opacus_resnet else 0)
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
    if f"{name}/nonprivate" in op_times:
      ob = {m: float(np.min(op_times[f"{name}/{m}"])) for m in ("nonprivate", "hooks", "ghost")
            if f"{name}/{m}" in op_times}
      r["opacus"] = {f"{m}_ms": 1e3 * t for m, t in ob.items()}
      op_best = min((m for m in ("hooks", "ghost") if m in ob), key=lambda m: ob[m])
      r["opacus"]["private_over_nonprivate"] = ob[op_best] / ob["nonprivate"]
      r["jaxdp_best_over_opacus_best"] = best[fastest] / ob[op_best]
      print(f"[opacus {name}] " + "; ".join(f"{m} {1e3 * t:.2f} ms" for m, t in ob.items())
            + f"; jaxdp best ({fastest}) / Opacus best ({op_best}) = "
            f"{r['jaxdp_best_over_opacus_best']:.2f}")
    results[name] = r
  if not op_times:
    print(note)

  # The training loop against its bare step (sampling, gather and padding included).
  gpu = jax.default_backend() == "gpu"
  loop_models = [("mlp", args.batch, 60_000), ("cnn", args.batch, 60_000)]
  if gpu:
    loop_models.append(("resnet20", 600, 50_000))  # paper 000 Fig. 7's batch
  reps = 3 if args.quick else 10
  loop = {}
  for name, b, n in loop_models:
    lsteps, info = loop_steps(name, b, n, total_steps=2 * (rounds + 2) * reps + 10)
    for fn, a in lsteps.values():  # compile + warm up
      jax.block_until_ready(fn(*a))
      jax.block_until_ready(fn(*a))
    times = {k: [] for k in lsteps}
    for _ in range(rounds):
      for k, (fn, a) in lsteps.items():
        t0 = time.perf_counter()
        for _ in range(reps):
          out = fn(*a)
        jax.block_until_ready(out)
        times[k].append((time.perf_counter() - t0) / reps)
    best = {k: float(np.min(v)) for k, v in times.items()}
    r = dict(info, **{f"{k}_ms": 1e3 * t for k, t in best.items()})
    r["loop_over_bare"] = best["loop_device"] / best["bare_padded"]
    r["host_loop_over_bare"] = best["loop_host"] / best["bare_padded"]
    r["padding_cost"] = best["bare_padded"] / best["bare_expected"]
    loop[name] = r
    print(f"[loop {name} batch {b} P={info['padded_size']}] make_private step (device data) "
          f"{r['loop_device_ms']:.2f} ms, bare step at P {r['bare_padded_ms']:.2f} ms: "
          f"loop_over_bare x{r['loop_over_bare']:.3f}; host-sampled loop x"
          f"{r['host_loop_over_bare']:.3f}; padding P vs {b}: x{r['padding_cost']:.3f}")
  results["loop"] = loop
  results["loop_over_bare"] = {k: v["loop_over_bare"] for k, v in loop.items()}

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
