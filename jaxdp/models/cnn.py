"""Small convolutional network for MNIST (Flax linen).

The two-convolution network used by the TensorFlow Privacy / Opacus DP-SGD
MNIST examples (Conv 16@8x8 stride 2, max-pool 2 stride 1, Conv 32@4x4 stride 2,
max-pool 2 stride 1, Dense 32, Dense 10; about 26k parameters). It has no
batch normalisation, whose statistics mix examples and break per-example
clipping (paper ``000_tradeoffs_of_private_prediction.md`` Section 4.3).
"""

from __future__ import annotations

import flax.linen as nn
import jax


class SmallCNN(nn.Module):
  """MNIST CNN; accepts (B, 784), (B, 28, 28) or (B, 28, 28, 1) inputs.

  Attributes:
    num_classes: number of output logits.
    image_size: side of the square input image (28 for MNIST).
  """

  num_classes: int = 10
  image_size: int = 28

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape((x.shape[0], self.image_size, self.image_size, -1))
    x = nn.Conv(16, (8, 8), strides=(2, 2), padding=((3, 3), (3, 3)))(x)
    x = nn.relu(x)
    x = nn.max_pool(x, (2, 2), strides=(1, 1))
    x = nn.Conv(32, (4, 4), strides=(2, 2), padding="VALID")(x)
    x = nn.relu(x)
    x = nn.max_pool(x, (2, 2), strides=(1, 1))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(32)(x))
    return nn.Dense(self.num_classes)(x)
