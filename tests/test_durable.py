"""Tests of the process-safe JSON state files."""

import multiprocessing as mp
import os

import pytest

from jaxdp import _durable


def _increment_many(path: str, times: int) -> None:
  for _ in range(times):
    with _durable.locked_update(path) as box:
      state = box.value or {"count": 0}
      state["count"] += 1
      box.value = state


def test_concurrent_processes_never_lose_an_increment(tmp_path):
  path = str(tmp_path / "state.json")
  ctx = mp.get_context("spawn")
  procs = [ctx.Process(target=_increment_many, args=(path, 50)) for _ in range(3)]
  for p in procs:
    p.start()
  for p in procs:
    p.join(60)
    assert p.exitcode == 0
  assert _durable.read_json(path) == {"count": 150}


def test_failed_update_writes_nothing(tmp_path):
  path = str(tmp_path / "state.json")
  _durable.write_json_atomic(path, {"count": 3})
  with pytest.raises(RuntimeError):
    with _durable.locked_update(path) as box:
      box.value["count"] = 99
      raise RuntimeError("refused")
  assert _durable.read_json(path) == {"count": 3}


def test_atomic_write_leaves_no_temporary_files(tmp_path):
  path = tmp_path / "state.json"
  _durable.write_json_atomic(path, {"a": 1})
  _durable.write_json_atomic(path, {"a": 2})
  assert _durable.read_json(path) == {"a": 2}
  assert sorted(os.listdir(tmp_path)) == ["state.json"]


def test_missing_file_reads_as_none(tmp_path):
  assert _durable.read_json(tmp_path / "absent.json") is None


def test_new_files_follow_the_umask_and_existing_files_keep_their_mode(tmp_path):
  path = tmp_path / "results.json"
  old = os.umask(0o022)
  try:
    _durable.write_json_atomic(path, {"a": 1})
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)  # not mkstemp's 0o600
    os.chmod(path, 0o640)
    _durable.write_json_atomic(path, {"a": 2})
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o640)
  finally:
    os.umask(old)


def test_lock_sidecar_is_hidden(tmp_path):
  path = tmp_path / "budget.json"
  with _durable.locked_update(path) as box:
    box.value = {"spent": 1}
  assert [n for n in os.listdir(tmp_path) if not n.startswith(".")] == ["budget.json"]
  assert os.listdir(tmp_path).count(".budget.json.lock") == 1
