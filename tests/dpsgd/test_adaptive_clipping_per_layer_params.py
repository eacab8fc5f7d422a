"""Per-layer adaptive clipping with G read from params at init (Andrew et al. 2021 Thm 1, G counts).

``per_layer_adaptive_clip_noise(..., num_groups="params")`` and
``adaptive_accounting.per_layer_gradient_noise_multiplier``: the split of sigma
into sigma_Delta and G counts of std sigma_b, checked against a direct
computation of the joint Gaussian's sensitivity, the feasibility condition
``G < (2 r sigma_b / sigma)^2 / k``, the state, and bit-identity with the
transform built for a known G.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.dpsgd import adaptive_accounting
from jaxdp.dpsgd import adaptive_clipping as ac
from jaxdp.dpsgd import transforms

_PARAMS = {"dense": {"w": jnp.ones((3, 2)), "b": jnp.zeros((2,))}, "head": jnp.ones((2,))}
_QN = 16.0


def _joint_sensitivity(sigma_delta, sigma_b, g, k=1, r=1.0, dim=5):
  """mu = sqrt(shift^T Sigma^-1 shift) of one example for the whole (gradient, counts) release.

  Explicit covariance and worst-case shift: the gradient block moves by a vector of
  norm r (noise std sigma_Delta per coordinate), each of the k G counts by 1/2 (std
  sigma_b). Solved with a dense linear system, independently of the closed form.
  """
  u = np.linspace(1.0, 2.0, dim)
  shift = np.concatenate([r * u / np.linalg.norm(u), np.full(k * g, 0.5)])
  cov = np.diag(np.concatenate([np.full(dim, sigma_delta ** 2), np.full(k * g, sigma_b ** 2)]))
  return float(np.sqrt(shift @ np.linalg.solve(cov, shift)))


@pytest.mark.parametrize("sigma,sigma_b,g,k,r", [
    (1.0, 12.8, 1, 1, 1.0), (1.0, 12.8, 7, 1, 1.0), (0.6, 3.0, 5, 1, 1.0),
    (2.0, 40.0, 12, 3, 1.0), (0.9, 2.5, 4, 2, 1.7)])
def test_sigma_delta_makes_the_joint_gaussian_cost_sigma(sigma, sigma_b, g, k, r):
  sd = adaptive_accounting.per_layer_gradient_noise_multiplier(
      sigma, sigma_b, g, participations=k, sensitivity_ratio=r)
  # The run is the Gaussian mechanism of multiplier sigma: sensitivity r / sigma in noise units.
  mu = _joint_sensitivity(sd, sigma_b, g, k, r)
  assert mu == pytest.approx(r / sigma, rel=1e-10)
  assert mu <= r / sigma  # sigma_Delta is rounded up: never less noise than calibrated
  assert sd == pytest.approx(r * (((sigma / r) ** -2 - k * g / (2 * sigma_b) ** 2) ** -0.5),
                             rel=1e-11)
  joint = adaptive_accounting.joint_noise_multiplier(sd / r, sigma_b, participations=k * g)
  assert joint == pytest.approx(sigma / r, rel=1e-11)


def test_default_count_noise_makes_sigma_delta_independent_of_g():
  cfg = ac.AdaptiveClipNorm(initial=0.1)
  flat = ac.gradient_noise_multiplier(1.0, cfg.resolved_count_noise_multiplier(_QN))
  for g in (1, 2, 5, 30):
    sb = cfg.resolved_count_noise_multiplier(_QN, g)
    assert ac.per_layer_gradient_noise_multiplier(1.0, sb, g) == pytest.approx(flat, rel=1e-13)
  # A fixed sigma_b: every extra count takes budget from the gradient.
  fixed = [ac.per_layer_gradient_noise_multiplier(1.0, 3.0, g) for g in (1, 2, 5, 30)]
  assert fixed == sorted(fixed) and fixed[0] < fixed[-1]
  assert ac.per_layer_gradient_noise_multiplier(0.0, 1.0, 50) == 0.0


@pytest.mark.parametrize("sigma_b,k,r,largest", [(1.0, 1, 1.0, 3), (1.0, 2, 1.0, 1),
                                                 (1.0, 1, 2.0, 15), (2.5, 1, 1.0, 24)])
def test_feasible_exactly_below_the_bound(sigma_b, k, r, largest):
  # G < (2 r sigma_b / sigma)^2 / k, with sigma = 1: the bound is an integer in every case here.
  kw = dict(participations=k, sensitivity_ratio=r)
  assert adaptive_accounting.per_layer_gradient_noise_multiplier(1.0, sigma_b, largest, **kw) > 0
  with pytest.raises(ValueError, match=f"num_groups={largest + 1} .*count_noise_multiplier"):
    adaptive_accounting.per_layer_gradient_noise_multiplier(1.0, sigma_b, largest + 1, **kw)


def test_bad_arguments_of_the_split_are_named():
  f = adaptive_accounting.per_layer_gradient_noise_multiplier
  with pytest.raises(ValueError, match="num_groups"):
    f(1.0, 2.0, 0)
  with pytest.raises(ValueError, match="count_noise_multiplier"):
    f(1.0, 0.0, 2)
  with pytest.raises(ValueError, match="sensitivity_ratio"):
    f(1.0, 2.0, 2, sensitivity_ratio=-1.0)
  with pytest.raises(ValueError, match="too small"):  # one group: the flat message
    f(1.0, 0.4, 1)


def _factory(calls, key=jax.random.key(11)):
  def build(sigma_delta):
    calls.append(sigma_delta)
    return transforms.noisy_aggregate(sigma_delta, 1.0, _QN, key)
  return build


def _run(tx, steps=3, params=_PARAMS):
  state = tx.init(params)
  outs = []
  update = tx.update
  g = len(jax.tree.leaves(params))
  for t in range(steps):
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.3 * (t + 1), jnp.float32), params)
    count = jnp.arange(g, dtype=jnp.float32) - 1.0 * t
    out, state = update((grads, count), state, params)
    outs.append(out)
  return outs, state


def _assert_bitwise(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb) and jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(la, lb):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    assert x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("extra", [{}, {"count_noise_multiplier": 6.0, "participations": 2,
                                        "sensitivity_ratio": 1.5}])
def test_bit_identical_to_the_transform_built_for_known_g(extra):
  cfg = ac.AdaptiveClipNorm(initial=0.5)
  common = dict(noise_multiplier=0.9, expected_batch_size=_QN, key=jax.random.key(4), **extra)
  known_calls, params_calls = [], []
  known = ac.per_layer_adaptive_clip_noise(_factory(known_calls), cfg, num_groups=3, **common)
  deferred = ac.per_layer_adaptive_clip_noise(_factory(params_calls), cfg, num_groups="params",
                                              **common)
  assert params_calls == []  # sigma_Delta needs G: nothing is built before init
  out_a, state_a = _run(known)
  out_b, state_b = _run(deferred)
  _assert_bitwise(out_a, out_b)
  _assert_bitwise(state_a, state_b)
  assert params_calls == known_calls and len(params_calls) == 1  # built once, same sigma_Delta
  sb = cfg.resolved_count_noise_multiplier(_QN, 3) if not extra else 6.0
  assert params_calls[0] == adaptive_accounting.per_layer_gradient_noise_multiplier(
      0.9, sb, 3, participations=extra.get("participations", 1),
      sensitivity_ratio=extra.get("sensitivity_ratio", 1.0))


def test_adaptive_noisy_aggregate_passes_params_through():
  cfg = ac.AdaptiveClipNorm(initial=0.5)
  kw = dict(noise_multiplier=1.0, expected_batch_size=_QN, key=jax.random.key(5), per_layer=True)
  out_a, state_a = _run(ac.adaptive_noisy_aggregate(cfg, num_groups=3, **kw), steps=2)
  out_b, state_b = _run(ac.adaptive_noisy_aggregate(cfg, num_groups="params", **kw), steps=2)
  _assert_bitwise((out_a, state_a), (out_b, state_b))
  with pytest.raises(ValueError, match="per_layer=True"):
    ac.adaptive_noisy_aggregate(cfg, noise_multiplier=1.0, expected_batch_size=_QN,
                                key=jax.random.key(5), num_groups="params")


def test_state_is_a_clip_norm_per_params_leaf():
  cfg = ac.AdaptiveClipNorm(initial=0.25)
  kb, kg = jax.random.split(jax.random.key(6))
  tx = ac.per_layer_adaptive_clip_noise(
      lambda s: transforms.noisy_aggregate(s, 1.0, _QN, kg), cfg, noise_multiplier=1.0,
      expected_batch_size=_QN, key=kb, num_groups="params")
  state = tx.init(_PARAMS)
  assert isinstance(state, ac.AdaptiveClipState)
  clip = ac.current_clip_norm(state)
  assert jax.tree.structure(clip) == jax.tree.structure(_PARAMS)
  for c in jax.tree.leaves(clip):
    assert c.shape == () and c.dtype == jnp.float32 and float(c) == np.float32(0.25)
  assert state.count.dtype == jnp.int32 and int(state.count) == 0
  assert np.array_equal(jax.random.key_data(state.key), jax.random.key_data(kb))
  assert np.array_equal(jax.random.key_data(state.inner.key), jax.random.key_data(kg))
  _, new = _run(tx, steps=2)
  assert jax.tree.structure(new) == jax.tree.structure(state) and int(new.count) == 2
  assert any(float(c) != np.float32(0.25) for c in jax.tree.leaves(ac.current_clip_norm(new)))
  # A transform rebuilt from the same arguments (a restored run) continues from a state it did
  # not initialise: G is read from the state's clip norms.
  calls = []
  again = ac.per_layer_adaptive_clip_noise(
      _factory(calls, kg), cfg, noise_multiplier=1.0, expected_batch_size=_QN, key=kb,
      num_groups="params")
  grads = jax.tree.map(jnp.ones_like, _PARAMS)
  count = jnp.zeros((3,), jnp.float32)
  _assert_bitwise(again.update((grads, count), new, _PARAMS), tx.update((grads, count), new,
                                                                         _PARAMS))
  assert len(calls) == 1


def test_refusals_name_the_argument_before_any_noise():
  cfg = ac.AdaptiveClipNorm(initial=0.5, count_noise_multiplier=1.0)
  calls = []
  common = dict(noise_multiplier=1.0, expected_batch_size=_QN, key=jax.random.key(7),
                num_groups="params")
  tx = ac.per_layer_adaptive_clip_noise(_factory(calls), cfg, **common)  # G = 1, 2, 3 feasible
  assert len(jax.tree.leaves(tx.init(_PARAMS))) > 0 and len(calls) == 1
  four = {**_PARAMS, "extra": jnp.ones(())}  # G = 4 = (2 sigma_b / sigma)^2: infeasible
  with pytest.raises(ValueError, match="params has 4 leaves.*num_groups=4.*count_noise_multiplier"):
    tx.init(four)
  assert len(calls) == 1  # the inner noise was never built for G = 4
  with pytest.raises(ValueError, match="no leaves"):
    tx.init({})
  with pytest.raises(ValueError, match="too small"):  # infeasible even for one group: at once
    ac.per_layer_adaptive_clip_noise(_factory(calls), ac.AdaptiveClipNorm(
        initial=0.5, count_noise_multiplier=0.4), **common)
  with pytest.raises(ValueError, match="num_groups must be a positive int or 'params'"):
    ac.per_layer_adaptive_clip_noise(_factory(calls), cfg, **{**common, "num_groups": "leaves"})
  with pytest.raises(ValueError, match="leave groups=None"):
    ac.per_layer_adaptive_clip_noise(_factory(calls), cfg, groups={"dense": 0.5, "head": 0.5},
                                     **common)
  with pytest.raises(TypeError, match="noise_multiplier is required"):
    ac.per_layer_adaptive_clip_noise(_factory(calls), cfg, **{**common, "noise_multiplier": None})
  with pytest.raises(TypeError, match="inner must be a factory"):
    ac.per_layer_adaptive_clip_noise(3.0, cfg, **common)
  with pytest.raises(ValueError, match="expected_batch_size"):
    ac.per_layer_adaptive_clip_noise(_factory(calls), cfg, **{**common, "expected_batch_size": 0})
  with pytest.raises(TypeError, match="AdaptiveClipState"):
    tx.update((_PARAMS, jnp.zeros(3)), {"not": "a state"})
  assert len(calls) == 1


def test_a_patched_split_reaches_the_noise_built_at_init(monkeypatch):
  # The power suite mutates adaptive_accounting.gradient_noise_multiplier: the G read at init
  # must go through it (the noise built then is scaled with it).
  calls = []
  cfg = ac.AdaptiveClipNorm(initial=0.5)
  tx = ac.per_layer_adaptive_clip_noise(_factory(calls), cfg, noise_multiplier=1.0,
                                        expected_batch_size=_QN, key=jax.random.key(8),
                                        num_groups="params")
  honest = ac.per_layer_gradient_noise_multiplier(
      1.0, cfg.resolved_count_noise_multiplier(_QN, 3), 3)
  original = adaptive_accounting.gradient_noise_multiplier
  monkeypatch.setattr(adaptive_accounting, "gradient_noise_multiplier",
                      lambda *a, **k: 0.8 * original(*a, **k))
  tx.init(_PARAMS)
  assert calls == [pytest.approx(0.8 * honest, rel=1e-14)]
