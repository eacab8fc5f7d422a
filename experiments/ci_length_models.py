"""Length models, sample-complexity search and figures of paper 003 Sec. 7 (Figs. 5-8, 11-19).

A library for ``experiments/confidence_intervals.py``: it reads the result rows that script
writes (dicts, e.g. from :class:`csv.DictReader`, so values may be strings) and needs only
numpy, scipy and matplotlib.

Length models (paper 003 Sec. 7.7):

* ``L(n) = c0 / n + c1 / sqrt(n)`` (Fig. 17): the ``1 / sqrt(n)`` term is the sampling width of
  a non-private interval, the ``1 / n`` term the privacy noise (Laplace or Gaussian noise on a
  sum of ``n`` bounded terms, divided by ``n``); :func:`fit_inverse_n`.
* ``L(n) = c / sqrt(n)`` (Fig. 18), the non-private rate alone; :func:`fit_inverse_sqrt_n`.
  It misfits private lengths, whose ``1 / n`` term dominates at small ``n``.
* ``L(eps) = sqrt(c0 / eps^2 + c1)`` for pure DP and ``sqrt(c0 / rho + c1)`` with
  ``rho = eps^2 / 2`` for zCDP (Fig. 19): the privacy noise variance (``~ 1 / eps^2`` for Laplace,
  ``~ 1 / rho`` for Gaussian noise) adds to the sampling variance; :func:`fit_epsilon`.

:func:`fit_quality` gives ``R^2`` and relative errors of a fit for the write-up.

Sample complexity (paper 003 Sec. 7.5, Fig. 13): :func:`sample_complexity` finds, for each
non-private sample size ``n'``, the smallest private ``n`` on the grid ``step, 2 step, ...``
whose mean private interval length is at most the non-private one at ``n'``.

Figures, each written as one PNG by a ``plot_*(rows, path, *, metadata=None)`` function:
:func:`plot_split23` (Figs. 5-8), :func:`plot_epsilon_grid` (Figs. 11-12),
:func:`plot_sample_complexity` (Fig. 13), :func:`plot_ci_vs_vi` (Figs. 14-16) and
:func:`plot_length_fits` (Figs. 17-19).
"""

from __future__ import annotations

import math
import textwrap
from typing import Callable, Mapping

import numpy as np
from scipy import optimize

VARIANTS = ("objective_pure", "objective_zcdp", "output_pure", "output_zcdp")
_VARIANT_TITLES = {"objective_pure": "objective perturbation, ε-DP",
                   "objective_zcdp": "objective perturbation, ρ-zCDP",
                   "output_pure": "output perturbation, ε-DP",
                   "output_zcdp": "output perturbation, ρ-zCDP"}
_INT_FIELDS = ("n", "d", "replicates", "n_nonprivate", "n_private")
_FLOAT_FIELDS = ("epsilon", "rho", "phi1_fraction", "phi2_share", "coverage", "coverage_se",
                 "length", "length_se", "vi_length", "seconds_per_interval",
                 "nonprivate_length", "private_length")
_STUDY_AXES = {"vi_n": ("n", "n", True), "vi_d": ("d", "d", False),
               "vi_epsilon": ("epsilon", "ε  (ρ = ε²/2)", True)}


# ----------------------------------------------------------------------------- rows


def _missing(value):
  return value is None or (isinstance(value, str) and value.strip() in ("", "None", "nan"))


def coerce_row(row: Mapping) -> dict:
  """``row`` with typed values: the numeric fields as ``int`` / ``float``, empty strings and
  ``"None"`` as ``None`` (e.g. a ``n_private`` past ``max_n``); text fields (``variant``,
  ``coverage_warning``: the warning's message or ``""``) as they are.
  Unknown fields are kept as they are. Works on rows as written and as read back by
  :class:`csv.DictReader` (all strings)."""
  if not isinstance(row, Mapping):
    raise TypeError(f"rows: each row must be a mapping, got {type(row).__name__}")
  out = dict(row)
  for field, value in row.items():
    if field in _INT_FIELDS + _FLOAT_FIELDS and _missing(value):
      out[field] = None
    elif field in _INT_FIELDS:
      out[field] = int(float(value))
    elif field in _FLOAT_FIELDS:
      out[field] = float(value)
  return out


def coerce_rows(rows) -> list[dict]:
  """:func:`coerce_row` on each of ``rows``."""
  return [coerce_row(r) for r in rows]


def _require(rows, fields, name="rows"):
  if not rows:
    raise ValueError(f"{name}: no rows to plot")
  for field in fields:
    if any(r.get(field) is None for r in rows):
      raise ValueError(f"{name}: every row needs a value for field {field!r}")


def _variants(rows):
  present = {r["variant"] for r in rows}
  unknown = present - set(VARIANTS)
  if unknown:
    raise ValueError(f"rows: unknown variant(s) {sorted(unknown)}; expected one of {VARIANTS}")
  return [v for v in VARIANTS if v in present]


def _notion(variant):
  return "zcdp" if variant.endswith("_zcdp") else "pure"


# ----------------------------------------------------------------------------- fits


def _points(xs, lengths, xname):
  xs = np.asarray(xs, dtype=np.float64).reshape(-1)
  lengths = np.asarray(lengths, dtype=np.float64).reshape(-1)
  if xs.shape != lengths.shape:
    raise ValueError(f"{xname} and lengths must have the same length, got {xs.size} and "
                     f"{lengths.size}")
  if xs.size < 2:
    raise ValueError(f"{xname}: need at least 2 points to fit, got {xs.size}")
  if not (np.all(np.isfinite(xs)) and np.all(xs > 0)):
    raise ValueError(f"{xname} must be finite and positive")
  if not (np.all(np.isfinite(lengths)) and np.all(lengths > 0)):
    raise ValueError("lengths must be finite and positive")
  return xs, lengths


def inverse_n_curve(ns, c0: float, c1: float) -> np.ndarray:
  """``c0 / n + c1 / sqrt(n)`` (paper 003 Sec. 7.7, Fig. 17)."""
  ns = np.asarray(ns, dtype=np.float64)
  return c0 / ns + c1 / np.sqrt(ns)


def inverse_sqrt_n_curve(ns, c: float) -> np.ndarray:
  """``c / sqrt(n)`` (paper 003 Sec. 7.7, Fig. 18)."""
  return c / np.sqrt(np.asarray(ns, dtype=np.float64))


def epsilon_curve(eps, c0: float, c1: float, notion: str) -> np.ndarray:
  """``sqrt(c0 / eps^2 + c1)`` (``notion="pure"``) or ``sqrt(c0 / rho + c1)`` with
  ``rho = eps^2 / 2`` (``notion="zcdp"``) (paper 003 Sec. 7.7, Fig. 19)."""
  return np.sqrt(c0 * _budget_feature(eps, notion) + c1)


def _budget_feature(eps, notion):
  if notion not in ("pure", "zcdp"):
    raise ValueError(f"notion must be 'pure' or 'zcdp', got {notion!r}")
  eps = np.asarray(eps, dtype=np.float64)
  return 1.0 / eps**2 if notion == "pure" else 1.0 / (eps**2 / 2.0)


def fit_inverse_n(ns, lengths) -> tuple[float, float]:
  """``(c0, c1)`` of ``length = c0 / n + c1 / sqrt(n)`` (paper 003 Sec. 7.7, Fig. 17).

  Least squares on the RELATIVE residuals ``(L_i - c0 / n_i - c1 / sqrt(n_i)) / L_i`` (the
  model is linear in ``(c0, c1)``: :func:`numpy.linalg.lstsq` on the rows scaled by
  ``1 / L_i``). The lengths span orders of magnitude over ``n``; plain least squares would fit
  the few longest intervals (smallest ``n``) and miss the rest by factors. The coefficients are
  not constrained in sign; a negative ``c0`` says the data show no ``1 / n`` privacy term.
  """
  ns, lengths = _points(ns, lengths, "ns")
  design = np.stack([1.0 / ns, 1.0 / np.sqrt(ns)], axis=1) / lengths[:, None]
  (c0, c1), *_ = np.linalg.lstsq(design, np.ones_like(lengths), rcond=None)
  return float(c0), float(c1)


def fit_inverse_sqrt_n(ns, lengths) -> float:
  """``c`` of ``length = c / sqrt(n)`` (paper 003 Sec. 7.7, Fig. 18), least squares on the
  relative residuals as :func:`fit_inverse_n`: ``c = sum_i a_i / sum_i a_i^2`` with
  ``a_i = 1 / (sqrt(n_i) L_i)``."""
  ns, lengths = _points(ns, lengths, "ns")
  a = 1.0 / (np.sqrt(ns) * lengths)
  return float(np.sum(a) / np.sum(a * a))


def fit_epsilon(eps, lengths, notion: str) -> tuple[float, float]:
  """``(c0, c1)`` of ``length = sqrt(c0 / eps^2 + c1)`` (``notion="pure"``) or
  ``sqrt(c0 / rho + c1)``, ``rho = eps^2 / 2`` (``notion="zcdp"``) (paper 003 Sec. 7.7, Fig. 19).

  Fitted in the squared-length space, where the model ``L^2 = c0 u + c1`` (``u = 1 / eps^2`` or
  ``1 / rho``) is linear, by non-negative least squares (:func:`scipy.optimize.nnls`) with
  each equation weighted by ``1 / (2 L_i)``. Why: (i) ``c0`` (privacy noise variance) and ``c1``
  (sampling variance) are variances, so ``c0, c1 >= 0``, which also keeps the square root
  defined at every ``eps``; (ii) since ``L_i^2 - Lhat_i^2 = (L_i - Lhat_i)(L_i + Lhat_i)
  ~ 2 L_i (L_i - Lhat_i)``, the weighted residuals are, to first order, the residuals on the
  lengths, so the fit matches nonlinear least squares on the lengths near the optimum without
  its starting point or iterations, where unweighted squares would let the longest intervals
  (smallest ``eps``) dominate; (iii) exact data are recovered exactly.
  """
  eps, lengths = _points(eps, lengths, "eps")
  u = _budget_feature(eps, notion)
  w = 1.0 / (2.0 * lengths)
  design = np.stack([u, np.ones_like(u)], axis=1) * w[:, None]
  (c0, c1), _ = optimize.nnls(design, lengths**2 * w)
  return float(c0), float(c1)


def fit_quality(pred, obs) -> dict:
  """Fit quality of predictions ``pred`` of observations ``obs``: ``r2`` (``1 - SS_res /
  SS_tot``; ``1.0`` for a perfect fit, ``nan`` when ``obs`` is constant), ``max_rel_err`` and
  ``rms_rel_err`` (of ``(pred - obs) / obs``)."""
  pred = np.asarray(pred, dtype=np.float64).reshape(-1)
  obs = np.asarray(obs, dtype=np.float64).reshape(-1)
  if pred.shape != obs.shape or pred.size == 0:
    raise ValueError(f"pred and obs must be non-empty and of the same length, got {pred.size} "
                     f"and {obs.size}")
  if np.any(obs == 0):
    raise ValueError("obs must be non-zero (relative errors)")
  ss_res = float(np.sum((obs - pred)**2))
  ss_tot = float(np.sum((obs - obs.mean())**2))
  r2 = (1.0 if ss_res == 0.0 else math.nan) if ss_tot == 0.0 else 1.0 - ss_res / ss_tot
  rel = (pred - obs) / obs
  return dict(r2=r2, max_rel_err=float(np.max(np.abs(rel))),
              rms_rel_err=float(np.sqrt(np.mean(rel**2))))


def length_fits(rows) -> list[dict]:
  """The Sec. 7.7 fits of ``rows``, one dict per series (same study, dataset, loss, variant and
  fixed parameters), sorted; what :func:`plot_length_fits` draws.

  Rows whose study is ``"epsilon_fit"`` are fitted in ``epsilon`` (series: fixed ``n`` and
  ``d``; keys ``c0``, ``c1``, ``notion`` and the :func:`fit_quality` keys). All other rows are
  fitted in ``n`` (series: fixed ``d``, ``epsilon`` and ``floor``; keys ``c0``, ``c1``,
  ``quality`` of :func:`fit_inverse_n`, ``c``, ``quality_sqrt`` of :func:`fit_inverse_sqrt_n`).
  Series with fewer than 3 distinct ``x`` values are skipped (a 2-parameter fit through 2
  points says nothing about the model).
  """
  rows = coerce_rows(rows)
  _require(rows, ("variant", "length"))
  groups = {}
  for r in rows:
    if r.get("study") == "epsilon_fit":
      key = ("epsilon_fit", r.get("dataset"), r.get("loss"), r["variant"], r.get("n"), r.get("d"))
    else:
      key = (r.get("study"), r.get("dataset"), r.get("loss"), r["variant"], r.get("d"),
             r.get("epsilon"), r.get("floor"))
    groups.setdefault(key, []).append(r)
  fits = []
  for key in sorted(groups, key=lambda k: tuple(str(v) for v in k)):
    sel = groups[key]
    axis = "epsilon" if key[0] == "epsilon_fit" else "n"
    _require(sel, (axis,))
    if len({r[axis] for r in sel}) < 3:
      continue
    sel = sorted(sel, key=lambda r: r[axis])
    x = np.array([r[axis] for r in sel], dtype=np.float64)
    y = np.array([r["length"] for r in sel], dtype=np.float64)
    base = dict(study=key[0], dataset=key[1], loss=key[2], variant=key[3], x=x, lengths=y)
    if axis == "epsilon":
      notion = _notion(key[3])
      c0, c1 = fit_epsilon(x, y, notion)
      fits.append(dict(base, axis="epsilon", n=key[4], d=key[5], notion=notion, c0=c0, c1=c1,
                       **fit_quality(epsilon_curve(x, c0, c1, notion), y)))
    else:
      c0, c1 = fit_inverse_n(x, y)
      c = fit_inverse_sqrt_n(x, y)
      fits.append(dict(base, axis="n", d=key[4], epsilon=key[5], floor=key[6], c0=c0, c1=c1,
                       quality=fit_quality(inverse_n_curve(x, c0, c1), y), c=c,
                       quality_sqrt=fit_quality(inverse_sqrt_n_curve(x, c), y)))
  return fits


# ----------------------------------------------------------------------------- sample complexity


def sample_complexity(length_at: Callable[[int], float], nonprivate_lengths: Mapping[int, float],
                      *, step: int = 2500, max_n: int = 2_000_000) -> dict:
  """For each ``n'`` of ``nonprivate_lengths`` (``n' -> L_np(n')``, the mean non-private interval
  length), the smallest ``n`` among ``step, 2 step, ..., <= max_n`` with
  ``length_at(n) <= L_np(n')`` (the private mean length), or ``None`` if there is none
  (paper 003 Sec. 7.5, Fig. 13).

  The paper scans ``n = 2,500, 5,000, ...`` until the private length reaches the non-private
  one. Assuming the private length is non-increasing in ``n`` on the grid, this returns the same
  answer from a doubling search that brackets the first grid point at or below the target,
  then a bisection of the bracket. Targets are processed from the longest ``L_np`` down, and
  each search starts at the last grid point known to be too long, stepping ``1, 2, 4, ...``
  grid points past it; ``length_at`` is called at most once per ``n`` (memoised across
  targets). A target whose answer lies ``g`` grid points past the previous target's costs about
  ``2 log2(g) + 1`` calls, where the paper's scan costs ``g``: far fewer for sparse targets or
  large private ``n``, about as many when consecutive answers are one or two grid points apart.

  The assumption is checked on every point evaluated up to the answer: if an evaluated grid
  point is longer than the evaluated point before it (Monte Carlo noise in a flat region can do
  this), the grid is scanned linearly from that earlier point up to the answer found, and the
  first grid point at or below the target wins, as in the paper's scan. Points never evaluated
  are not checked: a dip below the target between evaluated points that show no rise can be
  missed, where the paper's scan would stop at it.

  Args:
    length_at: ``n -> `` mean private interval length at sample size ``n`` (expensive).
    nonprivate_lengths: ``{n': L_np(n')}``, finite positive lengths.
    step: grid spacing and smallest ``n`` (positive int).
    max_n: largest ``n`` to try (at least ``step``).

  Returns:
    ``{n': n or None}`` with the keys of ``nonprivate_lengths``.
  """
  if not callable(length_at):
    raise TypeError(f"length_at must be callable, got {type(length_at).__name__}")
  if not isinstance(nonprivate_lengths, Mapping) or not nonprivate_lengths:
    raise ValueError("nonprivate_lengths must be a non-empty mapping n' -> length")
  for key, value in nonprivate_lengths.items():
    if not (isinstance(value, (int, float, np.floating, np.integer)) and math.isfinite(value)
            and value > 0):
      raise ValueError(f"nonprivate_lengths[{key!r}] must be a finite positive length, got "
                       f"{value!r}")
  if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step <= 0:
    raise ValueError(f"step must be a positive int, got {step!r}")
  if isinstance(max_n, bool) or not isinstance(max_n, (int, np.integer)) or max_n < step:
    raise ValueError(f"max_n must be an int >= step ({step}), got {max_n!r}")
  top = int(max_n) // int(step)  # grid index k <-> n = k * step, k = 1 .. top
  memo: dict[int, float] = {}

  def length(k):
    if k not in memo:
      value = float(length_at(int(k * step)))
      if math.isnan(value):
        raise ValueError(f"length_at({k * step}) returned nan")
      memo[k] = value
    return memo[k]

  def first_rise(k_max):
    """The first evaluated ``k <= k_max`` whose next evaluated point is longer, or ``None``."""
    ks = sorted(k for k in memo if k <= k_max)
    return next((a for a, b in zip(ks, ks[1:]) if memo[a] < memo[b]), None)

  result = {}
  for key in sorted(nonprivate_lengths, key=lambda k: -nonprivate_lengths[k]):
    target = float(nonprivate_lengths[key])
    passing = [k for k in memo if memo[k] <= target]
    hi = min(passing) if passing else None
    failing = [k for k in memo if memo[k] > target and (hi is None or k < hi)]
    lo = max(failing) if failing else 0
    jump = 1
    while hi is None:  # doubling steps from the last known failure
      k = min(top, lo + jump)
      if length(k) <= target:
        hi = k
      elif k == top:
        break
      else:
        lo, jump = k, 2 * jump
    if hi is None:
      result[key] = None
      continue
    while hi - lo > 1:
      mid = (lo + hi) // 2
      if length(mid) <= target:
        hi = mid
      else:
        lo = mid
    rise = first_rise(hi)  # every evaluated k < hi is longer than the target
    if rise is not None:
      hi = next(k for k in range(rise + 1, hi + 1) if length(k) <= target)
    result[key] = int(hi * step)
  return {key: result[key] for key in nonprivate_lengths}


# ----------------------------------------------------------------------------- figures


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def _legend_below(fig, axes, ncol, fontsize):
  """One legend for all ``axes``, below them (never over a curve); returns its top (fraction)."""
  handles = {}
  for ax in np.ravel(axes):
    for handle, label in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(label, handle)
  if not handles:
    return 0.0
  renderer = fig.canvas.get_renderer()
  # The most columns (at most ``ncol``) whose legend fits the figure's width.
  for cols in range(max(1, min(ncol, len(handles))), 0, -1):
    legend = fig.legend(list(handles.values()), list(handles), loc="lower center",
                        bbox_to_anchor=(0.5, 0.0), ncol=cols, fontsize=fontsize, frameon=False)
    if cols == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
      break
    legend.remove()
  return legend.get_window_extent(renderer).y1 / fig.bbox.height


def _wrap_suptitle(fig):
  """Wraps the figure's title to its width (a long title would be cut at the edges)."""
  title = fig._suptitle  # pylint: disable=protected-access
  if title is None or not title.get_text():
    return
  chars = max(20, int(fig.get_figwidth() * 72 / (0.56 * title.get_fontsize())))
  title.set_text(textwrap.fill(" ".join(title.get_text().split()), chars))


def _finish(fig, plt, path, metadata, axes=None, ncol=4, layout=True):
  _wrap_suptitle(fig)
  top = _legend_below(fig, axes, ncol=ncol, fontsize=7) if axes is not None else 0.0
  if layout:
    fig.tight_layout(rect=(0, top, 1, 1))
  fig.savefig(path, dpi=120, metadata=metadata)
  plt.close(fig)


def _number(v):
  return f"{v:,.0f}" if float(v).is_integer() and abs(v) >= 1000 else f"{v:g}"


def _plain_log(ax, xvalues=None):
  """Log axes of ``ax`` with plain-number tick labels (no ``10^k`` mathtext, whose minor labels
  collide on short spans); the x ticks at ``xvalues`` (the data grid) when given, at most 8."""
  from matplotlib import ticker  # pylint: disable=import-outside-toplevel

  class Plain(ticker.LogFormatter):
    def _num_to_string(self, x, vmin, vmax):  # pylint: disable=unused-argument
      return _number(x)

  for axis in (ax.xaxis, ax.yaxis):
    if axis.get_scale() == "log":
      axis.set_major_formatter(Plain())
      axis.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
  if xvalues is not None and ax.xaxis.get_scale() == "log":
    values = sorted({float(v) for v in xvalues})
    if len(values) <= 8:
      ax.set_xticks(values, [_number(v) for v in values], fontsize=7)
      ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def _label(parts):
  return ", ".join(f"{k} = {v}" if k else str(v) for k, v in parts)


def _varying(rows, fields):
  """The fields among ``fields`` that take more than one value in ``rows``."""
  return [f for f in fields if len({r.get(f) for r in rows}) > 1]


def _suptitle_params(rows, fields):
  parts = []
  for field, name in fields:
    values = sorted({r.get(field) for r in rows if r.get(field) is not None})
    if len(values) == 1:
      parts.append(f"{name} = {values[0]:g}" if isinstance(values[0], float)
                   else f"{name} = {values[0]}")
  return ", ".join(parts)


def plot_split23(rows, path, *, metadata=None):
  """Figs. 5-8 (paper 003 Sec. 7.3.2): for each variant (a column), coverage (top) and mean CI
  length (bottom) vs ``phi_2 / (phi - phi_1)``, one line per ``d`` (and per dataset / loss when
  the rows hold several), error bars ``1.96`` s.e., the 0.95 target as a line."""
  plt = _pyplot()
  rows = coerce_rows(rows)
  _require(rows, ("variant", "d", "phi2_share", "coverage", "coverage_se", "length",
                  "length_se"))
  variants = _variants(rows)
  split = [f for f in ("dataset", "loss") if f in _varying(rows, ("dataset", "loss"))]
  series = sorted({tuple(r.get(f) for f in split) + (r["d"],) for r in rows},
                  key=lambda s: tuple(str(v) for v in s[:-1]) + (s[-1],))
  fig, axes = plt.subplots(2, len(variants), figsize=(3.5 * len(variants) + 0.4, 6.2),
                           squeeze=False)
  for j, variant in enumerate(variants):
    vrows = [r for r in rows if r["variant"] == variant]
    for i, s in enumerate(series):
      sel = sorted((r for r in vrows if tuple(r.get(f) for f in split) + (r["d"],) == s),
                   key=lambda r: r["phi2_share"])
      if not sel:
        continue
      label = _label(list(zip(split, s[:-1])) + [("d", s[-1])])
      x = [r["phi2_share"] for r in sel]
      style = dict(marker="o", ms=4, capsize=2, color=f"C{i}")
      axes[0, j].errorbar(x, [r["coverage"] for r in sel],
                          yerr=[1.96 * r["coverage_se"] for r in sel], label=label, **style)
      axes[1, j].errorbar(x, [r["length"] for r in sel],
                          yerr=[1.96 * r["length_se"] for r in sel], **style)
    axes[0, j].axhline(0.95, color="k", lw=0.8, ls=":", label="target 0.95")
    fractions = sorted({r["phi1_fraction"] for r in vrows if r.get("phi1_fraction") is not None})
    phi = "ρ" if _notion(variant) == "zcdp" else "ε"
    sub = f"\n{phi}₁/{phi} = " + ", ".join(f"{f:g}" for f in fractions) if fractions else ""
    axes[0, j].set_title(_VARIANT_TITLES[variant] + sub, fontsize=9)
    axes[0, j].set_ylabel("coverage")
    axes[1, j].set(yscale="log", xlabel=f"{phi}₂ / ({phi} − {phi}₁)", ylabel="mean CI length")
    _plain_log(axes[1, j])
  params = _suptitle_params(rows, (("dataset", "dataset"), ("loss", "loss"),
                                   ("epsilon", "ε"), ("n", "n")))
  fig.suptitle("Budget split between Hessian (φ₂) and covariance (φ₃); "
               f"±1.96 s.e.\n{params}", fontsize=9)
  _finish(fig, plt, path, metadata, axes=axes[0], ncol=6)


def plot_epsilon_grid(rows, path, *, metadata=None):
  """Figs. 11-12 (paper 003 Sec. 7.4.2): per variant (a column), heatmaps of coverage (one
  shared diverging colour scale centred on 0.95) and mean CI length (one shared log colour
  scale) over ``epsilon`` (x) and ``n`` (y), each cell annotated with its value. One pair of
  heatmap rows per (dataset, loss, d) in ``rows``."""
  plt = _pyplot()
  from matplotlib import colors  # pylint: disable=import-outside-toplevel
  rows = coerce_rows(rows)
  _require(rows, ("variant", "n", "epsilon", "coverage", "length"))
  variants = _variants(rows)
  groups = sorted({(r.get("dataset"), r.get("loss"), r.get("d")) for r in rows},
                  key=lambda g: tuple(str(v) for v in g))
  cov = np.array([r["coverage"] for r in rows])
  lengths = np.array([r["length"] for r in rows])
  cov_norm = colors.TwoSlopeNorm(vmin=min(float(cov.min()), 0.9), vcenter=0.95, vmax=1.0)
  lo, hi = float(lengths.min()), float(lengths.max())
  len_norm = colors.LogNorm(vmin=lo, vmax=hi if hi > lo else lo * 1.01)
  epss = sorted({r["epsilon"] for r in rows})
  ns = sorted({r["n"] for r in rows})
  fig, axes = plt.subplots(2 * len(groups), len(variants),
                           figsize=(max(2.8, 0.45 * len(epss) + 1.1) * len(variants) + 1.2,
                                    (max(2.6, 0.34 * len(ns) + 1.3)) * 2 * len(groups) + 0.8),
                           squeeze=False, layout="constrained")
  images = [None, None]
  for g, (dataset, loss, d) in enumerate(groups):
    for j, variant in enumerate(variants):
      sel = [r for r in rows if r["variant"] == variant and
             (r.get("dataset"), r.get("loss"), r.get("d")) == (dataset, loss, d)]
      for kind, (field, norm, fmt) in enumerate((("coverage", cov_norm, "{:.3f}"),
                                                 ("length", len_norm, "{:.3g}"))):
        grid = np.full((len(ns), len(epss)), np.nan)
        for r in sel:
          grid[ns.index(r["n"]), epss.index(r["epsilon"])] = r[field]
        ax = axes[2 * g + kind, j]
        cmap = plt.get_cmap("RdYlGn" if kind == 0 else "viridis_r")
        images[kind] = ax.imshow(np.ma.masked_invalid(grid), origin="lower", aspect="auto",
                                 cmap=cmap, norm=norm)
        for (yi, xi), value in np.ndenumerate(grid):
          if np.isfinite(value):
            red, green, blue, _ = cmap(norm(value))
            dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
            ax.text(xi, yi, fmt.format(value), ha="center", va="center", fontsize=6,
                    color="white" if dark else "black")
        ax.set_xticks(range(len(epss)), [f"{e:g}" for e in epss], fontsize=7)
        ax.set_yticks(range(len(ns)), [f"{n:,}" for n in ns], fontsize=7)
        ax.set_xlabel("ε  (ρ = ε²/2)", fontsize=8)
        ax.set_ylabel("n", fontsize=8)
        where = _label([(k, v) for k, v in (("", dataset), ("", loss), ("d", d))
                        if v is not None])
        ax.set_title(f"{_VARIANT_TITLES[variant]}\n{field}" + (f" ({where})" if where else ""),
                     fontsize=8)
    for kind, label in enumerate(("coverage (centred on 0.95)", "mean CI length (log)")):
      fig.colorbar(images[kind], ax=list(axes[2 * g + kind]), shrink=0.9).set_label(label,
                                                                                   fontsize=8)
  fig.suptitle("Coverage and mean length of private 95% CIs over n and ε", fontsize=10)
  _finish(fig, plt, path, metadata, layout=False)


def _study_axis(rows):
  """``(field, axis label, log scale)`` of the x axis of the rows' single ``vi_*`` study."""
  studies = sorted({str(r.get("study")) for r in rows})
  if len(studies) != 1 or studies[0] not in _STUDY_AXES:
    raise ValueError(f"rows: plot_ci_vs_vi needs rows of one study among {sorted(_STUDY_AXES)}, "
                     f"got {studies}")
  return _STUDY_AXES[studies[0]]


def plot_ci_vs_vi(rows, path, *, metadata=None):
  """Figs. 14-16 (paper 003 Sec. 7.6): mean CI length (solid) and variability-interval length
  (dashed) vs the study's axis, in three panels: objective perturbation (pure vs zCDP), output
  perturbation (pure vs zCDP), and all four variants. The axis follows the rows' ``study``:
  ``vi_n`` -> ``n`` (log), ``vi_d`` -> ``d``, ``vi_epsilon`` -> ``epsilon`` (log). One row of
  panels per (dataset, loss) in ``rows``."""
  plt = _pyplot()
  rows = coerce_rows(rows)
  _require(rows, ("study", "variant", "length", "vi_length"))
  field, xlabel, logx = _study_axis(rows)
  _require(rows, (field,))
  variants = _variants(rows)
  groups = sorted({(r.get("dataset"), r.get("loss")) for r in rows},
                  key=lambda g: tuple(str(v) for v in g))
  panels = (("objective perturbation", ("objective_pure", "objective_zcdp")),
            ("output perturbation", ("output_pure", "output_zcdp")),
            ("all four", VARIANTS))
  fig, axes = plt.subplots(len(groups), 3, figsize=(12.6, 3.8 * len(groups) + 0.9),
                           squeeze=False)
  for g, group in enumerate(groups):
    for p, (title, members) in enumerate(panels):
      ax = axes[g, p]
      for variant in members:
        if variant not in variants:
          continue
        sel = sorted((r for r in rows if r["variant"] == variant and
                      (r.get("dataset"), r.get("loss")) == group), key=lambda r: r[field])
        x = [r[field] for r in sel]
        color = f"C{VARIANTS.index(variant)}"
        ax.plot(x, [r["length"] for r in sel], "-o", ms=3, color=color,
                label=f"CI, {_VARIANT_TITLES[variant]}")
        ax.plot(x, [r["vi_length"] for r in sel], "--s", ms=3, color=color,
                label=f"VI, {_VARIANT_TITLES[variant]}")
      where = _label([("", v) for v in group if v is not None])
      ax.set_title(title + (f" ({where})" if where else ""), fontsize=9)
      ax.set(xlabel=xlabel, ylabel="mean interval length", yscale="log")
      if logx:
        ax.set_xscale("log")
      _plain_log(ax, [r[field] for r in rows])
  params = _suptitle_params(rows, (("n", "n"), ("d", "d"), ("epsilon", "ε")))
  fig.suptitle("Private CI (solid) vs variability interval (dashed) length"
               + (f"; {params}" if params else ""), fontsize=9)
  _finish(fig, plt, path, metadata, axes=axes[0], ncol=4)


def plot_length_fits(rows, path, *, metadata=None):
  """Figs. 17-19 (paper 003 Sec. 7.7), decided from the rows' ``study``: ``epsilon_fit`` rows ->
  per variant the mean CI length vs ``epsilon`` with the fit ``sqrt(c0 / eps^2 + c1)`` (pure)
  or ``sqrt(c0 / rho + c1)`` (zCDP) (Fig. 19); otherwise the rows at ``d = 5`` -> per variant
  the length vs ``n`` with ``c0 / n + c1 / sqrt(n)`` (solid, Fig. 17) and ``c / sqrt(n)``
  (dashed, Fig. 18). Legends give the coefficients and ``R^2``. Returns :func:`length_fits` of
  the plotted rows."""
  plt = _pyplot()
  rows = coerce_rows(rows)
  _require(rows, ("variant", "length"))
  studies = {r.get("study") for r in rows}
  by_epsilon = "epsilon_fit" in studies
  if by_epsilon and len(studies) > 1:
    raise ValueError(f"rows: epsilon_fit rows cannot be mixed with other studies, got "
                     f"{sorted(str(s) for s in studies)}")
  if not by_epsilon:
    _require(rows, ("d", "n"))
    rows = [r for r in rows if r["d"] == 5]
    if not rows:
      raise ValueError("rows: no rows at d = 5 (the n fits of Figs. 17-18 use d = 5)")
    # The paper's figures: logistic regression, and of a grid run with several eigenvalue
    # floors the library's default ("paper").
    if any(r.get("loss") == "logistic" for r in rows):
      rows = [r for r in rows if r.get("loss") in (None, "logistic")]
    if len({r.get("floor") for r in rows}) > 1:
      rows = [r for r in rows if r.get("floor") == "paper"]
  fits = length_fits(rows)
  variants = _variants(rows)
  varying = _varying(fits, ("study", "dataset", "loss", "epsilon", "n", "d"))
  fig, axes = plt.subplots(1, len(variants), figsize=(3.6 * len(variants) + 0.4, 3.9),
                           squeeze=False)
  for j, variant in enumerate(variants):
    ax = axes[0, j]
    for i, fit in enumerate(f for f in fits if f["variant"] == variant):
      color = f"C{i}"
      tag = _label([(k, fit.get(k)) for k in varying])
      tag = f" [{tag}]" if tag else ""
      x = fit["x"]
      grid = np.geomspace(x.min(), x.max(), 200)
      ax.plot(x, fit["lengths"], "o", ms=4, color=color, label=f"observed{tag}")
      if fit["axis"] == "n":
        ax.plot(grid, inverse_n_curve(grid, fit["c0"], fit["c1"]), "-", color=color,
                label=f"c0/n + c1/√n{tag}")
        ax.plot(grid, inverse_sqrt_n_curve(grid, fit["c"]), "--", color=color,
                label=f"c/√n{tag}")
        ax.text(0.97, 0.97 - 0.11 * i, f"c0 = {fit['c0']:.3g}, c1 = {fit['c1']:.3g}, "
                f"R² = {fit['quality']['r2']:.3f}\nc = {fit['c']:.3g}, "
                f"R² = {fit['quality_sqrt']['r2']:.3f}", transform=ax.transAxes, ha="right",
                va="top", fontsize=6.5, color=color)
      else:
        budget = "ε²" if fit["notion"] == "pure" else "ρ"
        ax.plot(grid, epsilon_curve(grid, fit["c0"], fit["c1"], fit["notion"]), "-",
                color=color, label=f"√(c0/{budget} + c1){tag}")
        ax.text(0.97, 0.97 - 0.11 * i,
                f"c0 = {fit['c0']:.3g}, c1 = {fit['c1']:.3g}\nR² = {fit['r2']:.3f}",
                transform=ax.transAxes, ha="right", va="top", fontsize=6.5, color=color)
    ax.set_title(_VARIANT_TITLES[variant], fontsize=9)
    ax.set(xscale="log", yscale="log", ylabel="mean CI length",
           xlabel="ε  (ρ = ε²/2)" if by_epsilon else "n")
    _plain_log(ax, [r["epsilon" if by_epsilon else "n"] for r in rows if r["variant"] == variant])
  if by_epsilon:
    title = "Mean CI length vs privacy budget; fits √(c0/ε² + c1) (ε-DP), √(c0/ρ + c1) (zCDP)"
    params = _suptitle_params(rows, (("n", "n"), ("d", "d")))
  else:
    title = "Mean CI length vs n; fits c0/n + c1/√n (solid) and c/√n (dashed)"
    params = _suptitle_params(rows, (("d", "d"), ("epsilon", "ε")))
  fig.suptitle(title + (f"\n{params}" if params else ""), fontsize=9)
  _finish(fig, plt, path, metadata, axes=axes[0], ncol=6)
  return fits


def plot_sample_complexity(rows, path, *, metadata=None):
  """Fig. 13 (paper 003 Sec. 7.5): per dataset a panel; x = non-private sample size ``n'``,
  y = private ``n`` reaching the same mean CI length, one line per variant, and ``y = x``.
  Rows with ``n_private`` ``None`` (no grid point up to ``max_n`` was short enough) are
  marked with a triangle at the panel's top edge."""
  plt = _pyplot()
  rows = coerce_rows(rows)
  _require(rows, ("dataset", "variant", "n_nonprivate"))
  variants = _variants(rows)
  datasets = sorted({r["dataset"] for r in rows})
  fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets) + 0.4, 4.2),
                           squeeze=False)
  for j, dataset in enumerate(datasets):
    ax = axes[0, j]
    drows = [r for r in rows if r["dataset"] == dataset]
    for variant in variants:
      sel = sorted((r for r in drows if r["variant"] == variant), key=lambda r: r["n_nonprivate"])
      found = [r for r in sel if r.get("n_private") is not None]
      color = f"C{VARIANTS.index(variant)}"
      ax.plot([r["n_nonprivate"] for r in found], [r["n_private"] for r in found], "-o", ms=4,
              color=color, label=_VARIANT_TITLES[variant])
      unreached = [r["n_nonprivate"] for r in sel if r.get("n_private") is None]
      if unreached:
        ax.plot(unreached, [1.0] * len(unreached), "^", color=color, ms=6, clip_on=False,
                transform=ax.get_xaxis_transform(), label=f"{_VARIANT_TITLES[variant]}: > max n")
    xs = [r["n_nonprivate"] for r in drows]
    ref = np.array([min(xs), max(xs)], dtype=np.float64)
    ax.plot(ref, ref, "k:", lw=1, label="y = x (no privacy cost)")
    ax.set(xscale="log", yscale="log", title=dataset, xlabel="non-private sample size n'",
           ylabel="private n with the same mean CI length")
    _plain_log(ax, xs)
  fig.suptitle("Sample size a private CI needs to be as short as the non-private one",
               fontsize=9)
  _finish(fig, plt, path, metadata, axes=axes[0], ncol=3)
