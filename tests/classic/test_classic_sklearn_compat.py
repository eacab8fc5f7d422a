"""The classic estimators are scikit-learn estimators (issue 27, classic part).

``clone`` (sharing the caller's accountant), ``get_params``/``set_params``,
``Pipeline``, scikit-learn's API checks that need no fit; parameters are stored
unchanged by the constructor and checked by ``fit`` with a named error before
any key draw or privacy spend.
"""

import copy
import pickle

import numpy as np
import pytest
from sklearn import base
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import MinMaxScaler
from sklearn.utils import estimator_checks

from jaxdp import _keys
from jaxdp.accounting import PrivacyAccountant
from jaxdp.classic import kmeans as km
from jaxdp.classic import linear_regression as lr
from jaxdp.classic import naive_bayes as nb
from jaxdp.classic import pca
from jaxdp.classic import random_trees as rt

_RNG = np.random.default_rng(0)
_X = _RNG.normal(size=(40, 3))
_Y = (_X[:, 0] > 0).astype(int)
_Y[:2] = [0, 1]
_YR = _X @ np.array([1.0, -0.5, 0.2])

# Bounds [0, 1]: the range of MinMaxScaler's output on the rows it was fitted on. (Its
# min/max are read off the data without noise: a real pipeline declares public bounds.)
_BOX = dict(lower=0.0, upper=1.0, clip=True)


def _make(name, **kw):
  """A small estimator of each kind (parameters valid unless overridden by ``kw``)."""
  if name == "naive_bayes":
    return nb.PrivateNaiveBayes(**{"epsilon": 1.0, "classes": [0, 1], **_BOX, **kw})
  if name == "random_trees":
    return rt.PrivateRandomTrees(**{"epsilon": 1.0, "classes": [0, 1], "n_estimators": 2,
                                    "depth": 2, **_BOX, **kw})
  if name == "kmeans":
    return km.PrivateKMeans(**{"n_clusters": 2, "epsilon": 1.0, "iterations": 2, **_BOX, **kw})
  if name == "pca":
    return pca.PrivatePCA(**{"n_components": 2, "epsilon": 1.0, "mechanism": "laplace",
                             "center": [0.5, 0.5, 0.5], "clip": True, **kw})
  return lr.PrivateLinearRegression(**{"epsilon": 1.0, "y_lower": -3.0, "y_upper": 3.0,
                                       **_BOX, **kw})


ESTIMATORS = ("naive_bayes", "random_trees", "kmeans", "pca", "linear_regression")
MIXINS = {"naive_bayes": base.ClassifierMixin, "random_trees": base.ClassifierMixin,
          "kmeans": base.ClusterMixin, "pca": base.TransformerMixin,
          "linear_regression": base.RegressorMixin}


def _y(name):
  return np.clip(_YR, -3.0, 3.0) if name == "linear_regression" else _Y


@pytest.mark.parametrize("name", ESTIMATORS)
def test_clone_round_trips_params_and_shares_the_accountant(name):
  acc = PrivacyAccountant()
  # The original at epsilon = 2, the clone set to 1: the clone's fit is then the one of
  # test_pipeline_fits_and_predicts_or_transforms (epsilon 1, the same scaled rows), whose
  # compiled core it shares (noise scales are compile-time constants of the classic cores).
  est = _make(name, accountant=acc, seed=5, epsilon=2.0)
  assert isinstance(est, base.BaseEstimator) and isinstance(est, MIXINS[name])
  params = est.get_params()
  assert params["accountant"] is acc and params["seed"] == 5 and params["epsilon"] == 2.0
  c = clone(est)
  assert c is not est and c.accountant is acc  # the ledger is shared, never copied
  assert {k: v for k, v in c.get_params().items() if k != "center"} == {
      k: v for k, v in params.items() if k != "center"}
  np.testing.assert_array_equal(c.get_params().get("center", 0), params.get("center", 0))
  assert c.set_params(epsilon=1.0) is c and c.epsilon == 1.0 and est.epsilon == 2.0
  # A fitted clone spends on the caller's accountant; the original stays unfitted.
  c.fit(MinMaxScaler().fit_transform(_X), _y(name))
  assert acc.pure_epsilon() == pytest.approx(1.0)  # the clone's epsilon, set above
  assert not hasattr(est, "event_") and hasattr(c, "event_")
  assert all(not k.endswith("_") for k in params)  # parameters vs fitted attributes


@pytest.mark.parametrize("name", ESTIMATORS)
def test_pickle_or_deepcopy_with_an_accountant_is_refused(name):
  est = _make(name, accountant=PrivacyAccountant())
  with pytest.raises(TypeError, match="accountant"):
    pickle.dumps(est)
  with pytest.raises(TypeError, match="accountant"):
    copy.deepcopy(est)
  est.set_params(accountant=None)
  assert pickle.loads(pickle.dumps(est)).get_params()["epsilon"] == 1.0


@pytest.mark.parametrize("name", ESTIMATORS)
def test_pipeline_fits_and_predicts_or_transforms(name):
  acc = PrivacyAccountant()
  pipe = Pipeline([("scale", MinMaxScaler()), ("est", _make(name, accountant=acc, seed=0))])
  pipe.fit(_X, _y(name))
  est = pipe.named_steps["est"]
  assert est.n_features_in_ == 3 and hasattr(est, "event_")
  if name == "pca":
    out = pipe.transform(_X)
    assert out.shape == (40, 2) and np.all(np.isfinite(out))
    np.testing.assert_allclose(
        out, (MinMaxScaler().fit_transform(_X) - 0.5) @ est.components_.T, atol=1e-6)
  else:
    out = pipe.predict(_X)
    assert out.shape == (40,) and np.all(np.isfinite(out))
    if name in ("naive_bayes", "random_trees"):
      assert set(np.unique(out)) <= {0, 1}
      assert 0.0 <= pipe.score(_X, _Y) <= 1.0
    if name == "kmeans":
      assert set(np.unique(out)) <= {0, 1}
  spent = acc.pure_epsilon()
  assert spent == pytest.approx(1.0)  # one fit, one charge of epsilon = 1


def test_kmeans_fit_predict_and_pca_fit_transform():
  x = MinMaxScaler().fit_transform(_X)
  k = _make("kmeans", seed=1)
  labels = k.fit_predict(x)
  np.testing.assert_array_equal(labels, k.predict(x))
  assert not hasattr(k, "labels_")  # not stored: the training rows' assignments
  p = _make("pca", seed=1)
  np.testing.assert_allclose(p.fit_transform(x), p.transform(x))


# Bad parameters: the constructor stores them (no error), fit raises a named error before any
# key draw or spend.
BAD = [
    ("naive_bayes", dict(epsilon=0.0), "epsilon"),
    ("naive_bayes", dict(classes=[1]), "classes"),
    ("naive_bayes", dict(noise="laplace"), "noise"),
    ("naive_bayes", dict(categorical_features="0"), "categorical_features"),
    ("naive_bayes", dict(categorical_features=[7]), "categorical_features"),
    ("naive_bayes", dict(neighbouring="add"), "neighbouring"),
    ("naive_bayes", dict(seed=1.5), "seed"),
    ("naive_bayes", dict(accountant="acc"), "accountant"),
    ("naive_bayes", dict(classes="ab"), "classes"),
    ("naive_bayes", dict(lower=None), "lower and upper are required"),
    ("random_trees", dict(classes=[0, 0]), "classes"),
    ("random_trees", dict(epsilon=float("nan")), "epsilon"),
    ("random_trees", dict(combine="vote"), "combine"),
    ("random_trees", dict(depth=0), "depth"),
    ("random_trees", dict(n_estimators=0), "n_estimators"),
    ("random_trees", dict(noise=None), "noise"),
    ("random_trees", dict(seed="0"), "seed"),
    ("kmeans", dict(method="kmeans++"), "method"),
    ("kmeans", dict(n_clusters=0), "n_clusters"),
    ("kmeans", dict(epsilon=-1.0), "epsilon"),
    ("kmeans", dict(iterations=0), "iterations"),
    ("kmeans", dict(noise="Discrete"), "noise"),
    ("kmeans", dict(accountant=3), "accountant"),
    ("pca", dict(n_components=0), "n_components"),
    ("pca", dict(epsilon=0.0), "epsilon"),
    ("pca", dict(neighbouring="swap"), "neighbouring"),
    ("pca", dict(seed=True), "seed"),
    ("linear_regression", dict(epsilon=-2.0), "epsilon"),
    ("linear_regression", dict(seed=2.0), "seed"),
    ("linear_regression", dict(accountant=object()), "accountant"),
]


@pytest.mark.parametrize("name,kw,pattern", BAD, ids=[f"{b[0]}-{b[2]}" for b in BAD])
def test_bad_parameters_raise_at_fit_before_any_spend(name, kw, pattern, monkeypatch):
  acc = PrivacyAccountant()
  kw = {"accountant": acc, **kw}
  est = _make(name, **kw)  # no error: stored as given
  for k, v in kw.items():
    assert est.get_params()[k] is v
  draws = []
  real = _keys.fit_key
  monkeypatch.setattr(_keys, "fit_key", lambda *a, **k: draws.append(1) or real(*a, **k))
  with pytest.raises((ValueError, TypeError), match=pattern):
    est.fit(MinMaxScaler().fit_transform(_X), _y(name))
  assert draws == []  # refused before the key draw
  assert acc.pure_epsilon() == 0.0
  assert not hasattr(est, "event_")


# Labels: the PUBLIC label set ``classes`` (any sortable labels), as the training estimators.
_LABELS = np.array(["<=50K", ">50K"])
CLASSIFIERS = ("naive_bayes", "random_trees")


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_string_labels_round_trip_through_classes(name):
  x, y = MinMaxScaler().fit_transform(_X), _LABELS[_Y]
  est = _make(name, classes=[">50K", "<=50K"], seed=0).fit(x, y)
  np.testing.assert_array_equal(est.classes_, ["<=50K", ">50K"])  # sorted, as scikit-learn
  pred = est.predict(x)
  assert pred.shape == (40,) and set(pred) <= {"<=50K", ">50K"}
  assert est.score(x, y) == pytest.approx(np.mean(pred == y))
  # Integer labels 0/1 through the same set in index order: the same model and predictions.
  idx = _make(name, classes=[0, 1], seed=0).fit(x, _Y)
  np.testing.assert_array_equal(_LABELS[idx.predict(x)], pred)
  # classes=None reads the set off y: allowed, with a warning that it is not private.
  with pytest.warns(UserWarning, match="NOT differentially private"):
    inferred = _make(name, classes=None, seed=0).fit(x, y)
  np.testing.assert_array_equal(inferred.classes_, ["<=50K", ">50K"])


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_label_outside_classes_raises_naming_y_before_any_spend(name, monkeypatch):
  acc = PrivacyAccountant()
  y = _LABELS[_Y].astype(object)
  y[5] = "unknown"
  est = _make(name, classes=list(_LABELS), accountant=acc)
  draws = []
  real = _keys.fit_key
  monkeypatch.setattr(_keys, "fit_key", lambda *a, **k: draws.append(1) or real(*a, **k))
  with pytest.raises(ValueError, match=r"y contains labels outside classes.*row 5") as err:
    est.fit(MinMaxScaler().fit_transform(_X), y)
  assert "unknown" not in str(err.value)  # the row is named, never the private label
  assert draws == [] and acc.ledger == () and acc.pure_epsilon() == 0.0
  assert not hasattr(est, "event_")


# A tiny grid each; k-means searches a parameter that changes no noise scale (each scale is
# a compile-time constant of its jitted core: a grid over epsilon would compile every point).
GRIDS = {"naive_bayes": {"epsilon": [1.0, 2.0]}, "random_trees": {"epsilon": [1.0, 2.0]},
         "kmeans": {"init": ["central", "uniform"]}}


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_grid_search_clones_share_the_accountant(name):
  acc = PrivacyAccountant()
  x = MinMaxScaler().fit_transform(_X)
  labels = {} if name == "kmeans" else {"classes": list(_LABELS)}
  est = _make(name, accountant=acc, **labels)  # seed=None: fresh noise at every fit
  c = clone(est)
  assert c.get_params()["accountant"] is acc and c.get_params()["epsilon"] == 1.0
  gs = GridSearchCV(est, GRIDS[name], cv=2)
  if name == "kmeans":
    gs.fit(x)
    assert gs.best_estimator_.cluster_centers_.shape == (2, 3)
  else:
    gs.fit(x, _LABELS[_Y])
    assert set(gs.predict(x)) <= set(_LABELS)
    np.testing.assert_array_equal(gs.best_estimator_.classes_, _LABELS)
  assert np.isfinite(gs.best_score_)
  # Every fit is charged to the shared ledger: 2 folds x 2 grid points, plus the refit.
  eps = GRIDS[name].get("epsilon", [1.0, 1.0])
  best = gs.best_params_.get("epsilon", 1.0)
  assert acc.pure_epsilon() == pytest.approx(2 * sum(eps) + best)
  assert not hasattr(est, "event_")  # the estimator given to GridSearchCV is left unfitted


# scikit-learn's own API checks that need no fit (each with its own assertions).
_API_CHECKS = ("check_no_attributes_set_in_init", "check_do_not_raise_errors_in_init_or_set_params",
               "check_get_params_invariance", "check_set_params", "check_estimator_repr",
               "check_estimator_cloneable", "check_mixin_order", "check_estimators_unfitted")


@pytest.mark.parametrize("check", _API_CHECKS)
@pytest.mark.parametrize("name", ESTIMATORS)
def test_sklearn_api_checks(name, check):
  est = _make(name)
  getattr(estimator_checks, check)(type(est).__name__, est)
