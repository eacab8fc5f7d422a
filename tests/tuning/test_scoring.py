"""Private validation scores: noise laws and events from the theorems, argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdp import tuning
from jaxdp.accounting import events


def test_private_accuracy_laplace_noise_and_event():
  labels = np.array([0, 1, 1, 0, 2, 2, 1, 0])
  preds = np.array([0, 1, 0, 0, 2, 1, 1, 1])  # 5 correct
  keys = jax.random.split(jax.random.key(0), 4000)
  scores = np.array(jax.vmap(lambda k: tuning.private_accuracy(k, preds, labels, epsilon=0.5)[0])(keys))
  noise = scores * 8 - 5.0  # Lap(1/0.5) on the count
  assert stats.kstest(noise, stats.laplace(scale=2.0).cdf).pvalue > 1e-4
  _, event = tuning.private_accuracy(keys[0], preds, labels, epsilon=0.5)
  assert event == events.LaplaceDpEvent(2.0, neighbouring="replace_one")


def test_private_accuracy_gaussian_zcdp_and_public_normaliser():
  labels = np.zeros(10, np.int32)
  keys = jax.random.split(jax.random.key(1), 4000)
  f = jax.vmap(lambda k: tuning.private_accuracy(k, labels, labels, rho=0.5, mechanism="gaussian",
                                                 neighbouring="add_remove", num_examples=20)[0])
  noise = np.array(f(keys)) * 20 - 10.0  # N(0, 1/(2 rho)) = N(0, 1)
  assert stats.kstest(noise, stats.norm(scale=1.0).cdf).pvalue > 1e-4
  _, event = tuning.private_accuracy(keys[0], labels, labels, rho=0.5, mechanism="gaussian",
                                     neighbouring="add_remove")
  assert event.noise_multiplier == pytest.approx(1.0) and event.neighbouring == "add_remove"


def test_private_loss_clips_to_bound():
  losses = np.array([0.5, 7.0, -1.0, np.inf, np.nan])  # clipped: 0.5, 2, 0, 2, 2 -> 6.5
  keys = jax.random.split(jax.random.key(2), 4000)
  f = jax.vmap(lambda k: tuning.private_loss(k, losses, bound=2.0, epsilon=1.0)[0])
  noise = np.array(f(keys)) * 5 - 6.5  # Lap(B/eps) = Lap(2)
  assert stats.kstest(noise, stats.laplace(scale=2.0).cdf).pvalue > 1e-4
  assert tuning.private_loss(keys[0], losses, bound=2.0, epsilon=1.0)[1] == \
      events.LaplaceDpEvent(1.0, neighbouring="replace_one")  # b / Delta = 1 / eps


def test_bad_arguments_name_them():
  key = jax.random.key(3)
  y = np.array([0, 1])
  with pytest.raises(ValueError, match="epsilon"):
    tuning.private_accuracy(key, y, y)
  with pytest.raises(ValueError, match="epsilon"):
    tuning.private_accuracy(key, y, y, epsilon=-1.0)
  with pytest.raises(ValueError, match="mechanism"):
    tuning.private_accuracy(key, y, y, epsilon=1.0, mechanism="cauchy")
  with pytest.raises(ValueError, match="same shape"):
    tuning.private_accuracy(key, y, np.array([0, 1, 1]), epsilon=1.0)
  with pytest.raises(ValueError, match="labels"):
    tuning.private_accuracy(key, y, np.array([0.5, 1.0]), epsilon=1.0)
  with pytest.raises(ValueError, match="num_examples"):
    tuning.private_accuracy(key, y, y, epsilon=1.0, num_examples=0)
  with pytest.raises(ValueError, match="bound"):
    tuning.private_loss(key, np.ones(3), bound=0.0, epsilon=1.0)
  with pytest.raises(ValueError, match="delta"):
    tuning.private_accuracy(key, y, y, epsilon=1.0, delta=0.0, mechanism="gaussian")
