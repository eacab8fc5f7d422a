"""Tests of the Flax models used with DP-SGD (paper 000 Section 4.3 for ResNet-20)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp import models


def _num_params(model, shape):
  variables = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros(shape))
  return sum(int(np.prod(v.shape)) for v in jax.tree.leaves(variables))


def test_parameter_counts():
  assert _num_params(models.LinearClassifier(), (1, 784)) == 784 * 10 + 10
  assert _num_params(models.MLP(hidden_sizes=(256,)), (1, 784)) == 784 * 256 + 256 + 256 * 10 + 10
  # SmallCNN: conv 8x8x1x16 + 16, conv 4x4x16x32 + 32, dense (4*4*32)x32 + 32, dense 32x10 + 10.
  assert _num_params(models.SmallCNN(), (1, 784)) == (
      8 * 8 * 16 + 16 + 4 * 4 * 16 * 32 + 32 + 512 * 32 + 32 + 32 * 10 + 10)
  # ResNet-20 (He et al. 2016 Sec. 4.2, "0.27M"): 19 bias-free 3x3 convs, type-A
  # shortcuts without parameters, 19 GroupNorms (scale + bias), one dense layer.
  convs = 3 * 9 * 16 + 6 * 9 * 16 * 16 + (9 * 16 * 32 + 5 * 9 * 32 * 32) + (9 * 32 * 64 + 5 * 9 * 64 * 64)
  norms = 2 * (7 * 16 + 6 * 32 + 6 * 64)
  assert _num_params(models.ResNet20(), (1, 32, 32, 3)) == convs + norms + 64 * 10 + 10 == 269_722


def test_output_shapes_and_groupnorm_groups():
  x = jnp.ones((2, 784))
  for m in (models.LinearClassifier(), models.MLP(), models.SmallCNN()):
    v = jax.eval_shape(m.init, jax.random.key(0), x)
    assert jax.eval_shape(m.apply, v, x).shape == (2, 10)
  r = models.ResNet20(blocks_per_stage=1)
  v = jax.eval_shape(r.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  gn = {k: p for k, p in v["params"].items() if k.startswith("GroupNorm")}
  assert gn and all(p["scale"].shape == (16,) for p in gn.values())
  # GroupNorm(min(32, C)) as in the paper's code; the module records num_groups.
  assert models.resnet._group_norm(64, 32).num_groups == 32
  assert models.resnet._group_norm(16, 32).num_groups == 16


def test_type_a_shortcut_shapes():
  block = models.BasicBlock(planes=32, stride=2)
  x = jax.random.normal(jax.random.key(0), (1, 8, 8, 16))
  v = jax.eval_shape(block.init, jax.random.key(1), x)
  assert jax.eval_shape(block.apply, v, x).shape == (1, 4, 4, 32)
  # Only the two convolutions and two norms carry parameters (no projection shortcut).
  assert sorted(v["params"]) == ["Conv_0", "Conv_1", "GroupNorm_0", "GroupNorm_1"]


def test_resnet_examples_are_independent():
  # GroupNorm normalises each example alone, so a per-example gradient depends
  # only on that example (what per-example clipping needs; BatchNorm fails this).
  # Two stages of one block: the stem, GroupNorms and a stride-2 type-A shortcut, as in the
  # ResNet-20 (fewer convolutions to compile; the property holds layer by layer).
  model = models.ResNet20(blocks_per_stage=1, widths=(4, 8), max_groups=4)
  x = jax.random.normal(jax.random.key(0), (3, 12, 12, 3))  # small images keep compile time low
  v = jax.jit(model.init)(jax.random.key(1), x)

  @jax.jit
  def both(v, x):  # one compilation: the batch at once, and each example alone
    return model.apply(v, x), jax.vmap(lambda xi: model.apply(v, xi[None])[0])(x)

  batched, alone = both(v, x)
  np.testing.assert_allclose(batched, alone, rtol=1e-4, atol=1e-5)
  x2 = x.at[2].set(100.0 * x[2])
  np.testing.assert_allclose(both(v, x2)[0][:2], batched[:2], rtol=1e-4, atol=1e-5)
  assert batched.shape == (3, 10)


@pytest.mark.parametrize("shape", [(2, 784), (2, 28, 28), (2, 28, 28, 1)])
def test_cnn_accepts_mnist_layouts(shape):
  m = models.SmallCNN()
  v = jax.eval_shape(m.init, jax.random.key(0), jnp.zeros(shape))
  assert jax.eval_shape(m.apply, v, jnp.zeros(shape)).shape == (2, 10)


@pytest.mark.parametrize("window", [(2, 2), (3, 2)])
def test_max_pool_stride1_equals_nn_max_pool(window):
  """Values and (tie-free) gradients of the slice-based pool equal nn.max_pool's."""
  import flax.linen as nn
  from jaxdp.models.cnn import max_pool_stride1
  x = jax.random.normal(jax.random.key(0), (3, 9, 8, 4))  # continuous: no ties
  ref = lambda v: nn.max_pool(v, window, strides=(1, 1))
  ours = lambda v: max_pool_stride1(v, window)

  @jax.jit
  def values_and_grads(x, ct):  # one compilation instead of eager dispatch of every op
    (y_ours, vjp_ours), (y_ref, vjp_ref) = jax.vjp(ours, x), jax.vjp(ref, x)
    return y_ours, y_ref, vjp_ours(ct)[0], vjp_ref(ct)[0]

  ct = jax.random.normal(jax.random.key(1), jax.eval_shape(ref, x).shape)
  y_ours, y_ref, g_ours, g_ref = values_and_grads(x, ct)
  np.testing.assert_array_equal(np.asarray(y_ours), np.asarray(y_ref))
  np.testing.assert_allclose(np.asarray(g_ours), np.asarray(g_ref), rtol=1e-6, atol=1e-6)


def test_small_cnn_matches_the_reduce_window_definition():
  """SmallCNN's output equals the same network written with nn.max_pool (same params)."""
  import flax.linen as nn

  class Reference(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = x.reshape((x.shape[0], 28, 28, 1))
      x = nn.max_pool(nn.relu(nn.Conv(16, (8, 8), strides=(2, 2), padding=((3, 3), (3, 3)),
                                      name="Conv_0")(x)), (2, 2), strides=(1, 1))
      x = nn.max_pool(nn.relu(nn.Conv(32, (4, 4), strides=(2, 2), padding="VALID", name="Conv_1")(x)),
                      (2, 2), strides=(1, 1))
      x = nn.relu(nn.Dense(32, name="Dense_0")(x.reshape((x.shape[0], -1))))
      return nn.Dense(10, name="Dense_1")(x)

  x = jax.random.normal(jax.random.key(0), (4, 784))

  @jax.jit
  def both(key, x):  # one compilation: the parameters, then both networks on them
    params = models.SmallCNN().init(key, x)
    return models.SmallCNN().apply(params, x), Reference().apply(params, x)

  ours, ref = both(jax.random.key(1), x)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), rtol=1e-5, atol=1e-6)
