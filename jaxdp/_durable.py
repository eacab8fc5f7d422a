"""Durable, process-safe JSON state files (budgets, predictor counters).

Privacy state must survive crashes and must not be overspent by two processes
sharing it. The primitives here give both:

* :func:`locked` takes an exclusive advisory lock (``fcntl.flock``) on a
  sidecar ``<path>.lock`` file; every read-modify-write of ``path`` happens
  under it, so concurrent processes serialise (compare-and-increment).
* :func:`write_json_atomic` writes a temporary file in the same directory,
  ``fsync``s it, ``os.replace``s it over ``path`` and ``fsync``s the directory,
  so a crash leaves either the old or the new state, never a torn one, and a
  state that was reported written is on disk.
* :func:`locked_update` combines them: ``with locked_update(path) as state:``
  yields the current state (``None`` if the file does not exist yet); the
  caller mutates it in place or assigns ``state_box[0]``; it is written before
  the lock is released. If the body raises, nothing is written.

The lock is advisory and POSIX-only (Linux, macOS); processes that bypass
these helpers are not serialised. Within one process, the lock file's
``flock`` is per open file description, so threads of one process are
serialised too (each call opens its own descriptor).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from typing import Any, Iterator


def _lock_path(path: str) -> str:
  return f"{path}.lock"


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
  """Holds an exclusive inter-process lock associated with ``path``."""
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd = os.open(_lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    try:
      fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
      os.close(fd)


def read_json(path: str | os.PathLike) -> Any | None:
  """Returns the parsed JSON content of ``path``, or ``None`` if it does not exist."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    return None


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
  """Writes ``text`` to ``path`` atomically and durably (see module doc)."""
  path = os.path.abspath(os.fspath(path))
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise
  dir_fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(dir_fd)
  finally:
    os.close(dir_fd)


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
  """Writes ``data`` as JSON to ``path`` atomically and durably (see module doc)."""
  write_text_atomic(path, json.dumps(data))


class StateBox:
  """Mutable holder yielded by :func:`locked_update`: ``box.value`` is the state."""

  def __init__(self, value: Any | None):
    self.value = value


@contextlib.contextmanager
def locked_update(path: str | os.PathLike) -> Iterator[StateBox]:
  """Read-modify-write of a JSON state file under the inter-process lock.

  Usage::

    with locked_update(path) as box:
      state = box.value or {"count": 0}
      if state["count"] + m > limit:
        raise BudgetExceededError(...)   # nothing is written
      state["count"] += m
      box.value = state                  # written (fsync'd) before the lock is released
  """
  with locked(path):
    box = StateBox(read_json(path))
    before = json.dumps(box.value, sort_keys=True)
    yield box
    if json.dumps(box.value, sort_keys=True) != before:
      write_json_atomic(path, box.value)


__all__ = ["StateBox", "locked", "locked_update", "read_json", "write_json_atomic",
           "write_text_atomic"]
