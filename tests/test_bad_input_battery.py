"""A battery of bad inputs across the public API (at least 80 cases).

DP-SGD (``tests/dpsgd/test_input_checks.py``) and the training
estimators (``tests/training/test_sklearn_compat.py``) have their own. Here:
``jaxdp.classic`` (estimators and quantiles), ``jaxdp.inference``
(confidence intervals), ``jaxdp.multiparty``, ``jaxdp.mechanisms``,
``jaxdp.accounting`` (the ledger and DP-SGD's accounting, incl. the
neighbouring relation), DP-SGD's relation argument and ``jaxdp.prediction``
predictors. Every case must

* raise a ``ValueError``/``TypeError`` (jaxdp's error classes subclass them),
* with a message naming the offending argument, and
* from a frame inside the jaxdp package: the last frame of the traceback is a
  jaxdp file, not jax/numpy/optax/flax/scikit-learn internals (a library that
  validates its inputs refuses them itself, before any work or spend).

No case is silent. Data are tiny and every case raises before any compile.
"""

import functools
import os

import jax
import numpy as np
import pytest

import dp_accounting

from jaxdp import classic, mechanisms, multiparty
from jaxdp.accounting import PrivacyAccountant, dpsgd_accounting, events
from jaxdp import dpsgd
from jaxdp.inference import confidence_intervals
from jaxdp.prediction import PredictionSensitivityPredictor, calibrate_prediction_sensitivity

_RNG = np.random.default_rng(0)
X = _RNG.uniform(0.0, 0.5, (24, 2))  # inside [0, 1]^2 and the unit ball
Y = np.arange(24) % 2
X_CI = np.hstack([X * 0.5, np.ones((24, 1)) * 0.5])  # ||x_i|| <= 1, with an intercept column
Y_PM = 2 * Y - 1  # labels in {-1, +1}
KEY = jax.random.key(0)
BOX = dict(lower=[0.0, 0.0], upper=[1.0, 1.0])


def _nan(a):
  a = np.array(a, np.float64)
  a.flat[3] = np.nan
  return a


def _inf(a):
  a = np.array(a, np.float64)
  a.flat[1] = np.inf
  return a


# -- estimators (fitted once, lazily; a fit is a few small compiles) ---------
def _nb(**kw):
  return classic.PrivateNaiveBayes(**{"epsilon": 1.0, "classes": [0, 1], **BOX, "seed": 0, **kw})


def _trees(**kw):
  return classic.PrivateRandomTrees(**{"epsilon": 1.0, "classes": [0, 1], **BOX,
                                       "n_estimators": 2, "depth": 2, "seed": 0, **kw})


def _kmeans(**kw):
  return classic.PrivateKMeans(**{"n_clusters": 2, "epsilon": 1.0, **BOX, "iterations": 1,
                                  "seed": 0, **kw})


def _pca(**kw):
  return classic.PrivatePCA(**{"n_components": 1, "epsilon": 1.0, "mechanism": "laplace",
                               "seed": 0, **kw})


def _linreg(**kw):
  return classic.PrivateLinearRegression(**{"epsilon": 1.0, **BOX, "y_lower": 0.0,
                                            "y_upper": 1.0, "seed": 0, **kw})


@functools.lru_cache(maxsize=None)
def _fitted(name):
  # A RuntimeError (not a ValueError/TypeError): a broken fit must fail the case, not pass it.
  try:
    return _fit(name)
  except Exception as err:  # pylint: disable=broad-except
    raise RuntimeError(f"fitting the {name} estimator for a predict case failed") from err


def _fit(name):
  if name == "nb":
    return _nb().fit(X, Y)
  if name == "trees":
    return _trees().fit(X, Y)
  if name == "kmeans":
    return _kmeans().fit(X)
  if name == "pca":
    return _pca().fit(X)
  return _linreg().fit(X, Y.astype(np.float64))


def _ci(x=X_CI, y=Y_PM, **kw):
  return confidence_intervals(KEY, x, y, **{"epsilon": 1.0, **kw})


def _ledger():
  acc = PrivacyAccountant()
  acc.spend(events.PureDpEvent(1.0, neighbouring="replace_one"))
  return acc


VOTES = np.array([Y, 1 - Y, Y])  # (M=3 parties, N=24 auxiliary rows)


def _vote_erm(votes=VOTES, x_aux=X, **kw):
  return multiparty.private_vote_erm(KEY, votes, x_aux,
                                     **{"num_classes": 2, "l2_reg": 0.1, "epsilon": 1.0, **kw})


def _soft_erm(votes=VOTES, x_aux=X, **kw):
  return multiparty.private_soft_label_erm(KEY, votes, x_aux,
                                           **{"num_classes": 2, "l2_reg": 0.1, "epsilon": 1.0,
                                              **kw})


@functools.lru_cache(maxsize=None)
def _ps_predictor():
  cal = calibrate_prediction_sensitivity(1.0, 1e-5, 10, 100, 0.1)
  return PredictionSensitivityPredictor(np.zeros((2, 3), np.float32), cal, key=KEY,
                                        unsafe_fixed_nonce=0)


CASES = [
    # jaxdp.classic estimators: fit
    ("nb_fit_nan_x", lambda: _nb().fit(_nan(X), Y), r"\bx\b"),
    ("nb_fit_1d_x", lambda: _nb().fit(X[:, 0], Y), r"\bx\b"),
    ("nb_fit_len_y", lambda: _nb().fit(X, Y[:-1]), r"\by\b"),
    ("nb_fit_string_x", lambda: _nb().fit(X.astype(str), Y), r"\bx\b"),
    ("nb_epsilon_nan", lambda: _nb(epsilon=float("nan")).fit(X, Y), r"epsilon"),
    ("nb_seed_float", lambda: _nb(seed=1.5).fit(X, Y), r"seed"),
    ("nb_y_outside_classes", lambda: _nb(classes=[1, 2]).fit(X, Y), r"\by\b.*classes"),
    ("nb_classes_string", lambda: _nb(classes="01").fit(X, Y), r"classes"),
    ("nb_no_bounds_no_categorical", lambda: _nb(lower=None).fit(X, Y), r"lower and upper"),
    ("trees_fit_inf_x", lambda: _trees().fit(_inf(X), Y), r"\bx\b"),
    ("trees_fit_complex_x", lambda: _trees().fit(X + 1j, Y), r"\bx\b"),
    ("trees_fit_len_y", lambda: _trees().fit(X, Y[:-1]), r"\by\b"),
    ("trees_epsilon_zero", lambda: _trees(epsilon=0.0).fit(X, Y), r"epsilon"),
    ("trees_y_outside_classes", lambda: _trees(classes=["a", "b"]).fit(X, Y), r"\by\b"),
    ("trees_one_class", lambda: _trees(classes=[0]).fit(X, Y), r"classes"),
    ("kmeans_fit_nan_x", lambda: _kmeans().fit(_nan(X)), r"\bx\b"),
    ("kmeans_fit_1d_x", lambda: _kmeans().fit(X[:, 0]), r"\bx\b"),
    ("kmeans_fit_empty_x", lambda: _kmeans().fit(np.zeros((0, 2))), r"\bx\b"),
    ("kmeans_epsilon_negative", lambda: _kmeans(epsilon=-1.0).fit(X), r"epsilon"),
    ("kmeans_accountant_string", lambda: _kmeans(accountant="acc").fit(X), r"accountant"),
    ("pca_fit_nan_x", lambda: _pca().fit(_nan(X)), r"\bx\b"),
    ("pca_fit_1d_x", lambda: _pca().fit(X[:, 0]), r"\bx\b"),
    ("pca_components_gt_dim", lambda: _pca(n_components=3).fit(X), r"n_components|num_components"),
    ("pca_seed_float", lambda: _pca(seed=1.5).fit(X), r"seed"),
    ("linreg_fit_nan_x", lambda: _linreg().fit(_nan(X), Y.astype(float)), r"\bx\b"),
    ("linreg_fit_nan_y", lambda: _linreg().fit(X, _nan(Y)), r"\by\b"),
    ("linreg_fit_len_y", lambda: _linreg().fit(X, Y[:-1].astype(float)), r"\by\b"),
    ("linreg_fit_string_x", lambda: _linreg().fit(X.astype(str), Y.astype(float)), r"\bx\b"),
    # jaxdp.classic estimators: predict with the wrong feature count / bad x
    ("nb_predict_3_features", lambda: _fitted("nb").predict(np.zeros((4, 3))), r"\bx\b"),
    ("trees_predict_3_features", lambda: _fitted("trees").predict(np.zeros((4, 3))), r"\bx\b"),
    ("kmeans_predict_3_features", lambda: _fitted("kmeans").predict(np.zeros((4, 3))), r"\bx\b"),
    ("kmeans_predict_nan_x", lambda: _fitted("kmeans").predict(_nan(X)), r"\bx\b"),
    ("pca_transform_3_features", lambda: _fitted("pca").transform(np.zeros((4, 3))), r"\bx\b"),
    ("linreg_predict_3_features", lambda: _fitted("linreg").predict(np.zeros((4, 3))), r"\bx\b"),
    ("linreg_predict_string_x", lambda: _fitted("linreg").predict(X.astype(str)), r"\bx\b"),
    # jaxdp.classic quantiles
    ("quantile_nan_x", lambda: classic.private_quantile(KEY, _nan(X[:, 0]), 0.5, lower=0.0,
                                                        upper=1.0, epsilon=1.0), r"\bx\b"),
    ("quantile_empty_x", lambda: classic.private_quantile(KEY, np.zeros(0), 0.5, lower=0.0,
                                                          upper=1.0, epsilon=1.0), r"\bx\b"),
    ("quantile_q_out_of_range", lambda: classic.private_quantile(
        KEY, X[:, 0], 1.5, lower=0.0, upper=1.0, epsilon=1.0), r"\bq\b"),
    ("quantile_key_none", lambda: classic.private_quantile(None, X[:, 0], 0.5, lower=0.0,
                                                           upper=1.0, epsilon=1.0), r"key"),
    ("bounds_epsilon_negative", lambda: classic.private_bounds(KEY, X, **BOX, epsilon=-1.0),
     r"epsilon"),
    ("bounds_1d_x", lambda: classic.private_bounds(KEY, X[:, 0], **BOX, epsilon=1.0), r"\bx\b"),
    # jaxdp.inference.confidence_intervals
    ("ci_empty_x", lambda: _ci(x=np.zeros((0, 3)), y=np.zeros(0)), r"\bx\b"),
    ("ci_nan_x", lambda: _ci(x=_nan(X_CI)), r"\bx\b"),
    ("ci_1d_x", lambda: _ci(x=X_CI[:, 0]), r"\bx\b"),
    ("ci_labels_not_binary", lambda: _ci(y=np.arange(24) % 3), r"\by\b"),
    ("ci_len_y", lambda: _ci(y=Y_PM[:-1]), r"\by\b"),
    ("ci_epsilon_negative", lambda: _ci(epsilon=-1.0), r"epsilon"),
    ("ci_epsilon_string", lambda: _ci(epsilon="1.0"), r"epsilon"),
    ("ci_rho_zero", lambda: confidence_intervals(KEY, X_CI, Y_PM, rho=0.0), r"\brho\b"),
    ("ci_epsilon_and_rho", lambda: _ci(rho=0.5), r"epsilon.*\brho\b"),
    ("ci_neither_epsilon_nor_rho", lambda: confidence_intervals(KEY, X_CI, Y_PM),
     r"epsilon.*\brho\b"),
    ("ci_key_none", lambda: confidence_intervals(None, X_CI, Y_PM, epsilon=1.0), r"key"),
    # jaxdp.multiparty
    ("vote_erm_nan_x_aux", lambda: _vote_erm(x_aux=_nan(X)), r"x_aux"),
    ("vote_erm_votes_out_of_classes", lambda: _vote_erm(votes=VOTES + 2), r"votes"),
    ("vote_erm_len_mismatch", lambda: _vote_erm(x_aux=X[:-1]), r"x_aux|votes"),
    ("vote_erm_epsilon_zero", lambda: _vote_erm(epsilon=0.0), r"epsilon"),
    ("soft_erm_1d_x_aux", lambda: _soft_erm(x_aux=X[:, 0]), r"x_aux"),
    ("soft_erm_accountant_string", lambda: _soft_erm(accountant="acc"), r"accountant"),
    ("split_parties_seed_float", lambda: multiparty.split_parties(
        1.5, X, Y, num_parties=2, samples_per_party=4), r"seed"),
    ("split_parties_len_y", lambda: multiparty.split_parties(
        0, X, Y[:-1], num_parties=2, samples_per_party=4), r"\by\b"),
    ("fit_local_nan_xs", lambda: multiparty.fit_local_classifiers(
        _nan(np.stack([X, X])), np.stack([Y, Y]), l2_reg=0.1), r"xs"),
    # jaxdp.mechanisms
    ("laplace_nan_value", lambda: mechanisms.laplace_mechanism(KEY, np.array([np.nan, 1.0]),
                                                               1.0, 1.0), r"value"),
    ("laplace_negative_sensitivity", lambda: mechanisms.laplace_mechanism(
        KEY, np.ones(2), -1.0, 1.0), r"sensitivity"),
    ("gaussian_key_none", lambda: mechanisms.gaussian_mechanism(None, np.ones(2), 1.0, 1.0, 1e-5),
     r"key"),
    ("gaussian_delta_one", lambda: mechanisms.gaussian_mechanism(KEY, np.ones(2), 1.0, 1.0, 1.0),
     r"delta"),
    # jaxdp.accounting (the shared ledger and DP-SGD's accounting)
    ("accountant_unknown_relation", lambda: PrivacyAccountant(neighbouring="both"),
     r"neighbouring"),
    ("accountant_spend_string", lambda: PrivacyAccountant().spend("gaussian"), r"event"),
    ("accountant_spend_count_zero", lambda: PrivacyAccountant().spend(
        events.PureDpEvent(1.0, neighbouring="replace_one"), count=0), r"count"),
    ("accountant_delta_above_one", lambda: _ledger().get_epsilon(1.5), r"delta"),
    ("accountant_unknown_method", lambda: _ledger().get_epsilon(1e-5, "magic"), r"method"),
    ("accountant_sampled_laplace_replace_one", lambda: PrivacyAccountant(
        neighbouring="replace_one").spend(events.PoissonSampledDpEvent(
            0.1, events.LaplaceDpEvent(1.0, neighbouring="replace_one"))), r"replace_one"),
    ("accountant_untagged_sampled_gaussian_replace_one", lambda: PrivacyAccountant(
        neighbouring="replace_one").spend(events.PoissonSampledDpEvent(
            0.1, dp_accounting.GaussianDpEvent(1.0))), r"replace_one"),
    ("replace_one_from_add_remove_negative", lambda: events.replace_one_from_add_remove(-1.0),
     r"epsilon"),
    ("dpsgd_epsilon_unknown_relation", lambda: dpsgd_accounting.dpsgd_epsilon(
        1.0, 0.1, 10, 1e-5, "pld", neighbouring="swap"), r"neighbouring"),
    ("dpsgd_epsilon_replace_one_rdp", lambda: dpsgd_accounting.dpsgd_epsilon(
        1.0, 0.1, 10, 1e-5, "rdp", neighbouring="replace_one"), r"accountant"),
    ("dpsgd_calibrate_delta_zero", lambda: dpsgd_accounting.calibrate_noise_multiplier(
        1.0, 0.0, 0.1, 10), r"delta"),
    ("dpsgd_calibrate_sample_rate_above_one", lambda: dpsgd_accounting.calibrate_noise_multiplier(
        1.0, 1e-5, 1.5, 10), r"sample_rate"),
    ("dpsgd_event_steps_float", lambda: dpsgd_accounting.dpsgd_event(1.0, 0.1, 2.5), r"steps"),
    ("linear_dpsgd_replace_one_rdp", lambda: dpsgd.linear_dpsgd(
        KEY, X, Y, num_classes=2, noise_multiplier=1.0, delta=1e-5,
        neighbouring="replace_one"), r"accountant"),
    ("linear_dpsgd_unknown_relation", lambda: dpsgd.linear_dpsgd(
        KEY, X, Y, num_classes=2, noise_multiplier=1.0, delta=1e-5, accountant="pld",
        neighbouring="swap"), r"neighbouring"),
    ("make_private_replace_one_rdp", lambda: dpsgd.make_private(
        lambda w, a, b: (a @ w - b) ** 2, l2_clip_norm=1.0, num_examples=24,
        expected_batch_size=4.0, noise_multiplier=1.0, delta=1e-5, steps=2, key=KEY,
        neighbouring="replace_one"), r"accountant"),
    # jaxdp.prediction predictors
    ("ps_predictor_3_features", lambda: _ps_predictor().predict(np.zeros((2, 3))), r"\bx\b"),
    ("ps_predictor_nan_x", lambda: _ps_predictor().predict(_nan(np.zeros((2, 2)))), r"\bx\b"),
    ("ps_predictor_string_x", lambda: _ps_predictor().predict(np.zeros((2, 2)).astype(str)),
     r"\bx\b"),
]

_JAXDP_DIR = os.path.dirname(os.path.abspath(__import__("jaxdp").__file__))


@pytest.mark.parametrize("call,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_by_jaxdp(call, pattern):
  with pytest.raises((ValueError, TypeError), match=pattern) as excinfo:
    call()
  last = os.path.abspath(str(excinfo.traceback[-1].path))
  assert last.startswith(_JAXDP_DIR) and "site-packages" not in last, (
      f"raised from {last}, not from inside jaxdp: {excinfo.value!r}")


def test_battery_is_large():
  assert len(CASES) >= 80
  assert len({c[0] for c in CASES}) == len(CASES)
