"""A private run killed with SIGKILL resumes from its last checkpoint to the uninterrupted result.

The worker (``_resume_worker.py``) trains with ``make_private(..., checkpoint_dir=...)`` on a
durable ``PrivacyBudget``; the test kills it mid-run (between checkpoints, after it paid steps
it never checkpointed), restarts it with the same arguments, and checks: the final parameters
equal an uninterrupted run's bit for bit (same batches, same noise), and the budget file's
ledger holds exactly the T steps paid (the steps lost after the last checkpoint are replayed
once, not paid twice).
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxdp.accounting import PrivacyBudget

WORKER = pathlib.Path(__file__).with_name("_resume_worker.py")
TIMEOUT_S = 120


def _env():
  env = dict(os.environ)
  env.setdefault("JAX_PLATFORMS", "cpu")
  return env


def _run(args, timeout=TIMEOUT_S):
  return subprocess.run([sys.executable, str(WORKER), *map(str, args)], capture_output=True,
                        text=True, timeout=timeout, env=_env())


def _ledger_steps(path) -> int:
  budget = PrivacyBudget.load(path)
  return sum(count for _, count in budget.accountant.ledger)


@pytest.mark.slow
def test_sigkill_mid_run_resumes_to_the_uninterrupted_result(tmp_path):
  sys.path.insert(0, str(WORKER.parent))
  import _resume_worker as worker  # pylint: disable=import-outside-toplevel

  # Uninterrupted reference, in this process (no checkpoints: the same keys, the same run).
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jaxdp.accounting import PrivacyAccountant  # pylint: disable=import-outside-toplevel
  private = worker.plan()
  params, state = jnp.zeros((worker.D, worker.K), jnp.float32), None
  state = private.init(params)
  sampler = private.sampler(PrivacyAccountant(), data=worker.data())
  while sampler.steps_remaining:
    params, state, _ = private.step(params, state, sampler.sample())
  reference = np.asarray(params)

  ckpt, budget, out = tmp_path / "ckpt", tmp_path / "budget.json", tmp_path / "out.npz"
  proc = subprocess.Popen([sys.executable, str(WORKER), ckpt, budget, out, "0.2"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
  killed_after = None
  deadline = time.monotonic() + TIMEOUT_S
  try:
    for line in proc.stdout:
      if line.startswith("step "):
        step = int(line.split()[1])
        # Step 5: the checkpoint of step 4 exists, step 5 is paid (and applied) but not saved.
        if step == 5:
          os.kill(proc.pid, signal.SIGKILL)
          killed_after = step
          break
      assert time.monotonic() < deadline, "the worker did not reach step 5 in time"
  finally:
    proc.wait(timeout=30)
  assert killed_after == 5 and proc.returncode == -signal.SIGKILL
  assert not out.exists()
  ledger = json.loads((ckpt / "ledger.json").read_text())
  paid_before = ledger["steps_paid"]
  assert paid_before >= 5
  assert _ledger_steps(budget) == paid_before

  resumed = _run([ckpt, budget, out])
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  start = int(resumed.stdout.split("start ")[1].split()[0])
  # Resumed from the newest finalised checkpoint (step 4; step 2 if the kill beat the
  # asynchronous save of step 4), before the steps paid: those are replayed, not paid again.
  assert start in (2, 4) and start < paid_before
  result = np.load(out)
  np.testing.assert_array_equal(result["params"], reference)
  assert int(result["paid"]) == worker.T
  assert _ledger_steps(budget) == worker.T
