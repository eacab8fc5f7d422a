"""make_private's wired cells: fixed-size / user selection x {adaptive clip, correlated noise}, per-layer adaptive.

The plan-cell product (test_plan_cells.py) trains every cell and checks its ledger; here:
the refusals that stay, with their reasons, before anything is paid; the calibration and the
run event of a correlated-noise run on fixed-size batches and on users (unamplified matrix
mechanism, notes in correlated/accounting.py); the adaptive split against the selections' own
analyses (FixedSizeSampler / UserPoissonSampler.adaptive_gradient_noise_multiplier); per-layer
adaptive clipping (one clip norm, quantile and noisy count per params leaf): the reported
per-group clip norms, host == device, vmap == ghost, and an infeasible G refused at init.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.accounting import PrivacyAccountant, events
from jaxdp.dpsgd import AdaptiveClipNorm, adaptive_clipping, make_private
from jaxdp.dpsgd.correlated import BandMF
from jaxdp.dpsgd.fixed_size_sampling import FixedSizeSampler
from jaxdp.dpsgd.user_sampling import UserPoissonSampler

N, D, K = 64, 4, 3
RNG = np.random.default_rng(3)
X = RNG.normal(size=(N, D)).astype(np.float32)
X[:, 0] *= 20.0  # the w gradients are large, the b gradients small: the groups differ
Y = RNG.integers(0, K, N).astype(np.int32)
USERS = RNG.integers(0, 16, N)


def _loss(params, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(x @ params["w"] + params["b"], y)


def _params():
  return {"w": jnp.zeros((D, K)), "b": jnp.zeros((K,))}


def _fixed(**kw):
  base = dict(num_examples=N, key=jax.random.key(0), noise_multiplier=1.0, steps=3,
              batch_selection=FixedSizeSampler(N, 16), neighbouring="replace_one",
              l2_clip_norm=1.0)
  base.update(kw)
  return make_private(_loss, **base)


def _users(**kw):
  base = dict(num_examples=N, key=jax.random.key(0), noise_multiplier=1.0, steps=3,
              batch_selection=UserPoissonSampler(USERS, sample_rate=0.5,
                                                 max_examples_per_user=16),
              l2_clip_norm=1.0)
  base.update(kw)
  return make_private(_loss, **base)


@pytest.mark.parametrize("build, kw, match", [
    (_fixed, dict(noise_strategy=BandMF(np.array([1.0, 0.5])), min_separation=2),
     "min_separation=2 is not available with batch_selection=FixedSizeSampler: .*no separation"),
    (_users, dict(noise_strategy=BandMF(np.array([1.0, 0.5])), min_separation=2),
     "min_separation=2 is not available with batch_selection=UserPoissonSampler: .*cyclic"),
    (_fixed, dict(neighbouring="add_remove"), "needs neighbouring='replace_one'"),
    (_fixed, dict(accountant_method="pld"), "RDP only"),
    (_fixed, dict(accountant_method="pld", l2_clip_norm=AdaptiveClipNorm(initial=1.0)),
     "RDP only"),
    (_fixed, dict(accountant_method="pld", noise_strategy=BandMF.dp_sgd()), "RDP only"),
    (_users, dict(per_layer=True), "per_layer=True is not available with .*UserPoissonSampler"),
    (_users, dict(per_layer=True, l2_clip_norm=AdaptiveClipNorm(initial=1.0)),
     "per_layer=True is not available"),
    (_users, dict(microbatch_size=4), "microbatch_size=4 is not available"),
], ids=["fixed-min_sep", "user-min_sep", "fixed-add_remove", "fixed-pld", "fixed-adaptive-pld",
        "fixed-one_band-pld", "user-per_layer", "user-per_layer-adaptive", "user-microbatch"])
def test_refused_cells_state_their_reason(build, kw, match, tmp_path):
  with pytest.raises(ValueError, match=match):
    build(checkpoint_dir=tmp_path, **kw)
  assert not list(tmp_path.iterdir())  # refused before anything was written


def test_fixed_size_bandmf_pays_the_unamplified_run():
  strategy = BandMF(np.array([1.0, 0.5]))
  sampler = FixedSizeSampler(N, 16)
  plan = _fixed(noise_strategy=strategy, delta=1e-5, batch_selection=sampler)
  assert plan.run_event() == sampler.mf_event(strategy, 1.0, 3)
  assert isinstance(plan.run_event(), events.GaussianDpEvent)  # one Gaussian: no amplification
  assert plan.run_event().neighbouring == "replace_one"
  # A multi-band run's event is one Gaussian: PLD applies as well (epsilon: slow test below).
  assert _fixed(noise_strategy=strategy, accountant_method="pld").accountant_method == "pld"


@pytest.mark.slow
def test_fixed_size_bandmf_calibrates_to_the_target():
  strategy = BandMF(np.array([1.0, 0.5]))
  sampler = FixedSizeSampler(N, 16)
  pld = _fixed(noise_strategy=strategy, accountant_method="pld", delta=1e-5)
  assert pld.epsilon(3) == pytest.approx(sampler.mf_epsilon(strategy, 1.0, 3, 1e-5, "pld"))
  plan = _fixed(noise_strategy=strategy, target_epsilon=8.0, delta=1e-5, noise_multiplier=None,
                batch_selection=sampler)
  assert plan.noise_multiplier == sampler.calibrate_mf_noise_multiplier(strategy, 8.0, 1e-5, 3)
  assert plan.epsilon(3) <= 8.0
  assert plan.run_event() == sampler.mf_event(strategy, plan.noise_multiplier, 3)


def test_user_bandmf_pays_the_users_mf_event():
  strategy = BandMF(np.array([1.0, 0.5]))
  plan = _users(noise_strategy=strategy, delta=1e-5)
  assert plan.run_event() == plan.batch_selection.mf_event(strategy, 1.0, 3)
  acc = PrivacyAccountant(unit="user")
  sampler = plan.sampler(acc)
  params, state = _params(), plan.init(_params())
  for _ in range(3):
    params, state, _ = plan.step(params, state, sampler.sample().gather(X, Y))
  assert acc.ledger == ((plan.run_event(), 1),)


@pytest.mark.parametrize("strategy", [None, BandMF(np.array([1.0, 0.5]))], ids=["dpsgd", "bandmf"])
@pytest.mark.parametrize("build", [_fixed, _users], ids=["fixed_size", "user"])
def test_adaptive_split_is_the_selections_own(build, strategy):
  config = AdaptiveClipNorm(initial=0.5, count_noise_multiplier=3.0)
  plan = build(l2_clip_norm=config, noise_strategy=strategy)
  want = plan.batch_selection.adaptive_gradient_noise_multiplier(
      1.0, 3.0, noise_strategy=strategy, steps=3)
  assert plan.gradient_noise_multiplier == pytest.approx(want, rel=1e-12)
  assert plan.gradient_noise_multiplier > 1.0
  # The step event is unchanged: the split makes gradient and count cost sigma together.
  if strategy is None:
    bs = plan.batch_selection
    assert plan.step_event() == bs.event(1.0).event


def test_per_layer_adaptive_split_for_the_params_groups():
  config = AdaptiveClipNorm(initial=0.5, count_noise_multiplier=3.0)
  plan = _fixed(l2_clip_norm=config, per_layer=True)
  one_group = plan.gradient_noise_multiplier
  plan.init(_params())  # G = 2 leaves: two counts of std 3 share sigma
  want = plan.batch_selection.adaptive_gradient_noise_multiplier(1.0, 3.0, num_counts=2)
  assert plan.gradient_noise_multiplier == pytest.approx(want, rel=1e-12)
  assert plan.gradient_noise_multiplier > one_group
  assert plan.noise_stddev == plan.gradient_noise_multiplier  # units of D (sensitivity 1)
  # A count noise too small for G = 2 (feasible for one group) is refused at init.
  tight = _fixed(l2_clip_norm=AdaptiveClipNorm(initial=0.5, count_noise_multiplier=0.6),
                 per_layer=True)
  with pytest.raises(ValueError, match="num_groups=2 .*count_noise_multiplier"):
    tight.init(_params())


def _run_per_layer(device: bool, method: str = "auto", steps: int = 3):
  plan = make_private(_loss, num_examples=N, key=jax.random.key(1), noise_multiplier=1.0,
                      steps=steps, expected_batch_size=16.0, per_layer=True,
                      clipping_method=method, learning_rate=0.1,
                      l2_clip_norm=AdaptiveClipNorm(initial=1.0, learning_rate=0.5))
  acc = PrivacyAccountant()
  sampler = plan.sampler(acc, data=(X, Y) if device else None)
  params = _params()
  state = plan.init(params)
  norms = [plan.clip_norm(state)]
  for _ in range(steps):
    batch = sampler.sample()
    params, state, _ = plan.step(params, state, batch if device else batch.gather(X, Y))
    norms.append(plan.clip_norm(state))
  return params, norms, acc, plan


def test_per_layer_adaptive_reports_one_clip_norm_per_group_and_pays_sigma():
  params, norms, acc, plan = _run_per_layer(device=False)
  assert norms[0] == {"w": 1.0, "b": 1.0}
  assert all(isinstance(v, float) for v in jax.tree.leaves(norms[-1]))
  # Each group tracks its own quantile: w's gradients (x scaled by 20) grow its clip norm
  # past b's.
  assert norms[-1]["w"] > norms[-1]["b"]
  assert acc.ledger == ((plan.step_event(), 3),)
  assert np.isfinite(np.asarray(params["w"])).all()


@pytest.mark.slow
def test_per_layer_adaptive_device_equals_host_and_ghost_equals_vmap():
  host, host_norms, _, _ = _run_per_layer(device=False, method="vmap")
  device, device_norms, _, _ = _run_per_layer(device=True, method="vmap")
  ghost, ghost_norms, _, _ = _run_per_layer(device=False, method="ghost")
  for other, other_norms in ((device, device_norms), (ghost, ghost_norms)):
    for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(other)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    for a, b in zip(host_norms, other_norms):
      assert a == pytest.approx(b, rel=1e-4)


def test_fixed_size_per_layer_and_microbatches_train():
  outs = []
  for kw in (dict(per_layer=True), dict(per_layer=True, microbatch_size=4)):
    plan = _fixed(**kw)
    sampler = plan.sampler(PrivacyAccountant(neighbouring="replace_one"))
    params, state = _params(), plan.init(_params())
    for _ in range(3):
      params, state, _ = plan.step(params, state, sampler.sample().gather(X, Y))
    outs.append(params)
  # Microbatches only chunk the computation: every example is still clipped, same release.
  for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
