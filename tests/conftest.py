"""Shared pytest fixtures."""

import os
import pathlib

import jax
import pytest

from jaxdp.data import resolve as jdata_resolve

jax.config.update("jax_enable_x64", False)


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
