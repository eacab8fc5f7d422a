"""jaxdp.training.batching: chunked lax.map equals one lax.map, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.training import batching, objective_perturbation


def test_map_in_chunks_equals_one_call_with_padding():
  f = jax.jit(lambda t: jax.lax.map(lambda a: (jnp.sin(a[0]) * a[1], a[0].sum()), t))
  xs = (jnp.arange(21.0).reshape(7, 3), jnp.arange(7.0)[:, None] + 1.0)
  whole = f(xs)
  for chunks in (1, 2, 3, 7, 50):
    got = batching.map_in_chunks(f, xs, chunks)
    for g, w in zip(got, whole):
      assert g.shape == w.shape
      np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_map_in_chunks_one_worker_runs_in_the_calling_thread():
  """max_workers=1: the chunks run one after the other in the calling thread, so its
  thread-local jax.enable_x64 still holds (float64 in, float64 out), and the result equals
  one call, padding included."""
  import threading
  threads = set()

  def f(t):
    threads.add(threading.get_ident())
    return jax.jit(lambda a: a * 3.0 + 1.0)(t)

  with jax.enable_x64(True):
    xs = jnp.arange(7.0, dtype=jnp.float64) / 3.0
    whole = f(xs)
    got = batching.map_in_chunks(f, xs, 3, max_workers=1)
    assert got.dtype == jnp.float64
  np.testing.assert_array_equal(np.asarray(got), np.asarray(whole))
  assert threads == {threading.get_ident()}


def test_cpu_workers_env_override(monkeypatch):
  monkeypatch.setenv("JAXDP_CPU_WORKERS", "3")
  assert batching.cpu_workers() == 3
  assert batching.num_chunks(100, "map") == (3 if jax.default_backend() == "cpu" else 1)
  assert batching.num_chunks(100, "vmap") == 1
  assert batching.num_chunks(3, "map") == 1  # at least 2 problems per chunk
  for bad in ("0", "-2", "two"):
    monkeypatch.setenv("JAXDP_CPU_WORKERS", bad)
    with pytest.raises(ValueError, match="JAXDP_CPU_WORKERS"):
      batching.cpu_workers()


def test_chunked_private_fits_equal_single_fits(monkeypatch):
  """The batched loss-perturbation release is the same whatever the chunking, and equal to the
  single-key release of each key (each problem is computed by the same per-problem body)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(300, 6)).astype(np.float32)
  x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
  y = rng.integers(0, 3, 300)
  keys = jax.random.split(jax.random.key(5), 5)
  kw = dict(num_classes=3, epsilon=1.0, l2_reg=1e-3, tol=1e-6, batch_mode="map")
  outs = []
  for workers in ("1", "2"):
    monkeypatch.setenv("JAXDP_CPU_WORKERS", workers)
    outs.append(np.asarray(objective_perturbation.loss_perturbation(keys, x, y, **kw).weights))
  np.testing.assert_array_equal(outs[0], outs[1])
  single = objective_perturbation.loss_perturbation(keys[3], x, y, **kw).weights
  np.testing.assert_allclose(outs[1][3], np.asarray(single), rtol=0, atol=1e-6)
