"""Release-level checks of the private confidence intervals, and the proof that they have power.

Each ``check_*`` function re-derives what paper 003 requires INDEPENDENTLY of the library's
calibration (numpy float64, the paper's formulas written out here) and compares it with what
the pipeline released; each ``test_power_*`` injects one defect (monkeypatch) and asserts that
the check fails, so the power of the checks is itself tested.

Checked (paper 003 = ../shared/papers/003_dp_confidence_intervals_for_erm.md):

* the noise of ``H~`` and ``Sigma~`` (Algorithm 2 line 5, zCDP: ``eta ~ N(0, Sens^2/(2 phi) I)``
  in ``R^{d^2}``; Lemma 3: ``Sens(H) = 1/(2n)``; Lemma 2: ``Sens(Sigma) = 2 S(||theta~||)^2 / n``
  evaluated at the RELEASED ``theta~``, at which ``Sigma`` is computed, Alg. 5 lines 4-5),
  observed as ``M~ - M(theta~)`` over many keys (the floors of Alg. 2 do not bind in this
  configuration, asserted), standardised by the paper's scale: the mean square of the
  standardised entries must be 1 within 4 standard errors (a 20% error in a scale is a 36%
  (or, for a ``phi`` scaled by 1/0.8, a 20%) error in the variance: caught);
* independence of the two noises (Algorithm 2 run twice with fresh randomness): the
  correlation of the standardised ``H~`` and ``Sigma~`` noises must be 0 within 4 standard
  errors (a reused key makes it 1);
* the charge: ``M`` keys are ``M`` releases of Theorem 4's event, ``phi_1 + phi_2 + phi_3``
  with the split written out here.
"""

import math

import jax
import numpy as np
import pytest

from jaxdp.accounting import PrivacyAccountant, events
from jaxdp.inference import intervals as ci
from jaxdp.inference import sensitivities as sens

N, D = 40, 3
L2_REG = 0.02
# zCDP parameters (rho_1, rho_2, rho_3) of theta~, H~, Sigma~: theta~ noisy (so that ||theta~|| is far from the
# non-private minimiser's norm and Lemma 2 at the wrong point is visible), the matrices
# nearly exact (so that no eigenvalue floor of Algorithm 2 binds and M~ - M(theta~) is the
# symmetrised noise itself).
RHOS = (1.4, 20.0, 20.0)
RHO = sum(RHOS)  # the total rho= of each interval
FRACTIONS = tuple(r / RHO for r in RHOS)
NUM_KEYS = 400  # 6 standardised entries per matrix and key: 2,400; s.e. of the mean square 0.029


def _data():
  """Rows on the unit sphere (the boundary of Lemmas 2-5) and balanced +-1 labels."""
  rng = np.random.default_rng(7)
  x = rng.normal(size=(N, D))
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  y = np.where(np.arange(N) % 2 == 0, 1.0, -1.0)
  return x, y


def _sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


def _paper_matrices(theta, x, y, lam):
  """Eq. 4.2 and Eq. 4.3 at ``theta`` (logistic, numpy float64): ``(H, Sigma)``."""
  z = y * (x @ theta)
  d2 = _sigmoid(z) * _sigmoid(-z)
  d1sq = _sigmoid(-z) ** 2
  n = len(y)
  hess = (x * d2[:, None]).T @ x / n + lam * np.eye(x.shape[1])
  cov = (x * d1sq[:, None]).T @ x / n - lam ** 2 * np.outer(theta, theta)
  return hess, cov


def _paper_sigmas(theta, n, rho_h, rho_s):
  """Algorithm 2 (zCDP) per-entry std of eta for H (Lemma 3) and Sigma (Lemma 2 at theta)."""
  sens_h = 1.0 / (2.0 * n)
  sens_s = 2.0 * _sigmoid(np.linalg.norm(theta)) ** 2 / n
  return sens_h / math.sqrt(2.0 * rho_h), sens_s / math.sqrt(2.0 * rho_s)


def _standardised(sym_noise, sigma):
  """The ``d(d+1)/2`` independent N(0, 1) coordinates of ``(eta + eta^T)/2`` over sigma."""
  d = sym_noise.shape[0]
  iu = np.triu_indices(d, 1)
  return np.concatenate([np.diag(sym_noise), math.sqrt(2.0) * sym_noise[iu]]) / sigma


def run_release(num_keys=NUM_KEYS, accountant=None, seed=0):
  x, y = _data()
  keys = jax.random.split(jax.random.key(seed), num_keys)
  out, cal = ci.confidence_intervals_batched(
      keys, x, y, rho=RHO, fractions=FRACTIONS, perturbation="output", l2_reg=L2_REG,
      floor="psd", accountant=accountant)
  return out, cal


def noise_samples(out):
  """``(z_H, z_Sigma)``: standardised noises of every key, shape ``(M, d(d+1)/2)`` each."""
  x, y = _data()
  rho_h, rho_s = RHOS[1], RHOS[2]
  z_h, z_s = [], []
  for theta, h_rel, s_rel in zip(out.theta, out.hessian, out.covariance):
    hess, cov = _paper_matrices(np.asarray(theta, np.float64), x, y, L2_REG)
    # The floors of Algorithm 2 (Lambda for H~, 0 for Sigma~ with floor="psd") must not bind,
    # or M~ - M would not be the noise.
    assert np.linalg.eigvalsh(h_rel).min() > L2_REG + 1e-9, "H~ floor binds: reconfigure"
    assert np.linalg.eigvalsh(s_rel).min() > 1e-9, "Sigma~ floor binds: reconfigure"
    sig_h, sig_s = _paper_sigmas(theta, N, rho_h, rho_s)
    z_h.append(_standardised(np.asarray(h_rel) - hess, sig_h))
    z_s.append(_standardised(np.asarray(s_rel) - cov, sig_s))
  return np.array(z_h), np.array(z_s)


def check_noise_scale(z, what):
  """Mean square of N(0, 1) draws is 1 +- 4 s.e. (s.e. = sqrt(2/K) for K draws)."""
  k = z.size
  ms = float(np.mean(z * z))
  assert abs(ms - 1.0) <= 4.0 * math.sqrt(2.0 / k), (
      f"{what}: noise variance / paper's variance = {ms:.3f}, outside 1 +- "
      f"{4.0 * math.sqrt(2.0 / k):.3f}")


def check_noises_independent(z_h, z_s):
  """Pearson correlation of the paired standardised entries is 0 +- 4/sqrt(K)."""
  a, b = z_h.ravel(), z_s.ravel()
  corr = float(np.corrcoef(a, b)[0, 1])
  assert abs(corr) <= 4.0 / math.sqrt(a.size), f"H~ and Sigma~ noises correlate: {corr:.3f}"


def check_release_noises(out):
  z_h, z_s = noise_samples(out)
  check_noise_scale(z_h, "H~ (Lemma 3)")
  check_noise_scale(z_s, "Sigma~ (Lemma 2 at theta~)")
  check_noises_independent(z_h, z_s)


def check_charge(accountant, num_keys):
  """The ledger holds ``M`` releases of (phi_1, phi_2, phi_3)-zCDP (Theorem 4), replace-one."""
  total = sum(count for _, count in accountant.ledger)
  assert total == num_keys, f"{num_keys} intervals released, {total} charged"
  assert accountant.zcdp_rho() == pytest.approx(num_keys * RHO, rel=1e-9)
  for event, _ in accountant.ledger:
    assert all(isinstance(e, events.ZCDpEvent) and e.neighbouring == "replace_one"
               for e in event.events), f"not Theorem 4's zCDP leaves: {event}"
    np.testing.assert_allclose([e.rho for e in event.events], RHOS, rtol=1e-12)


@pytest.fixture(scope="module")
def correct_release():
  acc = PrivacyAccountant()
  out, _ = run_release(accountant=acc)
  return out, acc


def test_noise_scales_and_independence_follow_algorithm_2(correct_release):
  check_release_noises(correct_release[0])


def test_batched_charge_is_one_event_per_key(correct_release):
  check_charge(correct_release[1], NUM_KEYS)


# -- power: each injected defect makes a check fail --------------------------------------------


@pytest.fixture
def retrace(correct_release):
  """Injected defects live in functions traced into the jitted stages: retrace before and
  after (so that no defective program stays cached for the other tests)."""
  jits = (ci._pipeline_jit, ci._intervals_jit, ci._warm_start_jit)
  for f in jits:
    f.clear_cache()
  yield
  for f in jits:
    f.clear_cache()


@pytest.mark.slow  # a retrace of the pipeline (~20 s of compile on a busy CPU)
def test_power_covariance_sensitivity_scaled_by_0_8(monkeypatch, retrace):
  orig = sens.covariance_sensitivity
  monkeypatch.setattr(sens, "covariance_sensitivity", lambda *a, **k: 0.8 * orig(*a, **k))
  out, _ = run_release()
  with pytest.raises(AssertionError, match="Sigma~"):
    check_release_noises(out)


@pytest.mark.slow  # a retrace of the pipeline (~20 s of compile on a busy CPU)
def test_power_lemma_2_at_the_nonprivate_minimiser(monkeypatch, retrace):
  x, y = _data()
  theta_hat = ci.confidence_intervals(jax.random.key(1), x, y, rho=math.inf,
                                      perturbation="output", l2_reg=L2_REG)[0].theta
  norm_hat = float(np.linalg.norm(theta_hat))
  orig = sens.covariance_sensitivity
  monkeypatch.setattr(sens, "covariance_sensitivity",
                      lambda loss, n, theta_norm, h=0.5: orig(loss, n, 0.0 * theta_norm + norm_hat,
                                                              h))
  out, _ = run_release()
  with pytest.raises(AssertionError, match="Sigma~"):
    check_release_noises(out)


@pytest.mark.slow  # a retrace of the pipeline (~20 s of compile on a busy CPU)
def test_power_one_key_for_both_matrices(monkeypatch, retrace):
  orig = ci._stage_keys

  def reused(key):
    k = orig(key)
    return jax.numpy.stack([k[0], k[1], k[2], k[2], k[4]])  # Sigma~ drawn with H~'s key

  monkeypatch.setattr(ci, "_stage_keys", reused)
  out, _ = run_release()
  with pytest.raises(AssertionError, match="correlate"):
    check_release_noises(out)


def test_power_covariance_phi_over_0_8(monkeypatch):
  # No retrace needed: phi_2 and phi_3 are runtime inputs of the compiled stages.
  orig = ci._params
  phi3 = ci._PARAM_NAMES.index("phi3")

  def params(cal):
    p = orig(cal)
    p[phi3] = p[phi3] / 0.8  # noise for phi3/0.8, while cal.event still charges phi3
    return p

  monkeypatch.setattr(ci, "_params", params)
  out, _ = run_release()
  with pytest.raises(AssertionError, match="Sigma~"):
    check_release_noises(out)


def test_power_batched_call_charging_one_event(monkeypatch):
  monkeypatch.setattr(ci, "_releases", lambda keys, batched: 1)
  acc = PrivacyAccountant()
  run_release(accountant=acc)  # the compiled shape of the fixture: no new compile
  with pytest.raises(AssertionError, match="charged"):
    check_charge(acc, NUM_KEYS)
