"""Private prediction vs private training: accuracy as a function of the inference budget B.

Paper 000 (``../shared/papers/000_tradeoffs_of_private_prediction.md``) Sec. 4.2,
"Accuracy as a function of inference budget", Fig. 2.

Usage::

  python experiments/prediction_vs_training.py
  JAXDP_DATA_DIR=../shared/data python experiments/prediction_vs_training.py --config.dataset=mnist \
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
    the exact minimiser; the non-private fit is certified in float64 within
    ``tol / lambda`` of it (:func:`jaxdp.training.output_perturbation.certified_fit`,
    repaired and never refused when L-BFGS stops short), so the logit
    sensitivity of the released float32 weights is ``2K/(N lambda) + 2 s/lambda``
    with ``s = tol + 2^-24 (K + tol)`` (the float32 rounding), exactly
    :meth:`jaxdp.prediction.PredictionSensitivityPredictor.from_linear_model`'s
    ``solver_tol``.
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

Writes ``<out_dir>/<name>/<dataset>/results.csv``, ``results.json`` and
``prediction_vs_training.png`` (accuracy vs B on a log axis, one panel per
(epsilon, delta)). Every finished point (a training method at one (eps, delta),
a prediction method at one (eps, delta, B)) is appended to ``points.jsonl`` as
it completes; re-running resumes from it (:class:`jaxdp.results_io.PointLog`).
Keys are derived from what they are drawn for, so a resumed run reproduces an
uninterrupted one. Runs from any directory (the default config is found next
to this script; results go under the current directory's ``results/``).
"""

from __future__ import annotations

import functools
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

from jaxdp import results_io
from jaxdp.mechanisms import noise_scale_as
from jaxdp import data as jdata
from jaxdp import prediction as jpred
from jaxdp import training as jtrain

CONFIG_FILE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "prediction_vs_training.py"
TRAINING_METHODS = ("model_sensitivity", "loss_perturbation")
PREDICTION_METHODS = ("prediction_sensitivity", "subsample_aggregate")
ALL_METHODS = ("non_private",) + TRAINING_METHODS + PREDICTION_METHODS
# Settings that change a point's result (see experiments/accuracy_vs_epsilon.py).
RESULT_FIELDS = ("dataset", "n_train", "pca_dims", "l2_regs", "num_teachers",
                 "validation_fraction", "num_seeds", "max_iter", "tol", "objective_tol",
                 "gaussian_method", "seed")


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
  """Fresh ``jax.random`` keys that depend only on what they are for.

  ``keys.for_(tag, ...)`` is ``fold_in(root, point_seed(tag))``: the same tag
  always gives the same key, different tags independent keys, whatever else the
  run computes (so resumed runs reproduce uninterrupted ones). Each tag is used
  for one draw only.
  """

  def __init__(self, seed: int):
    self._root = jax.random.key(seed)

  def for_(self, *tag, num: int | None = None) -> jax.Array:
    key = jax.random.fold_in(self._root, results_io.point_seed(tag))
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
  """Non-private minimiser, certified within ``tol/lambda`` in float64 (never refused).

  :func:`jaxdp.training.output_perturbation.certified_fit`: when L-BFGS stops
  short of ``||grad J|| <= tol`` the float64 polish / accelerated gradient
  repairs the point, so the ``2 tol/lambda`` slack of prediction sensitivity's
  calibration always holds (refusing a fit would depend on the data). Returns
  the float32 rounding of the certified float64 weights.
  """
  _, cert = jtrain.output_perturbation.certified_fit(
      x, y, num_classes=num_classes, l2_reg=l2_reg, max_iter=config.max_iter, tol=config.tol)
  return jnp.asarray(cert.weights, jnp.float32)


def _ps_solver_tol(config) -> float:
  """Distance slack of the float32 certified weights, as ``PredictionSensitivityPredictor``.

  ``tol`` (certified, :func:`_fit_exact`) plus ``2^-24 (K + tol)`` for rounding the
  certified float64 point (``||theta|| <= (K + tol)/lambda``) to float32, so
  ``Delta = 2K/(N lambda) + 2 solver_tol/lambda`` (paper 000 Lemma 1 plus strong convexity).
  """
  return config.tol + 2.0 ** -24 * (jpred.SOFTMAX_LIPSCHITZ + config.tol)


def _ps_scale(eps, delta, budget, n, l2_reg, config):
  """(noise, float32 scale) of prediction sensitivity for B queries (module docstring)."""
  cal = jpred.calibrate_prediction_sensitivity(eps, delta, budget, n, l2_reg,
                                               jpred.SOFTMAX_LIPSCHITZ,
                                               method=config.gaussian_method,
                                               solver_tol=_ps_solver_tol(config))
  scale = noise_scale_as(cal.scale, jnp.float32, round_up=cal.noise != "l2_laplace")
  return cal.noise, scale


def _row(method, eps, delta, budget, l2_reg, teachers, scale, val_acc, accs):
  accs = np.asarray(accs, dtype=np.float64)
  return dict(method=method, kind=("prediction" if method in PREDICTION_METHODS else "training"),
              epsilon=float(eps), delta=float(delta), budget=int(budget), l2_reg=float(l2_reg),
              num_teachers=int(teachers), noise_scale=float(scale), val_accuracy=float(val_acc),
              test_accuracy_mean=float(accs.mean()), test_accuracy_std=float(accs.std()),
              num_draws=int(accs.size))


def grid(config) -> list[tuple]:
  """The points of the figure: ``(method, eps, delta)`` for non-private / private training
  (the same accuracy for every B) and ``(method, eps, delta, B)`` for private prediction."""
  unknown = set(config.methods) - set(ALL_METHODS)
  if unknown:
    raise ValueError(f"config.methods must be a subset of {ALL_METHODS}, got {sorted(unknown)}.")
  budgets = sorted({int(b) for b in config.budgets})
  if not budgets or budgets[0] < 1:
    raise ValueError(f"config.budgets must be integers >= 1, got {config.budgets}.")
  settings = [(float(e), float(d)) for e in config.epsilons for d in config.deltas]
  points = []
  if "non_private" in config.methods:
    points.append(("non_private", math.inf, 0.0))
  for method in (m for m in ALL_METHODS if m in config.methods):
    if method in TRAINING_METHODS:
      points += [(method, e, d) for e, d in settings]
    elif method in PREDICTION_METHODS:
      points += [(method, e, d, b) for e, d in settings for b in budgets]
  return points


def main(config) -> list[dict]:
  start = time.time()
  points = grid(config)
  budgets = sorted({int(b) for b in config.budgets})
  teacher_counts = config.num_teachers
  if isinstance(teacher_counts, int):
    teacher_counts = (teacher_counts,)
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
  x_fit, y_fit = x[fit_idx], y[fit_idx]
  x_val, y_val = jnp.asarray(x[val_idx]), jnp.asarray(y[val_idx])
  x_test, y_test = jnp.asarray(ds.x_test), jnp.asarray(ds.y_test)
  n_full, n_fit = len(y), len(y_fit)
  keys = _Keys(config.seed)
  num = config.num_seeds

  # Work shared by several points, computed on first use (nothing if every point is done).
  @functools.cache
  def nonprivate_weights(split, lam):  # shared by non-private and prediction sensitivity
    return _fit_exact(*((x_fit, y_fit) if split == "fit" else (x, y)), c, lam, config)

  @functools.cache
  def teacher_votes(split, t, lam):
    xs, ys, xe = (x_fit, y_fit, x_val) if split == "fit" else (x, y, x_test)
    teachers = jpred.train_linear_teachers(
        xs, ys, num_teachers=int(t), num_classes=c, l2_reg=lam, key=keys.for_("teachers", split,
                                                                              int(t), lam),
        max_iter=config.max_iter, tol=config.tol).weights
    return jpred.linear_teacher_votes(teachers, xe)

  def run_point(point):
    method, eps, delta = point[:3]
    if method == "non_private":
      vals = [float(_model_accuracies(nonprivate_weights("fit", lam)[None], x_val, y_val)[0])
              for lam in config.l2_regs]
      lam = config.l2_regs[int(np.argmax(vals))]
      acc = _model_accuracies(nonprivate_weights("full", lam)[None], x_test, y_test)
      return _row("non_private", math.inf, 0.0, 0, lam, 0, 0.0, max(vals), acc)
    if method in TRAINING_METHODS:
      # One lambda per (method, eps, delta); the released model serves any B.
      vals = []
      for lam in config.l2_regs:
        w = private_models(method, keys.for_(*point, "val", lam, num=num), x_fit, y_fit, c, lam,
                           eps, delta, config)
        vals.append(float(jnp.mean(_model_accuracies(w, x_val, y_val))))
      best = int(np.argmax(vals))
      lam = config.l2_regs[best]
      w = private_models(method, keys.for_(*point, "test", num=num), x, y, c, lam, eps, delta,
                         config)
      return _row(method, eps, delta, 0, lam, 0, 0.0, vals[best], _model_accuracies(w, x_test, y_test))
    b = point[3]
    if method == "prediction_sensitivity":
      # lambda chosen per (eps, delta, B) with noise calibrated for n_fit.
      vals = []
      for lam in config.l2_regs:
        noise, scale = _ps_scale(eps, delta, b, n_fit, lam, config)
        vals.append(float(jnp.mean(_noisy_logit_accuracies(
            keys.for_(*point, "val", lam, num=num), x_val @ nonprivate_weights("fit", lam), y_val,
            scale, noise))))
      best = int(np.argmax(vals))
      lam = config.l2_regs[best]
      noise, scale = _ps_scale(eps, delta, b, n_full, lam, config)
      accs = _noisy_logit_accuracies(keys.for_(*point, "test", num=num),
                                     x_test @ nonprivate_weights("full", lam), y_test, scale, noise)
      return _row(method, eps, delta, b, lam, 0, scale, vals[best], accs)
    # Subsample-and-aggregate: (T, lambda) of the teachers chosen per (eps, delta, B).
    beta = noise_scale_as(jpred.exponential_aggregation_beta(eps, delta, b), jnp.float32,
                          round_up=False)
    options = [(int(t), lam) for t in teacher_counts for lam in config.l2_regs]
    vals = [float(jnp.mean(_aggregation_accuracies(keys.for_(*point, "val", t, lam, num=num),
                                                   teacher_votes("fit", t, lam), y_val, beta)))
            for t, lam in options]
    best = int(np.argmax(vals))
    t, lam = options[best]
    accs = _aggregation_accuracies(keys.for_(*point, "test", num=num), teacher_votes("full", t, lam),
                                   y_test, beta)
    return _row(method, eps, delta, b, lam, t, beta, vals[best], accs)

  def finished_rows():
    rows = []
    for p in points:
      if p not in log:
        continue
      row = log.get(p)[0]
      if p[0] in PREDICTION_METHODS:
        rows.append(row)
      else:  # non-private and private training: the same model answers any number of queries
        rows += [dict(row, budget=b) for b in budgets]
    return rows

  for point in tqdm(todo, desc=f"{config.dataset} points"):
    log.append(point, [run_point(point)])
    results_io.write_csv_atomic(out / "results.csv", finished_rows())
  rows = finished_rows()
  elapsed = time.time() - start

  results_io.write_csv_atomic(out / "results.csv", rows)
  meta = dict(config=config.to_dict(), dataset=repr(ds), n_train=int(n_full), n_fit=int(n_fit),
              n_val=int(n_val), n_test=int(len(y_test)), num_features=int(x.shape[1]),
              num_classes=int(c), seconds_this_run=elapsed, points_computed_this_run=len(todo),
              backend=jax.default_backend(), rows=rows)
  results_io.write_json_atomic(out / "results.json", meta)
  plot(rows, config, out / "prediction_vs_training.png")
  print(f"wrote {out}/results.csv, results.json, prediction_vs_training.png "
        f"({len(todo)} points computed in {elapsed:.1f} s)")
  for r in rows:
    if r["kind"] == "training" and r["budget"] != budgets[0]:
      continue  # flat in B: print once
    b = "any" if r["kind"] == "training" else r["budget"]
    print(f"{r['method']:>22s} ε={r['epsilon']:<5g} δ={r['delta']:<6g} B={b:<5} "
          f"λ={r['l2_reg']:<7g} T={r['num_teachers']:<3d} "
          f"acc={r['test_accuracy_mean']:.4f} ± {r['test_accuracy_std']:.4f} "
          f"(s.d. over {r['num_draws']} draws)")
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
      ax.set_title(f"{config.dataset}, ε = {eps:g}, δ = {delta:g}")
      ax.set_ylim(0, 1)
      ax.grid(alpha=0.3)
      ax.legend(loc="best", fontsize=8)
  draws = sorted({r["num_draws"] for r in rows if r["method"] != "non_private"})
  n = "/".join(str(d) for d in draws) or "?"
  fig.text(0.5, 0.005, f"Mean test accuracy; shaded bands: ±1 s.d. over {n} independent noise "
           "draws per point (λ, T chosen on a held-out split). Private training (dashed) releases "
           "one model, so it is flat in B.", ha="center", va="bottom", fontsize=8, wrap=True)
  fig.tight_layout(rect=(0, 0.05 / len(epsilons), 1, 1))
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  # Defined here (not at import) so tests can import main() without registering absl flags.
  _CONFIG = config_flags.DEFINE_config_file("config", str(CONFIG_FILE), "experiment config")
  app.run(lambda argv: main(_CONFIG.value) and None)  # exit status 0, not the rows
