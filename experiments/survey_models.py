"""The survey's classic DP models vs epsilon: jaxdp vs diffprivlib vs scikit-learn (paper 004 Sec. 3).

Usage (from any directory; needs ``$JAXDP_DATA_DIR``)::

  python experiments/survey_models.py --config.dataset=adult
  python experiments/survey_models.py --config.dataset=bank
  python experiments/survey_models.py --config.dataset=mnist      # PCA

Per point ``(model, library, epsilon)``: ``num_seeds`` fits, the metric's mean
and s.d. and the mean fit time. Metrics: test accuracy (naive Bayes, random
trees), test k-means cost per point divided by scikit-learn's (k-means), and
the fraction of the test second moment captured by the top components (PCA).
Every library gets the same declared bounds and the same clipped data
(:mod:`configs.survey_models`). diffprivlib (0.6.6, optional extra
``[compare]``) is imported with a two-name shim for scikit-learn >= 1.4
(``sklearn.tree._tree.DOUBLE/DTYPE``); if it cannot be imported its rows are
skipped. Its epsilons are what it *claims*; see ``docs/paper_004.md`` for where
it overspends.

Results: ``<out_dir>/survey_models/<dataset>/`` (``points.jsonl`` resumable via
:class:`jaxdp.results_io.PointLog`, ``results.csv``, ``results.json``,
``survey_models.png``).
"""

from __future__ import annotations

import math
import pathlib
import sys
import time
import warnings

import jax
import numpy as np
from absl import app
from ml_collections import config_flags
from tqdm import tqdm

import jaxdp
from jaxdp import classic
from jaxdp import data as jdata
from jaxdp import results_io

CONFIG_FILE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "survey_models.py"
TABULAR_MODELS = ("naive_bayes", "random_trees", "kmeans")
RESULT_FIELDS = ("dataset", "n_train", "num_seeds", "num_trees", "tree_depth", "tree_budget",
                 "n_clusters", "kmeans_iterations", "kmeans_method", "kmeans_neighbouring",
                 "kmeans_equal_spend", "kmeans_num_seeds", "pca_components",
                 "pca_delta", "bounds", "seed")


def import_diffprivlib():
  """diffprivlib with the scikit-learn >= 1.4 shim, or None when unavailable."""
  try:
    import sklearn.tree._tree as tree_mod  # pylint: disable=import-outside-toplevel
    for name, value in (("DOUBLE", np.float64), ("DTYPE", np.float32)):
      if not hasattr(tree_mod, name):
        setattr(tree_mod, name, value)
    import diffprivlib  # pylint: disable=import-outside-toplevel
    return diffprivlib
  except ImportError:
    return None


# ------------------------------------------------------------------ data


def load(config):
  """Train/test arrays plus the declared (public) bounds, data clipped to them."""
  name = config.dataset
  kw = dict(data_dir=config.data_dir or None)
  if name == "mnist":
    ds = jdata.load("mnist", **kw)
    x, xt = ds.x_train / 28.0, ds.x_test / 28.0  # pixels in [0, 1]: ||x||_2 <= 28 publicly
    out = dict(x=x, y=ds.y_train, xt=xt, yt=ds.y_test)
  else:
    ds = jdata.load(name, scale=False, add_constant=False, unit_ball=False, **kw)
    names = list(ds.feature_names)
    declared = config.bounds[name]
    lo, hi = np.zeros(len(names)), np.ones(len(names))
    for j, f in enumerate(names):
      if f in declared:
        lo[j], hi[j] = declared[f]
    binary = np.array([f not in declared for f in names])
    x, xt = np.clip(ds.x_train, lo, hi), np.clip(ds.x_test, lo, hi)
    out = dict(x=x, y=ds.y_train, xt=xt, yt=ds.y_test, lower=lo, upper=hi, binary=binary)
  if config.n_train:
    idx = np.random.default_rng(config.seed).permutation(len(out["y"]))[:config.n_train]
    out["x"], out["y"] = out["x"][idx], out["y"][idx]
  return out


# ------------------------------------------------------------------ one fit


def _fit(est, *args):
  """``est.fit(*args)`` including the (asynchronously dispatched) jaxdp computation."""
  est.fit(*args)
  jax.block_until_ready([v for v in vars(est).values()
                         if isinstance(v, (jax.Array, tuple)) and not isinstance(v, str)])
  return est


def diffprivlib_kmeans_spend_factor(dim: int, rho: float = classic.kmeans.SU_RHO) -> float:
  """What diffprivlib 0.6.6's ``KMeans`` really spends per unit of its nominal epsilon.

  ``KMeans._split_epsilon`` returns ``(eps_dim, eps_count) = (N, c N)``, ``N = eps/T/(d + c)``,
  ``c = cbrt(4 d rho^2)``, and ``_update_centers`` unpacks ``(eps_count, eps_dim)``: each
  iteration spends ``N`` on the count and ``c N`` on each of the ``d`` coordinates of the sum,
  ``eps/T (1 + d c)/(d + c)`` in all (1.21 at ``d = 10``, 2.11 at Bank's 51, 2.70 at Adult's 104).
  """
  c = float(np.cbrt(4.0 * dim * rho ** 2))
  return (1.0 + dim * c) / (dim + c)


def fit_and_score(model, library, epsilon, seed, d, config, dpl=None):
  """Fits one model; returns ``(metric, fit_seconds)``."""
  warnings.simplefilter("ignore")
  x, y, xt, yt = d["x"], d["y"], d["xt"], d["yt"]
  eps_dpl = epsilon
  if model == "naive_bayes":
    if library == "jaxdp":
      cat = np.flatnonzero(d["binary"])
      num = np.flatnonzero(~d["binary"])
      est = classic.PrivateNaiveBayes(epsilon=epsilon, classes=[0, 1], categorical_features=cat,
                                      num_categories=2, lower=d["lower"][num],
                                      upper=d["upper"][num], seed=seed)
    elif library == "diffprivlib":
      est = dpl.models.GaussianNB(epsilon=eps_dpl, bounds=(d["lower"], d["upper"]),
                                  random_state=seed)
    else:
      from sklearn.naive_bayes import GaussianNB  # pylint: disable=import-outside-toplevel
      est = GaussianNB()
    t = time.perf_counter()
    _fit(est, x, y)
    return float(np.mean(est.predict(xt) == yt)), time.perf_counter() - t
  if model == "random_trees":
    if library == "jaxdp":
      est = classic.PrivateRandomTrees(epsilon=epsilon, classes=[0, 1], lower=d["lower"],
                                       upper=d["upper"], n_estimators=config.num_trees,
                                       depth=config.tree_depth, tree_budget=config.tree_budget,
                                       seed=seed)
    elif library == "diffprivlib":
      est = dpl.models.RandomForestClassifier(
          n_estimators=config.num_trees, epsilon=eps_dpl, bounds=(d["lower"], d["upper"]),
          classes=[0, 1], max_depth=config.tree_depth, random_state=seed)
    else:
      from sklearn.ensemble import RandomForestClassifier  # pylint: disable=import-outside-toplevel
      est = RandomForestClassifier(n_estimators=config.num_trees, max_depth=config.tree_depth,
                                   random_state=seed)
    t = time.perf_counter()
    _fit(est, x, y)
    return float(np.mean(est.predict(xt) == yt)), time.perf_counter() - t
  if model == "kmeans":
    # Features min-max scaled by the declared bounds (public map) to [0, 1].
    s = lambda a: (a - d["lower"]) / (d["upper"] - d["lower"])
    xs, xts = s(x), s(xt)
    from sklearn.cluster import KMeans  # pylint: disable=import-outside-toplevel
    ref = d.setdefault("_kmeans_ref", {})
    if "cost" not in ref:
      km = KMeans(config.n_clusters, n_init=4, random_state=0).fit(xs)
      ref["cost"] = float(classic.kmeans_cost(xts, km.cluster_centers_))
    if library == "jaxdp":
      est = classic.PrivateKMeans(n_clusters=config.n_clusters, epsilon=epsilon, lower=0.0,
                                  upper=1.0, method=config.kmeans_method,
                                  iterations=config.kmeans_iterations,
                                  neighbouring=config.kmeans_neighbouring, seed=seed)
    elif library == "diffprivlib":
      if config.kmeans_equal_spend:
        eps_dpl = epsilon / diffprivlib_kmeans_spend_factor(xs.shape[1])
      est = dpl.models.KMeans(config.n_clusters, epsilon=eps_dpl,
                              bounds=(np.zeros(xs.shape[1]), np.ones(xs.shape[1])),
                              random_state=seed)
    else:
      est = KMeans(config.n_clusters, n_init=1, random_state=seed)
    t = time.perf_counter()
    _fit(est, xs)
    sec = time.perf_counter() - t
    return float(classic.kmeans_cost(xts, est.cluster_centers_)) / ref["cost"], sec
  if model in ("pca", "pca_laplace"):
    k = config.pca_components
    if library == "jaxdp":
      mech = "laplace" if model == "pca_laplace" else "gaussian"
      est = classic.PrivatePCA(n_components=k, epsilon=epsilon,
                               delta=0.0 if mech == "laplace" else config.pca_delta,
                               mechanism=mech, seed=seed)
    elif library == "diffprivlib":
      est = dpl.models.PCA(k, epsilon=eps_dpl, data_norm=1.0, centered=True, random_state=seed)
    else:
      from sklearn.decomposition import PCA  # pylint: disable=import-outside-toplevel
      est = PCA(k)
    t = time.perf_counter()
    _fit(est, x)
    sec = time.perf_counter() - t
    return classic.explained_variance_ratio(xt, est.components_), sec
  raise ValueError(f"unknown model {model!r}")


# ------------------------------------------------------------------ driver


def grid(config):
  models = tuple(config.models) or (("pca", "pca_laplace") if config.dataset == "mnist"
                                    else TABULAR_MODELS)
  points = []
  for model in models:
    for lib in config.libraries:
      if lib == "sklearn":
        points.append((model, lib, math.inf))
      elif not (lib == "diffprivlib" and model == "pca_laplace"):
        points.extend((model, lib, float(e)) for e in config.epsilons)
  return points


def main(config) -> list[dict]:
  start = time.time()
  points = grid(config)
  out = results_io.run_dir(config.out_dir, config.name, config.dataset, n_train=config.n_train)
  log = results_io.PointLog(out / "points.jsonl",
                            {f: (config[f].to_dict() if hasattr(config[f], "to_dict") else config[f])
                             for f in RESULT_FIELDS}
                            | {"experiment": config.name, "jaxdp": jaxdp.__version__})
  dpl = import_diffprivlib() if "diffprivlib" in config.libraries else None
  if dpl is None and "diffprivlib" in config.libraries:
    print("diffprivlib not installed (pip install -e .[compare]): its rows are skipped.",
          file=sys.stderr)
    points = [p for p in points if p[1] != "diffprivlib"]
  todo = [p for p in points if p not in log]
  print(f"{config.name} on {config.dataset}: {len(points) - len(todo)} of {len(points)} points "
        f"already in {out / 'points.jsonl'}", file=sys.stderr)
  d = load(config) if todo else None

  def finished_rows():
    return [log.get(p)[0] for p in points if p in log]

  for point in tqdm(todo, desc=f"{config.dataset} points"):
    model, lib, eps = point
    seeds = 1 if lib == "sklearn" else (config.kmeans_num_seeds if model == "kmeans"
                                        else config.num_seeds)
    base = results_io.point_seed(point) + config.seed
    res = [fit_and_score(model, lib, eps, (base + s) % (2 ** 31), d, config, dpl) for s in range(seeds)]
    vals = np.array([r[0] for r in res])
    row = dict(model=model, library=lib, epsilon=eps, metric_mean=float(vals.mean()),
               metric_std=float(vals.std(ddof=1)) if len(vals) > 1 else 0.0, num_seeds=seeds,
               fit_seconds_mean=float(np.mean([r[1] for r in res])))
    log.append(point, [row])
    results_io.write_csv_atomic(out / "results.csv", finished_rows())
  rows = finished_rows()
  results_io.write_csv_atomic(out / "results.csv", rows)
  results_io.write_json_atomic(out / "results.json", dict(
      config=config.to_dict(), seconds_this_run=time.time() - start,
      points_computed_this_run=len(todo), backend=jax.default_backend(), rows=rows))
  plot(rows, config, out / "survey_models.png")
  for r in rows:
    print(f"{r['model']:>13s} {r['library']:>11s} ε={r['epsilon']:<5g} "
          f"metric={r['metric_mean']:.4f} ± {r['metric_std']:.4f} fit={r['fit_seconds_mean']:.3f}s")
  print(f"wrote {out}/results.csv, results.json, survey_models.png")
  return rows


METRIC_LABEL = {"naive_bayes": "test accuracy", "random_trees": "test accuracy",
                "kmeans": "test cost / scikit-learn cost", "pca": "captured second moment (test)",
                "pca_laplace": "captured second moment (test)"}


def plot(rows, config, path, metadata=None):
  """Accuracy (or k-means score) vs epsilon per model, jaxdp vs diffprivlib.

  ``metadata``: PNG text entries (``savefig``).
  """
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  models = list(dict.fromkeys(r["model"] for r in rows))
  if not models:
    return
  fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4.2), squeeze=False)
  for ax, model in zip(axes[0], models):
    for lib in ("jaxdp", "diffprivlib"):
      rs = sorted((r for r in rows if r["model"] == model and r["library"] == lib),
                  key=lambda r: r["epsilon"])
      if rs:
        ax.errorbar([r["epsilon"] for r in rs], [r["metric_mean"] for r in rs],
                    yerr=[r["metric_std"] for r in rs], marker="o", capsize=3, label=lib)
    base = [r for r in rows if r["model"] == model and r["library"] == "sklearn"]
    if base:
      ax.axhline(base[0]["metric_mean"], color="k", ls="--", label="scikit-learn (non-private)")
    ax.set_xscale("log")
    if model == "kmeans":
      ax.set_yscale("log")
    ax.set_xlabel("privacy loss ε")
    ax.set_ylabel(METRIC_LABEL[model])
    ax.set_title(f"{model.replace('_', ' ')} on {config.dataset}")
    ax.grid(alpha=0.3)
    ax.legend()
  fig.text(0.5, 0.01, f"Mean over {config.num_seeds} fits ({config.kmeans_num_seeds} for "
           "k-means); error bars: ±1 s.d. over fits (same spent ε, declared bounds and "
           "neighbouring relation for both libraries).", ha="center", va="bottom", fontsize=8)
  fig.tight_layout(rect=(0, 0.04, 1, 1))
  fig.savefig(path, dpi=120, metadata=metadata)
  plt.close(fig)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", str(CONFIG_FILE), "experiment config")
  app.run(lambda argv: main(_CONFIG.value) and None)
