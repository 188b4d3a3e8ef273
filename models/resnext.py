"""ResNeXt (Xie et al., 2017) in plain PyTorch (no torchvision, no weights).

ResNeXt-50 32x4d is ResNet-50 v1.5 (see :mod:`resnet`) with grouped 3x3 convolutions: in a stage of base width
w (64, 128, 256, 512), the bottleneck's inner width is ``w · width_per_group / 64 · groups`` (128, 256, 512, 1024
for 32x4d) and its 3x3 conv has ``groups`` groups; the output is still 4w. Stride on the 3x3 conv (v1.5), projection
shortcuts (1x1 conv + BatchNorm) at the first block of each stage, no conv bias, a linear head with bias.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["ResNeXt", "ResNeXtBottleneck", "resnext", "resnext50_32x4d"]

EXPANSION = 4
STAGE_WIDTHS = (64, 128, 256, 512)


class ResNeXtBottleneck(nn.Module):
    """1x1 to the inner width, grouped 3x3 (with the stride), 1x1 to 4w; BatchNorm after each; ReLU after the add."""

    def __init__(self, in_channels: int, base_width: int, stride: int, groups: int, width_per_group: int) -> None:
        super().__init__()
        inner = base_width * width_per_group // 64 * groups
        out_channels = base_width * EXPANSION
        self.conv1 = nn.Conv2d(in_channels, inner, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, inner, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv3 = nn.Conv2d(inner, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNeXt(nn.Module):
    def __init__(
        self,
        layers: Sequence[int],
        groups: int = 32,
        width_per_group: int = 4,
        num_classes: int = 1000,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        if len(layers) != len(STAGE_WIDTHS):
            raise ValueError(f"layers must give {len(STAGE_WIDTHS)} block counts, got {list(layers)}")
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        channels, blocks = 64, []
        for index, (count, width) in enumerate(zip(layers, STAGE_WIDTHS)):
            for block in range(count):
                stride = 2 if index > 0 and block == 0 else 1
                blocks.append(ResNeXtBottleneck(channels, width, stride, groups, width_per_group))
                channels = width * EXPANSION
        self.blocks = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(self.blocks(self.stem(x))), 1))


def resnext(layers: Sequence[int] = (3, 4, 6, 3), groups: int = 32, width_per_group: int = 4,
            num_classes: int = 1000, in_channels: int = 3) -> ResNeXt:
    """A ResNeXt with ``layers[i]`` blocks in stage ``i``; random weights.

    Examples
    --------
    >>> resnext((1, 1, 1, 1), num_classes=10).fc.out_features
    10
    """
    return ResNeXt(layers, groups, width_per_group, num_classes, in_channels)


def resnext50_32x4d(num_classes: int = 1000, in_channels: int = 3) -> ResNeXt:
    """ResNeXt-50 32x4d: blocks ``[3, 4, 6, 3]``, 32 groups of width 4 in the first stage.

    Examples
    --------
    >>> sum(p.numel() for p in resnext50_32x4d().parameters())
    25028904
    """
    return resnext((3, 4, 6, 3), 32, 4, num_classes, in_channels)
