"""Multi-layer perceptron for MNIST (Flax linen).

The fully connected network of DP-SGD's MNIST experiments (Abadi et al. 2016,
cited as [1] in ``004_dp_machine_learning_survey.md`` Section 4.2): hidden
layers with a pointwise non-linearity and a softmax output.
"""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax


class MLP(nn.Module):
  """``flatten -> [Dense(h) -> activation] * len(hidden_sizes) -> Dense(C)``.

  Attributes:
    hidden_sizes: widths of the hidden layers.
    num_classes: number of output logits.
    activation: pointwise non-linearity (bounded ones such as tanh often work
      better under DP-SGD because activations, hence gradients, stay bounded).
  """

  hidden_sizes: Sequence[int] = (256,)
  num_classes: int = 10
  activation: Callable[[jax.Array], jax.Array] = nn.relu

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape((x.shape[0], -1))
    for h in self.hidden_sizes:
      x = self.activation(nn.Dense(h)(x))
    return nn.Dense(self.num_classes)(x)
