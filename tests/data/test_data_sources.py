"""Where files are looked for, checksum verification, and the errors users see."""

import hashlib
import os
import pathlib

import numpy as np
import pytest

import jaxdp.data as jd
from jaxdp.data import checksums

pytestmark = pytest.mark.data


def _link_folder(src: pathlib.Path, dst: pathlib.Path, skip=()):
  dst.mkdir(parents=True)
  for f in src.iterdir():
    if f.name not in skip:
      (dst / f.name).symlink_to(f)


def test_embedded_checksums_match_shared_sha256sums(data_dir):
  """The embedded table agrees with shared/data/SHA256SUMS (a consistency check, not the source)."""
  sums = data_dir / "SHA256SUMS"
  if not sums.exists():
    pytest.skip("this data folder has no SHA256SUMS file")
  listed = dict(reversed(line.split()) for line in sums.read_text().splitlines() if line.strip())
  assert listed == jd.SHA256


def test_file_sha256_matches_hashlib_and_is_cached(tmp_path):
  path = tmp_path / "f.bin"
  path.write_bytes(b"jaxdp" * 1000)
  want = hashlib.sha256(b"jaxdp" * 1000).hexdigest()
  assert jd.file_sha256(path) == want
  st = os.stat(path)
  assert checksums._CACHE[(os.path.realpath(path), st.st_size, st.st_mtime_ns)] == want
  # Same size, new content and mtime: the cache key changes, the hash is recomputed.
  path.write_bytes(b"JAXDP" * 1000)
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
  assert jd.file_sha256(path) == hashlib.sha256(b"JAXDP" * 1000).hexdigest()


def test_corrupt_file_is_named_with_both_hashes(tmp_path, data_dir, monkeypatch):
  monkeypatch.delenv("JAXDP_DATA_DIR", raising=False)
  name = "t10k-labels-idx1-ubyte.gz"
  _link_folder(data_dir / "mnist", tmp_path / "mnist", skip=(name,))
  data = bytearray((data_dir / "mnist" / name).read_bytes())
  data[100] ^= 0xFF
  (tmp_path / "mnist" / name).write_bytes(bytes(data))
  actual = hashlib.sha256(bytes(data)).hexdigest()
  with pytest.raises(jd.ChecksumError) as err:
    jd.load("mnist", tmp_path)
  msg = str(err.value)
  assert f"mnist/{name}" in msg and str(tmp_path) in msg
  assert jd.SHA256[f"mnist/{name}"] in msg and actual in msg
  # verify=False skips the check (the flipped byte lands in the gzip stream,
  # so the error then comes from gzip, not from a silent wrong label).
  with pytest.raises(Exception) as err2:
    jd.load("mnist", tmp_path, verify=False)
  assert not isinstance(err2.value, jd.ChecksumError)


def test_corrupt_har_label_file_is_caught_before_the_unavailable_error(tmp_path, data_dir,
                                                                        monkeypatch):
  monkeypatch.delenv("JAXDP_DATA_DIR", raising=False)
  _link_folder(data_dir / "uci-har", tmp_path / "uci-har", skip=("y_test.txt",))
  text = (data_dir / "uci-har" / "y_test.txt").read_text()
  (tmp_path / "uci-har" / "y_test.txt").write_text(text.replace("5", "4", 1))
  with pytest.raises(jd.ChecksumError, match="uci-har/y_test.txt"):
    jd.load("har", tmp_path)


def test_missing_files_error_lists_every_place(tmp_path, monkeypatch):
  monkeypatch.delenv("JAXDP_DATA_DIR", raising=False)
  with pytest.raises(jd.DatasetNotFoundError) as err:
    jd.load("adult", tmp_path)
  msg = str(err.value)
  assert isinstance(err.value, FileNotFoundError)
  assert "adult/adult.data" in msg and "adult/adult.test" in msg
  assert str(tmp_path / "adult" / "adult.data") in msg
  assert "$JAXDP_DATA_DIR: not set" in msg
  assert "TFDS" in msg and "'adult'" in msg


def test_partial_folder_names_only_the_missing_file(tmp_path, data_dir, monkeypatch):
  monkeypatch.setenv("JAXDP_DATA_DIR", str(tmp_path / "does-not-exist"))
  (tmp_path / "adult").mkdir()
  (tmp_path / "adult" / "adult.data").symlink_to(data_dir / "adult" / "adult.data")
  with pytest.raises(jd.DatasetNotFoundError) as err:
    jd.load("adult", tmp_path)
  msg = str(err.value)
  assert "missing adult/adult.test" in msg and "missing adult/adult.data" not in msg
  assert "does-not-exist: not a directory" in msg


def test_mnist_missing_everywhere_reports_tfds(tmp_path, monkeypatch):
  monkeypatch.delenv("JAXDP_DATA_DIR", raising=False)
  with pytest.raises(jd.DatasetNotFoundError) as err:
    jd.load("mnist", tmp_path, tfds_data_dir=str(tmp_path / "tfds"))
  msg = str(err.value)
  assert "mnist/train-images-idx3-ubyte.gz" in msg and "TFDS" in msg
  with pytest.raises(jd.DatasetNotFoundError, match=r"not tried \(use_tfds=False\)"):
    jd.load("mnist", tmp_path, use_tfds=False)


def test_resolution_order(tmp_path, data_dir, monkeypatch):
  """Explicit data_dir first; a folder lacking the files falls through to $JAXDP_DATA_DIR."""
  _link_folder(data_dir / "bank-marketing", tmp_path / "mine" / "bank-marketing")
  monkeypatch.setenv("JAXDP_DATA_DIR", str(data_dir))
  ds = jd.load("bank", tmp_path / "mine")
  assert ds.info["source"] == f"data_dir argument={tmp_path / 'mine'}"
  (tmp_path / "empty").mkdir()
  ds_env = jd.load("bank", tmp_path / "empty")
  assert ds_env.info["source"] == f"$JAXDP_DATA_DIR={data_dir}"
  np.testing.assert_array_equal(ds.x_train, ds_env.x_train)
  # The dataset's own folder also works as data_dir.
  assert jd.load("bank", tmp_path / "mine" / "bank-marketing").num_train == 36169


def test_relative_data_dirs_are_made_absolute(tmp_path, data_dir, monkeypatch):
  """The README's ``JAXDP_DATA_DIR=../shared/data`` is relative: it is resolved against the
  cwd when read, so the source reported (and anything linked from it) survives a chdir."""
  monkeypatch.chdir(data_dir.parent)
  relative = os.path.join(os.curdir, data_dir.name)
  monkeypatch.setenv("JAXDP_DATA_DIR", relative)
  env_dir = jd.env_data_dir()
  assert env_dir.is_absolute() and env_dir.samefile(data_dir)
  (tmp_path / "empty").mkdir()
  for ds, where in ((jd.load("bank", tmp_path / "empty"), "$JAXDP_DATA_DIR="),
                    (jd.load("bank", relative), "data_dir argument=")):
    assert ds.info["source"].startswith(where), ds.info["source"]
    reported = pathlib.Path(ds.info["source"][len(where):])
    assert reported.is_absolute() and reported.samefile(data_dir), ds.info["source"]
  # A link made from the resolved path still points at the data after leaving the folder.
  (tmp_path / "link").symlink_to(env_dir / "bank-marketing")
  monkeypatch.chdir(tmp_path)
  assert jd.load("bank", tmp_path / "link").num_train == 36169
  monkeypatch.delenv("JAXDP_DATA_DIR")
  assert jd.env_data_dir() is None


def test_bad_arguments():
  with pytest.raises(ValueError, match="name must be one of"):
    jd.load("cifar10")
  with pytest.raises(ValueError, match="split must be one of"):
    jd.load("digits", split="validation")
  with pytest.raises(ValueError, match="unit_ball must be"):
    jd.load("digits", unit_ball="sphere")
  with pytest.raises(ValueError, match="num_classes must be an int in \\[1, 10\\]"):
    jd.load("digits", num_classes=11)
  with pytest.raises(ValueError, match="test_fraction must be in \\(0, 1\\)"):
    jd.load("digits", test_fraction=1.0)
  with pytest.raises(ValueError, match="split must be 'official' for mnist"):
    jd.load_mnist(split="random")


@pytest.mark.parametrize("loader, kwargs, match", [
    (jd.load_kddcup99, dict(unit_ball="sphere"), "unit_ball must be"),
    (jd.load_adult, dict(split="bogus"), r"split must be one of \('official', 'random'\)"),
    (jd.load_adult, dict(split="random", test_fraction=0.0), r"test_fraction must be in \(0, 1\)"),
    (jd.load_bank, dict(split_seed=-1), "split_seed must be an int >= 0"),
    (jd.load_bank, dict(test_fraction="a fifth"), r"test_fraction must be in \(0, 1\)"),
    (jd.load_mnist, dict(split="random"), "split must be 'official' for mnist"),
    (jd.load_har, dict(unit_ball="sphere"), "unit_ball must be"),
])
def test_bad_options_are_refused_before_files_are_looked_for(tmp_path, monkeypatch, loader,
                                                             kwargs, match):
  """The shared option check runs first: an empty folder still gives the argument's error."""
  monkeypatch.delenv("JAXDP_DATA_DIR", raising=False)
  with pytest.raises(ValueError, match=match):
    loader(tmp_path, use_tfds=False, **kwargs)


def test_split_options_are_checked_only_where_a_split_is_drawn(tmp_path, monkeypatch):
  """Adult's official split uses its test file, so test_fraction is not read (nor refused)."""
  monkeypatch.delenv("JAXDP_DATA_DIR", raising=False)
  with pytest.raises(jd.DatasetNotFoundError):
    jd.load_adult(tmp_path, test_fraction=5.0, use_tfds=False)


def test_malformed_records_and_labels_are_named(tmp_path):
  from jaxdp.data import adult, bank
  good = "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, " \
         "Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K"
  path = tmp_path / "adult.data"
  path.write_text(f"{good}\n{good.replace(', 40,', ',')}\n")
  with pytest.raises(ValueError, match="record 1 has 14 fields, expected 15"):
    adult.parse_adult_file(path)
  path.write_text(f"{good}\n{good.replace('<=50K', 'rich')}\n")
  with pytest.raises(ValueError, match=r"unexpected labels \['rich'\]"):
    adult.parse_adult_file(path)
  path.write_text(f"{good}\n{good.replace('<=50K', '>50K.')}\n")
  fields, labels = adult.parse_adult_file(path)
  assert fields.shape == (2, 14) and labels.tolist() == [0, 1] and labels.dtype == np.int32
  header = ";".join(f'"{a}"' for a in (*bank.ATTRIBUTES, "y"))
  csv = tmp_path / "bank-full.csv"
  csv.write_text(header + '\n58;"management";"married";"tertiary";"no";2143;"yes";"no";'
                 '"unknown";5;"may";261;1;-1;0;"unknown";"maybe"\n')
  with pytest.raises(ValueError, match=r"unexpected labels \['maybe'\]"):
    bank.parse_bank_file(csv)
