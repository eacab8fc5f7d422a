"""Benchmark: correlated-noise training (BandMF, BLT) against DP-SGD at equal (epsilon, delta).

Measured in ONE run (ratios are only meaningful within a run on a shared machine):

1. **Accuracy at equal (epsilon, delta)** on MNIST with the Opacus MNIST CNN
   (``jaxdp.models.SmallCNN``), every run through ``make_private`` with the
   same expected batch size E, steps T (``epochs`` passes), clip norm, SGD
   with momentum and seed, the noise calibrated by each mechanism's own
   accountant:

   * DP-SGD: Poisson rate E / N, T steps (``PoissonSampled`` x T);
   * BandMF (amplified, Choquette-Choo et al. 2023): b = bands cyclic groups,
     in-group rate ``E b / N``, ``ceil(T / b)`` rounds of the sampled Gaussian;
     the number of bands is chosen per epsilon before training, from public
     numbers only, as the one minimising ``sigma(eps)^2 x expected error``
     (the papers' rule), bands in {1, 2, 4, ..., 64} (1 = DP-SGD);
   * BLT (McMahan et al. 2024; deterministic accounting): b = T / epochs
     groups (one pass per epoch, k = epochs participations), one Gaussian of
     the (k, b)-participation sensitivity.

   The strategies are optimised for the SGD-with-momentum workload
   (``jaxdp.dpsgd.correlated.optimize_bandmf`` / ``optimize_blt``).
2. **Step time and memory**: one jitted private step (clipped gradient sum +
   noise transform + SGD) with ``noisy_aggregate`` vs ``correlated_noise``
   (BandMF with 64 bands, BLT with 4 buffers, built as ``make_private`` builds
   them, ``step_check="caller"``) on the MLP 784-512-512-10 and
   the CNN at batch 256 (minimum over interleaved rounds), and the noise state
   (``params x (bands - 1)`` or ``params x buffers`` floats).
3. **Strategy optimisation time** for n = 2000 steps (BandMF 64 bands, BLT 4
   buffers; ``--quick``: n = 500).

``--quick`` trains on a 12,000-example subset for one epoch at epsilon in
{2, 8}. ``--seed s --accuracy-only --csv FILE`` adds a seed (model init, keys)
to the accuracy table; ``--summarize FILE...`` prints the table of
``docs/speed.md`` (mean and sd over seeds) from such CSVs. The last printed
line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import models
from jaxdp.accounting import PrivacyAccountant, dpsgd_accounting
from jaxdp import dpsgd
from jaxdp.dpsgd import correlated
from jaxdp.dpsgd.correlated import optimize
from jaxdp.dpsgd import clipping, transforms

CLIP = 1.0
DELTA = 1e-5
MOMENTUM = 0.9
LR = 0.1
BAND_CHOICES = (1, 2, 4, 8, 16, 32, 64)
BLT_BUFFERS = 4


def _load_mnist(quick: bool):
  from jaxdp.data import load_mnist  # pylint: disable=import-outside-toplevel
  ds = load_mnist(os.environ.get("JAXDP_DATA_DIR"))
  x_tr, y_tr, x_te, y_te = ds.x_train, ds.y_train, ds.x_test, ds.y_test
  x_tr = ((np.asarray(x_tr, np.float32) - 0.1307) / 0.3081)
  x_te = ((np.asarray(x_te, np.float32) - 0.1307) / 0.3081)
  if quick:
    x_tr, y_tr = x_tr[:12_000], y_tr[:12_000]
  return x_tr, np.asarray(y_tr, np.int32), x_te, np.asarray(y_te, np.int32)


def choose_bands(epsilon: float, num_steps: int, batch: int, n: int) -> tuple:
  """Bands minimising sigma(eps)^2 x expected error (public numbers only)."""
  scores = {}
  for bands in BAND_CHOICES:
    p = batch * bands / n
    if p > 1.0 or bands > num_steps:
      continue
    strategy = (correlated.BandMF.dp_sgd() if bands == 1 else
                optimize.optimize_bandmf(num_steps, bands, momentum=MOMENTUM))
    sigma = correlated.calibrate_mf_noise_multiplier(
        epsilon, DELTA, strategy, num_steps=num_steps, min_separation=bands, sample_rate=p)
    err = optimize.expected_error(strategy, num_steps, momentum=MOMENTUM)
    scores[bands] = (sigma ** 2 * err, strategy, sigma)
  best = min(scores, key=lambda b: scores[b][0])
  return best, {b: v[0] for b, v in scores.items()}, scores[best][1]


def train_one(mechanism: str, epsilon: float, data, *, batch: int, epochs: int, seed: int,
              strategy=None, min_separation=None) -> dict:
  x_tr, y_tr, x_te, y_te = data
  n = len(y_tr)
  per_epoch = n // batch
  steps = epochs * per_epoch
  model = models.SmallCNN()
  params = model.init(jax.random.key(seed), x_tr[:1])
  loss = dpsgd.make_per_example_loss(model.apply)
  kwargs = {}
  if mechanism != "dpsgd":
    kwargs = dict(noise_strategy=strategy, min_separation=min_separation)
  private = dpsgd.make_private(
      loss, l2_clip_norm=CLIP, num_examples=n, key=jax.random.key(seed + 1),
      expected_batch_size=batch, target_epsilon=epsilon, delta=DELTA, steps=steps,
      optimizer=optax.sgd(LR, momentum=MOMENTUM), clipping_method="auto", **kwargs)
  acc = PrivacyAccountant()
  sampler = private.sampler(acc)
  state = private.init(params)
  t0 = time.perf_counter()
  for _ in range(steps):
    params, state, _ = private.step(params, state, sampler.sample().gather(x_tr, y_tr))
  jax.block_until_ready(params)
  seconds = time.perf_counter() - t0
  logits = jax.jit(model.apply)(params, x_te)
  accuracy = float(np.mean(np.asarray(jnp.argmax(logits, -1)) == y_te))
  return {"seed": seed, "mechanism": mechanism, "epsilon": epsilon, "accuracy": accuracy,
          "noise_multiplier": private.noise_multiplier, "steps": steps,
          "ledger_epsilon_rdp": float(acc.get_epsilon(DELTA, "rdp")),
          "train_seconds": seconds}


def _mlp_and_cnn_steps(batch: int, bands: int, buffers: int, n_steps: int) -> tuple[dict, dict]:
  steps, memory = {}, {}
  for name, model in (("mlp", models.MLP(hidden_sizes=(512, 512))), ("cnn", models.SmallCNN())):
    x = jax.random.normal(jax.random.key(0), (batch, 784))
    y = jax.random.randint(jax.random.key(1), (batch,), 0, 10)
    params = jax.jit(model.init)(jax.random.key(2), x[:1])["params"]
    size = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))

    def per_example(p, xi, yi, model=model):
      return optax.softmax_cross_entropy_with_integer_labels(
          model.apply({"params": p}, xi[None])[0], yi)

    grad_fn = clipping.clipped_grad(per_example, l2_clip_norm=CLIP, batch_argnums=(1, 2),
                                    method="auto")
    mask = jnp.ones((batch,), bool)
    noise = {
        "dpsgd": transforms.noisy_aggregate(1.0, CLIP, float(batch), jax.random.key(3)),
        # As make_private builds them: its sampler refuses step n + 1 on the host, so the
        # transform needs no in-graph callback (step_check="caller").
        "bandmf": correlated.correlated_noise(
            correlated.BandMF(0.5 ** np.arange(bands)), n_steps, 1.0, CLIP, float(batch),
            jax.random.key(3), step_check="caller"),
        "blt": correlated.correlated_noise(
            correlated.BLT(np.linspace(0.5, 0.99, buffers), np.full(buffers, 0.1)), n_steps,
            1.0, CLIP, float(batch), jax.random.key(3), step_check="caller"),
    }
    for mode, tx in noise.items():
      tx = optax.chain(tx, optax.sgd(LR, momentum=MOMENTUM))

      @functools.partial(jax.jit, donate_argnums=(1,))  # the state, as make_private does
      def step(p, s, xb, yb, tx=tx, grad_fn=grad_fn):
        g, _ = grad_fn(p, xb, yb, mask=mask)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

      state = tx.init(params)
      steps[f"{name}/{mode}"] = (step, (params, state, x, y))
      extra = {"dpsgd": 0, "bandmf": bands - 1, "blt": buffers}[mode]
      memory[f"{name}/{mode}"] = {"params": size, "noise_state_floats": size * extra,
                                  "noise_state_mib": size * extra * 4 / 2 ** 20}
  return steps, memory


def _time_rounds(steps: dict, rounds: int) -> dict:
  """Minimum over interleaved rounds; each step's donated state is replaced by its output."""
  states = {}
  for key, (fn, (p, s, x, y)) in steps.items():
    states[key] = jax.block_until_ready(fn(p, s, x, y))[1]
  best = {k: math.inf for k in steps}
  for _ in range(rounds):
    for key, (fn, (p, _, x, y)) in steps.items():
      t0 = time.perf_counter()
      states[key] = jax.block_until_ready(fn(p, states[key], x, y))[1]
      best[key] = min(best[key], time.perf_counter() - t0)
  return best


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--epsilons", type=float, nargs="*", default=None)
  parser.add_argument("--epochs", type=int, default=None)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--csv", default=None, help="also write the accuracy table to this CSV")
  parser.add_argument("--accuracy-only", action="store_true",
                      help="skip the optimisation-time and step-time sections (extra seeds)")
  parser.add_argument("--summarize", nargs="+", default=None, metavar="CSV",
                      help="print the accuracy table (mean and sd over seeds) of these CSVs, "
                           "and nothing else")
  args = parser.parse_args(argv)
  if args.summarize:
    return summarize(args.summarize)
  epsilons = args.epsilons or ([2.0, 8.0] if args.quick else [1.0, 2.0, 4.0, 8.0])
  epochs = args.epochs or (1 if args.quick else 3)
  load = os.getloadavg()[0]
  print(f"backend={jax.default_backend()} batch={args.batch} epochs={epochs} "
        f"load_avg_1min={load:.2f}")
  out: dict = {"backend": jax.default_backend(), "batch": args.batch, "epochs": epochs,
               "delta": DELTA, "momentum": MOMENTUM, "learning_rate": LR,
               "load_avg_1min_start": load}

  if not args.accuracy_only:
    _speed_sections(args, out)
  _accuracy_section(args, out, epsilons, epochs)
  out["load_avg_1min_end"] = os.getloadavg()[0]
  print(json.dumps(out))
  return out


def _speed_sections(args, out: dict) -> None:
  # 3. Strategy optimisation time.
  n_opt = 500 if args.quick else 2000
  t0 = time.perf_counter()
  optimize.optimize_bandmf(n_opt, 64, momentum=MOMENTUM)
  t_band = time.perf_counter() - t0
  t0 = time.perf_counter()
  optimize.optimize_blt(n_opt, BLT_BUFFERS, momentum=MOMENTUM)
  t_blt = time.perf_counter() - t0
  out["optimisation_seconds"] = {"n": n_opt, "bandmf_64": t_band, f"blt_{BLT_BUFFERS}": t_blt}
  print(f"strategy optimisation, n={n_opt}: BandMF 64 bands {t_band:.2f} s, "
        f"BLT {BLT_BUFFERS} buffers {t_blt:.2f} s")

  # 2. Step time and memory.
  steps, memory = _mlp_and_cnn_steps(args.batch, 64, BLT_BUFFERS, 1000)
  best = _time_rounds(steps, 5 if args.quick else 15)
  out["step_ms"] = {k: 1e3 * v for k, v in best.items()}
  out["step_over_dpsgd"] = {k: best[k] / best[k.split("/")[0] + "/dpsgd"] for k in best}
  out["memory"] = memory
  print("step time (ms) and ratio to DP-SGD's step; noise state:")
  for k in best:
    print(f"  {k:12s} {1e3 * best[k]:8.2f} ms  x{out['step_over_dpsgd'][k]:.3f}  "
          f"state {memory[k]['noise_state_mib']:.1f} MiB")


def _accuracy_section(args, out: dict, epsilons, epochs: int) -> None:
  # 1. Accuracy at equal (epsilon, delta).
  data = _load_mnist(args.quick)
  n = len(data[1])
  per_epoch = n // args.batch
  steps_total = epochs * per_epoch
  rows = []
  blt = optimize.optimize_blt(steps_total, BLT_BUFFERS, momentum=MOMENTUM,
                              max_participations=epochs, min_separation=per_epoch)
  for eps in epsilons:
    bands, scores, band_strategy = choose_bands(eps, steps_total, args.batch, n)
    print(f"eps={eps:g}: bands chosen {bands} (sigma^2 x error: "
          + ", ".join(f"{b}: {s:.3g}" for b, s in scores.items()) + ")")
    runs = [("dpsgd", None, None), ("bandmf", band_strategy, bands), ("blt", blt, per_epoch)]
    for mech, strategy, b in runs:
      r = train_one(mech, eps, data, batch=args.batch, epochs=epochs, seed=args.seed,
                    strategy=strategy, min_separation=b)
      r["bands_or_groups"] = b
      rows.append(r)
      print(f"  {mech:7s} eps={eps:g} acc={r['accuracy']:.4f} sigma={r['noise_multiplier']:.3f} "
            f"ledger_eps(rdp)={r['ledger_epsilon_rdp']:.3f} ({r['train_seconds']:.0f} s)")
  out["accuracy"] = rows
  for eps in epsilons:
    acc = {r["mechanism"]: r["accuracy"] for r in rows if r["epsilon"] == eps}
    out.setdefault("accuracy_gain_over_dpsgd", {})[str(eps)] = {
        m: acc[m] - acc["dpsgd"] for m in ("bandmf", "blt")}
  if args.csv:
    import csv  # pylint: disable=import-outside-toplevel
    with open(args.csv, "w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=list(rows[0]))
      w.writeheader()
      w.writerows(rows)


def summarize(paths) -> dict:
  """The markdown table of test accuracy (mean and sd over seeds) from benchmark CSVs."""
  import csv  # pylint: disable=import-outside-toplevel
  rows = []
  for path in paths:
    with open(path, newline="") as f:
      rows.extend(csv.DictReader(f))
  cells: dict = {}
  for r in rows:
    cells.setdefault((float(r["epsilon"]), r["mechanism"]), []).append(float(r["accuracy"]))
  eps_list = sorted({e for e, _ in cells})
  mechs = ("dpsgd", "bandmf", "blt")
  seeds = len({r["seed"] for r in rows})
  print(f"| epsilon | DP-SGD | BandMF | BLT | BandMF - DP-SGD | BLT - DP-SGD |  ({seeds} seeds)")
  print("| --- | --- | --- | --- | --- | --- |")
  table = {}
  for e in eps_list:
    mean = {m: float(np.mean(cells[(e, m)])) for m in mechs}
    sd = {m: float(np.std(cells[(e, m)], ddof=1)) if len(cells[(e, m)]) > 1 else 0.0
          for m in mechs}
    table[str(e)] = {"mean": mean, "sd": sd}
    print(f"| {e:g} | " + " | ".join(f"{mean[m]:.4f} ± {sd[m]:.4f}" for m in mechs)
          + f" | {mean['bandmf'] - mean['dpsgd']:+.4f} | {mean['blt'] - mean['dpsgd']:+.4f} |")
  out = {"seeds": seeds, "accuracy": table}
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main()
