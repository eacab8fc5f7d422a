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


class BudgetExhausted(BaseException):
  """A privacy budget refused a fit made by scikit-learn model selection: the search is stopped.

  Raised instead of :class:`BudgetExceededError` when the refusal happens inside
  ``sklearn.model_selection`` (``GridSearchCV``, ``RandomizedSearchCV``,
  ``cross_validate``, ``cross_val_score``, ...). Those catch every ``Exception``
  a fit raises unless ``error_score="raise"`` (the default is NaN): the search
  would go on and pick a "best" candidate among the fits the budget could
  afford, with only a ``FitFailedWarning``. Like ``KeyboardInterrupt``, a
  ``BaseException`` is not caught there, so the search ends. The refused fit
  spent nothing; the fits before it were spent. The original
  :class:`BudgetExceededError` is ``error`` (and ``__cause__``). Catch it with
  ``except BudgetExhausted`` (``except Exception`` does not catch it).
  """

  def __init__(self, message: str, error: BaseException | None = None):
    super().__init__(message)
    self.error = error
