r"""Differentially private naive Bayes (paper 004, Sec. 3.2, Eqs. 25-28; Vaidya et al. 2013).

Paper 004 = ``../shared/papers/004_dp_machine_learning_survey.md``.

Model (Eq. 24): ``argmax_c Pr(c) prod_j Pr(x_j | c)`` with categorical
``Pr(x_j = v | c)`` and Gaussian ``N(mu_cj, sigma_cj^2)`` features.

What is released. Sufficient statistics, each a sum over records of a
per-record contribution (see :mod:`jaxdp.classic._common`), with (discrete, by
default, or continuous) Laplace noise:

* class counts ``n_c`` (Eq. 25): contribution ``e_y``, ``||.||_1 = 1``;
* categorical counts ``n_{c, j, v}`` (Eq. 26): for every categorical feature
  ``j`` one one-hot cell, ``||.||_1 = m_cat``;
* for every Gaussian feature, with the declared bounds ``[l_j, u_j]`` mapped to
  ``z = 2 (x - l_j)/(u_j - l_j) - 1 in [-1, 1]``: the per-class sums of ``z``
  and of ``z^2``; ``||.||_1 <= 2 m_num``.

Instead of Eqs. 27-28 (noise on the mean and the standard deviation with a
sensitivity ``(u - l)/(n + 1)`` that uses the private class size ``n_c`` and
assumes add/remove with a known ``n``), the means and variances are computed
from the noisy sums and the *noisy* counts: ``mu = S/n~``,
``sigma^2 = Q/n~ - mu^2`` (post-processing, no extra cost, no private ``n_c``
in any noise scale).

Budget split (explicit, basic composition, Dwork & Roth Thm. 3.16). The three
blocks get ``epsilon_b = epsilon w_b / sum(w)`` with ``w = budget_split``
(default proportional to the blocks' sensitivities ``(1, m_cat, 2 m_num)``,
which gives every released number the same Laplace scale, i.e. one Laplace
mechanism on the concatenated vector). Block ``b`` gets
``Lap(Delta_b / epsilon_b)`` with ``Delta_b = B_b`` (add/remove) or ``2 B_b``
(replace-one), so the fit is ``sum_b epsilon_b = epsilon``-DP. The survey's
``Lap(1/epsilon)`` on *every* count (Eqs. 25-26) composes to
``(1 + m_cat) epsilon`` (and replace-one doubles it); that is not what is
spent here.

Noise (``noise``, :mod:`jaxdp.classic._common`). ``"discrete"`` (default): the
discrete Laplace mechanism on public grids (Canonne, Kamath & Steinke 2020,
``CKS``, Algorithm 2), each block ``eps_b``-DP, so the fit is again
``epsilon``-DP (basic composition), charged as one ``PureDpEvent(eps_b)`` per
released block (:func:`jaxdp.mechanisms.discrete_laplace_mechanism_event`):

* class counts and categorical counts are integers on the grid ``1 Z``: integer
  noise of scale ``t/s >= Delta_b/eps_b`` (``Delta_b`` = 1 or 2, and ``m_cat``
  or ``2 m_cat``) is added exactly; the rounded sensitivity is ``Delta_b``
  itself, so the scale is the continuous one;
* the numeric block (sums of ``z`` and of ``z^2`` together, a vector of
  ``2 C m_num`` numbers, ``Delta_num = 2 m_num`` or ``4 m_num``) is rounded to
  the grid ``g Z`` and gets discrete Laplace noise of scale ``t/s >= K_1/eps_num``
  grid steps, ``K_1 = ceil(Delta_num/g) + (c - 1)`` with ``c`` the coordinates a
  record changes: ``c = 2 m_num`` (add/remove: its class row of sums and of
  squares) or ``c = 4 m_num`` (replace-one: two class rows). ``g`` is the largest
  power of two ``<= Delta_num/(c 2^10) = 2^-10``
  (:func:`jaxdp.classic._common.sum_grid_step`; doubled only if the noise would
  exceed ``2^19`` grid steps, i.e. when ``m_num/eps_num > 2^8`` under add/remove
  or ``2^7`` under replace-one), so ``K_1 = 2^10 Delta_num + c - 1`` and the noise
  scale in ``z`` units is ``K_1 g/eps_num < (1 + 2^-10) Delta_num/eps_num``. The
  sums are at most ``n`` in absolute value, so ``n/g`` must stay below
  ``2^30 - 64`` (``n`` below about ``10^6`` at ``g = 2^-10``), else ``ValueError``.

Every released number then lies on ``g Z`` (counts on ``Z``): a support that does
not depend on the data (``docs/sharp_edges.md``). ``"continuous"``: the float
Laplace noise ``Lap(Delta_b/eps_b)`` (Dwork & Roth Thm. 3.6) and one
``LaplaceDpEvent(1/eps_b)`` per block.

Post-processing to probabilities: counts floored at 0 plus Laplace smoothing
``alpha`` (as scikit-learn's ``CategoricalNB``), class sizes floored at 1,
variances clipped to ``[var_floor, 1]`` in ``z`` units (by default ``var_floor`` is the
noise level of each class's variance estimate, :func:`model_from_statistics`). With
``epsilon = inf`` and ``alpha = 1`` the categorical model equals scikit-learn's
``CategoricalNB(alpha=1)`` and the Gaussian one ``GaussianNB`` (up to its
``var_smoothing``).

Floating point. The sums are accumulated in float64 (a scoped
``jax.enable_x64``) and the noise (integers, or float32 Laplace draws) is added in float64; the
released statistics are float64. In float32 the rounding of sums over
``n = 2e5`` records made the same-key difference of two neighbouring releases
exceed the sensitivity by about 0.1%; in float64 any summation order errs by at
most ``gamma_n sum_i |f(x_i)|``, ``gamma_n = n u / (1 - n u)``, ``u = 2^-53``
(Higham 2002, Eq. 4.4), a worst-case relative excess below ``1e-5`` for
``n <= 2e5`` and of order ``sqrt(n) u`` in practice. The model is a float32
post-processing of the released float64 statistics.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
from sklearn.base import BaseEstimator, ClassifierMixin

from jaxdp import _estimator_checks as checks
from jaxdp import _keys
from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.classic import _common
from jaxdp.mechanisms import discrete
from jaxdp.mechanisms import laplace_noise


class NaiveBayesStats(NamedTuple):
  """(Noisy) sufficient statistics: the DP release itself."""
  class_counts: jax.Array        # (C,)
  cat_counts: jax.Array          # (m_cat, C, K_max), padded cells are unused
  num_sums: jax.Array            # (C, m_num) sums of z
  num_squares: jax.Array         # (C, m_num) sums of z^2


class NaiveBayesModel(NamedTuple):
  """Log-probabilities of the fitted model (a post-processing of the stats)."""
  log_prior: jax.Array           # (C,)
  cat_log_prob: jax.Array        # (m_cat, C, K_max); -inf on padded cells
  mean: jax.Array                # (C, m_num) in z units
  var: jax.Array                 # (C, m_num) in z units
  lower: jax.Array               # (m_num,)
  upper: jax.Array               # (m_num,)


class NaiveBayesCalibration(NamedTuple):
  """Per-block sensitivities, epsilons and noise scales (output units).

  ``grid_steps`` (1, 1, ``g``) and ``changed`` (the coordinates of each block a
  record changes, used in the rounded sensitivity of the numeric block) are
  those of ``noise="discrete"``; ``scales`` are ``t/s`` times the grid step
  there, ``Delta_b/eps_b`` for ``"continuous"``.
  """
  sensitivities: tuple[float, float, float]   # (classes, categorical, numeric)
  epsilons: tuple[float, float, float]
  scales: tuple[float, float, float]
  neighbouring: str
  noise: str = "continuous"
  grid_steps: tuple[float, float, float] = (0.0, 0.0, 0.0)
  changed: tuple[int, int, int] = (0, 0, 0)


def _check_feature_count(value: Any, name: str) -> int:
  """A number of features: an integer ``>= 0`` (bools, floats and negatives raise)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
    raise ValueError(f"{name} must be an integer >= 0 (a number of features), got {value!r}.")
  return int(value)


def naive_bayes_calibration(*, num_cat: int, num_num: int, epsilon: float,
                            neighbouring: str = "replace_one",
                            budget_split: Sequence[float] | None = None,
                            noise: str = "discrete") -> NaiveBayesCalibration:
  """Noise scales of the three blocks (module docstring), ``noise`` as :func:`private_naive_bayes`.

  ``epsilon = inf`` gives zero scales (the non-private model).
  """
  noise = _common.check_noise(noise)
  rel = _common.check_relation(neighbouring)
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  m_cat = _check_feature_count(num_cat, "num_cat")
  m_num = _check_feature_count(num_num, "num_num")
  per_record = (1.0, float(m_cat), 2.0 * float(m_num))
  sens = tuple(_common.sum_sensitivity(b, rel) for b in per_record)
  if budget_split is None:
    weights = per_record
  else:
    weights = tuple(float(_validation.check_nonnegative(w, "budget_split")) for w in budget_split)
    if len(weights) != 3:
      raise ValueError(f"budget_split must have 3 weights (classes, categorical, numeric), got {budget_split!r}.")
  used = [w for w, b in zip(weights, per_record) if b > 0]
  if any(w <= 0 for w in used):
    raise ValueError(f"budget_split gives zero budget to a block that is released: {weights!r}.")
  total = sum(w for w, b in zip(weights, per_record) if b > 0)
  eps_b = tuple((eps * w / total if b > 0 else 0.0) for w, b in zip(weights, per_record))
  released = tuple(b > 0 and math.isfinite(eps) for b in per_record)
  two = 1 if rel == events.ADD_REMOVE else 2  # class rows a record touches
  changed = (two, two * m_cat, two * 2 * m_num)
  if noise == "continuous":
    scales = tuple((s / e if r else 0.0) for s, e, r in zip(sens, eps_b, released))
    return NaiveBayesCalibration(sens, eps_b, scales, rel, noise, (0.0, 0.0, 0.0), changed)
  grid = (1.0, 1.0, _common.sum_grid_step(sens[2], eps_b[2], changed[2]) if released[2] else 0.0)
  scales = []
  for i, r in enumerate(released):
    if not r:
      scales.append(0.0)
      continue
    t, s = (_common.discrete_count_parameters(sens[i], eps_b[i]) if i < 2 else
            discrete.discrete_laplace_scale(sens[i], eps_b[i], grid[i], changed[i]))
    scales.append(t / s * grid[i])
  return NaiveBayesCalibration(sens, eps_b, tuple(scales), rel, noise, grid, changed)


def naive_bayes_event(cal: NaiveBayesCalibration) -> events.DpEvent:
  """``ComposedDpEvent`` of one event per released block.

  ``noise="continuous"``: ``LaplaceDpEvent(1/epsilon_b)``; ``"discrete"``:
  ``PureDpEvent(epsilon_b)`` (:func:`jaxdp.mechanisms.discrete_laplace_mechanism_event`,
  which also validates the grid parameters).
  """
  if any(math.isinf(e) for e in cal.epsilons):
    return events.NonPrivateDpEvent()
  if cal.noise == "discrete":
    # Counts: changed=1 in the rounded sensitivity (integers, no rounding: module docstring).
    leaves = [discrete.discrete_laplace_mechanism_event(
        s, e, g, max_changed_coordinates=(1 if i < 2 else c), neighbouring=cal.neighbouring)
              for i, (s, e, g, c) in enumerate(zip(cal.sensitivities, cal.epsilons,
                                                   cal.grid_steps, cal.changed)) if e > 0]
  else:
    leaves = [events.LaplaceDpEvent(noise_multiplier=sc / s, neighbouring=cal.neighbouring)
              for s, sc, e in zip(cal.sensitivities, cal.scales, cal.epsilons) if e > 0]
  return leaves[0] if len(leaves) == 1 else events.ComposedDpEvent(leaves)


@functools.partial(jax.jit, static_argnames=("num_classes", "k_max"))
def exact_statistics(y, x_cat, z, *, num_classes: int, k_max: int) -> NaiveBayesStats:
  """Exact sufficient statistics (the per-record sums of the module docstring), in ``z.dtype``."""
  onehot_y = jax.nn.one_hot(y, num_classes, dtype=z.dtype)                  # (n, C)
  class_counts = onehot_y.sum(0)
  onehot_x = jax.nn.one_hot(x_cat, k_max, dtype=z.dtype)                    # (n, m_cat, K)
  cat_counts = jnp.einsum("nc,njk->jck", onehot_y, onehot_x)
  num_sums = onehot_y.T @ z
  num_squares = onehot_y.T @ (z * z)
  return NaiveBayesStats(class_counts, cat_counts, num_sums, num_squares)


def _perturb_discrete(key, stats: NaiveBayesStats, cal: NaiveBayesCalibration) -> NaiveBayesStats:
  """The discrete release (module docstring): exact integer noise on the counts, the numeric
  block (sums and squares together) on the grid ``g Z`` by the discrete Laplace mechanism."""
  k1, k2, k3, _ = jax.random.split(key, 4)
  sens, eps, grid, changed = cal.sensitivities, cal.epsilons, cal.grid_steps, cal.changed

  def counts(k, value, i):
    if not eps[i] > 0:
      return value
    t, s = _common.discrete_count_parameters(sens[i], eps[i])
    return value + discrete.discrete_laplace_noise(k, value.shape, t, s).astype(value.dtype)

  sums, squares = stats.num_sums, stats.num_squares
  if eps[2] > 0:
    both = discrete.discrete_laplace_mechanism(
        k3, jnp.stack([sums, squares]), sens[2], eps[2], grid[2],
        max_changed_coordinates=changed[2])
    sums, squares = both[0], both[1]
  return NaiveBayesStats(counts(k1, stats.class_counts, 0), counts(k2, stats.cat_counts, 1),
                         sums, squares)


def _perturb(key, stats: NaiveBayesStats, scales) -> NaiveBayesStats:
  """Adds the float32 Laplace draws to the statistics in their dtype (float64 when released)."""
  k1, k2, k3, k4 = jax.random.split(key, 4)
  sc, scat, snum = scales
  return NaiveBayesStats(
      stats.class_counts + laplace_noise(k1, stats.class_counts.shape, sc),
      stats.cat_counts + laplace_noise(k2, stats.cat_counts.shape, scat),
      stats.num_sums + laplace_noise(k3, stats.num_sums.shape, snum),
      stats.num_squares + laplace_noise(k4, stats.num_squares.shape, snum))


def model_from_statistics(stats: NaiveBayesStats, num_categories: jax.Array, lower, upper, *,
                          alpha: float = 1.0, var_floor: float | None = None,
                          sum_scale: float = 0.0) -> NaiveBayesModel:
  """Post-processing of (noisy) statistics into a model (no privacy cost).

  ``var_floor=None`` (default) floors class ``c``'s variances (``z`` units) at
  ``clip(sqrt(2) sum_scale / n~_c, 1e-4, 0.25)``: the standard deviation of the
  Laplace noise (scale ``sum_scale``) in ``Q_c / n~_c``: a variance below its
  own noise level is not evidence of a peaked class, and flooring there keeps
  noisy near-zero variances from dominating the likelihood (Adult, 10,000
  rows: 0.66 -> about 0.75 accuracy at epsilon = 0.1, 0.64 -> 0.80 at 1), capped at
  0.25, the largest variance of a variable in ``[0, 1]``. Computed from released
  numbers only, so post-processing.
  """
  counts = jnp.maximum(stats.class_counts, 0.0)
  log_prior = jnp.log(counts + 1e-12) - jnp.log(jnp.sum(counts) + 1e-12)
  k_max = stats.cat_counts.shape[-1]
  valid = jnp.arange(k_max)[None, :] < num_categories[:, None]               # (m_cat, K)
  cell = jnp.where(valid[:, None, :], jnp.maximum(stats.cat_counts, 0.0) + alpha, 0.0)
  denom = cell.sum(-1, keepdims=True)
  cat_log_prob = jnp.where(valid[:, None, :], jnp.log(cell) - jnp.log(denom), -jnp.inf)
  n_c = jnp.maximum(stats.class_counts, 1.0)[:, None]
  mean = jnp.clip(stats.num_sums / n_c, -1.0, 1.0)
  if var_floor is None:
    floor = jnp.clip(math.sqrt(2.0) * sum_scale / n_c, 1e-4, 0.25)
  else:
    floor = jnp.asarray(var_floor, jnp.float32)
  var = jnp.clip(stats.num_squares / n_c - mean * mean, floor, 1.0)
  return NaiveBayesModel(log_prior, cat_log_prob, mean, var,
                         jnp.asarray(lower, jnp.float32), jnp.asarray(upper, jnp.float32))


def _to_z(x_num, lower, upper):
  return 2.0 * (x_num - lower) / (upper - lower) - 1.0


@jax.jit
def joint_log_likelihood(model: NaiveBayesModel, x_cat, x_num):
  """``log Pr(c) + sum_j log Pr(x_j | c)`` for every class: ``(n, C)``."""
  out = jnp.broadcast_to(model.log_prior, (x_cat.shape[0], model.log_prior.shape[0]))
  if x_cat.shape[1]:
    # cat_log_prob[j, c, x_cat[n, j]] summed over j.
    lp = jnp.take_along_axis(model.cat_log_prob[None], x_cat[:, :, None, None], axis=3)[..., 0]
    out = out + lp.sum(1)
  if x_num.shape[1]:
    z = jnp.clip(_to_z(x_num, model.lower, model.upper), -1.0, 1.0)
    ll = -0.5 * (jnp.log(2 * jnp.pi * model.var)[None] + (z[:, None, :] - model.mean[None]) ** 2 / model.var[None])
    out = out + ll.sum(-1)
  return out


def _prepare(x_cat, x_num, y, *, num_classes, num_categories, lower, upper, clip):
  """Validates inputs (bounds policy of :mod:`jaxdp.classic._common`)."""
  num_classes = _validation.check_positive_int(num_classes, "num_classes")
  n = None
  if x_cat is not None:
    xc = _validation.check_finite_array(x_cat, "x_cat")
    if xc.ndim != 2:
      raise ValueError(f"x_cat must be 2-D (examples, features), got shape {xc.shape}.")
    if num_categories is None:
      raise ValueError("num_categories (the public number of values of each categorical "
                       "feature) is required with x_cat; reading it off the data leaks.")
    kc = np.broadcast_to(np.asarray(num_categories, np.int64), (xc.shape[1],))
    if np.any(kc < 1):
      raise ValueError(f"num_categories must be >= 1, got {num_categories!r}.")
    if not np.all(np.equal(np.mod(xc, 1), 0)):
      raise ValueError("x_cat must hold integer category codes.")
    xc = xc.astype(np.int64)
    if xc.size and (np.any(xc < 0) or np.any(xc >= kc[None, :])):
      j = int(np.argwhere((xc < 0) | (xc >= kc[None, :]))[0, 1])
      raise ValueError(f"x_cat column {j} has codes outside {{0, ..., {kc[j] - 1}}} (num_categories).")
    n = xc.shape[0]
  else:
    kc = np.zeros((0,), np.int64)
  if x_num is not None:
    xn = _validation.check_finite_array(x_num, "x_num")
    if xn.ndim != 2:
      raise ValueError(f"x_num must be 2-D (examples, features), got shape {xn.shape}.")
    lo, hi = _common.check_bounds(lower, upper, xn.shape[1], "x_num bounds")
    xn = _common.check_data_in_bounds(xn, lo, hi, clip=clip, name="x_num")
    if n is not None and xn.shape[0] != n:
      raise ValueError(f"x_cat and x_num must have the same number of rows, got {n} and {xn.shape[0]}.")
    n = xn.shape[0]
  else:
    lo = hi = np.zeros((0,))
  if n is None:
    raise ValueError("give at least one of x_cat and x_num.")
  xc = xc if x_cat is not None else np.zeros((n, 0), np.int64)
  xn = xn if x_num is not None else np.zeros((n, 0))
  yy = _common.check_labels(y, num_classes, n)
  return xc, xn, yy, kc, lo, hi, num_classes


def private_naive_bayes(key: jax.Array, x_cat: Any, x_num: Any, y: Any, *, num_classes: int,
                        epsilon: float, num_categories: Any = None, lower: Any = None,
                        upper: Any = None, clip: bool = False,
                        neighbouring: str = "replace_one",
                        budget_split: Sequence[float] | None = None,
                        alpha: float = 1.0, var_floor: float | None = None,
                        accountant: Any = None,
                        noise: str = "discrete") -> tuple[NaiveBayesModel, NaiveBayesStats, events.DpEvent]:
  """Fits an ``epsilon``-DP naive Bayes model (module docstring).

  Args:
    key: a ``jax.random`` key, used once.
    x_cat: ``(n, m_cat)`` integer codes or None.
    x_num: ``(n, m_num)`` continuous features or None.
    y: ``(n,)`` labels in ``{0, ..., num_classes - 1}`` (public label set).
    num_classes: number of classes ``C``.
    epsilon: total privacy parameter (``inf``: no noise, for baselines).
    num_categories: public number of values of each categorical feature.
    lower, upper: declared bounds of the continuous features (required).
    clip: clip continuous values to the bounds (otherwise out-of-bound values raise).
    neighbouring: ``"replace_one"`` (default, like the library's estimators) or ``"add_remove"``.
    budget_split: weights of (class counts, categorical counts, numeric sums).
    alpha, var_floor: post-processing smoothing (``var_floor=None``: at the noise level,
      :func:`model_from_statistics`).
    accountant: optional accountant/budget; the event is spent before release.
    noise: ``"discrete"`` (default: discrete Laplace on public grids, every released
      number on ``g Z``) or ``"continuous"`` (float Laplace); module docstring.

  Returns:
    ``(model, noisy_stats, event)``.
  """
  _validation.check_key(key)
  noise = _common.check_noise(noise)
  xc, xn, yy, kc, lo, hi, c = _prepare(x_cat, x_num, y, num_classes=num_classes,
                                        num_categories=num_categories, lower=lower,
                                        upper=upper, clip=clip)
  cal = naive_bayes_calibration(num_cat=xc.shape[1], num_num=xn.shape[1], epsilon=epsilon,
                                neighbouring=neighbouring, budget_split=budget_split,
                                noise=noise)
  if noise == "discrete" and 0 < cal.epsilons[2] < math.inf:
    _common.check_grid_range(float(xn.shape[0]), cal.grid_steps[2],
                             "a per-class sum of z or z^2 (at most n)")
  event = naive_bayes_event(cal)
  _common.spend(accountant, event)
  k_max = int(kc.max()) if kc.size else 1
  z = _to_z(xn, lo, hi) if xn.shape[1] else xn
  with jax.enable_x64(True):  # float64 sums (module docstring, "Floating point")
    stats = exact_statistics(jnp.asarray(yy, jnp.int32), jnp.asarray(xc, jnp.int32),
                             jnp.asarray(z, jnp.float64), num_classes=c, k_max=k_max)
    if noise == "discrete" and math.isfinite(cal.epsilons[0]):
      released = _perturb_discrete(key, stats, cal)
    else:
      released = _perturb(key, stats, cal.scales)
    noisy = NaiveBayesStats(*(np.asarray(a, np.float64) for a in released))
  model = model_from_statistics(noisy, jnp.asarray(kc, jnp.int32), lo, hi, alpha=alpha,
                                var_floor=var_floor, sum_scale=float(cal.scales[2]))
  return model, noisy, event


class PrivateNaiveBayes(checks.SharedAccountantMixin, ClassifierMixin, BaseEstimator):
  """Private naive Bayes (categorical and/or Gaussian features), a scikit-learn classifier.

  ``fit(x, y)`` takes one array whose columns ``categorical_features`` are
  integer codes (``num_categories`` values each) and whose other columns are
  continuous within ``[lower, upper]`` (one bound per continuous column, in
  their order in ``x``). Each fit spends its event on ``accountant`` before
  releasing anything. ``noise``: ``"discrete"`` (default) or ``"continuous"``,
  as :func:`private_naive_bayes`.

  ``classes``: the PUBLIC label set, as for every jaxdp estimator
  (:func:`jaxdp._estimator_checks.encode_labels`; ``None`` is NOT private and warns).

  One-hot / categorical data. Give every 0/1 indicator column (a one-hot
  encoded category, a yes/no flag) to ``categorical_features`` with
  ``num_categories=2``, and declare ``lower``/``upper`` for the continuous
  columns only. A Gaussian is a poor model of a 0/1 column: a rare indicator
  has a class variance near zero, so a row where it is 1 costs that class
  hundreds of log-likelihood units and a few rare columns decide the prediction
  (0.64 test accuracy on Adult even without noise). Under noise each of the
  ~100 Gaussian columns adds a noisy term to the log-odds and their sum swamps
  the few informative columns, so the fit falls to the majority class (Adult:
  every test row at ``epsilon = 0.1``; at ``epsilon = 1``, 85-90% of them and
  0.76 accuracy against a majority rate of 0.754), whereas the categorical
  path's terms are logs of smoothed counts and it reaches about 0.82 at
  ``epsilon = 1``::

    import numpy as np
    from jaxdp import classic, data

    ds = data.load("adult", scale=False, add_constant=False, unit_ball=False)
    bounds = {"age": (17, 90), "fnlwgt": (0, 1.5e6), "education-num": (1, 16),
              "capital-gain": (0, 2e4), "capital-loss": (0, 3e3),
              "hours-per-week": (1, 99)}  # public ranges, chosen without the data
    names = list(ds.feature_names)
    num = [j for j, f in enumerate(names) if f in bounds]
    cat = [j for j, f in enumerate(names) if f not in bounds]  # one-hot 0/1 columns
    lower, upper = np.array([bounds[names[j]] for j in num]).T
    labels = np.asarray(ds.class_names)                        # ("<=50K", ">50K")
    nb = classic.PrivateNaiveBayes(epsilon=1.0, classes=labels,
                                   categorical_features=cat, num_categories=2,
                                   lower=lower, upper=upper, clip=True)
    nb.fit(ds.x_train, labels[ds.y_train])
    print(nb.score(ds.x_test, labels[ds.y_test]))              # about 0.82

  With no ``categorical_features`` every column is Gaussian and needs
  ``lower``/``upper``; leaving them out raises ``ValueError`` at ``fit``.

  scikit-learn conventions, a shared ``accountant`` and the noise-key rule
  (``seed=None``: fresh OS entropy per fit):
  :class:`jaxdp._estimator_checks.SharedAccountantMixin`.

  Attributes (after ``fit``): ``model_`` (the private :class:`NaiveBayesModel`),
  ``event_``, ``classes_`` (the label set, public when ``classes`` is given),
  ``n_features_in_``.
  """

  def __init__(self, *, epsilon: float, classes: Any = None,
               categorical_features: Sequence[int] = (), num_categories: Any = None,
               lower: Any = None, upper: Any = None,
               clip: bool = False, neighbouring: str = "replace_one",
               budget_split: Sequence[float] | None = None, alpha: float = 1.0,
               var_floor: float | None = None, accountant: Any = None, seed: Any = None,
               noise: str = "discrete"):
    self.epsilon = epsilon
    self.classes = classes
    self.categorical_features = categorical_features
    self.num_categories = num_categories
    self.lower, self.upper, self.clip = lower, upper, clip
    self.neighbouring = neighbouring
    self.budget_split, self.alpha, self.var_floor = budget_split, alpha, var_floor
    self.accountant, self.seed = accountant, seed
    self.noise = noise
    self._fits = 0

  def _check_params(self) -> dict[str, Any]:
    """The parameters checked (before any work); the attributes are left unchanged."""
    epsilon = _validation.check_epsilon(self.epsilon, "epsilon", allow_inf=True)
    classes = checks.check_classes(self.classes, "classes")
    noise = _common.check_noise(self.noise)
    cats = self.categorical_features
    if isinstance(cats, (str, bytes)) or not hasattr(cats, "__iter__"):
      raise ValueError("categorical_features must be a sequence of column indices (ints), got "
                       f"{type(cats).__name__}.")
    cat_features = tuple(cats)
    if any(isinstance(j, bool) or not isinstance(j, (int, np.integer)) for j in cat_features):
      raise ValueError("categorical_features must be a sequence of column indices (ints).")
    cat_features = tuple(int(j) for j in cat_features)
    if not cat_features and (self.lower is None or self.upper is None):
      raise ValueError(
          "lower and upper are required: with no categorical_features every column of x is "
          "modelled as a Gaussian within declared public bounds. Declare lower/upper for the "
          "continuous columns, and list the 0/1 indicator (one-hot) columns in "
          "categorical_features with num_categories=2 (a Gaussian fit of indicator columns "
          "predicts the majority class under noise; see the PrivateNaiveBayes docstring).")
    neighbouring = _common.check_relation(self.neighbouring)
    _common.check_accountant(self.accountant)
    _keys.check_seed(self.seed, "seed")
    return dict(epsilon=epsilon, classes=classes, noise=noise,
                cat_features=cat_features, neighbouring=neighbouring)

  @staticmethod
  def _split(x, cat_features):
    x = _validation.check_finite_array(x, "x")
    if x.ndim != 2:
      raise ValueError(f"x must be 2-D, got shape {x.shape}.")
    bad = [j for j in cat_features if not -x.shape[1] <= j < x.shape[1]]
    if bad:
      raise ValueError(f"categorical_features: column {bad[0]} is out of range for x with "
                       f"{x.shape[1]} columns.")
    cat = np.zeros(x.shape[1], bool)
    cat[list(cat_features)] = True
    x_cat = x[:, cat] if cat.any() else None
    x_num = x[:, ~cat] if (~cat).any() else None
    return x_cat, x_num

  def fit(self, x: Any, y: Any) -> "PrivateNaiveBayes":
    """Fits privately; parameters, ``x`` and ``y`` are checked before any key or spend."""
    p = self._check_params()
    x_cat, x_num = self._split(x, p["cat_features"])
    y_np = checks.check_y(y, int(np.shape(x)[0]), "y")
    classes, y_idx = checks.encode_labels(y_np, p["classes"], "y", "classes", stacklevel=3)
    key = _keys.fit_key(self.seed, self._fits)
    self._fits += 1
    model, _, event = private_naive_bayes(
        key, x_cat, x_num, y_idx, num_classes=classes.size, epsilon=p["epsilon"],
        num_categories=self.num_categories, lower=self.lower, upper=self.upper, clip=self.clip,
        neighbouring=p["neighbouring"], budget_split=self.budget_split, alpha=self.alpha,
        var_floor=self.var_floor, accountant=self.accountant, noise=p["noise"])
    self.model_, self.event_ = model, event
    self.classes_ = classes
    self.n_features_in_ = int(np.shape(x)[1])  # x was checked 2-D by _split
    self._cat_features, self._num_categories = p["cat_features"], self.num_categories
    return self

  def predict_log_joint(self, x: Any) -> np.ndarray:
    """``log Pr(c) + sum_j log Pr(x_j | c)``: ``(n, len(classes_))``, in ``classes_`` order."""
    checks.check_is_fitted(self, "model_")  # NotFittedError (a ValueError)
    x = _common.check_query_x(x, self.n_features_in_, self)
    x_cat, x_num = self._split(x, self._cat_features)
    n = np.asarray(x).shape[0]
    xc = np.zeros((n, 0), np.int32) if x_cat is None else np.clip(
        x_cat.astype(np.int32), 0, np.broadcast_to(np.asarray(self._num_categories), (x_cat.shape[1],)) - 1)
    xn = np.zeros((n, 0), np.float32) if x_num is None else x_num.astype(np.float32)
    return np.asarray(joint_log_likelihood(self.model_, jnp.asarray(xc), jnp.asarray(xn)))

  def predict_log_proba(self, x: Any) -> np.ndarray:
    """``log Pr(c | x)`` under the released model: the log joint minus its logsumexp over classes.

    Post-processing of the released model (no further privacy cost); columns in
    ``classes_`` order, as scikit-learn's ``GaussianNB.predict_log_proba``.
    """
    joint = np.asarray(self.predict_log_joint(x), np.float64)
    return joint - scipy.special.logsumexp(joint, axis=1, keepdims=True)

  def predict_proba(self, x: Any) -> np.ndarray:
    """``Pr(c | x)`` under the released model, ``(n, len(classes_))``; rows sum to 1."""
    return np.exp(self.predict_log_proba(x))

  def predict(self, x: Any) -> np.ndarray:
    """The most probable label of ``classes_`` for every row."""
    joint = self.predict_log_joint(x)  # checks first (NotFittedError before classes_ is read)
    return self.classes_[np.argmax(joint, axis=1)]

  def score(self, x: Any, y: Any) -> float:
    """Accuracy: the share of rows whose predicted label equals ``y``'s."""
    return float(np.mean(self.predict(x) == np.asarray(y)))
