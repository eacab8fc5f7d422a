"""make_private with an adaptive clip norm (Andrew et al. 2021), with DP-SGD and correlated noise."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.accounting import PrivacyAccountant
from jaxdp import dpsgd
from jaxdp.dpsgd import correlated
from jaxdp.dpsgd import adaptive_clipping
from jaxdp.dpsgd.adaptive_clipping import AdaptiveClipNorm

N, D, K = 1000, 5, 3
RNG = np.random.default_rng(0)
X = (RNG.normal(size=(N, D)) * RNG.lognormal(0.0, 0.5, size=(N, 1))).astype(np.float32)
Y = RNG.integers(0, K, N).astype(np.int32)


def _loss(w, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(x @ w, y)


def _run(steps=50, update=True, **kwargs):
  """Samples (and, with ``update``, applies) ``steps`` steps of a plan: (plan, state, accountant).

  The sampler pays each step as it samples it; ``update=False`` gives the ledger of the run
  without compiling and running its step.
  """
  private = dpsgd.make_private(_loss, num_examples=N, key=jax.random.key(1), sample_rate=0.2,
                               noise_multiplier=1.0, delta=1e-5, steps=steps,
                               optimizer=optax.sgd(0.0), **kwargs)
  acc = PrivacyAccountant()
  sampler = private.sampler(acc)
  w = jnp.zeros((D, K))
  state = private.init(w)
  for _ in range(steps):
    batch = sampler.sample()
    if update:
      w, state, _ = private.step(w, state, batch.gather(X, Y))
  return private, state, acc


@functools.lru_cache(maxsize=None)
def _median_norm() -> float:
  # Cached, and jitted: one compilation instead of one per primitive run op by op.
  g = jax.jit(jax.vmap(jax.grad(_loss), (None, 0, 0)))(jnp.zeros((D, K)), X, Y)
  return float(np.median(np.linalg.norm(np.asarray(g).reshape(N, -1), axis=1)))


@pytest.mark.parametrize("kwargs", [
    {}, {"noise_strategy": correlated.BandMF(np.array([1.0, 0.5]))},
    {"noise_strategy": correlated.BLT(np.array([0.7]), np.array([0.3])), "min_separation": 2},
], ids=["dpsgd", "bandmf", "blt"])
def test_clip_norm_tracks_the_median_and_the_ledger_pays_sigma(kwargs):
  # lr 0: the gradients stay those of W = 0, so the target is a fixed median.
  private, state, acc = _run(l2_clip_norm=AdaptiveClipNorm(initial=0.1, learning_rate=0.3),
                             **kwargs)
  assert abs(private.clip_norm(state) / _median_norm() - 1) < 0.1
  # The ledger of the same run with a fixed clip norm (the reference: its updates are not
  # checked, so it is only sampled, which pays each step).
  plain, _, plain_acc = _run(l2_clip_norm=1.0, steps=50, update=False, **kwargs)
  # Adaptive clipping changes nothing on the ledger: the same sigma is paid.
  assert acc.ledger == plain_acc.ledger
  assert private.noise_multiplier == plain.noise_multiplier == 1.0
  sigma_b = private.expected_batch_size / 20  # Andrew et al.'s default
  if kwargs.get("min_separation") == 2:  # BLT: deterministic run accounting
    from jaxdp.dpsgd.correlated import accounting
    r = accounting.run_sensitivity(kwargs["noise_strategy"], 50, 2)
    k = correlated.max_participations(50, 2)
    joint = r * adaptive_clipping.joint_noise_multiplier(private.gradient_noise_multiplier / r,
                                                         sigma_b, participations=k)
  else:
    joint = adaptive_clipping.joint_noise_multiplier(private.gradient_noise_multiplier, sigma_b)
  assert joint == pytest.approx(1.0, rel=1e-9)
  assert private.gradient_noise_multiplier > 1.0


def test_fixed_and_per_layer_clip_norms_are_reported():
  private = dpsgd.make_private(_loss, l2_clip_norm=0.5, num_examples=N, key=jax.random.key(0),
                               sample_rate=0.1, noise_multiplier=1.0, steps=2)
  assert private.clip_norm(private.init(jnp.zeros((D, K)))) == 0.5
  base = dict(num_examples=N, key=jax.random.key(0), sample_rate=0.1, noise_multiplier=1.0,
              steps=2)
  # Per-layer adaptive clipping: one clip norm per params leaf (here one leaf: a float).
  per_layer = dpsgd.make_private(_loss, l2_clip_norm=AdaptiveClipNorm(initial=1.0),
                                 per_layer=True, **base)
  assert per_layer.clip_norm(per_layer.init(jnp.zeros((D, K)))) == 1.0
  two = per_layer.init({"w": jnp.zeros((D, K)), "b": jnp.zeros(K)})
  assert per_layer.clip_norm(two) == {"w": 1.0, "b": 1.0}
  private = dpsgd.make_private(_loss, l2_clip_norm=AdaptiveClipNorm(initial=1.0), **base)
  # Device-resident data works too (equality with the host path: test_device_cells.py).
  assert private.sampler(PrivacyAccountant(), data=(X, Y)).device_resident
