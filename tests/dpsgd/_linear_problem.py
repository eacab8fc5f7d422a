"""The small linear problem shared by the make_private tests whose checks do not depend on its size.

A plan's XLA programs (the host-path step, the device-resident step, the data digest of the
replay binding) depend on the shapes of the data and parameters and on the loss, the expected
batch size, the clip norm, the noise multiplier and the learning rate; not on the key, the
number of steps, delta or the checkpoint arguments. The tests that build their plans from
``PLAN`` and ``loss`` on (N, D) / (D, K) arrays (test_device_sampling.py, test_replay_rules.py,
test_private_step_resume_rules.py, test_private_step_checkpoints.py) therefore share those
programs: each is compiled once per test run (tests/conftest.py's persistent compilation cache,
shared by the workers) instead of once per test file.
"""

import jax

N, D, K = 203, 5, 3  # N not a multiple of 8: a mesh of 8 devices pads 5 rows

# make_private's arguments, less the key, steps and checkpoint arguments.
PLAN = dict(l2_clip_norm=1.0, num_examples=N, expected_batch_size=20, noise_multiplier=1.0,
            delta=1e-5, learning_rate=0.5)


def loss(w, xi, yi):
  """Softmax cross-entropy of the linear model ``xi @ w`` (w: (D, K)) on one example."""
  return -jax.nn.log_softmax(xi @ w)[yi]
