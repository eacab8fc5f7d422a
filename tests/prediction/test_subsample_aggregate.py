"""Tests of jaxdp.prediction.subsample_aggregate (paper 000 Algorithm 8, corrected)."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdp.accounting import zcdp
from jaxdp.accounting.accountant import PrivacyBudget
from jaxdp.errors import BudgetExceededError
from jaxdp.prediction import subsample_aggregate as sa
from jaxdp.training import linear


@pytest.mark.parametrize("n, t", [(103, 10), (100, 10), (7, 7), (50, 1)])
@pytest.mark.parametrize("seed", [None, 3])
def test_partition_disjoint_and_covers_floor(n, t, seed):
  key = None if seed is None else jax.random.key(seed)
  idx = sa.partition_indices(n, t, key)
  assert idx.shape == (t, n // t)
  flat = idx.reshape(-1)
  assert len(np.unique(flat)) == (n // t) * t  # disjoint
  assert flat.min() >= 0 and flat.max() < n
  if seed is None:
    np.testing.assert_array_equal(flat, np.arange((n // t) * t))
  for a, b in itertools.combinations(range(t), 2):
    assert not set(idx[a]) & set(idx[b])


def test_partition_bad_arguments():
  with pytest.raises(ValueError, match="num_teachers"):
    sa.partition_indices(5, 6)
  with pytest.raises(ValueError, match="num_teachers"):
    sa.partition_indices(5, 0)


def _toy_data(n=160, d=6, c=3, seed=0):
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(c, d))
  y = rng.integers(0, c, size=n)
  x = centers[y] + 0.8 * rng.normal(size=(n, d))
  x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)
  return x.astype(np.float32), y


def test_vmapped_teachers_equal_separately_trained():
  x, y = _toy_data()
  t, c = 4, 3
  key = jax.random.key(7)
  model = sa.train_linear_teachers(x, y, num_teachers=t, num_classes=c, l2_reg=1e-2, key=key,
                                   tol=1e-7)
  assert model.weights.shape == (t, x.shape[1], c)
  xs, ys = sa.partition_dataset(x, y, t, key)
  for i in range(t):
    single = linear.fit_linear(xs[i], ys[i], num_classes=c, l2_reg=1e-2, tol=1e-7)
    np.testing.assert_allclose(np.asarray(model.weights[i]), np.asarray(single.weights),
                               atol=2e-4, rtol=2e-4)


def test_linear_teacher_votes_count_argmax_labels():
  rng = np.random.default_rng(1)
  w = rng.normal(size=(5, 4, 3)).astype(np.float32)
  x = rng.normal(size=(7, 4)).astype(np.float32)
  votes = np.asarray(sa.linear_teacher_votes(w, x))
  expected = np.zeros((7, 3), int)
  for t in range(5):
    for m, lab in enumerate(np.argmax(x @ w[t], axis=1)):
      expected[m, lab] += 1
  np.testing.assert_array_equal(votes, expected)
  assert np.all(votes.sum(axis=1) == 5)


def test_aggregation_matches_exponential_law_chi_square():
  votes = np.array([5, 2, 1, 0])
  beta = 0.4
  draws = 40_000
  # Jitted (beta traced): one compiled program instead of one per primitive.
  labels = np.asarray(jax.jit(sa.aggregate_exponential)(jax.random.key(11),
                                                        np.tile(votes, (draws, 1)), beta))
  counts = np.bincount(labels, minlength=4)
  target = sa.exponential_vote_distribution(votes, beta)
  np.testing.assert_allclose(target, np.exp(beta * votes) / np.exp(beta * votes).sum(), rtol=1e-12)
  _, p_ok = stats.chisquare(counts, draws * target)
  assert p_ok > 1e-3
  # The test has power: the paper's uncorrected 2x beta (or any 25% change) is rejected.
  _, p_wrong = stats.chisquare(counts, draws * sa.exponential_vote_distribution(votes, 1.25 * beta))
  assert p_wrong < 1e-6
  # Per-row keys: same key -> same labels, rows independent.
  keys = jax.random.split(jax.random.key(2), 3)
  from_keys = jax.jit(sa.aggregate_exponential_from_keys)
  a = from_keys(keys, np.tile(votes, (3, 1)), beta)
  b = from_keys(keys, np.tile(votes, (3, 1)), beta)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_calibration_formulas():
  eps, budget = 1.0, 100
  assert sa.exponential_aggregation_beta(eps, 0.0, budget) == pytest.approx(eps / (2 * budget))
  delta = 1e-5
  log_inv = math.log(1 / delta)
  beta2 = math.sqrt(2 / budget) * (math.sqrt(log_inv + eps) - math.sqrt(log_inv))
  beta = sa.exponential_aggregation_beta(eps, delta, budget)
  assert beta == pytest.approx(max(eps / (2 * budget), beta2), rel=1e-14)
  # beta'' is exactly the zCDP root: B beta^2/2 -> (eps, delta) by Bun & Steinke Prop 1.3.
  assert zcdp.zcdp_to_approx_dp(budget * beta2**2 / 2, delta) == pytest.approx(eps, rel=1e-12)
  # For B=1 the pure term wins: eps/2.
  assert sa.exponential_aggregation_beta(eps, delta, 1) == pytest.approx(0.5)


@pytest.mark.parametrize("delta", [0.0, 1e-5])
def test_budget_accepts_b_answers_and_refuses_one_more_pure(delta):
  eps, budget = 1.0, 40
  event = sa.exponential_aggregation_event(sa.exponential_aggregation_beta(eps, delta, budget))
  pb = PrivacyBudget(eps, delta)
  pb.spend(event, budget)
  assert pb.spent_epsilon <= eps * (1 + 1e-9)
  if delta == 0.0:
    with pytest.raises(BudgetExceededError):
      pb.spend(event, 1)


def _loss_b_queries(votes, votes_prime, beta, budget):
  # B independent answers to the same query: the loss of the output sequence
  # (y, ..., y) is B times the one-answer loss of y; maximise over y.
  return budget * sa.exponential_privacy_loss(votes, votes_prime, beta)


@pytest.mark.parametrize("eps, budget, teachers", [(1.0, 1, 3), (1.0, 4, 10), (2.0, 10, 256)])
def test_paper_calibration_leaks_more_than_eps_ours_does_not(eps, budget, teachers):
  d, d_prime = sa.adversarial_votes(teachers, 2)
  paper = sa._paper_theorem7_beta(eps, budget)  # pylint: disable=protected-access
  ours = sa.exponential_aggregation_beta(eps, 0.0, budget)
  loss_paper = max(_loss_b_queries(d, d_prime, paper, budget),
                   _loss_b_queries(d_prime, d, paper, budget))
  loss_ours = max(_loss_b_queries(d, d_prime, ours, budget),
                  _loss_b_queries(d_prime, d, ours, budget))
  assert loss_paper > eps * 1.2
  assert loss_ours <= eps * (1 + 1e-12)


def test_worst_case_over_all_vote_histograms_is_between_beta_and_2beta():
  t, c, beta = 6, 3, 0.3
  worst = 0.0
  for votes in itertools.product(range(t + 1), repeat=c):
    if sum(votes) != t:
      continue
    for a, b in itertools.permutations(range(c), 2):
      if votes[a] == 0:
        continue
      moved = list(votes)
      moved[a] -= 1
      moved[b] += 1
      worst = max(worst, sa.exponential_privacy_loss(votes, moved, beta))
  assert beta * 1.3 < worst <= 2 * beta * (1 + 1e-12)


def _hockey_stick(votes, votes_prime, beta, budget, eps):
  """Exact delta(eps) = sum over output sequences of max(0, P - e^eps Q), both directions."""
  p1 = sa.exponential_vote_distribution(votes, beta)
  q1 = sa.exponential_vote_distribution(votes_prime, beta)
  worst = 0.0
  for a, b in [(p1, q1), (q1, p1)]:
    total = 0.0
    for seq in itertools.product(range(len(a)), repeat=budget):
      pa = math.prod(a[i] for i in seq)
      pb = math.prod(b[i] for i in seq)
      total += max(0.0, pa - math.exp(eps) * pb)
    worst = max(worst, total)
  return worst


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_paper_theorem8_calibration_breaks_eps_delta_ours_does_not(budget):
  # For small B the paper's Theorem 8 picks beta' = eps/B, which is not (eps, delta)-DP.
  eps, delta = 1.0, 1e-5
  paper = sa._paper_theorem8_beta(eps, delta, budget)  # pylint: disable=protected-access
  assert paper == pytest.approx(eps / budget)
  d, d_prime = sa.adversarial_votes(3, 2)
  assert _hockey_stick(d, d_prime, paper, budget, eps) > 100 * delta
  ours = sa.exponential_aggregation_beta(eps, delta, budget)
  assert _hockey_stick(d, d_prime, ours, budget, eps) <= delta


def test_empirical_privacy_loss_from_vmapped_samples():
  """Sampled estimate of the loss of (a, a) over B=2 answers on the adversarial votes."""
  eps, budget, teachers, draws = 1.0, 2, 3, 200_000
  d, d_prime = sa.adversarial_votes(teachers, 2)
  results = {}
  for name, beta in [("paper", sa._paper_theorem7_beta(eps, budget)),  # pylint: disable=protected-access
                     ("ours", sa.exponential_aggregation_beta(eps, 0.0, budget))]:
    k1, k2 = jax.random.split(jax.random.key(123 if name == "paper" else 321))
    out_d = np.asarray(sa.aggregate_exponential(k1, np.broadcast_to(d, (draws, budget, 2)), beta))
    out_p = np.asarray(sa.aggregate_exponential(k2, np.broadcast_to(d_prime, (draws, budget, 2)),
                                                beta))
    hits_d = int(np.sum(np.all(out_d == 0, axis=1)))
    hits_p = int(np.sum(np.all(out_p == 0, axis=1)))
    exact = budget * math.log(sa.exponential_vote_distribution(d, beta)[0]
                              / sa.exponential_vote_distribution(d_prime, beta)[0])
    estimate = math.log(hits_d / hits_p)
    # Clopper-Pearson (1e-4 each side) lower bound on the loss.
    lo_d = stats.beta.ppf(1e-4, hits_d, draws - hits_d + 1)
    hi_p = stats.beta.ppf(1 - 1e-4, hits_p + 1, draws - hits_p)
    results[name] = (exact, estimate, math.log(lo_d / hi_p))
    se = math.sqrt(1 / hits_d + 1 / hits_p)
    assert abs(estimate - exact) < 4 * se
  exact, _, lower = results["paper"]
  assert exact > eps and lower > eps  # measured loss above eps with high confidence
  exact, estimate, _ = results["ours"]
  assert exact <= eps and estimate <= eps


def test_generic_vmapped_training_equals_loop():
  """train_teachers vmaps any jittable trainer (e.g. a Flax/optax loop with fixed steps)."""
  x, y = _toy_data(n=120, d=4, c=3, seed=2)
  xs, ys = sa.partition_dataset(x, y, 3, jax.random.key(0))

  def train(xp, yp, key):
    w = 0.01 * jax.random.normal(key, (4, 3))

    def step(w, _):
      grad = jax.grad(lambda w: jnp.mean(
          -jnp.take_along_axis(jax.nn.log_softmax(xp @ w), yp[:, None], axis=1)))(w)
      return w - 0.5 * grad, None

    return jax.lax.scan(step, w, None, length=50)[0]

  keys = jax.random.split(jax.random.key(1), 3)
  batched = np.asarray(sa.train_teachers(train, xs, ys, keys))
  for i in range(3):
    np.testing.assert_allclose(batched[i], np.asarray(jax.jit(train)(xs[i], ys[i], keys[i])),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("args, match", [
    ((0.0, 0.0, 10), "epsilon"), ((1.0, 1.0, 10), "delta"), ((1.0, 0.0, 0), "budget")])
def test_calibration_bad_arguments(args, match):
  with pytest.raises(ValueError, match=match):
    sa.exponential_aggregation_beta(*args)


@pytest.mark.slow
@pytest.mark.data
def test_mnist_subsample_and_aggregate(data_dir):
  from jaxdp import data as jdata  # pylint: disable=import-outside-toplevel
  from jaxdp.prediction import predictor as pr  # pylint: disable=import-outside-toplevel
  ds = jdata.load_mnist(data_dir)
  pca = jdata.fit_pca(ds.x_train[:20000], 30)
  x_tr, x_te = jdata.normalize_train_test(pca.transform(ds.x_train[:20000]),
                                          pca.transform(ds.x_test[:1000]), "project")
  model = sa.train_linear_teachers(x_tr, ds.y_train[:20000], num_teachers=32, num_classes=10,
                                   l2_reg=1e-3, key=jax.random.key(0), max_iter=100)
  votes = np.asarray(sa.linear_teacher_votes(model.weights, x_te))
  assert np.mean(np.argmax(votes, axis=1) == ds.y_test[:1000]) > 0.8
  p = pr.SubsampleAggregatePredictor.from_linear_teachers(
      model.weights, epsilon=8.0, delta=1e-5, budget=1000, key=jax.random.key(1))
  labels = np.asarray(p.predict(x_te))
  # Accuracy matches the exact law softmax(beta * votes) of the answers.
  probs = sa.exponential_vote_distribution(votes, p.beta)
  expected = probs[np.arange(1000), ds.y_test[:1000]]
  se = math.sqrt(np.sum(expected * (1 - expected))) / 1000
  assert abs(np.mean(labels == ds.y_test[:1000]) - expected.mean()) < 4 * se
  assert expected.mean() > 0.2  # well above chance (0.1)
  with pytest.raises(BudgetExceededError):
    p.predict(x_te[:1])
