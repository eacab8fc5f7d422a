"""The cells of a private-training plan, built and run the same way by the product test and its workers.

A cell is one choice on each axis of ``make_private``:

* layout: ``host`` (``sampler(acc).sample().gather(x, y)``) or ``device``
  (``sampler(acc, data=(x, y))``);
* selection: ``poisson`` (examples at rate q), ``cyclic`` (cyclic Poisson over
  b = 2 groups), ``fixed_size`` (B of N without replacement, replace-one) or
  ``user`` (users at rate q, one clipped contribution per user);
* clip: ``fixed``, ``adaptive`` (``AdaptiveClipNorm``) or ``adaptive_per_layer``
  (``AdaptiveClipNorm`` with ``per_layer=True``: one clip norm, quantile and
  noisy count per params leaf, G = 2 here);
* noise: ``independent``, ``BandMF`` (2 bands) or ``BLT`` (1 buffer);
* checkpoint: with ``checkpoint_dir`` or without;
* processes: 1, or 2 (``jax.distributed`` on localhost; device layout).

:func:`refusal` names the cells ``make_private`` refuses, with the reason it
must give; every other cell trains and pays exactly its event.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import jax
import numpy as np

from jaxdp.accounting import PrivacyAccountant, events
from jaxdp.dpsgd import AdaptiveClipNorm, make_private
from jaxdp.dpsgd.correlated import BLT, BandMF
from jaxdp.dpsgd.fixed_size_sampling import FixedSizeSampler
from jaxdp.dpsgd.user_sampling import UserPoissonSampler

N, D, K, T = 96, 5, 3, 4
LAYOUTS = ("host", "device")
SELECTIONS = ("poisson", "cyclic", "fixed_size", "user")
CLIPS = ("fixed", "adaptive", "adaptive_per_layer")
NOISES = ("independent", "BandMF", "BLT")


class Cell(NamedTuple):
  layout: str
  selection: str
  clip: str
  noise: str

  @property
  def id(self) -> str:
    return "-".join(self)


def all_cells() -> list[Cell]:
  return [Cell(*c) for c in itertools.product(LAYOUTS, SELECTIONS, CLIPS, NOISES)]


def data() -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  x = rng.normal(size=(N, D)).astype(np.float32)
  y = ((x[:, :K].argmax(1) + (rng.random(N) < 0.2)) % K).astype(np.int32)
  return x, y


def user_ids() -> np.ndarray:
  return np.random.default_rng(1).integers(0, 24, N)


def loss(params, x, y):
  return -jax.nn.log_softmax(x @ params["w"] + params["b"])[y]


def initial_params() -> dict:
  rng = np.random.default_rng(2)
  return {"w": (0.3 * rng.normal(size=(D, K))).astype(np.float32), "b": np.zeros(K, np.float32)}


def refusal(cell: Cell) -> str | None:
  """The reason make_private must give for a refused cell (a regex), or None if it works.

  Only per-layer clipping with user-level sampling is refused in this product: user-level
  clipping clips each user's gradient as one vector (no per-layer mode). The other
  refusals (min_separation > 1 with a batch_selection sampler, fixed-size with add/remove
  or PLD of a sampled-without-replacement event) are outside these axes and tested in
  test_plan_selection_cells.py.
  """
  if cell.selection == "user" and cell.clip == "adaptive_per_layer":
    return "per_layer=True is not available with batch_selection=UserPoissonSampler"
  return None


def _strategy(cell: Cell):
  if cell.noise == "BandMF":
    return BandMF(np.array([1.0, 0.5]))
  if cell.noise == "BLT":
    return BLT(theta=[0.5], omega=[0.3])
  return BandMF.dp_sgd() if cell.selection == "cyclic" else None


def plan_kwargs(cell: Cell) -> dict:
  """make_private's arguments for ``cell`` (without key and checkpoint arguments)."""
  kw = dict(num_examples=N, noise_multiplier=1.0, delta=1e-5, steps=T, learning_rate=0.5,
            l2_clip_norm=(AdaptiveClipNorm(initial=0.5, count_noise_multiplier=4.0)
                          if cell.clip.startswith("adaptive") else 0.5),
            per_layer=cell.clip == "adaptive_per_layer")
  strategy = _strategy(cell)
  if strategy is not None:
    kw.update(noise_strategy=strategy, min_separation=2 if cell.selection == "cyclic" else 1)
  if cell.selection == "fixed_size":
    kw.update(batch_selection=FixedSizeSampler(N, 16), neighbouring="replace_one")
  elif cell.selection == "user":
    kw.update(batch_selection=UserPoissonSampler(user_ids(), sample_rate=0.3,
                                                 max_examples_per_user=16))
  else:
    kw.update(expected_batch_size=16.0)
  return kw


def make_plan(cell: Cell, checkpoint_dir=None, key: int = 7):
  return make_private(loss, key=jax.random.key(key), checkpoint_dir=checkpoint_dir,
                      checkpoint_every=None if checkpoint_dir is None else 2,
                      **plan_kwargs(cell))


def run(cell: Cell, *, checkpoint_dir=None, stop: int | None = None, mesh=None, arrays=None,
        params=None):
  """Runs (or resumes) the cell's plan; stops after ``stop`` sampled steps like a killed job.

  Returns ``(params, accountant, plan)``.
  """
  plan = make_plan(cell, checkpoint_dir)
  arrays = data() if arrays is None else arrays
  params = initial_params() if params is None else params
  acc = PrivacyAccountant(unit=plan.unit)
  if checkpoint_dir is not None:
    params, state = plan.restore(params, data=arrays)
  else:
    state = plan.init(params)
  device = cell.layout == "device"
  sampler = plan.sampler(acc, data=arrays if device else None, mesh=mesh)
  while sampler.steps_remaining and sampler.steps_sampled != stop:
    batch = sampler.sample()
    params, state, _ = plan.step(params, state, batch if device else batch.gather(*arrays))
  plan.close()
  return params, acc, plan


def expected_ledger(plan) -> list[tuple[dict, int]]:
  """What the run must have paid: the run's one event (correlated noise) or T x the step event."""
  if plan.noise_strategy is not None:
    return [(events.event_to_dict(plan.run_event()), 1)]
  return [(events.event_to_dict(plan.step_event()), plan.steps)]


def ledger(acc) -> list[tuple[dict, int]]:
  return [(events.event_to_dict(e), c) for e, c in acc.ledger]
