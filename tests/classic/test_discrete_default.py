"""The discrete default of the classic models' low-dimensional releases (issue 26).

Naive Bayes, random trees, DP-Lloyd and sample-and-aggregate k-means release
their counts and sums with the discrete Laplace mechanism on a public grid by
default (``noise="discrete"``): the outputs lie on the grid, the events are
``PureDpEvent`` s with the same epsilon and relation as the continuous path,
``noise="continuous"`` still gives float Laplace, a bad ``noise`` raises, and
the same key gives the same release.

Cost: every distinct (shape, noise parameters) of a release compiles its own
sampler, so the tests share ONE configuration per model (the ``NB``, ``RT``,
``LLOYD`` and ``SA`` dicts below, one data set) and module-scope fits.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.accounting import PrivacyAccountant
from jaxdp.accounting import events
from jaxdp.classic import kmeans as km
from jaxdp.classic import naive_bayes as nb
from jaxdp.classic import random_trees as rt

NB_GRID = 2.0**-10  # largest power of two <= Delta_num/(c 2^10) = 1/2^10 (module docstring)
# One configuration per model, shared by every test (one compilation each).
NB = dict(num_classes=2, epsilon=1.0, num_categories=3, lower=0.0, upper=1.0)
RT = dict(num_classes=2, epsilon=1.0, lower=0.0, upper=1.0, num_trees=4, depth=4)
LLOYD = dict(n_clusters=2, epsilon=1.0, lower=0.0, upper=1.0, iterations=2)
SA = dict(n_clusters=2, epsilon=5.0, lower=0.0, upper=1.0, num_blocks=8, iterations=3)


def _on_grid(values, step):
  v = np.asarray(values, np.float64) / step
  return np.all(v == np.round(v))


def _nb_data(n=300, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.integers(0, 3, size=(n, 2)), rng.uniform(0, 1, size=(n, 2)),
          rng.integers(0, 2, size=n))


def _nb_fit(key, noise="discrete", **kw):
  xc, xn, y = _nb_data()
  return nb.private_naive_bayes(key, xc, xn, y, noise=noise, **{**NB, **kw})


def _km_data(n=200, seed=1):
  return np.random.default_rng(seed).uniform(0, 1, size=(n, 3))


X = _km_data()
Y = np.random.default_rng(2).integers(0, 2, 200)


def _rt_fit(key, noise="discrete", **kw):
  return rt.private_random_trees(key, X, Y, noise=noise, **{**RT, **kw})


@pytest.fixture(scope="module")
def nb_discrete():
  return _nb_fit(jax.random.key(0))


@pytest.fixture(scope="module")
def rt_discrete():
  return _rt_fit(jax.random.key(0))


@pytest.fixture(scope="module")
def sa_discrete():
  return km.sample_aggregate_kmeans(jax.random.key(0), X, **SA)


# ------------------------------------------------------------------ the grid


@pytest.mark.parametrize("rel", ["replace_one", pytest.param("add_remove", marks=pytest.mark.slow)])
def test_naive_bayes_default_is_on_the_grid(rel, request):
  if rel == "replace_one":
    _, stats, ev = request.getfixturevalue("nb_discrete")
  else:
    _, stats, ev = _nb_fit(jax.random.key(0), neighbouring=rel)
  assert _on_grid(stats.class_counts, 1.0) and _on_grid(stats.cat_counts, 1.0)
  assert _on_grid(stats.num_sums, NB_GRID) and _on_grid(stats.num_squares, NB_GRID)
  assert not _on_grid(stats.num_sums, 2 * NB_GRID)  # the grid is g, not coarser
  cal = nb.naive_bayes_calibration(num_cat=2, num_num=2, epsilon=1.0, neighbouring=rel)
  two = 2 if rel == "replace_one" else 1
  assert cal.grid_steps == (1.0, 1.0, NB_GRID) and cal.changed[2] == two * 2 * 2
  # numeric scale K_1 g/eps_num with K_1 = ceil(Delta/g) + (c - 1): within 2^-10 of Delta/eps
  k1 = math.ceil(cal.sensitivities[2] / NB_GRID) + cal.changed[2] - 1
  assert cal.scales[2] == pytest.approx(k1 * NB_GRID / cal.epsilons[2], rel=2**-19)
  assert cal.scales[2] / (cal.sensitivities[2] / cal.epsilons[2]) - 1 < 2**-10
  # counts: the continuous scale (integers: K_1 = Delta), up to the 2^-20 of t/s
  assert cal.scales[0] == pytest.approx(cal.sensitivities[0] / cal.epsilons[0], rel=2**-19)
  # the same epsilon per block, as PureDpEvents
  assert isinstance(ev, events.ComposedDpEvent)
  assert [e.epsilon for e in ev.events] == pytest.approx(list(cal.epsilons))
  assert all(isinstance(e, events.PureDpEvent) and e.neighbouring == rel for e in ev.events)


def test_random_trees_default_counts_are_integers(rt_discrete):
  trees, ev = rt_discrete
  assert _on_grid(trees.counts, 1.0)
  assert ev == events.PureDpEvent(1.0, neighbouring="replace_one")
  t, s = rt.random_trees_noise_parameters(num_trees=4, epsilon=1.0)
  assert 2.0 <= t / s < 2.0 * (1 + 2**-19)  # Delta/eps = 2 (disjoint, replace-one)


def test_lloyd_release_is_on_the_grid():
  cal = km.lloyd_calibration(lower=np.zeros(3), upper=np.ones(3), epsilon=1.0, iterations=2)
  params = km.lloyd_discrete_parameters(cal)
  # g = largest power of two <= Delta_sum/(c 2^10) = R_1/(d 2^10) = 0.5/2^10
  assert cal.sum_grid_step == 2.0**-11 and cal.sum_changed == 6
  with jax.enable_x64(True):
    x = jnp.asarray(X, jnp.float64)
    cents = jnp.asarray([[0.2, 0.2, 0.2], [0.8, 0.8, 0.8]], jnp.float64)
    # One compiled program (op by op, every primitive of the samplers compiles on its own).
    step = jax.jit(km.noisy_lloyd_step, static_argnums=(4, 5, 6))
    counts, sums = step(jax.random.key(0), x, cents, jnp.full(3, 0.5),
                        float(cal.count_scale), float(cal.sum_scale), params)
  assert _on_grid(counts, 1.0) and _on_grid(sums, 2.0**-11)
  ev = km.lloyd_iteration_event(cal)
  assert [e.epsilon for e in ev.events] == pytest.approx([cal.count_epsilon, cal.sum_epsilon])
  assert all(isinstance(e, events.PureDpEvent) for e in ev.events)


def test_sample_aggregate_default_is_on_the_grid(sa_discrete):
  c, ev = sa_discrete
  # Delta_1 = K sum(u - l)/q = 2 * 3/8, c = K d = 6: g = 2^floor(log2(0.75/(6 2^10))) = 2^-13
  assert _on_grid(c, 2.0**-13) and not _on_grid(c, 2.0**-12)
  assert ev == events.PureDpEvent(5.0, neighbouring="replace_one")


# ------------------------------------------------------------------ the continuous option


def test_continuous_option_is_float_laplace():
  _, stats, ev = _nb_fit(jax.random.key(0), noise="continuous")
  assert not _on_grid(stats.class_counts, 2.0**-20)
  assert all(isinstance(e, events.LaplaceDpEvent) for e in ev.events)
  trees, ev = _rt_fit(jax.random.key(0), noise="continuous")
  assert not _on_grid(trees.counts, 2.0**-10)
  assert ev == events.LaplaceDpEvent(noise_multiplier=1.0, neighbouring="replace_one")
  c, ev = km.sample_aggregate_kmeans(jax.random.key(0), X, noise="continuous", **SA)
  assert not _on_grid(c, 2.0**-20)
  assert ev == events.LaplaceDpEvent(noise_multiplier=0.2, neighbouring="replace_one")


@pytest.mark.parametrize("noise", ["discrete", "continuous"])
def test_both_paths_spend_the_same_epsilon(noise):
  acc = PrivacyAccountant()
  _nb_fit(jax.random.key(1), noise=noise, accountant=acc)
  km.dp_lloyd(jax.random.key(2), X, accountant=acc, noise=noise, **LLOYD)
  assert acc.pure_epsilon() == pytest.approx(2.0)


@pytest.mark.parametrize("estimator", ["nb", "rt", "lloyd", "sample_aggregate"])
def test_estimators_pass_noise_and_refit_on_the_grid(estimator):
  for noise in ("discrete", "continuous"):
    if estimator == "nb":
      xc, xn, y = _nb_data()
      est = nb.PrivateNaiveBayes(categorical_features=[0, 1], seed=0, noise=noise,
                                 classes=[0, 1], epsilon=NB["epsilon"],
                                 num_categories=NB["num_categories"], lower=NB["lower"],
                                 upper=NB["upper"]).fit(np.hstack([xc, xn]), y)
      leaf = est.event_.events[0]
    elif estimator == "rt":
      est = rt.PrivateRandomTrees(classes=[0, 1], epsilon=1.0, lower=0.0, upper=1.0,
                                  n_estimators=RT["num_trees"], depth=RT["depth"], seed=0,
                                  noise=noise).fit(X, Y)
      leaf = est.event_
      assert _on_grid(est.trees_.counts, 1.0) == (noise == "discrete")
    else:
      cfg = LLOYD if estimator == "lloyd" else SA
      est = km.PrivateKMeans(n_clusters=2, epsilon=cfg["epsilon"], lower=0.0, upper=1.0,
                             method=estimator, iterations=cfg["iterations"],
                             num_blocks=SA["num_blocks"], seed=0, noise=noise).fit(X)
      leaf = est.event_ if estimator == "sample_aggregate" else est.event_.event.events[0]
    assert est.noise == noise
    assert isinstance(leaf, events.PureDpEvent if noise == "discrete" else events.LaplaceDpEvent)


# ------------------------------------------------------------------ validation and keys


@pytest.mark.parametrize("bad", ["Discrete", "laplace", None, 1, "gaussian"])
def test_bad_noise_raises_naming_it(bad):
  x, y = _km_data(20), np.zeros(20, int)
  calls = [
      lambda: _nb_fit(jax.random.key(0), noise=bad),
      lambda: nb.naive_bayes_calibration(num_cat=1, num_num=1, epsilon=1.0, noise=bad),
      lambda: nb.PrivateNaiveBayes(epsilon=1.0, classes=[0, 1], noise=bad).fit(x, y),
      lambda: rt.private_random_trees(jax.random.key(0), x, y, num_classes=2, epsilon=1.0,
                                      lower=0.0, upper=1.0, noise=bad),
      lambda: rt.PrivateRandomTrees(epsilon=1.0, classes=[0, 1], noise=bad).fit(x, y),
      lambda: rt.random_trees_scale(num_trees=2, epsilon=1.0, noise=bad),
      lambda: km.dp_lloyd(jax.random.key(0), x, n_clusters=2, epsilon=1.0, lower=0.0,
                          upper=1.0, noise=bad),
      lambda: km.sample_aggregate_kmeans(jax.random.key(0), x, n_clusters=2, epsilon=1.0,
                                         lower=0.0, upper=1.0, num_blocks=4, noise=bad),
      lambda: km.lloyd_calibration(lower=0.0, upper=1.0, epsilon=1.0, iterations=2, noise=bad),
      lambda: km.PrivateKMeans(n_clusters=2, epsilon=1.0, noise=bad).fit(x),
  ]
  for call in calls:
    with pytest.raises(ValueError, match="noise must be one of"):
      call()


def test_bad_noise_raises_before_spending():
  acc = PrivacyAccountant()
  with pytest.raises(ValueError, match="noise"):
    _nb_fit(jax.random.key(0), noise="exact", accountant=acc)
  assert acc.pure_epsilon() == 0.0


def test_same_key_same_release_and_fresh_keys_differ(nb_discrete, rt_discrete, sa_discrete):
  _, a, _ = nb_discrete
  _, b, _ = _nb_fit(jax.random.key(0))
  _, c, _ = _nb_fit(jax.random.key(4))
  for u, v in zip(a, b):
    np.testing.assert_array_equal(u, v)
  assert not np.array_equal(a.num_sums, c.num_sums)
  lloyd = lambda k: km.dp_lloyd(k, X, **LLOYD)[0]
  np.testing.assert_array_equal(lloyd(jax.random.key(5)), lloyd(jax.random.key(5)))
  np.testing.assert_array_equal(_rt_fit(jax.random.key(0))[0].counts, rt_discrete[0].counts)
  assert not np.array_equal(_rt_fit(jax.random.key(6))[0].counts, rt_discrete[0].counts)
  np.testing.assert_array_equal(km.sample_aggregate_kmeans(jax.random.key(0), X, **SA)[0],
                                sa_discrete[0])


def test_discrete_counts_noise_has_the_continuous_scale():
  """Random-tree leaf noise ``counts(eps) - counts(inf)`` (same key, same structure) is discrete
  Laplace with ``E|z| = 2q/(1 - q^2)``, ``q = exp(-eps/Delta)`` (CKS 2020 Alg. 2 at t/s = Delta/eps)."""
  # 25 keys x (4 trees x 16 leaves x 2 classes) = 3200 draws
  z = np.concatenate([np.ravel(np.asarray(_rt_fit(k)[0].counts)
                               - np.asarray(_rt_fit(k, epsilon=np.inf)[0].counts))
                      for k in jax.random.split(jax.random.key(7), 25)])
  assert z.size == 3200 and np.all(z == np.round(z))
  q = math.exp(-1.0 / 2.0)
  mean_abs = 2 * q / (1 - q * q)
  sd = math.sqrt(2 * q / (1 - q) ** 2 - mean_abs**2)  # E z^2 = 2q/(1 - q)^2
  # a 20% narrower scale would move the mean by ~20%; 5.5 standard errors of the mean
  assert abs(np.mean(np.abs(z)) - mean_abs) < 5.5 * sd / math.sqrt(z.size)


def test_discrete_sums_refuse_data_beyond_the_grid_range():
  # g = 2^-10 holds |sum| < (2^30 - 64) 2^-10, about 1.05e6 rows of z = 1
  with pytest.raises(ValueError, match="noise='continuous'"):
    nb._common.check_grid_range(1.1e6, NB_GRID, "a sum")
  nb._common.check_grid_range(1.0e6, NB_GRID, "a sum")
