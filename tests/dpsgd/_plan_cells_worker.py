"""One process of the 2-process plan-cells job (``_multihost_launch.launch``; see
test_plan_cells_multihost.py).

Runs every working device-layout cell of ``_plan_cells`` on the global mesh of
the job (``multihost.global_mesh()``, the data from
``multihost.global_dataset``), the user-level cell's refusal of global arrays
(and that cell again with the N-row host arrays and the mesh, which the refusal
asks for), and one checkpoint cell killed after 3 steps and resumed in the same
job on a directory every process sees (``--checkpoint-dir``). Writes, per cell,
this process's copy of the final parameters and its ledger (JSON) to ``--out``;
the assertions live in the test. A cell that raises is recorded (its error) and
the job goes on, so the test can name every failing cell.
"""

import argparse
import json
import os
import sys
import time
import traceback

import jax
import numpy as np
from jax.experimental import multihost_utils

import _plan_cells as pc
from jaxdp.accounting import PrivacyAccountant
from jaxdp.dpsgd import multihost

# The cell the job kills after 3 steps (a checkpoint at step 2) and resumes: the one with
# the most state (noise history, cyclic groups, adaptive clip norm).
CHECKPOINT_CELL = pc.Cell("device", "cyclic", "adaptive", "BandMF")


def device_cells() -> list[pc.Cell]:
  """The device-layout cells make_private accepts (user-level sampling included)."""
  return [c for c in pc.all_cells() if c.layout == "device" and pc.refusal(c) is None]


def ledger_json(ledger) -> str:
  """A ledger ``[(event dict, count)]`` as canonical JSON (the test compares the strings)."""
  return json.dumps([[e, int(c)] for e, c in ledger], sort_keys=True)


def _log(msg: str) -> None:
  print(f"[process {jax.process_index()}] {msg}", file=sys.stderr, flush=True)


def _record(out: dict, name: str, fn) -> None:
  """Runs ``fn() -> (params, acc, plan)`` and stores params, ledger and expected ledger."""
  start = time.monotonic()
  try:
    params, acc, plan = fn()
  except Exception as err:  # pylint: disable=broad-except  (recorded for the test to report)
    out[f"{name}/error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc()[-1500:]}"
    _log(f"{name}: {type(err).__name__}: {err}")
    return
  for k, v in params.items():
    out[f"{name}/{k}"] = np.asarray(v.addressable_data(0) if isinstance(v, jax.Array) else v)
  out[f"{name}/ledger"] = ledger_json(pc.ledger(acc))
  out[f"{name}/expected_ledger"] = ledger_json(pc.expected_ledger(plan))
  out[f"{name}/unit"] = acc.unit
  _log(f"{name}: {time.monotonic() - start:.1f} s")


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--coordinator", required=True)
  parser.add_argument("--num-processes", type=int, required=True)
  parser.add_argument("--process-id", type=int, required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--checkpoint-dir", required=True,
                      help="an empty directory every process sees")
  parser.add_argument("--cells", default="",
                      help="comma-separated cell ids to run (default: every device cell)")
  args = parser.parse_args()

  multihost.initialize(args.coordinator, num_processes=args.num_processes,
                       process_id=args.process_id)
  mesh = multihost.global_mesh()
  x, y = pc.data()
  lo, hi = multihost.process_rows(pc.N, mesh)
  arrays = multihost.global_dataset((x[lo:hi], y[lo:hi]), num_examples=pc.N, mesh=mesh)
  out = {"process_index": jax.process_index(), "process_count": jax.process_count(),
         "num_devices": mesh.devices.size}
  wanted = set(filter(None, args.cells.split(",")))
  cells = [c for c in device_cells() if not wanted or c.id in wanted]
  ran = []
  for cell in cells:
    ran.append(cell.id)
    if cell.selection == "user":
      # Global (per-process) arrays: refused before anything is paid.
      plan = pc.make_plan(cell)
      acc = PrivacyAccountant(unit=plan.unit)
      try:
        plan.sampler(acc, data=arrays, mesh=mesh)
        out[f"{cell.id}/global_refusal"] = "no error"
      except ValueError as err:
        out[f"{cell.id}/global_refusal"] = str(err)
      out[f"{cell.id}/global_refusal_ledger"] = ledger_json(pc.ledger(acc))
      plan.close()
      # What the refusal asks for: the N-row host arrays (the same on every process) and the mesh.
      _record(out, cell.id, lambda cell=cell: pc.run(cell, mesh=mesh, arrays=(x, y)))
    else:
      _record(out, cell.id, lambda cell=cell: pc.run(cell, mesh=mesh, arrays=arrays))
  if not wanted or CHECKPOINT_CELL.id in wanted:
    name = CHECKPOINT_CELL.id + "-ckpt"
    ran.append(name)

    def killed_and_resumed():
      pc.run(CHECKPOINT_CELL, checkpoint_dir=args.checkpoint_dir, stop=3, mesh=mesh,
             arrays=arrays)  # killed after 3 steps (checkpoint at 2)
      # The run's durable ledger the killed run left on the shared directory: the steps paid
      # and the newest step checkpointed. Process 0 writes it (the last time when its close()
      # has waited for the pending save; process 1 can return from close() before that and read
      # checkpointed_through = 0), so every process reads it after a barrier.
      multihost_utils.sync_global_devices("plan_cells_killed_run_closed")
      with open(os.path.join(args.checkpoint_dir, "ledger.json")) as f:
        durable = json.load(f)
      out[f"{name}/killed_steps_paid"] = durable["steps_paid"]
      out[f"{name}/killed_checkpointed_through"] = durable["checkpointed_through"]
      return pc.run(CHECKPOINT_CELL, checkpoint_dir=args.checkpoint_dir, mesh=mesh,
                    arrays=arrays)  # the same command again

    _record(out, name, killed_and_resumed)
  out["cells"] = np.asarray(ran)
  np.savez(args.out, **out)


if __name__ == "__main__":
  main()
