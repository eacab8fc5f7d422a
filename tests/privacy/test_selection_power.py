"""Power of the conformance suite on ``jaxdp.training.private_argmax`` (entries_selection.py).

The injection row of tests/privacy/test_power.py's ``INJECTIONS`` format, kept
here beside its entry: the selection's ``beta`` times 1.25 (the Gumbel noise of
report-noisy-max 20% smaller, so the release is ``1.25 eps``-DP at most and
about ``e^{3.55}`` on the worst-case pair instead of ``e^{2.86}``) must be
caught by the audit, and the unpatched entry must pass it. Same helpers as
``test_power`` (``run_injection``, ``scaled``, the cleared caches).
"""

from __future__ import annotations

import conformance_checks as cc
import conformance_registry as reg
import entries_selection
from test_power import Injection, run_injection, scaled

ROW = Injection("training", entries_selection.NAME, "jaxdp.training.selection._beta",
                scaled(1.25), "audit",
                "private_argmax beta = 1.25 eps/(2 Delta) (Gumbel noise x 0.8)")


def test_selection_is_registered_and_valid():
  entry = reg.load_all()[ROW.entry]
  cc.validate_entry(entry)
  assert "audit" not in cc.canonical_skip(entry)


cc.pin(ROW.entry)  # the unpatched audit reads test_conformance's releases (see pin)


def test_under_noised_selection_is_caught(monkeypatch):
  entry = reg.load_all()[ROW.entry]
  # The unpatched entry passes (else the row shows nothing); cached releases and their
  # audit statistics, if any, were computed unpatched (run_injection clears them).
  cc.CHECK_FUNCTIONS[ROW.check](entry)
  correct = cc.audit_report(entry)  # the statistics the check just computed
  caught = run_injection(ROW, monkeypatch)  # clears the entry's caches before and after
  assert caught, f"injected defect not caught by {ROW.check} on {ROW.entry}: {ROW.defect}"
  assert correct.epsilon_lower_bound <= entry.epsilon
