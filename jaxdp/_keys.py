"""Where the noise keys of stateful objects come from: fresh OS entropy unless told otherwise.

Rule (library-wide; scikit-learn's ``random_state=None`` semantics). An object
that draws noise (an estimator's ``fit``, a predictor's answers) and is given no
explicit seed or key draws its key from the operating system's entropy
(:func:`secrets.randbits`, 64 bits) *at every fit*: two instances, a refit on
updated data, or two processes never add the same noise, so the difference of
two releases cannot cancel the noise and expose the change in the data.

An explicit ``seed`` (an ``int``) or ``key`` (a ``jax.random`` key) is the
user's promise not to reuse it across releases of overlapping data. With it,
fit ``i`` of an instance uses ``fold_in(key(seed), i)``: the same explicit seed
and the same sequence of calls give the same results (reproducible
experiments), and the fits of one instance never share a key.

scikit-learn model selection (``GridSearchCV``, ``cross_validate``, ...) fits a
fresh ``clone`` per fold and candidate, and a clone's fit counter starts at 0:
with an explicit seed every one of those fits uses the SAME key
``fold_in(key(seed), 0)`` on overlapping data. :func:`fit_key` warns then
(:func:`in_model_selection` reads the call stack); keys are never derived from
the data, nor changed silently. The same detector lets a budget refusal stop
such a search (:func:`budget_refusal`) and an estimator holding an accountant
refuse worker processes with its own message (:func:`refuse_worker_processes`).
"""

from __future__ import annotations

import numbers
import os
import secrets
import sys
import warnings
from typing import Any

import jax
import numpy as np

from jaxdp import _validation


def fresh_key() -> jax.Array:
  """A typed ``jax.random`` key from 64 bits of OS entropy (never the same twice)."""
  words = np.array([secrets.randbits(32), secrets.randbits(32)], dtype=np.uint32)
  return jax.random.wrap_key_data(words)


def check_seed(seed: Any, name: str = "seed") -> Any:
  """``None``, a Python/numpy integer, or a ``jax.random`` key; anything else raises.

  Floats (``1.5``, and also ``2.0``), bools and strings raise ``ValueError``
  naming ``name``: a silently truncated seed would make two different seeds
  collide.
  """
  if seed is None:
    return None
  if isinstance(seed, (bool, np.bool_)):
    raise ValueError(f"{name} must be None (fresh OS entropy), an integer or a jax.random key; "
                     f"got a bool ({seed!r}).")
  if isinstance(seed, numbers.Integral):
    value = int(seed)
    if not -2**63 <= value < 2**64:
      raise ValueError(f"{name} must fit in 64 bits, got {value}.")
    return value
  if isinstance(seed, (jax.Array, np.ndarray)) and (
      jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key) or seed.dtype == np.uint32):
    return _validation.check_key(seed, name)
  raise ValueError(f"{name} must be None (fresh OS entropy), an integer or a jax.random key; "
                   f"got {type(seed).__name__} {seed!r}.")


def key_from_seed(seed: Any, name: str = "seed") -> jax.Array:
  """The key of an explicit seed (int or key), or a fresh OS-entropy key for ``None``."""
  seed = check_seed(seed, name)
  if seed is None:
    return fresh_key()
  if isinstance(seed, int):
    # Two 32-bit words: every 64-bit seed is a distinct key, negatives included.
    value = seed % 2**64
    words = np.array([value >> 32, value & 0xFFFFFFFF], dtype=np.uint32)
    return jax.random.wrap_key_data(words)
  if jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
    return seed
  return jax.random.wrap_key_data(seed)


def fit_key(seed: Any, counter: int, name: str = "seed") -> jax.Array:
  """The key of fit number ``counter`` of an object built with ``seed``.

  ``seed=None``: a fresh OS-entropy key (the counter is not needed: every call is
  fresh). Otherwise ``fold_in(key_from_seed(seed), counter)``.
  """
  seed = check_seed(seed, name)
  if seed is None:
    return fresh_key()
  if in_model_selection():
    warnings.warn(
        f"{name}={seed!r} is set on an estimator fitted by scikit-learn model selection "
        "(GridSearchCV, cross_validate, cross_val_score, ...): each fold and candidate is "
        f"fitted on a fresh clone whose fit counter starts at 0, so every such fit adds the SAME "
        f"noise (key fold_in(key({name}), 0)) to overlapping data, and the events charged for "
        f"them do not compose. Leave {name}=None (fresh OS entropy per fit), or tune with "
        f"jaxdp.tuning.PrivateSearchCV (its seed gives every run its own key).",
        UserWarning, stacklevel=3)
  return jax.random.fold_in(key_from_seed(seed, name), int(counter))


# -- scikit-learn model-selection context ----------------------------------------------------

_MODEL_SELECTION_DIR = os.path.join("sklearn", "model_selection", "")


def in_model_selection() -> bool:
  """True when the caller runs inside ``sklearn.model_selection`` (a search or cross-validation).

  Reads the file names of the frames of the current thread's call stack
  (joblib's threading workers run ``_fit_and_score`` on their own stack, so
  they are seen too); nothing else.
  """
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    if _MODEL_SELECTION_DIR in frame.f_code.co_filename:
      return True
    frame = frame.f_back
  return False


def budget_refusal(error: BaseException) -> BaseException:
  """The exception to raise for a budget's refusal ``error``: itself, or a search stopper.

  Inside scikit-learn model selection a :class:`~jaxdp.errors.BudgetExceededError`
  would be swallowed by ``error_score`` (``_fit_and_score`` catches every
  ``Exception``) and the search would pick a "best" among the affordable fits;
  there it becomes :class:`~jaxdp.errors.BudgetExhausted` (a ``BaseException``),
  with ``error`` as its cause, so the search ends. Elsewhere ``error`` is
  returned unchanged (``except BudgetExceededError`` keeps working).
  """
  if not in_model_selection():
    return error
  from jaxdp.errors import BudgetExhausted  # pylint: disable=import-outside-toplevel
  stop = BudgetExhausted(
      f"{error} The scikit-learn model selection that made this fit was stopped (it would "
      "otherwise turn the refusal into a FitFailedWarning and pick a 'best' candidate among "
      "the fits the budget could afford). Catch jaxdp.errors.BudgetExhausted; for a search "
      "that is paid for once, use jaxdp.tuning.PrivateSearchCV.", error)
  stop.__cause__ = error
  return stop


def refuse_worker_processes(estimator: Any) -> None:
  """Raises ``TypeError`` when ``estimator`` holds an accountant and joblib would pickle it.

  Called when scikit-learn clones an estimator (``__sklearn_clone__``). If the
  clone is made for a ``joblib.Parallel`` whose backend runs tasks in other
  processes (``n_jobs > 1`` with loky or multiprocessing), the task would be
  pickled, which an estimator holding an accountant refuses; joblib would only
  say "Could not pickle the task". This raises the reason at the clone, in the
  caller's process, before any fit. Sequential and threading backends share
  the ledger and pass.
  """
  if getattr(estimator, "accountant", None) is None:
    return
  parallel_type = getattr(sys.modules.get("joblib"), "Parallel", None)
  if parallel_type is None:
    return
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    owner = frame.f_locals.get("self")
    if isinstance(owner, parallel_type):
      backend = getattr(owner, "_backend", None)
      if backend is None or getattr(backend, "uses_threads", False) or (
          type(backend).__name__ == "SequentialBackend"):
        return
      raise TypeError(
          f"n_jobs={owner.n_jobs!r}: joblib would run these fits in worker processes "
          f"({type(backend).__name__}), which needs pickling the estimator, but this "
          f"{type(estimator).__name__} holds an accountant: the workers' spends would land in "
          "copies of the ledger and be lost. Use n_jobs=1 (or joblib.parallel_backend("
          "'threading'), which shares the ledger), or jaxdp.tuning.PrivateSearchCV for a "
          "search that is paid for once.")
    frame = frame.f_back
