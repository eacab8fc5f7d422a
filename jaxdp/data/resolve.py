"""Where dataset files are looked for, in order, and the error when none has them.

Resolution order (issue 2, "Data"):

1. an explicit ``data_dir`` argument;
2. the ``JAXDP_DATA_DIR`` environment variable;
3. TensorFlow Datasets, when ``tensorflow_datasets`` is importable and TFDS has
   the dataset (see :mod:`jaxdp.data.tfds_source`).

Relative folders (``JAXDP_DATA_DIR=../shared/data``, a relative ``data_dir``) are
made absolute against the current directory when they are read (:func:`absolute_dir`),
so the paths in ``Dataset.info["source"]``, in error messages and any symlink made
from them keep pointing at the same folder after a ``chdir``.

A folder is laid out like ``shared/data`` (``<dir>/mnist/train-images-idx3-ubyte.gz``);
the dataset's own folder may also be given (``<dir>/train-images-idx3-ubyte.gz``).
A folder is used only when it holds *every* required file of the dataset; each
file found is checked against its embedded SHA-256 (a corrupt file raises at
once instead of falling through to the next place).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Sequence

from jaxdp.data import checksums
from jaxdp.data.base import DatasetNotFoundError

ENV_VAR = "JAXDP_DATA_DIR"


@dataclasses.dataclass(frozen=True)
class FileSpec:
  """One file of a dataset.

  Attributes:
    key: the loader's name for it (``"train_images"``).
    relpath: path relative to a ``shared/data``-like folder; also the checksum key.
    alternatives: other relative paths accepted (e.g. the original zip layout).
  """

  key: str
  relpath: str
  alternatives: tuple[str, ...] = ()

  def candidates(self) -> tuple[str, ...]:
    base = pathlib.PurePosixPath(self.relpath).name
    out = [self.relpath, *self.alternatives, base]
    return tuple(dict.fromkeys(out))


@dataclasses.dataclass(frozen=True)
class LocalFiles:
  """Files found in one folder: ``paths[key]`` and where they came from."""

  paths: dict[str, pathlib.Path]
  source: str
  root: pathlib.Path


def absolute_dir(path: str | os.PathLike) -> pathlib.Path:
  """``path`` with ``~`` expanded, made absolute against the current directory.

  ``os.path.abspath`` semantics: ``..`` is collapsed lexically and symlinks are
  kept (the folder a user named stays the folder reported), unlike
  ``Path.resolve``.
  """
  return pathlib.Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def env_data_dir() -> pathlib.Path | None:
  """``$JAXDP_DATA_DIR`` as an absolute path (:func:`absolute_dir`), or None if unset/empty."""
  env = os.environ.get(ENV_VAR)
  return absolute_dir(env) if env else None


def data_roots(data_dir: str | os.PathLike | None) -> list[tuple[str, pathlib.Path | None]]:
  """The folders to search, in order, each with a description for error messages.

  Both are absolute (:func:`absolute_dir`): a relative ``$JAXDP_DATA_DIR`` such as
  the README's ``../shared/data`` is resolved against the current directory here,
  once per lookup.
  """
  roots: list[tuple[str, pathlib.Path | None]] = []
  if data_dir is not None:
    roots.append(("data_dir argument", absolute_dir(data_dir)))
  roots.append((f"${ENV_VAR}", env_data_dir()))
  return roots


def _find(root: pathlib.Path, spec: FileSpec) -> pathlib.Path | None:
  for rel in spec.candidates():
    p = root / rel
    if p.is_file():
      return p
  return None


def find_local(
    specs: Sequence[FileSpec],
    data_dir: str | os.PathLike | None,
    *,
    verify: bool = True,
    optional: Sequence[FileSpec] = (),
) -> tuple[LocalFiles | None, list[str]]:
  """Finds every file of ``specs`` in the first folder that has all of them.

  Args:
    specs: the required files.
    data_dir: explicit folder, searched before ``$JAXDP_DATA_DIR``.
    verify: check each file found against its embedded SHA-256.
    optional: files picked up from the same folder when present.

  Returns:
    ``(LocalFiles or None, looked)``, where ``looked`` lists, per place, the
    paths tried and the files missing there (for the not-found message).

  Raises:
    ChecksumError: a file found has the wrong SHA-256.
  """
  looked: list[str] = []
  for desc, root in data_roots(data_dir):
    if root is None:
      looked.append(f"{desc}: not set")
      continue
    if not root.is_dir():
      looked.append(f"{desc}={root}: not a directory")
      continue
    found, missing = {}, []
    for spec in specs:
      p = _find(root, spec)
      if p is None:
        missing.append(spec)
      else:
        found[spec.key] = p
    if missing:
      tried = "; ".join(
          " or ".join(str(root / c) for c in spec.candidates()) for spec in missing)
      looked.append(f"{desc}={root}: missing {', '.join(s.relpath for s in missing)} "
                    f"(tried {tried})")
      continue
    for spec in optional:
      p = _find(root, spec)
      if p is not None:
        found[spec.key] = p
    if verify:
      for spec in (*specs, *optional):
        if spec.key in found:
          checksums.verify_file(found[spec.key], spec.relpath)
    return LocalFiles(paths=found, source=f"{desc}={root}", root=root), looked
  return None, looked


def not_found_error(name: str, specs: Sequence[FileSpec], looked: Sequence[str],
                    tfds_note: str) -> DatasetNotFoundError:
  """The error raised when no place has the dataset: which files, where it looked."""
  files = ", ".join(s.relpath for s in specs)
  places = "\n".join(f"  {i + 1}. {line}" for i, line in enumerate([*looked, tfds_note]))
  return DatasetNotFoundError(
      f"jaxdp.data: cannot load {name!r}: file(s) {files} not found. Looked in, in order:\n"
      f"{places}\n"
      f"Pass data_dir=... or set {ENV_VAR} to a folder laid out like shared/data "
      "(see shared/data/README.md); 'digits' needs no files."
  )
