"""TensorFlow Datasets as the last place to look (optional ``jaxdp[tfds]`` extra).

Reads through ``tfds.data_source`` (random-access ArrayRecord files), which
needs no TensorFlow. TFDS has ``mnist`` and ``kddcup99``; Adult, Bank Marketing
and UCI HAR have no TFDS builder, so for them this step reports that and the
loader raises its not-found error.

Note: TFDS ``kddcup99``'s train split is the *full* 4,898,431-record
``kddcup.data.gz`` (the set paper 003 Table 1 counts), not the 10% subset in
``shared/data``; its test split is the same ``corrected.gz``. Records are read
one Python dict at a time, so that path is slow and memory-hungry for 4.9M
records (minutes, several GB); prefer the local files.

By default (``download=False``) nothing is fetched: TFDS is used only if the
dataset was already prepared in its data folder (``tfds_data_dir`` or TFDS's own
default, ``$TFDS_DATA_DIR`` / ``~/tensorflow_datasets``).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np

# jaxdp dataset name -> TFDS builder name.
TFDS_NAMES: dict[str, str] = {"mnist": "mnist", "kddcup99": "kddcup99"}


def tfds_importable() -> bool:
  """Whether ``tensorflow_datasets`` can be imported."""
  return importlib.util.find_spec("tensorflow_datasets") is not None


def _read_records(source: Any) -> list[dict[str, Any]]:
  n = len(source)
  out: list[dict[str, Any]] = []
  chunk = 8192
  getitems = getattr(source, "__getitems__", None)
  for start in range(0, n, chunk):
    keys = list(range(start, min(n, start + chunk)))
    records = None
    if getitems is not None:
      try:
        records = list(getitems(keys))
      except Exception:  # some data sources (and tfds mocks) only index one by one
        getitems = None
    if records is None:
      records = [source[i] for i in keys]
    out.extend(records)
  return out


def load_split(name: str, split: str, *, tfds_data_dir: str | None = None,
               download: bool = False) -> tuple[dict[str, np.ndarray], Any]:
  """Reads one split of a TFDS dataset into stacked numpy columns.

  Returns:
    ``(columns, features)``: ``columns[key]`` is an ``[n, ...]`` array per
    feature key; ``features`` is the TFDS ``FeaturesDict`` (for class names).
  """
  import tensorflow_datasets as tfds  # optional dependency

  source = tfds.data_source(TFDS_NAMES[name], split=split, data_dir=tfds_data_dir,
                            download=download)
  records = _read_records(source)
  features = source.dataset_info.features
  if not records:
    raise ValueError(f"TFDS {TFDS_NAMES[name]!r} split {split!r} is empty.")
  columns = {k: np.stack([np.asarray(r[k]) for r in records]) for k in records[0]}
  return columns, features


def try_load(name: str, *, use_tfds: bool, tfds_data_dir: str | None,
             download: bool) -> tuple[dict[str, tuple[dict[str, np.ndarray], Any]] | None, str]:
  """Tries TFDS for both splits; returns ``(splits or None, note for error messages)``."""
  if not use_tfds:
    return None, "TFDS: not tried (use_tfds=False)"
  if name not in TFDS_NAMES:
    return None, f"TFDS: no TFDS dataset for {name!r} (TFDS has: {', '.join(TFDS_NAMES)})"
  if not tfds_importable():
    return None, ("TFDS: tensorflow_datasets is not installed "
                  "(pip install 'jaxdp[tfds]' to use it)")
  try:
    splits = {s: load_split(name, s, tfds_data_dir=tfds_data_dir, download=download)
              for s in ("train", "test")}
  except Exception as err:  # TFDS raises many types (KeyError, AssertionError, ...)
    where = tfds_data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
    msg = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
    hint = "" if download else "; pass download=True to let TFDS fetch and prepare it"
    return None, (f"TFDS: {TFDS_NAMES[name]!r} not available in {where} with "
                  f"download={download} ({type(err).__name__}: {msg}){hint}")
  return splits, f"TFDS: {TFDS_NAMES[name]!r} ({tfds_data_dir or 'default data_dir'})"
