"""Tests of jaxdp.multiparty.local and .aggregation (paper 001 Sec. 3.1, Eq. 6 and 12)."""

import numpy as np
import pytest

from jaxdp.multiparty import aggregation, local
from jaxdp.training import linear


def _parties(m=5, n=12, d=3, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(m * n + 30, d))
  x = (x / np.linalg.norm(x, axis=1, keepdims=True) * 0.9).astype(np.float32)
  y = (x @ np.array([1.0, -1.0, 0.5]) + 0.3 * rng.normal(size=len(x)) > 0).astype(np.int32)
  return local.split_parties(1, x, y, num_parties=m, samples_per_party=n), x, y


def test_split_is_a_partition():
  sp, x, _ = _parties()
  assert sp.xs.shape == (5, 12, 3) and sp.x_aux.shape == (30, 3)
  rows = np.concatenate([sp.xs.reshape(-1, 3), sp.x_aux])
  assert len({tuple(r) for r in rows}) == len(x)
  with pytest.raises(ValueError, match="parties"):
    local.split_parties(0, x, np.zeros(len(x)), num_parties=10, samples_per_party=10)


@pytest.mark.parametrize("c", [2, 3])
def test_batched_parties_equal_a_loop(c):
  sp, _, _ = _parties()
  ys = sp.ys if c == 2 else (sp.ys + (sp.xs[..., 2] > 0.3)).astype(np.int32)
  loss = "logistic" if c == 2 else "softmax"
  kw = dict(l2_reg=0.05, loss=loss, num_classes=None if c == 2 else c, tol=1e-6)
  batched = local.fit_local_classifiers(sp.xs, ys, batch_mode="vmap", **kw)
  for i in range(sp.xs.shape[0]):
    one = linear.fit_linear(sp.xs[i], ys[i], **kw)
    np.testing.assert_allclose(batched.weights[i], one.weights, atol=2e-5)
  votes = local.local_votes(batched.weights, sp.x_aux)
  for i in range(sp.xs.shape[0]):
    np.testing.assert_array_equal(votes[i], linear.predict_labels(batched.weights[i], sp.x_aux))


def test_black_box_predictors_vote():
  x = np.array([[0.5, 0.1], [-0.4, 0.2], [0.0, -0.3]], np.float32)
  hs = [lambda z: (z[:, 0] > 0).astype(int), lambda z: (z[:, 1] > 0).astype(int),
        lambda z: np.ones(len(z), int)]
  votes = local.votes_from_predictors(hs, x)
  np.testing.assert_array_equal(votes, [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
  np.testing.assert_allclose(aggregation.soft_labels(votes, 2)[:, 1], [1.0, 2 / 3, 1 / 3])
  np.testing.assert_array_equal(aggregation.majority_labels(votes, 2), [1, 1, 0])
  with pytest.raises(ValueError, match="predictor 0"):
    local.votes_from_predictors([lambda z: np.ones((len(z), 2))], x)


def test_soft_labels_and_majority():
  votes = np.array([[0, 1, 2, 1], [1, 1, 2, 0], [2, 0, 2, 0], [1, 0, 2, 1]])
  a = np.asarray(aggregation.soft_labels(votes, 3))
  np.testing.assert_allclose(a.sum(axis=1), 1.0)
  np.testing.assert_allclose(a[0], [0.25, 0.5, 0.25])
  np.testing.assert_array_equal(aggregation.majority_labels(votes, 3), [1, 0, 2, 0])  # tie -> 0
  # Binary tie goes to class 1 (Eq. 6: >= M/2).
  np.testing.assert_array_equal(aggregation.majority_labels(np.array([[0], [1]]), 2), [1])
  # One party changes one vote per sample: each soft-label row moves by sqrt(2)/M in L2.
  changed = votes.copy()
  changed[0] = (votes[0] + 1) % 3
  diff = np.asarray(aggregation.soft_labels(changed, 3)) - a
  np.testing.assert_allclose(np.linalg.norm(diff, axis=1), np.sqrt(2) / 4, rtol=1e-6)
  for bad in (votes + 3, votes - 1, votes + 0.5, np.zeros((0, 3))):
    with pytest.raises(ValueError, match="votes"):
      aggregation.soft_labels(bad, 3)
