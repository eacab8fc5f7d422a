"""Tests of jaxdp.prediction.prediction_sensitivity (paper 000 Algorithms 6 and 7)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.accounting import analytic_gaussian
from jaxdp.accounting import events
from jaxdp.accounting.accountant import PrivacyAccountant, PrivacyBudget
from jaxdp.prediction import prediction_sensitivity as ps

N, LAM, K = 1000, 1e-2, math.sqrt(2.0)


def test_logit_sensitivity_and_laplace_beta_match_formulas():
  assert ps.logit_sensitivity(N, LAM) == pytest.approx(2 * K / (N * LAM), rel=1e-15)
  assert ps.logit_sensitivity(N, LAM, lipschitz=1.0) == pytest.approx(2 / (N * LAM), rel=1e-15)
  # Algorithm 6: beta = N lambda eps / (2 K B).
  beta = ps.l2_laplace_prediction_beta(0.5, 20, N, LAM)
  assert beta == pytest.approx(N * LAM * 0.5 / (2 * K * 20), rel=1e-14)
  cal = ps.calibrate_prediction_sensitivity(0.5, 0.0, 20, N, LAM)
  assert cal.noise == "l2_laplace" and cal.scale == pytest.approx(beta, rel=1e-15)
  # One query is (beta * Delta) = eps/B pure DP.
  assert isinstance(cal.query_event(), events.PureDpEvent)
  assert cal.query_event().epsilon == pytest.approx(0.5 / 20, rel=1e-12)


@pytest.mark.parametrize("budget", [1, 10, 200])
def test_gaussian_sigma_methods_match_formulas(budget):
  eps, delta = 1.0, 1e-5
  sens = ps.logit_sensitivity(N, LAM)
  basic = ps.gaussian_prediction_sigma(eps, delta, budget, N, LAM, method="basic")
  adv = ps.gaussian_prediction_sigma(eps, delta, budget, N, LAM, method="advanced")
  best = ps.gaussian_prediction_sigma(eps, delta, budget, N, LAM, method="best")
  exact = ps.gaussian_prediction_sigma(eps, delta, budget, N, LAM,
                                       method="exact_gaussian_composition")
  # sigma' = analytic Gaussian at (eps/B, delta/B) (Algorithm 7, first line).
  assert basic == pytest.approx(
      analytic_gaussian.analytic_gaussian_sigma(eps / budget, delta / budget, sens), rel=1e-12)
  assert best == pytest.approx(min(basic, adv), rel=1e-12)
  # B Gaussian queries = one Gaussian of sensitivity Delta sqrt(B) (GDP composition).
  assert exact == pytest.approx(
      analytic_gaussian.analytic_gaussian_sigma(eps, delta, sens * math.sqrt(budget)), rel=1e-12)
  assert exact <= best * (1 + 1e-12)
  if budget > 1:
    assert exact < 0.9 * best  # strictly tighter than the paper's composition


@pytest.mark.parametrize("method", ["basic", "advanced", "best", "exact_gaussian_composition"])
def test_gaussian_sigma_gives_eps_delta_over_budget_through_accountant(method):
  eps, delta, budget = 1.0, 1e-5, 50
  cal = ps.calibrate_prediction_sensitivity(eps, delta, budget, N, LAM, method=method)
  assert cal.noise == "gaussian"
  acc = PrivacyAccountant()
  acc.spend(cal.query_event(), budget)
  eps_pld = acc.get_epsilon(delta, method="pld")
  # PLD is a (pessimistic) discretised bound: allow its discretisation slack.
  assert eps_pld <= eps * (1 + 1e-3)
  # Exact check of the composed Gaussian: delta(eps) of the sqrt(B)-sensitivity mechanism.
  composed_delta = analytic_gaussian.analytic_gaussian_delta(
      cal.scale, eps, cal.sensitivity * math.sqrt(budget))
  assert composed_delta <= delta * (1 + 1e-6)
  if method == "exact_gaussian_composition":
    # Tight: the accountant spends (almost) all of eps, and 2% less noise breaks it.
    assert eps_pld >= eps * 0.98
    assert analytic_gaussian.analytic_gaussian_delta(
        0.98 * cal.scale, eps, cal.sensitivity * math.sqrt(budget)) > delta
  # The shared budget accepts the B queries.
  PrivacyBudget(eps, delta).spend(cal.query_event(), budget)


def test_noisy_logits_noise_scales():
  m, c = 2000, 5
  logits = jnp.zeros((m, c))
  beta = 2.0
  lap = ps.noisy_logits(jax.random.key(0), logits, "l2_laplace", beta)
  # ||b|| ~ Gamma(C, 1/beta): mean C/beta, sd sqrt(C)/beta.
  norms = np.linalg.norm(np.asarray(lap), axis=1)
  se = math.sqrt(c) / beta / math.sqrt(m)
  assert abs(norms.mean() - c / beta) < 4 * se
  sigma = 0.7
  gau = np.asarray(ps.noisy_logits(jax.random.key(1), logits, "gaussian", sigma))
  assert abs(gau.std() - sigma) < 4 * sigma / math.sqrt(2 * m * c)
  assert abs(gau.mean()) < 4 * sigma / math.sqrt(m * c)
  # Each query gets its own noise: identical rows get different answers.
  assert not np.allclose(np.asarray(lap[0]), np.asarray(lap[1]))
  # Same key -> same result.
  np.testing.assert_array_equal(
      np.asarray(ps.noisy_logits(jax.random.key(1), logits, "gaussian", sigma)), gau)


@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=-1.0), "epsilon"),
    (dict(delta=1.0), "delta"),
    (dict(budget=0), "budget"),
    (dict(num_examples=0), "num_examples"),
    (dict(l2_reg=0.0), "l2_reg"),
    (dict(method="nope"), "method"),
])
def test_bad_arguments_raise(kwargs, match):
  args = dict(epsilon=1.0, delta=1e-5, budget=10, num_examples=N, l2_reg=LAM, method="best")
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    ps.gaussian_prediction_sigma(**args)


def test_noisy_logits_rejects_bad_noise_and_shape():
  with pytest.raises(ValueError, match="noise"):
    ps.noisy_logits(jax.random.key(0), jnp.zeros((2, 3)), "cauchy", 1.0)
  with pytest.raises(ValueError, match="logits"):
    ps.noisy_logits(jax.random.key(0), jnp.zeros((3,)), "gaussian", 1.0)


@pytest.mark.parametrize("noise,scale", [("gaussian", 0.0), ("l2_laplace", math.inf),
                                         ("gaussian", -1.0), ("l2_laplace", math.nan)])
def test_noisy_logits_refuses_scales_that_mean_no_noise(noise, scale):
  # The raw samplers accept sigma = 0 / beta = inf (non-private baselines); a private
  # prediction must not silently release the exact logits.
  with pytest.raises(ValueError, match="scale"):
    ps.noisy_logits(jax.random.key(0), jnp.zeros((2, 3)), noise, scale)


def test_solver_tolerance_enters_the_sensitivity():
  from jaxdp.prediction import logit_sensitivity, calibrate_prediction_sensitivity
  n, lam, tol = 500, 0.01, 1e-4
  exact = 2 * np.sqrt(2) / (n * lam)
  assert logit_sensitivity(n, lam) == pytest.approx(exact)
  assert logit_sensitivity(n, lam, solver_tol=tol) == pytest.approx(exact + 2 * tol / lam)
  cal0 = calibrate_prediction_sensitivity(1.0, 0.0, 10, n, lam)
  cal1 = calibrate_prediction_sensitivity(1.0, 0.0, 10, n, lam, solver_tol=tol)
  assert cal1.scale == pytest.approx(1.0 / (10 * (exact + 2 * tol / lam)))
  assert cal1.scale < cal0.scale  # smaller beta = more noise
  g0 = calibrate_prediction_sensitivity(1.0, 1e-5, 10, n, lam)
  g1 = calibrate_prediction_sensitivity(1.0, 1e-5, 10, n, lam, solver_tol=tol)
  assert g1.scale == pytest.approx(g0.scale * (exact + 2 * tol / lam) / exact, rel=1e-6)
  with pytest.raises(ValueError, match="solver_tol"):
    logit_sensitivity(n, lam, solver_tol=-1.0)


def test_predictor_from_linear_model_certifies_and_never_refuses():
  """The calibration uses the FIXED tol (data-independent), not the achieved gradient norm,
  and an unconverged fit is certified/repaired instead of refused (a data-dependent refusal)."""
  import jax
  from jaxdp.prediction import PredictionSensitivityPredictor
  from jaxdp.training import certified_solve, fit_linear
  rng = np.random.default_rng(0)
  x = rng.normal(size=(200, 4))
  x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
  y = rng.integers(0, 3, 200).astype(np.int32)
  tol = 1e-5
  expected = 2 * np.sqrt(2) / (200 * 0.05) + 2 * (tol + 2.0 ** -24 * (np.sqrt(2) + tol)) / 0.05
  for max_iter in (500, 1):
    model = fit_linear(x, y, num_classes=3, l2_reg=0.05, tol=tol, max_iter=max_iter)
    pred = PredictionSensitivityPredictor.from_linear_model(
        model, x=x, y=y, l2_reg=0.05, epsilon=1.0, delta=0.0, budget=5, tol=tol,
        key=jax.random.key(0))
    assert pred.calibration.sensitivity == pytest.approx(expected, rel=1e-12)
    w = np.asarray(pred.weights, np.float64)  # float32 rounding of the certified point
    _, g = certified_solve.objective_and_grad(w, x.astype(np.float64), y, loss="softmax", h=0.5,
                                              l2_total=0.05)
    assert np.linalg.norm(g) <= tol + 0.55 * 2.0 ** -24 * np.linalg.norm(w)


