"""Multi-device DP-SGD equals single-device DP-SGD with the same key.

The main pytest process has already initialised JAX with one CPU device, so
the check runs in a subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``
(8 simulated CPU devices); see ``_multidevice_check.py``.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from jaxdp.dpsgd import clipping, data_parallel


@pytest.mark.slow
@pytest.mark.multidevice
def test_eight_devices_equal_one_device():
  script = pathlib.Path(__file__).with_name("_multidevice_check.py")
  flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["devices"] == 8
  assert out["steps"] == 4
  # Same Poisson batches and the same noise: parameters agree to float32 rounding
  # of the reassociated sum (psum of 8 shard sums vs one sum), while training
  # moved them by ~0.2, so a missing/extra noise draw or a lost shard would fail.
  assert out["param_max_abs_diff"] < 1e-5
  assert out["moved"] > 0.05
  assert out["sum_max_abs_diff"] < 1e-5
  assert out["num_examples"][0] == out["num_examples"][1] > 0
  assert out["num_clipped"][0] == out["num_clipped"][1]
  assert out["sensitivity"] == [0.5, 0.5]


def test_single_device_mesh_wrapper_and_errors():
  mesh = data_parallel.make_data_mesh(1)
  fn = clipping.clipped_grad(lambda w, x: jnp.sum(w * x), l2_clip_norm=1.0)
  dp_fn = data_parallel.data_parallel_clipped_grad(fn, mesh)
  x = jnp.arange(12.0).reshape(6, 2)
  g1, _ = jax.jit(fn)(jnp.zeros(2), x)  # jitted: one compilation, not one per primitive
  g2, info = jax.jit(dp_fn)(jnp.zeros(2), x)
  assert jnp.allclose(g1, g2)
  assert dp_fn.sensitivity == fn.sensitivity == 1.0
  assert info.per_example_norms.shape == (6,)
  with pytest.raises(ValueError, match="axis_name"):
    data_parallel.data_parallel_clipped_grad(fn, mesh, axis_name="model")
  with pytest.raises(ValueError, match="num_devices"):
    data_parallel.make_data_mesh(len(jax.devices()) + 1)
