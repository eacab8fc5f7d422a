"""Every registered release point x every generic check (tests/privacy/README.md).

``reg.load_all()`` imports every ``entries_*.py``; each (entry, check) pair is
one test, ordered entry by entry so that the releases one check computes are
reused by the next (``conformance_checks`` caches them per entry). A check
that does not apply to an entry is skipped only when the entry lists it in
``skip`` with a reason; a missing callable or spec the check needs is a
failure (the message says which field to give). The stronger audit
(``AuditSpec.slow_trials``) and the full-power noise check of host-side releases
run under ``@pytest.mark.slow``.
"""

from __future__ import annotations

import pytest

import conformance_checks as cc
import conformance_registry as reg

REGISTRY = reg.load_all()
NAMES = sorted(REGISTRY)
# Entry by entry (so the per-entry caches are reused), except the fresh checks of keyless
# entries (``fresh`` given), which come last (tests/privacy/conftest.py moves them to the
# end of the privacy suite): their two subprocesses start at the block of the last keyless
# entry (_STARTER) and run while the remaining tests do (see fresh_process_digests). A
# keyed entry's fresh check (``fresh`` None: no subprocess) runs with its entry's other
# checks, where it reads the entry's cached releases instead of recomputing them after the
# cache has moved on.
_KEYLESS = {name for name in NAMES if REGISTRY[name].fresh is not None}
_PAIRS = ([(name, check) for name in NAMES for check in ("schema",) + cc.CHECKS
           if check != "fresh" or name not in _KEYLESS]
          + [(name, "fresh") for name in NAMES if name in _KEYLESS])
_STARTER = max((n for n in _KEYLESS if "fresh" not in cc.canonical_skip(REGISTRY[n])),
               default=None)
_STARTING: set = set()
CASES = [pytest.param(n, c, marks=pytest.mark.slow) if (n, c) in cc.SLOW_CASES else (n, c)
         for n, c in _PAIRS]


def _entry_or_skip(name: str, check: str) -> reg.ReleasePoint:
  entry = REGISTRY[name]
  skip = cc.canonical_skip(entry)
  if check in skip:
    pytest.skip(f"{check} does not apply: {skip[check]}")
  if check == "audit_slow" and "audit" in skip:
    pytest.skip(f"audit does not apply: {skip['audit']}")
  return entry


@pytest.fixture(scope="session")
def fresh_process_digests(request):
  """``fresh(D)`` of every selected keyless entry in two separate processes.

  Started by the first test of the last keyless entry's block (or else by the first
  keyless fresh test): by then this run's other checks have compiled the keyless entries'
  releases into the run's shared compilation cache (tests/conftest.py; the worker that
  starts the processes first compiles the keyless calls), which the two processes read
  instead of compiling every keyless release again, each. They run while the rest of the
  suite does; the keyless fresh tests, last, collect their digests.
  """
  selected = {item.callspec.params.get("name") for item in request.session.items
              if getattr(item, "callspec", None) and item.callspec.params.get("check") == "fresh"}
  names = [n for n in NAMES if n in selected and REGISTRY[n].fresh is not None
           and "fresh" not in cc.canonical_skip(REGISTRY[n])]
  if not names:
    yield None
    return

  def precompile():
    # Compile the keyless calls here first: the two processes then read them from the run's
    # compilation cache instead of both compiling them (check_fresh makes these calls in
    # this process anyway). An entry whose call raises is reported by its fresh check.
    # Started by _STARTER's block: only _STARTER, the one keyless entry whose checks have
    # not run yet (each keyless entry's releases are the programs of its keyless call,
    # compiled into the run's cache by the worker that checked it: no worker compiles
    # them a second time).
    for n in ([m for m in names if m in _STARTING] or names):
      entry = REGISTRY[n]
      try:
        entry.fresh(cc.pairs_of(entry)[0][0])
      except Exception:  # pylint: disable=broad-except
        pass

  workerinput = getattr(request.config, "workerinput", None)
  if workerinput is None:
    precompile()
    procs = cc.FreshProcesses(names)
  else:  # pytest-xdist: one pair of processes for the whole run, shared by the workers; the
    # worker that starts them precompiles (another one compiles only the entries it checks)
    procs = cc.SharedFreshProcesses(names, run_id=workerinput.get("testrunuid", "run"),
                                    before_start=precompile)
  yield procs
  procs.kill()


@pytest.mark.parametrize("name,check", CASES, ids=[f"{n}-{c}" for n, c in _PAIRS])
def test_check(name, check, request):
  if check == "schema":
    cc.validate_entry(REGISTRY[name])
    return
  if name == _STARTER:  # start the fresh check's processes now (collected at the end)
    _STARTING.add(name)
    request.getfixturevalue("fresh_process_digests")
  entry = _entry_or_skip(name, check)
  if check == "noise" and name in cc.SLOW_NOISE:
    pytest.skip("host-side release with one noise coordinate per call: the noise check runs "
                "under slow (test_noise_slow) and in test_power")
  if check == "fresh":
    procs = request.getfixturevalue("fresh_process_digests") if entry.fresh is not None else None
    digests = procs.result() if procs is not None else None
    cc.check_fresh(entry, process_digests=digests)
    return
  note = cc.CHECK_FUNCTIONS[check](entry)
  if note:  # support "continuous" (documented caveat) or an under-powered host-side noise test
    print(f"{name} [{check}]: {note}")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_audit_slow(name):
  cc.check_audit(_entry_or_skip(name, "audit_slow"), slow=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_noise_slow(name):
  """The noise check at full power (miss <= 1e-6) also for host-side (looped) releases.

  The always-on ``noise`` check draws fewer host-side releases (miss <= 1e-3, the
  same 1e-6 false-alarm rate); vmapped releases have full power in both.
  """
  entry = _entry_or_skip(name, "noise")
  if entry.noise is not None:
    cc.output_at(entry, 0, 0, 0)  # decides vmappability (cached)
    if cc.is_vmappable(entry):
      pytest.skip("vmapped release: the always-on noise check already has full power")
  note = cc.check_noise_scale(entry, slow=True)
  if note:
    print(f"{name} [noise, slow]: {note}")


def test_registry_is_not_empty():
  assert REGISTRY, "no release point registered: tests/privacy/entries_*.py define them."
