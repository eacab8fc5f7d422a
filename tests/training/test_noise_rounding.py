"""The private linear methods hand float32 noise scales rounded towards MORE noise."""

import jax
import numpy as np

from jaxdp.training import functional_mechanism, objective_perturbation, output_perturbation


def _data(n=60, d=3, c=2, seed=0):  # the (60, 3) shape of the other files' fits (shared compiles)
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d))
  x = (x / np.linalg.norm(x, axis=1, keepdims=True) * 0.9).astype(np.float32)
  return x, rng.integers(0, c, n).astype(np.int32)


def test_output_perturbation_noise_uses_rounded_scale(monkeypatch):
  seen = {}
  original = output_perturbation._add_noise

  def spy(key, weights, scale, noise):
    seen["scale"] = scale
    return original(key, weights, scale, noise)

  monkeypatch.setattr(output_perturbation, "_add_noise", spy)
  x, y = _data()
  for delta in (0.0, 1e-5):
    res = output_perturbation.model_sensitivity(jax.random.key(0), x, y, num_classes=2, l2_reg=0.1,
                                                epsilon=0.7, delta=delta)
    exact = float(res.calibration.scale)
    used = float(np.asarray(seen["scale"], np.float64))
    if res.calibration.noise == "l2_laplace":
      assert used <= exact  # beta is an inverse scale: rounded down
    else:
      assert used >= exact  # sigma rounded up
    assert abs(used - exact) <= 1e-6 * exact


def test_objective_and_functional_mechanism_scales_round_towards_more_noise(monkeypatch):
  from jaxdp.mechanisms import noise_scale_as
  # The helper the modules call: beta = 1/3 is not a float32, so the direction is visible.
  assert float(noise_scale_as(1 / 3, np.float32, round_up=True)) >= 1 / 3
  assert float(noise_scale_as(1 / 3, np.float32, round_up=False)) <= 1 / 3
  x, y = _data()
  res = objective_perturbation.loss_perturbation(jax.random.key(1), x, y, num_classes=2, epsilon=1.3,
                                                 l2_reg=0.1, tol=1e-5,
                                                 return_nonprivate_diagnostics=True)
  assert bool(res.nonprivate_info.solver.converged)
  theta = functional_mechanism.functional_mechanism(jax.random.key(2), x, (y * 2 - 1) * 0.5,
                                                    epsilon=1.3, task="linear", l2_reg=0.1)
  assert np.all(np.isfinite(np.asarray(theta.weights)))
