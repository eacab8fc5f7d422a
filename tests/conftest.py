"""Shared pytest fixtures."""

import os
import pathlib
import shutil
import tempfile

# Compile with XLA:CPU's elemental emitters instead of its fusion emitters: the
# same programs, compiled in about 40% less CPU time on this suite's small shapes
# (measured: 52 -> 32 s user on the clipping and additive-mechanism tests). Set
# before the first computation; subprocesses inherit it through the environment,
# and tests that set XLA_FLAGS for a subprocess append to it.
# LLVM's expensive passes are skipped for the same reason (the suite's CPU time fell 5-8% on the
# DP-SGD and conformance tests: 64 -> 59 s and 115 -> 110 s with 2 workers).
for _flag in ("--xla_cpu_use_fusion_emitters=false", "--xla_llvm_disable_expensive_passes=true"):
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest

from jaxdp.data import resolve as jdata_resolve

jax.config.update("jax_enable_x64", False)

# Compile with XLA's optimisation passes off. The suite runs small shapes, where
# compiling dominates (a third of the run with them on); results are checked
# against references computed in the same test, never against timings. Set
# JAX_DISABLE_MOST_OPTIMIZATIONS=0 to test with the optimiser on. Subprocesses
# that tests start inherit the setting through the environment.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
jax.config.update(
    "jax_disable_most_optimizations",
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"].lower() not in ("0", "false", ""))

_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def pytest_configure(config):
  """One persistent XLA compilation cache per test run, shared by every process of the run.

  Compilation dominates this suite on a CPU, and the two ``pytest-xdist`` workers
  (and the subprocesses some tests start) compile many of the same programs: with
  a shared on-disk cache a program is compiled once per run. The cache starts
  empty (a fresh temporary folder, removed at the end), so no result depends on
  an earlier run. Workers and subprocesses inherit the folder through the
  environment. Set ``JAX_COMPILATION_CACHE_DIR`` yourself to use another folder,
  or ``JAXDP_TEST_COMPILATION_CACHE=0`` to turn it off.
  """
  if os.environ.get("JAXDP_TEST_COMPILATION_CACHE", "1") == "0":
    return
  if hasattr(config, "workerinput") or os.environ.get(_CACHE_ENV):
    cache_dir = os.environ.get(_CACHE_ENV)  # set by the controller (or the user)
  else:
    cache_dir = tempfile.mkdtemp(prefix="jaxdp-tests-xla-cache-")
    config._jaxdp_cache_dir = cache_dir  # pylint: disable=protected-access
    os.environ[_CACHE_ENV] = cache_dir
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
  if cache_dir:
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
  cache_dir = getattr(config, "_jaxdp_cache_dir", None)
  if cache_dir:
    shutil.rmtree(cache_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
  """Directory of the offline datasets, from the JAXDP_DATA_DIR environment variable."""
  value = os.environ.get("JAXDP_DATA_DIR")
  if not value:
    pytest.skip("JAXDP_DATA_DIR is not set; it must point at the offline datasets (shared/data).")
  # Absolute, as the library resolves it: tests symlink files from here into tmp_path.
  path = jdata_resolve.env_data_dir()
  if not path.is_dir():
    pytest.skip(f"JAXDP_DATA_DIR={value} is not a directory.")
  return path
