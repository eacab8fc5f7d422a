"""The classic models (``jaxdp.classic``, paper 004 Sec. 3) and the functional mechanism.

Every public release point of the family, with its claim written here from the
theorem (paper 004 = ``shared/papers/004_dp_machine_learning_survey.md``), not
read off the library's calibration:

* ``private_quantile`` / ``private_bounds``: the exponential mechanism over a
  public grid (McSherry & Talwar 2007; Smith 2011), ``beta = eps/2``, utility
  sensitivity 1; output support the grid ``k 2^-10`` of ``[0, 1]``.
* ``private_naive_bayes``: the sufficient statistics (Eqs. 25-28 with the budget
  split by sensitivity): per-record L1 contribution ``1 + m_cat + 2 m_num``,
  doubled under replace-one, every block at the same scale ``Delta / eps``.
* ``private_random_trees`` (Eq. 31, ``tree_budget="disjoint"``: one tree per
  record): leaf counts with L1 sensitivity 2 (replace-one), scale ``2/eps``.
* ``dp_lloyd`` (SuLQ / Su et al. 2016): ``T`` iterations at ``eps/T``, counts and
  sums at ``f eps/T`` and ``(1 - f) eps/T``.
* ``sample_aggregate_kmeans`` (Nissim-Raskhodnikova-Smith 2007; Eq. 33): mean
  of ``q`` block outputs, L1 sensitivity ``K sum_j (u_j - l_j) / q``;
  clipping the noisy mean to the box is 1-Lipschitz, so the same-key replay
  bound holds for the released value (entry at ``eps = 20`` so that the clip
  does not hide the difference; its first pair catches the issue 26 item 3
  defect, a block borrowing another block's rows, on every key).

Noise (issue 26). These four releases default to the discrete Laplace mechanism
on a public grid (Canonne-Kamath-Steinke 2020, Alg. 2; ``PureDpEvent`` per
release): counts are integers on ``1 Z`` (no rounding, rounded sensitivity =
``Delta``, scale ``Delta/eps``), sums/means are rounded to ``g Z`` with ``g`` the
largest power of two ``<= Delta_1/(c 2^10)`` (``c`` = coordinates one record
changes) and get scale ``K_1 g/eps`` with ``K_1 = ceil(Delta_1/g) + (c - 1)``
(the rounded-sensitivity bound of ``jaxdp/mechanisms/discrete.py``), which is
also the replay sensitivity in output units. The float Laplace path
(``noise="continuous"``) is registered as ``<name>[noise=continuous]``.
* ``private_pca`` (Laplace variant, Sec. 3.5): upper triangle of ``X^T X`` plus
  ``Lap(Delta_1/eps)``, ``Delta_1 = d + 1`` under replace-one (rows in the unit ball).
* ``private_linear_regression`` and the functional mechanism (Zhang et al. 2012,
  Eqs. 18-20): Laplace on the polynomial coefficients, ``Delta = 2(2 sqrt(D) + D)``;
  the release is the minimiser of the noisy polynomial (post-processing), so
  the replay and noise checks do not apply (the additive part is checked in
  ``tests/classic/test_float64_sums.py``).

The estimators (``Private*.fit``) release post-processings of the same
statistics; their entries check the seeding (fresh OS entropy by default,
issue 26 item 2), the spend and the fitted attributes.

Pairs (replace-one, the family's default relation; worst case first): a record
moved from the lower to the upper corner of the declared box with its label and
category changed, a record beyond the clip (``-5`` / ``7``), a duplicated row;
k-means pairs use blocks with fewer than ``K`` rows (under-full).
"""

from __future__ import annotations

import math

import numpy as np

import conformance_checks as cc
import conformance_registry as reg
from jaxdp.accounting import events

FAMILY = "classic"
EPS = 1.0
REL = "replace_one"
N = 20
GRID_POINTS = 2**10 + 1             # quantile candidates k / 2^10 on [0, 1]
GRID_STEP = 2.0**-10

_HOST = ("host-side fit (validation on the host; not vmappable): 2 x trials calls do not fit "
         "the always-on suite; the release is pinned by the replay check (same noise: difference "
         "<= Delta) and the noise-scale check (Laplace b = Delta/eps), and audited on the worst-"
         "case pair in tests/classic/")
_POST = ("the release is a post-processing (minimiser, centroids or model) of noisy statistics, "
         "not an additive-noise statistic: the replay/noise checks apply to the statistic's own "
         "entry")
_ESTIMATOR_PUBLIC = ("classes_", "event_", "seed", "_fits", "epsilon", "classes", "lower",
                     "upper", "accountant", "n_clusters", "n_components", "noise")
_NO_ACCOUNTANT = ("a pure function with no accountant parameter: it returns the event of one "
                  "release; PrivateLinearRegression.fit and private_linear_regression check the spend")


def _classic():
  import jaxdp.classic as classic  # pylint: disable=import-outside-toplevel
  return classic


def _flat(*arrays) -> np.ndarray:
  return np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in arrays])


def _laplace(noise_multiplier: float) -> events.DpEvent:
  return events.LaplaceDpEvent(noise_multiplier=noise_multiplier, neighbouring=REL)


def _pure(eps: float) -> events.DpEvent:
  return events.PureDpEvent(eps, neighbouring=REL)


def _pow2_at_most(x: float) -> float:
  """Largest power of two ``<= x`` (the public grid rule of the discrete sums)."""
  return 2.0 ** math.floor(math.log2(x))


def _rounded_l1(sens: float, grid: float, changed: int) -> int:
  """CKS rounded L1 sensitivity in grid units: ``ceil(Delta_1/g) + (c - 1)``."""
  return math.ceil(sens / grid) + changed - 1


CONTINUOUS = "[noise=continuous]"


def _base(seed: int, d: int) -> np.ndarray:
  return np.random.default_rng(seed).uniform(0.2, 0.8, size=(N, d))


def _charged(fn):
  """``(D, acc) -> (output, 1)``: one keyed call that spends on ``acc``."""
  def run(d, acc):
    import jax  # pylint: disable=import-outside-toplevel
    return fn(jax.random.key(0), d, acc), 1
  return run


def _replace(x, i, row):
  out = np.array(x, copy=True)
  out[i] = row
  return out


# ------------------------------------------------------------------ quantiles


def _quantile_pairs():
  x = _base(0, 1)[:, 0]
  return [({"x": _replace(x, 0, 0.0)}, {"x": _replace(x, 0, 1.0)}),       # lower -> upper
          ({"x": _replace(x, 1, -5.0)}, {"x": _replace(x, 1, 7.0)}),      # beyond the clip
          ({"x": x}, {"x": _replace(x, 2, x[3])})]                        # duplicated row


def _quantile(key, d, accountant=None):
  return _classic().private_quantile(key, d["x"], 0.5, lower=0.0, upper=1.0, epsilon=EPS,
                                     num_grid_points=GRID_POINTS, accountant=accountant)


reg.register(reg.ReleasePoint(
    name="jaxdp.classic.private_quantile",
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP: exponential mechanism over the public grid k/2^10 of [0, 1], "
               "u = -|rank - qn|, Delta_u = 1, beta = eps/2 (McSherry-Talwar 2007 Thm 6)"),
    epsilon=EPS, delta=0.0, pairs=_quantile_pairs,
    release=_quantile, vector=lambda out: np.array([out], np.float64),
    event=lambda: events.ExponentialMechanismDpEvent(beta=EPS / 2, sensitivity=1.0,
                                                     neighbouring=REL),
    charged=_charged(_quantile),
    fresh=None, sensitivity=None, noise=None,
    audit=reg.AuditSpec(statistic=lambda out: float(out), trials=300, slow_trials=5_000),
    support=f"grid:{GRID_STEP!r}",
    skip={"replay": "not additive: exponential mechanism (support checked on the grid)",
          "noise": "not additive: exponential mechanism; its law is checked exactly against "
                   "exp(eps/2 u) in tests/classic/test_bounds_quantile.py"}))


def _bounds_pairs():
  x = _base(1, 2)
  return [({"x": _replace(x, 0, [0.0, 0.0])}, {"x": _replace(x, 0, [1.0, 1.0])}),
          ({"x": _replace(x, 1, [-5.0, 7.0])}, {"x": _replace(x, 1, [7.0, -5.0])}),
          ({"x": x}, {"x": _replace(x, 2, x[3])})]


def _bounds(key, d, accountant=None):
  return _classic().private_bounds(key, d["x"], lower=0.0, upper=1.0, epsilon=EPS,
                                   quantiles=(0.1, 0.9), num_grid_points=GRID_POINTS,
                                   accountant=accountant)


# 2 d = 4 draws at eps / 4 each: beta = eps / 8 (basic composition, Dwork-Roth Thm 3.16).
reg.register(reg.ReleasePoint(
    name="jaxdp.classic.private_bounds",
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP: 2d grid exponential-mechanism quantiles at eps/(2d) each, beta = "
               "eps/(4d), basic composition (Dwork-Roth Thm 3.16)"),
    epsilon=EPS, delta=0.0, pairs=_bounds_pairs,
    release=_bounds, vector=lambda out: _flat(*out),
    event=lambda: events.SelfComposedDpEvent(
        events.ExponentialMechanismDpEvent(beta=EPS / 8, sensitivity=1.0, neighbouring=REL), 4),
    charged=_charged(_bounds), fresh=None, sensitivity=None, noise=None, audit=None,
    support=f"grid:{GRID_STEP!r}",
    skip={"replay": "not additive: exponential mechanism",
          "noise": "not additive: exponential mechanism",
          "audit": "four draws at eps/4; the single draw is audited in the private_quantile entry "
                   "and the per-draw law checked exactly in tests/classic/test_bounds_quantile.py"}))


# ------------------------------------------------------------------ naive Bayes

NB_CLASSES, NB_CATS = 2, 2
# Per-record L1 contribution (1 class count + 1 categorical cell + |z| + z^2 <= 2), doubled
# under replace-one; the default split gives every block the same scale Delta / eps.
NB_SENS = 2.0 * (1 + 1 + 2 * 1)
# Block epsilons eps * (1, 1, 2) / 4; noise multiplier = scale / Delta_b = 1 / eps_b.
NB_EVENT_MULTIPLIERS = (4.0 / EPS, 4.0 / EPS, 2.0 / EPS)
NB_EPS_BLOCKS = (EPS / 4, EPS / 4, EPS / 2)
# Discrete default: counts (Delta 2 each, integers) exact at scale 2/(eps/4) = 8/eps; the
# numeric block (sums of z and z^2, Delta 4) changes c = 4 coordinates under replace-one (two
# class rows x (sum, square)): g = 2^floor(log2(4/(4 * 2^10))) = 2^-10, K_1 = 4096 + 3.
NB_NUM_SENS, NB_NUM_CHANGED = 4.0, 4
NB_GRID = _pow2_at_most(NB_NUM_SENS / (NB_NUM_CHANGED * 2**10))
NB_K1 = _rounded_l1(NB_NUM_SENS, NB_GRID, NB_NUM_CHANGED)
NB_NUM_SCALE = NB_K1 * NB_GRID / NB_EPS_BLOCKS[2]
NB_COUNT_SCALE = 2.0 / NB_EPS_BLOCKS[0]
NB_DISCRETE_SENS = 2.0 + 2.0 + NB_K1 * NB_GRID  # rounded sensitivity in output units
# reference order: class counts (C), cat counts (1, C, K), sums (C, 1), squares (C, 1)
NB_DISCRETE_SCALES = np.array([NB_COUNT_SCALE] * (NB_CLASSES + NB_CLASSES * NB_CATS)
                              + [NB_NUM_SCALE] * (2 * NB_CLASSES))


def _nb_pairs():
  rng = np.random.default_rng(2)
  xc = rng.integers(0, NB_CATS, size=(N, 1))
  xn = rng.uniform(0.2, 0.8, size=(N, 1))
  y = rng.integers(0, NB_CLASSES, size=N)
  def data(c, v, label, i=0, base=(xc, xn, y)):
    a, b, l = (np.array(t, copy=True) for t in base)
    a[i], b[i], l[i] = c, v, label
    return {"xc": a, "xn": b, "y": l}
  d0 = {"xc": xc, "xn": xn, "y": y}
  return [(data(0, 0.0, 0), data(1, 1.0, 1)),            # every block at its sensitivity
          (data(0, 0.0, 1), data(0, 0.0, 0)),            # extreme label flipped only
          (d0, data(xc[3, 0], xn[3, 0], y[3], i=2))]     # duplicated row


def _nb_reference(d):
  """Exact statistics (float64): class counts, cat counts (1, C, K), sums of z and z^2."""
  z = 2.0 * d["xn"] - 1.0
  onehot = np.eye(NB_CLASSES)[d["y"]]
  cat = np.einsum("nc,nk->ck", onehot, np.eye(NB_CATS)[d["xc"][:, 0]])[None]
  return _flat(onehot.sum(0), cat, onehot.T @ z, onehot.T @ (z * z))


def _nb(key, d, accountant=None, noise="discrete"):
  return _classic().private_naive_bayes(key, d["xc"], d["xn"], d["y"], num_classes=NB_CLASSES,
                                        epsilon=EPS, num_categories=[NB_CATS], lower=0.0,
                                        upper=1.0, accountant=accountant, noise=noise)


def _nb_continuous(key, d, accountant=None):
  return _nb(key, d, accountant, noise="continuous")


def _nb_event():
  return events.ComposedDpEvent([_pure(e) for e in NB_EPS_BLOCKS])


def _nb_continuous_event():
  return events.ComposedDpEvent([_laplace(m) for m in NB_EVENT_MULTIPLIERS])


reg.register(reg.ReleasePoint(
    name="jaxdp.classic.private_naive_bayes",
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP: discrete Laplace (CKS 2020 Alg. 2) on the naive-Bayes sufficient "
               "statistics (paper 004 Eqs. 25-28), budget split by block sensitivity: integer "
               "counts exact on Z, sums on the grid 2^-10 Z with K_1 = ceil(Delta/g) + 3"),
    epsilon=EPS, delta=0.0, pairs=_nb_pairs,
    release=_nb, vector=lambda out: _flat(*out[1]), event=_nb_event, charged=_charged(_nb),
    fresh=None, sensitivity=NB_DISCRETE_SENS, norm="l1",
    noise=reg.NoiseSpec(kind="discrete_laplace", scale=NB_DISCRETE_SCALES,
                        reference=_nb_reference,
                        theorem="CKS 2020 Alg. 2: b = K_1 g/eps_b per block; counts K_1 = "
                                "Delta_b (integers, no rounding), sums K_1 = ceil(Delta/g) + "
                                "(c - 1), c = 4 coordinates, g = 2^-10"),
    audit=None, support=f"grid:{NB_GRID!r}", public_outputs=("lower", "upper"),
    skip={"audit": _HOST}))


reg.register(reg.ReleasePoint(
    name="jaxdp.classic.private_naive_bayes" + CONTINUOUS,
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP: Laplace on the naive-Bayes sufficient statistics (paper 004 Eqs. 25-28), "
               "L1 Delta = 2(1 + m_cat + 2 m_num), budget split by block sensitivity"),
    epsilon=EPS, delta=0.0, pairs=_nb_pairs,
    release=_nb_continuous, vector=lambda out: _flat(*out[1]), event=_nb_continuous_event,
    charged=_charged(_nb_continuous), fresh=None, sensitivity=NB_SENS, norm="l1",
    noise=reg.NoiseSpec(kind="laplace", scale=NB_SENS / EPS, reference=_nb_reference,
                        theorem="Dwork-Roth Thm 3.6 on the concatenated sums: b = Delta_1/eps, "
                                "Delta_1 = 2(1 + m_cat + 2 m_num) (paper 004 Eqs. 25-28)"),
    audit=None, support="continuous", public_outputs=("lower", "upper"),
    skip={"audit": _HOST}))


def _nb_estimator(seed):
  return _classic().PrivateNaiveBayes(epsilon=EPS, classes=list(range(NB_CLASSES)),
                                      categorical_features=[0], num_categories=[NB_CATS],
                                      lower=0.0, upper=1.0, seed=seed)


def _estimator_entry(name, make, fit_args, vector, event, guarantee, public=()):
  """An estimator's fit: release with ``seed=key``, fresh with the default seed."""

  def release(key, d):
    return make(key).fit(*fit_args(d))

  def fresh(d):
    return make(None).fit(*fit_args(d))

  def charged(d, acc):
    est = make(None)
    est.accountant = acc
    return est.fit(*fit_args(d)), 1

  return dict(name=name, family=FAMILY, neighbouring=REL, unit="example", guarantee=guarantee,
              epsilon=EPS, delta=0.0, release=release, vector=vector, event=event,
              charged=charged, fresh=fresh, sensitivity=None, noise=None, audit=None,
              support="continuous", public_outputs=_ESTIMATOR_PUBLIC + tuple(public),
              skip={"replay": _POST, "noise": _POST, "audit": _HOST})


reg.register(reg.ReleasePoint(pairs=_nb_pairs, **_estimator_entry(
    "jaxdp.classic.PrivateNaiveBayes.fit", _nb_estimator,
    lambda d: (np.concatenate([d["xc"], d["xn"]], 1), d["y"]),
    lambda est: _flat(est.model_.log_prior, est.model_.mean), _nb_event,
    "eps-DP per fit: the private_naive_bayes statistics, post-processed to a model",
    public=("categorical_features", "num_categories"))))


# ------------------------------------------------------------------ random trees

RT_TREES, RT_DEPTH = 3, 2
RT_SENS = 2.0  # disjoint mode: a record is in one tree, one leaf count moves per class (x2)


def _rt_pairs():
  x = _base(3, 2)
  y = np.random.default_rng(3).integers(0, 2, size=N)
  def data(row, label, i=0):
    a, l = _replace(x, i, row), np.array(y, copy=True)
    l[i] = label
    return {"x": a, "y": l}
  return [(data([0.0, 0.0], 0), data([1.0, 1.0], 1)),
          (data(x[0], 0), data(x[0], 1)),                 # extreme label only
          ({"x": x, "y": y}, data(x[3], y[3], i=2))]      # duplicated row


def _rt(key, d, accountant=None, noise="discrete"):
  return _classic().private_random_trees(key, d["x"], d["y"], num_classes=2, epsilon=EPS,
                                         lower=0.0, upper=1.0, num_trees=RT_TREES,
                                         depth=RT_DEPTH, accountant=accountant, noise=noise)


def _rt_continuous(key, d, accountant=None):
  return _rt(key, d, accountant, noise="continuous")


_RT_NOISE_SKIP = ("the counts' reference depends on the key (random structure and tree owners), "
                  "so vector - reference(D) is not the noise; the noise law is audited in "
                  "tests/classic/test_random_trees.py")

# Discrete default: integer counts on Z, no rounding, K_1 = Delta = 2: the replay bound is 2.
reg.register(reg.ReleasePoint(
    name="jaxdp.classic.private_random_trees",
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP: data-independent random trees, integer leaf class counts + discrete "
               "Laplace of scale Delta/eps on Z (CKS 2020 Alg. 2; integers: rounded sensitivity "
               "Delta), disjoint trees (parallel composition, McSherry 2009 Thm 4): Delta_1 = 2"),
    epsilon=EPS, delta=0.0, pairs=_rt_pairs,
    release=_rt, vector=lambda out: _flat(out[0].counts), event=lambda: _pure(EPS),
    charged=_charged(_rt), fresh=None, sensitivity=RT_SENS, norm="l1", noise=None, audit=None,
    support="grid:1.0", public_outputs=("features", "thresholds"),
    skip={"noise": _RT_NOISE_SKIP, "audit": _HOST}))

reg.register(reg.ReleasePoint(
    name="jaxdp.classic.private_random_trees" + CONTINUOUS,
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP: data-independent random trees, leaf class counts + Lap(Delta/eps), "
               "disjoint trees (parallel composition, McSherry 2009 Thm 4): Delta_1 = 2"),
    epsilon=EPS, delta=0.0, pairs=_rt_pairs,
    release=_rt_continuous, vector=lambda out: _flat(out[0].counts),
    event=lambda: _laplace(1.0 / EPS), charged=_charged(_rt_continuous), fresh=None,
    sensitivity=RT_SENS, norm="l1", noise=None, audit=None,
    support="continuous", public_outputs=("features", "thresholds"),
    skip={"noise": _RT_NOISE_SKIP, "audit": _HOST}))

reg.register(reg.ReleasePoint(pairs=_rt_pairs, **_estimator_entry(
    "jaxdp.classic.PrivateRandomTrees.fit",
    lambda seed: _classic().PrivateRandomTrees(epsilon=EPS, classes=[0, 1], lower=0.0, upper=1.0,
                                               n_estimators=RT_TREES, depth=RT_DEPTH, seed=seed),
    lambda d: (d["x"], d["y"]), lambda est: _flat(est.trees_.counts), lambda: _pure(EPS),
    "eps-DP per fit: private_random_trees (disjoint trees, discrete Laplace)",
    public=("features", "thresholds", "n_estimators", "depth", "tree_budget", "combine"))))


# ------------------------------------------------------------------ k-means

KM_K, KM_T, KM_BLOCKS = 2, 2, 4
# DP-Lloyd, d = 2 in [0, 1]^2, count_fraction 1/2: per iteration eps/T split in halves;
# Delta_count = 2, Delta_sum = 2 R_1 = 2 (replace-one): noise multiplier 1 / (eps / (2T)).
KM_LLOYD_MULTIPLIER = 2.0 * KM_T / EPS
# Sample and aggregate: Delta_1 = K sum_j (u_j - l_j) / q = 2 * 2 / 4.
KM_SA_SENS = KM_K * 2.0 / KM_BLOCKS
# A large epsilon for the sample-and-aggregate function entry: the release is clipped to the
# box, and with Lap(1) noise on a [0, 1] box the clip hides most of a same-key difference.
KM_SA_EPS = 20.0
# Discrete default of sample and aggregate: one block moves all c = K d = 4 coordinates of the
# mean; g = 2^floor(log2(1/(4 * 2^10))) = 2^-12, K_1 = 4096 + 3 grid steps, and the replay
# bound is the rounded sensitivity K_1 g (the box [0, 1] is on the grid, so the clip is too).
KM_SA_CHANGED = KM_K * 2
KM_SA_GRID = _pow2_at_most(KM_SA_SENS / (KM_SA_CHANGED * 2**10))
KM_SA_DISCRETE_SENS = _rounded_l1(KM_SA_SENS, KM_SA_GRID, KM_SA_CHANGED) * KM_SA_GRID


def _km_pairs():
  x = np.random.default_rng(4).uniform(0.2, 0.8, size=(5, 2))   # 5 rows, 4 blocks: under-full
  centre = np.full((5, 2), 0.5)                                  # duplicated rows
  # Worst case for a block that borrows another block's row as an initial centroid (the
  # issue 26 item 3 defect): the other rows sit at the centre, so a borrowed corner record
  # keeps its own cluster and moves every borrowing block's output by 2 (L1).
  return [({"x": _replace(centre, 0, [0.0, 0.0])}, {"x": _replace(centre, 0, [1.0, 1.0])}),
          ({"x": _replace(x, 0, [0.0, 0.0])}, {"x": _replace(x, 0, [1.0, 1.0])}),
          ({"x": x}, {"x": _replace(x, 1, x[2])}),               # duplicated row
          ({"x": _replace(x, 3, [1.0, 0.0])}, {"x": _replace(x, 3, [0.0, 1.0])})]


def _lloyd(key, d, accountant=None, noise="discrete"):
  return _classic().dp_lloyd(key, d["x"], n_clusters=KM_K, epsilon=EPS, lower=0.0, upper=1.0,
                             iterations=KM_T, count_fraction=0.5, accountant=accountant,
                             noise=noise)


def _lloyd_continuous(key, d, accountant=None):
  return _lloyd(key, d, accountant, noise="continuous")


def _lloyd_event():
  # discrete: each release eps-DP at its share f eps/T = (1 - f) eps/T = eps/(2T)
  one = events.ComposedDpEvent([_pure(EPS / (2 * KM_T)), _pure(EPS / (2 * KM_T))])
  return events.SelfComposedDpEvent(one, KM_T)


def _lloyd_continuous_event():
  one = events.ComposedDpEvent([_laplace(KM_LLOYD_MULTIPLIER), _laplace(KM_LLOYD_MULTIPLIER)])
  return events.SelfComposedDpEvent(one, KM_T)


_LLOYD_SKIP = {"replay": _POST + " (centroids m + S~/n~ after T steps)", "noise": _POST,
               "audit": _HOST + " (one iteration: tests/classic/test_kmeans.py)"}

reg.register(reg.ReleasePoint(
    name="jaxdp.classic.dp_lloyd",
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP: T noisy Lloyd iterations at eps/T, integer counts + discrete Laplace of "
               "scale 2/(f eps/T) on Z, centred sums on the grid g Z + discrete Laplace of scale "
               "K_1 g/((1-f) eps/T) (CKS 2020 Alg. 2), basic composition (SuLQ; Su et al. 2016)"),
    epsilon=EPS, delta=0.0, pairs=_km_pairs,
    release=_lloyd, vector=lambda out: _flat(out[0]), event=_lloyd_event,
    charged=_charged(_lloyd), fresh=None, sensitivity=None, noise=None, audit=None,
    support="continuous", skip=_LLOYD_SKIP))

reg.register(reg.ReleasePoint(
    name="jaxdp.classic.dp_lloyd" + CONTINUOUS,
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP: T noisy Lloyd iterations at eps/T (counts Lap(2/(f eps/T)), centred sums "
               "Lap(2 R_1/((1-f) eps/T))), basic composition (SuLQ; Su et al. 2016)"),
    epsilon=EPS, delta=0.0, pairs=_km_pairs,
    release=_lloyd_continuous, vector=lambda out: _flat(out[0]), event=_lloyd_continuous_event,
    charged=_charged(_lloyd_continuous), fresh=None, sensitivity=None, noise=None, audit=None,
    support="continuous", skip=_LLOYD_SKIP))


def _sample_aggregate(key, d, accountant=None, noise="discrete"):
  return _classic().sample_aggregate_kmeans(key, d["x"], n_clusters=KM_K, epsilon=KM_SA_EPS,
                                            lower=0.0, upper=1.0, num_blocks=KM_BLOCKS,
                                            iterations=3, accountant=accountant, noise=noise)


def _sample_aggregate_continuous(key, d, accountant=None):
  return _sample_aggregate(key, d, accountant, noise="continuous")


_SA_NOISE_SKIP = ("the reference (mean of block outputs) depends on the key's block assignment; "
                  "the noise law is audited in tests/classic/test_kmeans.py")

reg.register(reg.ReleasePoint(
    name="jaxdp.classic.sample_aggregate_kmeans",
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP: mean of q block k-means outputs (each a function of its own block) on the "
               "grid g = 2^-12 + discrete Laplace of scale K_1/eps grid steps, K_1 = ceil(Delta_1/"
               "g) + (K d - 1), Delta_1 = K sum(u - l)/q (Nissim-Raskhodnikova-Smith 2007; CKS "
               "2020 Alg. 2)"),
    epsilon=KM_SA_EPS, delta=0.0, pairs=_km_pairs,
    release=_sample_aggregate, vector=lambda out: _flat(out[0]),
    event=lambda: _pure(KM_SA_EPS), charged=_charged(_sample_aggregate), fresh=None,
    sensitivity=KM_SA_DISCRETE_SENS, norm="l1", noise=None, audit=None,
    support=f"grid:{KM_SA_GRID!r}", skip={"noise": _SA_NOISE_SKIP, "audit": _HOST}))

reg.register(reg.ReleasePoint(
    name="jaxdp.classic.sample_aggregate_kmeans" + CONTINUOUS,
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP: mean of q block k-means outputs (each a function of its own block) + "
               "Lap(Delta_1/eps), Delta_1 = K sum(u - l)/q (Nissim-Raskhodnikova-Smith 2007)"),
    epsilon=KM_SA_EPS, delta=0.0, pairs=_km_pairs,
    release=_sample_aggregate_continuous, vector=lambda out: _flat(out[0]),
    event=lambda: _laplace(1.0 / KM_SA_EPS), charged=_charged(_sample_aggregate_continuous),
    fresh=None, sensitivity=KM_SA_SENS, norm="l1", noise=None, audit=None, support="continuous",
    skip={"noise": _SA_NOISE_SKIP, "audit": _HOST}))

for _method, _event in (("lloyd", _lloyd_event), ("sample_aggregate", lambda: _pure(EPS))):
  reg.register(reg.ReleasePoint(pairs=_km_pairs, **_estimator_entry(
      "jaxdp.classic.PrivateKMeans.fit" + ("" if _method == "lloyd" else "[method=sample_aggregate]"),
      lambda seed, m=_method: _classic().PrivateKMeans(
          n_clusters=KM_K, epsilon=EPS, lower=0.0, upper=1.0, method=m, iterations=KM_T,
          num_blocks=KM_BLOCKS, count_fraction=0.5, seed=seed),
      lambda d: (d["x"],), lambda est: _flat(est.cluster_centers_), _event,
      f"eps-DP per fit: {_method} k-means",
      public=("method", "iterations", "num_blocks", "count_fraction", "init", "clip",
              "neighbouring"))))


# ------------------------------------------------------------------ PCA

PCA_D = 2
PCA_SENS = PCA_D + 1.0  # ||U(xx^T)||_1 <= (d+1)/2 per record in the unit ball, x2 replace-one
_IU = np.triu_indices(PCA_D)


def _pca_pairs():
  x = np.random.default_rng(5).normal(size=(N, PCA_D))
  x *= 0.9 / np.linalg.norm(x, axis=1, keepdims=True)
  s = 1 / math.sqrt(PCA_D)
  return [({"x": _replace(x, 0, [s, s])}, {"x": _replace(x, 0, [s, -s])}),
          ({"x": _replace(x, 0, [1.0, 0.0])}, {"x": _replace(x, 0, [0.0, 0.0])}),
          ({"x": x}, {"x": _replace(x, 1, x[2])})]


def _pca(key, d, accountant=None):
  return _classic().private_pca(key, d["x"], num_components=1, epsilon=EPS, mechanism="laplace",
                                accountant=accountant)


reg.register(reg.ReleasePoint(
    name="jaxdp.classic.private_pca",
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP: upper triangle of X^T X + Lap((d+1)/eps) (replace-one, rows in the unit "
               "ball; paper 004 Sec. 3.5), eigenvectors as post-processing"),
    epsilon=EPS, delta=0.0, pairs=_pca_pairs,
    release=_pca, vector=lambda out: _flat(np.asarray(out[0].noisy_matrix)[_IU]),
    event=lambda: _laplace(1.0 / EPS), charged=_charged(_pca), fresh=None,
    sensitivity=PCA_SENS, norm="l1",
    noise=reg.NoiseSpec(kind="laplace", scale=PCA_SENS / EPS,
                        reference=lambda d: (d["x"].T @ d["x"])[_IU],
                        theorem="Dwork-Roth Thm 3.6: b = Delta_1/eps, Delta_1 = 2 (d+1)/2 "
                                "(||U(xx^T)||_1 = (||x||_1^2 + ||x||_2^2)/2 <= (d+1)/2)"),
    audit=None, support="continuous", skip={"audit": _HOST}))

reg.register(reg.ReleasePoint(pairs=_pca_pairs, **_estimator_entry(
    "jaxdp.classic.PrivatePCA.fit",
    lambda seed: _classic().PrivatePCA(n_components=1, epsilon=EPS, mechanism="laplace",
                                       seed=seed),
    lambda d: (d["x"],), lambda est: _flat(est.eigenvalues_), lambda: _laplace(1.0 / EPS),
    "eps-DP per fit: private_pca (Laplace)",
    public=("delta", "mechanism", "center", "clip", "neighbouring"))))


# ------------------------------------------------------------------ linear regression

def _lr_pairs():
  x = _base(6, 2)
  y = np.random.default_rng(6).uniform(0.5, 1.5, size=N)
  def data(row, t, i=0):
    a, b = _replace(x, i, row), np.array(y, copy=True)
    b[i] = t
    return {"x": a, "y": b}
  return [(data([0.0, 0.0], 0.0), data([1.0, 1.0], 2.0)),
          (data(x[0], 0.0), data(x[0], 2.0)),
          ({"x": x, "y": y}, data(x[3], y[3], i=2))]


def _lr(key, d, accountant=None):
  return _classic().private_linear_regression(key, d["x"], d["y"], epsilon=EPS, lower=0.0,
                                              upper=1.0, y_lower=0.0, y_upper=2.0,
                                              accountant=accountant)


reg.register(reg.ReleasePoint(
    name="jaxdp.classic.private_linear_regression",
    family=FAMILY, neighbouring=REL, unit="example",
    guarantee=("eps-DP (replace-one): functional mechanism on D + 1 = 3 rescaled features, "
               "Delta = 2(2 sqrt(D) + D) (Zhang et al. 2012; paper 004 Eqs. 18-20)"),
    epsilon=EPS, delta=0.0, pairs=_lr_pairs,
    release=_lr, vector=lambda out: _flat(out[0], out[1]), event=lambda: _pure(EPS),
    charged=_charged(_lr), fresh=None, sensitivity=None, noise=None, audit=None,
    support="continuous", skip={"replay": _POST, "noise": _POST, "audit": _HOST}))

reg.register(reg.ReleasePoint(pairs=_lr_pairs, **_estimator_entry(
    "jaxdp.classic.PrivateLinearRegression.fit",
    lambda seed: _classic().PrivateLinearRegression(epsilon=EPS, lower=0.0, upper=1.0, y_lower=0.0,
                                                    y_upper=2.0, seed=seed),
    lambda d: (d["x"], d["y"]), lambda est: _flat(est.coef_, est.intercept_), lambda: _pure(EPS),
    "eps-DP per fit: private_linear_regression",
    public=("y_lower", "y_upper", "l2_reg", "clip"))))


def _fm_pairs():
  x = np.random.default_rng(7).normal(size=(N, 3))
  x *= 0.9 / np.linalg.norm(x, axis=1, keepdims=True)
  y = np.clip(x[:, 0], -1, 1)
  c = 1 / math.sqrt(3)
  def data(row, t, i=0):
    a, b = _replace(x, i, row), np.array(y, copy=True)
    b[i] = t
    return {"x": a.astype(np.float32), "y": b.astype(np.float32)}
  return [(data([c, c, c], 1.0), data([-c, -c, -c], -1.0)),
          (data(x[0], 1.0), data(x[0], -1.0)),
          (data(x[2], y[2]), data(x[3], y[3], i=2))]


def _fm(key, d):
  from jaxdp.training import functional_mechanism as fm  # pylint: disable=import-outside-toplevel
  return fm.functional_mechanism(key, d["x"], d["y"], epsilon=EPS, task="linear")


reg.register(reg.ReleasePoint(
    name="jaxdp.training.functional_mechanism_fit",
    family="training", neighbouring=REL, unit="example",
    guarantee=("eps-DP (replace-one): Laplace on the polynomial coefficients, Delta = "
               "2(2 sqrt(D) + D) (Zhang et al. 2012; paper 004 Eqs. 18-20)"),
    epsilon=EPS, delta=0.0, pairs=_fm_pairs,
    release=_fm, vector=lambda out: _flat(out.weights), event=lambda: _pure(EPS), charged=None,
    fresh=None, sensitivity=None, noise=None, audit=None, support="continuous",
    public_outputs=("event", "calibration"),
    skip={"replay": _POST, "noise": _POST, "charge": _NO_ACCOUNTANT,
          "audit": _HOST + " (tests/training/test_functional_mechanism.py)"}))


# ------------------------------------------------------------------ not release points

_CAL = "a calibration of public parameters (bounds, dimensions, epsilon); reads no data"
_EVENT = "builds the DpEvent of public parameters; reads no data, draws no noise, spends nothing"
_CTOR = "the constructor validates and stores parameters; reads no data; its fit is registered"
_PREDICT = ("post-processing of the already released model on the caller's query data; draws "
            "no noise, spends nothing")
for _name, _reason in {
    "jaxdp.classic.lloyd_calibration": _CAL,
    "jaxdp.classic.kmeans.auto_count_fraction": "Su et al.'s public budget share of the counts "
                                                "(a formula of the dimension); reads no data",
    "jaxdp.classic.naive_bayes_calibration": _CAL,
    "jaxdp.classic.naive_bayes.NaiveBayesCalibration": "a NamedTuple of public calibration numbers",
    "jaxdp.classic.pca_calibration": _CAL,
    "jaxdp.classic.pca.PCACalibration": "a NamedTuple of public calibration numbers",
    "jaxdp.classic.pca.symmetric_noise": ("draws data-independent symmetric noise from a key and "
                                          "a public scale; private_pca adds it (registered)"),
    "jaxdp.classic.random_trees_scale": _CAL,
    "jaxdp.classic.random_trees.random_trees_noise_parameters": _CAL,
    "jaxdp.classic.lloyd_event": _EVENT,
    "jaxdp.classic.lloyd_iteration_event": _EVENT,
    "jaxdp.classic.naive_bayes_event": _EVENT,
    "jaxdp.classic.pca_event": _EVENT,
    "jaxdp.classic.quantile_event": _EVENT,
    "jaxdp.classic.random_trees_event": _EVENT,
    "jaxdp.classic.PrivateKMeans": _CTOR,
    "jaxdp.classic.PrivateLinearRegression": _CTOR,
    "jaxdp.classic.PrivateNaiveBayes": _CTOR,
    "jaxdp.classic.PrivatePCA": _CTOR,
    "jaxdp.classic.PrivateRandomTrees": _CTOR,
    "jaxdp.classic.PrivateKMeans.predict": _PREDICT,
    "jaxdp.classic.PrivateLinearRegression.predict": _PREDICT,
    "jaxdp.classic.PrivateNaiveBayes.predict": _PREDICT,
    "jaxdp.classic.PrivateRandomTrees.predict": _PREDICT,
    "jaxdp.classic.PrivateNaiveBayes.predict_proba": _PREDICT,
    "jaxdp.classic.PrivateNaiveBayes.predict_log_proba": _PREDICT,
    "jaxdp.classic.PrivateRandomTrees.predict_proba": _PREDICT,
    "jaxdp.training.functional_mechanism.functional_mechanism_calibration": _CAL,
    "jaxdp.training.functional_mechanism.FunctionalMechanismCalibration":
        "a NamedTuple of public calibration numbers",
}.items():
  reg.not_a_release_point(_name, _reason)

# Estimator fits are host-side (Python objects, an accountant, a fit counter), and so are
# the functions that finish on the host (numpy on the noisy statistics: the grid
# quantiles, the naive-Bayes and PCA post-processing, k-means' centroid updates, the
# functional mechanism's minimiser): looped from the start instead of paying a failed
# vmap attempt first. The random trees vmap (their counts are arrays; the event is put
# back by the checks).
cc.host_side(*[_n for _n in reg.REGISTRY if _n.startswith("jaxdp.classic.Private")])
cc.host_side(*[_n for _n in reg.REGISTRY if _n.startswith((
    "jaxdp.classic.private_quantile", "jaxdp.classic.private_bounds",
    "jaxdp.classic.private_naive_bayes", "jaxdp.classic.dp_lloyd",
    "jaxdp.classic.sample_aggregate_kmeans", "jaxdp.classic.private_pca",
    "jaxdp.classic.private_linear_regression", "jaxdp.training.functional_mechanism_fit"))])
