"""ResNet-20 for CIFAR-10 with "type A" shortcuts and GroupNorm (Flax linen).

Paper ``000_tradeoffs_of_private_prediction.md`` Section 4.3: a ResNet-20 (He et
al. 2016, Section 4.2 "CIFAR-10 and analysis": 3 stages of n = 3 basic blocks
with 16, 32, 64 filters, 6n + 2 = 20 weighted layers) with "type A" blocks --
parameter-free shortcuts that subsample spatially and zero-pad the new
channels -- where batch normalisation is replaced by group normalisation
(Wu & He 2018) "to facilitate the computation of per-example gradients in
DP-SGD": GroupNorm normalises each example on its own, so a per-example
gradient depends only on that example. The number of groups follows the
paper's released code (facebookresearch/private_prediction, ``modeling.py``):
``GroupNorm(min(32, C), C)``. Convolutions have no bias and use Kaiming-normal
initialisation, as in that code's ResNet.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

_conv_init = nn.initializers.variance_scaling(2.0, "fan_in", "normal")


def _group_norm(channels: int, max_groups: int) -> nn.GroupNorm:
  return nn.GroupNorm(num_groups=min(max_groups, channels))


class BasicBlock(nn.Module):
  """Two 3x3 convolutions with GroupNorm and a type-A (zero-pad) shortcut."""

  planes: int
  stride: int = 1
  max_groups: int = 32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    in_planes = x.shape[-1]
    out = nn.Conv(self.planes, (3, 3), strides=(self.stride, self.stride), padding=((1, 1), (1, 1)),
                  use_bias=False, kernel_init=_conv_init)(x)
    out = nn.relu(_group_norm(self.planes, self.max_groups)(out))
    out = nn.Conv(self.planes, (3, 3), padding=((1, 1), (1, 1)), use_bias=False,
                  kernel_init=_conv_init)(out)
    out = _group_norm(self.planes, self.max_groups)(out)
    shortcut = x
    if self.stride != 1 or in_planes != self.planes:
      # Option A (He et al. 2016): subsample by the stride and zero-pad the new channels
      # evenly on both sides (planes // 4 each side when the width doubles, as in the
      # paper's code).
      if self.planes < in_planes:
        raise ValueError(f"type-A shortcuts need planes >= in_planes, got {self.planes} < {in_planes}.")
      extra = self.planes - in_planes
      shortcut = x[:, ::self.stride, ::self.stride, :]
      shortcut = jnp.pad(shortcut, ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))
    return nn.relu(out + shortcut)


class ResNet20(nn.Module):
  """ResNet-(6n+2) for 32x32 images; ``n = 3`` gives ResNet-20 (~0.27M params).

  Attributes:
    num_classes: number of logits (10 for CIFAR-10).
    blocks_per_stage: n, blocks in each of the 3 stages.
    widths: filters per stage.
    max_groups: GroupNorm uses ``min(max_groups, C)`` groups.
  """

  num_classes: int = 10
  blocks_per_stage: int = 3
  widths: Sequence[int] = (16, 32, 64)
  max_groups: int = 32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if x.ndim == 2:
      x = x.reshape((x.shape[0], 32, 32, 3))
    x = nn.Conv(self.widths[0], (3, 3), padding=((1, 1), (1, 1)), use_bias=False,
                kernel_init=_conv_init)(x)
    x = nn.relu(_group_norm(self.widths[0], self.max_groups)(x))
    for stage, planes in enumerate(self.widths):
      for block in range(self.blocks_per_stage):
        stride = 2 if (stage > 0 and block == 0) else 1
        x = BasicBlock(planes, stride, self.max_groups)(x)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes, kernel_init=_conv_init)(x)
