"""PrivacyBudget: read-only spent/remaining properties, no relative slack, durable path= budgets."""

import json
import math
import multiprocessing
import os

import pytest

from jaxdp.accounting import BudgetExceededError, PrivacyAccountant, PrivacyBudget, dpsgd_accounting, events

REL = "replace_one"


def _pure(eps):
  return events.PureDpEvent(eps, neighbouring=REL)


# -- properties ---------------------------------------------------------------------------------------


def test_spent_and_remaining_are_properties():
  budget = PrivacyBudget(epsilon=1.0)
  budget.spend(_pure(0.25))
  assert f"{budget.spent_epsilon:.2f}" == "0.25"  # a method here raised TypeError
  assert f"{budget.remaining_epsilon:.2f}" == "0.75"
  with pytest.raises(AttributeError):
    budget.spent_epsilon = 0.0


# -- slack ------------------------------------------------------------------------------------------


def test_no_relative_slack_past_the_limit():
  """The old 1e-9 relative slack let a spend of 1 + 5e-10 pass a budget of 1."""
  budget = PrivacyBudget(epsilon=1.0)
  with pytest.raises(BudgetExceededError):
    budget.spend(_pure(1.0 + 5e-10))
  big = PrivacyBudget(epsilon=1000.0)
  big.spend(_pure(999.0))
  with pytest.raises(BudgetExceededError):
    big.spend(_pure(1.0 + 1e-7))  # 1e-10 relative to the budget
  with pytest.raises(BudgetExceededError):
    budget.spend(_pure(math.nextafter(math.nextafter(math.nextafter(1.0, 2), 2), 2)))
  budget.spend(_pure(1.0))  # exactly the limit is allowed


@pytest.mark.parametrize("eps,b", [(1.0, 3), (1.0, 7), (0.3, 10), (2.5, 49), (1.0, 1000)])
def test_rounding_of_b_times_eps_over_b_is_absorbed(eps, b):
  budget = PrivacyBudget(epsilon=eps)
  budget.spend(_pure(eps / b), count=b)
  one_by_one = PrivacyBudget(epsilon=eps)
  for _ in range(min(b, 49)):
    one_by_one.spend(_pure(eps / b))
  with pytest.raises(BudgetExceededError):
    budget.spend(_pure(eps / b))


def test_rounding_slack_is_a_few_ulps():
  assert PrivacyBudget.ROUNDING_ULPS <= 4
  budget = PrivacyBudget(epsilon=1.0)
  assert budget._limit() - 1.0 <= 4 * 2.0**-52  # pylint: disable=protected-access


# -- path= ------------------------------------------------------------------------------------------


def test_path_persists_every_spend_and_resumes(tmp_path):
  path = tmp_path / "budget.json"
  budget = PrivacyBudget(epsilon=1.0, path=path)
  assert os.path.exists(path)
  budget.spend(_pure(0.3))
  on_disk = json.loads(path.read_text())
  assert on_disk["accountant"]["neighbouring"] == REL
  # a new object (e.g. after a crash and restart) resumes the spent budget
  resumed = PrivacyBudget(epsilon=1.0, path=path)
  assert resumed.spent_epsilon == pytest.approx(0.3)
  assert resumed.neighbouring == REL
  with pytest.raises(BudgetExceededError):
    resumed.spend(_pure(0.8))
  resumed.spend(_pure(0.7))
  assert budget.spent_epsilon == pytest.approx(1.0)  # the file is the state of record


def test_two_objects_on_one_path_cannot_overspend(tmp_path):
  path = tmp_path / "budget.json"
  first = PrivacyBudget(epsilon=1.0, path=path)
  second = PrivacyBudget(epsilon=1.0, path=path)
  first.spend(_pure(0.6))
  assert not second.can_spend(_pure(0.6))
  with pytest.raises(BudgetExceededError):
    second.spend(_pure(0.6))
  second.spend(_pure(0.4))
  assert first.spent_epsilon == pytest.approx(1.0)


def test_resuming_with_different_parameters_is_refused(tmp_path):
  path = tmp_path / "budget.json"
  PrivacyBudget(epsilon=1.0, delta=1e-5, path=path).spend(_pure(0.1))
  for kwargs, name in [({"epsilon": 2.0, "delta": 1e-5}, "epsilon"),
                       ({"epsilon": 1.0, "delta": 1e-6}, "delta"),
                       ({"epsilon": 1.0, "delta": 1e-5, "method": "rdp"}, "method"),
                       ({"epsilon": 1.0, "delta": 1e-5, "neighbouring": "add_remove"},
                        "neighbouring"),
                       ({"epsilon": 1.0, "delta": 1e-5, "unit": "party"}, "unit")]:
    with pytest.raises(ValueError, match=name):
      PrivacyBudget(path=path, **kwargs)
  resumed = PrivacyBudget(epsilon=1.0, delta=1e-5, neighbouring=REL, path=path)
  assert resumed.spent_epsilon == pytest.approx(0.1, rel=1e-3)  # PLD at delta = 1e-5
  other = PrivacyAccountant()
  other.spend(_pure(0.2))
  with pytest.raises(ValueError, match="already holds"):
    PrivacyBudget(epsilon=1.0, delta=1e-5, path=path, accountant=other)


def test_declared_relation_persists(tmp_path):
  path = tmp_path / "b.json"
  PrivacyBudget(epsilon=1.0, delta=1e-5, neighbouring="add_remove", path=path)
  resumed = PrivacyBudget(epsilon=1.0, delta=1e-5, path=path)
  assert resumed.neighbouring == "add_remove"
  with pytest.raises(ValueError, match="replace_one"):
    resumed.spend(_pure(0.1))
  resumed.spend(dpsgd_accounting.dpsgd_event(5.0, 0.01, 10))


def test_every_spend_is_fsynced_and_atomic(tmp_path, monkeypatch):
  path = tmp_path / "budget.json"
  budget = PrivacyBudget(epsilon=1.0, path=path)
  synced, replaced = [], []
  real_fsync, real_replace = os.fsync, os.replace
  monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
  monkeypatch.setattr(os, "replace", lambda a, b: (replaced.append(b), real_replace(a, b))[1])
  budget.spend(_pure(0.2))
  assert synced and replaced == [str(path)]
  # a refused spend writes nothing
  synced.clear()
  replaced.clear()
  with pytest.raises(BudgetExceededError):
    budget.spend(_pure(0.9))
  assert replaced == []


def test_failed_write_spends_nothing(tmp_path, monkeypatch):
  """If the durable write fails, the spend raises and neither memory nor disk records it."""
  path = tmp_path / "budget.json"
  budget = PrivacyBudget(epsilon=1.0, path=path)

  def boom(*args):
    raise OSError("disk full")

  monkeypatch.setattr(os, "replace", boom)
  with pytest.raises(OSError, match="disk full"):
    budget.spend(_pure(0.5))
  monkeypatch.undo()
  assert budget.spent_epsilon == 0.0
  assert PrivacyBudget(epsilon=1.0, path=path).spent_epsilon == 0.0


def test_deleted_file_is_not_silently_reset(tmp_path):
  path = tmp_path / "budget.json"
  budget = PrivacyBudget(epsilon=1.0, path=path)
  budget.spend(_pure(0.5))
  os.remove(path)
  with pytest.raises(FileNotFoundError):
    budget.spend(_pure(0.1))


def test_copies_of_a_persistent_budget_share_the_file(tmp_path):
  import copy
  import pickle
  budget = PrivacyBudget(epsilon=1.0, path=tmp_path / "b.json")
  budget.spend(_pure(0.4))
  for clone in (copy.deepcopy(budget), pickle.loads(pickle.dumps(budget))):
    with pytest.raises(BudgetExceededError):
      clone.spend(_pure(0.7))
  copy.deepcopy(budget).spend(_pure(0.5))
  assert budget.spent_epsilon == pytest.approx(0.9)


def _spend_worker(path, attempts, barrier, results):
  budget = PrivacyBudget(epsilon=1.0, path=path)
  barrier.wait()
  ok = 0
  for _ in range(attempts):
    try:
      budget.spend(events.PureDpEvent(0.1, neighbouring="replace_one"))
      ok += 1
    except BudgetExceededError:
      pass
  results.put(ok)


def _thread_race(path, n_objects, attempts):
  import threading
  budgets = [PrivacyBudget(epsilon=1.0, path=path) for _ in range(n_objects)]
  barrier = threading.Barrier(n_objects)
  counts = [0] * n_objects

  def run(i):
    barrier.wait()
    for _ in range(attempts):
      try:
        budgets[i].spend(_pure(0.1))
        counts[i] += 1
      except BudgetExceededError:
        pass

  threads = [threading.Thread(target=run, args=(i,)) for i in range(n_objects)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return counts


def test_independent_objects_racing_on_one_file_cannot_overspend(tmp_path):
  """Always-on variant of the multi-process test: separate objects (own locks), one file."""
  path = str(tmp_path / "shared.json")
  counts = _thread_race(path, 3, 6)
  assert sum(counts) == 10, counts
  assert PrivacyBudget(epsilon=1.0, path=path).accountant.ledger[0][1] == 10


@pytest.mark.slow
def test_two_processes_cannot_overspend_one_file(tmp_path):
  """Two spawned processes each try 8 spends of 0.1 on a shared budget of 1.0: exactly 10 succeed."""
  path = str(tmp_path / "shared.json")
  PrivacyBudget(epsilon=1.0, path=path)
  ctx = multiprocessing.get_context("spawn")
  barrier, results = ctx.Barrier(2), ctx.Queue()
  procs = [ctx.Process(target=_spend_worker, args=(path, 8, barrier, results)) for _ in range(2)]
  for p in procs:
    p.start()
  counts = [results.get(timeout=120) for _ in procs]
  for p in procs:
    p.join(timeout=60)
    assert p.exitcode == 0
  assert sum(counts) == 10, counts
  final = PrivacyBudget(epsilon=1.0, path=path)
  assert final.spent_epsilon <= 1.0
  assert final.accountant.ledger[0][1] == 10
