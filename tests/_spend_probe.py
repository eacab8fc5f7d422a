"""An accountant stand-in that records what a release point would spend and stops the call.

Used to read the event and count a call charges without running the release (``charged``).
``tests/`` is on ``sys.path`` (see ``_repo_modules``).
"""

import pytest

from jaxdp.accounting import PrivacyAccountant


class StopAtSpend(Exception):
  """Raised by :class:`SpendRecorder` at the spend: nothing after it runs."""


class SpendRecorder:
  """An accountant that records the spend and stops the call (nothing is computed after)."""

  def spend(self, event, count=1):
    self.event, self.count = event, count
    raise StopAtSpend


def charged(fn, *args, **kw):
  """``(PrivacyAccountant holding what fn spends, count)``, without running the release."""
  rec = SpendRecorder()
  with pytest.raises(StopAtSpend):
    fn(*args, accountant=rec, **kw)
  acc = PrivacyAccountant()
  acc.spend(rec.event, count=rec.count)
  return acc, rec.count
