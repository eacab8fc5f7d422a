"""Tests of adaptive clipping (Andrew, Thakkar, McMahan & Ramaswamy 2021, Alg. 1, Theorem 1)."""

import doctest
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from jaxdp.accounting.analytic_gaussian import analytic_gaussian_delta
from jaxdp.dpsgd import adaptive_clipping as ac
from jaxdp.dpsgd import adaptive_accounting, adaptive_clip_norm, adaptive_grad
from jaxdp.dpsgd import clipping, transforms


# ---------------------------------------------------------------- configuration


def test_config_defaults_and_resolution():
  cfg = ac.AdaptiveClipNorm(initial=0.1)
  assert (cfg.target_quantile, cfg.learning_rate, cfg.count_noise_multiplier) == (0.5, 0.2, None)
  assert cfg.resolved_count_noise_multiplier(256.0) == pytest.approx(12.8)
  fixed = ac.AdaptiveClipNorm(initial=1.0, count_noise_multiplier=3.0)
  assert fixed.resolved_count_noise_multiplier(256.0) == 3.0
  with pytest.raises(ValueError, match="expected_batch_size"):
    cfg.resolved_count_noise_multiplier(0.0)


@pytest.mark.parametrize("field,value", [
    ("initial", 0.0), ("initial", -1.0), ("initial", float("inf")), ("initial", float("nan")),
    ("target_quantile", 0.0), ("target_quantile", 1.0), ("target_quantile", 1.5),
    ("learning_rate", 0.0), ("learning_rate", -0.2), ("learning_rate", float("inf")),
    ("count_noise_multiplier", 0.0), ("count_noise_multiplier", -1.0),
])
def test_config_refuses_bad_values(field, value):
  kwargs = {"initial": 0.1, field: value}
  with pytest.raises(ValueError, match=f"AdaptiveClipNorm.{field}"):
    ac.AdaptiveClipNorm(**kwargs)


@pytest.mark.parametrize("field", ["initial", "target_quantile", "learning_rate",
                                   "count_noise_multiplier"])
def test_config_refuses_wrong_types(field):
  kwargs = {"initial": 0.1, field: "0.5"}
  with pytest.raises(TypeError, match=f"AdaptiveClipNorm.{field}"):
    ac.AdaptiveClipNorm(**kwargs)
  kwargs[field] = True
  with pytest.raises(TypeError, match=f"AdaptiveClipNorm.{field}"):
    ac.AdaptiveClipNorm(**kwargs)


def test_config_is_frozen():
  cfg = ac.AdaptiveClipNorm(initial=0.1)
  with pytest.raises(Exception):
    cfg.initial = 1.0  # type: ignore[misc]


# ------------------------------------------------------- noise multiplier algebra


@pytest.mark.parametrize("sigma,sigma_b,k", [(1.0, 12.8, 1), (0.7, 0.5, 1), (2.0, 5.0, 3),
                                             (1.1, 3.0, 10)])
def test_gradient_noise_multiplier_algebra(sigma, sigma_b, k):
  s = ac.gradient_noise_multiplier(sigma, sigma_b, participations=k)
  assert isinstance(s, float)
  # Closed form, and the joint multiplier is the one calibrated (never below it).
  assert s == pytest.approx((sigma ** -2 - k / (2 * sigma_b) ** 2) ** -0.5, rel=1e-11)
  joint = ac.joint_noise_multiplier(s, sigma_b, participations=k)
  assert joint >= sigma
  assert joint == pytest.approx(sigma, rel=1e-11)
  assert s > sigma  # the gradient needs MORE noise than sigma: the count takes a share
  assert ac.gradient_noise_multiplier(0.0, sigma_b, participations=k) == 0.0


def test_gradient_noise_multiplier_refuses_count_that_spends_everything():
  # 2 sigma_b <= sigma: no finite sigma_Delta works.
  with pytest.raises(ValueError, match="count_noise_multiplier.*too small"):
    ac.gradient_noise_multiplier(1.0, 0.5)
  with pytest.raises(ValueError, match="too small"):
    ac.gradient_noise_multiplier(1.0, 0.4)
  # k participations: 2 sigma_b / sqrt(k) <= sigma.
  assert ac.gradient_noise_multiplier(1.0, 1.01) > 1.0
  with pytest.raises(ValueError, match="participations=4"):
    ac.gradient_noise_multiplier(1.0, 1.0, participations=4)


@pytest.mark.parametrize("kwargs,name", [
    (dict(total_noise_multiplier=-1.0, count_noise_multiplier=1.0), "total_noise_multiplier"),
    (dict(total_noise_multiplier=float("inf"), count_noise_multiplier=1.0),
     "total_noise_multiplier"),
    (dict(total_noise_multiplier=1.0, count_noise_multiplier=0.0), "count_noise_multiplier"),
    (dict(total_noise_multiplier=1.0, count_noise_multiplier=2.0, participations=0),
     "participations"),
    (dict(total_noise_multiplier=1.0, count_noise_multiplier=2.0, participations=1.5),
     "participations"),
])
def test_gradient_noise_multiplier_bad_arguments(kwargs, name):
  with pytest.raises(ValueError, match=name):
    ac.gradient_noise_multiplier(**kwargs)


_EPSILONS = (0.1, 0.5, 1.0, 2.0, 4.0)


def _gaussian_pld(std, sensitivity):
  return pld.from_gaussian_mechanism(std, sensitivity=sensitivity,
                                     value_discretization_interval=1e-3)


def test_privacy_curve_of_joint_release_is_one_gaussian():
  # Andrew et al. Theorem 1: the gradient Gaussian (sensitivity 1, std sigma_Delta) and the
  # count Gaussian (sensitivity 1/2, std sigma_b), released together, have the privacy curve
  # of ONE Gaussian mechanism with noise multiplier sigma. dp_accounting's PLD composes the
  # two (pessimistic discretisation: an upper bound, within 3e-5 of it here); the reference is
  # the exact curve of Balle & Wang (analytic_gaussian_delta).
  sigma, sigma_b = 1.0, 0.8  # a large count share, so an error in the formula shows
  s = ac.gradient_noise_multiplier(sigma, sigma_b)
  joint = _gaussian_pld(s, 1.0).compose(_gaussian_pld(sigma_b, 0.5))
  ignoring_count = _gaussian_pld(sigma, 1.0).compose(_gaussian_pld(sigma_b, 0.5))
  for eps in _EPSILONS:
    exact = analytic_gaussian_delta(sigma, eps)
    got = joint.get_delta_for_epsilon(eps)
    assert got == pytest.approx(exact, rel=1e-4, abs=1e-12), eps
    # Negative control: noise sigma on the gradient plus a count costs MORE than sigma.
    assert ignoring_count.get_delta_for_epsilon(eps) > 1.1 * exact, eps


def test_privacy_curve_with_k_participations_matrix_mechanism():
  # MF Gaussian with deterministic k-participation: gradient stream of sensitivity sens_C
  # (noise std s = sens_C * sigma_Delta'), k count releases of sensitivity 1/2 each. The run
  # must cost exactly the single Gaussian with the run-level multiplier sigma.
  sigma, sigma_b, k, sens_c = 1.5, 2.0, 3, 2.4
  s = sens_c * ac.gradient_noise_multiplier(sigma, sigma_b, participations=k)
  joint = _gaussian_pld(s, sens_c).compose(_gaussian_pld(sigma_b, 0.5).self_compose(k))
  for eps in _EPSILONS:
    exact = analytic_gaussian_delta(sigma, eps)
    assert joint.get_delta_for_epsilon(eps) == pytest.approx(exact, rel=1e-4, abs=1e-12), eps
  # participations=1 for this k would under-noise: its curve lies above the target.
  s1 = sens_c * ac.gradient_noise_multiplier(sigma, sigma_b, participations=1)
  wrong = _gaussian_pld(s1, sens_c).compose(_gaussian_pld(sigma_b, 0.5).self_compose(k))
  assert wrong.get_delta_for_epsilon(1.0) > 1.05 * analytic_gaussian_delta(sigma, 1.0)


# ----------------------------------------------------------------- the transform

_QN = 200.0
_SIGMA, _SIGMA_B, _C0, _GAMMA, _ETA = 1.3, 10.0, 2.5, 0.3, 0.2


def _grads(dim=5):
  return {"w": jnp.zeros((dim,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def _transform(sigma_delta, sigma_b, *, initial=1.0, gamma=0.5, lr=0.2, key=0, qn=_QN):
  kc, kg = jax.random.split(jax.random.key(key))
  inner = transforms.noisy_aggregate(sigma_delta, 1.0, qn, kg)
  cfg = ac.AdaptiveClipNorm(initial=initial, target_quantile=gamma, learning_rate=lr,
                            count_noise_multiplier=sigma_b)
  # The built inner is checked against the sigma_Delta of the total multiplier.
  total = ac.joint_noise_multiplier(sigma_delta, sigma_b) * (1 - 1e-9)
  return ac.adaptive_clip_noise(inner, cfg, noise_multiplier=total, expected_batch_size=qn,
                                key=kc)


@pytest.fixture(scope="module")
def shared():
  """One DP-SGD transform with adaptive clipping, its jitted update and a vmapped one.

  Built by adaptive_noisy_aggregate (sigma_Delta = gradient_noise_multiplier(sigma, sigma_b));
  the vmapped update reseeds both keys per seed (reseed_state) and applies one update to a
  zero gradient and a zero centered count.
  """
  cfg = ac.AdaptiveClipNorm(initial=_C0, target_quantile=_GAMMA, learning_rate=_ETA,
                            count_noise_multiplier=_SIGMA_B)
  tx = ac.adaptive_noisy_aggregate(cfg, noise_multiplier=_SIGMA, expected_batch_size=_QN,
                                   key=jax.random.key(3))
  step = jax.jit(tx.update)
  state0 = tx.init(_grads())

  @jax.jit
  @jax.vmap
  def fresh_step(seed):
    state = ac.reseed_state(state0, jax.random.fold_in(jax.random.key(7), seed), 0)
    return step((_grads(), jnp.zeros(())), state)

  return tx, step, state0, fresh_step


def test_update_is_the_geometric_rule_times_clip(shared):
  tx, step, state, _ = shared
  assert isinstance(state, ac.AdaptiveClipState)
  assert state.clip_norm.dtype == jnp.float32 and float(state.clip_norm) == pytest.approx(_C0)
  assert int(state.count) == 0 and int(state.inner.count) == 0
  # Same state (same keys, so the same noise) and two inputs: the noise cancels in the
  # differences, which are C_t * (grad_1 - grad_0) / qN and -eta (count_1 - count_0) / qN.
  g0 = _grads()
  g1 = {"w": jnp.array([1.0, -2.0, 0.5, 0.0, 4.0]), "b": jnp.array(3.0)}
  centered = ac.centered_unclipped_count(100.0, 20)  # 80 of 100 unclipped -> +30
  assert float(centered) == 30.0
  out0, s0 = step((g0, jnp.zeros(())), state)
  out1, s1 = step((g1, centered), state)
  for a, b, g in zip(jax.tree.leaves(out1), jax.tree.leaves(out0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(np.asarray(a) - np.asarray(b), _C0 * np.asarray(g) / _QN,
                               rtol=1e-4, atol=1e-6)
  assert math.log(float(s1.clip_norm) / float(s0.clip_norm)) == pytest.approx(
      -_ETA * 30.0 / _QN, rel=1e-4)
  assert int(s1.count) == 1 and int(s1.inner.count) == 1
  # The rule itself: C_1 = C_0 exp(-eta (btilde - gamma)), btilde = (noisy + qN/2) / qN.
  noisy = (-math.log(float(s0.clip_norm) / _C0) / _ETA + _GAMMA) * _QN - _QN / 2
  assert abs(noisy) < 6 * _SIGMA_B  # the count noise alone (the count was 0)


def test_noise_stds_are_sigma_b_and_sigma_delta_clip_over_qn(shared):
  # Zero gradient and count, 4000 fresh keys: log(C_1 / C_0) = -eta (z_b / qN + 1/2 - gamma)
  # recovers the count noise z_b from the released clip norm; the update is C_0 z / qN.
  _, _, _, fresh_step = shared
  n = 4000
  out, state = fresh_step(jnp.arange(n))
  clips = np.asarray(state.clip_norm, np.float64)
  z_b = (-np.log(clips / _C0) / _ETA - 0.5 + _GAMMA) * _QN
  assert abs(z_b.mean()) < 4 * _SIGMA_B / math.sqrt(n)
  assert z_b.std() == pytest.approx(_SIGMA_B, rel=0.05)
  sigma_delta = ac.gradient_noise_multiplier(_SIGMA, _SIGMA_B)
  assert sigma_delta > _SIGMA  # the inner noise pays the count's share
  want = sigma_delta * _C0 / _QN
  w = np.asarray(out["w"], np.float64).ravel()
  assert w.std() == pytest.approx(want, rel=0.03)
  assert abs(w.mean()) < 4 * want / math.sqrt(w.size)
  # Gradient and count noise are independent (separate keys).
  assert abs(np.corrcoef(np.asarray(out["b"]), z_b)[0, 1]) < 4 / math.sqrt(n)


def test_same_key_same_result_different_keys_differ_keys_never_reused(shared):
  _, step, state0, _ = shared
  g = _grads()

  def run(state):
    outs, clips, keys = [], [], []
    for _ in range(4):
      keys += [np.asarray(jax.random.key_data(state.key)).tobytes(),
               np.asarray(jax.random.key_data(state.inner.key)).tobytes()]
      out, state = step((g, jnp.zeros(())), state)
      outs.append(np.asarray(out["w"]))
      clips.append(float(state.clip_norm))
    return np.stack(outs), np.array(clips), keys, state

  a_out, a_clip, a_keys, a_state = run(state0)
  b_out, b_clip, _, _ = run(state0)
  c_out, c_clip, _, _ = run(ac.reseed_state(state0, jax.random.key(1), 0))
  np.testing.assert_array_equal(a_out, b_out)
  np.testing.assert_array_equal(a_clip, b_clip)
  assert not np.array_equal(a_out, c_out) and not np.array_equal(a_clip, c_clip)
  # Every key used (count and inner, every step) is distinct, and so is every step's noise.
  assert len(set(a_keys)) == len(a_keys)
  assert len({o.tobytes() for o in a_out}) == 4
  assert len(set(np.diff(np.log(np.concatenate([[_C0], a_clip]))).round(9))) == 4
  assert int(a_state.count) == 4 and int(a_state.inner.count) == 4


def test_reseed_state_refreshes_both_keys(shared):
  _, step, state0, _ = shared
  _, state = step((_grads(), jnp.zeros(())), state0)
  fresh = ac.reseed_state(state, jax.random.key(99), 7)
  assert int(fresh.count) == 7 and int(fresh.inner.count) == 7
  keys = [np.asarray(jax.random.key_data(k)).tobytes()
          for k in (state.key, state.inner.key, fresh.key, fresh.inner.key)]
  assert len(set(keys)) == 4
  assert float(fresh.clip_norm) == float(state.clip_norm)
  with pytest.raises(TypeError, match="AdaptiveClipState"):
    ac.reseed_state((state,), jax.random.key(1), 1)


def test_wraps_the_correlated_noise_transform():
  # The same wrapper around the matrix-mechanism noise (C^{-1} z streamed): the output is
  # C_t times exactly what the inner transform returns for the same key and inputs.
  noise = pytest.importorskip("jaxdp.dpsgd.correlated.noise")
  strategies = pytest.importorskip("jaxdp.dpsgd.correlated.strategies")
  strategy = strategies.BandMF(coefs=np.array([1.0, -0.4]))
  kc, kg = jax.random.split(jax.random.key(11))
  cfg = ac.AdaptiveClipNorm(initial=0.7, count_noise_multiplier=_SIGMA_B)
  built = []

  def factory(s):  # the wrapper builds the inner noise with sigma_Delta
    built.append(noise.correlated_noise(strategy, 8, s, 1.0, _QN, kg))
    return built[-1]

  tx = ac.adaptive_clip_noise(factory, cfg, noise_multiplier=1.2, expected_batch_size=_QN,
                              key=kc)
  inner = built[0]
  assert ac.joint_noise_multiplier(
      ac.gradient_noise_multiplier(1.2, _SIGMA_B), _SIGMA_B) == pytest.approx(1.2)
  g = {"w": jnp.arange(5.0), "b": jnp.array(1.0)}

  step, ref_step = jax.jit(tx.update), jax.jit(inner.update)
  state, ref_state = tx.init(g), inner.init(g)
  outs, clips, refs = [], [], []
  for _ in range(3):
    clips.append(state.clip_norm)
    out, state = step((g, jnp.asarray(3.0)), state)
    ref, ref_state = ref_step(g, ref_state)
    outs.append(out)
    refs.append(ref)
  for out, clip, ref in zip(outs, clips, refs):
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
      np.testing.assert_allclose(np.asarray(a), float(clip) * np.asarray(b), rtol=1e-6)
  assert len({float(c) for c in clips}) == 3  # the clip norm adapts
  assert int(state.count) == 3 and int(state.inner.count) == 3
  fresh = ac.reseed_state(state, jax.random.key(5), 3)
  assert not np.array_equal(jax.random.key_data(fresh.inner.key),
                            jax.random.key_data(state.inner.key))


# --------------------------------------------------------------- bad inputs


def test_bad_arguments_are_refused_before_work():
  cfg = ac.AdaptiveClipNorm(initial=0.1)
  inner = transforms.noisy_aggregate(1.0, 1.0, 64.0, jax.random.key(1))
  key = jax.random.key(2)
  with pytest.raises(TypeError, match="inner"):
    ac.adaptive_clip_noise(lambda g: g, cfg, noise_multiplier=0.5, expected_batch_size=64.0,
                           key=key)
  with pytest.raises(TypeError, match="config"):
    ac.adaptive_clip_noise(inner, {"initial": 0.1}, noise_multiplier=0.5,
                           expected_batch_size=64.0, key=key)
  with pytest.raises(ValueError, match="expected_batch_size"):
    ac.adaptive_clip_noise(inner, cfg, noise_multiplier=0.5, expected_batch_size=0.0, key=key)
  with pytest.raises(ValueError, match="count_noise_multiplier"):
    ac.adaptive_clip_noise(inner, cfg, noise_multiplier=0.5, expected_batch_size=64.0, key=key,
                           count_noise_multiplier=-1.0)
  with pytest.raises(ValueError, match="differs from the config"):
    ac.adaptive_clip_noise(inner, ac.AdaptiveClipNorm(initial=0.1, count_noise_multiplier=2.0),
                           noise_multiplier=0.5, expected_batch_size=64.0, key=key,
                           count_noise_multiplier=3.0)
  with pytest.raises((TypeError, ValueError), match="key"):
    ac.adaptive_clip_noise(inner, cfg, noise_multiplier=0.5, expected_batch_size=64.0, key=3)
  with pytest.raises(ValueError, match="too small"):
    ac.adaptive_noisy_aggregate(ac.AdaptiveClipNorm(initial=0.1, count_noise_multiplier=0.4),
                                noise_multiplier=1.0, expected_batch_size=64.0, key=key)
  with pytest.raises(TypeError, match="config"):
    ac.adaptive_noisy_aggregate(None, noise_multiplier=1.0, expected_batch_size=64.0, key=key)
  with pytest.raises(ValueError, match="clip_norm"):
    ac.normalized_loss(lambda w, x: w @ x, 0.0)
  with pytest.raises(TypeError, match="loss_fn"):
    ac.normalized_loss(3, 1.0)
  with pytest.raises(TypeError, match="AdaptiveClipState"):
    ac.current_clip_norm((transforms.NoisyAggregateState(key, jnp.zeros((), jnp.int32)),))


def test_shared_key_between_noises_is_refused_at_init():
  cfg = ac.AdaptiveClipNorm(initial=0.1)
  key = jax.random.key(5)
  tx = ac.adaptive_clip_noise(transforms.noisy_aggregate(1.0, 1.0, 64.0, key), cfg,
                              noise_multiplier=0.5, expected_batch_size=64.0, key=key)
  with pytest.raises(ValueError, match="same key"):
    tx.init(_grads())
  raw = jax.random.PRNGKey(5)  # raw uint32 keys are compared too
  tx = ac.adaptive_clip_noise(transforms.noisy_aggregate(1.0, 1.0, 64.0, raw), cfg,
                              noise_multiplier=0.5, expected_batch_size=64.0, key=raw)
  with pytest.raises(ValueError, match="same key"):
    tx.init(_grads())


def test_update_refuses_wrong_updates_structure():
  tx = _transform(1.0, 5.0)
  state = tx.init(_grads())
  with pytest.raises(TypeError, match="pair"):
    tx.update(_grads(), state)
  with pytest.raises(TypeError, match="length 3"):
    tx.update((_grads(), jnp.zeros(()), jnp.zeros(())), state)
  with pytest.raises(ValueError, match="scalar"):
    tx.update((_grads(), jnp.zeros((3,))), state)
  with pytest.raises(TypeError, match="real number"):
    tx.update((_grads(), jnp.zeros((), bool)), state)


# --------------------------------------------- normalised gradients, traced C


class _MLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(nn.relu(nn.Dense(8)(x)))


def _mlp_problem():
  model = _MLP()
  x = jax.random.normal(jax.random.key(0), (12, 5)) * jnp.linspace(0.2, 3.0, 12)[:, None]
  y = jax.random.randint(jax.random.key(1), (12,), 0, 3)
  params = jax.jit(model.init)(jax.random.key(2), x[:1])["params"]

  def loss(p, xi, yi):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, xi), yi)

  return loss, params, x, y


def _check_traced_clip_norm(method, microbatch):
  loss, params, x, y = _mlp_problem()
  mask = jnp.ones((12,)).at[3].set(0.0)

  @jax.jit
  def normalised(clip):  # ONE compilation, called with two values of the traced C
    fn = ac.adaptive_clipped_grad(loss, clip, batch_argnums=(1, 2), method=method,
                                  microbatch_size=microbatch)
    assert fn.sensitivity == 1.0
    return fn(params, x, y, mask=mask)

  _, info_1 = normalised(jnp.float32(1.0))  # C = 1: the raw per-example norms
  norms = np.asarray(info_1.per_example_norms)
  c = float(np.median(norms[np.asarray(mask) > 0]))
  got, info = normalised(jnp.float32(c))
  want, ref_info = jax.jit(lambda p: clipping.clipped_grad(
      loss, l2_clip_norm=c, batch_argnums=(1, 2), method="vmap")(p, x, y, mask=mask))(params)
  # sum_i (g_i / C) min(1, C / ||g_i||) = (clipped sum at clip norm C) / C.
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a) * c, np.asarray(b), rtol=2e-4, atol=1e-6)
  assert int(info.num_clipped) == int(ref_info.num_clipped)
  assert 0 < int(info.num_clipped) < 11
  assert float(info.num_examples) == 11.0
  np.testing.assert_allclose(float(info.loss_sum) * c, float(ref_info.loss_sum), rtol=1e-5)
  # The normalised per-example norms are ||g_i|| / C, with ||g_i|| as vmap computes them.
  np.testing.assert_allclose(norms, np.asarray(ref_info.per_example_norms), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(info.per_example_norms) * c, norms, rtol=1e-4, atol=1e-6)


def test_traced_clip_norm_works_with_clipped_grad():
  # The default method ("auto" = ghost norms for Flax layers), microbatched (lax.scan).
  _check_traced_clip_norm("auto", 5)


@pytest.mark.slow
@pytest.mark.parametrize("method,microbatch", [("vmap", None), ("reweight", None),
                                               ("ghost", None), ("reweight", 5)])
def test_traced_clip_norm_works_with_every_clipping_method(method, microbatch):
  _check_traced_clip_norm(method, microbatch)


def test_normalized_loss_with_aux_divides_only_the_loss():
  f = ac.normalized_loss(lambda w, x: (jnp.dot(w, x), x * 2), 4.0, has_aux=True)
  value, aux = f(jnp.ones(2), jnp.array([2.0, 6.0]))
  assert float(value) == 2.0
  np.testing.assert_array_equal(aux, [4.0, 12.0])


def test_centered_count_is_additive_over_chunks():
  a = ac.centered_unclipped_count(10.0, 3)
  b = ac.centered_unclipped_count(7.0, 6)
  assert float(a + b) == float(ac.centered_unclipped_count(17.0, 9)) == -0.5
  assert ac.centered_unclipped_count(10.0, 3).dtype == jnp.float32


# ------------------------------------------------------------- quantile tracking


def _norms_dataset(n, key):
  # Per-example gradients x_i of the loss w.x (gradient x_i whatever w), with known norms r_i
  # drawn log-normally (median 1): the tracked gamma-quantile is the empirical one of r.
  k1, k2 = jax.random.split(key)
  direction = jax.random.normal(k1, (n, 4))
  direction = direction / jnp.linalg.norm(direction, axis=1, keepdims=True)
  r = jnp.exp(0.5 * jax.random.normal(k2, (n,)))
  return direction * r[:, None], np.asarray(r, np.float64)


def _track(gamma, *, steps, n, q, sigma_b, seed=0):
  x, r = _norms_dataset(n, jax.random.key(100 + seed))
  qn = q * n
  cfg = ac.AdaptiveClipNorm(initial=0.1, target_quantile=gamma, count_noise_multiplier=sigma_b)
  kc, kg, ks = jax.random.split(jax.random.key(seed), 3)
  tx = ac.adaptive_clip_noise(lambda s: transforms.noisy_aggregate(s, 1.0, qn, kg), cfg,
                              noise_multiplier=1e-3, expected_batch_size=qn, key=kc)
  loss = lambda w, xi: jnp.dot(w, xi)
  w = jnp.zeros((4,))

  @jax.jit
  def run(state):
    def body(state, key):
      mask = jax.random.bernoulli(key, q, (n,))  # Poisson sample
      g, info = ac.adaptive_clipped_grad(loss, ac.current_clip_norm(state), method="vmap")(
          w, x, mask=mask)
      _, state = tx.update((g, ac.centered_unclipped_count(info.num_examples, info.num_clipped)),
                           state, w)
      return state, state.clip_norm

    return jax.lax.scan(body, state, jax.random.split(ks, steps))[1]

  clips = np.asarray(run(tx.init(w)), np.float64)
  tail = clips[steps // 2:]
  c_hat = float(np.exp(np.mean(np.log(tail))))  # geometric mean of the second half
  return c_hat, float(np.quantile(r, gamma)), float(np.mean(r <= c_hat)), clips


def _check_tracking(gamma, c_hat, true_q, frac, clips, tol_frac=0.025, tol_rel=0.04):
  assert abs(frac - gamma) < tol_frac, (gamma, frac)
  assert abs(c_hat / true_q - 1) < tol_rel, (gamma, c_hat, true_q)
  assert clips[-1] > 3 * 0.1  # it moved from C_0 = 0.1 to the quantile (every one is > 0.5)


@pytest.mark.parametrize("gamma", [0.2, 0.8])
def test_clip_norm_tracks_target_quantile(gamma):
  c_hat, true_q, frac, clips = _track(gamma, steps=160, n=1000, q=0.2, sigma_b=1e-3)
  _check_tracking(gamma, c_hat, true_q, frac, clips)


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [0.1, 0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("noisy", [False, True])
def test_clip_norm_tracks_target_quantile_many(gamma, noisy):
  # The paper's count noise sigma_b = qN / 20 as well as a tiny one.
  n, q = 4000, 0.1
  c_hat, true_q, frac, clips = _track(gamma, steps=400, n=n, q=q,
                                      sigma_b=(q * n / 20 if noisy else 1e-3), seed=1)
  _check_tracking(gamma, c_hat, true_q, frac, clips)


def test_module_docstring_example_runs():
  result = doctest.testmod(ac)
  assert result.attempted >= 15
  assert result.failed == 0


@pytest.mark.parametrize("module,least", [(adaptive_clip_norm, 2), (adaptive_accounting, 5),
                                          (adaptive_grad, 1)])
def test_split_module_doctests_run(module, least):
  result = doctest.testmod(module)
  assert result.attempted >= least
  assert result.failed == 0
