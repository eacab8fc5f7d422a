"""Regression tests of the DP-SGD defects found by the privacy conformance suite (issue 26).

* ``linear_dpsgd`` drew its noise with ``jax.random.normal`` (truncated near 5.4
  sigma: the privacy loss of a truncated Gaussian is unbounded at the cut) and
  cast ``z c`` to float32 to nearest (up to half an ulp less noise than
  calibrated). It now uses the library's full-tail sampler with the std rounded up.
* Non-private values were returned under names that do not say so:
  ``train_dpsgd``'s ``history[i]["train_loss"]`` (the un-noised loss of the
  batches) and ``make_private``'s ``StepInfo`` fields.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import mechanisms
from jaxdp.accounting import PrivacyAccountant
from jaxdp import dpsgd

N, D, C = 16, 4, 3


def test_linear_dpsgd_noise_is_the_full_tail_sampler_with_std_rounded_up():
  # x = 0: every gradient is 0, so one step at q = 1 with lr = q N = 16 releases exactly -Z.
  # 1.3 is not a float32: round-to-nearest gives 1.29999995 < 1.3, the sampler must round up.
  key = jax.random.key(3)
  x = np.zeros((N, D), np.float32)
  y = np.arange(N, dtype=np.int32) % C
  out = dpsgd.linear_dpsgd(key, x, y, num_classes=C, noise_multiplier=1.3, delta=1e-5,
                           epochs=1.0, expected_batch_size=float(N), l2_clip_norm=1.0,
                           learning_rate=float(N), momentum=0.0)
  _, k_noise = jax.random.split(jax.random.split(key, 1)[0])
  expected = mechanisms.gaussian_noise(k_noise, (D, C), 1.3, jnp.float32)  # concrete: rounded up
  assert float(np.float32(1.3)) < 1.3 < float(mechanisms.noise_scale_as(1.3, jnp.float32))
  np.testing.assert_array_equal(np.asarray(out.weights), -np.asarray(expected))


class _Linear(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(C, use_bias=False)(x)


def _data():
  rng = np.random.default_rng(0)
  return rng.normal(size=(N, D)).astype(np.float32), (np.arange(N) % C).astype(np.int32)


def test_train_dpsgd_history_names_its_nonprivate_loss():
  x, y = _data()
  res = dpsgd.train_dpsgd(_Linear(), x, y, key=jax.random.key(0), epochs=1.0, l2_clip_norm=1.0,
                          delta=1e-5, sample_rate=1.0, noise_multiplier=1.0, accountant=None)
  last = res.history[-1]
  assert "train_loss" not in last
  assert np.isfinite(last["nonprivate_train_loss"]) and last["nonprivate_train_loss"] > 0


def test_make_private_step_info_fields_say_nonprivate():
  x, y = _data()
  loss = lambda w, xi, yi: optax.softmax_cross_entropy_with_integer_labels(xi @ w, yi)
  private = dpsgd.make_private(loss, l2_clip_norm=1.0, num_examples=N, key=jax.random.key(1),
                               sample_rate=1.0, noise_multiplier=1.0, delta=1e-5, steps=1)
  w0 = jnp.zeros((D, C), jnp.float32)
  sampler = private.sampler(PrivacyAccountant())
  _, _, info = private.step(w0, private.init(w0), sampler.sample().gather(x, y))
  fields = {f for f in info.__dataclass_fields__}
  assert fields == {"nonprivate_loss_sum", "nonprivate_num_examples", "nonprivate_num_clipped"}
  assert int(info.nonprivate_num_examples) == N and float(info.nonprivate_loss_sum) > 0
  for old_name in ("num_examples", "loss_sum", "num_clipped"):  # no alias that hides the rule
    assert not hasattr(info, old_name)
