"""Tests of jaxdp.dpsgd.correlated.participation: cyclic Poisson (k, b) participation."""

import jax
import numpy as np
import pytest

from jaxdp.errors import BudgetExceededError
from jaxdp import dpsgd
from jaxdp.dpsgd.correlated import CyclicPoissonSampler, max_participations


def test_one_group_is_dp_sgd_poisson_sampling():
  s = CyclicPoissonSampler(500, 1, 0.1, 20, jax.random.key(0))
  for t, k in enumerate(jax.random.split(jax.random.key(1), 20)):
    np.testing.assert_array_equal(s.indices(t, k), dpsgd.poisson_sample_indices(k, 500, 0.1))
  assert s.expected_batch_size == pytest.approx(50.0)


def test_every_example_respects_k_participations_b_apart():
  n_rows, b, steps = 300, 4, 22
  s = CyclicPoissonSampler(n_rows, b, 0.7, steps, jax.random.key(2))
  seen = {i: [] for i in range(n_rows)}
  for t, k in enumerate(jax.random.split(jax.random.key(3), steps)):
    for i in s.indices(t, k):
      seen[int(i)].append(t)
  k_max = max_participations(steps, b)
  assert k_max == 6
  for i, ts in seen.items():
    assert len(ts) <= k_max
    assert all(b2 - b1 >= b for b1, b2 in zip(ts, ts[1:]))
    assert len({t % b for t in ts}) <= 1
  assert s.expected_batch_size == pytest.approx(0.7 * n_rows / b)


def test_inclusion_rate_is_p_over_b():
  n_rows, b, p, steps = 4000, 5, 0.5, 40
  s = CyclicPoissonSampler(n_rows, b, p, steps, jax.random.key(4))
  sizes = np.array([len(s.indices(t, k))
                    for t, k in enumerate(jax.random.split(jax.random.key(5), steps))])
  total, mean = sizes.sum(), steps * n_rows * p / b
  # Binomial-ish total (groups are random): 6 standard deviations of the binomial count.
  assert abs(total - mean) < 6 * np.sqrt(mean) + 4 * steps * np.sqrt(n_rows / b)


def test_steps_outside_the_schema_are_refused():
  s = CyclicPoissonSampler(50, 2, 0.5, 4, jax.random.key(0))
  with pytest.raises(BudgetExceededError, match="outside"):
    s.indices(4, jax.random.key(1))
  with pytest.raises(BudgetExceededError, match="outside"):
    s.indices(-1, jax.random.key(1))
  with pytest.raises(ValueError, match="min_separation"):
    CyclicPoissonSampler(3, 4, 0.5, 4, jax.random.key(0))
  with pytest.raises(ValueError, match="sample_rate"):
    CyclicPoissonSampler(30, 2, 1.5, 4, jax.random.key(0))


def test_chunks_are_padded_and_never_truncated():
  s = CyclicPoissonSampler(100, 2, 1.0, 3, jax.random.key(0), padded_size=8)
  chunks = s.sample(0, jax.random.key(1))
  slots = [c.slots_and_mask() for c in chunks]
  assert all(idx.shape == (8,) and mask.shape == (8,) for idx, mask in slots)
  got = np.concatenate([idx[mask] for idx, mask in slots])
  np.testing.assert_array_equal(np.sort(got), np.sort(s.indices(0, jax.random.key(1))))
  assert len(chunks) == -(-len(got) // 8)
