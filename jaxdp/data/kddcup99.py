"""KDD Cup 1999 network intrusion data: normal connection (0) vs attack (1).

Files (``kddcup99/`` in ``shared/data``): ``kddcup.data_10_percent.gz``
(494,021 training records, 23 labels) and ``corrected.gz`` (311,029 test
records with corrected labels, 38 labels; some attack types occur only in the
test set). Each record has 41 comma-separated attributes and a label ending in
``.``; ``kddcup.names`` gives the attribute names.

Preprocessing as paper 003 (``../shared/papers/003_dp_confidence_intervals_for_erm.md``)
Section 7.1: the three string attributes (``protocol_type``, ``service``,
``flag``) are binarised with the categories seen in training; the other 38
(including the 0/1 symbolic ``land``, ``logged_in``, ``is_host_login``,
``is_guest_login``, kept as one 0/1 column each) are numeric; every column is
scaled to max absolute value 1 on the training set (test clipped), a constant
feature is added and records are put in the unit L2 ball. The 10% set gives
38 + 3 + 66 + 11 = **118** features (119 with the constant). Paper 003 Table 1
reports d = 90 for its version (full 4.9M-record set, attribute selection not
described); paper 001 Section 6.2 reports d = 123.

Parsing is vectorised and deduplicated: the 805,050 records have only 215,601
distinct lines, which are split and converted with numpy once and gathered
back (about 2 s for both files).
"""

from __future__ import annotations

import gzip
import os
import pathlib
from typing import Any

import numpy as np

from jaxdp.data import resolve, tabular
from jaxdp.data.base import Dataset

NAME = "kddcup99"
ATTRIBUTES: tuple[str, ...] = (
    "duration", "protocol_type", "service", "flag", "src_bytes", "dst_bytes", "land",
    "wrong_fragment", "urgent", "hot", "num_failed_logins", "logged_in",
    "num_compromised", "root_shell", "su_attempted", "num_root", "num_file_creations",
    "num_shells", "num_access_files", "num_outbound_cmds", "is_host_login",
    "is_guest_login", "count", "srv_count", "serror_rate", "srv_serror_rate",
    "rerror_rate", "srv_rerror_rate", "same_srv_rate", "diff_srv_rate",
    "srv_diff_host_rate", "dst_host_count", "dst_host_srv_count",
    "dst_host_same_srv_rate", "dst_host_diff_srv_rate", "dst_host_same_src_port_rate",
    "dst_host_srv_diff_host_rate", "dst_host_serror_rate", "dst_host_srv_serror_rate",
    "dst_host_rerror_rate", "dst_host_srv_rerror_rate")
CATEGORICAL_ATTRIBUTES = ("protocol_type", "service", "flag")
CATEGORICAL: tuple[bool, ...] = tuple(a in CATEGORICAL_ATTRIBUTES for a in ATTRIBUTES)
CLASS_NAMES = ("normal", "attack")
FILES = (
    resolve.FileSpec("train", "kddcup99/kddcup.data_10_percent.gz"),
    resolve.FileSpec("test", "kddcup99/corrected.gz"),
)
# TFDS spells one attribute differently.
_TFDS_KEYS = {"is_host_login": "is_hot_login"}


def _lines(path: str | os.PathLike) -> list[bytes]:
  raw = gzip.decompress(pathlib.Path(path).read_bytes())
  lines = raw.replace(b"\r", b"").split(b"\n")
  while lines and not lines[-1]:
    lines.pop()
  return lines


def parse_kdd_files(
    *paths: str | os.PathLike) -> tuple[tabular.RawTable, list[np.ndarray], np.ndarray]:
  """Parses KDD files into a table of their distinct lines.

  Returns:
    ``(table, indices, label_names)``: ``table`` has one row per distinct line
    over all files; ``indices[k][i]`` is the table row of record ``i`` of file
    ``k``; ``label_names[r]`` is row ``r``'s label without the final ``.``.
  """
  distinct: dict[bytes, int] = {}
  indices = []
  for path in paths:
    lines = _lines(path)
    indices.append(np.fromiter((distinct.setdefault(l, len(distinct)) for l in lines),
                               dtype=np.int64, count=len(lines)))
  unique = list(distinct)
  # Layout: duration, protocol_type, service, flag, <37 numeric>, label. Split
  # each distinct line once; parse all numeric text in one np.fromstring call.
  heads, numeric_text, label_bytes = [], [], []
  for line in unique:
    parts = line.split(b",", 4)
    if len(parts) != 5 or b"," not in parts[4]:
      raise ValueError(f"malformed KDD record: {line[:80]!r}")
    rest, label = parts[4].rsplit(b",", 1)
    heads.append(parts[1:4])
    numeric_text.append(parts[0])
    numeric_text.append(rest)
    label_bytes.append(label)
  n_numeric = len(ATTRIBUTES) - len(CATEGORICAL_ATTRIBUTES)
  try:
    numeric = np.fromstring(b",".join(numeric_text).decode("ascii"), dtype=np.float64, sep=",")
  except ValueError as err:
    raise ValueError(f"KDD numeric attributes could not be parsed: {err}") from err
  if numeric.size != n_numeric * len(unique):
    raise ValueError(f"KDD records must have {len(ATTRIBUTES) + 1} fields; parsed "
                     f"{numeric.size} numeric values for {len(unique)} records.")
  numeric = numeric.reshape(len(unique), n_numeric)
  cats = np.array(heads, dtype=str)
  columns, k_num, k_cat = [], 0, 0
  for cat in CATEGORICAL:
    if cat:
      columns.append(cats[:, k_cat])
      k_cat += 1
    else:
      columns.append(numeric[:, k_num])
      k_num += 1
  label_names = np.char.rstrip(np.array(label_bytes, dtype=str), ".")
  table = tabular.RawTable(columns=tuple(columns), names=ATTRIBUTES, categorical=CATEGORICAL,
                           labels=(label_names != "normal").astype(np.int32))
  return table, indices, label_names


def _table_from_tfds(splits: dict[str, tuple[dict[str, np.ndarray], Any]]):
  """Builds the raw table from TFDS ``kddcup99`` columns (ClassLabel ints -> names)."""
  parts, label_parts = [], []
  for split in ("train", "test"):
    cols, features = splits[split]
    part = []
    for a, cat in zip(ATTRIBUTES, CATEGORICAL):
      v = cols[_TFDS_KEYS.get(a, a)]
      part.append(np.asarray(features[a].names)[v] if cat else v.astype(np.float64))
    parts.append(part)
    label_parts.append(np.asarray(features["label"].names)[cols["label"]])
  columns = tuple(np.concatenate([p[j] for p in parts]) for j in range(len(ATTRIBUTES)))
  label_names = np.concatenate(label_parts)
  table = tabular.RawTable(columns=columns, names=ATTRIBUTES, categorical=CATEGORICAL,
                           labels=(label_names != "normal").astype(np.int32))
  n_tr = len(label_parts[0])
  return table, [np.arange(n_tr), np.arange(n_tr, len(label_names))], label_names


def load_kddcup99(
    data_dir: str | os.PathLike | None = None,
    split: str = "official",
    *,
    scale: bool = True,
    add_constant: bool = True,
    unit_ball: bool | str = True,
    test_fraction: float = 0.2,
    split_seed: int = 0,
    verify: bool = True,
    use_tfds: bool = True,
    tfds_data_dir: str | None = None,
    download: bool = False,
) -> Dataset:
  """Loads KDD Cup 99 (10% train + corrected test), preprocessed as paper 003 Sec. 7.1.

  Args:
    data_dir: folder with ``kddcup99/kddcup.data_10_percent.gz`` and
      ``kddcup99/corrected.gz`` (else ``$JAXDP_DATA_DIR``, else TFDS
      ``kddcup99``, whose train split is the full 4.9M-record set).
    split: ``"official"`` (10% train / corrected test) or ``"random"`` (pooled,
      deterministic ``test_fraction`` / ``split_seed`` split).
    scale, add_constant, unit_ball: see :func:`jaxdp.data.tabular.build_tabular_dataset`.
    verify: check SHA-256 checksums.
    use_tfds, tfds_data_dir, download: the TFDS fallback (``download=False``
      uses only an already prepared TFDS copy).

  Returns:
    A binary :class:`Dataset`, label 1 = attack; ``info["label_counts_train"]``
    and ``info["label_counts_test"]`` give the counts per original label.
  """
  tabular.check_options(NAME, split, unit_ball, test_fraction=test_fraction,
                        split_seed=split_seed)
  found = tabular.locate(NAME, FILES, data_dir, verify=verify, use_tfds=use_tfds,
                         tfds_data_dir=tfds_data_dir, download=download)
  if found.tfds is None:
    table, (tr, te), label_names = parse_kdd_files(found.paths["train"], found.paths["test"])
  else:
    table, (tr, te), label_names = _table_from_tfds(found.tfds)
  counts = {}
  for key, idx in (("label_counts_train", tr), ("label_counts_test", te)):
    names, c = np.unique(label_names[idx], return_counts=True)
    counts[key] = dict(zip(names.tolist(), c.tolist()))
  return tabular.build_tabular_dataset(
      NAME, table, tr, te, CLASS_NAMES, split=split, test_fraction=test_fraction,
      split_seed=split_seed, scale=scale, add_constant=add_constant, unit_ball=unit_ball,
      info=dict(split=split, **found.info, **counts))
