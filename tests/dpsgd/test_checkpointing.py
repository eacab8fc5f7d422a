"""Tests of RunCheckpointer: Orbax round trips, the durable run ledger, refusals, SIGKILL."""

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.dpsgd import checkpointing
from jaxdp.dpsgd.checkpointing import RunCheckpointer

_PLAN = {"N": 1000, "q": 0.01, "sigma": 1.1, "S": 1.0, "T": 50, "P": 16, "key": [0, 7],
         "params": [["w", [3, 4], "float32"]]}


def _state(seed=0):
  """A training state with typed keys, optax state and host leaves (a fresh copy per call)."""
  return jax.tree.map(lambda x: np.array(x) if isinstance(x, np.ndarray) else x, _base_state(seed))


@functools.lru_cache(maxsize=None)
def _base_state(seed):
  rng = np.random.default_rng(seed)
  params = {"w": jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32)),
            "b": jnp.asarray(np.arange(4, dtype=np.int32) + seed)}
  opt_state = optax.adam(1e-3).init(params)
  opt_state = jax.tree.map(
      lambda a: jnp.asarray(np.asarray(a) + 0.5) if a.dtype == jnp.float32 else a, opt_state)
  key_data = rng.integers(0, 2**32, size=(3, 4), dtype=np.uint32)
  return {"params": params, "opt": opt_state,
          "noise_key": jax.random.key(seed + 1),
          "batch_keys": jax.random.wrap_key_data(key_data, impl="rbg"),
          "host": np.arange(5, dtype=np.int64) * (seed + 1), "t": 3 + seed,
          "np_scalar": np.int32(7 + seed), "lr": 0.25 * (seed + 1)}


def _assert_identical(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert type(g) is type(w)
    if isinstance(w, jax.Array) and jax.dtypes.issubdtype(w.dtype, jax.dtypes.prng_key):
      assert jax.dtypes.issubdtype(g.dtype, jax.dtypes.prng_key)
      assert jax.random.key_impl(g) == jax.random.key_impl(w)
      g, w = jax.random.key_data(g), jax.random.key_data(w)
    if isinstance(w, (jax.Array, np.ndarray)):
      assert g.dtype == w.dtype and g.shape == w.shape
      np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    else:
      assert g == w


def _listing(directory):
  out = {}
  for root, dirs, files in os.walk(directory):
    out.update({os.path.relpath(os.path.join(root, d), directory): None for d in dirs})
    for f in files:
      p = os.path.join(root, f)
      with open(p, "rb") as fh:
        out[os.path.relpath(p, directory)] = fh.read()
  return out


def test_round_trip_latest_and_older_step(tmp_path):
  with RunCheckpointer(tmp_path / "run", _PLAN, max_to_keep=2) as ckpt:
    assert ckpt.latest_step() is None and ckpt.checkpointed_through() == 0
    with pytest.raises(FileNotFoundError):
      ckpt.restore(_state())
    ckpt.save(1, _state(1))
    state = _state(2)
    ckpt.save(2, state)  # async; the ledger is updated once finalised
    state["host"][:] = -1  # the caller may change its arrays at once
    assert ckpt.latest_step() == 2 and ckpt.checkpointed_through() == 2
    step, got = ckpt.restore(_state())
    assert step == 2
    _assert_identical(got, _state(2))
    step, got = ckpt.restore(_state(), step=1)
    assert step == 1
    _assert_identical(got, _state(1))
    ckpt.save(3, _state(3), wait=True)
    assert ckpt.all_steps() == [2, 3]  # max_to_keep=2 rotated step 1 away
    with pytest.raises(FileNotFoundError, match="step 1"):
      ckpt.restore(_state(), step=1)
    with pytest.raises(ValueError, match="step must exceed"):
      ckpt.save(3, _state(3))
  # A new checkpointer on the same directory sees the same checkpoints.
  with RunCheckpointer(tmp_path / "run", dict(_PLAN)) as again:
    assert again.latest_step() == 3 and again.checkpointed_through() == 3
    step, got = again.restore(_state())
    assert step == 3
    _assert_identical(got, _state(3))


def test_restore_refuses_a_template_key_of_another_impl(tmp_path):
  with RunCheckpointer(tmp_path, _PLAN) as ckpt:
    ckpt.save(0, {"k": jax.random.key(1, impl="rbg")}, wait=True)
    with pytest.raises(ValueError, match="unsafe_rbg key"):
      ckpt.restore({"k": jax.random.key(1, impl="unsafe_rbg")})


def test_fingerprint_mismatch_refused_before_any_write(tmp_path):
  run = tmp_path / "run"
  with RunCheckpointer(run, _PLAN) as ckpt:
    ckpt.record_paid(4)
    ckpt.save(4, {"x": np.ones(3, np.float32)}, wait=True)
  with open(run / "ledger.json") as f:
    ledger = json.load(f)
  assert ledger["plan_fingerprint"] == json.loads(json.dumps(_PLAN))
  before = _listing(run)
  other = dict(_PLAN, sigma=2.0, T=60)
  with pytest.raises(ValueError, match=r"belongs to another plan.*\['T', 'sigma'\]"):
    RunCheckpointer(run, other)
  with pytest.raises(ValueError, match=r"\['extra'\]"):
    RunCheckpointer(run, dict(_PLAN, extra=1))
  assert _listing(run) == before
  # A fresh directory is not touched by a refused constructor either.
  with pytest.raises(TypeError, match="plan_fingerprint"):
    RunCheckpointer(tmp_path / "fresh", [("N", 1)])
  assert not (tmp_path / "fresh").exists()


def test_record_paid_monotone_and_durable(tmp_path):
  with RunCheckpointer(tmp_path, _PLAN) as ckpt:
    assert ckpt.steps_paid() == 0
    ckpt.record_paid(3)
    ckpt.record_paid(3)
    ckpt.record_paid(10)
    with pytest.raises(ValueError, match=r"total must be >= the steps already paid \(10\)"):
      ckpt.record_paid(9)
    assert ckpt.steps_paid() == 10
  with RunCheckpointer(tmp_path, _PLAN) as again:
    assert again.steps_paid() == 10
    assert again.checkpointed_through() == 0


def test_checkpointed_through_survives_removed_step_folder(tmp_path):
  with RunCheckpointer(tmp_path, _PLAN, max_to_keep=3) as ckpt:
    for t in (2, 5):
      ckpt.save(t, {"x": np.full(3, t, np.float32)})
  shutil.rmtree(tmp_path / "orbax" / "5")
  with RunCheckpointer(tmp_path, _PLAN, max_to_keep=3) as again:
    assert again.latest_step() == 2
    assert again.checkpointed_through() == 5
    step, got = again.restore({"x": np.zeros(3, np.float32)})
    assert step == 2
    np.testing.assert_array_equal(got["x"], np.full(3, 2, np.float32))


def test_bad_arguments_named(tmp_path):
  with pytest.raises(ValueError, match="max_to_keep"):
    RunCheckpointer(tmp_path, _PLAN, max_to_keep=0)
  with pytest.raises(TypeError, match="max_to_keep"):
    RunCheckpointer(tmp_path, _PLAN, max_to_keep=1.5)
  with pytest.raises(TypeError, match="plan_fingerprint"):
    RunCheckpointer(tmp_path, None)
  with pytest.raises(TypeError, match="plan_fingerprint"):
    RunCheckpointer(tmp_path, {"key": jax.random.key(0)})
  with pytest.raises(TypeError, match="plan_fingerprint"):
    RunCheckpointer(tmp_path, {"sigma": float("nan")})
  with pytest.raises(TypeError, match="directory"):
    RunCheckpointer(3, _PLAN)
  assert os.listdir(tmp_path) == []
  with RunCheckpointer(tmp_path, _PLAN) as ckpt:
    with pytest.raises(ValueError, match="step"):
      ckpt.save(-1, {"x": np.ones(2)})
    with pytest.raises(TypeError, match="step"):
      ckpt.save(1.0, {"x": np.ones(2)})
    with pytest.raises(ValueError, match="step"):
      ckpt.restore({"x": np.ones(2)}, step=-2)
    with pytest.raises(ValueError, match="total"):
      ckpt.record_paid(-1)
    with pytest.raises(TypeError, match="total"):
      ckpt.record_paid(True)
    assert ckpt.latest_step() is None and ckpt.steps_paid() == 0
  with pytest.raises(RuntimeError, match="closed"):
    ckpt.save(1, {"x": np.ones(2)})


_CHILD = textwrap.dedent("""
  import importlib.util
  import os
  import signal
  import sys
  import numpy as np
  # The module alone (not the jaxdp.training package): keeps the child's start-up short.
  spec = importlib.util.spec_from_file_location("checkpointing", sys.argv[2])
  checkpointing = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(checkpointing)
  ckpt = checkpointing.RunCheckpointer(sys.argv[1], {"run": "sigkill"}, max_to_keep=2)
  ckpt.record_paid(1)
  ckpt.save(1, {"x": np.full(64, 1, np.float32), "t": 1}, wait=True)
  print("finalised 1", flush=True)
  ckpt.record_paid(2)
  # 8 MB: Orbax needs far longer to write and finalise it than SIGKILL takes to arrive.
  ckpt.save(2, {"x": np.full(2_000_000, 2, np.float32), "t": 2})
  os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.slow  # always on: the end-to-end SIGKILL test (test_resume_after_sigkill.py)
def test_sigkill_mid_save_leaves_previous_checkpoint_restorable(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  child = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), checkpointing.__file__],
                         capture_output=True, env=env, text=True, timeout=120)
  assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
  assert child.stdout == "finalised 1\n"
  with RunCheckpointer(tmp_path, {"run": "sigkill"}, max_to_keep=2) as ckpt:
    assert ckpt.latest_step() == 1  # the interrupted save of step 2 is not a checkpoint
    assert ckpt.steps_paid() == 2  # step 2 was paid before its save began
    assert ckpt.checkpointed_through() == 1
    step, got = ckpt.restore({"x": np.zeros(64, np.float32), "t": 0})
    assert step == 1 and got["t"] == 1
    np.testing.assert_array_equal(got["x"], np.full(64, 1, np.float32))
    ckpt.save(2, {"x": np.zeros(64, np.float32), "t": 2}, wait=True)
    assert ckpt.latest_step() == 2 and ckpt.checkpointed_through() == 2
  assert sorted(os.listdir(tmp_path / "orbax")) == ["1", "2"]  # no temporary folder left


def test_ledger_catches_up_with_a_checkpoint_finalised_before_a_crash(tmp_path):
  with RunCheckpointer(tmp_path, _PLAN) as ckpt:
    ckpt.save(1, {"x": np.ones(2, np.float32)}, wait=True)
    ckpt.save(2, {"x": np.ones(2, np.float32)}, wait=True)
  # A crash after Orbax finalised step 2 but before the ledger recorded it.
  with open(tmp_path / "ledger.json") as f:
    ledger = json.load(f)
  ledger["checkpointed_through"] = 1
  with open(tmp_path / "ledger.json", "w") as f:
    json.dump(ledger, f)
  with RunCheckpointer(tmp_path, _PLAN) as again:
    assert again.checkpointed_through() == 2
