"""Tests of Poisson sampling with static padding (the accountant's sampling model)."""

import contextlib

import jax
import numpy as np
import pytest
from scipy import stats

from jaxdp.dpsgd import sampling


def test_padded_size_is_binomial_tail_bound():
  for n, q, p in [(60_000, 256 / 60_000, 1e-9), (1000, 0.05, 1e-6), (50, 0.5, 1e-3)]:
    k = sampling.padded_batch_size(n, q, p)
    assert stats.binom.sf(k, n, q) <= p
    assert stats.binom.sf(k - 1, n, q) > p  # smallest such k
  assert sampling.padded_batch_size(60_000, 256 / 60_000, 1e-9, multiple_of=8) % 8 == 0
  assert sampling.padded_batch_size(10, 1.0) == 10


def test_poisson_sample_statistics():
  n, q, reps = 2000, 0.03, 300
  keys = jax.random.split(jax.random.key(0), reps)
  sizes, counts, samples = [], np.zeros(n), []
  for k in keys:
    idx = sampling.poisson_sample_indices(k, n, q)
    samples.append(idx)
    sizes.append(len(idx))
    counts[idx] += 1
  sizes = np.asarray(sizes)
  # Binomial(N, q): mean 60, sd 7.63; the mean of 300 draws has s.e. 0.44.
  assert abs(sizes.mean() - n * q) < 4 * np.sqrt(n * q * (1 - q) / reps)
  np.testing.assert_allclose(sizes.var(ddof=1), n * q * (1 - q), rtol=0.25)
  # Each example is included independently w.p. q: overall frequency and a chi-square check.
  freq = counts / reps
  assert abs(freq.mean() - q) < 0.002
  chi2 = np.sum((counts - reps * q) ** 2 / (reps * q * (1 - q)))
  assert stats.chi2.sf(chi2, n) > 1e-4
  # Pairwise independence (the accountant needs independent Bernoulli(q) per example, not
  # just the right marginals): adjacent pairs co-occur in ~ reps * (n-1) * q^2 = 540 draws
  # (sd ~ 23); block/contiguous or fixed-size samplers with the same marginals give far more
  # or fewer.
  masks = np.zeros((reps, n), bool)
  for r, idx in enumerate(samples):
    masks[r, idx] = True
  co = int(np.sum(masks[:, 1:] & masks[:, :-1]))
  expected = reps * (n - 1) * q * q
  assert abs(co - expected) < 5 * np.sqrt(expected), (co, expected)
  # Same key, same sample.
  np.testing.assert_array_equal(sampling.poisson_sample_indices(keys[0], n, q),
                                sampling.poisson_sample_indices(keys[0], n, q))


@contextlib.contextmanager
def _xla_optimisations_on():
  """Compile with XLA's optimiser for a test whose cost is running, not compiling.

  tests/conftest.py turns the optimiser off (the suite is dominated by compiling small
  programs); 160M random draws run 2.6x faster optimised. Results do not depend on it.
  """
  old = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", False)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", old)


def test_inclusion_probability_never_exceeds_q():
  # The accountant is told q; sampling must not include examples more often. A float32
  # uniform compared with q (jax.random.bernoulli) rounds q UP to the 2^-23 grid.
  for q in (256 / 60_000, 0.03, 1e-5, 6.02e-8, 0.999999):
    q_eff = sampling.effective_sample_rate(q)
    assert q - 2.0 ** -32 < q_eff <= q, (q, q_eff)
  assert sampling.effective_sample_rate(1.0) == 1.0
  assert sampling.poisson_sample_indices(jax.random.key(0), 7, 1.0).tolist() == list(range(7))
  # Empirically: 160M draws at q = 0.1 * 2^-23 expect 1.9 inclusions; a float32 uniform
  # compared with q (the 2^-23 grid) includes with probability 2^-23 (10x): ~19.
  q = 0.1 * 2.0 ** -23
  with _xla_optimisations_on():
    total = sum(sampling.poisson_sample_indices(k, 4_000_000, q).size
                for k in jax.random.split(jax.random.key(1), 40))
  assert total <= 10, total


def test_pad_split_raise_and_empty():
  idx = np.arange(23, dtype=np.int32) * 3
  chunks = sampling.pad_and_split(idx, 10)
  assert len(chunks) == 3 and all(c.padded_indices.shape == (10,) for c in chunks)
  got = np.concatenate([c.padded_indices[c.mask] for c in chunks])
  np.testing.assert_array_equal(np.concatenate([c.indices for c in chunks]), idx)
  np.testing.assert_array_equal(got, idx)  # every sampled example exactly once
  assert sum(c.num_examples for c in chunks) == 23
  with pytest.raises(sampling.BatchOverflowError):
    sampling.pad_and_split(idx, 10, on_overflow="raise")
  (empty,) = sampling.pad_and_split(np.zeros(0, np.int32), 10)
  assert empty.num_examples == 0 and empty.padded_indices.shape == (10,) and empty.indices.shape == (0,)
  with pytest.raises(ValueError, match="on_overflow"):
    sampling.pad_and_split(idx, 10, on_overflow="truncate")


def test_sampler():
  s = sampling.PoissonSampler(1000, 0.1, overflow_prob=1e-6)
  assert s.expected_batch_size == pytest.approx(100.0)
  assert s.padded_size == sampling.padded_batch_size(1000, 0.1, 1e-6)
  chunks = s.sample(jax.random.key(1))
  assert len(chunks) == 1 and chunks[0].padded_indices.shape == (s.padded_size,)
  small = sampling.PoissonSampler(1000, 0.1, padded_size=16)
  assert len(small.sample(jax.random.key(1))) >= 5  # ~100 examples in chunks of 16
  for bad in [dict(sample_rate=0.0), dict(sample_rate=1.5)]:
    with pytest.raises(ValueError, match="sample_rate"):
      sampling.PoissonSampler(1000, **bad)
  with pytest.raises(ValueError, match="padded_size"):
    sampling.PoissonSampler(1000, 0.1, padded_size=10, multiple_of=4)
  with pytest.raises(ValueError, match="overflow_prob"):
    sampling.padded_batch_size(1000, 0.1, overflow_prob=0.0)


def test_overflow_probability_and_abort_delta():
  # p = Pr[Binomial(N + 1, q) > P]: the abort probability under the data set or any
  # add/remove neighbour (at most N + 1 examples), exact in float64.
  for n, q, pad in [(400, 0.1, 80), (60_000, 256 / 60_000, 300), (1000, 0.05, 60), (50, 0.5, 20)]:
    p = sampling.overflow_probability(n, q, pad)
    assert p == stats.binom.sf(pad, n + 1, q)
    assert p >= stats.binom.sf(pad, n, q)
    s = sampling.PoissonSampler(n, q, padded_size=pad, on_overflow="raise")
    assert s.overflow_probability == p
  assert sampling.overflow_probability(100, 0.1, 101) == 0.0
  # (1 + e^eps) * steps * p (coupling of the aborting and the exact mechanism).
  assert sampling.abort_delta(1e-12, 100, 2.0) == pytest.approx((1 + np.exp(2.0)) * 100 * 1e-12,
                                                                rel=1e-15)
  assert sampling.abort_delta(0.0, 100, 2.0) == 0.0
  assert sampling.abort_delta(1e-12, 10, 1e4) == float("inf")
  with pytest.raises(ValueError, match="overflow_prob_per_step"):
    sampling.abort_delta(1.5, 10, 1.0)
  with pytest.raises(ValueError, match="epsilon"):
    sampling.abort_delta(0.1, 10, -1.0)


def test_padded_batch_indices_exclude_padding_and_gather():
  (chunk,) = sampling.pad_and_split(np.array([5, 2, 9], np.int32), 8)
  np.testing.assert_array_equal(chunk.indices, [5, 2, 9])
  assert chunk.padded_indices.shape == (8,) and chunk.num_examples == 3
  x = np.arange(40.0).reshape(10, 4)
  y = np.arange(10)
  batch = chunk.gather(x, y)
  assert isinstance(batch, sampling.MaskedBatch)
  np.testing.assert_array_equal(batch.arrays[0][:3], x[[5, 2, 9]])
  np.testing.assert_array_equal(batch.mask, chunk.mask)
  assert batch.arrays[1].shape == (8,)
  with pytest.raises(ValueError, match="gather"):
    chunk.gather()
  # A pytree: leaves are the arrays and the mask.
  assert len(jax.tree.leaves(batch)) == 3
