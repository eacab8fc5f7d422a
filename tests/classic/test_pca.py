"""Private PCA (jaxdp.classic.pca): sensitivities, symmetric noise, eps = inf, audits."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.decomposition import PCA

from classic_audit_util import laplace_log_ratio
from jaxdp import audit
from jaxdp.accounting import PrivacyAccountant
from jaxdp.accounting import analytic_gaussian_sigma
from jaxdp.classic import pca


def test_calibration_formulas():
  g = pca.pca_calibration(dim=5, epsilon=1.0, delta=1e-5, neighbouring="add_remove")
  assert g.sensitivity == 1.0
  assert g.scale == pytest.approx(analytic_gaussian_sigma(1.0, 1e-5, 1.0))
  g2 = pca.pca_calibration(dim=5, epsilon=1.0, delta=1e-5, neighbouring="replace_one")
  assert g2.sensitivity == pytest.approx(math.sqrt(2.0))
  lap = pca.pca_calibration(dim=5, epsilon=2.0, mechanism="laplace", neighbouring="add_remove")
  assert lap.sensitivity == 3.0 and lap.scale == pytest.approx(1.5)
  lap2 = pca.pca_calibration(dim=5, epsilon=2.0, mechanism="laplace")
  assert lap2.sensitivity == 6.0
  acc = PrivacyAccountant()
  acc.spend(pca.pca_event(g2))
  assert acc.get_epsilon(1e-5, method="pld") == pytest.approx(1.0, rel=0.02)
  with pytest.raises(ValueError, match="delta must be > 0"):
    pca.pca_calibration(dim=3, epsilon=1.0, delta=0.0)
  with pytest.raises(ValueError, match="delta=0"):
    pca.pca_calibration(dim=3, epsilon=1.0, delta=1e-5, mechanism="laplace")


def test_worst_case_sensitivities_are_attained_and_not_exceeded():
  rng = np.random.default_rng(0)
  d = 6
  up = lambda x: np.asarray(x)[np.triu_indices(d)]
  # Replace-one L2: sqrt(2) for orthogonal unit vectors, never more for random ones.
  e1, e2 = np.eye(d)[0], np.eye(d)[1]
  assert np.linalg.norm(up(np.outer(e1, e1)) - up(np.outer(e2, e2))) == pytest.approx(math.sqrt(2))
  x = rng.normal(size=(2000, d))
  x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0) * rng.uniform(1, 2, (2000, 1))
  diffs = [np.linalg.norm(up(np.outer(a, a)) - up(np.outer(b, b))) for a, b in zip(x[::2], x[1::2])]
  assert max(diffs) <= math.sqrt(2) + 1e-9
  # Add/remove L1: (d+1)/2 at x = 1/sqrt(d), never more.
  u = np.full(d, 1 / math.sqrt(d))
  assert np.abs(up(np.outer(u, u))).sum() == pytest.approx((d + 1) / 2)
  assert max(np.abs(up(np.outer(a, a))).sum() for a in x) <= (d + 1) / 2 + 1e-9


def test_noise_is_symmetric_with_the_right_scale():
  e = np.asarray(jax.vmap(lambda k: pca.symmetric_noise(k, 4, 2.0, "gaussian"))(
      jax.random.split(jax.random.key(0), 4000)))
  np.testing.assert_array_equal(e, np.swapaxes(e, 1, 2))
  # Diagonal and off-diagonal entries both have std sigma (not sqrt(2) sigma).
  np.testing.assert_allclose(e[:, 0, 0].std(), 2.0, rtol=0.05)
  np.testing.assert_allclose(e[:, 0, 1].std(), 2.0, rtol=0.05)


def _data(n=3000, d=6, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)) * np.array([3, 2, 1, 0.5, 0.2, 0.1])[:d]
  x -= x.mean(0)
  return x / np.linalg.norm(x, axis=1).max()


def test_eps_inf_reproduces_sklearn_on_centred_data():
  x = _data()
  est = pca.PrivatePCA(n_components=3, epsilon=np.inf).fit(x)
  ref = PCA(3).fit(x)
  np.testing.assert_allclose(np.abs(est.components_ @ ref.components_.T), np.eye(3), atol=1e-4)
  assert est.score(x) == pytest.approx(ref.explained_variance_ratio_.sum(), rel=1e-4)


@pytest.mark.parametrize("mechanism,delta", [("gaussian", 1e-5), ("laplace", 0.0)])
def test_private_pca_explained_variance(mechanism, delta):
  x = _data(20000)
  acc = PrivacyAccountant()
  est = pca.PrivatePCA(n_components=2, epsilon=1.0, delta=delta, mechanism=mechanism,
                       accountant=acc, seed=0).fit(x)
  ref = PCA(2).fit(x).explained_variance_ratio_.sum()
  assert est.score(x) > 0.9 * ref
  assert acc.neighbouring == "replace_one"


def test_bad_inputs_raise():
  x = _data(50) * 3
  with pytest.raises(ValueError, match="unit L2 ball"):
    pca.private_pca(jax.random.key(0), x, num_components=2, epsilon=1.0, delta=1e-5)
  r, _ = pca.private_pca(jax.random.key(0), x, num_components=2, epsilon=1.0, delta=1e-5, clip=True)
  assert r.components.shape == (2, 6)
  with pytest.raises(ValueError, match="num_components"):
    pca.private_pca(jax.random.key(0), x / 3, num_components=7, epsilon=1.0, delta=1e-5)


# ------------------------------------------------------------------ audits

def test_audit_analyze_gauss_worst_case():
  # Replace-one worst case: e1 -> e2 (||.||_F = sqrt(2) = Delta_2); projection on the
  # difference of the two exact matrices is the likelihood ratio of the Gaussian.
  d, eps, delta = 3, 1.0, 1e-3
  cal = pca.pca_calibration(dim=d, epsilon=eps, delta=delta)
  dset, nb = jnp.eye(d)[:1], jnp.eye(d)[1:2]
  mech = lambda key, x: x.T @ x + pca.symmetric_noise(key, d, cal.scale, "gaussian")
  stat = audit.projection_statistic(jnp.triu(nb.T @ nb - dset.T @ dset))
  r = audit.audit_epsilon(mech, dset, nb, lambda o: stat(jnp.triu(o)), key=jax.random.key(0),
                          num_trials=20_000, batch_size=20_000, claimed_epsilon=eps, delta=delta,
                          progress=False)
  assert 0.2 <= r.epsilon_lower_bound <= eps


@pytest.mark.parametrize("scale_factor,violates", [(1.0, False), (0.25, True)])
def test_audit_laplace_pca_add_remove_worst_case(scale_factor, violates):
  # Add/remove worst case: x = 1/sqrt(d) against the empty set (a zero row adds
  # nothing to X^T X): ||U(x x^T)||_1 = (d+1)/2 = Delta_1. A quarter of the noise is caught.
  d, eps = 3, 1.0
  cal = pca.pca_calibration(dim=d, epsilon=eps, mechanism="laplace", neighbouring="add_remove")
  scale = cal.scale * scale_factor
  dset, nb = jnp.full((1, d), 1 / math.sqrt(d)), jnp.zeros((1, d))
  iu = jnp.triu_indices(d)
  mech = lambda key, x: (x.T @ x + pca.symmetric_noise(key, d, scale, "laplace"))[iu]
  s0, s1 = (dset.T @ dset)[iu], (nb.T @ nb)[iu]
  r = audit.audit_epsilon(mech, dset, nb, lambda o: laplace_log_ratio(o, s0, s1, scale),
                          key=jax.random.key(1), num_trials=20_000, batch_size=20_000,
                          claimed_epsilon=eps, progress=False)
  assert r.violates_claim == violates
  if not violates:
    assert r.epsilon_lower_bound >= 0.2
