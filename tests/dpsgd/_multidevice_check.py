"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (see test_dpsgd_data_parallel.py).

Trains the same small model with the same key on 1 device and on an 8-device
data-parallel mesh and prints a JSON summary of the differences.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import models
from jaxdp import dpsgd


def main() -> None:
  assert len(jax.devices()) == 8, jax.devices()
  rng = np.random.default_rng(0)
  x = rng.normal(size=(512, 12)).astype(np.float32)
  y = (x[:, :3].argmax(1)).astype(np.int32)
  model = models.MLP(hidden_sizes=(16,), num_classes=3)
  mesh = dpsgd.make_data_mesh(8)
  common = dict(key=jax.random.key(7), epochs=0.5, l2_clip_norm=0.5, delta=1e-5,
                expected_batch_size=64, noise_multiplier=1.1, learning_rate=0.5,
                physical_batch_size=96, accountant=None)
  single = dpsgd.train_dpsgd(model, x, y, **common)
  multi = dpsgd.train_dpsgd(model, x, y, mesh=mesh, **common)
  # Summaries in NumPy on the host: op-by-op jax on the two device layouts compiles a program
  # per op and layout, which costs more here than the training steps.
  host = lambda tree: [np.asarray(a) for a in jax.tree.leaves(tree)]
  diff = max(float(np.max(np.abs(a - b))) for a, b in zip(host(single.params), host(multi.params)))
  init = model.init(jax.random.split(jax.random.key(7), 3)[0], x[:1])["params"]
  moved = float(np.sqrt(sum(np.sum(np.square(a - b, dtype=np.float64))
                            for a, b in zip(host(single.params), host(init)))))
  # One clipped sum directly: shard_map + psum vs one device.
  def loss(p, xi, yi):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, xi[None])[0], yi)
  fn = dpsgd.clipped_grad(loss, l2_clip_norm=0.5, batch_argnums=(1, 2))
  dp_fn = dpsgd.data_parallel_clipped_grad(fn, mesh)
  mask = jnp.asarray(rng.random(64) < 0.7)
  g1, i1 = jax.jit(fn)(single.params, x[:64], y[:64], mask=mask)
  g8, i8 = jax.jit(dp_fn)(single.params, x[:64], y[:64], mask=mask)
  sum_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(host(g1), host(g8)))
  print(json.dumps({
      "devices": len(jax.devices()), "steps": single.steps, "param_max_abs_diff": diff,
      "moved": moved, "sum_max_abs_diff": sum_diff,
      "num_examples": [float(i1.num_examples), float(i8.num_examples)],
      "num_clipped": [int(i1.num_clipped), int(i8.num_clipped)],
      "sensitivity": [fn.sensitivity, dp_fn.sensitivity],
      "padded_size": [single.padded_size, multi.padded_size],
  }))


if __name__ == "__main__":
  main()
