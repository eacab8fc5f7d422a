"""Fixed-size batches without replacement: exact uniform subsets, host == device, replace-one RDP."""

import itertools
import math
import os
import subprocess
import sys
import textwrap

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats

from jaxdp.accounting import PrivacyAccountant, dpsgd_accounting, events
from jaxdp.accounting.accountant import UnsupportedEventError
from jaxdp.dpsgd import adaptive_clipping, clipped_grad, correlated
from jaxdp.dpsgd.clipping import ClippedGradInfo
from jaxdp.dpsgd import fixed_size_sampling as fss
from jaxdp.errors import ArgumentTypeError

REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE


def _direct_rdp_epsilon(event, delta):
  acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=REPLACE_ONE)
  acc.compose(event)
  return acc.get_epsilon(delta)


# -- accounting ------------------------------------------------------------------------------------


def _renyi_2d(alpha, mean_p, mean_q, stds):
  """D_alpha(N(mean_p, diag(stds^2)) || N(mean_q, ...)) by quadrature on a 2-D grid (no formula)."""
  from scipy import special  # pylint: disable=g-import-not-at-top
  axes, logp, logq = [], 0.0, 0.0
  for i, (mp, mq, s) in enumerate(zip(mean_p, mean_q, stds)):
    grid = np.linspace(min(mp, mq) - 14 * s, max(mp, mq) + 14 * s, 501)
    axes.append(grid)
    shape = [1, 1]
    shape[i] = -1
    logp = logp + stats.norm.logpdf(grid, mp, s).reshape(shape)  # the 2-D grid by broadcasting
    logq = logq + stats.norm.logpdf(grid, mq, s).reshape(shape)
  cell = (axes[0][1] - axes[0][0]) * (axes[1][1] - axes[1][0])
  return float((special.logsumexp(alpha * logp + (1 - alpha) * logq) + np.log(cell))
               / (alpha - 1))


def test_adaptive_split_replace_one_pair_has_the_renyi_curve_of_the_event():
  # Andrew et al. 2021 Thm 1 under replace-one: the worst pair moves the normalised clipped
  # gradient from +u to -u (distance 2; project on u, the other coordinates are identical) and
  # the centred bit from +1/2 to -1/2 (distance 1). With sigma_Delta from the add/remove split
  # the pair's Renyi divergence is that of Gaussian(sigma / 2), the event's inner Gaussian
  # (dp_accounting's RDP of GaussianDpEvent(z) is alpha / (2 z^2)); add/remove gives sigma.
  sigma, sigma_b = 1.2, 0.9
  sd = adaptive_clipping.gradient_noise_multiplier(sigma, sigma_b)
  event = fss.adaptive_dpsgd_event(100, 10, gradient_noise_multiplier=sd,
                                   count_noise_multiplier=sigma_b)
  z = event.event.event.noise_multiplier
  assert z == pytest.approx(sigma / 2, rel=1e-9)
  for alpha in (2.0, 5.0):
    replace = _renyi_2d(alpha, (1.0, 0.5), (-1.0, -0.5), (sd, sigma_b))
    assert replace == pytest.approx(alpha / (2 * z ** 2), rel=1e-6)
    add_remove = _renyi_2d(alpha, (1.0, 0.5), (0.0, 0.0), (sd, sigma_b))
    assert add_remove == pytest.approx(alpha / (2 * sigma ** 2), rel=1e-6)
    assert replace == pytest.approx(4 * add_remove, rel=1e-6)  # both blocks double


_ADAPTIVE = dict(n=2_000, b=50, t=40, sd=1.05, sigma_b=2.5, groups=3)


def _adaptive_event_and_explicit_twin():
  """The sampler's adaptive event and the dp_accounting event written out by hand."""
  a = _ADAPTIVE
  # Whitened replace-one sensitivity 2 sqrt(sd^-2 + G (2 sigma_b)^-2): Gaussian(joint / 2).
  half_joint = 0.5 * (a["sd"] ** -2 + a["groups"] / (2 * a["sigma_b"]) ** 2) ** -0.5
  explicit = dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
      a["n"], a["b"], dp_accounting.GaussianDpEvent(half_joint)), a["t"])
  event = fss.FixedSizeSampler(a["n"], a["b"]).adaptive_event(a["sd"], a["sigma_b"], a["t"],
                                                              num_counts=a["groups"])
  return event, explicit


def test_adaptive_event_is_the_fixed_size_event_at_the_joint_multiplier():
  a = _ADAPTIVE
  event, explicit = _adaptive_event_and_explicit_twin()
  sigma = adaptive_clipping.joint_noise_multiplier(a["sd"], a["sigma_b"],
                                                   participations=a["groups"])
  assert event == dpsgd_accounting.fixed_size_dpsgd_event(sigma, a["n"], a["b"], a["t"])
  assert events.leaf_tags(event) == {("replace_one", "example")}
  inner = event.event
  assert (inner.source_dataset_size, inner.sample_size, event.count) == (
      explicit.event.source_dataset_size, explicit.event.sample_size, explicit.count)
  assert inner.event.noise_multiplier == pytest.approx(explicit.event.event.noise_multiplier,
                                                       rel=1e-12)
  # The split inverts: the multiplier make_private calibrates gives back sigma_Delta.
  sampler = fss.FixedSizeSampler(a["n"], a["b"])
  assert sampler.adaptive_gradient_noise_multiplier(sigma, a["sigma_b"],
                                                    num_counts=a["groups"]) == (
      pytest.approx(a["sd"], rel=1e-9))


@pytest.mark.slow
def test_adaptive_event_epsilon_is_dp_accounting_of_the_explicit_event():
  event, explicit = _adaptive_event_and_explicit_twin()
  acc = PrivacyAccountant()
  acc.spend(event)
  assert acc.get_epsilon(1e-5, "rdp") == pytest.approx(_direct_rdp_epsilon(explicit, 1e-5),
                                                       rel=1e-12)


def test_adaptive_event_refuses_add_remove_and_a_count_noise_too_small():
  with pytest.raises(ValueError, match="replace_one"):
    fss.adaptive_dpsgd_event(100, 10, gradient_noise_multiplier=1.0, count_noise_multiplier=5.0,
                             neighbouring="add_remove")
  sampler = fss.FixedSizeSampler(100, 10)
  with pytest.raises(ValueError, match="count_noise_multiplier"):
    sampler.adaptive_gradient_noise_multiplier(1.0, 0.4)  # 2 sigma_b <= sigma
  with pytest.raises(ValueError, match="gradient_noise_multiplier"):
    sampler.adaptive_event(0.0, 5.0)
  with pytest.raises(ValueError, match="steps"):
    sampler.adaptive_gradient_noise_multiplier(1.0, 5.0, noise_strategy=correlated.BandMF.dp_sgd())


def test_correlated_noise_methods_are_the_fixed_size_mf_functions():
  strategy = correlated.BandMF(np.array([1.0, 0.5]))
  sampler = fss.FixedSizeSampler(400, 20)
  event = sampler.mf_event(strategy, 4.0, 10)
  assert event == correlated.accounting.fixed_size_mf_event(
      strategy, noise_multiplier=4.0, num_steps=10, num_examples=400, batch_size=20)
  assert sampler.mf_epsilon(strategy, 4.0, 10, 1e-5) == correlated.accounting.fixed_size_mf_epsilon(
      strategy, noise_multiplier=4.0, num_steps=10, num_examples=400, batch_size=20, delta=1e-5)
  sigma = sampler.calibrate_mf_noise_multiplier(strategy, 3.0, 1e-5, 10)
  assert sampler.mf_epsilon(strategy, sigma, 10, 1e-5) <= 3.0
  assert sampler.adaptive_gradient_noise_multiplier(4.0, 30.0, noise_strategy=strategy,
                                                    steps=10) == (
      correlated.accounting.fixed_size_adaptive_gradient_noise_multiplier(
          strategy, noise_multiplier=4.0, count_noise_multiplier=30.0, num_steps=10,
          num_examples=400, batch_size=20))
  with pytest.raises(ValueError, match="replace_one"):
    sampler.mf_event(strategy, 4.0, 10, neighbouring="add_remove")


def test_event_epsilon_equals_dp_accounting_computed_directly():
  z, n, b, t, delta = 1.1, 60_000, 256, 1_000, 1e-5
  event = dpsgd_accounting.fixed_size_dpsgd_event(z, n, b, t)
  inner = event.event
  assert isinstance(inner, events.SampledWithoutReplacementDpEvent)
  assert (inner.source_dataset_size, inner.sample_size, event.count) == (n, b, t)
  assert inner.event.noise_multiplier == z / 2  # noise over the replace-one sensitivity 2C
  assert events.leaf_tags(event) == {("replace_one", "example")}
  direct = _direct_rdp_epsilon(dp_accounting.SelfComposedDpEvent(
      dp_accounting.SampledWithoutReplacementDpEvent(n, b, dp_accounting.GaussianDpEvent(z / 2)),
      t), delta)
  acc = PrivacyAccountant()
  acc.spend(event)
  assert acc.neighbouring == "replace_one"
  assert acc.get_epsilon(delta, "rdp") == direct  # fixed_size_dpsgd_epsilon: the next test


def test_full_batch_is_the_gaussian_of_replace_one_sensitivity_2c():
  # B = N: no sampling; the sum of N clipped gradients has replace-one sensitivity 2C, and
  # noise z C is the Gaussian mechanism with noise multiplier z / 2, T times.
  z, n, t, delta = 3.0, 50, 20, 1e-6
  eps = dpsgd_accounting.fixed_size_dpsgd_epsilon(z, n, n, t, delta)
  gaussian = _direct_rdp_epsilon(dp_accounting.SelfComposedDpEvent(
      dp_accounting.GaussianDpEvent(z / 2), t), delta)
  assert eps == pytest.approx(gaussian, rel=1e-12)
  # Mirrors DP-SGD's replace-one Poisson event at q = 1 (Gaussian(z / 2) as well).
  assert dpsgd_accounting.dpsgd_event(z, 1.0, t, neighbouring="replace_one").event.event == (
      dpsgd_accounting.fixed_size_dpsgd_event(z, n, n, t).event.event)


def test_pld_and_mixed_ledgers_are_refused_with_a_clear_message():
  event = dpsgd_accounting.fixed_size_dpsgd_event(1.0, 100, 10, 5)
  acc = PrivacyAccountant()
  acc.spend(event)
  with pytest.raises(UnsupportedEventError, match="method='rdp'"):
    acc.get_epsilon(1e-5, "pld")
  for method in ("zcdp", "basic"):
    with pytest.raises(UnsupportedEventError):
      acc.get_epsilon(1e-5, method)
  with pytest.raises(ValueError, match="accountant='rdp'"):
    dpsgd_accounting.fixed_size_dpsgd_epsilon(1.0, 100, 10, 5, 1e-5, accountant="pld")
  with pytest.raises(ValueError, match="accountant='rdp'"):
    dpsgd_accounting.calibrate_fixed_size_noise_multiplier(1.0, 1e-5, 100, 10, 5, "pld")
  # A replace-one relation only: an add/remove ledger refuses the event.
  with pytest.raises(ValueError, match="replace_one"):
    PrivacyAccountant(neighbouring="add_remove").spend(event)
  # Poisson (PLD only) and fixed-size (RDP only) on one ledger: no method bounds both.
  acc.spend(dpsgd_accounting.dpsgd_event(1.0, 0.1, 5, neighbouring="replace_one"))
  for method in ("rdp", "pld"):
    with pytest.raises(UnsupportedEventError):
      acc.get_epsilon(1e-5, method)
  assert acc.get_epsilon(1e-5) == math.inf


@pytest.mark.slow
def test_calibration_meets_the_target_tightly():
  n, b, t, delta, target = 60_000, 256, 1_000, 1e-5, 3.0
  z = dpsgd_accounting.calibrate_fixed_size_noise_multiplier(target, delta, n, b, t, tol=1e-3)
  eps = dpsgd_accounting.fixed_size_dpsgd_epsilon(z, n, b, t, delta)
  assert eps <= target
  assert eps == _direct_rdp_epsilon(dp_accounting.SelfComposedDpEvent(
      dp_accounting.SampledWithoutReplacementDpEvent(n, b, dp_accounting.GaussianDpEvent(z / 2)),
      t), delta)
  assert dpsgd_accounting.fixed_size_dpsgd_epsilon(z - 0.01, n, b, t, delta) > target
  sampler = fss.FixedSizeSampler(n, b)
  assert sampler.calibrate_noise_multiplier(target, delta, t) == z  # memoised, same answer


# -- the sampler -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n,b,p", [(10, 4, None), (1000, 37, 16), (5, 5, None), (7, 1, 3)])
def test_sampler_returns_exactly_b_distinct_rows(n, b, p):
  sampler = fss.FixedSizeSampler(n, b, padded_size=p)
  assert sampler.expected_batch_size == b and sampler.sample_rate == b / n
  for seed in range(3):
    chunks = sampler.sample(jax.random.key(seed))
    assert len(chunks) == sampler.num_chunks == -(-b // sampler.padded_size)
    assert all(c.mask.shape == (sampler.padded_size,) for c in chunks)
    rows = np.concatenate([c.indices for c in chunks])
    assert rows.shape == (b,) and len(set(rows.tolist())) == b
    assert np.all(np.diff(rows) > 0) and rows.min() >= 0 and rows.max() < n


def test_host_equals_device_for_the_same_key_with_padding_rows():
  n, b = 300, 40
  mask_fn = jax.jit(lambda k: fss.inclusion_mask(k, n, b, n + 5))
  for seed in range(5):
    key = jax.random.key(seed)
    host = fss.sample_indices(key, n, b)
    device = np.flatnonzero(np.asarray(mask_fn(key)))
    np.testing.assert_array_equal(host, device)


def _subset_counts(masks, n):
  index = {s: i for i, s in enumerate(itertools.combinations(range(n), 2))}
  counts = np.zeros(len(index))
  for m in np.asarray(masks):
    counts[index[tuple(np.flatnonzero(m))]] += 1
  return counts


def test_subsets_are_uniform_chi_square():
  n, b, draws = 6, 2, 3000
  keys = jax.random.split(jax.random.key(11), draws)
  masks = jax.jit(jax.vmap(lambda k: fss.inclusion_mask(k, n, b)))(keys)
  assert np.all(np.asarray(masks).sum(1) == b)
  counts = _subset_counts(masks, n)
  assert stats.chisquare(counts).pvalue > 1e-3


def test_boundary_ties_are_rejected_exactly(monkeypatch):
  # Words with 2 bits of entropy: boundary ties on most attempts. The rejection loop must still
  # give exactly B rows, the same on host and device, uniformly (module docstring's claim).
  real_words = fss._words
  monkeypatch.setattr(fss, "_words", lambda key, a, rows: real_words(key, a, rows) & jnp.uint32(1))
  n, b, draws = 6, 2, 3000
  keys = jax.random.split(jax.random.key(5), draws)
  masks = np.asarray(jax.jit(jax.vmap(lambda k: fss.inclusion_mask(k, n, b)))(keys))
  assert np.all(masks.sum(1) == b)
  for i in range(5):
    np.testing.assert_array_equal(fss.sample_indices(keys[i], n, b), np.flatnonzero(masks[i]))
  assert stats.chisquare(_subset_counts(masks, n)).pvalue > 1e-3


def _row_sum(params, masked):
  """A stand-in for clipped_grad (cheap to compile): params times the sum of the masked rows."""
  (rows,), mask = masked.arrays, masked.mask.astype(jnp.float32)
  count = jnp.sum(mask)
  return params * (mask @ rows), ClippedGradInfo(count, mask, jnp.zeros((), jnp.int32), count)


def test_device_sum_is_over_exactly_the_host_subset_in_several_chunks():
  n, b, p = 64, 24, 10
  x = np.arange(n, dtype=np.float32)[:, None] * np.array([[1.0, 1000.0]], np.float32)
  sampler = fss.FixedSizeSampler(n, b, padded_size=p)
  fn = jax.jit(sampler.device_clipped_sum_fn(_row_sum))
  placed = sampler.place_data((x,))
  for seed in range(2):
    key = jax.random.key(seed)
    gsum, (_, num, _) = fn(jnp.float32(1.0), key, placed)
    host = sum(np.asarray(c.gather(x).mask, np.float32) @ c.gather(x).arrays[0]
               for c in sampler.sample(key))
    np.testing.assert_array_equal(np.asarray(gsum), host)
    assert float(num) == b


def _make_row_sum(clip):
  """A stand-in for adaptive_clipped_grad(loss, clip): the row sum divided by the clip norm."""
  def fn(params, masked):
    g, info = _row_sum(params, masked)
    return g / clip, info
  return fn


def test_device_sum_with_a_clip_norm_per_step_checks_its_arguments_before_tracing():
  sampler = fss.FixedSizeSampler(40, 12, padded_size=5)
  placed, key = sampler.place_data((np.ones((40, 2), np.float32),)), jax.random.key(0)
  with pytest.raises(ValueError, match="clip_norm is required"):
    sampler.device_clipped_sum_fn(make_grad_fn=_make_row_sum)(jnp.float32(1.0), key, placed)
  with pytest.raises(ValueError, match="only accepted with make_grad_fn"):
    sampler.device_clipped_sum_fn(_row_sum)(jnp.float32(1.0), key, placed, clip_norm=1.0)
  with pytest.raises(ValueError, match="exactly one"):
    sampler.device_clipped_sum_fn(_row_sum, make_grad_fn=_make_row_sum)
  with pytest.raises(ValueError, match="exactly one"):
    sampler.device_clipped_sum_fn()


@pytest.mark.slow
def test_device_sum_with_a_clip_norm_per_step_builds_the_grad_fn_from_it():
  n, b, p = 40, 12, 5
  x = np.arange(n, dtype=np.float32)[:, None] * np.array([[1.0, 10.0]], np.float32)
  sampler = fss.FixedSizeSampler(n, b, padded_size=p)
  make = _make_row_sum
  adaptive = jax.jit(lambda w, k, d, c: sampler.device_clipped_sum_fn(make_grad_fn=make)(
      w, k, d, clip_norm=c))
  placed, key = sampler.place_data((x,)), jax.random.key(5)
  got, (_, num, _) = adaptive(jnp.float32(1.0), key, placed, jnp.float32(4.0))
  host = x[fss.sample_indices(key, n, b)].sum(0)
  np.testing.assert_allclose(np.asarray(got) * 4.0, host, rtol=1e-6)
  assert float(num) == b


@pytest.mark.slow
def test_clipped_sum_host_chunks_equal_device_path():
  rng = np.random.default_rng(0)
  n, b, p = 64, 24, 10
  x = rng.normal(size=(n, 3)).astype(np.float32)
  y = rng.normal(size=(n,)).astype(np.float32)
  grad_fn = clipped_grad(lambda w, xi, yi: (xi @ w - yi) ** 2, l2_clip_norm=0.5,
                         batch_argnums=(1, 2), method="vmap")
  sampler = fss.FixedSizeSampler(n, b, padded_size=p)
  w = jnp.ones(3)
  key = jax.random.key(3)
  host = sum(np.asarray(grad_fn(w, c.gather(x, y))[0]) for c in sampler.sample(key))
  fn = jax.jit(sampler.device_clipped_sum_fn(grad_fn))
  gsum, (_, num, _) = fn(w, key, sampler.place_data((x, y)))
  np.testing.assert_allclose(np.asarray(gsum), host, rtol=1e-5, atol=1e-6)
  assert float(num) == b


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_examples=10, batch_size=11), "batch_size must be <= num_examples"),
    (dict(num_examples=10, batch_size=0), "batch_size"),
    (dict(num_examples=10, batch_size=-3), "batch_size"),
    (dict(num_examples=10, batch_size=2.5), "batch_size"),
    (dict(num_examples=0, batch_size=1), "num_examples"),
    (dict(num_examples=10, batch_size=4, padded_size=0), "padded_size"),
    (dict(num_examples=10, batch_size=4, padded_size=3, multiple_of=2), "padded_size"),
])
def test_bad_arguments_are_refused_naming_them(kwargs, match):
  with pytest.raises(ValueError, match=match):
    fss.FixedSizeSampler(**kwargs)


def test_bad_types_and_keys_are_refused_naming_them():
  with pytest.raises(ArgumentTypeError, match="batch_size"):
    fss.FixedSizeSampler(10, True)
  with pytest.raises(ArgumentTypeError, match="num_examples"):
    fss.FixedSizeSampler("10", 2)
  with pytest.raises(ArgumentTypeError, match="key"):
    fss.FixedSizeSampler(10, 2).sample(0)
  with pytest.raises(ValueError, match="batch_size"):
    dpsgd_accounting.fixed_size_dpsgd_event(1.0, 10, 20, 1)
  with pytest.raises(ValueError, match="noise_multiplier"):
    dpsgd_accounting.fixed_size_dpsgd_event(0.0, 10, 2, 1)


_MESH_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jaxdp.dpsgd import clipped_grad, make_data_mesh
    from jaxdp.dpsgd import fixed_size_sampling as fss
    assert len(jax.devices()) == 2
    rng = np.random.default_rng(0)
    n, b = 51, 20
    x = rng.normal(size=(n, 3)).astype(np.float32); y = rng.normal(size=(n,)).astype(np.float32)
    g = clipped_grad(lambda w, xi, yi: (xi @ w - yi) ** 2, l2_clip_norm=0.5, batch_argnums=(1, 2),
                     method="vmap")
    s = fss.FixedSizeSampler(n, b)
    mesh = make_data_mesh(2)
    key, w = jax.random.key(9), jnp.ones(3)
    one = jax.jit(s.device_clipped_sum_fn(g))(w, key, s.place_data((x, y)))
    two = jax.jit(s.device_clipped_sum_fn(g, mesh=mesh, physical_batch_size=8))(
        w, key, s.place_data((x, y), mesh))
    np.testing.assert_allclose(np.asarray(one[0]), np.asarray(two[0]), rtol=1e-5, atol=1e-6)
    assert float(two[1][1]) == b
    # Adaptive clipping: the clip norm of the step enters every shard (make_grad_fn).
    from jaxdp.dpsgd import adaptive_clipping as ac
    make = lambda c: ac.adaptive_clipped_grad(lambda w, xi, yi: (xi @ w - yi) ** 2, c,
                                              batch_argnums=(1, 2), method="vmap")
    c = jnp.float32(0.5)
    three = jax.jit(lambda w, k, d, c: s.device_clipped_sum_fn(
        make_grad_fn=make, mesh=mesh, physical_batch_size=8)(w, k, d, clip_norm=c))(
            w, key, s.place_data((x, y), mesh), c)
    np.testing.assert_allclose(np.asarray(three[0]) * 0.5, np.asarray(one[0]), rtol=1e-5,
                               atol=1e-6)
    assert float(three[1][1]) == b
    print("OK")
""")


@pytest.mark.slow
def test_mesh_of_two_devices_selects_the_same_subset():
  env = dict(os.environ)
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
  out = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300, check=False)
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


def test_doctests():
  import doctest  # pylint: disable=g-import-not-at-top
  result = doctest.testmod(fss)
  assert result.attempted > 0 and result.failed == 0
