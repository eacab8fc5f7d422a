"""Coverage and length of private confidence intervals (paper 003 Sec. 7, Figs. 1-19, Table 2).

Usage (from any directory)::

  JAXDP_DATA_DIR=../shared/data python experiments/confidence_intervals.py
  python experiments/confidence_intervals.py --config.preset=full               # Adult's studies
  python experiments/confidence_intervals.py --config.dataset=kddcup99 --config.preset=full
  python experiments/confidence_intervals.py --config.studies='("split23",)' --config.preset=full

Protocol (paper 003 Sec. 7.2). The pool is the dataset's training split (Sec. 7.1
preprocessing by :mod:`jaxdp.data`, then the first ``d`` features, a constant feature and
rows projected into the unit ball); its non-private regularised minimiser is ``theta_0``.
A cell is (loss, variant = perturbation x privacy, eigenvalue floor, ``n``, ``d``, total
``epsilon``, budget fractions); zCDP variants run at ``rho = epsilon^2 / 2`` (every pure
``epsilon``-DP algorithm is ``epsilon^2/2``-zCDP, the paper's comparison). Its ``replicates``
bootstrap replicates of size ``n`` are drawn WITH replacement from the pool (row indices;
``n`` may exceed the pool) and get one private interval each, in batched calls of
``replicate_chunk`` replicates (:func:`jaxdp.inference.confidence_intervals_batched`), so
that no ``(replicates, n)`` array is ever held whole. Replicate ``i``'s rows and noise come
from keys ``fold_in(., i)`` of the cell's key: the results do not depend on
``replicate_chunk``. Reported per cell: coverage (fraction of (replicate, coordinate) pairs
with ``theta_0`` inside, Sec. 7.2) and its standard error over replicates, mean interval
length and its standard error, the variability interval (the 2.5% / 97.5% quantiles over
all the replicates of the private ``theta~``, i.e. sampling + ``phi_1`` noise only; Sec. 7.2
"VI") and its mean length, seconds per interval, and the library's coverage warning for
the configuration (empty when none).

Studies (``configs/confidence_intervals.py``): ``grid`` (Figs. 9-10, 17-18), ``split``
(Figs. 1-4), ``split23`` (Figs. 5-8), ``epsilon_grid`` (Figs. 11-12), ``vi_n`` / ``vi_d`` /
``vi_epsilon`` (Figs. 14-16), ``epsilon_fit`` (Fig. 19) and ``sample_complexity`` (Fig. 13,
Sec. 7.5: the smallest multiple of 2,500 whose private mean length is at most the
non-private one at ``n'``, found by ``experiments/ci_length_models.py``).

Outputs in ``<out_dir>/confidence_intervals/<dataset>/``: ``points.jsonl`` (resumable
:class:`jaxdp.results_io.PointLog`, one line per cell), ``<study>.csv`` per study
(``sample_complexity.csv``: one row per (variant, ``n'``); its cells in
``sample_complexity_cells.csv``), ``length_fits.json`` (Sec. 7.7 fits), ``results.json`` and
the figures of :data:`FIGURE_FILES`, drawn from the rows alone (``docs/draw_figures.py``
redraws them from committed CSVs with :func:`plot_study`).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import pathlib
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from ml_collections import config_flags
from tqdm import tqdm

from jaxdp import data as jdata
from jaxdp import results_io
from jaxdp.data import normalize_rows
from jaxdp.inference import confidence_intervals, confidence_intervals_batched
from jaxdp.inference import intervals as _intervals

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_FILE = ROOT / "configs" / "confidence_intervals.py"
# The config fields that change a cell's result. The cell's own coordinates (study, loss,
# variant, floor, n, d, epsilon, fractions, replicates) are its PointLog key; the chunk sizes
# change nothing (replicate i's keys do not depend on them).
RESULT_FIELDS = ("dataset", "l2_reg", "h", "alpha", "quantiles", "num_samples", "seed",
                 "pool_size")
STUDIES = ("grid", "split", "split23", "epsilon_grid", "vi_n", "vi_d", "vi_epsilon",
           "epsilon_fit", "sample_complexity")
ROW_FIELDS = ("study", "dataset", "loss", "variant", "floor", "n", "d", "epsilon", "rho",
              "phi1_fraction", "phi2_share", "coverage", "coverage_se", "length", "length_se",
              "vi_length", "replicates", "seconds_per_interval", "coverage_warning")
SAMPLE_COMPLEXITY_FIELDS = ("dataset", "variant", "n_nonprivate", "nonprivate_length",
                            "n_private", "private_length")
# Paper 003 Sec. 7.3.1: the phi_1 / phi range of Figs. 1-4 per privacy notion.
PAPER_SPLIT_RANGE = {"pure": (0.3, 0.9), "zcdp": (0.1, 0.98)}
# The figures each study writes into the output folder (docs/draw_figures.py copies them).
FIGURE_FILES = {
    "grid": ("coverage_length.png", "ci_vs_vi.png", "grid.png"),
    "split": ("budget_split.png",),
    **{s: (f"{s}.png",) for s in ("split23", "epsilon_grid", "vi_n", "vi_d", "vi_epsilon",
                                  "epsilon_fit", "sample_complexity")},
}
NONPRIVATE = "nonprivate"  # the sample-complexity study's non-private intervals (epsilon = inf)


def _load(name: str, path: pathlib.Path):
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
  return sys.modules[name]


def length_models():
  """``experiments/ci_length_models.py``: the Sec. 7.5/7.7 fits, search and figures."""
  return _load("ci_length_models", ROOT / "experiments" / "ci_length_models.py")


def _config_module():
  spec = importlib.util.spec_from_file_location("ci_config", CONFIG_FILE)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def resolve_config(config):
  """``config`` with every empty field set to the preset's value (studies: per data set)."""
  preset = dict(_config_module().PRESETS[config.preset])
  studies = preset.pop("studies")
  for field, value in preset.items():
    if not config[field]:
      config[field] = value
  if not config.studies:
    if config.dataset not in studies:
      raise ValueError(f"studies: no default studies for dataset {config.dataset!r}; give "
                       f"--config.studies (one or more of {STUDIES}).")
    config.studies = tuple(studies[config.dataset])
  unknown = [s for s in config.studies if s not in STUDIES]
  if unknown:
    raise ValueError(f"studies must be among {STUDIES}, got {unknown}.")
  return config


def default_floor() -> str:
  """The library's default eigenvalue floor (``confidence_intervals(floor=...)``)."""
  return inspect.signature(confidence_intervals).parameters["floor"].default


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


def _bootstrap_indices(key, start, stop, n, pool):
  """Rows of replicates ``start..stop-1``: ``n`` uniform draws with replacement from
  ``range(pool)`` each, replicate ``i`` from ``fold_in(key, i)`` (independent of chunking)."""
  draw = lambda i: jax.random.randint(jax.random.fold_in(key, i), (n,), 0, pool)
  return np.asarray(jax.vmap(draw)(jnp.arange(start, stop)))


def _replicate_keys(key, start, stop):
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(start, stop))


def _intervals_of_chunk(keys, x, y, idx, phi, kw, chunk_size):
  """Batched calls on the replicates ``idx`` (``(M, n)`` row indices): as indices while
  ``n < N`` (each replicate's ``n`` rows gathered, O(n d) per interval), else as ``(M, N)``
  row multiplicities (O(N d): cheaper when the replicate is larger than the pool)."""
  if idx.shape[1] < len(y):
    return confidence_intervals_batched(keys, x, y, **phi, indices=idx, chunk_size=chunk_size,
                                        **kw)[0]
  # counts: (M, N) multiplicities, in slices of about 2^22 entries (32 MiB of float64).
  step = max(1, (1 << 22) // len(y))
  parts = []
  for s in range(0, len(idx), step):
    counts = np.stack([np.bincount(r, minlength=len(y)) for r in idx[s:s + step]])
    parts.append(confidence_intervals_batched(keys[s:s + step], x, y, **phi, counts=counts,
                                              chunk_size=chunk_size, **kw)[0])
  return _intervals.ConfidenceIntervals(*(np.concatenate(f) for f in zip(*parts)))


def pure_epsilon(privacy: str, total: float) -> float:
  """The total budget in pure-DP terms: ``epsilon``, or ``sqrt(2 rho)`` under zCDP."""
  return total if privacy == "pure" else math.sqrt(2.0 * total)


def warning_for(loss, pert, n, privacy, total) -> str:
  """The library's coverage warning for a cell (:func:`jaxdp.inference.coverage_warning`:
  public quantities only), ``""`` when none."""
  return _intervals.coverage_warning(loss=loss, perturbation=pert, num_examples=int(n),
                                     epsilon=pure_epsilon(privacy, total)) or ""


def feasible(*, n, dim, phi, kw) -> bool:
  """Whether the paper's algorithm exists at this cell: objective perturbation (Algorithm 1)
  needs ``c > t / (2 n (e^{eps_1} - 1))``, which at the paper's ``c = 0.001`` fails for small
  ``n eps_1`` (e.g. KDD Cup 99 at ``eps = 0.1``, ``n <= 1,000``). Such cells are left out (no
  row), as the library refuses them (it would otherwise add extra L2, another algorithm)."""
  try:
    _intervals.calibrate(num_examples=int(n), dim=int(dim), **phi, **kw)
  except ValueError as err:
    if "l2_reg must be >" in str(err):
      return False
    raise
  return True


def run_cell(config, x, y, theta0, *, study, loss, variant, floor, n, epsilon, fractions,
             replicates, key):
  """One cell: ``replicates`` private intervals on bootstrap replicates of size ``n``.

  ``variant``: ``<perturbation>_<pure|zcdp>`` (zCDP at ``rho = epsilon^2 / 2``), or
  ``nonprivate`` (``epsilon = inf``: output perturbation's closed form without noise).
  Returns the row of :data:`ROW_FIELDS`.
  """
  if variant == NONPRIVATE:
    pert, priv = "output", "zcdp"
  else:
    pert, priv = variant.split("_")
  total = epsilon if priv == "pure" else epsilon ** 2 / 2
  phi = {"epsilon" if priv == "pure" else "rho": total}
  kw = dict(loss=loss, perturbation=pert, l2_reg=config.l2_reg, h=config.h, alpha=config.alpha,
            quantiles=config.quantiles, num_samples=config.num_samples, floor=floor,
            fractions=fractions)
  split = _intervals.budget_split(**phi, perturbation=pert, fractions=fractions)
  if not feasible(n=n, dim=x.shape[1], phi=phi, kw=kw):
    return None
  data_key, noise_key = jax.random.split(key)
  covered, lengths, thetas, secs = [], [], [], 0.0
  # At most 2^25 row indices (128 MiB) per call: bootstrap n may be far above the pool's size.
  chunk = max(1, min(int(config.replicate_chunk), (1 << 25) // int(n)))
  for start in range(0, replicates, chunk):
    stop = min(replicates, start + chunk)
    idx = _bootstrap_indices(data_key, start, stop, n, len(y))
    keys = _replicate_keys(noise_key, start, stop)
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # the row records it (coverage_warning)
      warnings.simplefilter("ignore", _intervals.CoverageWarning)
      out = _intervals_of_chunk(keys, x, y, idx, phi, kw, config.chunk_size)
    secs += time.perf_counter() - t0
    covered.append(((out.lower <= theta0) & (theta0 <= out.upper)).mean(axis=1))
    lengths.append((out.upper - out.lower).mean(axis=1))
    thetas.append(out.theta)
  covered, lengths = np.concatenate(covered), np.concatenate(lengths)
  vi = np.quantile(np.concatenate(thetas), [config.alpha / 2, 1 - config.alpha / 2], axis=0)
  se = lambda a: float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else math.nan
  private = math.isfinite(total)
  rest = total - split.theta if private else math.nan
  return dict(study=study, dataset=config.dataset, loss=loss, variant=variant, floor=floor,
              n=int(n), d=int(x.shape[1] - 1), epsilon=float(epsilon),
              rho=float(epsilon) ** 2 / 2,
              phi1_fraction=float(split.theta / total) if private else math.nan,
              phi2_share=float(split.hessian / rest) if private and rest > 0 else math.nan,
              coverage=float(covered.mean()), coverage_se=se(covered),
              length=float(lengths.mean()), length_se=se(lengths),
              vi_length=float((vi[1] - vi[0]).mean()), replicates=int(replicates),
              seconds_per_interval=secs / replicates,
              coverage_warning=warning_for(loss, pert, n, priv, total))


def _notion(variant: str) -> str:
  return variant.rsplit("_", 1)[1]


def study_cells(config, study, pool):
  """The cells of ``study``: dicts of :func:`run_cell`'s keyword arguments (``sample_complexity``
  cells are chosen by its search, :func:`run_sample_complexity`)."""
  floor = config.floor or default_floor()
  eps = float(config.epsilon)
  cell = lambda **kw: dict(dict(study=study, loss="logistic", floor=floor, epsilon=eps,
                                fractions=None, replicates=int(config.replicates)), **kw)
  cells = []
  if study == "grid":
    cells = [cell(loss=loss, variant=v, floor=fl, n=int(n), d=int(d))
             for loss in config.losses for d in config.ds for v in config.variants
             for fl in config.floors for n in config.ns if n <= pool]
  elif study == "split":
    for loss in config.losses:
      for v in config.variants:
        lo, hi = PAPER_SPLIT_RANGE[_notion(v)]
        for f in config.split_fractions:
          if lo <= f <= hi:
            cells.append(cell(loss=loss, variant=v, n=int(min(config.split_n, pool)),
                              d=int(config.split_d), fractions=(f, (1 - f) / 2, (1 - f) / 2)))
  elif study == "split23":
    for d in config.split23_ds:
      for v in config.variants:
        f1 = _intervals.TABLE2_FRACTIONS[tuple(v.split("_"))][0]
        for s in config.split23_shares:
          cells.append(cell(variant=v, n=int(min(config.split23_n, pool)), d=int(d),
                            fractions=(f1, s * (1 - f1), (1 - s) * (1 - f1)),
                            replicates=int(config.split23_replicates)))
  elif study == "epsilon_grid":
    cells = [cell(variant=v, n=int(n), d=int(config.epsilon_grid_d), epsilon=float(e))
             for v in config.variants for e in config.epsilons for n in config.epsilon_grid_ns
             if n <= pool]
  elif study == "vi_n":
    cells = [cell(variant=v, n=int(n), d=int(config.vi_d), replicates=int(config.vi_replicates))
             for v in config.variants for n in config.ns if n <= pool]
  elif study == "vi_d":
    cells = [cell(variant=v, n=int(min(config.vi_fixed_n, pool)), d=int(d),
                  replicates=int(config.vi_replicates))
             for v in config.variants for d in config.vi_ds]
  elif study == "vi_epsilon":
    cells = [cell(variant=v, n=int(min(config.vi_fixed_n, pool)), d=int(config.vi_d),
                  epsilon=float(e), replicates=int(config.vi_replicates))
             for v in config.variants for e in config.epsilons]
  elif study == "epsilon_fit":
    cells = [cell(variant=v, n=int(min(config.fit_n, pool)), d=int(config.fit_d),
                  epsilon=float(e))
             for v in config.variants for e in config.fit_epsilons]
  return cells


def cell_key(cell) -> list:
  """The PointLog key of a cell: its coordinates."""
  fr = cell["fractions"]
  return [cell["study"], cell["loss"], cell["variant"], cell["floor"], cell["n"], cell["d"],
          cell["epsilon"], None if fr is None else [float(f) for f in fr], cell["replicates"]]


class Runner:
  """Runs cells once: finished cells come from the PointLog (``computed`` counts the others)."""

  def __init__(self, config, log, x_full, y):
    self.config, self.log, self.x_full, self.y = config, log, x_full, y
    self.root = jax.random.key(config.seed)
    self.thetas = {}
    self.computed = 0

  def theta0(self, loss, d):
    if (loss, d) not in self.thetas:
      x = design(self.x_full, d)
      res, _ = confidence_intervals(jax.random.key(0), x, self.y, rho=math.inf, loss=loss,
                                    perturbation="output", l2_reg=self.config.l2_reg,
                                    h=self.config.h)
      self.thetas[(loss, d)] = (x, res.theta)
    return self.thetas[(loss, d)]

  def __call__(self, cell) -> dict:
    key = cell_key(cell)
    if key not in self.log:
      x, th0 = self.theta0(cell["loss"], cell["d"])
      args = {k: v for k, v in cell.items() if k != "d"}
      row = run_cell(self.config, x, self.y, th0, **args,
                     key=jax.random.fold_in(self.root, results_io.point_seed(key)))
      self.computed += 1
      self.log.append(key, [] if row is None else [row])
    got = self.log.get(key)
    if not got:
      return None  # the algorithm does not exist there (feasible)
    row = dict(got[0])
    if row["variant"] != NONPRIVATE:
      # The warning is the library's rule for the cell's public parameters, not a measurement:
      # rows logged under an earlier rule get the current one.
      pert, priv = row["variant"].split("_")
      total = row["epsilon"] if priv == "pure" else row["epsilon"] ** 2 / 2
      row["coverage_warning"] = warning_for(row["loss"], pert, row["n"], priv, total)
    return row


def run_sample_complexity(config, runner):
  """Paper 003 Sec. 7.5 (Fig. 13): per private variant and non-private ``n'``, the smallest
  multiple of ``sample_complexity_step`` whose private mean length is at most the non-private
  mean length at ``n'``. Returns ``(rows, cell_rows)``."""
  floor = config.floor or default_floor()
  d, eps, k = int(config.sample_complexity_d), float(config.epsilon), int(config.replicates)
  cell = lambda v, n: dict(study="sample_complexity", loss="logistic", variant=v, floor=floor,
                           n=int(n), d=d, epsilon=math.inf if v == NONPRIVATE else eps,
                           fractions=None, replicates=k)
  cells = {}

  def length(v, n):
    row = runner(cell(v, n))
    if row is None:  # the algorithm does not exist at this n (feasible): not short enough
      return math.inf
    cells[(v, n)] = row
    return row["length"]

  nonprivate = {int(n): length(NONPRIVATE, n) for n in config.nonprivate_ns}
  rows = []
  for v in tqdm(config.variants, desc=f"sample complexity ({config.dataset})"):
    found = length_models().sample_complexity(
        lambda n, v=v: length(v, int(n)), nonprivate, step=int(config.sample_complexity_step),
        max_n=int(config.sample_complexity_max_n))
    for n_np in sorted(nonprivate):
      n_priv = found.get(n_np)
      rows.append(dict(dataset=config.dataset, variant=v, n_nonprivate=n_np,
                       nonprivate_length=nonprivate[n_np],
                       n_private=None if n_priv is None else int(n_priv),
                       private_length=None if n_priv is None
                       else cells[(v, int(n_priv))]["length"]))
  return rows, [cells[c] for c in sorted(cells, key=lambda c: (c[0], c[1]))]


def length_fit_rows(rows):
  """The grid rows whose lengths Figs. 17-18 fit against n: logistic, ``d = 5`` (the paper's),
  one floor (``"paper"``, Algorithm 2, when present)."""
  sel = [r for r in rows if r["loss"] == "logistic" and int(r["d"]) == 5]
  floors = sorted({r["floor"] for r in sel})
  floor = "paper" if "paper" in floors else (floors[0] if floors else None)
  return [r for r in sel if r["floor"] == floor]


def length_fits(grid_rows, epsilon_rows) -> list[dict]:
  """Paper 003 Sec. 7.7 fits (``ci_length_models.length_fits``): ``c0/n + c1/sqrt(n)`` and
  ``c/sqrt(n)`` of the grid rows of :func:`length_fit_rows` (Figs. 17-18) and
  ``sqrt(c0/eps^2 + c1)`` / ``sqrt(c0/rho + c1)`` of the epsilon_fit rows (Fig. 19), with
  their quality; arrays as lists."""
  lm = length_models()
  fits = []
  for rows in (length_fit_rows(grid_rows), list(epsilon_rows)):
    if rows:
      fits += lm.length_fits(rows)
  tolist = lambda v: v.tolist() if isinstance(v, np.ndarray) else v
  return [{k: tolist(v) for k, v in f.items()} for f in fits]


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
    floors = sorted({r["floor"] for r in split_rows})
    fig.suptitle(f"Budget split (paper 003 Table 2); floor = {', '.join(floors)}; ±1.96 s.e.",
                 fontsize=9)
    top = _legend_below(fig, axes[0], ncol=4, fontsize=7)
    fig.tight_layout(rect=(0, top, 1, 1))
    fig.savefig(out / "budget_split.png", dpi=120, metadata=metadata)
    plt.close(fig)


def plot_study(study, rows, out, *, metadata=None) -> list[pathlib.Path]:
  """Draws the figures :data:`FIGURE_FILES` ``[study]`` of ``rows`` into the directory ``out``
  (from the rows alone; ``grid.png``, Figs. 17-18, only when the rows have ``d = 5``); returns
  their paths."""
  out = pathlib.Path(out)
  if not rows:
    return []
  if study == "grid":
    plot(rows, [], out, metadata)
    fit = length_fit_rows(rows)
    if fit:
      length_models().plot_length_fits(fit, out / "grid.png", metadata=metadata)
  elif study == "split":
    plot([], rows, out, metadata)
  else:
    lm = length_models()
    draw = {"split23": lm.plot_split23, "epsilon_grid": lm.plot_epsilon_grid,
            "vi_n": lm.plot_ci_vs_vi, "vi_d": lm.plot_ci_vs_vi, "vi_epsilon": lm.plot_ci_vs_vi,
            "epsilon_fit": lm.plot_length_fits,
            "sample_complexity": lm.plot_sample_complexity}[study]
    draw(rows, out / f"{study}.png", metadata=metadata)
  return [out / f for f in FIGURE_FILES[study] if (out / f).is_file()]


def run(config):
  """Runs ``config.studies`` (resolved config); returns ``(out_dir, runner)``."""
  log, out = results_io.open_point_log(config, RESULT_FIELDS)
  x_full, y = load_pool(config)
  runner = Runner(config, log, x_full, y)
  by_study = {}
  for study in config.studies:
    if study == "sample_complexity":
      rows, cell_rows = run_sample_complexity(config, runner)
      results_io.write_csv_atomic(out / "sample_complexity_cells.csv", cell_rows)
    else:
      rows = []
      for cell in tqdm(study_cells(config, study, len(y)),
                       desc=f"confidence intervals: {study} ({config.dataset})"):
        row = runner(cell)
        if row is not None:
          rows.append(row)
          results_io.write_csv_atomic(out / f"{study}.csv", rows)
    results_io.write_csv_atomic(out / f"{study}.csv", rows)
    by_study[study] = rows
    plot_study(study, rows, out)
  if "grid" in by_study or "epsilon_fit" in by_study:
    fits = length_fits(by_study.get("grid", []), by_study.get("epsilon_fit", []))
    results_io.write_json_atomic(out / "length_fits.json", fits)
  results_io.write_json_atomic(out / "results.json",
                               dict(config=config.to_dict(), studies=by_study))
  print(f"wrote {out} ({runner.computed} cells computed, the rest from {log.path.name})",
        file=sys.stderr)
  return out, runner


def main(argv):
  del argv
  run(resolve_config(_CONFIG.value))


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", str(CONFIG_FILE), "experiment config")
  app.run(main)
