"""jaxdp.results_io: the resumable point log and strict JSON helpers."""

import json
import logging
import math

import pytest

from jaxdp import results_io


def test_point_log_round_trip_torn_line_and_fingerprint(tmp_path):
  path = tmp_path / "run" / "points.jsonl"
  log = results_io.PointLog(path, {"seed": 0})
  log.append(("non_private", math.inf, 0.0), [{"epsilon": math.inf, "acc": 0.9}])
  log.append(("lp", 1.0, 1e-5), [{"epsilon": 1.0, "acc": 0.5}])
  with open(path, "a") as f:
    f.write('{"key": ["lp", 3.0')  # killed mid-write
  again = results_io.PointLog(path, {"seed": 0})
  assert len(again) == 2 and ("lp", 1.0, 1e-5) in again and ("lp", 3.0, 1e-5) not in again
  assert again.get(("non_private", math.inf, 0.0)) == [{"epsilon": math.inf, "acc": 0.9}]
  assert path.read_text().endswith("\n")  # torn line removed, appends stay line-aligned
  for line in path.read_text().splitlines():
    json.loads(line)  # strict JSON lines (inf written as "inf")
  # Other settings: the old points are kept in the file but not reused.
  other = results_io.PointLog(path, {"seed": 1})
  assert len(other) == 0 and len(path.read_text().splitlines()) == 2


def test_point_log_rejects_a_corrupt_middle_line(tmp_path):
  path = tmp_path / "points.jsonl"
  path.write_text('not json\n{"key": [], "fingerprint": "x", "rows": []}\n')
  with pytest.raises(ValueError, match="points.jsonl:1"):
    results_io.PointLog(path, {})


def test_point_seed_and_run_dir():
  assert results_io.point_seed(("lp", 1.0, 0.0)) == results_io.point_seed(["lp", 1.0, 0.0])
  assert results_io.point_seed(("lp", 1.0, 0.0)) != results_io.point_seed(("lp", 1.0, 1e-5))
  assert 0 <= results_io.point_seed(("x",)) < 2**32
  d = results_io.run_dir("results", "exp", "mnist", n_train=1000, pca_dims=50)
  assert d.is_absolute() and d.parts[-2:] == ("exp", "mnist_n1000_pca50")
  assert results_io.from_strict_json(results_io.strict_json([math.inf, "a", 1.0])) == [
      math.inf, "a", 1.0]


def test_non_actionable_log_lines_are_silenced_and_others_kept(caplog):
  import jaxdp  # pylint: disable=import-outside-toplevel,unused-import
  from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel
  xla = logging.getLogger("jax._src.xla_bridge")
  with caplog.at_level(logging.INFO):
    xla.info("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so")
    xla.info("Unable to initialize backend 'cuda': kept")
    absl_logging.warning("_compute_log_a_frac failed to converge after 1000 iterations")
    absl_logging.warning("some other absl warning")
  messages = [r.getMessage() for r in caplog.records]
  assert "Unable to initialize backend 'cuda': kept" in messages
  assert "some other absl warning" in messages
  assert not any("'tpu'" in m or "_compute_log_a_frac" in m for m in messages), messages


def test_open_point_log_folder_fingerprint_and_missing_field(tmp_path):
  ml_collections = pytest.importorskip("ml_collections")
  config = ml_collections.ConfigDict(dict(name="exp", dataset="mnist", n_train=1000, pca_dims=0,
                                          out_dir=str(tmp_path), seed=0, batch_mode="map"))
  log, out = results_io.open_point_log(config, ("dataset", "seed"))
  assert out == tmp_path / "exp" / "mnist_n1000" and log.path == out / "points.jsonl"
  log.append(("p", 1.0), [{"acc": 0.5}])
  # A speed-only setting (not a result field) keeps the finished points; a result field does not.
  config.batch_mode = "vmap"
  again, _ = results_io.open_point_log(config, ("dataset", "seed"))
  assert again.get(("p", 1.0)) == [{"acc": 0.5}]
  config.seed = 1
  assert len(results_io.open_point_log(config, ("dataset", "seed"))[0]) == 0
  # The experiment name and jaxdp version are part of the fingerprint, and so are extras.
  config.seed = 0
  import jaxdp  # pylint: disable=import-outside-toplevel
  assert again.fingerprint == results_io.fingerprint(
      {"dataset": "mnist", "seed": 0, "experiment": "exp", "jaxdp": jaxdp.__version__})
  extra, _ = results_io.open_point_log(config, ("dataset", "seed"), extra_settings={"k": 2})
  assert len(extra) == 0 and extra.fingerprint != again.fingerprint
  with pytest.raises(KeyError, match="max_iter"):
    results_io.open_point_log(config, ("dataset", "max_iter"))
