"""Resumable private runs: Orbax checkpoints plus a durable run ledger.

A DP-SGD run that is pre-empted (or killed with SIGKILL) must resume without
paying twice for a step and without ever releasing a step it has not paid for.
:class:`RunCheckpointer` keeps two things in one directory::

  <directory>/ledger.json   the run ledger (JSON, public numbers only)
  <directory>/orbax/<step>  the training state after <step> updates (Orbax)

The ledger holds

* ``plan_fingerprint``: the public plan parameters (N, q, sigma, S, T, the
  plan's key data, parameter shapes, ...). It is written on first use; a
  :class:`RunCheckpointer` opened later on the same directory with another
  fingerprint raises ``ValueError`` naming the fields that differ, before it
  writes anything, so one directory never mixes two plans' steps.
* ``steps_paid``: how many steps of this run have been paid for (spent on the
  privacy accountant). :meth:`RunCheckpointer.record_paid` sets it.
* ``checkpointed_through``: the largest step whose state was ever in a
  finalised checkpoint. It only grows, and it stays when checkpoint folders
  are deleted by hand (or rotated away by ``max_to_keep``).

What is durable when
--------------------
* ``record_paid(t)`` returns after ``steps_paid = t`` is on disk: the ledger is
  rewritten atomically (temporary file, ``fsync``, ``os.replace``, ``fsync`` of
  the directory) under an exclusive inter-process lock
  (:mod:`jaxdp._durable`). A crash leaves the old or the new count, never a
  torn file.
* ``save(step, state)`` copies the state off the device and returns; Orbax
  writes it in the background into a temporary folder that it renames to
  ``orbax/<step>`` only when every file is written (finalisation). A crash
  before that leaves the previous checkpoint as the newest one; the temporary
  folder is removed the next time the directory is opened.
  ``checkpointed_through`` is raised to ``step`` only after finalisation: at the
  next ``save``, or at ``latest_step``, ``checkpointed_through``, ``restore``,
  ``close``, or at once with ``save(..., wait=True)``. If the process dies
  between finalisation and the ledger update, opening the directory again
  raises ``checkpointed_through`` to the newest finalised step it finds.

The order to use
----------------
For each step t = 1, 2, ...::

  accountant.spend(step t)      # 1. pay (raises before anything is released)
  ckpt.record_paid(t)           # 2. make the payment durable
  batch = <hand out batch t>    # 3. only now does private data flow
  state = update(state, batch)
  ckpt.save(t, state)           # 4. checkpoint after the update (as often as wanted)

Payment comes before release (spend before release): a step that was released
is always paid and counted in ``steps_paid``, even if the process is killed
right after. A crash can only leave paid steps whose updates were lost
(``steps_paid > checkpointed_through``); it never leaves a released step
unpaid. Prepaying k steps at once (``record_paid(t + k)``) is the same rule.

After a restart the numbers to act on are ``steps_paid()`` (steps already paid
for; never pay them again), ``checkpointed_through()`` (the newest state that
was ever saved) and the step a :meth:`~RunCheckpointer.restore` returns. A
restore of a step older than ``checkpointed_through()`` (the newer folders were
deleted or rotated away) resumes from a state whose successors were already
released once; what that means for the guarantee is decided by the caller,
this class only reports the numbers.

Multi-process (``jax.process_count() > 1``): every process creates the
:class:`RunCheckpointer` and calls ``save``, ``restore`` and ``close`` (Orbax
coordinates the processes and writes each process's shards of a sharded
``jax.Array``); the directory must be on a file system every process sees.
The ledger is written by process 0 only; on the other processes
``record_paid`` checks its argument and writes nothing.

State pytrees may hold ``jax.Array`` and ``numpy`` arrays, NumPy scalars,
Python ints and floats, optax states and typed PRNG key arrays
(``jax.random.key``): Orbax stores a key as its key data together with its
implementation's name, and restores a typed key of that implementation.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import jax
import numpy as np

from jaxdp import _durable, _validation

PyTree = Any

LEDGER_NAME = "ledger.json"
ORBAX_DIR_NAME = "orbax"


def check_arguments(checkpoint_dir: Any, checkpoint_every: Any) -> int | None:
  """Validates ``checkpoint_dir`` / ``checkpoint_every`` of a training call; returns the interval.

  Raised before any work: ``checkpoint_every`` must be a positive int and needs
  ``checkpoint_dir``; ``checkpoint_dir`` must be a path.
  """
  every = None
  if checkpoint_every is not None:
    every = _validation.check_positive_int(checkpoint_every, "checkpoint_every")
    if checkpoint_dir is None:
      raise ValueError("checkpoint_every needs checkpoint_dir.")
  if checkpoint_dir is not None and not isinstance(checkpoint_dir, (str, os.PathLike)):
    raise TypeError(f"checkpoint_dir must be a path, got {type(checkpoint_dir).__name__}.")
  if checkpoint_dir is not None and not os.fspath(checkpoint_dir).strip():
    raise ValueError("checkpoint_dir must name a directory, got an empty path (it would write "
                     "the run's ledger and checkpoints into the current directory).")
  return every


def key_digest(key: jax.Array) -> str:
  """SHA-256 of a key's data: identifies the run's key in a plan fingerprint without storing it."""
  return hashlib.sha256(np.asarray(jax.random.key_data(key)).tobytes()).hexdigest()


def _ocp():
  """Imports Orbax on first use (keeps ``import jaxdp`` light)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  return ocp


def _check_step(step: Any, name: str = "step") -> int:
  if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
    raise TypeError(f"{name} must be an int, got {type(step).__name__}")
  if step < 0:
    raise ValueError(f"{name} must be >= 0, got {int(step)}")
  return int(step)


def _normalise_fingerprint(plan_fingerprint: Any) -> dict:
  """The fingerprint as it reads back from JSON (tuples -> lists, keys -> str)."""
  if not isinstance(plan_fingerprint, dict):
    raise TypeError(f"plan_fingerprint must be a dict, got {type(plan_fingerprint).__name__}")
  try:
    text = json.dumps(plan_fingerprint, sort_keys=True, allow_nan=False)
  except (TypeError, ValueError) as e:
    raise TypeError(f"plan_fingerprint must be JSON-serialisable without NaN/inf: {e}") from None
  return json.loads(text)


def _differing_fields(stored: dict, given: dict) -> list[str]:
  keys = set(stored) | set(given)
  return sorted(k for k in keys if k not in stored or k not in given or stored[k] != given[k])


def _is_empty(x: Any) -> bool:
  return (isinstance(x, (np.ndarray, jax.Array)) and not _is_typed_key(x)
          and int(np.prod(np.shape(x))) == 0)


def _stand_in_for_empty(x: Any) -> Any:
  """A 0-d stand-in for a leaf with no elements (Orbax refuses to save empty arrays)."""
  return np.zeros((), np.int8) if _is_empty(x) else x


def _is_typed_key(x: Any) -> bool:
  return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _is_writer() -> bool:
  """Whether this process writes the ledger (process 0 only)."""
  return jax.process_count() == 1 or jax.process_index() == 0


class RunCheckpointer:
  """Orbax checkpoints of a private run and its durable ledger (see module doc).

  Args:
    directory: the run's folder; created if missing.
    plan_fingerprint: JSON-serialisable dict of the plan's PUBLIC parameters.
      Stored on first use; a later checkpointer on the same directory with a
      different fingerprint raises ``ValueError`` naming the differing keys.
    max_to_keep: how many finalised checkpoints Orbax keeps (>= 1); older ones
      are deleted after a newer one is finalised.

  Usable as a context manager; leaving it waits for pending saves.
  """

  def __init__(self, directory: str | os.PathLike, plan_fingerprint: dict, *,
               max_to_keep: int = 2):
    if not isinstance(directory, (str, os.PathLike)):
      raise TypeError(f"directory must be a str or os.PathLike, got {type(directory).__name__}")
    fingerprint = _normalise_fingerprint(plan_fingerprint)
    if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, (int, np.integer)):
      raise TypeError(f"max_to_keep must be an int, got {type(max_to_keep).__name__}")
    if max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1, got {int(max_to_keep)}")
    self._directory = os.path.abspath(os.fspath(directory))
    self._ledger_path = os.path.join(self._directory, LEDGER_NAME)
    self._fingerprint = fingerprint
    # Refuse another plan's directory before anything is written (the lock file included).
    self._check_fingerprint(_durable.read_json(self._ledger_path))
    os.makedirs(self._directory, exist_ok=True)
    if _is_writer():
      with _durable.locked_update(self._ledger_path) as box:
        self._check_fingerprint(box.value)
        if box.value is None:
          box.value = self._new_ledger()
    ocp = _ocp()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=int(max_to_keep), create=True, cleanup_tmp_directories=True,
        enable_async_checkpointing=True)
    self._manager = ocp.CheckpointManager(os.path.join(self._directory, ORBAX_DIR_NAME),
                                          options=options)
    self._pending: int | None = None
    self._closed = False
    latest = self._manager.latest_step()
    if latest is not None:  # a crash between finalisation and the ledger update
      self._raise_checkpointed_through(int(latest))

  # -- ledger ---------------------------------------------------------------

  def _new_ledger(self) -> dict:
    return {"plan_fingerprint": self._fingerprint, "steps_paid": 0, "checkpointed_through": 0}

  def _check_fingerprint(self, ledger: Any) -> None:
    if ledger is None:
      return
    stored = ledger.get("plan_fingerprint") if isinstance(ledger, dict) else None
    if not isinstance(stored, dict):
      raise ValueError(f"checkpoint directory {self._directory} has a ledger without a "
                       f"plan_fingerprint; refusing to use it")
    if stored != self._fingerprint:
      differ = _differing_fields(stored, self._fingerprint)
      raise ValueError(f"checkpoint directory {self._directory} belongs to another plan: "
                       f"plan_fingerprint fields differ: {differ}")

  def _read_ledger(self) -> dict:
    ledger = _durable.read_json(self._ledger_path)
    if ledger is None:  # not yet written by process 0 (multi-process), or deleted by hand
      return self._new_ledger()
    self._check_fingerprint(ledger)
    return ledger

  def _update_ledger(self, field: str, value: int, *, monotone_error: bool) -> None:
    """Sets ``ledger[field] = value`` (or max with the old value) durably; process 0 only."""
    if not _is_writer():
      return
    with _durable.locked_update(self._ledger_path) as box:
      self._check_fingerprint(box.value)
      ledger = box.value if box.value is not None else self._new_ledger()
      old = int(ledger.get(field, 0))
      if value < old:
        if monotone_error:
          raise ValueError(f"total must be >= the steps already paid ({old}), got {value}")
        return
      ledger[field] = value
      box.value = ledger

  def _raise_checkpointed_through(self, step: int) -> None:
    self._update_ledger("checkpointed_through", step, monotone_error=False)

  def steps_paid(self) -> int:
    """The durable number of steps paid for in this run (0 for a new run)."""
    return int(self._read_ledger().get("steps_paid", 0))

  def record_paid(self, total: int) -> None:
    """Durably sets ``steps_paid = total`` (never lower); call after spending, before release."""
    total = _check_step(total, "total")
    self._update_ledger("steps_paid", total, monotone_error=True)

  def _set_once(self, field: str, value: Any) -> None:
    """Durably sets ``ledger[field] = value`` if the field is absent (process 0 only)."""
    if not _is_writer():
      return
    with _durable.locked_update(self._ledger_path) as box:
      self._check_fingerprint(box.value)
      ledger = box.value if box.value is not None else self._new_ledger()
      if ledger.get(field) is None:
        ledger[field] = value
        box.value = ledger

  def replay_binding(self) -> dict | None:
    """The digests of the data and starting parameters the run's first update used, or None.

    ``{"data": <digest>, "params": <digest or None>}`` (:mod:`.data_digest`),
    written once by :meth:`record_replay_binding` before the run's first update.
    A lost paid step may be replayed with its original batch and noise only
    when the data (and, for a replay from step 0, the starting parameters)
    have these digests: otherwise the replayed update differs from the lost
    one, and the two differ by a noise-free function of the data.
    """
    binding = self._read_ledger().get("replay_binding")
    return dict(binding) if isinstance(binding, dict) else None

  def record_replay_binding(self, data_sha: str, params_sha: str | None) -> None:
    """Durably records the run's data and starting-parameter digests (first call only)."""
    self._set_once("replay_binding", {"data": str(data_sha),
                                      "params": None if params_sha is None else str(params_sha)})

  def budget_path(self) -> str | None:
    """The file of the durable ``PrivacyBudget`` that paid this run's first steps, or None.

    None also when the run was paid on an in-memory accountant, or before any payment.
    """
    path = self._read_ledger().get("budget_path")
    return str(path) if path else None

  def record_budget_path(self, path: str | None) -> None:
    """Durably records which budget file pays the run ("" for an in-memory accountant); once."""
    self._set_once("budget_path", "" if path is None else os.path.abspath(os.fspath(path)))

  def checkpointed_through(self) -> int:
    """The largest step ever in a finalised checkpoint (0 if none; survives deleted folders)."""
    self._finalise_pending()
    return int(self._read_ledger().get("checkpointed_through", 0))

  # -- checkpoints ----------------------------------------------------------

  def _check_open(self) -> None:
    if self._closed:
      raise RuntimeError(f"RunCheckpointer on {self._directory} is closed")

  def _finalise_pending(self) -> None:
    """Waits for a pending save; records its step in the ledger once it is finalised."""
    if self._closed or self._pending is None:
      return
    self._manager.wait_until_finished()
    step, self._pending = self._pending, None
    self._raise_checkpointed_through(step)

  def latest_step(self) -> int | None:
    """The newest finalised checkpoint step, or ``None`` if there is none."""
    self._check_open()
    self._finalise_pending()
    latest = self._manager.latest_step()
    return None if latest is None else int(latest)

  def all_steps(self) -> list[int]:
    """The finalised checkpoint steps still on disk, oldest first."""
    self._check_open()
    self._finalise_pending()
    return sorted(int(s) for s in self._manager.all_steps())

  def save(self, step: int, state: PyTree, *, wait: bool = False) -> None:
    """Checkpoints ``state`` as the state after ``step`` updates.

    Returns once the state is copied off the device; the write finishes in the
    background (``wait=True``: returns after finalisation and the ledger
    update). ``step`` must exceed every checkpoint step on disk.
    """
    self._check_open()
    step = _check_step(step)
    if not isinstance(wait, bool):
      raise TypeError(f"wait must be a bool, got {type(wait).__name__}")
    self._finalise_pending()
    latest = self._manager.latest_step()
    if latest is not None and step <= latest:
      raise ValueError(f"step must exceed the newest checkpoint step {int(latest)}, got {step}")
    # Orbax may write host (numpy) leaves in the background: copy them so that the caller can
    # change its arrays in place at once. Device arrays are copied to the host by Orbax itself.
    # NumPy scalars travel as 0-d arrays (Orbax restores no np.generic leaf).
    state = jax.tree.map(
        lambda x: np.array(x, copy=True) if isinstance(x, (np.ndarray, np.generic)) else x, state)
    state = jax.tree.map(_stand_in_for_empty, state)
    ocp = _ocp()
    # force=True: the decision to save is the caller's (Orbax's default policy would silently skip
    # a save while another is in flight).
    saved = self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
    if not saved:
      raise RuntimeError(f"Orbax did not save step {step} in {self._directory}")
    self._pending = step
    if wait:
      self._finalise_pending()

  def restore(self, template: PyTree, step: int | None = None) -> tuple[int, PyTree]:
    """Restores ``(step, state)``: the newest checkpoint, or ``step``'s.

    ``template`` is a pytree of the saved structure (e.g. the initial state):
    restored leaves take its types, dtypes and (for ``jax.Array``) shardings;
    typed PRNG key leaves must be keys of the implementation that was saved.
    Raises ``FileNotFoundError`` if there is no such checkpoint.
    """
    self._check_open()
    if step is not None:
      step = _check_step(step)
    self._finalise_pending()
    steps = sorted(int(s) for s in self._manager.all_steps())
    if step is None:
      if not steps:
        raise FileNotFoundError(f"no finalised checkpoint in {self._directory}")
      step = steps[-1]
    elif step not in steps:
      raise FileNotFoundError(f"no finalised checkpoint for step {step} in {self._directory} "
                              f"(finalised steps: {steps})")
    ocp = _ocp()
    orbax_template = jax.tree.map(
        lambda x: np.zeros((), x.dtype) if isinstance(x, np.generic) else x, template)
    orbax_template = jax.tree.map(_stand_in_for_empty, orbax_template)
    state = self._manager.restore(step, args=ocp.args.StandardRestore(orbax_template))
    # Empty leaves (e.g. the noise history of a one-band strategy) hold no values: the template's.
    state = jax.tree.map(lambda want, got: want if _is_empty(want) else got, template, state)
    state = jax.tree.map(lambda want, got: want.dtype.type(got[()])
                         if isinstance(want, np.generic) else got, template, state)
    # Orbax restores a key with the implementation it was saved with, whatever the template's.
    for path, want, got in zip(*_key_paths_and_leaves(template, state)):
      if _is_typed_key(want) and (not _is_typed_key(got)
                                  or jax.random.key_impl(got) != jax.random.key_impl(want)):
        got_impl = jax.random.key_impl(got) if _is_typed_key(got) else type(got).__name__
        raise ValueError(f"template leaf {path} is a {jax.random.key_impl(want)} key, but step "
                         f"{step} holds {got_impl}")
    return step, state

  def close(self) -> None:
    """Waits for pending saves (and records them in the ledger); idempotent."""
    if self._closed:
      return
    try:
      self._finalise_pending()
    finally:
      self._closed = True
      self._manager.close()

  def __enter__(self) -> "RunCheckpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @property
  def directory(self) -> str:
    return self._directory


def _key_paths_and_leaves(template: PyTree, state: PyTree):
  paths_leaves = jax.tree_util.tree_flatten_with_path(template)[0]
  paths = [jax.tree_util.keystr(p) for p, _ in paths_leaves]
  return paths, [leaf for _, leaf in paths_leaves], jax.tree.leaves(state)


__all__ = ["RunCheckpointer"]
