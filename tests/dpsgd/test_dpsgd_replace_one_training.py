"""DP-SGD trained and accounted for replace-one neighbours (``neighbouring="replace_one"``).

The mechanism is the same as for add/remove (Gaussian noise of std ``z C`` on
the clipped sum); only the accounting differs. So the released parameters are
bit-identical to an add/remove run with the same key and noise multiplier, and
the event, epsilon and guarantee carry the replace-one analysis
(:mod:`jaxdp.accounting.dpsgd_accounting`).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.accounting import PrivacyAccountant, dpsgd_accounting
from jaxdp import dpsgd

N, D, K = 32, 4, 3
Z, DELTA = 2.0, 1e-5


def _data():
  rng = np.random.default_rng(0)
  return rng.normal(size=(N, D)).astype(np.float32), rng.integers(0, K, N).astype(np.int32)


def test_linear_dpsgd_same_release_replace_one_accounting():
  x, y = _data()
  kw = dict(num_classes=K, noise_multiplier=Z, delta=DELTA, epochs=2.0,
            expected_batch_size=float(N), accountant="pld")
  add = dpsgd.linear_dpsgd(jax.random.key(3), x, y, **kw)
  rep = dpsgd.linear_dpsgd(jax.random.key(3), x, y, neighbouring="replace_one", **kw)
  np.testing.assert_array_equal(np.asarray(add.weights), np.asarray(rep.weights))
  expected = dpsgd_accounting.dpsgd_epsilon(Z, rep.sample_rate, rep.steps, DELTA, "pld",
                                            neighbouring="replace_one")
  assert rep.epsilon == pytest.approx(expected, rel=1e-12)
  assert rep.epsilon > add.epsilon
  acc = PrivacyAccountant()
  acc.spend(rep.event)
  assert acc.neighbouring == "replace_one"
  assert acc.get_epsilon(DELTA, "pld") == pytest.approx(rep.epsilon, rel=1e-9)


class _Linear(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(K, use_bias=False)(x)


def test_train_dpsgd_replace_one_guarantee_and_ledger():
  x, y = _data()
  acc = PrivacyAccountant()
  res = dpsgd.train_dpsgd(_Linear(), x, y, key=jax.random.key(1), epochs=1.0, l2_clip_norm=1.0,
                          delta=DELTA, sample_rate=1.0, noise_multiplier=Z,
                          optimizer=optax.sgd(0.1), accountant=acc, accountant_method="pld",
                          neighbouring="replace_one")
  assert res.guarantee.neighbouring == "replace_one"
  assert res.guarantee.method == "pld"
  assert acc.neighbouring == "replace_one"
  assert acc.get_epsilon(DELTA, "pld") == pytest.approx(res.epsilon, rel=1e-9)
  # One full-batch step: the Gaussian mechanism of sensitivity 2C at std Z C.
  assert res.epsilon == pytest.approx(
      dpsgd_accounting.dpsgd_epsilon(Z / 2, 1.0, 1, DELTA, "pld"), rel=1e-9)


def test_make_private_replace_one_pays_replace_one_steps():
  private = dpsgd.make_private(lambda w, x, y: jnp.sum((x @ w - y) ** 2), l2_clip_norm=1.0,
                               num_examples=N, expected_batch_size=8.0, noise_multiplier=Z,
                               delta=DELTA, steps=3, key=jax.random.key(2),
                               accountant_method="pld", neighbouring="replace_one")
  acc = PrivacyAccountant()
  sampler = private.sampler(acc)
  sampler.pay(2)
  assert acc.neighbouring == "replace_one"
  assert private.step_event().event.neighbouring == "replace_one"
  assert private.step_event().event.noise_multiplier == pytest.approx(Z / 2)
  g = sampler.guarantee()
  assert g.neighbouring == "replace_one"
  assert g.epsilon == pytest.approx(acc.get_epsilon(DELTA, "pld"), rel=1e-9)


@pytest.mark.parametrize("call", [
    lambda x, y: dpsgd.linear_dpsgd(jax.random.key(0), x, y, num_classes=K, noise_multiplier=Z,
                                    delta=DELTA, neighbouring="replace_one"),
    lambda x, y: dpsgd.train_dpsgd(_Linear(), x, y, key=jax.random.key(0), epochs=1.0,
                                   l2_clip_norm=1.0, delta=DELTA, sample_rate=1.0,
                                   noise_multiplier=Z, neighbouring="replace_one"),
    lambda x, y: dpsgd.make_private(lambda w, a, b: jnp.sum(a @ w), l2_clip_norm=1.0,
                                    num_examples=N, expected_batch_size=8.0,
                                    noise_multiplier=Z, delta=DELTA, steps=3,
                                    key=jax.random.key(0), neighbouring="replace_one"),
    lambda x, y: dpsgd.linear_dpsgd(jax.random.key(0), x, y, num_classes=K, noise_multiplier=Z,
                                    delta=DELTA, accountant="pld", neighbouring="swap"),
])
def test_bad_relation_or_rdp_is_refused_before_any_work(call):
  x, y = _data()
  with pytest.raises(ValueError, match="neighbouring|accountant"):
    call(x, y)
