"""experiments/tradeoffs.py: selection="composition" selects with jaxdp.training.private_argmax;
selection="repeat_and_select" (and account_selection=True) with jaxdp.tuning.repeat_and_select.

Tiny grid on the embedded digits set (model sensitivity: certified fits, no teachers).
"""

import json

import numpy as np
import pytest

import _experiment_scripts

from jaxdp import results_io
from jaxdp.training import selection

_load = _experiment_scripts.load  # experiment scripts once per process


def _tiny(tmp_path, **over):
  config = _load("configs/tradeoffs.py").get_config("fig1")
  config.n_train = 0
  config.axis_values = (10.0,)
  config.epsilons = (10.0,)
  config.deltas = (1e-5,)
  config.methods = ("model_sensitivity",)
  config.l2_regs = (1e-3, 1e-2)
  config.num_teachers = 0
  config.num_seeds = 2
  config.val_seeds = 2
  config.out_dir = str(tmp_path)
  for k, v in over.items():
    config[k] = v
  return config


def _spy(monkeypatch):
  calls = []
  original = selection.private_argmax

  def spy(key, scores, *, sensitivity, epsilon):
    calls.append(dict(scores=np.asarray(scores), sensitivity=sensitivity, epsilon=epsilon))
    return original(key, scores, sensitivity=sensitivity, epsilon=epsilon)

  monkeypatch.setattr(selection, "private_argmax", spy)
  return calls


def test_accounted_selection_is_private_argmax_with_its_share(tmp_path, monkeypatch):
  experiment = _load("experiments/tradeoffs.py")
  calls = _spy(monkeypatch)
  config = _tiny(tmp_path, selection="composition")
  rows = experiment.main(config)
  assert len(rows) == 1 and len(calls) == 1
  row, call = rows[0], calls[0]
  # 2 lambdas x 2 validation draws + 1 final release + the selection: k = 6 shares of eps;
  # delta over the 5 (eps, delta) releases (the selection is pure DP).
  assert row["release_epsilon"] == pytest.approx(10.0 / 6)
  assert row["selection_epsilon"] == pytest.approx(10.0 / 6)
  assert row["release_delta"] == pytest.approx(1e-5 / 5)
  assert 5 * row["release_epsilon"] + row["selection_epsilon"] == pytest.approx(10.0)
  assert 5 * row["release_delta"] == pytest.approx(1e-5)
  assert call["epsilon"] == pytest.approx(10.0 / 6)
  # scores: correct held-out answers summed over the 2 draws; one row moves each by <= 2
  assert call["sensitivity"] == 2.0
  scores = call["scores"]
  assert scores.shape == (2,) and np.all(scores == np.rint(scores)) and np.all(scores >= 0)
  assert row["selection"] == "exponential_mechanism"
  assert "val_accuracy" not in row and 0.0 <= row["nonprivate_val_accuracy"] <= 1.0
  # the counts are those of the chosen candidate's accuracy: count / (2 n_val)
  chosen = [1e-3, 1e-2].index(row["l2_reg"])
  n_val = scores[chosen] / (2 * row["nonprivate_val_accuracy"])
  assert n_val == pytest.approx(round(n_val), abs=1e-3) and n_val > 100
  # resumable: a second run computes nothing and makes no new selection
  again = experiment.main(config)
  assert len(calls) == 1
  assert again[0]["test_accuracy_mean"] == row["test_accuracy_mean"]


def test_paper_protocol_does_not_call_it_and_other_protocols_rows_are_not_resumed(
    tmp_path, monkeypatch):
  experiment = _load("experiments/tradeoffs.py")
  calls = _spy(monkeypatch)
  rows = experiment.main(_tiny(tmp_path, account_selection=False))
  assert calls == []
  assert rows[0]["selection"] == "argmax_not_accounted"
  assert rows[0]["release_epsilon"] == 10.0 and rows[0]["selection_epsilon"] == 0.0
  # A log of another accounted protocol (np.argmax, no "selection" setting) has another
  # fingerprint: its rows are not resumed.
  config = experiment.resolve_config(_tiny(tmp_path, selection="composition"))
  other_log, out = results_io.open_point_log(config, experiment.RESULT_FIELDS,
                                           extra_settings=dict(dpsgd=config.dpsgd.to_dict()))
  for point in experiment.grid(config):
    other_log.append(point, [dict(rows[0], release_epsilon=2.0)])
  experiment.main(_tiny(tmp_path, selection="composition"))
  assert len(calls) == 1
  meta = json.loads((out / "results.json").read_text())
  assert meta["points_computed_this_run"] == 1


def _spy_search(monkeypatch):
  from jaxdp import tuning  # pylint: disable=import-outside-toplevel
  calls = []
  original = tuning.repeat_and_select

  def spy(key, mechanism, candidates, *, repetitions, event, accountant=None, **kw):
    out = original(key, mechanism, candidates, repetitions=repetitions, event=event,
                   accountant=accountant, **kw)
    calls.append(dict(repetitions=repetitions, event=event, accountant=accountant, out=out,
                      candidates=list(candidates)))
    return out

  monkeypatch.setattr(tuning, "repeat_and_select", spy)
  return calls


@pytest.mark.parametrize("delta", [0.0, 1e-5])
def test_repeat_and_select_meets_the_total_and_releases_the_best_run(tmp_path, monkeypatch, delta):
  from jaxdp import tuning  # pylint: disable=import-outside-toplevel
  from jaxdp.accounting import events  # pylint: disable=import-outside-toplevel
  experiment = _load("experiments/tradeoffs.py")
  argmax_calls = _spy(monkeypatch)
  calls = _spy_search(monkeypatch)
  config = _tiny(tmp_path, account_selection=True, deltas=(delta,), num_seeds=2,
                 repetitions=3.0, score_fraction=0.25)
  (row,) = experiment.main(config)
  assert argmax_calls == [] and len(calls) == 2  # one search per seed, no exponential mechanism
  assert row["selection"] == "repeat_and_select" and row["num_draws"] == 2
  eps_run = row["release_epsilon"] + row["selection_epsilon"]
  assert row["selection_epsilon"] == pytest.approx(0.25 * eps_run)
  if delta == 0.0:
    assert eps_run == pytest.approx(10.0 / 2)  # logarithmic K: 2 eps_run (PS22 Thm 2, eta = 0)
  else:
    assert eps_run >= 10.0 / 2
  for call in calls:
    assert call["repetitions"] == tuning.LogarithmicRepetitions(3.0)
    assert call["candidates"] == [0, 1]
    assert call["event"] == events.ComposedDpEvent([
        events.PureDpEvent(row["release_epsilon"], neighbouring="replace_one"),
        events.LaplaceDpEvent(1.0 / row["selection_epsilon"], neighbouring="replace_one")])
    # the search's ONE event, spent before any run, meets the point's (eps, delta)
    assert call["accountant"].ledger == ((tuning.LogarithmicRepetitions(3.0).event(call["event"]),
                                          1),)
    assert call["accountant"].get_epsilon(delta) <= 10.0 * (1 + 1e-9)
    assert call["out"].release.shape == (64, 10)  # the best run's model is the release
  chosen = [float(v) for v in str(row["chosen_l2_regs"]).split(";")]
  assert len(chosen) == 2 and set(chosen) <= {1e-3, 1e-2}
  assert 0.0 <= row["test_accuracy_mean"] <= 1.0 and np.isnan(row["nonprivate_val_accuracy"])
  # resumable: a second run searches nothing
  again = experiment.main(config)
  assert len(calls) == 2 and again[0]["test_accuracy_mean"] == row["test_accuracy_mean"]


def test_selection_modes_refuse_bad_settings(tmp_path):
  experiment = _load("experiments/tradeoffs.py")
  with pytest.raises(ValueError, match="config.selection must be one of"):
    experiment.main(_tiny(tmp_path, selection="grid"))
  with pytest.raises(ValueError, match="contradicts"):
    experiment.main(_tiny(tmp_path, selection="none", account_selection=True))
  with pytest.raises(ValueError, match="repeat_and_select.*subset"):
    experiment.main(_tiny(tmp_path, selection="repeat_and_select",
                          methods=("model_sensitivity", "subsample_aggregate")))
  with pytest.raises(ValueError, match="repetitions"):
    experiment.main(_tiny(tmp_path, selection="repeat_and_select", repetitions=1.0))
