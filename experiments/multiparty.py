"""Learning privately from multiparty data: paper 001 Figures 2 and 3.

Usage (from any directory; default config: ``configs/multiparty_kdd.py``)::

  JAXDP_DATA_DIR=../shared/data python experiments/multiparty.py
  JAXDP_DATA_DIR=../shared/data python experiments/multiparty.py \
      --config=configs/multiparty_har.py            # Figure 2 protocol on the MNIST stand-in

Paper 001 = ``../shared/papers/001_learning_privately_from_multiparty_data.md``
(Sec. 6). For every point ``(M, lambda, split)``: the training set is split into
``M`` parties of ``samples_per_party`` rows and ``num_aux`` auxiliary rows
(:func:`jaxdp.multiparty.split_parties`); all ``M`` local logistic regressions
are trained in one batched call; they vote on the auxiliary rows; then

* *batch*: non-private ERM on all the parties' data;
* *soft*: Algorithm 2 (Theorem 3 noise), *vote*: Algorithm 1 (Theorem 1),
  *avg*: noisy parameter average (App. B.4) — the non-private minimiser is
  computed and certified ONCE, and for each ``1/eps`` ``num_draws`` noisy
  releases are drawn in one vmapped call (one key per draw) and evaluated;
* *indiv*: mean test accuracy of the local classifiers.

Accuracy is mean and s.d. over the noise draws (the paper: 100 draws); with
``num_splits > 1`` the figure pools every split's rows (:func:`aggregate_splits`:
s.d. over draws and splits, over splits for ``batch``, the paper's 10 trials). Each row also
records the mean noise norm and the weight norm, to check the paper's claim
that *soft* stays close to *batch* (docs/paper_001.md). Privacy unit: one party
(all its samples); every release's event is tagged ``unit="party"``.

Results: ``<out_dir>/multiparty/<dataset>[_pca<d>]/`` (``points.jsonl``
resumable, ``results.csv``, ``results.json``, ``multiparty.png``). The HAR
stand-in writes ``mnist_standin`` in every file name, row and plot title.
"""

from __future__ import annotations

import math
import pathlib
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from ml_collections import config_flags
from tqdm import tqdm

import jaxdp
from jaxdp import data as jdata
from jaxdp import multiparty as mp
from jaxdp import results_io
from jaxdp.training import linear

CONFIG_FILE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "multiparty_kdd.py"
PRIVATE = ("soft", "vote", "avg")
RESULT_FIELDS = ("dataset", "samples_per_party", "num_aux", "pca_dims", "num_classes_kept",
                 "inv_epsilons", "delta", "num_draws", "eval_test_size", "tol", "max_iter", "seed")
PAPER_FIG2_HAR = dict(batch=0.90, vote=0.79, soft=0.76, avg=0.67, indiv=0.47)  # 1/eps = 0


def load_data(config):
  """``(x_train, y_train, x_test, y_test, num_classes, label)`` (features not yet in the ball for PCA sets)."""
  data_dir = config.data_dir or None
  if config.dataset == "kddcup99":
    ds = jdata.load_kddcup99(data_dir)
    label = "KDD Cup 99"
  elif config.dataset == "har":
    try:
      ds = jdata.load_har(data_dir)
    except jdata.DataUnavailableError as err:
      raise SystemExit(f"UCI HAR feature matrices are not available ({err}). Run the "
                       "Figure 2 protocol on the stand-in instead: --config.dataset=mnist_standin")
    label = "UCI HAR"
  elif config.dataset == "mnist_standin":
    ds = jdata.load_mnist(data_dir)
    label = "MNIST stand-in for UCI HAR"
  else:
    raise ValueError(f"unknown dataset {config.dataset!r}")
  xtr, ytr, xte, yte = ds.x_train, ds.y_train, ds.x_test, ds.y_test
  c = ds.num_classes
  if config.num_classes_kept:
    c = int(config.num_classes_kept)
    xtr, ytr = jdata.keep_first_classes(xtr, ytr, c)
    xte, yte = jdata.keep_first_classes(xte, yte, c)
  return (np.asarray(xtr, np.float32).reshape(len(ytr), -1), np.asarray(ytr, np.int32),
          np.asarray(xte, np.float32).reshape(len(yte), -1), np.asarray(yte, np.int32), c, label)


def prepare(config, data, m, split_seed):
  """Party split; PCA (fitted on the public auxiliary rows only) and unit-ball scaling."""
  xtr, ytr, xte, yte, c, _ = data
  sp = mp.split_parties(split_seed, xtr, ytr, num_parties=m,
                        samples_per_party=config.samples_per_party, num_aux=config.num_aux)
  if config.pca_dims:
    pca = jdata.fit_pca(sp.x_aux, config.pca_dims)
    r = float(np.max(np.linalg.norm(pca(sp.x_aux), axis=1)))
    f = lambda z: jdata.normalize_rows(pca(z.reshape(-1, z.shape[-1])), "scale", reference_norm=r)
    sp = mp.PartySplit(f(sp.xs).reshape(m, config.samples_per_party, -1), sp.ys, f(sp.x_aux),
                       sp.y_aux)
    xte = f(xte)
  rng = np.random.default_rng(split_seed + 1)
  if config.eval_test_size and config.eval_test_size < len(yte):
    idx = rng.choice(len(yte), config.eval_test_size, replace=False)
    xte, yte = xte[idx], yte[idx]
  return sp, xte, yte


@jax.jit
def _accuracies(weights, x, y):
  """Test accuracy of each of a batch of weight arrays (leading axis)."""
  return jax.vmap(lambda w: jnp.mean(linear.predict_labels(w, x) == y))(weights)


def run_point(config, data, m, lam, split, key):
  c, label = data[4], data[5]
  sp, xte, yte = prepare(config, data, m, config.seed * 1000 + split)
  xte_j, yte_j = jnp.asarray(xte), jnp.asarray(yte)
  timing = {}
  t0 = time.perf_counter()
  loc = mp.fit_local_classifiers(sp.xs, sp.ys, l2_reg=lam, loss="logistic" if c == 2 else "softmax",
                                 num_classes=None if c == 2 else c, max_iter=config.max_iter,
                                 tol=config.tol, batch_mode=config.batch_mode)
  jax.block_until_ready(loc.weights)
  timing["local_fits_s"] = time.perf_counter() - t0
  votes = np.asarray(mp.local_votes(loc.weights, sp.x_aux))
  nonpriv, sens, t0 = {}, {}, time.perf_counter()
  kw = dict(num_classes=c, l2_reg=lam, tol=config.tol, max_iter=config.max_iter)
  if "soft" in config.methods:
    nonpriv["soft"] = mp.global_minimizer(votes, sp.x_aux, method="soft", **kw)[0].weights
    sens["soft"] = mp.soft_label_sensitivity(lam, num_parties=m, num_classes=c,
                                             solver_tol=config.tol)
  if "vote" in config.methods:
    nonpriv["vote"] = mp.global_minimizer(votes, sp.x_aux, method="vote", **kw)[0].weights
    sens["vote"] = mp.vote_sensitivity(lam, num_classes=c, solver_tol=config.tol)
  timing["global_fits_s"] = time.perf_counter() - t0
  if "avg" in config.methods:
    t0 = time.perf_counter()
    nonpriv["avg"] = mp.certify_local_classifiers(loc.weights, sp.xs, sp.ys, num_classes=c,
                                                  l2_reg=lam, tol=config.tol).mean(axis=0)
    sens["avg"] = mp.parameter_averaging_sensitivity(lam, num_parties=m, num_classes=c,
                                                     solver_tol=config.tol)
    timing["avg_certify_s"] = time.perf_counter() - t0
  base = dict(dataset=config.dataset, label=label, num_parties=m, l2_reg=lam, split=split,
              num_aux=len(sp.y_aux), dim=int(sp.x_aux.shape[1]))
  rows = []
  fixed = {}
  if "batch" in config.methods:
    b = mp.batch_classifier(sp.xs.reshape(-1, sp.xs.shape[-1]), sp.ys.reshape(-1), num_classes=c,
                            l2_reg=lam, max_iter=config.max_iter, tol=config.tol)
    fixed["batch"] = (float(_accuracies(b.weights[None], xte_j, yte_j)[0]), 0.0,
                      float(jnp.linalg.norm(b.weights)))
  if "indiv" in config.methods:
    ind = mp.indiv_accuracy(loc.weights, xte, yte)
    fixed["indiv"] = (ind.mean, ind.std, float(np.mean(np.linalg.norm(
        np.asarray(loc.weights).reshape(m, -1), axis=1))))
  t0 = time.perf_counter()
  for inv_eps in config.inv_epsilons:
    eps = math.inf if inv_eps == 0 else 1.0 / inv_eps
    for name, (acc, sd, wn) in fixed.items():
      rows.append(dict(base, method=name, inv_epsilon=inv_eps, epsilon=eps, acc_mean=acc,
                       acc_sd=sd, num_draws=0, sensitivity=0.0, noise_norm_mean=0.0,
                       weight_norm=wn, event="non-private" if name == "batch" else "local only"))
    for j, name in enumerate(n for n in PRIVATE if n in nonpriv):
      cal = mp.party_calibration(sens[name], epsilon=eps, delta=config.delta)
      draws = 1 if math.isinf(eps) else config.num_draws
      keys = jax.random.split(jax.random.fold_in(key, 1000 * j + len(rows)), draws)
      w = mp.release(keys, nonpriv[name], cal)
      acc = np.asarray(_accuracies(w, xte_j, yte_j))
      noise = np.linalg.norm((np.asarray(w, np.float64) - nonpriv[name]).reshape(draws, -1),
                             axis=1)
      rows.append(dict(base, method=name, inv_epsilon=inv_eps, epsilon=eps,
                       acc_mean=float(acc.mean()), acc_sd=float(acc.std()), num_draws=draws,
                       sensitivity=sens[name], noise_norm_mean=float(noise.mean()),
                       weight_norm=float(np.linalg.norm(nonpriv[name])),
                       event=str(cal.event)))
  timing["private_sweep_s"] = time.perf_counter() - t0
  for r in rows:
    r.update(timing)
  return rows


def aggregate_splits(rows):
  """One row per (method, M, lambda, 1/eps): the mean and s.d. over every split's rows.

  Each split's row holds the mean and s.d. of ``num_draws`` noisy releases (private
  methods), of the parties (``indiv``) or of one number (``batch``, s.d. 0). With equal
  counts per split, the pooled mean is the mean of the means and the pooled variance is
  ``mean(sd^2 + mean^2) - pooled_mean^2``: over draws AND splits for private methods,
  over parties and splits for ``indiv``, over splits for ``batch`` (the paper's 10
  trials). ``num_splits`` records how many splits each row pools.
  """
  groups = {}
  for r in rows:
    groups.setdefault((r["method"], r["num_parties"], r["l2_reg"], r["inv_epsilon"]), []).append(r)
  out = []
  for sel in groups.values():
    means = np.array([float(r["acc_mean"]) for r in sel])
    sds = np.array([float(r["acc_sd"]) for r in sel])
    mean = float(means.mean())
    var = float(np.mean(sds**2 + means**2) - mean**2)
    out.append(dict(sel[0], acc_mean=mean, acc_sd=math.sqrt(max(var, 0.0)),
                    num_splits=len({r.get("split", 0) for r in sel})))
  return out


def plot(rows, path, title, metadata=None):
  """Accuracy vs 1/eps, one panel per (lambda, M), averaged over the rows' splits.

  ``metadata``: PNG text entries (``savefig``).
  """
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  rows = aggregate_splits(rows)
  splits = max(r["num_splits"] for r in rows)
  ms = sorted({r["num_parties"] for r in rows})
  lams = sorted({r["l2_reg"] for r in rows})
  fig, axes = plt.subplots(len(lams), len(ms), figsize=(4.2 * len(ms), 3.4 * len(lams)),
                           squeeze=False)
  styles = dict(batch=("k", "-"), soft=("tab:blue", "-"), avg=("tab:green", "-"),
                vote=("tab:red", "-"), indiv=("gray", "--"))
  for a, lam in enumerate(lams):
    for b, m in enumerate(ms):
      ax = axes[a][b]
      for name, (col, ls) in styles.items():
        sel = sorted((r for r in rows if r["method"] == name and r["num_parties"] == m
                      and r["l2_reg"] == lam), key=lambda r: r["inv_epsilon"])
        if not sel:
          continue
        xs = [max(r["inv_epsilon"], 1e-3) for r in sel]
        ax.errorbar(xs, [r["acc_mean"] for r in sel], yerr=[r["acc_sd"] for r in sel],
                    color=col, ls=ls, marker="o" if name in PRIVATE else None, ms=3,
                    capsize=2, label=name)
      ax.set_xscale("log")
      ax.set_title(f"M = {m}, λ = {lam:g}", fontsize=9)
      ax.set_xlabel("1/ε  (1/ε = 0 plotted at 1e-3)")
      ax.set_ylabel("test accuracy")
      ax.grid(alpha=0.3)
  over = f" and {splits} random splits" if splits > 1 else ""
  note = ("error bars: ±1 s.d. (private methods: over noise draws" + over
          + "; indiv: over parties" + over + ("; batch: over splits)" if splits > 1 else ")"))
  # Legend and note below the panels, the title wrapped to the figure's width: nothing drawn
  # over a curve, nothing cut at the edges.
  handles = {}
  for ax in axes.ravel():
    for handle, label in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(label, handle)
  width_chars = int(fig.get_figwidth() * 72 / 6.5)  # ~6.5 pt per character at fontsize 10
  fig.suptitle(textwrap.fill(title, width_chars), fontsize=10)
  legend = fig.legend(list(handles.values()), list(handles), loc="lower center",
                      bbox_to_anchor=(0.5, 0.0), ncol=len(handles), fontsize=7, frameon=False,
                      title=textwrap.fill(note, int(width_chars * 1.4)), title_fontsize=6)
  top = legend.get_window_extent(fig.canvas.get_renderer()).y1 / fig.bbox.height
  fig.tight_layout(rect=(0, top, 1, 1))
  fig.savefig(path, dpi=120, metadata=metadata)
  plt.close(fig)


def main(config) -> list[dict]:
  data = load_data(config)
  out = results_io.run_dir(config.out_dir, config.name, config.dataset, pca_dims=config.pca_dims)
  settings = {f: config[f] for f in RESULT_FIELDS}
  settings["jaxdp_version"] = getattr(jaxdp, "__version__", "")
  log = results_io.PointLog(out / "points.jsonl", settings)
  # Splits outermost: an interrupted run has whole splits of every (M, lambda).
  points = [(m, lam, s) for s in range(config.num_splits) for m in config.num_parties
            for lam in config.l2_regs]
  rows = []
  for m, lam, s in tqdm(points, desc=f"{config.dataset} points"):
    pkey = [config.dataset, int(m), float(lam), int(s), list(config.methods)]
    got = log.get(pkey)
    if got is None:
      key = jax.random.key(results_io.point_seed(pkey))
      got = log.append(pkey, run_point(config, data, int(m), float(lam), int(s), key))
    rows.extend(got)
    results_io.write_csv_atomic(out / "results.csv", rows)
  results_io.write_json_atomic(out / "results.json", dict(
      config=config.to_dict(), standin=config.dataset == "mnist_standin",
      paper_fig2_har_at_inv_eps_0=PAPER_FIG2_HAR, rows=rows))
  title = f"Paper 001 protocol on {data[5]}" + (
      " (STAND-IN: UCI HAR features unavailable)" if config.dataset == "mnist_standin" else "")
  plot(rows, out / "multiparty.png", title)
  print(f"wrote {out}", file=sys.stderr)
  return rows


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", str(CONFIG_FILE), "experiment config")
  app.run(lambda argv: main(_CONFIG.value) and None)
