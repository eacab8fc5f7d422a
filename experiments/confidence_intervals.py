"""Coverage and length of private confidence intervals (paper 003 Sec. 7, Figs. 1-16, Table 2).

Usage (from any directory)::

  JAXDP_DATA_DIR=../shared/data python experiments/confidence_intervals.py
  python experiments/confidence_intervals.py --config.dataset=bank --config.preset=full

Protocol (paper 003 Sec. 7.2). The pool is the dataset's training split (Sec. 7.1
preprocessing by :mod:`jaxdp.data`, then the first ``d`` features, a constant feature and
rows projected into the unit ball); its non-private regularised minimiser is ``theta_0``.
For each cell (loss, variant = perturbation x privacy, eigenvalue floor, ``n``, ``d``),
``replicates`` bootstrap replicates of size ``n`` (multinomial row counts over the pool) get
one private interval each, in one batched call
(:func:`jaxdp.inference.confidence_intervals_batched`, vmapped over keys and counts).
Reported: coverage (fraction of (replicate, coordinate) pairs with ``theta_0`` inside, Sec. 7.2),
mean interval length, and the variability interval (the 2.5% / 97.5% quantiles over the
replicates of the private ``theta~``, i.e. sampling + ``phi_1`` noise only; Sec. 7.2 "VI") and
its mean length. The budget-split study (Sec. 7.3, Table 2) varies ``phi_1 / phi`` and splits
the rest equally between ``phi_2`` and ``phi_3``.

Outputs in ``<out_dir>/confidence_intervals/<dataset>/``: ``points.jsonl`` (resumable
:class:`jaxdp.results_io.PointLog`), ``coverage.csv``, ``split.csv``, ``results.json`` and
figures ``coverage_length.png`` (coverage and length vs n), ``ci_vs_vi.png`` and
``budget_split.png``.
"""

from __future__ import annotations

import math
import pathlib
import sys
import time

import jax
import numpy as np
from absl import app
from ml_collections import config_flags
from tqdm import tqdm

from jaxdp import data as jdata
from jaxdp import results_io
from jaxdp.data import normalize_rows
from jaxdp.inference import confidence_intervals, confidence_intervals_batched

CONFIG_FILE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "confidence_intervals.py"
RESULT_FIELDS = ("dataset", "epsilon", "rho", "l2_reg", "h", "alpha", "replicates", "quantiles",
                 "num_samples", "seed", "pool_size")


def _presets():
  import importlib.util
  spec = importlib.util.spec_from_file_location("ci_config", CONFIG_FILE)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.PRESETS


def resolve_config(config):
  preset = _presets()[config.preset]
  for field, value in preset.items():
    if not config[field]:
      config[field] = value
  return config


def load_pool(config):
  ds = jdata.load(config.dataset, data_dir=config.data_dir or None, add_constant=False,
                  unit_ball=False)
  x, y = np.asarray(ds.x_train, np.float64), np.asarray(ds.y_train)
  if config.pool_size and len(y) > config.pool_size:
    idx = np.random.default_rng(config.seed).permutation(len(y))[:config.pool_size]
    x, y = x[idx], y[idx]
  return x, y


def design(x_full, d):
  """First ``d`` features + constant, rows projected into the unit ball (paper 003 Sec. 7.1)."""
  x = np.concatenate([x_full[:, :d], np.ones((len(x_full), 1))], axis=1)
  return np.asarray(normalize_rows(x, "project"), np.float64)


def run_cell(config, x, y, theta0, *, loss, variant, floor, n, fractions, key):
  pert, priv = variant.split("_")
  # The variant's privacy notion picks the argument: epsilon (pure DP) or rho (zCDP).
  total = config.epsilon if priv == "pure" else config.rho
  phi = {"epsilon" if priv == "pure" else "rho": total}
  r = config.replicates
  counts = np.random.default_rng(results_io.point_seed([loss, variant, floor, n, x.shape[1],
                                                        str(fractions)])).multinomial(
      n, np.full(len(y), 1.0 / len(y)), size=r)
  keys = jax.random.split(key, r)
  t0 = time.perf_counter()
  out, cal = confidence_intervals_batched(
      keys, x, y, **phi, counts=counts, loss=loss, perturbation=pert, l2_reg=config.l2_reg,
      h=config.h, alpha=config.alpha, quantiles=config.quantiles, num_samples=config.num_samples,
      floor=floor, fractions=fractions, chunk_size=config.chunk_size)
  secs = time.perf_counter() - t0
  inside = (out.lower <= theta0) & (theta0 <= out.upper)
  length = (out.upper - out.lower).mean(axis=1)
  vi = np.quantile(out.theta, [config.alpha / 2, 1 - config.alpha / 2], axis=0)
  return dict(loss=loss, variant=variant, floor=floor, n=int(n), d=int(x.shape[1] - 1),
              phi1_fraction=float(cal.split.theta / total), coverage=float(inside.mean()),
              coverage_se=float(inside.mean(axis=1).std(ddof=1) / math.sqrt(r)),
              length=float(length.mean()), length_se=float(length.std(ddof=1) / math.sqrt(r)),
              vi_length=float((vi[1] - vi[0]).mean()), replicates=r,
              seconds_per_interval=secs / r)


def _legend_below(fig, axes, ncol, fontsize):
  """One legend for all ``axes``, below them (never over a curve); returns its top (fraction)."""
  handles = {}
  for ax in axes:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(label, handle)
  legend = fig.legend(list(handles.values()), list(handles), loc="lower center",
                      bbox_to_anchor=(0.5, 0.0), ncol=max(1, min(ncol, len(handles))),
                      fontsize=fontsize, frameon=False)
  return legend.get_window_extent(fig.canvas.get_renderer()).y1 / fig.bbox.height


def plot(rows, split_rows, out, metadata=None):
  """``coverage_length.png`` and ``ci_vs_vi.png`` from ``rows``, ``budget_split.png`` from
  ``split_rows``, in the directory ``out``; legends outside the axes. ``metadata``: PNG text
  entries of every figure written (``savefig``)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  if rows:
    ds = sorted({r["d"] for r in rows})
    losses = sorted({r["loss"] for r in rows})
    fig, axes = plt.subplots(2 * len(losses), len(ds), figsize=(4.2 * len(ds),
                                                                 6.4 * len(losses) + 0.5),
                             squeeze=False)
    for li, loss in enumerate(losses):
      for j, d in enumerate(ds):
        for (variant, floor) in sorted({(r["variant"], r["floor"]) for r in rows}):
          sel = sorted((r for r in rows if r["d"] == d and r["variant"] == variant
                        and r["floor"] == floor and r["loss"] == loss), key=lambda r: r["n"])
          if not sel:
            continue
          ns = [r["n"] for r in sel]
          style = dict(ls="-" if floor == "psd" else "--", marker="o",
                       color=f"C{sorted({r['variant'] for r in rows}).index(variant)}")
          axes[2 * li, j].errorbar(ns, [r["coverage"] for r in sel],
                                   yerr=[1.96 * r["coverage_se"] for r in sel],
                                   label=f"{variant}, floor={floor}", **style)
          axes[2 * li + 1, j].errorbar(ns, [r["length"] for r in sel],
                                       yerr=[1.96 * r["length_se"] for r in sel], **style)
        axes[2 * li, j].axhline(1 - 0.05, color="k", lw=0.8)
        axes[2 * li, j].set(xscale="log", title=f"{loss}, d = {d}", ylabel="coverage")
        axes[2 * li + 1, j].set(xscale="log", yscale="log", xlabel="n",
                                ylabel="mean CI length")
    fig.suptitle("Private 95% CIs (ε = 1, ρ = 0.5): coverage and length vs n; "
                 "error bars = ±1.96 s.e. over bootstrap replicates", fontsize=9)
    top = _legend_below(fig, axes[0], ncol=4, fontsize=7)
    fig.tight_layout(rect=(0, top, 1, 1))
    fig.savefig(out / "coverage_length.png", dpi=120, metadata=metadata)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.6, 4))
    for variant in sorted({r["variant"] for r in rows}):
      sel = [r for r in rows if r["variant"] == variant and r["floor"] == "psd"]
      ax.scatter([r["vi_length"] for r in sel], [r["length"] for r in sel], label=variant, s=14)
    lim = [min(r["vi_length"] for r in rows), max(r["length"] for r in rows)]
    ax.plot(lim, lim, "k-", lw=0.8, label="CI = VI")
    ax.set(xscale="log", yscale="log", xlabel="variability interval length (φ₁ noise + sampling)",
           ylabel="private CI length (floor=psd)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(out / "ci_vs_vi.png", dpi=120, metadata=metadata)
    plt.close(fig)
  if split_rows:
    variants = sorted({r["variant"] for r in split_rows})
    fig, axes = plt.subplots(2, len(variants), figsize=(3.6 * len(variants), 5.9), squeeze=False)
    for j, variant in enumerate(variants):
      for loss in sorted({r["loss"] for r in split_rows}):
        sel = sorted((r for r in split_rows if r["variant"] == variant and r["loss"] == loss),
                     key=lambda r: r["phi1_fraction"])
        f = [r["phi1_fraction"] for r in sel]
        axes[0, j].errorbar(f, [r["coverage"] for r in sel],
                            yerr=[1.96 * r["coverage_se"] for r in sel], marker="o", label=loss)
        axes[1, j].errorbar(f, [r["length"] for r in sel],
                            yerr=[1.96 * r["length_se"] for r in sel], marker="o")
      axes[0, j].axhline(0.95, color="k", lw=0.8)
      axes[0, j].set(title=variant, ylabel="coverage")
      axes[1, j].set(xlabel="φ₁ / φ  (φ₂ = φ₃)", ylabel="mean CI length", yscale="log")
    fig.suptitle("Budget split (paper 003 Table 2); floor = paper; ±1.96 s.e.", fontsize=9)
    top = _legend_below(fig, axes[0], ncol=4, fontsize=7)
    fig.tight_layout(rect=(0, top, 1, 1))
    fig.savefig(out / "budget_split.png", dpi=120, metadata=metadata)
    plt.close(fig)


def main(argv):
  del argv
  config = resolve_config(_CONFIG.value)
  log, out = results_io.open_point_log(config, RESULT_FIELDS)
  x_full, y = load_pool(config)
  root = jax.random.key(config.seed)
  thetas = {}

  def theta0(loss, d):
    if (loss, d) not in thetas:
      x = design(x_full, d)
      res, _ = confidence_intervals(jax.random.key(0), x, y, rho=math.inf, loss=loss,
                                    perturbation="output", l2_reg=config.l2_reg, h=config.h)
      thetas[(loss, d)] = (x, res.theta)
    return thetas[(loss, d)]

  cells = [("cell", loss, v, fl, int(n), int(d), None)
           for loss in config.losses for d in config.ds for v in config.variants
           for fl in config.floors for n in config.ns if n <= len(y)]
  if config.split_study:
    for loss in config.losses:
      for v in config.variants:
        for f in config.split_fractions:
          fr = (f, (1 - f) / 2, (1 - f) / 2)
          cells.append(("split", loss, v, "paper", int(min(config.split_n, len(y))),
                        int(config.split_d), fr))
  rows, split_rows = [], []
  for cell in tqdm(cells, desc=f"confidence intervals ({config.dataset})"):
    kind, loss, v, fl, n, d, fr = cell
    key = list(cell[:6]) + ([list(fr)] if fr else [])
    if key not in log:
      x, th0 = theta0(loss, d)
      row = run_cell(config, x, y, th0, loss=loss, variant=v, floor=fl, n=n, fractions=fr,
                     key=jax.random.fold_in(root, results_io.point_seed(key)))
      log.append(key, [row])
    (split_rows if kind == "split" else rows).extend(log.get(key))
    results_io.write_csv_atomic(out / "coverage.csv", rows)
    results_io.write_csv_atomic(out / "split.csv", split_rows)
  results_io.write_json_atomic(out / "results.json", dict(config=config.to_dict(), cells=rows,
                                                          split=split_rows))
  plot(rows, split_rows, out)
  print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", str(CONFIG_FILE), "experiment config")
  app.run(main)
