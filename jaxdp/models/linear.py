"""Linear (multinomial logistic) classifier as a Flax linen module.

``logits = theta^T x + b`` over flattened inputs: the linear model phi'(x; theta)
of paper ``000_tradeoffs_of_private_prediction.md`` Section 2 / Assumption 3,
here trained with DP-SGD (Section 3.1, Equation 4).
"""

from __future__ import annotations

import flax.linen as nn
import jax


class LinearClassifier(nn.Module):
  """``x -> Dense(num_classes)(flatten(x))``.

  Attributes:
    num_classes: number of output logits C.
    use_bias: whether to add a bias (the paper's linear model has none; DP-SGD
      can train either).
  """

  num_classes: int = 10
  use_bias: bool = True

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape((x.shape[0], -1))
    return nn.Dense(self.num_classes, use_bias=self.use_bias)(x)
