"""Runs a notebook as a user would (nbclient + ipykernel), for the notebook tests."""

import os

import pytest


def execute(notebook, tmp_path, env_data_dir, timeout: int) -> str:
  """Executes ``notebook`` with ``$JAXDP_DATA_DIR`` set to ``env_data_dir`` (unset: None).

  The kernel inherits this process's environment, which is restored afterwards.
  Returns the text of every output, in order.
  """
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  pytest.importorskip("ipykernel")
  nb = nbformat.read(notebook, as_version=4)
  old = os.environ.get("JAXDP_DATA_DIR")
  try:
    if env_data_dir is None:
      os.environ.pop("JAXDP_DATA_DIR", None)
    else:
      os.environ["JAXDP_DATA_DIR"] = str(env_data_dir)
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
  finally:
    if old is None:
      os.environ.pop("JAXDP_DATA_DIR", None)
    else:
      os.environ["JAXDP_DATA_DIR"] = old
  text = []
  for cell in nb.cells:
    for out in cell.get("outputs", []):
      text.append(out.get("text", "") + str(out.get("data", {}).get("text/plain", "")))
  return "\n".join(text)
