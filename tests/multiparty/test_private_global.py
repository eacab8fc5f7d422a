"""Tests of jaxdp.multiparty.private_global (paper 001 Algorithms 1/2, Theorems 1/3, Sec. 4.5)."""

import itertools
import math

import jax
import numpy as np
import pytest

from jaxdp import audit
from jaxdp.accounting import PrivacyAccountant, analytic_gaussian_sigma, events
from jaxdp.multiparty import _soft_erm, aggregation, private_global as pg

TIGHT = 1e-7  # certified gradient norm of the brute-force minimisers


def _aligned_aux(n, d, seed=0):
  """Auxiliary rows close to one direction: the per-sample gradient changes add up (worst case)."""
  rng = np.random.default_rng(seed)
  u = np.zeros(d)
  u[0] = 1.0
  x = u + 0.05 * rng.normal(size=(n, d))
  return (x / np.linalg.norm(x, axis=1, keepdims=True) * 0.999).astype(np.float32)


def _minimizer(votes, x, c, lam, method):
  cert, _ = pg.global_minimizer(votes, x, num_classes=c, l2_reg=lam, method=method, tol=TIGHT)
  assert cert.distance <= TIGHT / lam
  return cert.weights


def _worst_pair(others, x, c, lam, method):
  """Max ||w(D) - w(D')|| over every vote row of party 0 (brute force), and the argmax pair."""
  n = x.shape[0]
  sols, rows = [], []
  for row in itertools.product(range(c), repeat=n):
    votes = np.vstack([np.array(row)[None], others])
    sols.append(_minimizer(votes, x, c, lam, method))
    rows.append(votes)
  flat = np.stack([s.reshape(-1) for s in sols])
  dist = np.linalg.norm(flat[:, None] - flat[None], axis=-1)
  i, j = np.unravel_index(np.argmax(dist), dist.shape)
  return dist[i, j], rows[i], rows[j]


# ---------------------------------------------------------------- closed forms


@pytest.mark.parametrize("lam,m", [(1e-4, 20000), (0.5, 3), (1e-2, 1000)])
def test_sensitivities_match_the_theorems(lam, m):
  # Soft labels are float64 fl(k/M): one entry moves by r = 1/M + 2^-52 (aggregation docstring).
  r = 1 / m + 2.0**-52
  assert pg.vote_sensitivity(lam, num_classes=2) == pytest.approx(2 / lam, rel=1e-14)  # Eq. 28
  assert pg.vote_sensitivity(lam, num_classes=6) == pytest.approx(math.sqrt(2) / lam, rel=1e-14)
  assert pg.soft_label_sensitivity(lam, num_parties=m, num_classes=2) == pytest.approx(
      2 * r / lam, rel=1e-14)  # Theorem 3
  assert pg.soft_label_sensitivity(lam, num_parties=m, num_classes=6) == pytest.approx(
      math.sqrt(2) * r / lam, rel=1e-14)  # Eq. 60
  # Section 4.5: ((N-1) 2r + 2)/(N lambda) = (2/(M lambda)) (N + M - 1)/N at r = 1/M.
  n = 43000
  assert pg.soft_label_sensitivity(lam, num_parties=m, num_classes=2, num_aux=n,
                                   protect_auxiliary=True) == pytest.approx(
      ((n - 1) * 2 * r + 2) / (n * lam), rel=1e-14)
  assert ((n - 1) * 2 / m + 2) / n == pytest.approx(2 / m * (n + m - 1) / n, rel=1e-14)
  assert pg.vote_sensitivity(lam, num_classes=2, num_aux=n, protect_auxiliary=True) == 2 / lam
  # Multiclass counterparts (module docstring): the changed row costs 2 sqrt(2).
  assert pg.soft_label_sensitivity(lam, num_parties=m, num_classes=3, num_aux=n,
                                   protect_auxiliary=True) == pytest.approx(
      ((n - 1) * math.sqrt(2) * r + 2 * math.sqrt(2)) / (n * lam), rel=1e-14)
  assert pg.vote_sensitivity(lam, num_classes=3, num_aux=n, protect_auxiliary=True) == \
      pytest.approx(math.sqrt(2) * (n + 1) / (n * lam), rel=1e-14)
  # Inexact minimiser: + 2 tol / lambda.
  assert pg.soft_label_sensitivity(lam, num_parties=m, num_classes=2, solver_tol=1e-6) == \
      pytest.approx(2 * r / lam + 2e-6 / lam, rel=1e-14)


def test_calibration_noise_scales_and_events():
  sens = 0.37
  cal = pg.party_calibration(sens, epsilon=0.5)
  assert cal.noise == "l2_laplace" and cal.scale == pytest.approx(0.5 / sens)  # p ∝ exp(-eps|z|/S)
  assert cal.event == events.PureDpEvent(0.5, neighbouring="replace_one", unit="party")
  cal = pg.party_calibration(sens, epsilon=1.0, delta=1e-5)
  assert cal.scale == pytest.approx(float(analytic_gaussian_sigma(1.0, 1e-5, sens)), rel=1e-12)
  assert cal.event.noise_multiplier == pytest.approx(cal.scale / sens)
  assert events.leaf_tags(cal.event) == {("replace_one", "party")}
  cal = pg.party_calibration(sens, rho=0.2)
  assert cal.scale == pytest.approx(sens / math.sqrt(0.4))
  assert cal.event == events.ZCDpEvent(0.2, neighbouring="replace_one", unit="party")
  assert pg.party_calibration(sens, epsilon=math.inf).noise == "none"


@pytest.mark.parametrize("kwargs,match", [
    (dict(epsilon=0.0), "epsilon"), (dict(epsilon=-1.0), "epsilon"),
    (dict(epsilon=1.0, delta=1.0), "delta"), (dict(epsilon=1.0, delta=-0.1), "delta"),
    (dict(), "exactly one"), (dict(epsilon=1.0, rho=1.0), "exactly one"),
])
def test_bad_privacy_parameters_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    pg.party_calibration(1.0, **kwargs)


def test_bad_inputs_raise():
  x = _aligned_aux(5, 2)
  votes = np.zeros((3, 5), np.int32)
  key = jax.random.key(0)
  with pytest.raises(ValueError, match="l2_reg"):
    pg.soft_label_sensitivity(0.0, num_parties=3, num_classes=2)
  with pytest.raises(ValueError, match="num_parties"):
    pg.soft_label_sensitivity(1.0, num_parties=0, num_classes=2)
  with pytest.raises(ValueError, match="num_aux"):
    pg.soft_label_sensitivity(1.0, num_parties=3, num_classes=2, protect_auxiliary=True)
  with pytest.raises(ValueError, match="l2_reg"):
    pg.private_soft_label_erm(key, votes, x, num_classes=2, l2_reg=0.0, epsilon=1.0)
  with pytest.raises(ValueError, match="x_aux"):
    pg.private_soft_label_erm(key, votes, 2 * x, num_classes=2, l2_reg=1.0, epsilon=1.0)
  bad = x.copy()
  bad[0, 0] = np.nan
  with pytest.raises(ValueError, match="x_aux"):
    pg.private_soft_label_erm(key, votes, bad, num_classes=2, l2_reg=1.0, epsilon=1.0)
  with pytest.raises(ValueError, match=r"votes\[0, 0\] \(party 0"):
    pg.private_soft_label_erm(key, votes + 2, x, num_classes=2, l2_reg=1.0, epsilon=1.0)
  with pytest.raises(ValueError, match="columns"):
    pg.private_vote_erm(key, votes[:, :4], x, num_classes=2, l2_reg=1.0, epsilon=1.0)
  with pytest.raises(TypeError, match="key"):
    pg.private_vote_erm(0, votes, x, num_classes=2, l2_reg=1.0, epsilon=1.0)


# ---------------------------------------------------------------- brute force


# Always on: one binary and one multiclass case, one of each method; the other two
# under ``slow`` (each brute-forces every vote row of the deciding party).
@pytest.mark.parametrize("c,method,n,lam,min_ratio", [
    (2, "soft", 6, 1.0, 0.35),   # logistic: l'(t)+l'(-t) = -1, so the paper's 2/M is 2x loose
    pytest.param(3, "soft", 4, 1.0, 0.5, marks=pytest.mark.slow),  # sqrt(2)/(M lambda) nearly attained
    pytest.param(2, "vote", 6, 1.0, 0.35, marks=pytest.mark.slow),
    (3, "vote", 4, 1.0, 0.5),
])
def test_one_party_moves_the_minimiser_by_at_most_the_bound(c, method, n, lam, min_ratio):
  m = 3
  x = _aligned_aux(n, 2)
  # Parties 1 and 2 tie (binary) or disagree (multiclass): party 0 decides every majority label.
  others = np.stack([np.zeros(n, np.int32), np.ones(n, np.int32)])
  worst, _, _ = _worst_pair(others, x, c, lam, method)
  bound = (pg.soft_label_sensitivity(lam, num_parties=m, num_classes=c) if method == "soft"
           else pg.vote_sensitivity(lam, num_classes=c))
  bound += 2 * TIGHT / lam  # the two brute-force minimisers are within TIGHT/lam each
  assert worst <= bound
  assert worst >= min_ratio * bound  # the search does find nearly-worst pairs


def test_protect_auxiliary_bound_holds_when_one_aux_row_also_changes():
  m, n, lam, c = 3, 4, 1.0, 2
  x = _aligned_aux(n, 2)
  others = np.stack([np.zeros(n, np.int32), np.ones(n, np.int32)])
  sols = []
  for new_row in (x[0], -x[0], np.array([0.0, 0.999], np.float32)):
    x2 = x.copy()
    x2[0] = new_row
    for row in itertools.product(range(c), repeat=n):
      for other_votes in itertools.product(range(c), repeat=2):  # any votes on the new row
        o = others.copy()
        o[:, 0] = other_votes
        sols.append(_minimizer(np.vstack([np.array(row)[None], o]), x2, c, lam, "soft"))
  flat = np.stack(sols)
  worst = np.max(np.linalg.norm(flat[:, None] - flat[None], axis=-1))
  bound = pg.soft_label_sensitivity(lam, num_parties=m, num_classes=c, num_aux=n,
                                    protect_auxiliary=True) + 2 * TIGHT / lam
  assert worst <= bound
  # Changing an auxiliary row moves the minimiser further than any party change can for the
  # logistic loss (party-only: ||grad g|| <= |alpha - alpha'| <= 1/M since l'(t) + l'(-t) = -1):
  # the extension's extra noise is needed.
  assert worst > 1.0 / (m * lam)


# ---------------------------------------------------------------- releases


def _reference(votes, x, c, lam, method, tol=1e-6):
  """The certified float64 point the release adds its noise to (same inputs, deterministic)."""
  return pg.global_minimizer(votes, x, num_classes=c, l2_reg=lam, method=method, tol=tol)[0].weights


def _small_problem(seed=0, m=15, n=40, d=4, c=2):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d))
  x = (x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0.2, 1, (n, 1))).astype(
      np.float32)
  w = rng.normal(size=(d, c))
  votes = np.argmax((x @ w)[None] + rng.normal(size=(m, n, c)), axis=-1).astype(np.int32)
  return votes, x


@pytest.mark.parametrize("c", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_epsilon_inf_gives_the_nonprivate_soft_label_model(c):
  votes, x = _small_problem(c=c)
  r = pg.private_soft_label_erm(jax.random.key(1), votes, x, num_classes=c, l2_reg=0.1,
                                epsilon=math.inf)
  assert isinstance(r.event, events.NonPrivateDpEvent)
  w64 = _reference(votes, x, c, 0.1, "soft")
  np.testing.assert_array_equal(np.asarray(r.weights), w64.astype(np.float32))
  # ... and it is the minimiser of Eq. 19/55: float64 gradient ~ 0 at it.
  t = np.asarray(aggregation.soft_labels(votes, c), np.float64)
  g = _soft_erm.grad64(w64, x.astype(np.float64), t, 0.1)
  assert np.linalg.norm(g) <= 1e-6
  # With unanimous votes the soft and vote objectives coincide.
  unanimous = np.repeat(votes[:1], 5, axis=0)
  ws = pg.private_soft_label_erm(jax.random.key(2), unanimous, x, num_classes=c, l2_reg=0.1,
                                 epsilon=math.inf).weights
  wv = pg.private_vote_erm(jax.random.key(3), unanimous, x, num_classes=c, l2_reg=0.1,
                           epsilon=math.inf).weights
  np.testing.assert_allclose(ws, wv, atol=2e-5)


def test_soft_label_noise_norm_matches_the_calibration():
  """||w_p - w_s|| ~ Gamma(d, Delta/eps) under the paper's density exp(-eps ||z|| / Delta)."""
  votes, x = _small_problem(c=3)
  m, lam, eps, k = votes.shape[0], 0.05, 0.7, 2000
  r = pg.private_soft_label_erm(jax.random.split(jax.random.key(4), k), votes, x, num_classes=3,
                                l2_reg=lam, epsilon=eps)
  d = x.shape[1] * 3
  sens = math.sqrt(2) * (1 / m + 2.0**-52) / lam + 2e-6 / lam
  assert r.calibration.sensitivity == pytest.approx(sens, rel=1e-12)
  w64 = _reference(votes, x, 3, lam, "soft")
  norms = np.linalg.norm((np.asarray(r.weights, np.float64) - w64).reshape(k, -1), axis=1)
  mean, sd = d * sens / eps, math.sqrt(d) * sens / eps
  assert abs(norms.mean() - mean) <= 5 * sd / math.sqrt(k)
  assert abs(norms.std() - sd) <= 0.1 * sd
  # Theorem 3 vs Theorem 1: M times less noise (multiclass: same sqrt(2) on both sides).
  rv = pg.private_vote_erm(jax.random.key(5), votes, x, num_classes=3, l2_reg=lam, epsilon=eps)
  assert rv.calibration.scale * (m - 2e-6 * m) <= r.calibration.scale * 1.0000001 * m


def test_gaussian_release_std_and_accountant_unit():
  votes, x = _small_problem()
  r = pg.private_soft_label_erm(jax.random.split(jax.random.key(6), 3000), votes, x,
                                num_classes=2, l2_reg=0.1, epsilon=1.0, delta=1e-5)
  z = (np.asarray(r.weights, np.float64) - _reference(votes, x, 2, 0.1, "soft")).reshape(-1)
  assert abs(z.std() / r.calibration.scale - 1) < 0.03
  acc = PrivacyAccountant(unit="party")
  acc.spend(r.event, count=3000)
  assert acc.unit == "party"
  with pytest.raises(ValueError):
    PrivacyAccountant(unit="example").spend(r.event)


def test_same_key_same_release_and_batch_is_independent():
  votes, x = _small_problem()
  kw = dict(num_classes=2, l2_reg=0.1, epsilon=1.0)
  a = pg.private_soft_label_erm(jax.random.key(7), votes, x, **kw).weights
  b = pg.private_soft_label_erm(jax.random.key(7), votes, x, **kw).weights
  np.testing.assert_array_equal(a, b)
  many = pg.private_soft_label_erm(jax.random.split(jax.random.key(7), 3), votes, x, **kw).weights
  assert many.shape == (3, x.shape[1])
  assert len({tuple(np.asarray(w).round(6)) for w in many}) == 3


# ---------------------------------------------------------------- audit


def test_audit_finds_no_violation_on_the_worst_pair():
  m, n, lam, c, eps = 3, 5, 1.0, 2, 2.0
  x = _aligned_aux(n, 2)
  others = np.stack([np.zeros(n, np.int32), np.ones(n, np.int32)])
  _, v0, v1 = _worst_pair(others, x, c, lam, "soft")
  w0, w1 = _minimizer(v0, x, c, lam, "soft"), _minimizer(v1, x, c, lam, "soft")
  stat = audit.l2_distance_statistic(w0, w1)

  def mech(keys, votes):
    return pg.private_soft_label_erm(keys, np.asarray(votes), x, num_classes=c, l2_reg=lam,
                                     epsilon=eps).weights

  rep = audit.audit_epsilon(mech, v0, v1, stat, key=jax.random.key(8), num_trials=20000,
                            claimed_epsilon=eps, batched=True, progress=False)
  assert rep.epsilon_lower_bound <= eps
  # The audit has power: the same pair with the noise of sensitivity Delta/(4M) (a "1/M twice"
  # bug) is caught.
  def broken(keys, votes):
    cert, _ = pg.global_minimizer(np.asarray(votes), x, num_classes=c, l2_reg=lam, tol=1e-6)
    sens = pg.soft_label_sensitivity(lam, num_parties=m, num_classes=c) / (4 * m)
    return pg.release(keys, cert.weights, pg.party_calibration(sens, epsilon=eps))

  rep = audit.audit_epsilon(broken, v0, v1, stat, key=jax.random.key(9), num_trials=20000,
                            claimed_epsilon=eps, batched=True, progress=False)
  assert rep.epsilon_lower_bound > eps


# ---------------------------------------------------------------- accountant: spend before work


def test_accountant_is_charged_one_event_per_key_before_any_work(monkeypatch):
  from jaxdp.accounting import PrivacyBudget
  from jaxdp.errors import BudgetExceededError
  from jaxdp.multiparty import baselines
  votes, x = _small_problem()
  acc = PrivacyAccountant(unit="party", neighbouring="replace_one")
  r = pg.private_soft_label_erm(jax.random.split(jax.random.key(3), 4), votes, x, num_classes=2,
                                l2_reg=0.1, epsilon=0.5, accountant=acc)
  assert r.weights.shape[0] == 4 and list(acc.ledger) == [(r.event, 4)]

  def boom(*args, **kwargs):
    raise AssertionError("computed on the data although the budget refused")
  monkeypatch.setattr(pg, "global_minimizer", boom)
  monkeypatch.setattr(baselines, "_certify", boom)
  budget = PrivacyBudget(epsilon=1.2, neighbouring="replace_one", unit="party")
  with pytest.raises(BudgetExceededError):  # 3 x 0.5 > 1.2: refused before any work
    pg.private_vote_erm(jax.random.split(jax.random.key(4), 3), votes, x, num_classes=2,
                        l2_reg=0.1, epsilon=0.5, accountant=budget)
  assert not budget.accountant.ledger
  rng = np.random.default_rng(0)
  xs = rng.normal(size=(3, 4, 4))
  xs = (0.5 * xs / np.linalg.norm(xs, axis=-1, keepdims=True)).astype(np.float32)
  with pytest.raises(BudgetExceededError):
    baselines.private_parameter_averaging(
        jax.random.split(jax.random.key(5), 3), np.zeros((3, 4), np.float32), xs,
        np.zeros((3, 4), np.int32), num_classes=2, l2_reg=0.1, epsilon=0.5, accountant=budget)
  assert not budget.accountant.ledger
  with pytest.raises(ValueError):  # an example-level ledger refuses the party event, first
    pg.private_vote_erm(jax.random.key(6), votes, x, num_classes=2, l2_reg=0.1, epsilon=0.5,
                        accountant=PrivacyAccountant(unit="example", neighbouring="replace_one"))
