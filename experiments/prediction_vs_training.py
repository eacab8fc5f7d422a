"""Private prediction vs private training: accuracy as a function of the inference budget B.

Paper 000 (``../shared/papers/000_tradeoffs_of_private_prediction.md``) Sec. 4.2,
"Accuracy as a function of inference budget", Fig. 2.

Usage::

  python experiments/prediction_vs_training.py --config=configs/prediction_vs_training.py
  JAXDP_DATA_DIR=../shared/data python experiments/prediction_vs_training.py \
      --config=configs/prediction_vs_training.py --config.dataset=mnist \
      --config.epsilons=1.0 --config.num_seeds=100 --config.num_teachers=256

Methods (all for a total guarantee ``(eps, delta)`` on the training set):

* private TRAINING -- model sensitivity (paper 000 App. B.1, Alg. 1 / 3) and loss
  perturbation (App. B.2, Alg. 4 / 5). The released model is private, so any
  number of predictions is post-processing: the accuracy is the same for every B
  (one row per B with identical numbers; horizontal lines in the figure).
* private PREDICTION -- noise calibrated to B answers:

  - prediction sensitivity (Sec. 3.2, App. C.1, Alg. 6 / 7, Thm. 5 / 6): logits
    ``theta^T x + b`` of the non-private L2-regularised minimiser, ``b`` L2-Laplace
    with ``beta = N lambda eps / (2 K B)`` (delta = 0) or Gaussian with the
    smaller of the basic / advanced composition sigmas (delta > 0), computed by
    :func:`jaxdp.prediction.calibrate_prediction_sensitivity` exactly as
    :class:`jaxdp.prediction.PredictionSensitivityPredictor` does for budget B
    (including its conservative float32 rounding of the scale). One change for
    correctness: Lemma 1 (``||theta(D) - theta(D')|| <= 2K/(N lambda)``) holds for
    the exact minimiser; L-BFGS stops at ``||grad J|| <= tol``, and by
    lambda-strong convexity ``||theta_hat - theta*|| <= tol / lambda``, so the
    logit sensitivity of the returned weights is ``2K/(N lambda) + 2 tol/lambda``
    (the same slack as model sensitivity's). It is passed as the Lipschitz
    constant ``K + N tol`` (``2 (K + N tol) / (N lambda)``); non-converged fits are
    refused.
  - subsample-and-aggregate (Sec. 3.2, App. C.2, Alg. 8): T teachers on disjoint
    parts, label drawn with ``p(y) ∝ exp(beta n_y(x))``, ``beta`` from
    :func:`jaxdp.prediction.exponential_aggregation_beta` (``eps/(2B)`` for delta =
    0 -- the paper's Thm. 7 ``eps/B`` is not eps-DP, see
    :mod:`jaxdp.prediction.subsample_aggregate` -- and ``max(eps/(2B), beta'')``
    for delta > 0, Thm. 8), rounded down to float32 as
    :class:`jaxdp.prediction.SubsampleAggregatePredictor` does.

The accuracy at budget B is the mean accuracy over the whole test set of answers
calibrated for B queries (each test point is one query; the expected accuracy of
B such answers is the same whether B is smaller or larger than the test set).
The sweep uses the pure functions with ``num_seeds`` noise draws vmapped in one
call, not one budget-enforcing predictor object per (method, B, seed).

Hyper-parameters (as ``experiments/accuracy_vs_epsilon.py``): lambda (and T for
subsample-and-aggregate) is chosen on a held-out part of the training set (the
prediction methods calibrated with the held-out fit size), then the final model
is trained on the whole training set and evaluated on the test set. As in the
paper, the privacy cost of this selection is not accounted for.

Writes ``<out_dir>/<name>/results.csv``, ``results.json`` and
``prediction_vs_training.png`` (accuracy vs B on a log axis, one panel per
(epsilon, delta)).
"""

from __future__ import annotations

import csv
import functools
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
from jaxdp.mechanisms import noise_scale_as
from jaxdp import data as jdata
from jaxdp import prediction as jpred
from jaxdp import training as jtrain

TRAINING_METHODS = ("model_sensitivity", "loss_perturbation")
PREDICTION_METHODS = ("prediction_sensitivity", "subsample_aggregate")
ALL_METHODS = ("non_private",) + TRAINING_METHODS + PREDICTION_METHODS


def load_data(config):
  return jdata.load(config.dataset, data_dir=config.data_dir or None,
                    n_train=config.n_train or None, seed=config.seed,
                    pca_dims=config.pca_dims or None, unit_ball="project")


def _model_accuracies(weights, x, y):
  """Accuracy of each model in a ``(M, D, C)`` stack."""
  return jax.vmap(lambda w: jnp.mean(jtrain.predict_labels(w, x) == y))(weights)


@functools.partial(jax.jit, static_argnames="noise")
def _noisy_logit_accuracies(keys, logits, y, scale, noise):
  """Accuracy of argmax(noisy logits) per key: one fresh noise vector per query and key."""
  def one(key):
    return jnp.mean(jnp.argmax(jpred.noisy_logits(key, logits, noise, scale), axis=-1) == y)
  return jax.vmap(one)(keys)


@jax.jit
def _aggregation_accuracies(keys, votes, y, beta):
  """Accuracy of exponential-mechanism vote aggregation per key."""
  return jax.vmap(lambda k: jnp.mean(jpred.aggregate_exponential(k, votes, beta) == y))(keys)


class _Keys:
  """Fresh ``jax.random`` keys from one root: key number i is ``fold_in(root, i)``."""

  def __init__(self, seed: int):
    self._root = jax.random.key(seed)
    self._count = 0

  def next(self, num: int | None = None) -> jax.Array:
    key = jax.random.fold_in(self._root, self._count)
    self._count += 1
    return key if num is None else jax.random.split(key, num)


# --- private training --------------------------------------------------------------------
def private_models(method, keys, x, y, num_classes, l2_reg, eps, delta, config):
  """``(M, D, C)`` weights of a private-training ``method``, one model per key."""
  if method == "model_sensitivity":
    return jtrain.model_sensitivity(
        keys, x, y, num_classes=num_classes, l2_reg=l2_reg, epsilon=eps, delta=delta,
        max_iter=config.max_iter, tol=config.tol).weights
  if method == "loss_perturbation":
    return jtrain.loss_perturbation(
        keys, x, y, num_classes=num_classes, l2_reg=l2_reg, epsilon=eps, delta=delta,
        batch_mode=config.batch_mode, max_iter=config.max_iter, tol=config.objective_tol).weights
  raise ValueError(f"method must be one of {TRAINING_METHODS}, got {method!r}.")


def _fit_exact(x, y, num_classes, l2_reg, config):
  """Non-private minimiser; refuses a fit that did not reach ``||grad|| <= tol``."""
  model = jtrain.fit_linear(x, y, num_classes=num_classes, l2_reg=l2_reg,
                            max_iter=config.max_iter, tol=config.tol)
  if not bool(model.info.converged):
    raise RuntimeError(
        f"non-private fit with l2_reg={l2_reg} did not converge (grad norm "
        f"{float(model.info.grad_norm):.3g} > tol={config.tol}); the prediction-sensitivity "
        "bound needs it. Raise config.max_iter or config.tol.")
  return model.weights


def _ps_scale(eps, delta, budget, n, l2_reg, config):
  """(noise, float32 scale) of prediction sensitivity for B queries (module docstring)."""
  lipschitz = jpred.SOFTMAX_LIPSCHITZ + n * config.tol  # Delta = 2K/(N lam) + 2 tol/lam
  cal = jpred.calibrate_prediction_sensitivity(eps, delta, budget, n, l2_reg, lipschitz,
                                               method=config.gaussian_method)
  scale = noise_scale_as(cal.scale, jnp.float32, round_up=cal.noise != "l2_laplace")
  return cal.noise, scale


def _row(method, eps, delta, budget, l2_reg, teachers, scale, val_acc, accs):
  accs = np.asarray(accs, dtype=np.float64)
  return dict(method=method, kind=("prediction" if method in PREDICTION_METHODS else "training"),
              epsilon=float(eps), delta=float(delta), budget=int(budget), l2_reg=float(l2_reg),
              num_teachers=int(teachers), noise_scale=float(scale), val_accuracy=float(val_acc),
              test_accuracy_mean=float(accs.mean()), test_accuracy_std=float(accs.std()),
              num_draws=int(accs.size))


def main(config) -> list[dict]:
  start = time.time()
  unknown = set(config.methods) - set(ALL_METHODS)
  if unknown:
    raise ValueError(f"config.methods must be a subset of {ALL_METHODS}, got {sorted(unknown)}.")
  budgets = sorted({int(b) for b in config.budgets})
  if not budgets or budgets[0] < 1:
    raise ValueError(f"config.budgets must be integers >= 1, got {config.budgets}.")
  teacher_counts = config.num_teachers
  if isinstance(teacher_counts, int):
    teacher_counts = (teacher_counts,)
  ds = load_data(config)
  x, y, c = np.asarray(ds.x_train), np.asarray(ds.y_train), ds.num_classes
  rng = np.random.default_rng(config.seed)
  perm = rng.permutation(len(y))
  n_val = int(round(config.validation_fraction * len(y)))
  val_idx, fit_idx = perm[:n_val], perm[n_val:]
  x_fit, y_fit = x[fit_idx], y[fit_idx]
  x_val, y_val = jnp.asarray(x[val_idx]), jnp.asarray(y[val_idx])
  x_test, y_test = jnp.asarray(ds.x_test), jnp.asarray(ds.y_test)
  n_full, n_fit = len(y), len(y_fit)
  keys = _Keys(config.seed)
  settings = [(float(e), float(d)) for e in config.epsilons for d in config.deltas]
  num_jobs = (("non_private" in config.methods)
              + len(settings) * sum(m in config.methods for m in TRAINING_METHODS)
              + ("prediction_sensitivity" in config.methods) * (1 + len(settings))
              + ("subsample_aggregate" in config.methods) * (1 + len(settings)))
  bar = tqdm(total=num_jobs, desc=f"{config.dataset} jobs")
  rows = []

  # Non-private minimisers for each lambda (shared by non-private and prediction sensitivity).
  w_fit, w_full = {}, {}
  if {"non_private", "prediction_sensitivity"} & set(config.methods):
    for lam in config.l2_regs:
      w_fit[lam] = _fit_exact(x_fit, y_fit, c, lam, config)
      w_full[lam] = _fit_exact(x, y, c, lam, config)

  if "non_private" in config.methods:
    vals = [float(_model_accuracies(w_fit[lam][None], x_val, y_val)[0]) for lam in config.l2_regs]
    lam = config.l2_regs[int(np.argmax(vals))]
    acc = _model_accuracies(w_full[lam][None], x_test, y_test)
    rows += [_row("non_private", math.inf, 0.0, b, lam, 0, 0.0, max(vals), acc) for b in budgets]
    bar.update()

  # Private training: one lambda per (method, eps, delta), then the same accuracy for every B.
  for method in (m for m in config.methods if m in TRAINING_METHODS):
    for eps, delta in settings:
      vals = []
      for lam in config.l2_regs:
        w = private_models(method, keys.next(config.num_seeds), x_fit, y_fit, c, lam, eps,
                           delta, config)
        vals.append(float(jnp.mean(_model_accuracies(w, x_val, y_val))))
      best = int(np.argmax(vals))
      lam = config.l2_regs[best]
      w = private_models(method, keys.next(config.num_seeds), x, y, c, lam, eps, delta, config)
      accs = _model_accuracies(w, x_test, y_test)
      rows += [_row(method, eps, delta, b, lam, 0, 0.0, vals[best], accs) for b in budgets]
      bar.update()

  # Prediction sensitivity: lambda chosen per (eps, delta, B) with noise calibrated for n_fit.
  if "prediction_sensitivity" in config.methods:
    logits_val = {lam: x_val @ w_fit[lam] for lam in config.l2_regs}
    logits_test = {lam: x_test @ w_full[lam] for lam in config.l2_regs}
    bar.update()
    for eps, delta in settings:
      for b in budgets:
        vals = []
        for lam in config.l2_regs:
          noise, scale = _ps_scale(eps, delta, b, n_fit, lam, config)
          vals.append(float(jnp.mean(_noisy_logit_accuracies(
              keys.next(config.num_seeds), logits_val[lam], y_val, scale, noise))))
        best = int(np.argmax(vals))
        lam = config.l2_regs[best]
        noise, scale = _ps_scale(eps, delta, b, n_full, lam, config)
        accs = _noisy_logit_accuracies(keys.next(config.num_seeds), logits_test[lam], y_test,
                                       scale, noise)
        rows.append(_row("prediction_sensitivity", eps, delta, b, lam, 0, scale, vals[best], accs))
      bar.update()

  # Subsample-and-aggregate: (T, lambda) of the teachers chosen per (eps, delta, B).
  if "subsample_aggregate" in config.methods:
    votes_val, votes_test = {}, {}
    for t in teacher_counts:
      for lam in config.l2_regs:
        teachers = jpred.train_linear_teachers(
            x_fit, y_fit, num_teachers=int(t), num_classes=c, l2_reg=lam, key=keys.next(),
            max_iter=config.max_iter, tol=config.tol).weights
        votes_val[t, lam] = jpred.linear_teacher_votes(teachers, x_val)
        teachers = jpred.train_linear_teachers(
            x, y, num_teachers=int(t), num_classes=c, l2_reg=lam, key=keys.next(),
            max_iter=config.max_iter, tol=config.tol).weights
        votes_test[t, lam] = jpred.linear_teacher_votes(teachers, x_test)
    bar.update()
    grid = list(votes_val)
    for eps, delta in settings:
      for b in budgets:
        beta = noise_scale_as(jpred.exponential_aggregation_beta(eps, delta, b), jnp.float32,
                              round_up=False)
        vals = [float(jnp.mean(_aggregation_accuracies(keys.next(config.num_seeds),
                                                       votes_val[g], y_val, beta)))
                for g in grid]
        best = int(np.argmax(vals))
        t, lam = grid[best]
        accs = _aggregation_accuracies(keys.next(config.num_seeds), votes_test[t, lam], y_test, beta)
        rows.append(_row("subsample_aggregate", eps, delta, b, lam, t, beta, vals[best], accs))
      bar.update()
  bar.close()
  elapsed = time.time() - start

  out = pathlib.Path(config.out_dir) / config.name
  out.mkdir(parents=True, exist_ok=True)
  with open(out / "results.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  meta = dict(config=config.to_dict(), dataset=repr(ds), n_train=int(n_full), n_fit=int(n_fit),
              n_val=int(n_val), n_test=int(len(y_test)), num_features=int(x.shape[1]),
              num_classes=int(c), seconds=elapsed, backend=jax.default_backend(), rows=rows)
  with open(out / "results.json", "w") as f:
    json.dump(strict_json(meta), f, indent=2, default=str, allow_nan=False)
  plot(rows, config, out / "prediction_vs_training.png")
  print(f"wrote {out}/results.csv, results.json, prediction_vs_training.png in {elapsed:.1f} s")
  for r in rows:
    if r["kind"] == "training" and r["budget"] != budgets[0]:
      continue  # flat in B: print once
    b = "any" if r["kind"] == "training" else r["budget"]
    print(f"{r['method']:>22s} eps={r['epsilon']:<5g} delta={r['delta']:<6g} B={b:<5} "
          f"lambda={r['l2_reg']:<7g} T={r['num_teachers']:<3d} "
          f"acc={r['test_accuracy_mean']:.4f} +- {r['test_accuracy_std']:.4f}")
  return rows


def plot(rows, config, path):
  """Paper 000 Fig. 2 layout: accuracy vs B (log axis), one panel per (epsilon, delta)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  epsilons, deltas = list(config.epsilons), list(config.deltas)
  fig, axes = plt.subplots(len(epsilons), len(deltas), figsize=(5.5 * len(deltas), 4 * len(epsilons)),
                           squeeze=False)
  base = sorted((r for r in rows if r["method"] == "non_private"), key=lambda r: r["budget"])
  for i, eps in enumerate(epsilons):
    for j, delta in enumerate(deltas):
      ax = axes[i][j]
      for method in config.methods:
        if method == "non_private":
          continue
        rs = sorted((r for r in rows if r["method"] == method and r["epsilon"] == float(eps)
                     and r["delta"] == float(delta)), key=lambda r: r["budget"])
        if not rs:
          continue
        training = method in TRAINING_METHODS
        bs = np.array([r["budget"] for r in rs])
        mean = np.array([r["test_accuracy_mean"] for r in rs])
        std = np.array([r["test_accuracy_std"] for r in rs])
        line, = ax.plot(bs, mean, ls="--" if training else "-", marker=None if training else "o",
                        label=method.replace("_", " ") + (" (training)" if training else ""))
        ax.fill_between(bs, mean - std, mean + std, color=line.get_color(), alpha=0.15)
      if base:
        ax.axhline(base[0]["test_accuracy_mean"], color="k", ls=":", label="non-private")
      ax.set_xscale("log")
      ax.set_xlabel("inference budget B")
      ax.set_ylabel("test accuracy")
      ax.set_title(f"{config.dataset}, epsilon = {eps:g}, delta = {delta:g}")
      ax.set_ylim(0, 1)
      ax.grid(alpha=0.3)
      ax.legend(loc="best", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  # Defined here (not at import) so tests can import main() without registering absl flags.
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/prediction_vs_training.py",
                                            "experiment config")
  app.run(lambda argv: main(_CONFIG.value) and None)  # exit status 0, not the rows
