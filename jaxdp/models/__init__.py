"""Flax linen models for DP training: linear, MLP, small CNN (MNIST), ResNet-20 GroupNorm (CIFAR-10)."""

from jaxdp.models.cnn import SmallCNN
from jaxdp.models.linear import LinearClassifier
from jaxdp.models.mlp import MLP
from jaxdp.models.resnet import BasicBlock, ResNet20

__all__ = ["BasicBlock", "LinearClassifier", "MLP", "ResNet20", "SmallCNN"]
