"""Accuracy vs epsilon of private linear models (paper 000 Sec. 4.2, Fig. 1).

Usage (from any directory; the default config is the one next to this script)::

  python experiments/accuracy_vs_epsilon.py
  JAXDP_DATA_DIR=../shared/data python experiments/accuracy_vs_epsilon.py --config.dataset=mnist

For each method in ``config.methods`` (non-private, model sensitivity = paper 000
Alg. 1/3, loss perturbation = Alg. 4/5), each delta and each epsilon (one
*point*), lambda is chosen on a held-out split of the training set (mean
validation accuracy over ``val_seeds`` noise draws), then ``num_seeds`` private
models are trained on the full training set in one batched call (one key per
seed) and evaluated on the test set.

Work shared between points is done once: the non-private minimiser for each
lambda (on the fit split and on the full set) is computed once and model
sensitivity only adds calibrated noise to it (exactly what
:func:`jaxdp.training.output_perturbation.model_sensitivity` does per call,
with :func:`~jaxdp.training.output_perturbation.output_perturbation_calibration`
and :func:`~jaxdp.training.output_perturbation.perturb_weights`). Loss
perturbation solves one perturbed problem per draw, batched over the seeds
(``lax.map`` on CPU, ``vmap`` on accelerators) with one compile per data shape.

Results go to ``<out_dir>/<name>/<dataset>/`` (``results.csv``, ``results.json``,
``accuracy_vs_epsilon.png``). Each finished point is appended to
``points.jsonl`` as it completes (flushed and fsync'd; ``results.csv`` is
rewritten after each point); re-running the same command resumes, skipping
the points already there (see :class:`jaxdp.results_io.PointLog`). A point's
random keys depend only on the point (not on the grid or on what was already
done), so a resumed run gives the same numbers as an uninterrupted one.
"""

from __future__ import annotations

import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from ml_collections import config_flags
from tqdm import tqdm

import jaxdp
from jaxdp import data as jdata
from jaxdp import results_io
from jaxdp.training import linear, objective_perturbation, output_perturbation

CONFIG_FILE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "accuracy_vs_epsilon.py"
METHODS = ("non_private", "model_sensitivity", "loss_perturbation")
# Settings that change a point's result (the grid itself -- methods, epsilons,
# deltas -- only selects which points exist; out_dir/batch_mode change nothing).
RESULT_FIELDS = ("dataset", "n_train", "pca_dims", "l2_regs", "validation_fraction", "num_seeds",
                 "val_seeds", "max_iter", "tol", "objective_tol", "seed")


def load_data(config):
  return jdata.load(config.dataset, data_dir=config.data_dir or None,
                    n_train=config.n_train or None, seed=config.seed,
                    pca_dims=config.pca_dims or None, unit_ball="project")


def dataset_epsilons(config) -> tuple[float, ...]:
  """``config.epsilons``, or the dataset's default grid when it is empty."""
  if config.epsilons:
    return tuple(float(e) for e in config.epsilons)
  grids = config.default_epsilons.to_dict()
  return tuple(float(e) for e in grids.get(config.dataset, grids["default"]))


@jax.jit
def _accuracies(weights, x, y):
  """Accuracy of each model in a ``(M, D, C)`` stack."""
  return jax.vmap(lambda w: jnp.mean(jnp.argmax(x @ w, axis=-1) == y))(weights)


class _NonPrivateFits:
  """Non-private minimisers, one per (split, lambda), computed on first use."""

  def __init__(self, splits, num_classes, config):
    self._splits, self._c, self._config, self._cache = splits, num_classes, config, {}

  def __call__(self, split: str, l2_reg: float) -> jax.Array:
    if (split, l2_reg) not in self._cache:
      x, y = self._splits[split]
      model = linear.fit_linear(x, y, num_classes=self._c, l2_reg=l2_reg,
                                max_iter=self._config.max_iter, tol=self._config.tol)
      # Output perturbation's guarantee needs the fit to reach tol (nothing released otherwise).
      linear.require_converged(model.info, "non-private fit")
      self._cache[split, l2_reg] = model.weights
    return self._cache[split, l2_reg]


def private_models(method, keys, split, l2_reg, eps, delta, *, splits, fits, num_classes, config):
  """``(M, D, C)`` weights of ``method`` on ``split`` (``"fit"`` or ``"full"``), one per key."""
  x, y = splits[split]
  if method == "non_private":
    return fits(split, l2_reg)[None]
  if method == "model_sensitivity":
    # = output_perturbation.model_sensitivity(keys, x, y, ...), sharing the fit across points:
    # Alg. 1 (delta = 0) / Alg. 3 (delta > 0), Delta = 2K/(N lambda) + 2 tol/lambda.
    cal = output_perturbation.output_perturbation_calibration(
        num_examples=int(x.shape[0]), l2_reg=l2_reg, epsilon=eps, delta=delta,
        solver_tol=config.tol)
    return output_perturbation.perturb_weights(keys, fits(split, l2_reg), cal)
  if method == "loss_perturbation":
    # Approximate Minima Perturbation: objective_tol = 0 picks the AMP default tol
    # (output noise ~1% of the objective noise; certified in float64).
    return objective_perturbation.loss_perturbation(
        keys, x, y, num_classes=num_classes, l2_reg=l2_reg, epsilon=eps, delta=delta,
        batch_mode=config.batch_mode, max_iter=config.max_iter,
        tol=config.objective_tol or None).weights
  raise ValueError(f"unknown method {method!r}; use one of {METHODS}.")


def grid(config) -> list[tuple[str, float, float]]:
  """The points ``(method, epsilon, delta)`` of the figure, in plotting order."""
  unknown = set(config.methods) - set(METHODS)
  if unknown:
    raise ValueError(f"config.methods must be a subset of {METHODS}, got {sorted(unknown)}.")
  points = []
  for method in config.methods:
    if method == "non_private":
      points.append((method, math.inf, 0.0))
      continue
    for delta in config.deltas:
      for eps in dataset_epsilons(config):
        points.append((method, float(eps), float(delta)))
  return points


def run_point(point, *, splits, fits, num_classes, config, x_val, y_val, x_test, y_test):
  """One finished point: lambda chosen on the held-out split, accuracy of the final models."""
  method, eps, delta = point
  root = jax.random.fold_in(jax.random.key(config.seed), results_io.point_seed(point))
  sel_key, test_key = jax.random.split(root)
  val_seeds = config.val_seeds or config.num_seeds
  kw = dict(splits=splits, fits=fits, num_classes=num_classes, config=config)
  val_scores = []
  for i, lam in enumerate(config.l2_regs):
    keys = jax.random.split(jax.random.fold_in(sel_key, i), val_seeds)
    w = private_models(method, keys, "fit", float(lam), eps, delta, **kw)
    val_scores.append(float(jnp.mean(_accuracies(w, x_val, y_val))))
  best = int(np.argmax(val_scores))
  lam = float(config.l2_regs[best])
  keys = jax.random.split(test_key, config.num_seeds)
  accs = np.asarray(_accuracies(private_models(method, keys, "full", lam, eps, delta, **kw),
                                x_test, y_test), np.float64)
  return dict(method=method, epsilon=eps, delta=delta, l2_reg=lam, val_accuracy=val_scores[best],
              test_accuracy_mean=float(accs.mean()), test_accuracy_std=float(accs.std()),
              num_models=int(accs.size))


def main(config) -> list[dict]:
  start = time.time()
  points = grid(config)
  out = results_io.run_dir(config.out_dir, config.name, config.dataset, n_train=config.n_train,
                           pca_dims=config.pca_dims)
  log = results_io.PointLog(out / "points.jsonl",
                            {f: config[f] for f in RESULT_FIELDS}
                            | {"experiment": config.name, "jaxdp": jaxdp.__version__})
  todo = [p for p in points if p not in log]
  print(f"{config.name} on {config.dataset}: {len(points) - len(todo)} of {len(points)} points "
        f"already in {out / 'points.jsonl'}", file=sys.stderr)

  ds = load_data(config)
  x, y, c = np.asarray(ds.x_train), np.asarray(ds.y_train), ds.num_classes
  rng = np.random.default_rng(config.seed)
  perm = rng.permutation(len(y))
  n_val = int(round(config.validation_fraction * len(y)))
  val_idx, fit_idx = perm[:n_val], perm[n_val:]
  splits = {"fit": (x[fit_idx], y[fit_idx]), "full": (x, y)}
  x_val, y_val = jnp.asarray(x[val_idx]), jnp.asarray(y[val_idx])
  x_test, y_test = jnp.asarray(ds.x_test), jnp.asarray(ds.y_test)
  fits = _NonPrivateFits(splits, c, config)

  def finished_rows():
    return [log.get(p)[0] for p in points if p in log]

  for point in tqdm(todo, desc=f"{config.dataset} points"):
    row = run_point(point, splits=splits, fits=fits, num_classes=c, config=config, x_val=x_val,
                    y_val=y_val, x_test=x_test, y_test=y_test)
    log.append(point, [row])
    results_io.write_csv_atomic(out / "results.csv", finished_rows())
  rows = finished_rows()
  elapsed = time.time() - start

  results_io.write_csv_atomic(out / "results.csv", rows)
  meta = dict(config=config.to_dict(), dataset=repr(ds), n_train=int(len(y)),
              n_test=int(len(y_test)), num_features=int(x.shape[1]), num_classes=int(c),
              seconds_this_run=elapsed, points_computed_this_run=len(todo),
              backend=jax.default_backend(), rows=rows)
  results_io.write_json_atomic(out / "results.json", meta)
  plot(rows, config, out / "accuracy_vs_epsilon.png")
  print(f"wrote {out}/results.csv, results.json, accuracy_vs_epsilon.png "
        f"({len(todo)} points computed in {elapsed:.1f} s)")
  for r in rows:
    print(f"{r['method']:>18s} ε={r['epsilon']:<7g} δ={r['delta']:<7g} λ={r['l2_reg']:<7g}"
          f" acc={r['test_accuracy_mean']:.4f} ± {r['test_accuracy_std']:.4f} "
          f"(s.d. over {r['num_models']} draws)")
  return rows


def plot(rows, config, path):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  deltas = list(config.deltas)
  fig, axes = plt.subplots(1, len(deltas), figsize=(5.5 * len(deltas), 4.4), squeeze=False)
  base = [r for r in rows if r["method"] == "non_private"]
  draws = sorted({r["num_models"] for r in rows if r["method"] != "non_private"})
  for ax, delta in zip(axes[0], deltas):
    for method in config.methods:
      if method == "non_private":
        continue
      rs = sorted((r for r in rows if r["method"] == method and r["delta"] == delta),
                  key=lambda r: r["epsilon"])
      if rs:
        ax.errorbar([r["epsilon"] for r in rs], [r["test_accuracy_mean"] for r in rs],
                    yerr=[r["test_accuracy_std"] for r in rs], marker="o", capsize=3,
                    label=method.replace("_", " "))
    if base:
      ax.axhline(base[0]["test_accuracy_mean"], color="k", ls="--", label="non-private")
    ax.set_xscale("log")
    ax.set_xlabel("privacy loss ε")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{config.dataset}, δ = {delta:g}")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
  n = "/".join(str(d) for d in draws) or "?"
  fig.text(0.5, 0.01, f"Mean test accuracy; error bars: ±1 s.d. over {n} independent noise draws "
           "per point (λ chosen on a held-out split).", ha="center", va="bottom", fontsize=8)
  fig.tight_layout(rect=(0, 0.04, 1, 1))
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  # Defined here (not at import) so tests can import main() without registering absl flags.
  _CONFIG = config_flags.DEFINE_config_file("config", str(CONFIG_FILE), "experiment config")
  app.run(lambda argv: main(_CONFIG.value) and None)  # exit status 0, not the rows
