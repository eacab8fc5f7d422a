"""Ghost norms + book-keeping (method="ghost") against materialised per-example gradients."""

from __future__ import annotations

import functools
import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import absltest, parameterized

from jaxdp import models
from jaxdp.dpsgd import clipping, ghost_norms


class _SeqModel(nn.Module):
  """Embedding -> Dense on tokens (Gram form) -> LayerNorm -> mean -> Dense (outer form)."""

  @nn.compact
  def __call__(self, ids):
    h = nn.Embed(50, 16)(ids)  # (B, T, 16)
    h = nn.tanh(nn.Dense(32)(h))
    h = nn.LayerNorm()(h)
    return nn.Dense(10)(jnp.mean(h, axis=1))


class _Scale(nn.Module):
  """A layer ghost norms do not know: must fall back to vmap."""

  @nn.compact
  def __call__(self, x):
    return x * self.param("scale", nn.initializers.ones, (x.shape[-1],))


class _Unsupported(nn.Module):
  """Unknown layer, a Dense applied twice (shared weights) and a GroupNorm."""

  @nn.compact
  def __call__(self, x):
    x = x.reshape((x.shape[0], 4, 4, 1))
    x = nn.Conv(4, (3, 3), use_bias=False)(x)  # a conv without bias (the ResNet's kind)
    x = nn.GroupNorm(num_groups=2)(x)
    x = _Scale()(x).reshape((x.shape[0], -1))
    shared = nn.Dense(64)
    x = nn.tanh(shared(nn.tanh(shared(x))))
    return nn.Dense(10)(x)


_CASES = {
    # One hidden layer: an inner dense layer (its cotangents come back through another) and an
    # output one; a second hidden layer adds the same two kinds again, and compile time.
    "mlp": (lambda: models.MLP(hidden_sizes=(16,)), (20,), "float"),
    "cnn": (models.SmallCNN, (784,), "float"),
    "resnet_gn": (lambda: models.ResNet20(blocks_per_stage=1, widths=(8, 16, 16), max_groups=4),
                  (16, 16, 3), "float"),
    "embedding": (_SeqModel, (5,), "ids"),
    "unsupported": (_Unsupported, (16,), "float"),
}


@functools.lru_cache(maxsize=None)
def _setup(name, batch=6, extra_loss=None):
  # Cached: several tests use the same model; the results are immutable (jax arrays, a pure loss).
  make, shape, kind = _CASES[name]
  model = make()

  @jax.jit  # the data and the initial params in one compiled program, not op by op
  def build():
    if kind == "ids":
      x = jax.random.randint(jax.random.key(0), (batch,) + shape, 0, 50)
      x = x.at[0, 1].set(x[0, 3])  # a repeated token: the Gram form must add its rows.
    else:
      x = jax.random.normal(jax.random.key(0), (batch,) + shape)
    y = jax.random.randint(jax.random.key(1), (batch,), 0, 10)
    return x, y, model.init(jax.random.key(2), x[:1])["params"]

  x, y, params = build()

  def loss(p, xi, yi):
    out = optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, xi[None])[0], yi)
    return out if extra_loss is None else out + extra_loss(p)

  return loss, params, x, y


@functools.lru_cache(maxsize=None)
def _reference_sq_norms(name):
  """Jitted per-example squared norm of each leaf's materialised gradient, for ``_setup(name)``.

  Cached: the per-example-norm and the clipped-sum tests of a model run the same program.
  """
  loss = _setup(name)[0]

  @jax.jit
  def reference(p, a, b):
    grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(p, a, b)
    return jax.tree.map(lambda g: jnp.sum(jnp.square(g.reshape(g.shape[0], -1)), axis=1), grads)

  return reference


def _rel_err(a, b):
  # In NumPy (float64): no compilation per leaf shape, as op-by-op jnp would need.
  return max(float(np.linalg.norm(np.asarray(u, np.float64) - np.asarray(v, np.float64))
                   / max(float(np.linalg.norm(np.asarray(v, np.float64))), 1e-12))
             for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# Default run: every model but the ResNet (the costliest compilation); its layers (bias-free
# conv, GroupNorm, dense) are in "unsupported" and "cnn", and
# test_per_example_norms_match_vmap_resnet_slow checks the ResNet itself.
_DEFAULT_NORMS = tuple(n for n in _CASES if n != "resnet_gn")


class GhostNormsTest(parameterized.TestCase):

  @parameterized.named_parameters(*[(n, n) for n in _DEFAULT_NORMS])
  def test_per_example_norms_match_vmap(self, name):
    self._check_norms(name)

  @parameterized.named_parameters(("resnet_gn", "resnet_gn"))
  @pytest.mark.slow
  def test_per_example_norms_match_vmap_resnet_slow(self, name):
    self._check_norms(name)

  def _check_norms(self, name):
    loss, params, x, y = _setup(name)
    # Jitted: one compilation each, instead of one per primitive run op by op.
    sq = jax.jit(lambda p, a, b: ghost_norms.per_example_sq_norms(
        loss, p, a, b, batch_argnums=(1, 2)))(params, x, y)
    ref = _reference_sq_norms(name)(params, x, y)
    for a, b in zip(jax.tree.leaves(sq), jax.tree.leaves(ref)):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-10)

  def _check_clipped_sum(self, name, configs):
    loss, params, x, y = _setup(name)
    mask = jnp.array([1, 0, 1, 1, 1, 0], bool)
    if x.dtype == jnp.float32:
      x = x.at[1].set(jnp.nan)  # garbage in a padding slot must not leak
    # Clip at the median norm so that the factors matter (the per-example gradient norms from
    # the reference program of test_per_example_norms_match_vmap).
    sq = _reference_sq_norms(name)(params, x, y)
    norms = np.sqrt(sum(np.asarray(v, np.float64) for v in jax.tree.leaves(sq)))
    c = float(np.nanmedian(norms))
    top = {k: c / math.sqrt(len(params)) for k in params}
    for per_layer, clip in [(p, top if clip == "tree" else c) for p, clip in configs]:
      kw = dict(l2_clip_norm=clip, batch_argnums=(1, 2), per_layer=per_layer)
      ref, ref_info = jax.jit(clipping.clipped_grad(loss, method="vmap", **kw))(
          params, x, y, mask=mask)
      fn = clipping.clipped_grad(loss, method="ghost", **kw)
      got, info = jax.jit(fn)(params, x, y, mask=mask)
      self.assertEqual(fn.sensitivity, clipping.clipped_grad(loss, method="vmap", **kw).sensitivity)
      chex.assert_tree_all_finite(got)
      self.assertLess(_rel_err(got, ref), 1e-4, msg=f"per_layer={per_layer}, clip={clip}")
      np.testing.assert_allclose(info.per_example_norms, ref_info.per_example_norms, rtol=1e-5)
      self.assertEqual(float(info.per_example_norms[1]), 0.0)
      self.assertEqual(int(info.num_clipped), int(ref_info.num_clipped))
      self.assertGreater(int(info.num_clipped), 0)
      np.testing.assert_allclose(info.loss_sum, ref_info.loss_sum, rtol=1e-5)

  _ALL = ((False, "c"), (True, "c"), (True, "tree"))
  # Default run: every configuration on some model, and every layer kind (dense, embedding,
  # LayerNorm, conv, GroupNorm, the vmap fallback) in some model (each one compiles a vmap and a
  # ghost clipped gradient); test_clipped_sum_matches_vmap_all_configurations_slow runs all three
  # on every model. The ResNet and the CNN (the costliest compilations) are in the slow tests
  # only: their layers (conv with and without bias, GroupNorm, dense) are covered here by
  # "unsupported", and their ghost norms by test_per_example_norms_match_vmap_cnn and
  # test_per_example_norms_match_vmap_resnet_slow.
  _DEFAULT = {"mlp": ((False, "c"),), "embedding": ((True, "c"),), "unsupported": ((True, "tree"),)}

  @parameterized.named_parameters(*[(n, n) for n in _DEFAULT])
  def test_clipped_sum_matches_vmap_with_mask_and_per_layer(self, name):
    self._check_clipped_sum(name, self._DEFAULT[name])

  # The mark goes UNDER named_parameters: absl copies the function's __dict__ (pytestmark
  # included) onto each generated test; a mark above it is lost and the test ran by default.
  @parameterized.named_parameters(*[(n, n) for n in _CASES])
  @pytest.mark.slow
  def test_clipped_sum_matches_vmap_all_configurations_slow(self, name):
    self._check_clipped_sum(name, self._ALL)

  def test_plan_covers_known_layers_and_falls_back_for_the_rest(self):
    loss, params, x, y = _setup("unsupported")
    plan = ghost_norms.make_plan(loss, params, x, y, batch_argnums=(1, 2))
    covered = {c.path: c.kind for c in plan.calls}
    self.assertEqual(covered, {("Conv_0",): "conv", ("GroupNorm_0",): "norm", ("Dense_1",): "dense"})
    # The unknown layer and the Dense used twice get per-example gradients from vmap.
    self.assertEqual(sorted(plan.fallback_paths),
                     ["['Dense_0']['bias']", "['Dense_0']['kernel']", "['_Scale_0']['scale']"])
    plan = ghost_norms.make_plan(*_setup("embedding")[:1], _setup("embedding")[1],
                                 *_setup("embedding")[2:], batch_argnums=(1, 2))
    self.assertEqual({c.path: c.strategy for c in plan.calls},
                     {("Embed_0",): "gram", ("Dense_0",): "gram", ("LayerNorm_0",): "materialise",
                      ("Dense_1",): "outer"})
    self.assertEqual(plan.fallback_paths, [])

  def test_parameter_used_outside_its_layer_falls_back(self):
    # Weight decay on one kernel inside the per-example loss: that kernel's gradient
    # is not a_n^T delta_n alone, so its ghost norm would be wrong; it must be detected.
    def decay(p):
      return 0.05 * jnp.sum(jnp.square(p["Dense_1"]["kernel"]))

    loss, params, x, y = _setup("mlp", extra_loss=decay)
    plan = ghost_norms.make_plan(loss, params, x, y, batch_argnums=(1, 2))
    self.assertIn("['Dense_1']['kernel']", plan.fallback_paths)
    self.assertNotIn("['Dense_0']['kernel']", plan.fallback_paths)
    self.assertNotIn(("Dense_1",), [c.path for c in plan.calls])
    kw = dict(l2_clip_norm=0.5, batch_argnums=(1, 2))
    ref, _ = jax.jit(clipping.clipped_grad(loss, method="vmap", **kw))(params, x, y)
    got, _ = jax.jit(clipping.clipped_grad(loss, method="ghost", **kw))(params, x, y)
    self.assertLess(_rel_err(got, ref), 1e-4)

  def test_clipped_contribution_never_exceeds_clip_norm(self):
    # One example at a time: the float32 sum must have norm <= c (checked in float64).
    loss, params, x, y = _setup("embedding")
    c = 1e-3  # far below every per-example norm: every example is clipped
    fn = jax.jit(clipping.clipped_grad(loss, l2_clip_norm=c, batch_argnums=(1, 2), method="ghost"))
    for n in range(x.shape[0]):
      g, info = fn(params, x[n:n + 1], y[n:n + 1])
      norm = math.sqrt(sum(float(np.sum(np.square(np.asarray(v, np.float64))))
                           for v in jax.tree.leaves(g)))
      self.assertLessEqual(norm, c)
      self.assertGreater(norm, c * (1 - 1e-3))
      self.assertEqual(int(info.num_clipped), 1)

  # Batch 5 in microbatches of 2: the last microbatch is padded. The default run uses the MLP
  # (microbatching is the same code for every layer kind); the slow run repeats it on the CNN.
  @parameterized.named_parameters(("mlp", "mlp"))
  def test_microbatches_and_aux(self, name):
    self._check_microbatches_and_aux(name)

  @parameterized.named_parameters(("cnn", "cnn"))
  @pytest.mark.slow
  def test_microbatches_and_aux_slow(self, name):
    self._check_microbatches_and_aux(name)

  def _check_microbatches_and_aux(self, name):
    loss, params, x, y = _setup(name, batch=5)

    def loss_aux(p, xi, yi):
      return loss(p, xi, yi), {"y": yi}

    full = clipping.clipped_grad(loss_aux, l2_clip_norm=0.1, batch_argnums=(1, 2), has_aux=True,
                                 method="ghost")
    micro = clipping.clipped_grad(loss_aux, l2_clip_norm=0.1, batch_argnums=(1, 2), has_aux=True,
                                  method="ghost", microbatch_size=2)
    g1, i1 = jax.jit(full)(params, x, y)
    g2, i2 = jax.jit(micro)(params, x, y)
    self.assertLess(_rel_err(g2, g1), 1e-5)
    np.testing.assert_array_equal(i2.aux["y"], y)
    np.testing.assert_allclose(i2.per_example_norms, i1.per_example_norms, rtol=1e-6)

  def test_default_method_is_ghost(self):
    loss, params, x, y = _setup("mlp")
    g_default, _ = jax.jit(clipping.clipped_grad(loss, l2_clip_norm=0.2, batch_argnums=(1, 2)))(
        params, x, y)
    g_ghost, _ = jax.jit(clipping.clipped_grad(loss, l2_clip_norm=0.2, batch_argnums=(1, 2),
                                               method="ghost"))(params, x, y)
    chex.assert_trees_all_equal(g_default, g_ghost)

  def test_memory_does_not_hold_per_example_gradients(self):
    # MLP 784-512-10 at batch 256: vmap stores 256 copies of ~0.4M gradients (~400 MB);
    # ghost norms keep activations and output cotangents only.
    model = models.MLP(hidden_sizes=(512,))
    x = jnp.zeros((256, 784))
    y = jnp.zeros((256,), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(0), x[:1])["params"]

    def loss(p, xi, yi):
      return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, xi[None])[0], yi)

    temps = {}
    for method in ("vmap", "ghost"):
      fn = clipping.clipped_grad(loss, l2_clip_norm=1.0, batch_argnums=(1, 2), method=method)
      analysis = jax.jit(fn).lower(params, x, y).compile().memory_analysis()
      if analysis is None:
        self.skipTest("this backend gives no memory analysis")
      temps[method] = analysis.temp_size_in_bytes
    n_params = sum(v.size for v in jax.tree.leaves(params))
    self.assertGreater(temps["vmap"], 256 * n_params * 4 * 0.9)
    self.assertLess(temps["ghost"], 0.05 * temps["vmap"])


if __name__ == "__main__":
  absltest.main()


@pytest.mark.parametrize("conv_kwargs", [
    dict(kernel_size=(3, 3), strides=(2, 1), padding="SAME", kernel_dilation=(1, 2)),
    dict(kernel_size=(8, 8), strides=(2, 2), padding=((3, 3), (3, 3))),
    dict(kernel_size=(3,), strides=2, padding="VALID"),
    dict(kernel_size=(2, 3), padding=((1, 0), (1, 1)), input_dilation=(2, 1)),
])
def test_conv_patches_reproduce_the_convolution(conv_kwargs):
  """Unfolded input (kernel-ordered features) times the flattened kernel = the conv output."""
  m = nn.Conv(features=4, **conv_kwargs)
  nd = len(conv_kwargs["kernel_size"])
  x = jax.random.normal(jax.random.key(0), (3, 1) + (11,) * nd + (5,))
  variables = m.init(jax.random.key(1), x[0])
  out = jax.jit(jax.vmap(lambda xi: m.apply(variables, xi)))(x)
  call = ghost_norms._Call(0, "conv", (), m, {}, x.shape[1:], x.dtype, out.shape[1:], out.dtype, True)
  kernel = variables["params"]["kernel"]

  @jax.jit
  def from_patches(xs):
    patches = ghost_norms._conv_patches(call, xs)
    return (jnp.einsum("btk,kp->btp", patches, kernel.reshape(-1, kernel.shape[-1]))
            + variables["params"]["bias"])

  y = from_patches(x)
  np.testing.assert_allclose(np.asarray(y), np.asarray(out).reshape(y.shape), rtol=1e-5, atol=1e-5)
