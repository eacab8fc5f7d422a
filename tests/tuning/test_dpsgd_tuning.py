"""tune_dpsgd: one dominating per-run event, calibration to the whole tuning, end to end."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from jaxdp import tuning
from jaxdp.accounting import PrivacyAccountant, dpsgd_event, events


class Linear(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x)


def _data(n=64, d=3, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32)
  return x, y


SPACE = {"learning_rate": [0.1, 0.5], "l2_clip_norm": [1.0], "epochs": [1.0, 2.0]}
LAW = tuning.GeometricRepetitions(2.0)


def test_bad_arguments_before_anything():
  x, y = _data()
  key = jax.random.key(0)
  common = dict(delta=1e-5, repetitions=LAW, score_epsilon=0.5, noise_multiplier=1.0,
                sample_rate=0.25)
  with pytest.raises(ValueError, match="epochs"):
    tuning.tune_dpsgd(key, Linear(), x, y, x, y, search_space=dict(SPACE, epochs=lambda k: 1.0),
                      **common)
  with pytest.raises(ValueError, match="search_space"):
    tuning.tune_dpsgd(key, Linear(), x, y, x, y, search_space={"learning_rate": [0.1]}, **common)
  with pytest.raises(ValueError, match="noise_strategy"):
    tuning.tune_dpsgd(key, Linear(), x, y, x, y, search_space=SPACE, noise_strategy="x", **common)
  with pytest.raises(ValueError, match="target_epsilon"):
    tuning.tune_dpsgd(key, Linear(), x, y, x, y, search_space=SPACE, delta=1e-5, repetitions=LAW,
                      score_epsilon=0.5, sample_rate=0.25, target_epsilon=0.01)


def test_calibration_meets_the_whole_tuning_target():
  from jaxdp.tuning import dpsgd_tuning
  score = events.LaplaceDpEvent(2.0, neighbouring="add_remove")
  sigma = dpsgd_tuning._calibrate_sigma(4.0, 1e-5, 0.25, 8, score, LAW)  # pylint: disable=protected-access

  def eps(s):
    acc = PrivacyAccountant()
    acc.spend(LAW.event(events.ComposedDpEvent([dpsgd_event(s, 0.25, 8), score])))
    return acc.get_epsilon(1e-5, "rdp")
  assert eps(sigma) <= 4.0 < eps(sigma * 0.9)  # met, and not far above the smallest sigma


@pytest.mark.slow
def test_end_to_end_spends_the_dominating_event_once():
  x, y = _data()
  xv, yv = _data(32, seed=1)
  acc = PrivacyAccountant()
  out = tuning.tune_dpsgd(jax.random.key(1), Linear(), x, y, xv, yv, search_space=SPACE,
                          delta=1e-5, repetitions=LAW, score_epsilon=0.5, target_epsilon=8.0,
                          sample_rate=0.25, accountant=acc)
  long_run = dpsgd_event(out.noise_multiplier, 0.25, 8)  # ceil(2 / 0.25) steps
  score = events.LaplaceDpEvent(2.0, neighbouring="add_remove")
  assert out.per_run_event == events.ComposedDpEvent([long_run, score])
  assert acc.ledger == ((LAW.event(out.per_run_event), 1),)
  assert acc.get_epsilon(1e-5, "rdp") == pytest.approx(out.epsilon) and out.epsilon <= 8.0
  assert out.hyperparameters["epochs"] in (1.0, 2.0)
  assert out.hyperparameters["learning_rate"] in (0.1, 0.5)
  assert np.isfinite(out.score)
  assert jax.tree.leaves(out.params)[0].shape in ((2,), (3, 2))
