"""In-jit Poisson sampling from device-resident data (jaxdp/dpsgd/device_sampling.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdp.accounting import PrivacyAccountant
from jaxdp.dpsgd import device_sampling as ds
from jaxdp.dpsgd import make_private, sampling

import _linear_problem as lp

N, D, K = lp.N, lp.D, lp.K  # the plans' programs are shared with other files (_linear_problem)


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(N, D)).astype(np.float32)
  y = rng.integers(0, K, N).astype(np.int32)
  return x, y


def _plan(steps=4, physical_batch_size=None, **kw):
  return make_private(lp.loss, steps=steps, key=jax.random.key(3),
                      physical_batch_size=physical_batch_size, **lp.PLAN, **kw)


@pytest.mark.parametrize("n,q", [(1, 0.5), (203, 0.1), (1000, 0.013), (64, 1.0)])
def test_inclusion_mask_is_the_host_samplers_batch(n, q):
  for seed in range(3):
    key = jax.random.key(seed)
    mask = np.asarray(ds.inclusion_mask(key, n, q, n))
    np.testing.assert_array_equal(np.flatnonzero(mask),
                                  sampling.poisson_sample_indices(key, n, q))


def test_padding_rows_never_join_and_do_not_move_the_bits():
  key = jax.random.key(5)
  n, rows = 203, ds.padded_num_rows(203, 8)
  assert rows == 208
  padded = np.asarray(ds.inclusion_mask(key, n, 0.9, rows))
  assert not padded[n:].any()
  np.testing.assert_array_equal(padded[:n], np.asarray(ds.inclusion_mask(key, n, 0.9, n)))


def test_chunks_cover_the_sample_in_order_like_pad_and_split():
  key = jax.random.key(1)
  n, q, p = 500, 0.2, 16  # ~100 sampled rows -> ~7 chunks
  keep = ds.inclusion_mask(key, n, q, n)
  rank = jnp.cumsum(keep.astype(jnp.int32))
  host = sampling.pad_and_split(sampling.poisson_sample_indices(key, n, q), p)
  assert len(host) > 3
  for k, chunk in enumerate(host):
    idx, valid = ds.chunk_slots(rank, rank[-1], jnp.int32(k), p)
    want_idx, want_mask = chunk.slots_and_mask()
    np.testing.assert_array_equal(np.asarray(idx), want_idx)
    np.testing.assert_array_equal(np.asarray(valid), want_mask)


def _batch_sizes(n, q, keys):
  masks = jax.vmap(lambda k: ds.inclusion_mask(k, n, q, n))(keys)
  return np.asarray(masks.sum(axis=1)), np.asarray(masks.mean(axis=0))


def _check_poisson(n, q, trials):
  keys = jax.random.split(jax.random.key(11), trials)
  sizes, per_row = _batch_sizes(n, q, keys)
  q_eff = sampling.effective_sample_rate(q)
  # Batch size ~ Binomial(n, q_eff): chi-square goodness of fit on binned counts.
  lo, hi = stats.binom.ppf([1e-3, 1 - 1e-3], n, q_eff).astype(int)
  edges = np.arange(lo, hi + 2)
  observed = np.array([(sizes < lo).sum()] + [(sizes == k).sum() for k in edges[:-1]]
                      + [(sizes > hi).sum()])
  cdf = stats.binom.cdf
  expected = trials * np.array([cdf(lo - 1, n, q_eff)]
                               + [stats.binom.pmf(k, n, q_eff) for k in edges[:-1]]
                               + [1 - cdf(hi, n, q_eff)])
  keep = expected >= 5
  merged_obs = np.append(observed[keep], observed[~keep].sum())
  merged_exp = np.append(expected[keep], expected[~keep].sum())
  chi2 = ((merged_obs - merged_exp) ** 2 / np.maximum(merged_exp, 1e-12)).sum()
  assert stats.chi2.sf(chi2, len(merged_obs) - 1) > 1e-4
  # Every row joins with probability q_eff (binomial z-scores, Bonferroni over the rows).
  z = (per_row - q_eff) / np.sqrt(q_eff * (1 - q_eff) / trials)
  assert np.abs(z).max() < stats.norm.isf(1e-4 / (2 * n))
  # Independence of two rows: the joint inclusion rate is q_eff^2.
  masks = jax.vmap(lambda k: ds.inclusion_mask(k, n, q, n))(keys)
  both = float(np.mean(np.asarray(masks[:, 0] & masks[:, 1])))
  assert abs(both - q_eff ** 2) < 5 * np.sqrt(q_eff ** 2 / trials)


def test_batches_are_poisson():
  _check_poisson(200, 0.1, 4_000)


@pytest.mark.slow
def test_batches_are_poisson_large():
  _check_poisson(2_000, 0.05, 50_000)


@pytest.mark.parametrize("physical_batch_size", [None, 8])  # 8: every batch overflows
def test_device_path_equals_host_path(physical_batch_size):
  # The same batches and noise; the sums may differ in the last ulp (another XLA fusion).
  x, y = _data()
  results = []
  for device in (False, True):
    private = _plan(physical_batch_size=physical_batch_size)
    acc = PrivacyAccountant()
    w = jnp.zeros((D, K))
    state = private.init(w)
    sampler = private.sampler(acc, data=(x, y)) if device else private.sampler(acc)
    assert sampler.device_resident == device
    for _ in range(private.steps):
      batch = sampler.sample()
      w, state, info = private.step(w, state, batch if device else batch.gather(x, y))
    results.append((np.asarray(w), acc.ledger, float(info.nonprivate_num_examples)))
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6, atol=1e-7)
  assert results[0][1] == results[1][1] and results[1][1][0][1] == 4
  assert results[0][2] == results[1][2]


def test_device_batch_is_used_once_and_checked_before_the_update():
  x, y = _data()
  private = _plan()
  acc = PrivacyAccountant()
  w = jnp.zeros((D, K))
  state = private.init(w)
  sampler = private.sampler(acc, data=(x, y))
  batch = sampler.sample()
  w1, state1, _ = private.step(w, state, batch)
  with pytest.raises(ValueError, match="already used"):
    private.step(w1, state1, batch)
  with pytest.raises(ValueError, match="reuse its noise key"):
    private.step(w, state, sampler.sample())  # the old state
  # The refused batch is handed out again, not paid again.
  again = sampler.sample()
  assert again.step_index == 1 and sampler.steps_paid == 2
  private.step(w1, state1, again)
  assert acc.ledger[0][1] == 2


def test_bad_device_data_is_refused_before_any_spend():
  x, y = _data()
  acc = PrivacyAccountant()
  with pytest.raises(ValueError, match="rows"):
    _plan().sampler(acc, data=(x[:-1], y[:-1]))
  bad = x.copy()
  bad[7, 0] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    _plan().sampler(acc, data=(bad, y))
  with pytest.raises(ValueError, match="data needs 2 arrays"):
    _plan().sampler(acc, data=(x,))
  with pytest.raises(ValueError, match="mesh needs data"):
    _plan().sampler(acc, mesh=object())
  assert acc.ledger == ()
