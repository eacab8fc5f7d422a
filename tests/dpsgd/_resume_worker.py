"""A private training run that a test kills with SIGKILL and restarts (test_resume_after_sigkill.py).

Usage: ``python _resume_worker.py CHECKPOINT_DIR BUDGET_PATH OUT_NPZ [SLEEP_S]``. Trains a
softmax-regression model with ``make_private`` (device-resident sampling, checkpoint every 2
steps) on a durable ``PrivacyBudget``; prints ``step t`` after each update; writes the final
parameters and the budget's ledger count to OUT_NPZ when the run completes.
"""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp.accounting import PrivacyBudget
from jaxdp.dpsgd import make_private

N, D, K, T = 301, 6, 3, 8


def data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(N, D)).astype(np.float32)
  y = rng.integers(0, K, N).astype(np.int32)
  return x, y


def loss(w, xi, yi):
  return -jax.nn.log_softmax(xi @ w)[yi]


def plan(checkpoint_dir=None):
  return make_private(loss, l2_clip_norm=1.0, num_examples=N, expected_batch_size=30,
                      noise_multiplier=1.0, delta=1e-5, steps=T, key=jax.random.key(42),
                      learning_rate=0.5, checkpoint_dir=checkpoint_dir,
                      checkpoint_every=None if checkpoint_dir is None else 2)


def main(argv):
  ckpt_dir, budget_path, out = argv[1], argv[2], argv[3]
  pause = float(argv[4]) if len(argv) > 4 else 0.0
  x, y = data()
  private = plan(ckpt_dir)
  budget = PrivacyBudget(10.0, 1e-5, path=budget_path)
  params, state = private.restore(jnp.zeros((D, K), jnp.float32), data=(x, y))
  sampler = private.sampler(budget, data=(x, y))
  print(f"start {sampler.steps_sampled}", flush=True)
  while sampler.steps_remaining:
    params, state, _ = private.step(params, state, sampler.sample())
    print(f"step {int(state.step)}", flush=True)
    time.sleep(pause)
  private.close()
  np.savez(out, params=np.asarray(params), paid=sampler.steps_paid)
  print("done", flush=True)


if __name__ == "__main__":
  main(sys.argv)
