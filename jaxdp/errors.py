"""Exceptions raised by jaxdp."""


class BudgetExceededError(RuntimeError):
  """Raised when spending would take a privacy budget past its limit.

  Nothing is spent (and no answer is released) when this is raised.
  """
