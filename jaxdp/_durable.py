"""Durable, process-safe JSON state files (budgets, predictor counters).

Privacy state must survive crashes and must not be overspent by two processes
sharing it. The primitives here give both:

* :func:`locked` takes an exclusive advisory lock (``fcntl.flock``) on a
  hidden sidecar file ``.<name>.lock`` beside ``path``; every read-modify-write
  of ``path`` happens under it, so concurrent processes serialise
  (compare-and-increment). The empty sidecar stays after the lock is released:
  deleting it would let a process that opened it just before lock a file no
  other process can find any more (two holders). It is safe to delete when no
  process uses ``path``.
* :func:`write_json_atomic` writes a temporary file in the same directory,
  ``fsync``s it, ``os.replace``s it over ``path`` and ``fsync``s the directory,
  so a crash leaves either the old or the new state, never a torn one, and a
  state that was reported written is on disk. The file keeps its permissions
  when it exists, and gets the usual ``0o666 & ~umask`` when it is new (as
  ``open(path, "w")`` would), not ``mkstemp``'s private ``0o600``.
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
import stat
import tempfile
import threading
from typing import Any, Iterator

_UMASK_LOCK = threading.Lock()


def _lock_path(path: str) -> str:
  directory, name = os.path.split(path)
  return os.path.join(directory, f".{name}.lock")


def _new_file_mode(path: str) -> int:
  """The mode ``path`` keeps (if it exists) or gets (``0o666 & ~umask``) when written."""
  try:
    return stat.S_IMODE(os.stat(path).st_mode)
  except FileNotFoundError:
    pass
  with _UMASK_LOCK:  # os.umask is the only portable way to read it; restore at once
    mask = os.umask(0o022)
    os.umask(mask)
  return 0o666 & ~mask


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
  mode = _new_file_mode(path)
  fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
  try:
    os.fchmod(fd, mode)
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
