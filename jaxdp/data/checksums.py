"""Known SHA-256 checksums of the offline dataset files, and cached verification.

The hashes are embedded here (copied from ``../shared/data/SHA256SUMS`` and its
README, which checks them against the published MD5s of the originals), so a
user's data folder does not need a ``SHA256SUMS`` file, and a tampered
``SHA256SUMS`` cannot make a wrong file pass.

Hashing the ~25 MB of files takes ~0.1 s; results are cached per
``(real path, size, mtime_ns)``, so a file that is replaced or edited is hashed
again, while repeated loads of an unchanged file are free.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import threading

from jaxdp.data.base import ChecksumError

# Keys are paths relative to the data folder, as in ../shared/data/SHA256SUMS.
SHA256: dict[str, str] = {
    "adult/adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    "adult/adult.names": "c248284c0b5de30c9e1958d6cdd168a34a654758b620e68f46aefa83fc0a576a",
    "adult/adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
    "bank-marketing/bank-full.csv": "d1513ec63b385506f7cfce9f2c5caa9fe99e7ba4e8c3fa264b3aaf0f849ed32d",
    "bank-marketing/bank-names.txt": "3899a77082573ed676a7dfce3765a5307915c7f11b1fe2f6f55fd3c5467c12f7",
    "kddcup99/corrected.gz": "74f0daef49b242badc09f2adbd457dea6a45b4f77177efbd11216d333651044b",
    "kddcup99/kddcup.data_10_percent.gz": "8045aca0d84e70e622d1148d7df782496f6333bf6eb979a1b0837c42a9fd9561",
    "kddcup99/kddcup.names": "4b903fb4d68c17d02b5c776998c21fa9d9d8b018348849bed7aadeda21893386",
    "mnist/t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "mnist/t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    "mnist/train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "mnist/train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "uci-har/activity_labels.txt": "f6e6b292704438261f0283b2a82659ab0661447dc16520938bdf379ed1bf8de0",
    "uci-har/features.txt": "b384889885b1c8680ecf250e0e605b4c79536cdf09ce9f2fa7225a3c6773b5c7",
    "uci-har/subject_test.txt": "63b8c577f4a85431c06bd87f6384608c90a9f72f05c7956dd21255dc63515c07",
    "uci-har/subject_train.txt": "66e1e2fbe9b396fa5155f531dc3348c803f503be663e2318772d49947db9153a",
    "uci-har/y_test.txt": "2a94cb53ca46b956c1b2aebd4a09a72badd8a8e9ea9cdfe9f31b3306a08666bb",
    "uci-har/y_train.txt": "415b3357e2e2d5e70a45c781947c6bdd80e0410a579d862eedcd6bbce3c694ef",
}

_CACHE: dict[tuple[str, int, int], str] = {}
_LOCK = threading.Lock()


def file_sha256(path: str | os.PathLike) -> str:
  """Hex SHA-256 of a file, cached per ``(real path, size, mtime_ns)``."""
  real = os.path.realpath(path)
  st = os.stat(real)
  key = (real, st.st_size, st.st_mtime_ns)
  with _LOCK:
    hit = _CACHE.get(key)
  if hit is not None:
    return hit
  digest = hashlib.sha256()
  with open(real, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  out = digest.hexdigest()
  with _LOCK:
    _CACHE[key] = out
  return out


def clear_checksum_cache() -> None:
  """Forgets every cached hash (the next verification re-reads the files)."""
  with _LOCK:
    _CACHE.clear()


def expected_sha256(relpath: str) -> str | None:
  """The embedded SHA-256 of ``relpath`` (e.g. ``"mnist/t10k-labels-idx1-ubyte.gz"``), or None."""
  return SHA256.get(relpath)


def verify_file(path: str | os.PathLike, relpath: str) -> None:
  """Checks ``path`` has the SHA-256 that jaxdp knows for ``relpath``.

  Files without a known hash (e.g. a user's own UCI HAR ``X_train.txt``) are not
  checked here; their loader checks their shape instead.

  Raises:
    ChecksumError: naming the file, the expected and the actual hash.
  """
  expected = SHA256.get(relpath)
  if expected is None:
    return
  actual = file_sha256(path)
  if actual != expected:
    raise ChecksumError(
        f"checksum mismatch for {relpath} at {pathlib.Path(path)}: expected SHA-256 "
        f"{expected}, got {actual}. The file is corrupt or not the original; "
        "replace it with the original (see shared/data/README.md), or pass "
        "verify=False to load it anyway."
    )
