"""User-level Poisson sampling: one clipped contribution per user, unit 'user', host == device."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.accounting import PrivacyAccountant, dpsgd_accounting, events
from jaxdp.dpsgd import device_sampling, sampling
from jaxdp.dpsgd import user_sampling as us
from jaxdp.dpsgd.clipping import ClippedGradInfo
from jaxdp.errors import ArgumentTypeError


def _sq_loss(w, xi, yi):
  return 0.5 * (xi @ w - yi) ** 2


def _np_grad(w, x, y):
  """Per-example gradients of _sq_loss in float64: (x.w - y) x."""
  return (x.astype(np.float64) @ w - y)[:, None] * x


# -- layout ----------------------------------------------------------------------------------------


def test_users_with_differing_example_counts_get_masked_rows():
  ids = np.array([5, 1, 5, 2, 2, 2, 5, 1, 9])
  rows, counts = us.user_table(ids, 4)
  # users in increasing id order 1, 2, 5, 9; rows in row order; padding = the user's first row
  assert counts.tolist() == [2, 3, 3, 1]
  assert rows.tolist() == [[1, 7, 1, 1], [3, 4, 5, 3], [0, 2, 6, 0], [8, 8, 8, 8]]
  sampler = us.UserPoissonSampler(ids, sample_rate=1.0, max_examples_per_user=4, padded_size=3)
  chunks = sampler.sample(jax.random.key(0))
  assert len(chunks) == 2 and [c.num_users for c in chunks] == [3, 1]
  assert chunks[0].mask.sum(1).tolist() == [2, 3, 3] and chunks[1].mask.sum(1).tolist() == [1, 0, 0]
  np.testing.assert_array_equal(np.sort(np.concatenate([c.indices for c in chunks])), np.arange(9))
  masked = chunks[0].gather(np.arange(9) * 10)
  assert masked.arrays[0].shape == (3, 4) and masked.mask.shape == (3, 4)
  assert masked.arrays[0][masked.mask].tolist() == [10, 70, 30, 40, 50, 0, 20, 60]


def test_excess_examples_raise_or_keep_the_first_rows():
  ids = np.array([0, 1, 0, 0, 1])
  with pytest.raises(ValueError, match="max_examples_per_user=2"):
    us.UserPoissonSampler(ids, sample_rate=0.5, max_examples_per_user=2)
  rows, counts = us.user_table(ids, 2, on_excess="truncate")
  assert rows.tolist() == [[0, 2], [1, 4]] and counts.tolist() == [2, 2]


# -- the per-user clipped sum ----------------------------------------------------------------------


def _jit(fn):
  """One compiled program per shape (op-by-op dispatch of the vmapped gradient is slower)."""
  return jax.jit(lambda w, batch: fn(w, batch))


def _batch(x, y, ids, k):
  sampler = us.UserPoissonSampler(ids, sample_rate=1.0, max_examples_per_user=k,
                                  padded_size=len(np.unique(ids)))
  chunk, = sampler.sample(jax.random.key(0))
  return chunk.gather(x, y)


def test_mean_reduction_then_clip_matches_numpy():
  rng = np.random.default_rng(1)
  ids = np.array([0, 0, 0, 1, 2, 2])
  x = rng.normal(size=(6, 3)).astype(np.float32)
  y = rng.normal(size=(6,)).astype(np.float32)
  w = np.array([0.3, -0.2, 0.1], np.float32)
  g = _np_grad(w.astype(np.float64), x, y)
  c = 0.4
  expect = 0
  for u in range(3):
    gu = g[ids == u].mean(0)
    expect = expect + gu * min(1.0, c / np.linalg.norm(gu))
  for reduction, scale in (("mean", None), ("sum", "sum")):
    fn = us.user_clipped_grad(_sq_loss, l2_clip_norm=c, batch_argnums=(1, 2), reduction=reduction)
    gsum, info = _jit(fn)(jnp.asarray(w), _batch(x, y, ids, 3))
    if scale is None:
      np.testing.assert_allclose(np.asarray(gsum), expect, rtol=1e-4, atol=1e-6)
      assert float(info.num_examples) == 3  # users
    else:
      want = sum(g[ids == u].sum(0) * min(1.0, c / np.linalg.norm(g[ids == u].sum(0)))
                 for u in range(3))
      np.testing.assert_allclose(np.asarray(gsum), want, rtol=1e-4, atol=1e-6)
  assert fn.sensitivity == c


def test_adding_a_user_with_many_examples_moves_the_sum_by_at_most_c():
  rng = np.random.default_rng(2)
  c = 0.5
  ids = np.repeat(np.arange(4), [1, 2, 3, 1])
  x = rng.normal(size=(7, 3)).astype(np.float32)
  y = rng.normal(size=(7,)).astype(np.float32)
  # The added user: 8 examples with huge gradients (the cap is what bounds shapes, not privacy).
  x_big = np.concatenate([x, 100 * rng.normal(size=(8, 3)).astype(np.float32)])
  y_big = np.concatenate([y, 1e4 * np.ones(8, np.float32)])
  ids_big = np.concatenate([ids, np.full(8, 99)])
  fn = _jit(us.user_clipped_grad(_sq_loss, l2_clip_norm=c, batch_argnums=(1, 2)))
  w = jnp.asarray([0.2, 0.1, -0.3], jnp.float32)
  without, _ = fn(w, _batch(x, y, ids, 8))
  with_user, info = fn(w, _batch(x_big, y_big, ids_big, 8))
  moved = np.linalg.norm(np.asarray(with_user, np.float64) - np.asarray(without, np.float64))
  assert 0.99 * c < moved <= c * (1 + 1e-6)
  assert int(info.num_clipped) >= 1 and float(info.num_examples) == 5


def test_a_non_finite_user_contributes_zero_and_leaves_the_others_alone():
  rng = np.random.default_rng(3)
  ids = np.array([0, 0, 1, 1, 2])
  x = rng.normal(size=(5, 3)).astype(np.float32)
  y = rng.normal(size=(5,)).astype(np.float32)
  fn = _jit(us.user_clipped_grad(_sq_loss, l2_clip_norm=1.0, batch_argnums=(1, 2)))
  w = jnp.asarray([0.2, 0.1, -0.3], jnp.float32)
  clean, _ = fn(w, _batch(x, y, ids, 2))
  x_bad = x.copy()
  x_bad[2, 0] = np.nan  # user 1's first example
  bad, info = fn(w, _batch(x_bad, y, ids, 2))
  assert np.all(np.isfinite(np.asarray(bad)))
  only_user_1 = fn(w, _batch(x[2:4], y[2:4], np.array([1, 1]), 2))[0]
  np.testing.assert_allclose(np.asarray(bad), np.asarray(clean) - np.asarray(only_user_1),
                             rtol=1e-5, atol=1e-6)
  assert float(np.asarray(info.per_example_norms)[1]) == 0.0


def test_a_huge_finite_user_gradient_is_clipped_not_dropped():
  # Entries ~3e36: their squares overflow float32, the power-of-two scaled clip does not.
  x = np.full((2, 3), 1e18, np.float32)
  y = np.zeros(2, np.float32)
  fn = _jit(us.user_clipped_grad(_sq_loss, l2_clip_norm=0.5, batch_argnums=(1, 2)))
  gsum, info = fn(jnp.ones(3, jnp.float32), _batch(x, y, np.array([4, 4]), 2))
  norm = np.linalg.norm(np.asarray(gsum, np.float64))
  assert 0.5 * (1 - 1e-5) < norm <= 0.5 and int(info.num_clipped) == 1


# -- accounting ------------------------------------------------------------------------------------


def test_event_is_dpsgd_at_the_user_rate_with_unit_user():
  ids = np.repeat(np.arange(200), 2)
  sampler = us.UserPoissonSampler(ids, expected_users_per_batch=20, max_examples_per_user=2)
  assert sampler.sample_rate == 0.1 and sampler.expected_batch_size == pytest.approx(20)
  event = sampler.event(1.1, 50)
  assert event == dpsgd_accounting.dpsgd_event(1.1, 0.1, 50, unit="user")
  assert events.leaf_tags(event) == {("add_remove", "user")}
  acc = PrivacyAccountant(unit="user")
  acc.spend(event)
  eps = sampler.epsilon(1.1, 50, 1e-5)
  assert eps == dpsgd_accounting.dpsgd_epsilon(1.1, 0.1, 50, 1e-5)
  assert acc.get_epsilon(1e-5, "rdp") == pytest.approx(eps, rel=1e-12)
  assert acc.guarantee(1e-5, "rdp").unit == "user"
  with pytest.raises(ValueError, match="unit"):
    PrivacyAccountant().spend(event)  # an example-level ledger refuses user-level events
  assert events.leaf_tags(sampler.event(1.1, 3, neighbouring="replace_one")) == {
      ("replace_one", "user")}


# -- adaptive clipping and correlated noise with user-level sampling ----------------------------------


def test_adaptive_user_clip_is_the_user_clip_in_units_of_c_with_centred_counts():
  rng = np.random.default_rng(5)
  ids = np.array([0, 0, 0, 1, 2, 2, 3])
  x = rng.normal(size=(7, 3)).astype(np.float32)
  y = rng.normal(size=(7,)).astype(np.float32)
  w = np.array([0.3, -0.2, 0.1], np.float32)
  g = _np_grad(w.astype(np.float64), x, y)
  gu = [g[ids == u].mean(0) for u in range(4)]
  c = float(np.median([np.linalg.norm(v) for v in gu]))  # some users clipped, some not
  fn = jax.jit(lambda w, batch, c: us.adaptive_user_clipped_grad(
      _sq_loss, c, batch_argnums=(1, 2))(w, batch))
  gsum, info = fn(jnp.asarray(w), _batch(x, y, ids, 3), jnp.float32(c))
  want = sum(v * min(1.0, c / np.linalg.norm(v)) for v in gu) / c
  np.testing.assert_allclose(np.asarray(gsum), want, rtol=1e-4, atol=1e-6)
  clipped = sum(np.linalg.norm(v) > c for v in gu)
  assert int(info.num_clipped) == clipped and float(info.num_examples) == 4
  np.testing.assert_allclose(np.asarray(info.per_example_norms),
                             [np.linalg.norm(v) / c for v in gu], rtol=1e-4)
  assert us.adaptive_user_clipped_grad(_sq_loss, 0.5).sensitivity == 1.0
  # A non-finite user contributes exactly zero and counts as clipped (b_u = 0).
  x_bad = x.copy()
  x_bad[3, 0] = np.nan  # user 1 (one example)
  bad, info_bad = fn(jnp.asarray(w), _batch(x_bad, y, ids, 3), jnp.float32(c))
  others = sum(v * min(1.0, c / np.linalg.norm(v)) for u, v in enumerate(gu) if u != 1) / c
  np.testing.assert_allclose(np.asarray(bad), others, rtol=1e-4, atol=1e-6)
  assert int(info_bad.num_clipped) == clipped + (np.linalg.norm(gu[1]) <= c)
  with pytest.raises(ValueError, match="clip_norm"):
    us.adaptive_user_clipped_grad(_sq_loss, 1e-50)


def test_adaptive_user_event_is_dpsgd_at_the_joint_multiplier_with_unit_user():
  from dp_accounting.rdp import rdp_privacy_accountant  # pylint: disable=g-import-not-at-top
  import dp_accounting  # pylint: disable=g-import-not-at-top
  from jaxdp.dpsgd import adaptive_clipping  # pylint: disable=g-import-not-at-top
  sampler = us.UserPoissonSampler(np.repeat(np.arange(500), 2), sample_rate=0.05,
                                  max_examples_per_user=2)
  sd, sigma_b, t = 1.02, 3.0, 200
  joint = (sd ** -2 + 1 / (2 * sigma_b) ** 2) ** -0.5  # Andrew et al. 2021, Thm 1
  event = sampler.adaptive_event(sd, sigma_b, t)
  assert event == dpsgd_accounting.dpsgd_event(joint, 0.05, t, unit="user")
  assert events.leaf_tags(event) == {("add_remove", "user")}
  direct = rdp_privacy_accountant.RdpAccountant()
  direct.compose(dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(joint)),
                 t)
  acc = PrivacyAccountant(unit="user")
  acc.spend(event)
  assert acc.get_epsilon(1e-5, "rdp") == pytest.approx(direct.get_epsilon(1e-5), rel=1e-9)
  replace = sampler.adaptive_event(sd, sigma_b, t, neighbouring="replace_one")
  assert replace.event.event.noise_multiplier == pytest.approx(joint / 2, rel=1e-12)
  assert events.leaf_tags(replace) == {("replace_one", "user")}
  assert sampler.adaptive_gradient_noise_multiplier(joint, sigma_b) == pytest.approx(sd,
                                                                                     rel=1e-9)
  assert sampler.adaptive_gradient_noise_multiplier(1.0, sigma_b, num_counts=2) == (
      adaptive_clipping.gradient_noise_multiplier(1.0, sigma_b, participations=2))


def test_correlated_noise_over_users_is_mf_event_at_one_group_and_the_user_rate():
  from jaxdp.dpsgd import correlated  # pylint: disable=g-import-not-at-top
  sampler = us.UserPoissonSampler(np.arange(300), sample_rate=0.1, max_examples_per_user=1)
  strategy = correlated.BandMF(np.array([1.0, 0.5]))
  for relation in ("add_remove", "replace_one"):
    assert sampler.mf_event(strategy, 3.0, 12, neighbouring=relation) == correlated.mf_event(
        strategy, noise_multiplier=3.0, num_steps=12, min_separation=1, sample_rate=0.1,
        unit="user", neighbouring=relation)
  assert sampler.mf_event(correlated.BandMF.dp_sgd(), 3.0, 12) == sampler.event(3.0, 12)
  sigma = sampler.calibrate_mf_noise_multiplier(strategy, 4.0, 1e-5, 12)
  assert sampler.mf_epsilon(strategy, sigma, 12, 1e-5) <= 4.0
  assert sampler.adaptive_gradient_noise_multiplier(3.0, 20.0, noise_strategy=strategy,
                                                    steps=12) == (
      correlated.accounting.adaptive_gradient_noise_multiplier(
          strategy, noise_multiplier=3.0, count_noise_multiplier=20.0, num_steps=12,
          min_separation=1, sample_rate=0.1))
  with pytest.raises(ValueError, match="steps"):
    sampler.adaptive_gradient_noise_multiplier(3.0, 20.0, noise_strategy=strategy)
  with pytest.raises(ValueError, match="num_counts"):
    sampler.adaptive_gradient_noise_multiplier(3.0, 20.0, noise_strategy=strategy, steps=12,
                                               num_counts=2)


def test_device_user_sum_with_a_clip_norm_per_step_checks_its_arguments():
  ids = np.repeat(np.arange(6), 2)
  sampler = us.UserPoissonSampler(ids, sample_rate=0.5, max_examples_per_user=2, padded_size=3)
  placed, key = sampler.place_data((np.ones((12, 2), np.float32),)), jax.random.key(0)
  make = lambda c: (lambda p, m: _row_sum(p, m))
  with pytest.raises(ValueError, match="clip_norm is required"):
    sampler.device_clipped_sum_fn(make_grad_fn=make)(jnp.float32(1.0), key, placed)
  with pytest.raises(ValueError, match="exactly one"):
    sampler.device_clipped_sum_fn(_row_sum, make_grad_fn=make)


@pytest.mark.slow
def test_device_adaptive_user_sum_equals_the_host_chunks():
  rng = np.random.default_rng(6)
  ids = np.repeat(np.arange(10), np.arange(10) % 3 + 1)
  n = ids.shape[0]
  x = rng.normal(size=(n, 3)).astype(np.float32)
  y = rng.normal(size=(n,)).astype(np.float32)
  sampler = us.UserPoissonSampler(ids, sample_rate=0.6, max_examples_per_user=3, padded_size=4)
  make = lambda c: us.adaptive_user_clipped_grad(_sq_loss, c, batch_argnums=(1, 2))
  w, key, c = jnp.asarray([0.2, -0.1, 0.3], jnp.float32), jax.random.key(2), jnp.float32(0.3)
  host = sum(np.asarray(make(c)(w, chunk.gather(x, y))[0]) for chunk in sampler.sample(key))
  fn = jax.jit(lambda w, k, d, c: sampler.device_clipped_sum_fn(make_grad_fn=make)(
      w, k, d, clip_norm=c))
  gsum, (_, num_users, _) = fn(w, key, sampler.place_data((x, y)), c)
  np.testing.assert_allclose(np.asarray(gsum), host, rtol=1e-5, atol=1e-6)
  assert float(num_users) == sum(chunk.num_users for chunk in sampler.sample(key))


# -- host == device --------------------------------------------------------------------------------


def _row_sum(params, masked):
  """A stand-in for user_clipped_grad (cheap to compile): params times the masked row sum."""
  (rows,), mask = masked.arrays, masked.mask.astype(jnp.float32)
  users = jnp.sum(jnp.any(masked.mask, axis=1).astype(jnp.float32))
  return (params * jnp.einsum("pk,pkd->d", mask, rows),
          ClippedGradInfo(users, mask, jnp.zeros((), jnp.int32), users))


def test_device_batch_equals_host_batch_for_the_same_key():
  ids = np.repeat(np.arange(30), np.arange(30) % 4 + 1)  # 1 to 4 examples per user
  n = ids.shape[0]
  x = np.arange(n, dtype=np.float32)[:, None] * np.array([[1.0, 1000.0]], np.float32)
  sampler = us.UserPoissonSampler(ids, sample_rate=0.4, max_examples_per_user=4, padded_size=5)
  fn = jax.jit(sampler.device_clipped_sum_fn(_row_sum))
  placed = sampler.place_data((x,))
  mask_fn = jax.jit(lambda k: device_sampling.inclusion_mask(k, 30, 0.4, 30))
  for seed in range(2):
    key = jax.random.key(seed)
    chunks = sampler.sample(key)
    host_users = np.concatenate([c.users for c in chunks])
    np.testing.assert_array_equal(host_users, np.flatnonzero(np.asarray(mask_fn(key))))
    np.testing.assert_array_equal(host_users, sampling.poisson_sample_indices(key, 30, 0.4))
    host = sum(x[c.indices].sum(0) for c in chunks)
    gsum, (_, num_users, _) = fn(jnp.float32(1.0), key, placed)
    np.testing.assert_array_equal(np.asarray(gsum), host)
    assert float(num_users) == host_users.size


@pytest.mark.slow
def test_user_clipped_sum_host_chunks_equal_device_path():
  rng = np.random.default_rng(4)
  ids = np.repeat(np.arange(12), np.arange(12) % 3 + 1)
  n = ids.shape[0]
  x = rng.normal(size=(n, 3)).astype(np.float32)
  y = rng.normal(size=(n,)).astype(np.float32)
  fn = us.user_clipped_grad(_sq_loss, l2_clip_norm=0.3, batch_argnums=(1, 2))
  sampler = us.UserPoissonSampler(ids, sample_rate=0.5, max_examples_per_user=3, padded_size=3)
  w, key = jnp.asarray([0.2, 0.1, -0.3], jnp.float32), jax.random.key(8)
  host = sum(np.asarray(fn(w, c.gather(x, y))[0]) for c in sampler.sample(key))
  gsum, _ = jax.jit(sampler.device_clipped_sum_fn(fn))(w, key, sampler.place_data((x, y)))
  np.testing.assert_allclose(np.asarray(gsum), host, rtol=1e-5, atol=1e-6)


# -- argument checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("user_ids,error,match", [
    (np.array([0.0, 1.0]), ArgumentTypeError, "user_ids"),
    (np.array(["a", "b"]), ArgumentTypeError, "user_ids"),
    (np.array([True, False]), ArgumentTypeError, "user_ids"),
    (np.zeros((2, 2), np.int32), ValueError, "user_ids"),
    (np.zeros((0,), np.int32), ValueError, "user_ids"),
])
def test_bad_user_ids_are_refused_naming_them(user_ids, error, match):
  with pytest.raises(error, match=match):
    us.UserPoissonSampler(user_ids, sample_rate=0.5, max_examples_per_user=2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(sample_rate=0.0), "sample_rate"),
    (dict(sample_rate=1.5), "sample_rate"),
    (dict(), "exactly one"),
    (dict(sample_rate=0.5, expected_users_per_batch=1), "exactly one"),
    (dict(expected_users_per_batch=5), "expected_batch_size"),  # > U = 3 users
    (dict(sample_rate=0.5, max_examples_per_user=0), "max_examples_per_user"),
    (dict(sample_rate=0.5, on_excess="drop"), "on_excess"),
    (dict(sample_rate=0.5, padded_size=0), "padded_size"),
])
def test_bad_sampler_arguments_are_refused_naming_them(kwargs, match):
  kwargs = dict(dict(max_examples_per_user=2), **kwargs)
  with pytest.raises(ValueError, match=match):
    us.UserPoissonSampler(np.array([0, 1, 1, 2]), **kwargs)


def test_bad_clipped_grad_arguments_and_batches_are_refused():
  with pytest.raises(ValueError, match="reduction"):
    us.user_clipped_grad(_sq_loss, l2_clip_norm=1.0, reduction="max")
  with pytest.raises(ValueError, match="l2_clip_norm"):
    us.user_clipped_grad(_sq_loss, l2_clip_norm=0.0)
  fn = us.user_clipped_grad(_sq_loss, l2_clip_norm=1.0, batch_argnums=(1, 2))
  w = jnp.zeros(3)
  x, y = np.zeros((4, 3), np.float32), np.zeros(4, np.float32)
  per_example = sampling.pad_and_split(np.arange(4), 4)[0].gather(x, y)
  with pytest.raises(ValueError, match="two leading axes"):
    fn(w, per_example)
  with pytest.raises(ValueError, match="mask"):
    fn(w, x.reshape(2, 2, 3), y.reshape(2, 2))
  with pytest.raises(ArgumentTypeError, match="key"):
    us.UserPoissonSampler(np.array([0, 1]), sample_rate=0.5, max_examples_per_user=1).sample(3)


_MESH_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jaxdp.dpsgd import make_data_mesh
    from jaxdp.dpsgd import user_sampling as us
    assert len(jax.devices()) == 2
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(13), np.arange(13) % 3 + 1)
    x = rng.normal(size=(ids.size, 3)).astype(np.float32)
    y = rng.normal(size=(ids.size,)).astype(np.float32)
    fn = us.user_clipped_grad(lambda w, a, b: 0.5 * (a @ w - b) ** 2, l2_clip_norm=0.3,
                              batch_argnums=(1, 2))
    s = us.UserPoissonSampler(ids, sample_rate=0.5, max_examples_per_user=3)
    mesh = make_data_mesh(2)
    key, w = jax.random.key(9), jnp.asarray([0.2, 0.1, -0.3], jnp.float32)
    one = jax.jit(s.device_clipped_sum_fn(fn))(w, key, s.place_data((x, y)))
    two = jax.jit(s.device_clipped_sum_fn(fn, mesh=mesh, physical_batch_size=4))(
        w, key, s.place_data((x, y), mesh))
    np.testing.assert_allclose(np.asarray(one[0]), np.asarray(two[0]), rtol=1e-5, atol=1e-6)
    assert float(one[1][1]) == float(two[1][1])
    print("OK")
""")


@pytest.mark.slow
def test_mesh_of_two_devices_samples_the_same_users():
  env = dict(os.environ)
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
  out = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300, check=False)
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


def test_doctests():
  import doctest  # pylint: disable=g-import-not-at-top
  result = doctest.testmod(us)
  assert result.attempted > 0 and result.failed == 0
