"""Device-resident sampling for every sampler x clipper x noise cell (issue 39).

``plan.sampler(accountant, data=(x, y))`` samples inside the jitted step; it
must give the run the host path (``sampler.sample().gather(x, y)``) gives for
the same key: cyclic Poisson batches of a correlated-noise plan (BandMF),
adaptive clip norms, and both together. The mesh check runs in a subprocess
with 8 simulated CPU devices (this module run as a script).
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.accounting import PrivacyAccountant
from jaxdp.dpsgd import device_sampling as ds
from jaxdp.dpsgd import make_private
from jaxdp.dpsgd.adaptive_clipping import AdaptiveClipNorm
from jaxdp.dpsgd.correlated import BandMF, CyclicPoissonSampler
from jaxdp.dpsgd.correlated import participation

import _plan_cells as pc

N, D, H, K = 203, 5, 8, 3
STEPS = 6
BANDMF = BandMF(np.array([1.0, 0.5, 0.25]))  # 3 bands: b = 3 cyclic groups


def _data(n=N):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n, D)).astype(np.float32)
  y = ((x[:, :3].argmax(1) + (rng.random(n) < 0.2)) % K).astype(np.int32)
  return x, y


def _mlp_loss(p, xi, yi):
  h = jax.nn.relu(xi @ p["w1"] + p["b1"])
  return -jax.nn.log_softmax(h @ p["w2"] + p["b2"])[yi]


def _params():
  rng = np.random.default_rng(1)
  return {"w1": (0.5 * rng.normal(size=(D, H))).astype(np.float32), "b1": np.zeros(H, np.float32),
          "w2": (0.5 * rng.normal(size=(H, K))).astype(np.float32), "b2": np.zeros(K, np.float32)}


def _plan(noise_strategy=None, adaptive=False, **kw):
  clip = AdaptiveClipNorm(initial=0.3, learning_rate=0.5) if adaptive else 0.5
  return make_private(_mlp_loss, l2_clip_norm=clip, num_examples=N, expected_batch_size=30,
                      noise_multiplier=1.0, delta=1e-5, steps=STEPS, key=jax.random.key(3),
                      learning_rate=0.5, noise_strategy=noise_strategy, **kw)


def _run(device, x, y, **plan_kw):
  return _run_plan(_plan(**plan_kw), device, x, y, _params())


def _run_cell(cell):
  """``_run`` for a cell of the plan product (_plan_cells.py): its plan, data and params."""
  x, y = pc.data()
  return _run_plan(pc.make_plan(cell), cell.layout == "device", x, y, pc.initial_params())


def _run_plan(private, device, x, y, params):
  """Every step of ``private`` on (x, y): (params, batch sizes, clip norms, ledger)."""
  acc = PrivacyAccountant()
  state = private.init(params)
  sampler = private.sampler(acc, data=(x, y)) if device else private.sampler(acc)
  assert sampler.device_resident == device
  sizes, clips = [], []
  for _ in range(private.steps):
    clips.append(private.clip_norm(state))
    batch = sampler.sample()
    params, state, info = private.step(params, state, batch if device else batch.gather(x, y))
    sizes.append(int(info.nonprivate_num_examples))
  clips.append(private.clip_norm(state))
  return params, sizes, clips, acc.ledger


# The plans of the plan-cell product (_plan_cells.py: a linear model on 96 examples, 4 steps;
# BandMF with 2 bands = 2 cyclic groups; AdaptiveClipNorm): the device run of "bandmf+adaptive"
# is test_plan_cells.py's always-on cell device-cyclic-adaptive-BandMF, so its compiled step is
# shared. (The 8-device checks below run _plan on 203 examples: a mesh with padding rows.)
@pytest.mark.parametrize("noise,adaptive", [
    pytest.param(True, False, marks=pytest.mark.slow),  # a part of "bandmf+adaptive"
    # Its code path (clip norm per step, no groups) is a part of "bandmf+adaptive".
    pytest.param(False, True, marks=pytest.mark.slow),
    (True, True)], ids=["bandmf", "adaptive", "bandmf+adaptive"])
def test_device_path_equals_host_path(noise, adaptive):
  cell = lambda layout: pc.Cell(layout, "cyclic" if noise else "poisson",
                                "adaptive" if adaptive else "fixed",
                                "BandMF" if noise else "independent")
  host = _run_cell(cell("host"))
  dev = _run_cell(cell("device"))
  # The same batches (sizes) and the same paid ledger ...
  assert host[1] == dev[1] and sum(host[1]) > 0
  assert host[3] == dev[3] and len(host[3]) == 1
  # ... the same clip norms C_t (adaptive: a function of the noisy counts) ...
  np.testing.assert_allclose(host[2], dev[2], rtol=1e-6)
  if adaptive:
    assert len(set(host[2])) == pc.T + 1  # C_t moved every step
  # ... and the same noise: parameters agree to float rounding (another XLA fusion),
  # while training moved them far beyond it.
  moved = max(float(np.abs(np.asarray(host[0][k]) - v).max())
              for k, v in pc.initial_params().items())
  assert moved > 0.05
  for k in host[0]:
    np.testing.assert_allclose(np.asarray(host[0][k]), np.asarray(dev[0][k]), rtol=2e-5,
                               atol=2e-6)


def test_cyclic_groups_are_the_host_groups_for_any_row_count():
  key = jax.random.key(9)
  for b in (1, 3, 7):
    host = participation.group_assignment(key, N, b)
    for rows in (N, ds.padded_num_rows(N, 8), 256):
      dev = np.asarray(jax.jit(lambda k, r=rows, g=b: participation.cyclic_groups(k, r, g))(key))
      np.testing.assert_array_equal(dev[:N], host)


def _indicator_loss(w, e):
  """Gradient = the one-hot row e: the clipped sum of a batch is its membership vector."""
  return jnp.dot(w, e)


def cyclic_batches(mesh=None, steps=5, n=N, b=3, p=0.6):
  """Membership vectors of the device-sampled cyclic batches (and the host's), for ``mesh``."""
  from jaxdp.dpsgd import clipping  # pylint: disable=g-import-not-at-top
  group_key, step_keys = jax.random.key(21), jax.random.split(jax.random.key(22), steps)
  host = CyclicPoissonSampler(n, b, p, steps, group_key)
  grad_fn = clipping.clipped_grad(_indicator_loss, l2_clip_norm=2.0, method="vmap")
  shards = 1 if mesh is None else mesh.shape[ds.DATA_AXIS]
  padded = ds.local_padded_size(n, p / b, shards, 8)  # small chunks: several per batch
  fn = ds.clipped_sum_fn(grad_fn, num_examples=n, sample_rate=p, padded_size=padded, mesh=mesh)
  groups = ds.computed_rows(lambda r: participation.cyclic_groups(group_key, r, b), n, mesh)
  (eye,) = ds.place_data((np.eye(n, dtype=np.float32),), n, mesh)
  run = jax.jit(lambda k, t, g, e: fn(jnp.zeros(n), k, (e,), row_mask=g == t % b)[0])
  got, want = [], []
  for t in range(steps):
    got.append(np.flatnonzero(np.asarray(run(step_keys[t], t, groups, eye)) > 0.5).tolist())
    want.append(host.indices(t, step_keys[t]).tolist())
  return got, want


def test_device_cyclic_batches_are_the_host_batches():
  got, want = cyclic_batches()
  assert got == want and all(want)


def _eight_devices(train):
  flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
  args = [sys.executable, str(pathlib.Path(__file__))] + (["--train"] if train else [])
  proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["devices"] == 8
  # The cyclic Poisson batches sampled on 8 devices are the host's, row for row.
  assert out["mesh_batches"] == out["host_batches"] and all(out["host_batches"])
  return out


@pytest.mark.slow  # always on: the 2-process job of test_multihost.py (BandMF + adaptive)
@pytest.mark.multidevice
def test_eight_devices_sample_the_same_cyclic_batches():
  _eight_devices(train=False)


@pytest.mark.slow
@pytest.mark.multidevice
def test_eight_devices_train_bandmf_adaptive_like_the_host_path():
  out = _eight_devices(train=True)
  x, y = _data()
  host = _run(False, x, y, noise_strategy=BANDMF, adaptive=True)
  assert out["sizes"] == host[1]
  np.testing.assert_allclose(out["clips"], host[2], rtol=1e-6)
  for k in host[0]:
    np.testing.assert_allclose(out["params"][k], np.asarray(host[0][k]), rtol=2e-5, atol=2e-6)


def _main(train):
  """Subprocess side (8 devices): cyclic batches, and a BandMF + adaptive run on the mesh."""
  from jaxdp.dpsgd import data_parallel  # pylint: disable=g-import-not-at-top
  assert len(jax.devices()) == 8, jax.devices()
  mesh = data_parallel.make_data_mesh(8)
  got, want = cyclic_batches(mesh)
  out = {"devices": len(jax.devices()), "mesh_batches": got, "host_batches": want}
  if train:
    x, y = _data()
    private = _plan(noise_strategy=BANDMF, adaptive=True)
    params = _params()
    state = private.init(params)
    sampler = private.sampler(PrivacyAccountant(), data=(x, y), mesh=mesh)
    sizes, clips = [], []
    for _ in range(private.steps):
      clips.append(private.clip_norm(state))
      params, state, info = private.step(params, state, sampler.sample())
      sizes.append(int(info.nonprivate_num_examples))
    clips.append(private.clip_norm(state))
    out.update(sizes=sizes, clips=clips,
               params={k: np.asarray(v).tolist() for k, v in params.items()})
  print(json.dumps(out))


if __name__ == "__main__":
  _main(train="--train" in sys.argv)
