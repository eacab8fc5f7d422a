"""Tests of per-example clipping (paper 000 Section 3.1 Equation 4, the clipped sum)."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp import models
from jaxdp.dpsgd import clip_chunks, clipping, sampling


@functools.lru_cache(maxsize=None)
def _model_and_loss(hidden=()):
  # Cached: one model and loss function per architecture (the jitted gradient of the loss, and
  # the clipped gradients of identical configurations, are then traced once per worker).
  # One dense layer unless a test needs layers (per-layer clipping): what these tests check
  # does not depend on the depth, and a hidden layer made every clipper compile ~20% longer.
  model = models.MLP(hidden_sizes=hidden, num_classes=3)

  def loss(p, xi, yi):
    logits = model.apply({"params": p}, xi[None])[0]
    return optax.softmax_cross_entropy_with_integer_labels(logits, yi)

  return model, loss


@functools.lru_cache(maxsize=None)
def _setup(batch=9, seed=0, hidden=()):
  # Cached (immutable jax arrays), each part built by one compiled program: op by op, the
  # data and the init compiled a dozen programs per batch size.
  model, loss = _model_and_loss(hidden)
  x, y = jax.jit(lambda: (jax.random.normal(jax.random.key(seed), (batch, 5)),
                          jax.random.randint(jax.random.key(seed + 1), (batch,), 0, 3)))()
  params = jax.jit(model.init)(jax.random.key(seed + 2), jnp.zeros((1, 5)))["params"]
  return loss, params, x, y


@functools.lru_cache(maxsize=None)
def _jit_grad(loss):
  return jax.jit(jax.grad(loss))


def _norm(tree):
  """L2 norm of a gradient tree, in NumPy (no compilation per leaf shape, as jnp op by op)."""
  return math.sqrt(sum(float(np.sum(np.square(np.asarray(v, np.float64))))
                       for v in jax.tree.leaves(tree)))


def _loop_clipped_sum(loss, params, x, y, clip, mask=None):
  # The per-example gradients from one jitted program; the loop itself is plain Python and NumPy.
  total = jax.tree.map(lambda p: np.zeros(np.shape(p), np.float32), params)
  grad = _jit_grad(loss)
  # jaxdp clips to the float32-safe c' (c shrunk by ~1e-5 relative so that rounding
  # never leaves a clipped norm above c; see the clipping module docstring). The
  # reference uses the same c' so the comparison stays tight.
  clip = clipping._safe_clip(clip, jax.tree.leaves(params))
  x, y = np.asarray(x), np.asarray(y)
  for n in range(x.shape[0]):
    if mask is not None and not mask[n]:
      continue
    g = jax.tree.map(np.asarray, grad(params, x[n], y[n]))
    norm = _norm(g)
    factor = min(1.0, clip / norm) if norm > 0 else 1.0
    total = jax.tree.map(lambda a, b: a + np.float32(factor) * b, total, g)
  return total


class ClippedGradTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_python_loop(self):
    loss, params, x, y = _setup()
    # Median per-example norm, so some gradients are clipped and some are not.
    grad = _jit_grad(loss)
    xs, ys = np.asarray(x), np.asarray(y)
    norms = [_norm(grad(params, xs[n], ys[n])) for n in range(x.shape[0])]
    srt = np.sort(norms)
    clip = float(0.5 * (srt[4] + srt[5]))  # between two norms: 4 clipped, 5 untouched.
    fn = clipping.clipped_grad(loss, l2_clip_norm=clip, batch_argnums=(1, 2), method="vmap")
    g, info = self.variant(fn)(params, x, y)
    expected = _loop_clipped_sum(loss, params, x, y, clip)
    chex.assert_trees_all_close(g, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(info.per_example_norms, norms, rtol=1e-5)
    self.assertEqual(int(info.num_clipped), 4)
    self.assertEqual(float(info.num_examples), x.shape[0])
    self.assertEqual(fn.sensitivity, clip)

  @chex.variants(with_jit=True)
  def test_mask_and_microbatch(self):
    loss, params, x, y = _setup(batch=11)
    mask = jnp.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1], bool)
    # A NaN in a masked slot must not leak into the sum.
    x = x.at[1].set(jnp.nan)
    clip = 0.3
    full = clipping.clipped_grad(loss, l2_clip_norm=clip, batch_argnums=(1, 2))
    micro = clipping.clipped_grad(loss, l2_clip_norm=clip, batch_argnums=(1, 2), microbatch_size=4)
    g_full, info_full = self.variant(full)(params, x, y, mask=mask)
    g_micro, info_micro = self.variant(micro)(params, x, y, mask=mask)
    expected = _loop_clipped_sum(loss, params, x, y, clip, mask=np.asarray(mask))
    chex.assert_trees_all_close(g_full, expected, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(g_micro, expected, rtol=1e-5, atol=1e-6)
    chex.assert_tree_all_finite(g_full)
    self.assertEqual(info_micro.per_example_norms.shape, (11,))
    np.testing.assert_allclose(info_micro.per_example_norms, info_full.per_example_norms, rtol=1e-5)
    self.assertEqual(float(info_full.num_examples), 8.0)

  @chex.variants(with_jit=True)
  def test_reweight_method_matches_loop(self):
    # Batch 11, clip 0.3: the reference (the default method, with a mask) is the program of
    # test_mask_and_microbatch's full batch.
    loss, params, x, y = _setup(batch=11)
    mask = jnp.arange(11) % 3 != 0
    clip = 0.3
    fn = clipping.clipped_grad(loss, l2_clip_norm=clip, batch_argnums=(1, 2), method="reweight",
                               microbatch_size=4)
    g, info = self.variant(fn)(params, x, y, mask=mask)
    expected = _loop_clipped_sum(loss, params, x, y, clip, mask=np.asarray(mask))
    chex.assert_trees_all_close(g, expected, rtol=1e-5, atol=1e-6)
    ref, ref_info = jax.jit(clipping.clipped_grad(loss, l2_clip_norm=clip, batch_argnums=(1, 2)))(
        params, x, y, mask=mask)
    np.testing.assert_allclose(info.per_example_norms, ref_info.per_example_norms, rtol=1e-5)
    self.assertEqual(int(info.num_clipped), int(ref_info.num_clipped))
    with self.assertRaisesRegex(ValueError, "per_layer"):
      clipping.clipped_grad(loss, l2_clip_norm=1.0, method="reweight", per_layer=True)
    with self.assertRaisesRegex(ValueError, "method"):
      clipping.clipped_grad(loss, l2_clip_norm=1.0, method="bogus")

  def test_empty_and_single_example(self):
    loss, params, x, y = _setup(batch=4)
    fn = clipping.clipped_grad(loss, l2_clip_norm=0.5, batch_argnums=(1, 2))
    g, info = jax.jit(fn)(params, x, y, mask=jnp.zeros(4, bool))
    for leaf in jax.tree.leaves(g):
      np.testing.assert_array_equal(leaf, 0.0)
    self.assertEqual(float(info.num_examples), 0.0)
    self.assertEqual(float(info.loss_sum), 0.0)
    g1, _ = jax.jit(fn)(params, x[:1], y[:1])
    expected = _loop_clipped_sum(loss, params, x[:1], y[:1], 0.5)
    chex.assert_trees_all_close(g1, expected, rtol=1e-5, atol=1e-7)
    norm = _norm(g1)
    self.assertLessEqual(norm, 0.5 * (1 + 1e-5))

  def test_infinite_clip_is_plain_gradient_sum(self):
    loss, params, x, y = _setup()
    fn = clipping.clipped_grad(loss, l2_clip_norm=float("inf"), batch_argnums=(1, 2))
    g, _ = jax.jit(fn)(params, x, y)
    expected = jax.jit(jax.grad(lambda p: jnp.sum(jax.vmap(loss, (None, 0, 0))(p, x, y))))(params)
    chex.assert_trees_all_close(g, expected, rtol=1e-5, atol=1e-6)
    self.assertTrue(math.isinf(fn.sensitivity))

  def test_has_aux(self):
    def loss(w, xi):
      return jnp.sum(w * xi), {"sq": jnp.sum(xi ** 2)}

    fn = clipping.clipped_grad(loss, l2_clip_norm=1.0, has_aux=True, microbatch_size=2)
    x = jnp.arange(10.0).reshape(5, 2)
    _, info = fn(jnp.zeros(2), x)
    np.testing.assert_allclose(info.aux["sq"], jnp.sum(x ** 2, axis=1))

  def test_per_layer_sensitivity_and_group_norms(self):
    loss, params, x, y = _setup(hidden=(8,))  # two layers: two groups
    clip_tree = {"Dense_0": 0.3, "Dense_1": 0.4}
    fn = clipping.clipped_grad(loss, l2_clip_norm=clip_tree, batch_argnums=(1, 2), per_layer=True)
    self.assertAlmostEqual(fn.sensitivity, 0.5, places=12)  # sqrt(0.3^2 + 0.4^2)
    # One example: each group of the clipped gradient has norm <= its c_k, and a
    # group whose raw norm is below c_k is unchanged.
    g, _ = jax.jit(fn)(params, x[:1], y[:1])
    raw = _jit_grad(loss)(params, x[0], y[0])
    for name, c in clip_tree.items():
      n_clip = float(optax.global_norm(g[name]))
      n_raw = float(optax.global_norm(raw[name]))
      self.assertLessEqual(n_clip, c * (1 + 1e-5))
      np.testing.assert_allclose(n_clip, min(n_raw, c), rtol=1e-5)
    # Even split of a scalar C over the L leaves keeps the sensitivity C.
    even = clipping.clipped_grad(loss, l2_clip_norm=2.0, batch_argnums=(1, 2), per_layer=True)
    self.assertEqual(even.sensitivity, 2.0)
    n_leaves = len(jax.tree.leaves(params))
    g_even, _ = jax.jit(even)(params, x[:1] * 100.0, y[:1])
    for leaf in jax.tree.leaves(g_even):
      self.assertLessEqual(float(jnp.linalg.norm(leaf)), 2.0 / math.sqrt(n_leaves) * (1 + 1e-5))
    self.assertAlmostEqual(clipping.per_layer_sensitivity([1.0, 2.0, 2.0]), 3.0, places=12)

  def test_bad_arguments(self):
    loss, params, x, y = _setup()
    with self.assertRaisesRegex(ValueError, "l2_clip_norm"):
      clipping.clipped_grad(loss, l2_clip_norm=0.0)
    with self.assertRaisesRegex(ValueError, "l2_clip_norm"):
      clipping.clipped_grad(loss, l2_clip_norm=-1.0, per_layer=True)
    with self.assertRaisesRegex(ValueError, "batch_argnums"):
      clipping.clipped_grad(loss, l2_clip_norm=1.0, batch_argnums=0)
    with self.assertRaisesRegex(ValueError, "microbatch_size"):
      clipping.clipped_grad(loss, l2_clip_norm=1.0, microbatch_size=0)
    fn = clipping.clipped_grad(loss, l2_clip_norm=1.0, batch_argnums=(1, 2))
    with self.assertRaisesRegex(ValueError, "mask"):
      jax.eval_shape(fn, params, x, y, mask=jnp.ones(3))
    bad = clipping.clipped_grad(loss, l2_clip_norm={"nope": 1.0}, batch_argnums=(1, 2), per_layer=True)
    with self.assertRaisesRegex(ValueError, "prefix"):
      jax.eval_shape(bad, params, x, y)


def _exact_norms(tree_batch):
  """float64 L2 norm of each float32 row (the norm the sensitivity bound is about)."""
  flat = np.concatenate([np.asarray(a, np.float64).reshape(a.shape[0], -1)
                         for a in jax.tree.leaves(tree_batch)], axis=1)
  return np.sqrt(np.sum(flat * flat, axis=1))


@pytest.mark.parametrize("clip", [1.0, 0.1, 3.7])
def test_clipped_norm_never_exceeds_clip_in_float32(clip):
  # Adversarial gradients: 2000 vectors (d = 1000; half equal-magnitude +-a, whose
  # float32 sum of squares is ~5 ulps low, half Gaussian) scaled so their exact norm is
  # C (1 + k 2^-24), k in [1, 64]: just above the clip, where min(1, C/||g||) alone
  # leaves clipped norms a few ulps ABOVE C. Each must have exact norm <= C.
  d, m = 1000, 2000
  rng = np.random.default_rng(0)
  v = np.concatenate([rng.choice([-1.0, 1.0], size=(m // 2, d)), rng.normal(size=(m // 2, d))])
  k = rng.integers(1, 65, size=(m, 1))
  v = v / np.linalg.norm(v, axis=1, keepdims=True) * clip * (1.0 + k * 2.0 ** -24)
  v32 = v.astype(np.float32)
  assert np.mean(_exact_norms([v32]) > clip) > 0.9  # most are above C after the cast
  fn = clipping.clipped_grad(lambda w, xi: jnp.vdot(w, xi), l2_clip_norm=clip)
  w = jnp.zeros(d, jnp.float32)
  clipped = jax.jit(jax.vmap(lambda xi: fn(w, xi[None])[0]))(jnp.asarray(v32))
  assert clipped.dtype == jnp.float32
  norms = _exact_norms([clipped])
  assert norms.max() <= clip, (norms.max() - clip) / clip
  # ... and the clip is not grossly shrunk (the float32-safe margin is ~1e-5 relative).
  assert norms.min() >= clip * (1 - 2e-5)
  # Per-layer clipping: every group within its own c_k.
  fn2 = clipping.clipped_grad(lambda p, xi: jnp.vdot(p["a"], xi[:600]) + jnp.vdot(p["b"], xi[600:]),
                              l2_clip_norm={"a": clip, "b": clip / 2}, per_layer=True)
  p2 = {"a": jnp.zeros(600), "b": jnp.zeros(400)}
  g2 = jax.jit(jax.vmap(lambda xi: fn2(p2, xi[None] * 3.0)[0]))(jnp.asarray(v32))
  assert _exact_norms([g2["a"]]).max() <= clip and _exact_norms([g2["b"]]).max() <= clip / 2


def test_bf16_params_give_float32_clipped_sums():
  # bf16 params: per-example gradients are cast up and clipped/summed in float32
  # (the old code cast the clipped gradients back to bf16: norm up to ~2^-8 above C,
  # sums rounded to 8 bits).
  loss, params, x, y = _setup(batch=16)
  p16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
  fn = clipping.clipped_grad(loss, l2_clip_norm=0.05, batch_argnums=(1, 2))
  g, info = jax.jit(fn)(p16, x.astype(jnp.bfloat16), y)
  assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(g))
  assert int(info.num_clipped) == 16
  per_ex = jax.jit(jax.vmap(lambda xi, yi: fn(p16, xi[None], yi[None])[0]))(
      x.astype(jnp.bfloat16), y)
  assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(per_ex))
  norms = _exact_norms(per_ex)
  assert norms.max() <= 0.05 and norms.min() > 0.05 * (1 - 2e-5)
  # The sum is the float32 sum of the per-example clipped gradients.
  chex.assert_trees_all_close(g, jax.tree.map(lambda a: jnp.sum(a, axis=0), per_ex),
                              rtol=1e-5, atol=1e-6)
  micro = clipping.clipped_grad(loss, l2_clip_norm=0.05, batch_argnums=(1, 2), microbatch_size=5)
  g_micro, _ = jax.jit(micro)(p16, x.astype(jnp.bfloat16), y)
  assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(g_micro))
  chex.assert_trees_all_close(g_micro, g, rtol=1e-5, atol=1e-6)
  rew = clipping.clipped_grad(loss, l2_clip_norm=0.05, batch_argnums=(1, 2), method="reweight")
  with pytest.raises(ValueError, match="reweight"):
    rew(p16, x.astype(jnp.bfloat16), y)


def test_padded_batch_carries_its_mask():
  # A padded Poisson chunk repeats example 0 in its padding slots. The old PaddedBatch
  # exposed those padded indices as `indices`, so `f(params, x[c.indices], y[c.indices])`
  # silently summed example 0 many times. Now `indices` holds only the sampled examples,
  # the padded batch comes from `gather` with its mask attached, and mixing the two is loud.
  loss, params, x, y = _setup(batch=30)
  (chunk,) = sampling.pad_and_split(np.array([3, 7, 11, 20], np.int32), 16)
  fn = clipping.clipped_grad(loss, l2_clip_norm=0.5, batch_argnums=(1, 2))
  expected = _loop_clipped_sum(loss, params, x[np.array([3, 7, 11, 20])],
                               y[np.array([3, 7, 11, 20])], 0.5)
  # The natural call is correct: no padding in `indices`.
  np.testing.assert_array_equal(chunk.indices, [3, 7, 11, 20])
  g_plain, info_plain = jax.jit(fn)(params, x[chunk.indices], y[chunk.indices])
  chex.assert_trees_all_close(g_plain, expected, rtol=1e-5, atol=1e-6)
  # The static-shape call: the mask travels inside the batch (also through jit).
  batch = chunk.gather(x, y)
  assert isinstance(batch, sampling.MaskedBatch) and batch.arrays[0].shape[0] == 16
  g_masked, info = jax.jit(fn)(params, batch)
  chex.assert_trees_all_close(g_masked, expected, rtol=1e-5, atol=1e-6)
  assert float(info.num_examples) == 4 == float(info_plain.num_examples)
  # Mixing a padded-size mask with the unpadded indices is a shape error, not a silent sum.
  with pytest.raises(ValueError, match="mask"):
    fn(params, x[chunk.indices], y[chunk.indices], mask=chunk.mask)
  with pytest.raises(ValueError, match="carries its own mask"):
    fn(params, batch, mask=chunk.mask)
  with pytest.raises(ValueError, match="MaskedBatch holds 1 arrays"):
    fn(params, chunk.gather(x))
  # Microbatched and non-batch arguments after the MaskedBatch.
  def loss3(p, xi, scale, yi):
    return scale * loss(p, xi, yi)

  fn3 = clipping.clipped_grad(loss3, l2_clip_norm=0.5, batch_argnums=(1, 3), microbatch_size=3)
  g3, _ = jax.jit(fn3)(params, batch, 1.0)
  chex.assert_trees_all_close(g3, expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------- the plain fast path and its rare recomputation


def _linear_loss(w, x):
  return jnp.sum(w * x)  # gradient = x: the batch rows ARE the per-example gradients


@pytest.mark.parametrize("method,micro,form", [
    ("vmap", None, "auto"), ("reweight", None, "auto"), ("vmap", 2, "auto"),
    ("vmap", None, "inline"), ("vmap", 2, "inline"), ("reweight", None, "inline")])
def test_nonfinite_row_contributes_exact_zero_and_huge_row_is_clipped(monkeypatch, method, micro,
                                                                      form):
  # Exact zero for the non-finite rows, norm <= c for the huge one (its squares overflow: the
  # scaled sum gives its norm), in both forms of the vmap method (clip_chunks._VMAP_FORM: "auto"
  # is XLA:CPU's, which redoes a non-finite sum; "inline" every other platform's).
  monkeypatch.setattr(clip_chunks, "_VMAP_FORM", form)
  good = jnp.array([[0.3, -0.4, 0.0], [3.0, 4.0, 12.0]], jnp.float32)
  bad = jnp.array([[jnp.inf, 1.0, 0.0], [jnp.nan, 0.5, 0.0]], jnp.float32)
  huge = jnp.array([[1e30, -1e30, 3e38]], jnp.float32)
  f = jax.jit(clipping.clipped_grad(_linear_loss, l2_clip_norm=1.0, method=method,
                                    microbatch_size=micro))
  w = jnp.zeros(3)
  g_all, info = f(w, jnp.concatenate([good, bad, huge]))
  g_good, _ = f(w, good)
  g_huge, _ = f(w, huge)
  assert bool(jnp.all(jnp.isfinite(g_all)))
  np.testing.assert_allclose(np.asarray(g_all), np.asarray(g_good + g_huge), rtol=1e-6, atol=1e-7)
  assert 0.999 < float(np.linalg.norm(np.asarray(g_huge, np.float64))) <= 1.0
  expect_good = np.asarray(good[0]) + np.asarray(good[1]) / 13.0
  np.testing.assert_allclose(np.asarray(g_good), expect_good, rtol=1e-4)  # c' = c (1 - ~1e-5)
  norms = np.asarray(info.per_example_norms)
  assert np.isinf(norms[2:4]).all() and norms[4] > 1e38 and np.isfinite(norms[:2]).all()
  assert int(info.num_clipped) == 4  # row 1 (norm 13), both non-finite rows, the huge row
  # A finite row whose norm (5.2e38) overflows float32: still clipped to norm <= c.
  g_over, _ = f(w, jnp.full((1, 3), 3e38, jnp.float32))
  assert 0.999 < float(np.linalg.norm(np.asarray(g_over, np.float64))) <= 1.0


@pytest.mark.parametrize("method,form", [("vmap", "auto"), ("vmap", "inline"),
                                         ("reweight", "auto")])
def test_float64_row_whose_squares_overflow_float64_is_clipped(monkeypatch, method, form):
  # With x64, a row of 3e307: its plain sum overflows float64 and the scaled one uses k ~ 514,
  # so 2^-k and the factor (~1e-153) must be formed in float64, not float32.
  monkeypatch.setattr(clip_chunks, "_VMAP_FORM", form)
  with jax.enable_x64(True):
    f = jax.jit(clipping.clipped_grad(_linear_loss, l2_clip_norm=1.0, method=method))
    x = jnp.array([[1e300, -1e300, 3e307], [0.3, 0.4, 0.0]], jnp.float64)
    g, info = f(jnp.zeros(3, jnp.float64), x)
    huge = np.asarray(g, np.float64) - np.array([0.3, 0.4, 0.0])
    assert g.dtype == jnp.float64 and int(info.num_clipped) == 1
    assert 0.999 < float(np.linalg.norm(huge)) <= 1.0


@pytest.mark.parametrize("method", ["vmap", "reweight", "ghost"])
def test_tiny_gradient_with_tiny_clip_norm_keeps_the_bound(method):
  # Entries of 1e-22: their squares (1e-44) are subnormal or flushed to zero, so a plain sum
  # of squares alone would see a norm of ~0 and leave the vector (norm 3.2e-21) unclipped.
  x = jnp.full((2, 1000), 1e-22, jnp.float32)
  clip = 1e-21
  f = jax.jit(clipping.clipped_grad(_linear_loss, l2_clip_norm=clip, method=method))
  g, _ = f(jnp.zeros(1000), x[:1])
  assert 0.0 <= float(np.linalg.norm(np.asarray(g, np.float64))) <= clip


if __name__ == "__main__":
  pytest.main([__file__])
