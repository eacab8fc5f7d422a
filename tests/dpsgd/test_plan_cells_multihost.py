"""The plan's multi-process cells: 2 processes x 2 CPU devices on 127.0.0.1 train like one process.

ONE launch (``_plan_cells_worker.py``, started by ``_multihost_launch.py``)
runs every working device-layout cell of ``_plan_cells`` (Poisson, cyclic
Poisson, fixed-size and user-level selection x fixed / adaptive clip x
independent / BandMF / BLT noise, as ``make_private`` accepts them) on the
4-device global mesh of a ``jax.distributed`` job, plus one checkpoint cell
killed after 3 steps and resumed in the same job on a shared directory. Here
each cell is run again in this process (device layout, no mesh): the final
parameters agree to float rounding (the clipped sums are added in another
order over the devices), both processes hold the same bits, process 0's ledger
is exactly the cell's event and process 1 mirrors it.

User-level sampling refuses the per-process global arrays of
``multihost.global_dataset`` (it lays the data out user-major on the host)
before anything is paid, and trains on the job's mesh from the N-row host arrays
its message asks for.

Slow: every cell compiles in each of the two processes (about 3 minutes on 2 cores).
"""

import functools
import json
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import _multihost_launch  # pylint: disable=g-import-not-at-top,wrong-import-position
import _plan_cells as pc  # pylint: disable=g-import-not-at-top,wrong-import-position
import _plan_cells_worker as worker  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = [pytest.mark.slow, pytest.mark.multidevice]

CELLS = worker.device_cells()
CKPT = worker.CHECKPOINT_CELL.id + "-ckpt"
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  ckpt_dir = tmp_path_factory.mktemp("plan_cells_ckpt")  # both processes see it
  results = _multihost_launch.launch(pathlib.Path(worker.__file__), num_processes=2,
                                     devices_per_process=2,
                                     args=["--checkpoint-dir", str(ckpt_dir)], timeout=900)
  return [r.out for r in results]


@functools.lru_cache(maxsize=None)
def one_process(cell: pc.Cell):
  """The cell in this process: device layout, no mesh -> (params, ledger JSON, expected JSON)."""
  params, acc, plan = pc.run(cell)
  return ({k: np.asarray(v) for k, v in params.items()}, worker.ledger_json(pc.ledger(acc)),
          worker.ledger_json(pc.expected_ledger(plan)))


def _check_like_one_process(job, name: str, cell: pc.Cell) -> None:
  p0, p1 = job
  for i, out in enumerate(job):
    assert f"{name}/error" not in out, f"process {i}, cell {name}: {out[f'{name}/error']}"
  ref, ref_ledger, expected = one_process(cell)
  assert ref_ledger == expected  # the single-process run paid its event
  start = pc.initial_params()
  moved = max(np.abs(ref[k] - start[k]).max() for k in ref)
  assert moved > 100 * (ATOL + RTOL)  # the run moved the parameters far beyond the tolerance
  for k in ref:
    # Both processes hold the same replicated parameters, bit for bit ...
    np.testing.assert_array_equal(p0[f"{name}/{k}"], p1[f"{name}/{k}"])
    # ... the single-process ones up to the order of the float32 sums over the devices.
    np.testing.assert_allclose(p0[f"{name}/{k}"], ref[k], rtol=RTOL, atol=ATOL,
                               err_msg=f"cell {name}, {k}")
  # Process 0 paid exactly the cell's event (the same plan event as in one process); process 1
  # mirrors it on its in-memory ledger.
  assert str(p0[f"{name}/expected_ledger"]) == expected
  assert str(p0[f"{name}/ledger"]) == expected
  assert str(p1[f"{name}/ledger"]) == str(p0[f"{name}/ledger"])
  unit = "user" if cell.selection == "user" else "example"
  assert str(p0[f"{name}/unit"]) == str(p1[f"{name}/unit"]) == unit


def test_the_job_ran_every_device_cell_on_two_processes(job):
  for i, out in enumerate(job):
    assert int(out["process_index"]) == i and int(out["process_count"]) == 2
    assert int(out["num_devices"]) == 4
    assert list(out["cells"]) == [c.id for c in CELLS] + [CKPT]
  selections = {c.selection for c in CELLS}
  assert selections == set(pc.SELECTIONS)  # every selection has a working device cell
  assert {(c.clip, c.noise) for c in CELLS} == {(a, b) for a in pc.CLIPS for b in pc.NOISES}


@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_cell_on_two_processes_equals_one_process(job, cell):
  if cell.selection == "user":
    for out in job:  # refused on every process before anything was paid
      msg = str(out[f"{cell.id}/global_refusal"])
      assert "UserPoissonSampler with data=" in msg and "not global arrays" in msg, msg
      assert json.loads(str(out[f"{cell.id}/global_refusal_ledger"])) == []
  _check_like_one_process(job, cell.id, cell)


def test_checkpoint_cell_killed_and_resumed_on_two_processes(job):
  cell = worker.CHECKPOINT_CELL
  # The killed job had paid its 3 steps (all T at once with correlated noise, whose run event
  # is paid up front) and checkpointed step 2 on the shared directory.
  paid = pc.T if pc.make_plan(cell).noise_strategy is not None else 3
  for out in job:
    assert int(out[f"{CKPT}/killed_steps_paid"]) == paid
    assert int(out[f"{CKPT}/killed_checkpointed_through"]) == 2
  _check_like_one_process(job, CKPT, cell)
  for out in job:  # the resumed run is the uninterrupted run of the same job, bit for bit
    for k in pc.initial_params():
      np.testing.assert_array_equal(out[f"{CKPT}/{k}"], out[f"{cell.id}/{k}"])
