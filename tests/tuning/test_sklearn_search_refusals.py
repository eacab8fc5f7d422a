"""Plain scikit-learn search over jaxdp estimators, tried as a new user would.

* a budget refusal inside ``GridSearchCV``/``cross_val_score`` ends the search
  (:class:`jaxdp.errors.BudgetExhausted`, a ``BaseException`` that
  ``error_score`` cannot swallow), and stays a ``BudgetExceededError`` outside;
* ``n_jobs=2`` with an accountant fails with jaxdp's reason, not joblib's
  "Could not pickle the task", before any fit;
* an explicit ``seed`` under cross-validation warns (every clone reuses one key).
"""

import warnings

import numpy as np
import pytest
from sklearn.model_selection import GridSearchCV, cross_val_score

from jaxdp.accounting import PrivacyAccountant, PrivacyBudget
from jaxdp.classic import PrivateLinearRegression
from jaxdp.errors import BudgetExceededError, BudgetExhausted
from jaxdp.training import PrivateLogisticRegression

_RNG = np.random.default_rng(0)
X = _RNG.normal(size=(60, 3))
X /= np.linalg.norm(X, axis=1, keepdims=True)
Y = (X[:, 0] > 0).astype(int)
KW = dict(epsilon=1.0, method="model_sensitivity", l2_reg=0.1, classes=[0, 1])


YR = np.clip(X @ np.array([1.0, -0.5, 0.2]), -1.0, 1.0)


def _linear_regression(**kw):  # a classic model: its spend goes through classic._common.spend
  return PrivateLinearRegression(epsilon=1.0, lower=-1.0, upper=1.0, y_lower=-1.0, y_upper=1.0,
                                 **kw)


@pytest.mark.parametrize("make, grid", [
    (lambda **kw: PrivateLogisticRegression(**KW, **kw), {"l2_reg": [0.1, 1.0]}),
    (_linear_regression, {"l2_reg": [0.0, 0.1]})], ids=["logistic_regression",
                                                         "linear_regression"])
@pytest.mark.parametrize("error_score", [np.nan, "raise"])
def test_a_budget_refusal_ends_grid_search(make, grid, error_score):
  budget = PrivacyBudget(epsilon=3.0)  # 3 fits of epsilon 1; the grid asks for 2 x 2 + 1
  search = GridSearchCV(make(accountant=budget), grid, cv=2, error_score=error_score)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no FitFailedWarning: the search does not go on
    with pytest.raises(BudgetExhausted, match="stopped") as info:
      search.fit(X, YR if grid.get("l2_reg") == [0.0, 0.1] else Y)
  assert not isinstance(info.value, Exception)  # what error_score cannot catch
  assert isinstance(info.value.error, BudgetExceededError)
  assert info.value.__cause__ is info.value.error
  assert budget.spent_epsilon == pytest.approx(3.0)  # the refused fit spent nothing
  assert not hasattr(search, "best_params_")  # no "best" among the affordable fits


def test_a_budget_refusal_ends_cross_val_score_and_is_unchanged_outside():
  budget = PrivacyBudget(epsilon=1.0)
  with pytest.raises(BudgetExhausted):
    cross_val_score(PrivateLogisticRegression(accountant=budget, **KW), X, Y, cv=3)
  assert budget.spent_epsilon == pytest.approx(1.0)
  # A plain fit still raises the BudgetExceededError users catch today (both code paths).
  with pytest.raises(BudgetExceededError):
    PrivateLogisticRegression(accountant=budget, **KW).fit(X, Y)
  with pytest.raises(BudgetExceededError):
    _linear_regression(accountant=budget).fit(X, YR)


def test_n_jobs_2_with_an_accountant_says_why_before_any_fit():
  acc = PrivacyAccountant()
  with pytest.raises(TypeError, match=r"n_jobs=2.*holds an accountant.*n_jobs=1") as info:
    GridSearchCV(PrivateLogisticRegression(accountant=acc, **KW), {"l2_reg": [0.1, 1.0]}, cv=2,
                 n_jobs=2).fit(X, Y)
  assert "pickle the task" not in str(info.value)
  assert acc.ledger == ()  # refused at the clone, in this process: nothing fitted or spent


def test_threads_share_the_ledger_and_pass():
  import joblib  # pylint: disable=import-outside-toplevel
  acc = PrivacyAccountant()
  with joblib.parallel_backend("threading", n_jobs=2):
    cross_val_score(PrivateLogisticRegression(accountant=acc, **KW), X, Y, cv=2, n_jobs=2)
  assert sum(count for _, count in acc.ledger) == 2


def test_an_explicit_seed_under_cross_validation_warns():
  with pytest.warns(UserWarning, match="SAME noise"):
    cross_val_score(PrivateLogisticRegression(seed=0, **KW), X, Y, cv=2)
  with pytest.warns(UserWarning, match="SAME noise"):  # classic estimators: the same key rule
    cross_val_score(_linear_regression(seed=0), X, YR, cv=2)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    cross_val_score(PrivateLogisticRegression(**KW), X, Y, cv=2)  # seed=None: fresh keys
    PrivateLogisticRegression(seed=0, **KW).fit(X, Y)  # a seeded fit outside: no warning
