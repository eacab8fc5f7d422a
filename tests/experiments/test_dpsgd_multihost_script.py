"""experiments/dpsgd_multihost.py: the README's multi-host launch, and its resume."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "dpsgd_multihost.py"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(tmp_path, processes, devices, extra=()):
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  common = [f"--out_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            "--epochs=0.5", *extra]
  if processes == 1:
    cmds = [[sys.executable, str(SCRIPT), *common]]
  else:
    port = _free_port()
    cmds = [[sys.executable, str(SCRIPT), f"--coordinator_address=127.0.0.1:{port}",
             f"--num_processes={processes}", f"--process_id={i}", *common]
            for i in range(processes)]
  procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
           for c in cmds]
  try:
    outs = [p.communicate(timeout=240) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  return json.loads((tmp_path / "out" / "result.json").read_text())


def _check(tmp_path, processes, devices):
  first = _launch(tmp_path, processes, devices)
  assert first["processes"] == processes and first["devices"] == processes * devices
  assert first["steps_paid"] == first["steps"] > 0 and first["epsilon"] <= 4.0
  again = _launch(tmp_path, processes, devices)  # the same command: resumes the finished run
  assert again == first
  from jaxdp.accounting import PrivacyBudget  # pylint: disable=import-outside-toplevel
  budget = PrivacyBudget.load(tmp_path / "ckpt" / "budget.json")
  assert sum(c for _, c in budget.accountant.ledger) == first["steps"]  # paid once, by one process


@pytest.mark.slow
def test_single_process_run_and_rerun(tmp_path):
  # Always on: the same make_private path on 2 x 4 devices (test_multihost.py) and its resume
  # (test_private_step_checkpoints.py, test_resume_after_sigkill.py).
  # In this process (the script's main, without the launch flags): the same checks, cheaper.
  import _repo_modules  # pylint: disable=import-outside-toplevel
  script = _repo_modules.load("experiments/dpsgd_multihost.py")
  argv = [f"--out_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
          "--epochs=0.5"]
  first = script.main(argv)
  assert first["processes"] == 1 and first["steps_paid"] == first["steps"] > 0
  assert script.main(argv) == first == json.loads((tmp_path / "out" / "result.json").read_text())
  from jaxdp.accounting import PrivacyBudget  # pylint: disable=import-outside-toplevel
  budget = PrivacyBudget.load(tmp_path / "ckpt" / "budget.json")
  assert sum(c for _, c in budget.accountant.ledger) == first["steps"]


@pytest.mark.slow
def test_single_process_launch_and_relaunch(tmp_path):
  _check(tmp_path, 1, 1)


@pytest.mark.slow
@pytest.mark.multidevice
def test_two_processes_run_and_rerun(tmp_path):
  _check(tmp_path, 2, 2)
