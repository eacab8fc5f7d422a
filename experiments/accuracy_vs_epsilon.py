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
lambda (on the fit split and on the full set) is computed once and certified
within ``tol/lambda`` in float64
(:func:`jaxdp.training.output_perturbation.certified_fit`, never refused);
model sensitivity only adds calibrated noise to it (exactly what
:func:`jaxdp.training.output_perturbation.model_sensitivity` does per call:
:func:`~jaxdp.training.output_perturbation.output_perturbation_calibration`
with ``solver_tol = tol``, ``Delta = 2K/(N lambda) + 2 tol/lambda``, and
:func:`~jaxdp.training.output_perturbation.add_noise_float64`). Loss
perturbation solves one perturbed problem per draw, batched over the draws
(one compile per data shape), each started from the non-private minimiser at
the same lambda (``warm_start``: the release is certified within
``tol/Lambda`` of the exact perturbed minimiser whatever the start, so the
guarantee is unchanged; :mod:`jaxdp.training.objective_perturbation`).

Dataset presets (``config.presets``) fill the fields left empty (epsilon and
lambda grids, draws, loss perturbation's tol); see the config's docstring for
what the ``mnist`` preset reduces and why. The resolved values are what the
point log's fingerprint and ``results.json`` record.

Results go to ``<out_dir>/<name>/<dataset>/`` (``results.csv``, ``results.json``,
``accuracy_vs_epsilon.png``). Each finished point is appended to
``points.jsonl`` as it completes (flushed and fsync'd; ``results.csv`` is
rewritten after each point); re-running the same command resumes, skipping
the points already there (see :class:`jaxdp.results_io.PointLog`). A point's
random keys depend only on the point (not on the grid or on what was already
done), so a resumed run gives the same numbers as an uninterrupted one.
"""

from __future__ import annotations

import copy
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

from jaxdp import data as jdata
from jaxdp import results_io
from jaxdp.training import objective_perturbation, output_perturbation

CONFIG_FILE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "accuracy_vs_epsilon.py"
METHODS = ("non_private", "model_sensitivity", "loss_perturbation")
# Settings that change a point's result (the grid itself -- methods, epsilons,
# deltas -- only selects which points exist; out_dir/batch_mode change nothing).
# Fingerprinted after the dataset presets are resolved.
RESULT_FIELDS = ("dataset", "n_train", "pca_dims", "l2_regs", "validation_fraction", "num_seeds",
                 "val_seeds", "max_iter", "tol", "objective_tol", "warm_start", "seed")
# Fields that take presets[dataset] (else presets["default"]) when left at these values.
PRESET_FIELDS = {"epsilons": (), "l2_regs": (), "num_seeds": 0, "val_seeds": 0,
                 "objective_tol": 0.0}


def load_data(config):
  return jdata.load(config.dataset, data_dir=config.data_dir or None,
                    n_train=config.n_train or None, seed=config.seed,
                    pca_dims=config.pca_dims or None, unit_ball="project")


def resolve_config(config):
  """A copy of ``config`` with the empty :data:`PRESET_FIELDS` filled from ``config.presets``."""
  config = copy.deepcopy(config)
  presets = config.presets.to_dict()
  preset = dict(presets["default"], **presets.get(config.dataset, {}))
  with config.unlocked():
    for field, empty in PRESET_FIELDS.items():
      value = config[field]
      if (tuple(value) if isinstance(value, (tuple, list)) else value) == empty:
        config[field] = type(empty)(preset[field]) if isinstance(empty, tuple) else preset[field]
  if config.num_seeds < 1 or config.val_seeds < 1:
    raise ValueError(f"config.num_seeds and config.val_seeds must be >= 1, got "
                     f"{config.num_seeds}, {config.val_seeds}.")
  return config


def dataset_epsilons(config) -> tuple[float, ...]:
  """The epsilon grid: ``config.epsilons``, or the dataset preset's when it is empty."""
  return tuple(float(e) for e in resolve_config(config).epsilons)


@jax.jit
def _accuracies(weights, x, y):
  """Accuracy of each model in a ``(M, D, C)`` stack."""
  return jax.vmap(lambda w: jnp.mean(jnp.argmax(x @ w, axis=-1) == y))(weights)


class _NonPrivateFits:
  """Certified non-private minimisers, one per (split, lambda), computed on first use.

  Each is :func:`jaxdp.training.output_perturbation.certified_fit`: certified in
  float64 within ``tol/lambda`` of the exact minimiser (repaired, never refused,
  when L-BFGS stops short), the point model sensitivity adds its noise to.
  """

  def __init__(self, splits, num_classes, config):
    self._splits, self._c, self._config, self._cache = splits, num_classes, config, {}
    self.seconds = 0.0

  def certified(self, split: str, l2_reg: float) -> np.ndarray:
    """Float64 certified weights ``(D, C)``."""
    if (split, l2_reg) not in self._cache:
      start = time.time()
      x, y = self._splits[split]
      _, cert = output_perturbation.certified_fit(
          x, y, num_classes=self._c, l2_reg=l2_reg, max_iter=self._config.max_iter,
          tol=self._config.tol)
      self._cache[split, l2_reg] = cert.weights
      self.seconds += time.time() - start
    return self._cache[split, l2_reg]

  def __call__(self, split: str, l2_reg: float) -> jax.Array:
    """Float32 certified weights ``(D, C)``."""
    return jnp.asarray(self.certified(split, l2_reg), jnp.float32)


_AMP_FRACTION = 0.01  # loss_perturbation's default share of epsilon for the output noise (AMP)


def private_models(method, keys, split, l2_reg, eps, delta, *, splits, fits, num_classes, config,
                   timings=None):
  """``(M, D, C)`` weights of ``method`` on ``split`` (``"fit"`` or ``"full"``), one per key."""
  x, y = splits[split]
  if method == "non_private":
    return fits(split, l2_reg)[None]
  if method == "model_sensitivity":
    # = output_perturbation.model_sensitivity(keys, x, y, ...), sharing the certified fit across
    # points: Alg. 1 (delta = 0) / Alg. 3 (delta > 0), Delta = 2K/(N lambda) + 2 tol/lambda.
    cal = output_perturbation.output_perturbation_calibration(
        num_examples=int(x.shape[0]), l2_reg=l2_reg, epsilon=eps, delta=delta,
        solver_tol=config.tol)
    return output_perturbation.add_noise_float64(keys, fits.certified(split, l2_reg), cal)
  if method == "loss_perturbation":
    # Approximate Minima Perturbation, certified within objective_tol/Lambda in float64
    # (objective_tol < 0: the AMP default, output noise ~1% of the objective noise).
    init = fits(split, l2_reg) if config.warm_start else None
    start = time.time()
    relation = config.get("neighbouring", "replace_one")
    if relation == "add_remove":
      # Paper 000 App. B.2 (add/remove): l2_reg = 0 and rho = lambda N + 2LC/eps_1, with
      # eps_1 = (1 - amp_fraction) eps the objective's share under AMP: the same mean
      # objective as the replace-one fit at lambda (extra_l2 = rho / N).
      eps_objective = (1.0 - _AMP_FRACTION) * eps
      relaxed = dict(l2_reg=0.0, neighbouring="add_remove", amp_fraction=_AMP_FRACTION,
                     rho=float(l2_reg * x.shape[0] + objective_perturbation.loss_perturbation_rho(
                         eps_objective, num_classes)))
    else:
      relaxed = dict(l2_reg=l2_reg)
    w = objective_perturbation.loss_perturbation(
        keys, x, y, num_classes=num_classes, epsilon=eps, delta=delta,
        batch_mode=config.batch_mode, max_iter=config.max_iter,
        tol=config.objective_tol if config.objective_tol > 0 else None, init_weights=init,
        **relaxed).weights
    if timings is not None:
      timings["loss_perturbation_fits"] += time.time() - start
      timings["loss_perturbation_count"] += int(np.shape(keys)[0])
    return w
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


def run_point(point, *, splits, fits, num_classes, config, x_val, y_val, x_test, y_test,
              timings=None):
  """One finished point: lambda chosen on the held-out split, accuracy of the final models."""
  method, eps, delta = point
  root = jax.random.fold_in(jax.random.key(config.seed), results_io.point_seed(point))
  sel_key, test_key = jax.random.split(root)
  val_seeds = config.val_seeds
  kw = dict(splits=splits, fits=fits, num_classes=num_classes, config=config, timings=timings)
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
  config = resolve_config(config)
  points = grid(config)
  log, out = results_io.open_point_log(config, RESULT_FIELDS)
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

  timings = dict(loss_perturbation_fits=0.0, loss_perturbation_count=0)
  for point in tqdm(todo, desc=f"{config.dataset} points"):
    row = run_point(point, splits=splits, fits=fits, num_classes=c, config=config, x_val=x_val,
                    y_val=y_val, x_test=x_test, y_test=y_test, timings=timings)
    log.append(point, [row])
    results_io.write_csv_atomic(out / "results.csv", finished_rows())
  rows = finished_rows()
  elapsed = time.time() - start

  results_io.write_csv_atomic(out / "results.csv", rows)
  meta = dict(config=config.to_dict(), dataset=repr(ds), n_train=int(len(y)),
              n_test=int(len(y_test)), num_features=int(x.shape[1]), num_classes=int(c),
              seconds_this_run=elapsed, points_computed_this_run=len(todo),
              seconds_nonprivate_fits=fits.seconds,
              seconds_loss_perturbation=timings["loss_perturbation_fits"],
              loss_perturbation_fits=timings["loss_perturbation_count"],
              backend=jax.default_backend(), rows=rows)
  results_io.write_json_atomic(out / "results.json", meta)
  plot(rows, config, out / "accuracy_vs_epsilon.png")
  print(f"wrote {out}/results.csv, results.json, accuracy_vs_epsilon.png "
        f"({len(todo)} points computed in {elapsed:.1f} s: certified non-private fits "
        f"{fits.seconds:.1f} s, {timings['loss_perturbation_count']} loss-perturbation fits "
        f"{timings['loss_perturbation_fits']:.1f} s)")
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
