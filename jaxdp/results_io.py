"""Helpers shared by experiments and benchmarks for writing results.

* :func:`strict_json` / :func:`from_strict_json`: non-finite floats (``epsilon =
  inf`` of a non-private baseline) as the strings ``"inf"``, ``"-inf"``,
  ``"nan"``, so files are strict JSON (``allow_nan=False``).
* :class:`PointLog`: an append-only, resumable log of finished experiment
  points (one JSON line each, flushed and ``fsync``'d as it completes). A run
  that is stopped loses at most the point in progress; re-running the same
  command skips every point already in the log.
* :func:`point_seed`: a 32-bit seed derived from a point's key, so a point's
  random draws do not depend on which other points are in the grid or were
  already done (resumed and uninterrupted runs give identical numbers).
* :func:`run_dir`: ``<out_dir>/<experiment>/<dataset>[_n<N>][_pca<D>]/``, so runs on
  different datasets (or subsets / PCA variants) never overwrite each other.
* :func:`write_csv_atomic`: the CSV of the rows so far, replaced atomically.
* :func:`open_point_log`: the one set-up every experiment main shares: its
  :func:`run_dir` and its :class:`PointLog`, fingerprinted by the config fields
  that change a point's result plus the experiment name and the jaxdp version.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import pathlib
import zlib
from typing import Any, Iterable, Mapping, Sequence

from jaxdp import _durable

_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def strict_json(obj: Any) -> Any:
  """``obj`` with non-finite floats (e.g. epsilon = inf) replaced by strings, so
  ``json.dump(..., allow_nan=False)`` writes strict JSON."""
  if isinstance(obj, dict):
    return {k: strict_json(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [strict_json(v) for v in obj]
  if isinstance(obj, float) and not math.isfinite(obj):
    return str(obj)
  return obj


def from_strict_json(obj: Any) -> Any:
  """Inverse of :func:`strict_json`: the strings ``"inf"``, ``"-inf"``, ``"nan"`` back to floats."""
  if isinstance(obj, dict):
    return {k: from_strict_json(v) for k, v in obj.items()}
  if isinstance(obj, list):
    return [from_strict_json(v) for v in obj]
  if isinstance(obj, str) and obj in _NON_FINITE:
    return _NON_FINITE[obj]
  return obj


def _canonical(obj: Any) -> str:
  return json.dumps(strict_json(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def point_seed(key: Sequence[Any]) -> int:
  """A 32-bit integer determined by ``key`` alone (CRC-32 of its canonical JSON).

  Use as ``jax.random.fold_in(root, point_seed(key))``: distinct points get
  distinct keys (up to CRC collisions, which :class:`PointLog` users avoid by
  having few points), and a point's key does not depend on its position in
  the grid.
  """
  return zlib.crc32(_canonical(list(key)).encode())


def fingerprint(settings: Mapping[str, Any]) -> str:
  """Short hash of the settings that determine a point's result (16 hex digits)."""
  return hashlib.sha256(_canonical(dict(settings)).encode()).hexdigest()[:16]


def run_dir(out_dir: str | os.PathLike, experiment: str, dataset: str, *, n_train: int = 0,
            pca_dims: int = 0) -> pathlib.Path:
  """``<out_dir>/<experiment>/<dataset>[_n<n_train>][_pca<pca_dims>]``, absolute."""
  name = str(dataset)
  if n_train:
    name += f"_n{int(n_train)}"
  if pca_dims:
    name += f"_pca{int(pca_dims)}"
  return pathlib.Path(os.path.abspath(os.fspath(out_dir))) / experiment / name


class PointLog:
  """Append-only JSON-lines log of finished points, keyed by their grid coordinates.

  Each line is ``{"key": [...], "fingerprint": "...", "rows": [...]}``: ``key``
  identifies the point in the grid (e.g. ``["loss_perturbation", 1.0, 1e-05]``),
  ``fingerprint`` hashes every setting that changes its result (see
  :func:`fingerprint`), ``rows`` are the result rows it produced. On opening,
  lines written with the same fingerprint are loaded; lines with another
  fingerprint (an earlier run with other settings) are kept in the file but
  ignored, so their points are recomputed. A last line cut short by a crash
  (no newline) is removed; any other unreadable line raises ``ValueError``.

  Appends hold an exclusive ``flock`` (see :mod:`jaxdp._durable`) and are
  flushed and ``fsync``'d before :meth:`append` returns, so a point reported
  finished survives a crash. Two processes running the same grid may both
  compute a point; both lines are equal and the first is used.
  """

  def __init__(self, path: str | os.PathLike, settings: Mapping[str, Any]):
    self.path = pathlib.Path(os.path.abspath(os.fspath(path)))
    self.fingerprint = fingerprint(settings)
    self._points: dict[str, list[dict]] = {}
    self.path.parent.mkdir(parents=True, exist_ok=True)
    with _durable.locked(self.path):
      self._load()

  def _load(self) -> None:
    if not self.path.exists():
      return
    data = self.path.read_bytes()
    if data and not data.endswith(b"\n"):
      # A torn last line (the process died mid-write): drop it, keep the rest.
      keep = data.rfind(b"\n") + 1
      with open(self.path, "r+b") as f:
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
      data = data[:keep]
    for lineno, line in enumerate(data.decode("utf-8").splitlines(), start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
        key, fp, rows = record["key"], record["fingerprint"], record["rows"]
      except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{self.path}:{lineno}: not a point record ({err}); move the file "
                         "away to start over.") from err
      if fp == self.fingerprint:
        self._points.setdefault(_canonical(key), from_strict_json(rows))

  def __contains__(self, key: Sequence[Any]) -> bool:
    return _canonical(list(key)) in self._points

  def __len__(self) -> int:
    return len(self._points)

  def get(self, key: Sequence[Any]) -> list[dict] | None:
    """The rows of a finished point, or None."""
    return self._points.get(_canonical(list(key)))

  def append(self, key: Sequence[Any], rows: Iterable[Mapping[str, Any]]) -> list[dict]:
    """Records a finished point durably and returns its rows."""
    rows = [dict(r) for r in rows]
    line = json.dumps({"key": strict_json(list(key)), "fingerprint": self.fingerprint,
                       "rows": strict_json(rows)}, allow_nan=False) + "\n"
    with _durable.locked(self.path):
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
    self._points.setdefault(_canonical(list(key)), rows)
    return rows


def open_point_log(config: Mapping[str, Any], result_fields: Sequence[str], *,
                   extra_settings: Mapping[str, Any] | None = None,
                   filename: str = "points.jsonl") -> tuple[PointLog, pathlib.Path]:
  """The :class:`PointLog` and output folder of an experiment run.

  The folder is :func:`run_dir` of ``config.out_dir``, ``config.name``,
  ``config.dataset`` (and ``config.n_train`` / ``config.pca_dims`` when the
  config has them); the log is ``<folder>/<filename>``, fingerprinted by
  ``{f: config[f] for f in result_fields}`` plus ``experiment = config.name``,
  ``jaxdp = jaxdp.__version__`` and ``extra_settings``. Only the settings that
  change a point's result belong in ``result_fields``: the grid itself selects
  which points exist, and speed-only settings (``batch_mode``, ``out_dir``)
  change nothing, so changing them keeps the finished points.

  Args:
    config: an ``ml_collections.ConfigDict`` (or a mapping) with at least
      ``out_dir``, ``name``, ``dataset`` and every field in ``result_fields``.
    result_fields: names of the config fields that determine a point's result.
    extra_settings: more settings to fingerprint (e.g. derived values).
    filename: the log's file name inside the folder.

  Returns:
    ``(log, out_dir)``.

  Raises:
    KeyError: a field of ``result_fields`` is missing from ``config``.
  """
  from jaxdp import __version__  # pylint: disable=import-outside-toplevel

  get = lambda f, default=0: config[f] if f in config else default
  out = run_dir(config["out_dir"], config["name"], config["dataset"], n_train=get("n_train"),
                pca_dims=get("pca_dims"))
  missing = [f for f in result_fields if f not in config]
  if missing:
    raise KeyError(f"result_fields not in the config: {missing}.")
  settings = {f: config[f] for f in result_fields}
  settings |= {"experiment": config["name"], "jaxdp": __version__}
  settings |= dict(extra_settings or {})
  return PointLog(out / filename, settings), out


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
  """Writes ``text`` to ``path`` atomically and durably (:func:`jaxdp._durable.write_text_atomic`)."""
  _durable.write_text_atomic(path, text)


def write_csv_atomic(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> None:
  """Writes ``rows`` (dicts with the same keys) as CSV, replacing ``path`` atomically."""
  if not rows:
    return
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
  writer.writeheader()
  writer.writerows(rows)
  write_text_atomic(path, buf.getvalue())


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
  """Writes ``obj`` as strict, indented JSON (non-finite floats as strings), atomically."""
  write_text_atomic(
      path, json.dumps(strict_json(obj), indent=2, default=str, allow_nan=False) + "\n")


__all__ = ["PointLog", "fingerprint", "from_strict_json", "open_point_log", "point_seed", "run_dir",
           "strict_json", "write_csv_atomic", "write_json_atomic", "write_text_atomic"]
