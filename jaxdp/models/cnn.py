"""Small convolutional network for MNIST (Flax linen).

The two-convolution network used by the TensorFlow Privacy / Opacus DP-SGD
MNIST examples (Conv 16@8x8 stride 2, max-pool 2 stride 1, Conv 32@4x4 stride 2,
max-pool 2 stride 1, Dense 32, Dense 10; about 26k parameters). It has no
batch normalisation, whose statistics mix examples and break per-example
clipping (paper ``000_tradeoffs_of_private_prediction.md`` Section 4.3).

The stride-1 max-pools are written as an elementwise maximum of the shifted
windows (:func:`max_pool_stride1`) rather than ``nn.max_pool``: the same
values, but XLA:CPU differentiates ``reduce_window`` max with a
``select_and_scatter`` that made up most of this network's training step
(about 2.5x slower than the elementwise form, ``benchmarks/dpsgd.py``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


def max_pool_stride1(x: jax.Array, window: tuple[int, int]) -> jax.Array:
  """``nn.max_pool(x, window, strides=(1, 1))`` ("VALID") on NHWC, as a max of shifted slices.

  Equal values. Gradients are equal wherever the window maximum is unique; on
  a tie ``jnp.maximum`` splits the cotangent between the tied entries where
  ``reduce_window`` gives it to one (after a ReLU the common tie is between
  zeros, whose ReLU gradient is 0 either way).
  """
  kh, kw = window
  h, w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
  out = None
  for i in range(kh):
    for j in range(kw):
      s = x[:, i:i + h, j:j + w, :]
      out = s if out is None else jnp.maximum(out, s)
  return out


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
    x = max_pool_stride1(x, (2, 2))
    x = nn.Conv(32, (4, 4), strides=(2, 2), padding="VALID")(x)
    x = nn.relu(x)
    x = max_pool_stride1(x, (2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(32)(x))
    return nn.Dense(self.num_classes)(x)
