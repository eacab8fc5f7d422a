"""Exceptions raised by jaxdp."""


class BudgetExceededError(RuntimeError):
  """Raised when spending would take a privacy budget past its limit.

  Nothing is spent (and no answer is released) when this is raised.
  """


class ArgumentTypeError(TypeError, ValueError):
  """An argument of the wrong type (a bool, str or None where a number is expected).

  Raised by :mod:`jaxdp._validation`; the message names the argument. It
  subclasses both ``TypeError`` (what it is) and ``ValueError`` (what jaxdp
  raised for these inputs before, and what ``except ValueError`` callers
  expect), the pattern of ``numpy.exceptions.AxisError``.
  """
