"""The README's commands are what CI runs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_command_verbatim():
  readme = (ROOT / "README.md").read_text()
  commands = [line.strip() for line in re.findall(r"^(JAXDP_DATA_DIR=.*pytest.*)$", readme, re.M)]
  assert commands, "README has no test command"
  ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
  for command in commands:
    assert command in ci_lines, command
  # No exported data dir overriding the README's relative one.
  assert not any(line.startswith("export JAXDP_DATA_DIR") for line in ci_lines)
