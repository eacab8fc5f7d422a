"""Multi-host DP-SGD (``jax.distributed``): 2 processes x 4 CPU devices on 127.0.0.1.

ONE launch of two worker processes (``_multihost_worker.py``, started by
``_multihost_launch.py``) checks the :mod:`~jaxdp.dpsgd.multihost`
pieces and trains with ``make_private`` on the 8-device global mesh; the test
compares both processes' outputs with each other, with the full dataset and
with a single-process run of the same key in this process. The single-process
behaviour and the argument checks run here directly.
"""

import pathlib
import sys
import time

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from jaxdp.accounting.accountant import PrivacyAccountant
from jaxdp.dpsgd import make_private, multihost

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import _multihost_launch  # pylint: disable=g-import-not-at-top,wrong-import-position
import _multihost_worker as worker  # pylint: disable=g-import-not-at-top,wrong-import-position

N = 203  # not a multiple of the 8 devices: 5 padding rows


@pytest.fixture(scope="module")
def job():
  return _multihost_launch.launch(pathlib.Path(worker.__file__), num_processes=2,
                                  devices_per_process=4, args=["--num-examples", str(N), "--e2e"],
                                  timeout=180)


@pytest.mark.multidevice
def test_two_processes_mesh_rows_dataset_psum_broadcast(job):
  x, y = worker.dataset(N)
  p0, p1 = (w.out for w in job)
  for i, out in enumerate((p0, p1)):
    assert int(out["process_index"]) == i and int(out["process_count"]) == 2
    assert int(out["num_devices"]) == 8
    # Each process's devices are one block of the mesh, in process order.
    np.testing.assert_array_equal(out["mesh_processes"], [0, 0, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(out["shape"], [208, 6])  # N_pad = 8 * ceil(203 / 8)
    # The global arrays gathered back: the full data, then zero padding.
    np.testing.assert_array_equal(out["gathered_x"][:N], x)
    np.testing.assert_array_equal(out["gathered_y"][:N], y)
    assert not out["gathered_x"][N:].any() and not out["gathered_y"][N:].any()
    # A psum across the two processes sees every row once.
    np.testing.assert_allclose(out["psum"], x.sum(0), rtol=1e-5, atol=1e-5)
    # Process 0's value everywhere, bit-exact (float64 through a float32 JAX), types kept.
    assert bool(out["bcast_ok"]) and str(out["bcast_ok_type"]) == "bool"
    assert float(out["bcast_eps"]) == 1.0 / 3.0
    np.testing.assert_array_equal(out["bcast_arr"], [0, 7, 14])
    # Params, optimiser state and keys placed replicated on the global mesh.
    assert bool(out["replicated_global"])
    np.testing.assert_array_equal(out["replicated_w"], [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(out["replicated_key"], jax.random.key_data(jax.random.key(5)))
    assert float(out["replicated_lr"]) == 0.5
    # A refusal on one process raises on every process (none is left waiting).
    assert str(out["wrong_dtype"]).startswith("ValueError: arrays differ between processes")
  assert bool(p0["is_coordinator"]) and not bool(p1["is_coordinator"])
  # Device blocks of 26 rows: process 0 rows [0, 104), process 1 the real rows of [104, 208).
  np.testing.assert_array_equal(p0["rows"], [0, 104])
  np.testing.assert_array_equal(p1["rows"], [104, 203])
  assert str(p1["wrong_rows"]).startswith("ValueError: arrays have 98 rows, but process 1 must "
                                          "provide rows [104, 203)")
  assert str(p0["wrong_rows"]).startswith("ValueError: arrays were refused by process(es) [1]")


@pytest.mark.multidevice
def test_two_processes_train_like_one_process(job):
  x, y = worker.dataset(N)
  private = make_private(worker.linear_loss, num_examples=N, key=jax.random.key(worker.E2E_KEY),
                         **worker.E2E)
  accountant = PrivacyAccountant()
  sampler = private.sampler(accountant, data=(x, y))
  params = worker.initial_params()
  state = private.init(params)
  sizes = []
  for _ in range(private.steps):
    params, state, info = private.step(params, state, sampler.sample())
    sizes.append(float(info.nonprivate_num_examples))
  steps = private.steps
  moved = np.abs(np.asarray(params["w"]) - worker.initial_params()["w"]).max()
  assert moved > 0.05  # training moved the weights well beyond the tolerance below
  for out in (w.out for w in job):
    for run in ("ledger", "budget"):
      # The same Poisson batches (sizes) and the same noise: the same parameters.
      np.testing.assert_array_equal(out[f"{run}_sizes"], sizes)
      np.testing.assert_allclose(out[f"{run}_w"], params["w"], rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(out[f"{run}_b"], params["b"], rtol=1e-5, atol=1e-6)
    # The durable budget file was written by process 0 alone: T steps, not 2 T.
    assert int(out["budget_file_entries"]) == 1 and int(out["budget_file_count"]) == steps
    assert bool(out["other_key_refused"])  # plans with different keys refused on every process
  p0, p1 = (w.out for w in job)
  # Process 0 paid exactly T steps on its ledger and on its budget; process 1 mirrors
  # the steps on its in-memory ledger, never on a budget.
  assert int(p0["ledger_entries"]) == 1 and int(p0["ledger_count"]) == steps
  assert int(p0["budget_count"]) == steps
  assert int(p1["ledger_count"]) == steps
  assert accountant.ledger[0][1] == steps


@pytest.mark.multidevice
def test_two_processes_bandmf_adaptive_like_the_host_path(job):
  # Device-resident cyclic Poisson + adaptive clipping on the 2-process mesh gives the run of
  # the host path (sample().gather) in this process for the same key.
  x, y = worker.dataset(N)
  private = worker.bandmf_plan(N)
  sampler = private.sampler(PrivacyAccountant())
  params = worker.initial_params()
  state = private.init(params)
  sizes = []
  for _ in range(private.steps):
    params, state, info = private.step(params, state, sampler.sample().gather(x, y))
    sizes.append(float(info.nonprivate_num_examples))
  for out in (w.out for w in job):
    np.testing.assert_array_equal(out["bandmf_sizes"], sizes)
    np.testing.assert_allclose(out["bandmf_w"], params["w"], rtol=1e-5, atol=1e-6)
    assert float(out["bandmf_clip"]) == pytest.approx(private.clip_norm(state), rel=1e-6)
  assert np.abs(np.asarray(params["w"]) - worker.initial_params()["w"]).max() > 0.05


def test_single_process_rows_dataset_and_broadcast():
  mesh = multihost.global_mesh()
  n_dev = len(jax.devices())
  x, y = worker.dataset(N)
  assert multihost.process_rows(N, mesh) == (0, N)
  assert multihost.padded_num_examples(N, mesh) == n_dev * -(-N // n_dev)
  gx, gy = multihost.global_dataset((x, y), num_examples=N)
  assert gx.shape == (multihost.padded_num_examples(N, mesh), 6)
  np.testing.assert_array_equal(np.asarray(gx)[:N], x)
  np.testing.assert_array_equal(np.asarray(gy)[:N], y)
  assert multihost.is_coordinator()
  sent = multihost.broadcast_from_coordinator({"ok": True, "eps": 0.1, "n": 3, "a": np.ones(2)})
  assert sent["ok"] is True and sent["eps"] == 0.1 and sent["n"] == 3
  np.testing.assert_array_equal(sent["a"], np.ones(2))
  placed = multihost.replicate({"w": np.ones(3, np.float32), "key": jax.random.key(5)}, mesh)
  assert all(a.sharding.is_fully_replicated for a in jax.tree.leaves(placed))
  np.testing.assert_array_equal(placed["w"], np.ones(3))


def test_refusals_name_the_argument():
  mesh = multihost.global_mesh()
  x, y = worker.dataset(N)
  with pytest.raises(ValueError, match="arrays have 202 rows.*rows \\[0, 203\\)"):
    multihost.global_dataset((x[:-1], y[:-1]), num_examples=N, mesh=mesh)
  with pytest.raises(ValueError,
                     match="different numbers of rows: arrays\\[0\\]: 203, arrays\\[1\\]: 202"):
    multihost.global_dataset((x, y[:-1]), num_examples=N, mesh=mesh)
  with pytest.raises(ValueError, match="arrays\\[1\\] must have the examples on its first axis"):
    multihost.global_dataset((x, np.float32(1.0)), num_examples=N, mesh=mesh)
  with pytest.raises(ValueError, match="arrays must hold at least one array"):
    multihost.global_dataset((), num_examples=N, mesh=mesh)
  with pytest.raises(TypeError, match="arrays\\[0\\] must be a numeric array"):
    multihost.global_dataset((np.array(["a"] * N), y), num_examples=N, mesh=mesh)
  other = Mesh(np.asarray(jax.devices()), ("batch",))
  for fn in (lambda: multihost.process_rows(N, other),
             lambda: multihost.global_dataset((x, y), num_examples=N, mesh=other)):
    with pytest.raises(ValueError, match="mesh has no axis 'data'"):
      fn()
  for fn in (lambda: multihost.process_rows(N, mesh=jax.devices()),
             lambda: multihost.replicate(np.ones(2), mesh=jax.devices())):
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
      fn()
  for bad in (0, -3, 2.5):
    with pytest.raises(ValueError, match="num_examples must be an integer >= 1"):
      multihost.global_dataset((x, y), num_examples=bad, mesh=mesh)
  with pytest.raises(TypeError, match="value: leaf 0 must be a number"):
    multihost.broadcast_from_coordinator(["text"])
  # initialize refuses before starting anything.
  with pytest.raises(ValueError, match="coordinator_address must be a 'host:port'"):
    multihost.initialize("localhost", num_processes=2, process_id=0)
  with pytest.raises(ValueError, match="num_processes must be an integer >= 1"):
    multihost.initialize("127.0.0.1:1234", num_processes=0, process_id=0)
  with pytest.raises(ValueError, match="process_id must be in \\[0, num_processes=2\\)"):
    multihost.initialize("127.0.0.1:1234", num_processes=2, process_id=2)
  with pytest.raises(TypeError, match="process_id must be an integer"):
    multihost.initialize("127.0.0.1:1234", num_processes=2, process_id=True)
  assert not jax.distributed.is_initialized()


def test_launcher_stops_every_worker_on_failure_and_timeout(tmp_path):
  script = tmp_path / "worker.py"
  script.write_text(
      "import sys, time\n"
      "pid = int(sys.argv[sys.argv.index('--process-id') + 1])\n"
      "mode = sys.argv[-1]\n"
      "if mode == 'fail' and pid == 1:\n"
      "  sys.exit('worker 1 gives up')\n"
      "time.sleep(60)\n")
  start = time.monotonic()
  with pytest.raises(_multihost_launch.LaunchError,
                     match="(?s)a worker failed.*worker 0 \\(exit status -9\\).*worker 1 "
                           "\\(exit status 1\\).*worker 1 gives up"):
    _multihost_launch.launch(script, num_processes=2, args=["fail"], timeout=60)
  with pytest.raises(_multihost_launch.LaunchError, match="ran past its 1 s limit"):
    _multihost_launch.launch(script, num_processes=2, args=["hang"], timeout=1)
  assert time.monotonic() - start < 30  # neither launch waited for the sleeping workers
