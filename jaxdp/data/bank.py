"""UCI Bank Marketing (``bank-full.csv``): will the client subscribe a term deposit?

File (``bank-marketing/`` in ``shared/data``): ``bank-full.csv``, a header and
45,211 records of 17 ``;``-separated fields with double-quoted strings; target
``y`` is ``"no"`` 39,922 / ``"yes"`` 5,289. ``"unknown"`` is an ordinary
category value (no records are dropped; paper 003 Table 1 uses all 45,211).

Preprocessing as paper 003 (``../shared/papers/003_dp_confidence_intervals_for_erm.md``)
Section 7.1: 9 categorical attributes binarised, each column scaled to max
absolute value 1 (fitted on train), constant feature, unit L2 ball. With all
attributes this gives 7 numeric + 44 one-hot = **51** features (52 with the
constant); paper 003 Table 1 reports d = 34 for its version, whose attribute
selection is not described. Bank has no test file: the official split is the
deterministic ``test_fraction`` / ``split_seed`` split of the 45,211 records.
Label 1 is ``y = "yes"``.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from jaxdp.data import resolve, tabular
from jaxdp.data.base import Dataset

NAME = "bank"
ATTRIBUTES: tuple[str, ...] = (
    "age", "job", "marital", "education", "default", "balance", "housing", "loan",
    "contact", "day", "month", "duration", "campaign", "pdays", "previous", "poutcome")
CATEGORICAL: tuple[bool, ...] = (
    False, True, True, True, True, False, True, True, True, False, True, False, False,
    False, False, True)
CLASS_NAMES = ("no", "yes")
FILES = (resolve.FileSpec("data", "bank-marketing/bank-full.csv",
                          alternatives=("bank/bank-full.csv",)),)


def parse_bank_file(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
  """Parses ``bank-full.csv`` into ``([n, 16] str fields, [n] int32 labels)``."""
  lines = pathlib.Path(path).read_text(encoding="ascii").splitlines()
  header = [h.strip('"') for h in lines[0].split(";")]
  if tuple(header) != ATTRIBUTES + ("y",):
    raise ValueError(f"{path}: unexpected header {header}.")
  fields = tabular.split_fields(
      [line.replace('"', "").split(";") for line in lines[1:] if line.strip()], 17, path)
  return fields[:, :16], tabular.binary_labels(fields[:, 16], CLASS_NAMES, path)


def load_bank(
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
  """Loads Bank Marketing, preprocessed as in paper 003 Section 7.1.

  Args:
    data_dir: folder with ``bank-marketing/bank-full.csv`` (else ``$JAXDP_DATA_DIR``).
    split: ``"official"`` and ``"random"`` are the same here: the last
      ``round(test_fraction * 45211)`` records of a ``default_rng(split_seed)``
      permutation are the test set (defaults: 36,169 train / 9,042 test).
    test_fraction, split_seed: that split.
    scale, add_constant, unit_ball: see :func:`jaxdp.data.tabular.build_tabular_dataset`.
    verify: check the SHA-256 checksum.
    use_tfds, tfds_data_dir, download: TFDS has no Bank Marketing; they only
      change the error message.
  """
  tabular.check_options(NAME, split, unit_ball, has_test_set=False,
                        test_fraction=test_fraction, split_seed=split_seed)
  found = tabular.locate(NAME, FILES, data_dir, verify=verify, use_tfds=use_tfds,
                         tfds_data_dir=tfds_data_dir, download=download)
  fields, labels = parse_bank_file(found.paths["data"])
  table = tabular.RawTable.from_fields(fields, ATTRIBUTES, CATEGORICAL, labels)
  return tabular.build_tabular_dataset(
      NAME, table, np.arange(table.num_rows), None, CLASS_NAMES, split=split,
      test_fraction=test_fraction, split_seed=split_seed, scale=scale,
      add_constant=add_constant, unit_ball=unit_ball,
      info=dict(found.info, records=table.num_rows, split=split,
                test_fraction=test_fraction, split_seed=split_seed))
