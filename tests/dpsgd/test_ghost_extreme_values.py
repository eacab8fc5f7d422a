"""The ghost clipper on huge and non-finite per-example gradients.

Its robust (power-of-two-scaled) rule runs for every chunk, in both forms of its row sums
of squares (ghost_layers._SUMSQ_FORM: XLA:CPU's plain sums with the overflowed rows redone
scaled, and every other platform's rows scaled first). It must give the
clipped sums, norms and clip counts of the vmap clipper (an independent
implementation: per-example gradients materialised, in both of its forms) up to rounding, keep a
non-finite example's contribution at exactly zero and clip a huge finite one
to the clip norm, flat and per layer, with a fixed and an adaptive (traced
``1/D``) clip norm, in one chunk and in microbatches.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp import models
from jaxdp.dpsgd import adaptive_clipping as ac
from jaxdp.dpsgd import clip_chunks, clipping, ghost_layers

_MODEL = models.MLP(hidden_sizes=(8,))


@functools.lru_cache(maxsize=None)
def _problem():
  """(x, y, params): built by one compiled program on first use, not at import (every pytest
  worker imports this module; op by op, the build compiled ~16 programs in each)."""

  @jax.jit
  def build():
    x = jax.random.normal(jax.random.key(0), (6, 5))
    y = jax.random.randint(jax.random.key(1), (6,), 0, 10)
    return x, y, _MODEL.init(jax.random.key(2), x[:1])["params"]

  return build()


def _loss(p, xi, yi):
  # + a term linear in the input: an input of 1e30 gives a finite gradient of ~1e30.
  logits = _MODEL.apply({"params": p}, xi[None])[0]
  return (optax.softmax_cross_entropy_with_integer_labels(logits, yi)
          + jnp.sum(p["Dense_0"]["kernel"].T @ xi))


@functools.lru_cache(maxsize=None)
def _jitted(per_layer, adaptive, micro, method, vmap_form, sumsq_form):
  # Cached per clipper (and form of the vmap method and of the ghost row sums, read when the
  # clipper is traced): the calls of a test on inputs of one shape (clean and extreme values)
  # share one compilation.
  del vmap_form, sumsq_form  # parts of the cache key only
  if adaptive:
    clip = (jnp.float32(0.7) if not per_layer
            else {"Dense_0": jnp.float32(0.5), "Dense_1": jnp.float32(0.4)})
    f = ac.adaptive_clipped_grad(_loss, clip, method=method, per_layer=per_layer,
                                 batch_argnums=(1, 2), microbatch_size=micro)
  else:
    f = clipping.clipped_grad(_loss, l2_clip_norm=0.7, method=method, per_layer=per_layer,
                              batch_argnums=(1, 2), microbatch_size=micro)
  return jax.jit(lambda p, xx, yy, m: f(p, xx, yy, mask=m))


def _run(per_layer, adaptive, x, y, mask=None, micro=None, method="ghost"):
  params = _problem()[2]
  return _jitted(per_layer, adaptive, micro, method, clip_chunks._VMAP_FORM,
                 ghost_layers._SUMSQ_FORM)(params, x, y, mask)


# Always on: flat fixed and per-layer adaptive (the two ends); the rest under `slow`.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("per_layer,adaptive,micro", [
    (False, False, None), pytest.param(True, False, None, marks=_SLOW),
    pytest.param(False, True, None, marks=_SLOW), (True, True, None),
    pytest.param(False, False, 4, marks=_SLOW)])
def test_ghost_equals_vmap(monkeypatch, per_layer, adaptive, micro):
  _X, _Y, _ = _problem()
  bad = jnp.concatenate([_X[:4], jnp.array([[jnp.inf, 0, 0, 0, 0], [1e30, -1e30, 0, 0, 0]],
                                           jnp.float32)])
  mask = jnp.array([True, True, False, True, True, True])
  # Both forms of the ghost row sums (ghost_layers._SUMSQ_FORM; "auto" is XLA:CPU's here).
  ghosts = []
  for sumsq_form in ("auto", "scaled"):
    monkeypatch.setattr(ghost_layers, "_SUMSQ_FORM", sumsq_form)
    ghosts.append([_run(per_layer, adaptive, x, _Y, mask, micro, "ghost") for x in (_X, bad)])
  # Both forms of the vmap method (clip_chunks._VMAP_FORM): XLA:CPU's and every other platform's.
  for form in ("auto", "inline"):
    monkeypatch.setattr(clip_chunks, "_VMAP_FORM", form)
    vmap = [_run(per_layer, adaptive, x, _Y, mask, micro, "vmap") for x in (_X, bad)]
    for (g_c, i_c), (g_i, i_i) in zip(vmap + vmap, ghosts[0] + ghosts[1]):
      for u, v in zip(jax.tree.leaves(g_c), jax.tree.leaves(g_i)):
        assert bool(jnp.all(jnp.isfinite(v))) and bool(jnp.all(jnp.isfinite(u)))
        np.testing.assert_allclose(np.asarray(v), np.asarray(u), rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(np.asarray(i_i.per_example_norms),
                                 np.asarray(i_c.per_example_norms), rtol=1e-5)
      assert int(i_i.num_clipped) == int(i_c.num_clipped)


@pytest.mark.parametrize("sumsq_form", ["auto", "scaled"])
@pytest.mark.parametrize("per_layer", [False, True])
def test_ghost_nonfinite_is_zero_and_huge_is_clipped(monkeypatch, per_layer, sumsq_form):
  monkeypatch.setattr(ghost_layers, "_SUMSQ_FORM", sumsq_form)
  _X, _Y, _ = _problem()
  x = jnp.concatenate([_X[:2], jnp.array([[jnp.nan, 0, 0, 0, 0]], jnp.float32)])
  g_bad, info = _run(per_layer, False, x, _Y[:3])
  g_good, _ = _run(per_layer, False, _X[:2], _Y[:2])
  for u, v in zip(jax.tree.leaves(g_bad), jax.tree.leaves(g_good)):
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-7)
  assert np.isinf(np.asarray(info.per_example_norms)[2])
  huge = jnp.array([[1e30, -1e30, 3.0, 0, 0]], jnp.float32)
  g_huge, _ = _run(per_layer, False, huge, _Y[:1])
  # Flat: norm ~c; per layer, each of the two groups is clipped to its share c / sqrt(2).
  assert (0.35 if per_layer else 0.699) < float(optax.global_norm(g_huge)) <= 0.7
