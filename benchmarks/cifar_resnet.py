"""Paper 000 Figure 7 cost: ResNet-20 (GroupNorm) on CIFAR-10-shaped data, measured in one run.

Times the two training loops of ``experiments/cifar_tradeoffs.py`` with the paper's
settings (Sec. 4.3: N = 50,000, expected batch 600, momentum SGD, augmentation) on
random CIFAR-shaped inputs (step time does not depend on pixel values; CIFAR-10 itself
is not needed):

1. **DP-SGD** step exactly as the experiment runs it (:func:`make_dpsgd_resnet`: Poisson
   sampling on the host, gather, ``PrivateSGD.step`` with per-example clipping and noise),
   and a jitted non-private momentum-SGD step on a batch of 600 of the same model: the
   ratio is the price of privacy per step.
2. **Subsample-and-aggregate teachers**: one step of all T = 16 teachers in ONE jitted
   program (:func:`make_teachers`, batch 600 from each teacher's 3,125 examples), with
   ``jax.lax.map`` over the teachers (the experiment's choice on a GPU) and with ``jax.vmap``.

From the median step times it projects the wall time of the full Figure 7 (every
epsilon of the config, 100 DP-SGD epochs each; 500 teacher epochs), compile time
excluded and reported apart. ``--quick`` (a CPU smoke run): N = 2,000, DP-SGD batches of 64
instead of 600, 4 teachers with batches of 16, 2 timed steps; its projection is of that small
setting scaled to N = 50,000.
The LAST line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp.accounting import PrivacyAccountant

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(rel):
  spec = importlib.util.spec_from_file_location(pathlib.Path(rel).stem, ROOT / rel)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _median_step(fn, n):
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20; quick 5)")
  args = parser.parse_args()
  exp = _load("experiments/cifar_tradeoffs.py")
  config = _load("configs/tradeoffs_fig7.py").get_config()
  n = 2000 if args.quick else 50_000
  steps = args.steps or (2 if args.quick else 20)
  if args.quick:
    config.dpsgd.expected_batch_size = 64.0
    config.teachers.batch_size = 16
    config.teachers.num_teachers = 4
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n, 32, 32, 3)).astype(np.float32)
  y = rng.integers(0, 10, n).astype(np.int32)
  print(f"backend={jax.default_backend()} device={jax.devices()[0].device_kind} n={n}", flush=True)
  out = dict(quick=bool(args.quick), backend=jax.default_backend(),
             device=jax.devices()[0].device_kind, n_train=n, timed_steps=steps)

  # 1. DP-SGD, as the experiment runs it.
  eps = float(config.budget_epsilon)
  params, model, private, total, per_epoch, k_aug = exp.make_dpsgd_resnet(
      jax.random.key(0), x, y, eps, float(config.dpsgd.clip_norms[0]), config)
  sampler = private.sampler(PrivacyAccountant())
  state = private.init(params)
  x_epoch = exp.augment(k_aug, jnp.asarray(x))
  carry = {"p": params, "s": state}

  def dp_step():
    batch = sampler.sample().gather(x_epoch, y)
    carry["p"], carry["s"], _ = private.step(carry["p"], carry["s"], batch)
    return carry["p"]

  t0 = time.perf_counter()
  jax.block_until_ready(dp_step())
  out["dpsgd_first_step_s"] = round(time.perf_counter() - t0, 2)
  dp_step()
  out["dpsgd_step_ms"] = 1e3 * _median_step(dp_step, steps)
  out["dpsgd_padded_batch"] = int(private.padded_size)
  out["dpsgd_steps_per_epoch"] = per_epoch

  # Non-private reference: same model, batch 600, momentum SGD, one jitted step.
  batch = int(config.dpsgd.expected_batch_size)
  opt = optax.sgd(0.1, momentum=0.9)
  xb, yb = jnp.asarray(x[:batch]), jnp.asarray(y[:batch])

  @jax.jit
  def plain(p, s):
    g = jax.grad(lambda q: optax.softmax_cross_entropy_with_integer_labels(
        model.apply({"params": q}, xb), yb).mean())(p)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s

  pc = {"p": params, "s": opt.init(params)}

  def np_step():
    pc["p"], pc["s"] = plain(pc["p"], pc["s"])
    return pc["p"]

  np_step(), np_step()
  out["nonprivate_step_ms"] = 1e3 * _median_step(np_step, steps)
  out["dpsgd_over_nonprivate"] = out["dpsgd_step_ms"] / out["nonprivate_step_ms"]

  # 2. The T teachers, one jitted step, lax.map (the default) and vmap over the teachers.
  for mode in ("map", "vmap"):
    config.teachers.batch_mode = mode
    step, tparams, topt, ttotal, _ = exp.make_teachers(jax.random.key(1), x, y, config)
    tc = {"p": tparams, "s": topt, "i": 0}

    def t_step(step=step, tc=tc):
      tc["i"] += 1
      tc["p"], tc["s"] = step(tc["p"], tc["s"], jax.random.fold_in(jax.random.key(2), tc["i"]))
      return tc["p"]

    t0 = time.perf_counter()
    jax.block_until_ready(t_step())
    out[f"teachers_{mode}_first_step_s"] = round(time.perf_counter() - t0, 2)
    t_step()
    out[f"teachers_{mode}_step_ms"] = 1e3 * _median_step(t_step, steps)
    del tc
  out["teachers_step_ms"] = min(out["teachers_map_step_ms"], out["teachers_vmap_step_ms"])
  out["teachers_vmap_over_map"] = out["teachers_vmap_step_ms"] / out["teachers_map_step_ms"]
  out["num_teachers"] = int(config.teachers.num_teachers)

  # Projection of the full Figure 7 at N = 50,000 (steps scale with N / batch).
  scale = 50_000 / n
  epsilons = sorted(set(float(e) for e in config.epsilons) | {float(config.budget_epsilon)})
  dpsgd_steps = len(epsilons) * per_epoch * scale * float(config.dpsgd.epochs)
  teacher_steps = ttotal * scale
  out["fig7_dpsgd_steps"] = int(dpsgd_steps)
  out["fig7_teacher_steps"] = int(teacher_steps)
  out["fig7_projected_minutes"] = (dpsgd_steps * out["dpsgd_step_ms"]
                                   + teacher_steps * out["teachers_step_ms"]) / 6e4
  for k in ("dpsgd_step_ms", "nonprivate_step_ms", "teachers_step_ms", "teachers_map_step_ms",
            "teachers_vmap_step_ms", "teachers_vmap_over_map", "dpsgd_over_nonprivate",
            "fig7_projected_minutes"):
    out[k] = round(out[k], 3)
  print(f"DP-SGD step {out['dpsgd_step_ms']:.1f} ms vs non-private {out['nonprivate_step_ms']:.1f}"
        f" ms (x{out['dpsgd_over_nonprivate']:.2f}); {out['num_teachers']} teachers one step "
        f"{out['teachers_step_ms']:.1f} ms; Figure 7 projected "
        f"{out['fig7_projected_minutes']:.1f} min")
  print(json.dumps(out))


if __name__ == "__main__":
  main()
