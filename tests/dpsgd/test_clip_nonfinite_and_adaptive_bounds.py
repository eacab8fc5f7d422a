"""Issue 39: non-finite / huge per-example gradients, adaptive clip-norm floor, checked inner noise,
per-layer adaptive clipping."""

import functools
import math
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.dpsgd import adaptive_clipping as ac
from jaxdp.dpsgd import clipping, transforms


class _Mlp(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(nn.tanh(nn.Dense(3)(x)))


_MODEL = _Mlp()


@functools.lru_cache(maxsize=None)
def _params():
  # On first use, one compiled program (not at import, op by op, in every pytest worker).
  return jax.jit(lambda: _MODEL.init(jax.random.key(0), jnp.ones(2))["params"])()


def _loss(p, x):
  # Linear in the input of the first layer: an input of 1e30 gives gradients of 1e30 (finite),
  # an inf/NaN input a non-finite gradient.
  return jnp.sum(_MODEL.apply({"params": p}, x) ** 2) * 0.5 + jnp.sum(p["Dense_0"]["kernel"] @ x)


_GOOD = jnp.array([[0.3, -0.4], [1.0, 2.0]], jnp.float32)
_HUGE = jnp.array([[1e30, -1e30]], jnp.float32)
_BAD = jnp.array([[jnp.inf, 1.0], [jnp.nan, 0.5]], jnp.float32)

# (method, per_layer, microbatch_size)
# Every clipper under `slow` (same assertions). Always on: flat vmap and reweight in
# test_dpsgd_clipping; ghost, flat and per layer, in test_ghost_extreme_values (these
# assertions, and the ghost clipper equal to the vmap one on inf and 1e30 inputs).
_SLOW = pytest.mark.slow
_CLIPPERS = [pytest.param("vmap", False, None, marks=_SLOW),
             pytest.param("vmap", True, None, marks=_SLOW),
             pytest.param("ghost", False, None, marks=_SLOW),
             pytest.param("ghost", True, None, marks=_SLOW),
             pytest.param("reweight", False, None, marks=_SLOW),
             pytest.param("vmap", True, 2, marks=_SLOW), pytest.param("ghost", False, 2, marks=_SLOW)]


def _close(a, b):
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert bool(np.all(np.isfinite(np.asarray(u))))
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("method,per_layer,micro", _CLIPPERS)
def test_nonfinite_example_contributes_zero_and_huge_one_is_clipped(method, per_layer, micro):
  f = clipping.clipped_grad(_loss, l2_clip_norm=1.0, method=method, per_layer=per_layer,
                            microbatch_size=micro)
  with_bad, info = f(_params(), jnp.concatenate([_GOOD, _BAD, _HUGE]))
  without, info_ok = f(_params(), jnp.concatenate([_GOOD, _HUGE]))
  _close(with_bad, without)
  # The huge (finite) example is clipped to norm ~1 (not zeroed): its contribution alone.
  huge_only, _ = f(_params(), _HUGE)
  norm = float(optax.global_norm(huge_only))
  assert (0.5 if per_layer else 0.999) < norm <= 1.0
  # Diagnostics: the non-finite examples count as clipped and have norm inf.
  assert int(info.num_clipped) == int(info_ok.num_clipped) + 2
  norms = np.asarray(info.per_example_norms)
  assert np.isinf(norms[2:4]).all() and np.isfinite(norms[[0, 1]]).all()
  assert norms[4] > 1e29


@functools.lru_cache(maxsize=None)
def _adaptive(method, per_layer=False):
  """adaptive_clipped_grad(_loss, c, ...) as ``f(c)(params, x)``, jitted with the clip norm(s) an
  argument (traced, as inside a training step): one compilation per input shape, shared by every
  clip norm, instead of one per primitive run op by op."""
  fn = jax.jit(lambda c, p, x: ac.adaptive_clipped_grad(_loss, c, method=method,
                                                        per_layer=per_layer)(p, x))
  return lambda c: functools.partial(fn, c)


@pytest.mark.parametrize("method", ["vmap", pytest.param("ghost", marks=pytest.mark.slow),
                                    pytest.param("reweight", marks=pytest.mark.slow)])
def test_adaptive_clipped_grad_nonfinite_and_tiny_clip_norm(method):
  # Clip before normalising: C = 1e-30 with gradients of 1e3 gives |g / C| = 1e33 if formed
  # first (and 1e30 entries would overflow); clipped first, every normalised vector has norm 1.
  for c in (1e-30, 0.5):
    f = _adaptive(method)(jnp.float32(c))
    g_bad, info = f(_params(), jnp.concatenate([_GOOD, _BAD, _HUGE]))
    g_ok, _ = f(_params(), jnp.concatenate([_GOOD, _HUGE]))
    _close(g_bad, g_ok)
    assert float(optax.global_norm(g_ok)) <= 3.0
    assert int(info.num_clipped) >= 3  # the two non-finite and the huge example


def test_adaptive_per_layer_nonfinite():
  clips = {"Dense_0": jnp.float32(0.3), "Dense_1": jnp.float32(2.0)}
  for method in ("vmap", "ghost"):
    f = _adaptive(method, per_layer=True)(clips)
    g_bad, info = f(_params(), jnp.concatenate([_GOOD, _BAD, _HUGE]))
    g_ok, _ = f(_params(), jnp.concatenate([_GOOD, _HUGE]))
    _close(g_bad, g_ok)
    assert info.num_clipped_per_group.shape == (2,)


def test_per_layer_adaptive_groups_are_clipped_to_their_norms():
  # One example: group l of the normalised clipped gradient has norm <= C_l / D, the whole
  # vector <= 1, and a group far below its clip norm is unchanged (g / D).
  clips = {"Dense_0": jnp.float32(1e-3), "Dense_1": jnp.float32(1e3)}
  d, nus = ac.per_layer_normalisation(clips)
  assert float(d) >= math.hypot(1e-3, 1e3)
  assert sum(float(v) ** 2 for v in jax.tree.leaves(nus)) <= 1.0
  x = _GOOD[1:]
  out, info = _adaptive("vmap", per_layer=True)(clips)(_params(), x)
  raw = jax.jit(jax.grad(_loss))(_params(), x[0])
  n0 = float(optax.global_norm(out["Dense_0"])) * float(d)
  assert n0 <= 1e-3 * (1 + 1e-6) and n0 > 0.999e-3
  _close(jax.tree.map(lambda a: a * d, out["Dense_1"]), raw["Dense_1"])
  assert info.num_clipped_per_group.tolist() == [1, 0]


# ------------------------------------------------------------------ floor, ceiling, inputs


@pytest.mark.parametrize("field,value", [("initial", 1e-50), ("initial", 1e39),
                                         ("initial", 1e-40), ("min_clip_norm", 1e-45),
                                         ("max_clip_norm", 1e39)])
def test_config_refuses_values_not_normal_float32(field, value):
  kwargs = {"initial": 0.1, field: value}
  with pytest.raises(ValueError, match=f"AdaptiveClipNorm.{field}.*normal float32"):
    ac.AdaptiveClipNorm(**kwargs)


def test_config_bounds_defaults_and_order():
  assert ac.AdaptiveClipNorm(initial=0.1).clip_norm_bounds() == (
      float(np.float32(1e-7)), float(np.float32(1e5)))
  lo, hi = ac.AdaptiveClipNorm(initial=1e-35).clip_norm_bounds()
  assert lo == float(np.float32(1e-35)) and hi == float(np.float32(1e-29))  # floor <= initial
  with pytest.raises(ValueError, match="min_clip_norm.*<= initial"):
    ac.AdaptiveClipNorm(initial=0.1, min_clip_norm=0.2)
  with pytest.raises(ValueError, match="max_clip_norm.*>= initial"):
    ac.AdaptiveClipNorm(initial=0.1, max_clip_norm=0.05)


def test_clip_norm_floor_over_2000_steps_and_finite_sum_after():
  # All-zero gradients: every example unclipped, btilde ~ 1 > gamma, C shrinks by exp(-0.1)
  # per step; without a floor it reaches 0 in float32 after ~900 steps.
  cfg = ac.AdaptiveClipNorm(initial=1.0, min_clip_norm=1e-6)
  qn = 64.0
  tx = ac.adaptive_noisy_aggregate(cfg, noise_multiplier=1.0, expected_batch_size=qn,
                                   key=jax.random.key(0))
  w = jnp.zeros(3)
  zero_sum = jnp.zeros(3)
  count = ac.centered_unclipped_count(qn, 0)

  @jax.jit
  def run(state):
    def body(s, _):
      _, s = tx.update((zero_sum, count), s, w)
      return s, ac.current_clip_norm(s)
    return jax.lax.scan(body, state, None, length=2000)

  state, trace = run(tx.init(w))
  assert float(jnp.min(trace)) == pytest.approx(float(np.float32(1e-6)))
  assert float(trace[-1]) == float(np.float32(1e-6))
  # A record with gradient norm 1e3 at C = 1e-6: clipped to C, normalised norm <= 1. (Jitted,
  # the clip norm traced as in a training step: one compilation instead of one per primitive.)
  loss = lambda w, x: jnp.dot(w, x)
  g, _ = jax.jit(lambda c, w, x: ac.adaptive_clipped_grad(loss, c, method="vmap")(w, x))(
      ac.current_clip_norm(state), w, jnp.array([[1e3, 0.0, 0.0]]))
  assert bool(jnp.all(jnp.isfinite(g))) and 0.999 < float(jnp.linalg.norm(g)) <= 1.0
  updates, _ = jax.jit(tx.update)((g, count), state, w)
  assert bool(jnp.all(jnp.isfinite(updates)))


def test_clip_norm_ceiling():
  cfg = ac.AdaptiveClipNorm(initial=1.0, max_clip_norm=4.0)
  tx = ac.adaptive_noisy_aggregate(cfg, noise_multiplier=1.0, expected_batch_size=64.0,
                                   key=jax.random.key(1))
  state = tx.init(jnp.zeros(2))
  for _ in range(40):  # everything clipped: C grows by exp(0.1) per step
    _, state = tx.update((jnp.zeros(2), ac.centered_unclipped_count(64.0, 64)), state)
  assert float(ac.current_clip_norm(state)) == 4.0


# ------------------------------------------------------------------ inner noise built/checked


def test_inner_noise_is_built_or_checked():
  cfg = ac.AdaptiveClipNorm(initial=0.1)
  qn, sigma = 20.0, 1.0
  sigma_b = cfg.resolved_count_noise_multiplier(qn)  # 1.0
  sd = ac.gradient_noise_multiplier(sigma, sigma_b)
  kc, kg = jax.random.split(jax.random.key(0))
  # Built with the TOTAL sigma: refused (joint multiplier below sigma).
  with pytest.raises(ValueError, match="sigma_Delta"):
    ac.adaptive_clip_noise(transforms.noisy_aggregate(sigma, 1.0, qn, kg), cfg,
                           noise_multiplier=sigma, expected_batch_size=qn, key=kc)
  assert ac.joint_noise_multiplier(sigma, sigma_b) == pytest.approx(0.894, abs=1e-3)  # unpaid
  # Wrong sensitivity: refused.
  with pytest.raises(ValueError, match="l2_sensitivity"):
    ac.adaptive_clip_noise(transforms.noisy_aggregate(sd, 2.0, qn, kg), cfg,
                           noise_multiplier=sigma, expected_batch_size=qn, key=kc)
  # Correct built transform: accepted; a factory gets sigma_Delta.
  ac.adaptive_clip_noise(transforms.noisy_aggregate(sd, 1.0, qn, kg), cfg,
                         noise_multiplier=sigma, expected_batch_size=qn, key=kc)
  seen = []

  def factory(s):
    seen.append(s)
    return transforms.noisy_aggregate(s, 1.0, qn, kg)

  ac.adaptive_clip_noise(factory, cfg, noise_multiplier=sigma, expected_batch_size=qn, key=kc)
  assert seen == [sd]
  # A transform that does not state its noise cannot be checked.
  plain = optax.GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))
  with pytest.raises(TypeError, match="factory"):
    ac.adaptive_clip_noise(plain, cfg, noise_multiplier=sigma, expected_batch_size=qn, key=kc)
  with pytest.raises(TypeError, match="noise_multiplier"):
    ac.adaptive_clip_noise(factory, cfg, expected_batch_size=qn, key=kc)
  # Legacy call: warned.
  with pytest.warns(FutureWarning, match="noise_multiplier"):
    ac.adaptive_clip_noise(transforms.noisy_aggregate(sd, 1.0, qn, kg), cfg,
                           expected_batch_size=qn, key=kc)
  # k participations and ratio r (unamplified matrix mechanism).
  seen.clear()
  ac.adaptive_clip_noise(factory, cfg, noise_multiplier=sigma, expected_batch_size=qn, key=kc,
                         participations=3, sensitivity_ratio=2.0)
  assert seen[0] == pytest.approx(2.0 * ac.gradient_noise_multiplier(0.5, sigma_b,
                                                                     participations=3))


def test_adaptive_noisy_aggregate_gives_the_gradient_sigma_delta():
  cfg = ac.AdaptiveClipNorm(initial=0.1)
  tx = ac.adaptive_noisy_aggregate(cfg, noise_multiplier=1.0, expected_batch_size=256.0,
                                   key=jax.random.key(0))
  state = tx.init(jnp.zeros(40000))
  out, _ = tx.update((jnp.zeros(40000), jnp.float32(0.0)), state)
  # update = C_0 * z / qN with std sigma_Delta (Andrew et al. Thm 1), not sigma.
  std = float(jnp.std(out)) * 256.0 / float(np.float32(0.1))
  assert std == pytest.approx(ac.gradient_noise_multiplier(1.0, 12.8), rel=0.02)


# ------------------------------------------------------------------ per-layer adaptive


def test_per_layer_adaptive_clip_noise_budget_and_update():
  cfg = ac.AdaptiveClipNorm(initial=0.5)
  groups = {"Dense_0": 0.5, "Dense_1": 2.0}
  qn, sigma = 64.0, 1.0
  seen = []

  def factory(s):
    seen.append(s)
    return transforms.noisy_aggregate(s, 1.0, qn, jax.random.key(7))

  tx = ac.per_layer_adaptive_clip_noise(factory, cfg, noise_multiplier=sigma,
                                        expected_batch_size=qn, key=jax.random.key(8),
                                        groups=groups)
  sigma_b = cfg.resolved_count_noise_multiplier(qn, 2)
  assert sigma_b == pytest.approx(math.sqrt(2) * qn / 20)
  # G = 2 counts of sensitivity 1/2 each: sigma^-2 = sigma_Delta^-2 + 2 (2 sigma_b)^-2.
  assert seen[0] == pytest.approx(ac.gradient_noise_multiplier(sigma, sigma_b, participations=2))
  assert ac.joint_noise_multiplier(seen[0], sigma_b, participations=2) == pytest.approx(sigma)
  params = _params()
  state = tx.init(params)
  assert jax.tree.structure(ac.current_clip_norm(state)) == jax.tree.structure(
      {"Dense_0": 0, "Dense_1": 0})

  @jax.jit
  def step(state, x):
    f = ac.adaptive_clipped_grad(_loss, ac.current_clip_norm(state), per_layer=True)
    g, info = f(params, x)
    count = ac.centered_unclipped_count(info.num_examples, info.num_clipped_per_group)
    return tx.update((g, count), state, params)

  out, new_state = step(state, jnp.concatenate([_GOOD, _HUGE]))
  assert all(bool(jnp.all(jnp.isfinite(v))) for v in jax.tree.leaves(out))
  new = ac.current_clip_norm(new_state)
  assert float(new["Dense_0"]) != 0.5 and float(new["Dense_1"]) != 2.0
  with pytest.raises(ValueError, match="shape \\(2,\\)"):
    tx.update((jax.tree.map(jnp.zeros_like, _params()), jnp.float32(0.0)), state)


def test_per_layer_adaptive_bad_arguments():
  cfg = ac.AdaptiveClipNorm(initial=0.5)
  f = lambda s: transforms.noisy_aggregate(s, 1.0, 64.0, jax.random.key(1))
  common = dict(noise_multiplier=1.0, expected_batch_size=64.0, key=jax.random.key(2))
  with pytest.raises(ValueError, match="num_groups"):
    ac.per_layer_adaptive_clip_noise(f, cfg, **common)
  with pytest.raises(ValueError, match="outside the config's clip norm bounds"):
    ac.per_layer_adaptive_clip_noise(f, cfg, groups={"a": 1e7}, **common)
  tx = ac.per_layer_adaptive_clip_noise(f, cfg, num_groups=3, **common)
  with pytest.raises(ValueError, match="num_groups=3 but params has 4 leaves"):
    tx.init(_params())
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    tx = ac.adaptive_noisy_aggregate(cfg, noise_multiplier=1.0, expected_batch_size=64.0,
                                     key=jax.random.key(3), per_layer=True, num_groups=4)
  assert len(jax.tree.leaves(ac.current_clip_norm(tx.init(_params())))) == 4
