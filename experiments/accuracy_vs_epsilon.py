"""Accuracy vs epsilon of private linear models (paper 000 Sec. 4.2, Fig. 1).

Usage::

  python experiments/accuracy_vs_epsilon.py --config=configs/accuracy_vs_epsilon.py
  JAXDP_DATA_DIR=../shared/data python experiments/accuracy_vs_epsilon.py \
      --config=configs/accuracy_vs_epsilon.py --config.dataset=mnist --config.num_seeds=100

For each method in ``config.methods`` (non-private, model sensitivity = paper 000
Alg. 1/3, loss perturbation = Alg. 4/5), each delta and each epsilon, lambda is
chosen on a held-out split of the training set, then ``num_seeds`` private models
are trained on the full training set in one batched call (one key per seed) and
evaluated on the test set. Writes ``<out_dir>/<name>/results.csv``,
``results.json`` and ``accuracy_vs_epsilon.png``.
"""

from __future__ import annotations

import csv
import json
import math
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from ml_collections import config_flags
from tqdm import tqdm

from jaxdp.results_io import strict_json
from jaxdp import data as jdata
from jaxdp.training import linear, objective_perturbation, output_perturbation

def load_data(config):
  ds = jdata.load(config.dataset, data_dir=config.data_dir or None,
                  n_train=config.n_train or None, seed=config.seed,
                  pca_dims=config.pca_dims or None, unit_ball="project")
  return ds


@jax.jit
def _accuracies(weights, x, y):
  """Accuracy of each model in a ``(M, D, C)`` stack."""
  return jax.vmap(lambda w: jnp.mean(jnp.argmax(x @ w, axis=-1) == y))(weights)


def private_models(method, key_batch, x, y, num_classes, l2_reg, eps, delta, config):
  """``(M, D, C)`` weights of ``method`` for each key (M = num_seeds)."""
  common = dict(max_iter=config.max_iter, tol=config.tol)
  if method == "non_private":
    w = linear.fit_linear(x, y, num_classes=num_classes, l2_reg=l2_reg, **common).weights
    return w[None]
  if method == "model_sensitivity":
    return output_perturbation.model_sensitivity(
        key_batch, x, y, num_classes=num_classes, l2_reg=l2_reg, epsilon=eps, delta=delta,
        **common).weights
  if method == "loss_perturbation":
    # Perturbed objectives carry noise terms of size ||b||/N, so float32 gradients
    # have a rounding floor near 1e-6; use scipy's default gtol (1e-5) here. The
    # output-perturbation tol above enters its sensitivity (2 tol/lambda), so it
    # stays tight.
    return objective_perturbation.loss_perturbation(
        key_batch, x, y, num_classes=num_classes, l2_reg=l2_reg, epsilon=eps, delta=delta,
        batch_mode=config.batch_mode, max_iter=config.max_iter, tol=config.objective_tol).weights
  raise ValueError(f"unknown method {method!r}; use non_private, model_sensitivity or loss_perturbation.")


def main(config) -> list[dict]:
  start = time.time()
  ds = load_data(config)
  x, y, c = ds.x_train, ds.y_train, ds.num_classes
  rng = np.random.default_rng(config.seed)
  perm = rng.permutation(len(y))
  n_val = int(round(config.validation_fraction * len(y)))
  val_idx, fit_idx = perm[:n_val], perm[n_val:]
  x_fit, y_fit, x_val, y_val = x[fit_idx], y[fit_idx], x[val_idx], y[val_idx]
  x_test, y_test = jnp.asarray(ds.x_test), jnp.asarray(ds.y_test)
  root = jax.random.key(config.seed)

  jobs = []
  for method in config.methods:
    for delta in config.deltas:
      for eps in (config.epsilons if method != "non_private" else (math.inf,)):
        if method == "non_private" and delta != config.deltas[0]:
          continue
        jobs.append((method, float(eps), float(delta)))

  rows = []
  for j, (method, eps, delta) in enumerate(tqdm(jobs, desc=f"{config.dataset} jobs")):
    job_key = jax.random.fold_in(root, j)
    sel_key, test_key = jax.random.split(job_key)
    # 1) lambda selection on the held-out split (mean accuracy over seeds).
    val_scores = []
    for i, lam in enumerate(config.l2_regs):
      keys = jax.random.split(jax.random.fold_in(sel_key, i), config.num_seeds)
      w = private_models(method, keys, x_fit, y_fit, c, lam, eps, delta, config)
      val_scores.append(float(jnp.mean(_accuracies(w, jnp.asarray(x_val), jnp.asarray(y_val)))))
    best = int(np.argmax(val_scores))
    lam = float(config.l2_regs[best])
    # 2) final models on the whole training set, evaluated on the test set.
    keys = jax.random.split(test_key, config.num_seeds)
    w = private_models(method, keys, x, y, c, lam, eps, delta, config)
    accs = np.asarray(_accuracies(w, x_test, y_test))
    rows.append(dict(method=method, epsilon=eps, delta=delta, l2_reg=lam,
                     val_accuracy=val_scores[best], test_accuracy_mean=float(accs.mean()),
                     test_accuracy_std=float(accs.std()), num_models=int(accs.size)))
  elapsed = time.time() - start

  out = pathlib.Path(config.out_dir) / config.name
  out.mkdir(parents=True, exist_ok=True)
  with open(out / "results.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  meta = dict(config=config.to_dict(), dataset=repr(ds), n_train=int(len(y)),
              n_test=int(len(y_test)), num_features=int(x.shape[1]), num_classes=int(c),
              seconds=elapsed, backend=jax.default_backend(), rows=rows)
  with open(out / "results.json", "w") as f:
    json.dump(strict_json(meta), f, indent=2, default=str, allow_nan=False)
  plot(rows, config, out / "accuracy_vs_epsilon.png")
  print(f"wrote {out}/results.csv, results.json, accuracy_vs_epsilon.png in {elapsed:.1f} s")
  for r in rows:
    print(f"{r['method']:>18s} eps={r['epsilon']:<7g} delta={r['delta']:<7g} lambda={r['l2_reg']:<7g}"
          f" acc={r['test_accuracy_mean']:.4f} +- {r['test_accuracy_std']:.4f}")
  return rows


def plot(rows, config, path):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  deltas = list(config.deltas)
  fig, axes = plt.subplots(1, len(deltas), figsize=(5.5 * len(deltas), 4), squeeze=False)
  base = [r for r in rows if r["method"] == "non_private"]
  for ax, delta in zip(axes[0], deltas):
    for method in config.methods:
      if method == "non_private":
        continue
      rs = sorted((r for r in rows if r["method"] == method and r["delta"] == delta),
                  key=lambda r: r["epsilon"])
      ax.errorbar([r["epsilon"] for r in rs], [r["test_accuracy_mean"] for r in rs],
                  yerr=[r["test_accuracy_std"] for r in rs], marker="o", capsize=3,
                  label=method.replace("_", " "))
    if base:
      ax.axhline(base[0]["test_accuracy_mean"], color="k", ls="--", label="non-private")
    ax.set_xscale("log")
    ax.set_xlabel("privacy loss epsilon")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{config.dataset}, delta = {delta:g}")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  # Defined here (not at import) so tests can import main() without registering absl flags.
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/accuracy_vs_epsilon.py",
                                            "experiment config")
  app.run(lambda argv: main(_CONFIG.value) and None)  # exit status 0, not the rows
