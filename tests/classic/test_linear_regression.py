"""Private linear regression (jaxdp.classic.linear_regression) over the functional mechanism."""

import jax
import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from jaxdp.accounting import PrivacyAccountant
from jaxdp.classic import linear_regression as lr
from jaxdp.training import functional_mechanism as fm


def _data(n=3000, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.uniform([0, -5, 10], [1, 5, 20], size=(n, 3))
  y = np.clip(2.0 * x[:, 0] - 0.3 * x[:, 1] + 0.1 * x[:, 2] + 3 + 0.1 * rng.normal(size=n), 0, 10)
  return x, y


def test_eps_inf_reproduces_sklearn_ols_with_intercept():
  x, y = _data()
  est = lr.PrivateLinearRegression(epsilon=np.inf, lower=[0, -5, 10], upper=[1, 5, 20],
                                   y_lower=0, y_upper=10).fit(x, y)
  ref = LinearRegression().fit(x, y)
  np.testing.assert_allclose(est.coef_, ref.coef_, rtol=2e-3, atol=2e-3)
  np.testing.assert_allclose(est.intercept_, ref.intercept_, atol=2e-2)
  assert est.score(x, y) == pytest.approx(ref.score(x, y), abs=1e-4)


def test_event_is_the_functional_mechanism_on_d_plus_1_features():
  x, y = _data(20000)
  acc = PrivacyAccountant()
  est = lr.PrivateLinearRegression(epsilon=5.0, lower=[0, -5, 10], upper=[1, 5, 20], y_lower=0,
                                   y_upper=10, l2_reg=1e-3, accountant=acc, seed=0).fit(x, y)
  assert acc.pure_epsilon() == pytest.approx(5.0)
  assert acc.neighbouring == "replace_one"
  assert fm.functional_mechanism_sensitivity("linear", 4) == pytest.approx(2 * (2 * 2 + 4))
  assert est.score(x, y) > 0.5


def test_bounds_required_and_enforced():
  x, y = _data(100)
  with pytest.raises(ValueError, match="bounds are required"):
    lr.private_linear_regression(jax.random.key(0), x, y, epsilon=1.0, lower=[0, -5, 10],
                                 upper=[1, 5, 20], y_lower=None, y_upper=10)
  with pytest.raises(ValueError, match="outside the declared bounds"):
    lr.private_linear_regression(jax.random.key(0), x, y, epsilon=1.0, lower=[0, -5, 10],
                                 upper=[1, 5, 20], y_lower=0, y_upper=5)
