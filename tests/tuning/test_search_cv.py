"""PrivateSearchCV: a scikit-learn search paid for once, releasing only the chosen run."""

import pickle
import warnings

import numpy as np
import pytest
from scipy.stats import loguniform
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

from jaxdp.accounting import PrivacyAccountant, PrivacyBudget, events
from jaxdp.classic import (PrivateKMeans, PrivateLinearRegression, PrivateNaiveBayes, PrivatePCA,
                           PrivateRandomTrees)
from jaxdp.errors import BudgetExceededError
from jaxdp.training import PrivateLogisticRegression, estimators
from jaxdp.tuning import GeometricRepetitions, LogarithmicRepetitions, PoissonRepetitions
from jaxdp.tuning.search_cv import PrivateSearchCV, fit_events

_RNG = np.random.default_rng(0)
N = 120
X = _RNG.normal(size=(N, 3))
X /= np.linalg.norm(X, axis=1, keepdims=True)
Y = (X[:, 0] + 0.3 * _RNG.normal(size=N) > 0).astype(int)
X01 = (X + 1.0) / 2.0  # in [0, 1]: the declared bounds of the classic models
YR = np.clip(X01 @ np.array([1.0, -0.5, 0.2]), -1.0, 1.0)
LR = dict(epsilon=1.0, method="model_sensitivity", classes=[0, 1])
GRID = {"l2_reg": [0.05, 0.5]}


def _search(est, grid=GRID, **kw):
  kw = {"score_epsilon": 0.5, "repetitions": 2, "seed": 0, **kw}
  return PrivateSearchCV(est, grid, **kw)


def test_one_charge_before_any_fit_and_only_the_chosen_run_is_released():
  acc = PrivacyAccountant()
  est = PrivateLogisticRegression(accountant=acc, **LR)
  search = _search(est).fit(X, Y)
  # ONE spend: the repeat-and-select event of (fit, score), on the estimator's accountant.
  assert len(acc.ledger) == 1 and acc.ledger[0][1] == 1
  spent = acc.ledger[0][0]
  assert isinstance(spent, events.RepeatAndSelectDpEvent) and spent == search.event_
  assert spent.event == events.ComposedDpEvent([
      events.PureDpEvent(1.0, neighbouring="replace_one"),
      events.LaplaceDpEvent(noise_multiplier=2.0, neighbouring="replace_one")])
  assert (spent.mean, spent.shape) == (2.0, 0.0)  # repetitions=2: LogarithmicRepetitions(2)
  assert search.epsilon_ == pytest.approx(acc.get_epsilon(1e-6))
  assert search.epsilon_ <= 2 * (1.0 + 0.5) + 1e-9  # pure run: (2 + eta) eps, eta = 0 (PS22 Thm 2)
  # Released: the chosen run's model, candidate and private score; nothing of the other runs.
  assert search.best_params_ in list(map(dict, [{"l2_reg": 0.05}, {"l2_reg": 0.5}]))
  assert np.isfinite(search.best_score_)
  assert set(search.cv_results_) == {"params", "param_l2_reg", "mean_test_score",
                                     "rank_test_score"}
  assert search.cv_results_["params"] == [search.best_params_]
  assert search.cv_results_["mean_test_score"].tolist() == [search.best_score_]
  assert not hasattr(search, "n_runs_")  # K is not released (see repeat_and_select)
  best = search.best_estimator_
  assert best.coef_.shape == (3, 2) and best.l2_reg == search.best_params_["l2_reg"]
  assert best.accountant is acc and best.seed is None  # the user's own settings are restored
  assert search.predict(X).shape == (N,) and set(search.classes_) == {0, 1}
  assert not hasattr(est, "coef_")  # the estimator given is left unfitted


def test_a_refused_budget_fits_nothing(monkeypatch):
  calls = []
  real = estimators.output_perturbation.model_sensitivity
  monkeypatch.setattr(estimators.output_perturbation, "model_sensitivity",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  budget = PrivacyBudget(epsilon=2.0)  # the search costs about 3
  with pytest.raises(BudgetExceededError):
    _search(PrivateLogisticRegression(**LR), accountant=budget).fit(X, Y)
  assert budget.spent_epsilon == 0.0 and calls == []
  _search(PrivateLogisticRegression(**LR), accountant=PrivacyBudget(epsilon=4.0)).fit(X, Y)
  assert calls  # the same search, affordable, trains


def test_candidate_events_that_differ_are_charged_by_the_dominating_one():
  acc = PrivacyAccountant()
  search = _search(PrivateLogisticRegression(**LR), {"epsilon": [0.5, 1.0, 2.0]},
                   accountant=acc, repetitions=GeometricRepetitions(3)).fit(X, Y)
  fit_event = search.per_run_event_.events[0]
  assert fit_event == events.PureDpEvent(2.0, neighbouring="replace_one")  # the largest
  assert search.epsilon_ <= 3 * (2.0 + 0.5) + 1e-9  # Liu & Talwar: 3 eps for geometric K
  assert acc.ledger[0][0] == search.event_


def test_the_accountant_is_the_searchs_or_the_estimators_never_two():
  mine, other = PrivacyAccountant(), PrivacyAccountant()
  with pytest.raises(ValueError, match="another accountant"):
    _search(PrivateLogisticRegression(accountant=other, **LR), accountant=mine).fit(X, Y)
  assert mine.ledger == () and other.ledger == ()
  search = _search(PrivateLogisticRegression(**LR), accountant=mine).fit(X, Y)
  assert mine.ledger[0][0] == search.event_ and search.best_estimator_.accountant is None


def test_seeded_searches_are_reproducible_and_runs_get_their_own_keys():
  a = _search(PrivateLogisticRegression(**LR), repetitions=3).fit(X, Y)
  b = _search(PrivateLogisticRegression(**LR), repetitions=3).fit(X, Y)
  assert a.best_params_ == b.best_params_ and a.best_score_ == b.best_score_
  np.testing.assert_array_equal(a.best_estimator_.coef_, b.best_estimator_.coef_)
  c = _search(PrivateLogisticRegression(**LR), repetitions=3, seed=1).fit(X, Y)
  assert not np.allclose(a.best_estimator_.coef_, c.best_estimator_.coef_)
  # The estimator's own seed is restored on the release, never used by the runs.
  assert _search(PrivateLogisticRegression(seed=7, **LR)).fit(X, Y).best_estimator_.seed == 7


def test_the_split_does_not_depend_on_the_data():
  import jax  # pylint: disable=import-outside-toplevel
  search, key = _search(PrivateLogisticRegression(**LR)), jax.random.key(3)
  x_tr, y_tr, x_va, y_va = search._split(key, X, Y, None, None)
  other = search._split(key, -X, 1 - Y, None, None)  # same n, other values: same rows
  np.testing.assert_array_equal(other[0], -x_tr)
  np.testing.assert_array_equal(other[2], -x_va)
  assert len(y_tr) + len(y_va) == N and 0 < len(y_va) < N
  with pytest.raises(ValueError, match="left a part empty"):
    search._split(key, X[:1], Y[:1], None, None)


def test_refit_is_a_second_paid_fit_on_all_rows(monkeypatch):
  rows = []
  real = estimators.output_perturbation.model_sensitivity
  monkeypatch.setattr(estimators.output_perturbation, "model_sensitivity",
                      lambda key, x, *a, **k: rows.append(x.shape[0]) or real(key, x, *a, **k))
  acc = PrivacyAccountant()
  search = _search(PrivateLogisticRegression(**LR), accountant=acc, refit=True).fit(X, Y)
  total = acc.ledger[0][0]
  assert len(acc.ledger) == 1 and total == search.event_
  assert isinstance(total, events.ComposedDpEvent)
  ras, refit = total.events
  assert isinstance(ras, events.RepeatAndSelectDpEvent)
  assert refit == events.ComposedDpEvent([events.PureDpEvent(1.0, neighbouring="replace_one")])
  assert rows[-1] == N and all(r < N for r in rows[:-1])  # runs on the split, the refit on all
  cheaper = _search(PrivateLogisticRegression(**LR)).fit(X, Y)
  assert search.epsilon_ == pytest.approx(cheaper.epsilon_ + 1.0, rel=1e-3)


def test_param_distributions_sample_n_iter_candidates_from_the_search_key():
  search = _search(PrivateLogisticRegression(**LR), grid=None, param_distributions={
      "l2_reg": loguniform(1e-3, 1.0)}, n_iter=4).fit(X, Y)
  assert search.n_candidates_ == 4 and 1e-3 <= search.best_params_["l2_reg"] <= 1.0
  again = clone(search).fit(X, Y)
  assert again.best_params_ == search.best_params_


# -- every jaxdp estimator -----------------------------------------------------------------

_BOX = dict(lower=0.0, upper=1.0, clip=True)
ESTIMATORS = {
    "logistic_regression": (lambda: PrivateLogisticRegression(**LR), GRID, X, Y, {}),
    "linear_classifier": (lambda: estimators.PrivateLinearClassifier(
        epsilon=1.0, method="output_perturbation", classes=[0, 1]),
                          {"loss": ["logistic", "huber"]}, X, Y, {}),
    "naive_bayes": (lambda: PrivateNaiveBayes(epsilon=1.0, classes=[0, 1], **_BOX),
                    {"alpha": [0.5, 1.0]}, X01, Y, {}),
    "random_trees": (lambda: PrivateRandomTrees(epsilon=1.0, classes=[0, 1], n_estimators=2,
                                                **_BOX), {"depth": [1, 2]}, X01, Y, {}),
    "kmeans": (lambda: PrivateKMeans(n_clusters=2, epsilon=1.0, iterations=2, **_BOX),
               {"init": ["central", "uniform"]}, X01, None, {"score_bound": 3.0}),
    "pca": (lambda: PrivatePCA(n_components=1, epsilon=1.0, mechanism="laplace",
                               center=[0.5] * 3, clip=True), {"n_components": [1, 2]}, X01, None,
            {"score_bound": 1.0}),
    "linear_regression": (lambda: PrivateLinearRegression(epsilon=1.0, y_lower=-1.0, y_upper=1.0,
                                                          **_BOX),
                          {"l2_reg": [0.0, 0.1]}, X01, YR, {"score_bound": 4.0}),
}


# Always on: one estimator per kind of score; the others compile for seconds (slow, same asserts).
_SLOW = ("kmeans", "linear_classifier", "naive_bayes", "random_trees")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW else n
                                  for n in sorted(ESTIMATORS)])
def test_every_jaxdp_estimator_is_searched_and_charged_once(name):
  make, grid, x, y, kw = ESTIMATORS[name]
  acc = PrivacyAccountant()
  search = _search(make(), grid, accountant=acc, **kw).fit(x, y)
  assert len(acc.ledger) == 1 and acc.ledger[0][0] == search.event_
  assert isinstance(search.event_, events.RepeatAndSelectDpEvent)
  assert np.isfinite(search.best_score_) and np.isfinite(search.epsilon_)
  assert search.best_params_ in [dict(zip(grid, [v])) for v in next(iter(grid.values()))]
  assert search.best_estimator_.event_ == search.per_run_event_.events[0]
  assert search.scorer_ == {"kmeans": "neg_kmeans_cost", "pca": "neg_reconstruction_error",
                            "linear_regression": "neg_mean_squared_error"}.get(name, "accuracy")
  if name == "kmeans":
    assert search.predict(x).shape == (N,)
  elif name == "pca":
    assert search.transform(x).shape[0] == N
  else:
    assert search.predict(x).shape == (N,)


def test_fit_events_reads_the_event_without_training_or_spending(monkeypatch):
  called = []
  monkeypatch.setattr(estimators.output_perturbation, "model_sensitivity",
                      lambda *a, **k: called.append(1))
  acc = PrivacyAccountant()
  est = PrivateLogisticRegression(accountant=acc, **LR)
  assert fit_events(est, X, Y) == [events.PureDpEvent(1.0, neighbouring="replace_one")]
  assert called == [] and acc.ledger == () and est.accountant is acc
  with pytest.raises(ValueError, match="spent no DpEvent"):
    fit_events(StandardScaler(), X)


# -- pipelines ---------------------------------------------------------------------------------

def test_a_pipeline_with_a_public_transform_tunes_step_params():
  pipe = Pipeline([("unit", FunctionTransformer(lambda v: v / np.maximum(
      np.linalg.norm(v, axis=1, keepdims=True), 1.0))), ("clf", PrivateLogisticRegression(**LR))])
  acc = PrivacyAccountant()
  search = _search(pipe, {"clf__l2_reg": [0.05, 0.5]}, accountant=acc).fit(3 * X, Y)
  assert search.best_params_["clf__l2_reg"] in (0.05, 0.5)
  assert search.best_estimator_.named_steps["clf"].l2_reg == search.best_params_["clf__l2_reg"]
  assert search.predict(3 * X).shape == (N,) and len(acc.ledger) == 1


def _pca_then_classifier():
  return Pipeline([("pca", PrivatePCA(n_components=2, epsilon=0.5, mechanism="laplace",
                                      center=[0.5] * 3, clip=True)),
                   ("clf", PrivateLogisticRegression(normalize=True, **LR))])


def test_a_pipeline_with_a_private_transform_reads_both_events_in_order():
  acc = PrivacyAccountant()
  pipe = _pca_then_classifier().set_params(pca__accountant=acc, clf__accountant=acc)
  fit_pca, fit_clf = fit_events(pipe, X01, Y)
  assert fit_pca == PrivatePCA(n_components=2, epsilon=0.5, mechanism="laplace",
                               center=[0.5] * 3, clip=True).fit(X01).event_
  assert fit_clf == events.PureDpEvent(1.0, neighbouring="replace_one")
  assert acc.ledger == ()  # the probe's PCA fit is discarded and charged nowhere


@pytest.mark.slow
def test_a_pipeline_with_a_private_transform_composes_both_events():
  search = _search(_pca_then_classifier(), {"clf__l2_reg": [0.05, 0.5]}).fit(X01, Y)
  fit_pca, fit_clf, score = search.per_run_event_.events
  assert fit_pca == search.best_estimator_.named_steps["pca"].event_
  assert fit_clf == events.PureDpEvent(1.0, neighbouring="replace_one")
  assert isinstance(score, events.LaplaceDpEvent)
  assert search.predict(X01).shape == (N,)


def test_a_pipeline_step_that_learns_without_noise_is_refused():
  acc = PrivacyAccountant()
  pipe = Pipeline([("scale", StandardScaler()), ("clf", PrivateLogisticRegression(**LR))])
  with pytest.raises(ValueError, match="'scale'.*learns from the training rows without noise"):
    _search(pipe, {"clf__l2_reg": [0.1]}, accountant=acc).fit(X, Y)
  assert acc.ledger == ()
  with pytest.raises(ValueError, match="jaxdp estimator"):
    _search(Pipeline([("f", FunctionTransformer()), ("s", StandardScaler())]), {}).fit(X, Y)


# -- bad input: refused before anything is spent -------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    (dict(grid={"seed": [1, 2]}), "may not set"),
    (dict(grid={"accountant": [None]}), "may not set"),
    (dict(param_distributions={"l2_reg": [0.1]}), "exactly one"),
    (dict(grid={"l2_reg": [0.1]}, scoring="neg_mean_squared_error", score_bound=1.0),
     "needs a regressor"),
    (dict(scoring="r2"), "scoring must be one of"),
    (dict(scoring="accuracy", score_bound=1.0), "sensitivity 1"),
    (dict(validation_fraction=1.0), "validation_fraction"),
    (dict(score_epsilon=0.0), "score_epsilon"),
    (dict(repetitions=1), "mean"),
    (dict(grid={"no_such": [1]}), "no_such"),
])
def test_bad_arguments_are_refused_before_any_spend(kw, match):
  acc = PrivacyAccountant()
  grid = kw.pop("grid", GRID)
  with pytest.raises((ValueError, TypeError), match=match):
    _search(PrivateLogisticRegression(**LR), grid, accountant=acc, **kw).fit(X, Y)
  assert acc.ledger == ()


def test_a_loss_scoring_needs_a_bound_and_unaccountable_fits_are_refused():
  acc = PrivacyAccountant()
  with pytest.raises(ValueError, match="score_bound"):
    _search(PrivateLinearRegression(epsilon=1.0, y_lower=-1.0, y_upper=1.0, **_BOX),
            {"l2_reg": [0.0]}, accountant=acc).fit(X01, YR)
  import math  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="no accounting method"):
    _search(PrivateLogisticRegression(epsilon=math.inf, method="non_private", classes=[0, 1]),
            accountant=acc).fit(X, Y)
  with pytest.raises(ValueError, match="ApproxDpEvent"):  # (eps, delta) fits: no RDP bound
    _search(PrivateLogisticRegression(epsilon=1.0, delta=1e-6, classes=[0, 1]),
            accountant=acc).fit(X, Y)
  with pytest.raises(ValueError, match="differ and no candidate's event dominates"):
    _search(PrivatePCA(n_components=1, epsilon=1.0, center=[0.5] * 3, clip=True),
            [{"mechanism": ["laplace"], "delta": [0.0]},  # pure vs Gaussian: the curves cross
             {"mechanism": ["gaussian"], "delta": [1e-5]}], accountant=acc,
            score_bound=1.0).fit(X01)
  assert acc.ledger == ()


# -- what is not released ----------------------------------------------------------------------

def test_k_zero_releases_nothing_and_is_still_paid():
  acc = PrivacyAccountant()
  for seed in range(20):  # P[K = 0] = e^-1 under PoissonRepetitions(1)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      search = _search(PrivateLogisticRegression(**LR), accountant=acc,
                       repetitions=PoissonRepetitions(1.0), seed=seed).fit(X, Y)
    if search.best_estimator_ is None:
      break
  assert search.best_estimator_ is None and search.best_params_ is None
  assert search.best_score_ is None and search.cv_results_["params"] == []
  assert any("released nothing" in str(w.message) for w in caught)
  assert len(acc.ledger) == 1 and acc.ledger[0][1] == seed + 1  # every search paid
  with pytest.raises(NotFittedError, match="released no model"):
    search.predict(X)


def test_clone_shares_the_accountant_and_pickling_is_refused():
  acc = PrivacyAccountant()
  search = _search(PrivateLogisticRegression(**LR), accountant=acc)
  assert clone(search).accountant is acc
  with pytest.raises(TypeError, match="accountant"):
    pickle.dumps(search)
  plain = _search(PrivateLogisticRegression(**LR), repetitions=LogarithmicRepetitions(2))
  assert pickle.loads(pickle.dumps(plain)).get_params()["repetitions"] == plain.repetitions
