"""Every cell of the plan product works or is refused for its stated reason (issue: composable plan).

{host, device} x {Poisson, cyclic Poisson, fixed-size, user-level} x {fixed, adaptive,
per-layer adaptive clip} x {independent, BandMF, BLT} x {checkpoint, none} in one process; the 2-process cells are in
``test_plan_cells_multihost.py``. A working cell trains, pays exactly its event, and, killed
between checkpoints and resumed, ends bit-identical to an uninterrupted run. A representative
slice is always on; the whole product is ``slow``.
"""

import re

import numpy as np
import pytest

import _plan_cells as pc
from jaxdp.accounting import PrivacyAccountant

# Always on: every value of every axis in at least one cell (each selection, each clip, each
# noise, both layouts, checkpoint and none), the refused cell, and a checkpointed cell whose
# state holds the most (a device-sampled cyclic run, an adaptive clip norm and a BandMF noise
# history), and the pairings device x Poisson x adaptive, fixed-size x fixed clip and user x
# adaptive x BandMF. The rest of the product runs under `slow`.
SLICE = {
    False: {pc.Cell("host", "poisson", "fixed", "independent"),
            pc.Cell("host", "cyclic", "fixed", "BLT"),
            pc.Cell("device", "poisson", "adaptive", "independent"),
            pc.Cell("host", "fixed_size", "fixed", "independent"),
            pc.Cell("device", "user", "fixed", "independent"),
            pc.Cell("host", "user", "adaptive", "BandMF"),  # user x adaptive x correlated
            pc.Cell("host", "fixed_size", "adaptive_per_layer", "BandMF"),  # G = 2 counts
            pc.Cell("host", "user", "adaptive_per_layer", "independent")},  # refused
    True: {pc.Cell("device", "cyclic", "adaptive", "BandMF")},
}


def _params(cells, checkpoint):
  out = []
  for cell in cells:
    marks = () if cell in SLICE[checkpoint] else (pytest.mark.slow,)
    out.append(pytest.param(cell, checkpoint, id=f"{cell.id}-{'ckpt' if checkpoint else 'none'}",
                            marks=marks))
  return out


CELLS = _params(pc.all_cells(), False) + _params(pc.all_cells(), True)


@pytest.mark.parametrize("cell, checkpoint", CELLS)
def test_cell_trains_pays_its_event_and_resumes_bit_identically(cell, checkpoint, tmp_path):
  reason = pc.refusal(cell)
  if reason is not None:
    acc = PrivacyAccountant()
    with pytest.raises(ValueError, match=reason):
      pc.make_plan(cell, checkpoint_dir=tmp_path if checkpoint else None)
    assert acc.ledger == ()
    assert not list(tmp_path.iterdir())  # refused before anything was written
    return
  ref, acc, plan = pc.run(cell)
  start = pc.initial_params()
  moved = [np.abs(np.asarray(a) - b).max() for a, b in zip(ref.values(), start.values())]
  assert all(np.isfinite(np.asarray(a)).all() for a in ref.values()) and max(moved) > 0
  assert pc.ledger(acc) == pc.expected_ledger(plan)
  assert acc.unit == ("user" if cell.selection == "user" else "example")
  if not checkpoint:
    return
  pc.run(cell, checkpoint_dir=tmp_path, stop=3)  # killed after 3 steps (checkpoint at 2)
  out, acc, plan = pc.run(cell, checkpoint_dir=tmp_path)  # the same command again
  for a, b in zip(ref.values(), out.values()):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert pc.ledger(acc) == pc.expected_ledger(plan)


def test_every_refused_cell_states_a_reason():
  refused = [c for c in pc.all_cells() if pc.refusal(c)]
  assert refused  # the table in docs/custom_training_loops.md lists these
  for cell in refused:
    assert re.search("not available", pc.refusal(cell))
