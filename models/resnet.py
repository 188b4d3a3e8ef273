"""ResNet v1.5 in plain PyTorch (no torchvision, no weights).

ResNet v1.5 differs from the original v1 (He et al., 2015) in one place: the bottleneck block puts its stride on
the 3x3 convolution instead of the first 1x1 convolution. This is the variant torchvision calls ``resnet50``.

Layout of :func:`resnet50` (``layers=(3, 4, 6, 3)``):

- stem: 7x7/2 conv to 64 channels, BatchNorm, ReLU, 3x3/2 max pool with padding 1;
- four stages of :class:`Bottleneck` blocks with widths 64, 128, 256, 512 and expansion 4; the first block of
  stages 2 to 4 has stride 2, and the first block of every stage has a 1x1 conv + BatchNorm projection shortcut;
- global average pool, flatten, fully connected layer (with bias) to ``num_classes``.

All convolutions have ``bias=False``; weights are randomly initialised.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["Bottleneck", "ResNet", "resnet_v1_5", "resnet50"]

EXPANSION = 4
STAGE_WIDTHS = (64, 128, 256, 512)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride, v1.5), 1x1 expand; each followed by BatchNorm; ReLU after the add."""

    expansion = EXPANSION

    def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """A ResNet v1.5 built from :class:`Bottleneck` blocks; ``layers`` gives the block count of each stage."""

    def __init__(self, layers: Sequence[int], num_classes: int = 1000, in_channels: int = 3) -> None:
        super().__init__()
        if len(layers) != len(STAGE_WIDTHS):
            raise ValueError(f"layers must give {len(STAGE_WIDTHS)} block counts, got {list(layers)}")
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        channels = 64
        stages = []
        for index, (blocks, width) in enumerate(zip(layers, STAGE_WIDTHS)):
            stride = 1 if index == 0 else 2
            stage = []
            for block in range(blocks):
                stage.append(Bottleneck(channels, width, stride if block == 0 else 1))
                channels = width * EXPANSION
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        # flatten(x, 1), not view(batch, -1): the exported Reshape must not hard-code the batch size.
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet_v1_5(layers: Sequence[int], num_classes: int = 1000, in_channels: int = 3) -> ResNet:
    """Build a bottleneck ResNet v1.5 with ``layers[i]`` blocks in stage ``i``.

    Examples
    --------
    >>> model = resnet_v1_5([1, 1, 1, 1], num_classes=10)
    >>> model.fc.out_features
    10
    """
    return ResNet(layers, num_classes=num_classes, in_channels=in_channels)


def resnet50(num_classes: int = 1000, in_channels: int = 3) -> ResNet:
    """ResNet-50 v1.5: bottleneck blocks ``[3, 4, 6, 3]``, random weights.

    Examples
    --------
    >>> sum(p.numel() for p in resnet50().parameters())
    25557032
    """
    return resnet_v1_5((3, 4, 6, 3), num_classes=num_classes, in_channels=in_channels)
