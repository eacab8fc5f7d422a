"""Conformance entries of private hyper-parameter tuning (``jaxdp.tuning``).

Release point: ``jaxdp.tuning.repeat_and_select`` (Papernot & Steinke 2022;
Liu & Talwar 2019), audited with a small per-run mechanism written here, so
that the SELECTION itself is what the checks see:

* candidates: thresholds ``theta`` of the classifier ``1[x_0 >= theta]``;
* per run, with independent Laplace noise (Dwork & Roth Thm 3.6, L1
  sensitivity 1 under add/remove: each row is clipped to L1 norm 1, and one
  row moves the count of correct predictions by at most 1):
  release = ``sum_i clip(x_i) + Lap(1/EPS_RELEASE)^16``, score =
  ``(#correct(theta) + Lap(1/EPS_SCORE)) / N_PUBLIC`` (public normaliser);
* per-run event ``Composed([Laplace(1/EPS_RELEASE), Laplace(1/EPS_SCORE)])``:
  pure ``EPS_RUN = EPS_RELEASE + EPS_SCORE``.

Claims (from the theorems, not from the library): geometric K (main entry)
is ``3 EPS_RUN``-DP (Liu & Talwar 2019; PS22 Thm 2 at lambda -> inf with
eta = 1); logarithmic K (the law-of-K entry) is ``2 EPS_RUN``-DP (PS22 Thm 2
at lambda -> inf, eta = 0).

The release noise is independent of the scores and every candidate releases
the same statistic, so the released vector minus the exact clipped sum is
exactly ``Lap(1/EPS_RELEASE)`` per coordinate whatever run is selected: the
noise check sees a 20% under-noising of the per-run mechanism. The audit
statistic is the released score; the worst-case pair adds a row that every
candidate classifies correctly (every run's score moves up by 1/N_PUBLIC),
where a K that is not random (fixed K = k) costs up to ``k EPS_SCORE``: the
event "all k scores low" has probability ratio ``e^{k EPS_SCORE}``. The
law-of-K entry (k = 8 >> 2) runs enough trials to catch that.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import conformance_checks as cc
import conformance_registry as reg

DIM = 16
N_PUBLIC = 8  # the public normaliser of the score
EPS_RELEASE = 0.02
EPS_SCORE = 1.0
EPS_RUN = EPS_RELEASE + EPS_SCORE
THETAS = (0.25, 0.5, 0.75)
MEAN_RUNS = 8.0
NAME = "jaxdp.tuning.repeat_and_select"
LAW_NAME = "jaxdp.tuning.repeat_and_select[law=logarithmic, audit=law of K]"


def _clip_rows(x: np.ndarray) -> np.ndarray:
  norms = np.abs(x).sum(axis=1, keepdims=True)
  return x * np.minimum(1.0, 1.0 / np.maximum(norms, 1e-30))


def tuning_pairs() -> list:
  """Add/remove pairs; the worst case first: an added row every candidate gets right."""
  rng = np.random.default_rng(41)
  x = _clip_rows(rng.uniform(0, 1, size=(N_PUBLIC, DIM))).astype(np.float32)
  # x_0 below or above every threshold: every candidate predicts alike on D (4 of 8 right), so
  # every run's score has one law and the added row moves all of them.
  x[:, 0] = np.float32([0.1, 0.9, 0.1, 0.9, 0.1, 0.9, 0.1, 0.9]) / DIM
  y = np.array([0, 1, 1, 0, 0, 1, 1, 0], np.int32)
  base = {"x": x, "y": y}

  def add(row, label):
    return {"x": np.concatenate([x, np.asarray([row], np.float32)]),
            "y": np.concatenate([y, np.asarray([label], np.int32)])}

  e0 = np.zeros(DIM, np.float32)
  e0[0] = 1.0
  far = np.zeros(DIM, np.float32)
  far[0] = 50.0  # clipped to e0
  return [(base, add(e0, 1)),                       # every candidate right on it: all scores up
          (base, add(far, 1)),                      # beyond the clip bound
          (base, add(np.zeros(DIM, np.float32), 1)),  # every candidate wrong on it
          (base, {"x": x[:-1], "y": y[:-1]})]      # a removed row


def _reference(d) -> np.ndarray:
  return _clip_rows(np.asarray(d["x"], np.float64)).sum(axis=0)


def _scales() -> tuple[float, float]:
  from jaxdp.mechanisms import laplace  # pylint: disable=import-outside-toplevel
  # Looked up at call time (a power row patches laplace_scale).
  return (float(laplace.laplace_scale(1.0, EPS_RELEASE)),
          float(laplace.laplace_scale(1.0, EPS_SCORE)))


def _per_run_event():
  from jaxdp import mechanisms  # pylint: disable=import-outside-toplevel
  from jaxdp.accounting import events  # pylint: disable=import-outside-toplevel
  return events.ComposedDpEvent([
      mechanisms.laplace_mechanism_event(1.0, EPS_RELEASE, neighbouring="add_remove"),
      mechanisms.laplace_mechanism_event(1.0, EPS_SCORE, neighbouring="add_remove")])


@functools.lru_cache(maxsize=64)
def _mechanism(x_bytes: bytes, y_bytes: bytes, n: int, scale_release: float, scale_score: float):
  """The per-run mechanism on one dataset (cached: one jit trace per dataset and scales)."""
  x = jnp.asarray(np.frombuffer(x_bytes, np.float32).reshape(n, DIM))
  y = jnp.asarray(np.frombuffer(y_bytes, np.int32))
  norms = jnp.sum(jnp.abs(x), axis=1, keepdims=True)
  clipped_sum = jnp.sum(x * jnp.minimum(1.0, 1.0 / jnp.maximum(norms, 1e-30)), axis=0)
  event = _per_run_event()

  def mechanism(key, theta):
    k_release, k_score = jax.random.split(key)
    release = clipped_sum + scale_release * jax.random.laplace(k_release, (DIM,))
    correct = jnp.sum(((x[:, 0] * DIM) >= theta).astype(jnp.int32) == y).astype(jnp.float32)
    score = (correct + scale_score * jax.random.laplace(k_score, ())) / N_PUBLIC
    return release, score, event

  return mechanism


def _mechanism_for(d):
  x = np.ascontiguousarray(np.asarray(d["x"], np.float32))
  y = np.ascontiguousarray(np.asarray(d["y"], np.int32))
  return _mechanism(x.tobytes(), y.tobytes(), int(x.shape[0]), *_scales())


def _law(logarithmic: bool):
  from jaxdp import tuning  # pylint: disable=import-outside-toplevel
  return (tuning.LogarithmicRepetitions(MEAN_RUNS) if logarithmic
          else tuning.GeometricRepetitions(MEAN_RUNS))


def _run(key, d, logarithmic: bool, accountant=None):
  from jaxdp import tuning  # pylint: disable=import-outside-toplevel
  return tuning.repeat_and_select(key, _mechanism_for(d), list(THETAS),
                                  repetitions=_law(logarithmic), event=_per_run_event(),
                                  accountant=accountant, vectorize=True)


def _event(logarithmic: bool):
  return _law(logarithmic).event(_per_run_event())


def _vector(out) -> np.ndarray:
  return np.asarray(out.release, np.float64).ravel()


def _score(out) -> float:
  return float(out.score)


_SELECTION = ("selection: with one key the chosen run (hence its noise draw) may differ between "
              "D and D', so y - y' is not f(D) - f(D')")

reg.register(reg.ReleasePoint(
    name=NAME, family="tuning", neighbouring="add_remove", unit="example",
    guarantee="3 eps_run-DP: best of K ~ Geometric runs of an eps_run-DP mechanism (Liu-Talwar "
              "2019; Papernot-Steinke 2022 Thm 2, lambda -> inf); RDP by PS22 Thms 2/6",
    epsilon=3.0 * EPS_RUN, delta=0.0, pairs=tuning_pairs,
    release=lambda key, d: _run(key, d, False), vector=_vector,
    event=lambda: _event(False),
    charged=lambda d, acc: (_run(jax.random.key(3), d, False, accountant=acc), 1),
    fresh=None, sensitivity=1.0, norm="l1",
    noise=reg.NoiseSpec("laplace", 1.0 / EPS_RELEASE, _reference,
                        "Dwork-Roth Thm 3.6: Lap(Delta_1/eps), Delta_1 = 1 (rows clipped to L1 "
                        "norm 1); the selected run's release noise is independent of the scores"),
    audit=reg.AuditSpec(statistic=_score, trials=300, slow_trials=4_000),
    support="continuous", public_outputs=("event",),
    skip={"replay": _SELECTION}))

reg.register(reg.ReleasePoint(
    name=LAW_NAME, family="tuning", neighbouring="add_remove", unit="example",
    guarantee="2 eps_run-DP: best of K ~ Logarithmic runs (Papernot-Steinke 2022 Thm 2, "
              "lambda -> inf, eta = 0); audited where a non-random K would cost k eps_score",
    epsilon=2.0 * EPS_RUN, delta=0.0, pairs=tuning_pairs,
    release=lambda key, d: _run(key, d, True), vector=_vector,
    event=lambda: _event(True), charged=None, fresh=None, sensitivity=None,
    noise=None, audit=reg.AuditSpec(statistic=_score, trials=2_000, slow_trials=8_000),
    support="continuous", public_outputs=("event",),
    skip={"replay": _SELECTION,
          "noise": f"covered by {NAME} (same mechanism and selection)",
          "charge": f"covered by {NAME}",
          "extreme": f"covered by {NAME}"}))

cc.host_side(NAME, LAW_NAME)

reg.not_a_release_point(
    "jaxdp.tuning.TruncatedNegativeBinomial.event",
    "builds RepeatAndSelectDpEvent from a public event and the public law of K; releases nothing")
reg.not_a_release_point(
    "jaxdp.tuning.PoissonRepetitions.event",
    "builds RepeatAndSelectDpEvent from a public event and the public law of K; releases nothing")
reg.not_a_release_point(
    "jaxdp.tuning.dominating_event",
    "compares the RDP curves of public events; reads no data")


# ---------------------------------------------------------------------------
# Private validation scores (jaxdp.tuning.scoring): additive noise on a count / clipped sum.
# ---------------------------------------------------------------------------

SCORE_EPS = 1.0
N_VAL = 8
LOSS_BOUND = 2.0


def score_pairs() -> list:
  """Replace-one pairs of validation rows (labels and per-row losses); worst case first."""
  preds = np.array([0, 1, 1, 0, 2, 2, 1, 0], np.int32)
  labels = np.array([0, 1, 0, 0, 2, 1, 1, 1], np.int32)
  losses = np.array([0.5, 1.0, 2.0, 0.0, 1.5, 0.25, 1.75, 0.5], np.float32)

  def with_row(label, loss):
    return {"preds": preds, "labels": np.concatenate([labels[:-1], [label]]).astype(np.int32),
            "losses": np.concatenate([losses[:-1], [loss]]).astype(np.float32)}

  base = {"preds": preds, "labels": labels, "losses": losses}
  return [(base, with_row(0, 0.0)),               # the last row becomes right; loss B/4 -> 0
          (base, with_row(0, 40.0)),              # loss beyond the bound: clipped to B
          (base, with_row(2, np.float32(np.nan)))]  # non-finite loss counts as B


def _accuracy(key, d):
  from jaxdp import tuning  # pylint: disable=import-outside-toplevel
  return tuning.private_accuracy(key, d["preds"], d["labels"], epsilon=SCORE_EPS)


def _loss(key, d):
  from jaxdp import tuning  # pylint: disable=import-outside-toplevel
  return tuning.private_loss(key, d["losses"], bound=LOSS_BOUND, epsilon=SCORE_EPS)


def _count(d) -> np.ndarray:
  return np.array([np.sum(np.asarray(d["preds"]) == np.asarray(d["labels"]))], np.float64)


def _clipped_sum(d) -> np.ndarray:
  x = np.asarray(d["losses"], np.float64)
  return np.array([np.sum(np.where(np.isnan(x), LOSS_BOUND, np.clip(x, 0.0, LOSS_BOUND)))])


def _unnormalised(out) -> np.ndarray:
  return np.asarray(out[0], np.float64).reshape(1) * N_VAL  # back to count / sum units


reg.register(reg.ReleasePoint(
    name="jaxdp.tuning.private_accuracy", family="tuning", neighbouring="replace_one",
    unit="example",
    guarantee="eps-DP, Laplace on the count of correct predictions (Delta_1 = 1; Dwork-Roth "
              "Thm 3.6), divided by the public n",
    epsilon=SCORE_EPS, delta=0.0, pairs=score_pairs, release=_accuracy, vector=_unnormalised,
    event=lambda: __import__("jaxdp").accounting.LaplaceDpEvent(
        1.0 / SCORE_EPS, neighbouring="replace_one"),
    charged=None, fresh=None, sensitivity=1.0, norm="l1",
    noise=reg.NoiseSpec("laplace", 1.0 / SCORE_EPS, _count, "Dwork-Roth Thm 3.6, Delta_1 = 1"),
    audit=reg.AuditSpec(statistic=lambda out: float(np.asarray(out[0])), trials=20_000,
                        slow_trials=200_000),
    support="continuous", public_outputs=("1",),
    skip={"charge": "a pure function of a key: spends nothing; it returns its event, which "
                    "repeat_and_select's per-run event carries"}))

reg.register(reg.ReleasePoint(
    name="jaxdp.tuning.private_loss", family="tuning", neighbouring="replace_one",
    unit="example",
    guarantee="eps-DP, Laplace on the sum of losses clipped to [0, B] (Delta_1 = B; Dwork-Roth "
              "Thm 3.6), divided by the public n",
    epsilon=SCORE_EPS, delta=0.0, pairs=score_pairs, release=_loss, vector=_unnormalised,
    event=lambda: __import__("jaxdp").accounting.LaplaceDpEvent(
        1.0 / SCORE_EPS, neighbouring="replace_one"),
    charged=None, fresh=None, sensitivity=LOSS_BOUND, norm="l1",
    noise=reg.NoiseSpec("laplace", LOSS_BOUND / SCORE_EPS, _clipped_sum,
                        "Dwork-Roth Thm 3.6, Delta_1 = B"),
    audit=reg.AuditSpec(statistic=lambda out: float(np.asarray(out[0])), trials=20_000,
                        slow_trials=200_000),
    support="continuous", public_outputs=("1",),
    skip={"charge": "a pure function of a key: spends nothing; it returns its event, which "
                    "repeat_and_select's per-run event carries"}))

_TUNE_DPSGD_COST = ("each call trains K DP-SGD models (seconds each on a CPU); the selection is "
                    "audited on jaxdp.tuning.repeat_and_select, the end-to-end spend in "
                    "tests/tuning/test_dpsgd_tuning.py (slow)")
reg.register(reg.ReleasePoint(
    name="jaxdp.tuning.tune_dpsgd", family="tuning", neighbouring="add_remove", unit="example",
    guarantee="RepeatAndSelect(Composed([T_max x PoissonSampled Gaussian, Laplace score]), E[K], "
              "eta): RDP by Papernot-Steinke 2022 Thms 2/6 with the dominating run's event",
    epsilon=float("inf"), delta=1e-5, pairs=tuning_pairs,
    release=lambda key, d: None, vector=lambda out: np.zeros(1), event=lambda: None,
    charged=None, fresh=None, sensitivity=None, noise=None, audit=None,
    skip={check: _TUNE_DPSGD_COST for check in
          ("replay", "fresh", "charge", "no_nonprivate", "support", "noise", "audit",
           "extreme")}))

reg.not_a_release_point(
    "jaxdp.tuning.DPSGDTuningResult",
    "a result container of tune_dpsgd; its epsilon/delta/noise_multiplier are public fields")
for _law_name in ("GeometricRepetitions", "LogarithmicRepetitions"):
  reg.not_a_release_point(
      f"jaxdp.tuning.{_law_name}.event",
      "builds RepeatAndSelectDpEvent from a public event and the public law of K; releases nothing")


# ---------------------------------------------------------------------------
# PrivateSearchCV (jaxdp.tuning.search_cv): the scikit-learn search, charged once.
# ---------------------------------------------------------------------------
#
# Estimator: PrivateLinearClassifier (output perturbation, binary logistic, paper 003 Alg. 4:
# pure EPS_FIT-DP under replace-one, the estimators' relation); candidates l2_reg in
# SEARCH_GRID; private validation score: Laplace on the count of correct predictions
# (sensitivity 1, Dwork-Roth Thm 3.6) at SEARCH_SCORE_EPS. Data: N_TRAIN training rows on the
# unit sphere and N_VAL private validation rows passed to fit as X_val, y_val: one dataset,
# replace-one neighbours differ in ONE row of one part. Per-run event
# Composed([Pure(EPS_FIT), Laplace(1/SEARCH_SCORE_EPS)]); K ~ Geometric(SEARCH_MEAN_RUNS):
# the search is 3 (EPS_FIT + SEARCH_SCORE_EPS)-DP (Liu & Talwar 2019; PS22 Thm 2 with eta = 1).
#
# The validation rows are the zero vector: a linear model without intercept scores 0 on them
# and predicts class 0 whatever its weights (noise included), so the count of correct
# predictions is #{y_val = 0} for every candidate and every run. The worst-case pair moves a
# validation label from 0 to 1: every run's score drops by 1/N_VAL (the released score is the
# best of K such scores). The second pair moves a validation row onto the first axis, where the
# candidates disagree (the strongly regularised one is nearly the non-private direction, the
# weak one mostly noise): it changes which candidate scores best. The third replaces a
# training row by its antipode with the other label.
#
# The released part: best_estimator_.coef_ (the chosen run's model) and best_score_. The best
# of K runs is not D's statistic plus one noise draw (a max over runs), so the noise law is
# checked on the [runs=1] variant: E[K] = 1 + 1e-12 (K = 1 except with probability 1e-12), one
# candidate; there best_score_ * N_VAL - #{y_val = 0} is exactly one Lap(1/SEARCH_SCORE_EPS)
# draw (the count is data-fixed, see above).

N_TRAIN, D_SEARCH, N_VAL = 30, 3, 8
EPS_FIT = 0.5
SEARCH_SCORE_EPS = 1.0
SEARCH_GRID = (0.1, 10.0)
SEARCH_MEAN_RUNS = 3.0
ONE_RUN = 1.0 + 1e-12  # E[K] of the [runs=1] variant: P[K >= 2] = 1 - 1/E[K] ~ 1e-12
SEARCH = "jaxdp.tuning.PrivateSearchCV.fit"
SEARCH_NOISE = "jaxdp.tuning.PrivateSearchCV.fit[runs=1, check=score noise]"


def search_pairs() -> list:
  """Replace-one pairs of (training rows, validation rows); the worst case first."""
  rng = np.random.default_rng(41)
  x = rng.normal(size=(N_TRAIN, D_SEARCH))
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  y = rng.integers(0, 2, size=N_TRAIN).astype(np.int32)
  base = {"x": x.astype(np.float32), "y": y, "x_val": np.zeros((N_VAL, D_SEARCH), np.float32),
          "y_val": np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int32)}

  def replaced(*changes):
    d = {k: v.copy() for k, v in base.items()}
    for name, i, value in changes:
      d[name][i] = value
    return d

  axis = np.zeros(D_SEARCH, np.float32)
  axis[0] = 1.0
  return [(base, replaced(("y_val", 0, 1))),            # every run's score down by 1/N_VAL
          (base, replaced(("x_val", 7, axis))),          # a row the candidates disagree on
          (base, replaced(("x", 0, -base["x"][0]), ("y", 0, 1 - base["y"][0])))]


def _search(seed=None, accountant=None, one_run: bool = False):
  from jaxdp import tuning  # pylint: disable=import-outside-toplevel
  from jaxdp.training.estimators import PrivateLinearClassifier  # pylint: disable=import-outside-toplevel
  clf = PrivateLinearClassifier(epsilon=EPS_FIT, method="output_perturbation", loss="logistic",
                                l2_reg=SEARCH_GRID[0], tol=1e-6, classes=[0, 1])
  return tuning.PrivateSearchCV(
      clf, param_grid={"l2_reg": list(SEARCH_GRID[:1] if one_run else SEARCH_GRID)},
      score_epsilon=SEARCH_SCORE_EPS,
      repetitions=tuning.GeometricRepetitions(ONE_RUN if one_run else SEARCH_MEAN_RUNS),
      scoring="accuracy", accountant=accountant, delta=0.0, seed=seed)


def _search_fit(search, d):
  return search.fit(d["x"], d["y"], X_val=d["x_val"], y_val=d["y_val"])


def _search_event(one_run: bool = False):
  from jaxdp import tuning  # pylint: disable=import-outside-toplevel
  from jaxdp.accounting import events  # pylint: disable=import-outside-toplevel
  run = events.ComposedDpEvent([
      events.PureDpEvent(EPS_FIT, neighbouring="replace_one"),
      events.LaplaceDpEvent(1.0 / SEARCH_SCORE_EPS, neighbouring="replace_one")])
  law = tuning.GeometricRepetitions(ONE_RUN if one_run else SEARCH_MEAN_RUNS)
  return events.RepeatAndSelectDpEvent(run, law.mean, 1.0)


def _search_vector(search) -> np.ndarray:
  return np.concatenate([np.asarray(search.best_estimator_.coef_, np.float64).ravel(),
                         [float(search.best_score_)]])


# The fitted search's public attributes (its parameters, the events, counts of the public grid)
# and the released model's public ones (as the estimator entries of entries_training.py).
_SEARCH_PUBLIC = ("estimator", "param_grid", "score_epsilon", "repetitions", "delta", "n_iter",
                  "validation_fraction", "event_", "per_run_event_", "epsilon_",
                  "n_candidates_", "best_index_", "rank_test_score", "epsilon", "l2_reg", "tol",
                  "max_iter", "h", "amp_fraction", "classes", "classes_", "_num_fits")
_COVERED = f"covered by {SEARCH} (the same search, K random)"

reg.register(reg.ReleasePoint(
    name=SEARCH, family="tuning", neighbouring="replace_one", unit="example",
    guarantee="3 (eps_fit + eps_score)-DP: the best of K ~ Geometric runs, each an eps_fit-DP "
              "fit (output perturbation, paper 003 Alg. 4) and an eps_score-DP Laplace "
              "validation count (Dwork-Roth Thm 3.6); Liu-Talwar 2019, PS22 Thm 2",
    epsilon=3.0 * (EPS_FIT + SEARCH_SCORE_EPS), delta=0.0, pairs=search_pairs,
    release=lambda key, d: _search_fit(_search(seed=key), d), vector=_search_vector,
    event=_search_event,
    charged=lambda d, acc: (_search_fit(_search(seed=jax.random.key(3), accountant=acc), d), 1),
    fresh=lambda d: _search_fit(_search(), d), sensitivity=None, noise=None,
    audit=reg.AuditSpec(statistic=lambda s: float(s.best_score_), trials=60, slow_trials=2_000),
    support="continuous", public_outputs=_SEARCH_PUBLIC,
    skip={"replay": _SELECTION,
          "noise": "selection: the released model and score are the best of K runs (a maximum "
                   f"over runs), not D's statistic plus one noise draw; {SEARCH_NOISE} checks "
                   "the score's noise with one run"}))

reg.register(reg.ReleasePoint(
    name=SEARCH_NOISE, family="tuning", neighbouring="replace_one", unit="example",
    guarantee="one run (K = 1 except with probability 1e-12): the score is the Laplace "
              "count of correct validation predictions, Lap(1/eps_score) (Dwork-Roth Thm 3.6)",
    epsilon=3.0 * (EPS_FIT + SEARCH_SCORE_EPS), delta=0.0, pairs=search_pairs,
    release=lambda key, d: _search_fit(_search(seed=key, one_run=True), d),
    vector=lambda s: np.array([float(s.best_score_) * N_VAL]),
    event=lambda: _search_event(one_run=True), charged=None, fresh=None,
    sensitivity=1.0, norm="l1",
    noise=reg.NoiseSpec("laplace", 1.0 / SEARCH_SCORE_EPS,
                        lambda d: np.array([float(np.sum(np.asarray(d["y_val"]) == 0))]),
                        "Dwork-Roth Thm 3.6: Lap(Delta_1/eps_score), Delta_1 = 1 (one validation "
                        "row moves the count of correct predictions by at most 1)"),
    audit=None, support="continuous", public_outputs=_SEARCH_PUBLIC,
    skip={"charge": _COVERED, "fresh": _COVERED, "audit": _COVERED, "extreme": _COVERED,
          "no_nonprivate": _COVERED, "support": _COVERED}))

# Every search fit is host-side (scikit-learn clones, numpy certificates); the score-noise
# variant draws one noise coordinate per search (~15 ms): its noise check runs under slow.
cc.host_side(SEARCH)
cc.slow_noise(SEARCH_NOISE)

reg.not_a_release_point(
    "jaxdp.tuning.PrivateSearchCV",
    "the constructor stores parameters and reads no data; its fit is registered")
for _method in ("predict", "predict_proba"):
  reg.not_a_release_point(
      f"jaxdp.tuning.PrivateSearchCV.{_method}",
      "post-processing of the released best_estimator_ (the fit is the registered release) on "
      "the caller's query rows; spends nothing")
reg.not_a_release_point(
    "jaxdp.tuning.fit_events",
    "reads the DpEvents an estimator's fit would spend (a stand-in accountant stops the fit at "
    "its spend, before any release); trains, spends and releases nothing")


# The law-of-K audit (2,000 searches) runs under slow; the default run audits the main
# repeat_and_select entry, and test_power's fixed-K row (slow) catches a wrong law.
import conformance_checks as _cc  # pylint: disable=wrong-import-position

_cc.slow_checks(LAW_NAME, "audit")
