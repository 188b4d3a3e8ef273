"""MobileNetV2 (Sandler et al., 2018) in plain PyTorch (no torchvision, no weights).

Layout of :func:`mobilenet_v2` (width multiplier 1.0, the torchvision layout):

- stem: 3x3/2 conv to 32 channels, BatchNorm, ReLU6;
- 17 inverted-residual blocks from the table ``(t, c, n, s)`` = expansion, output channels, repeats, stride of
  the first repeat: (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
  (6, 320, 1, 1). A block is a 1x1 expansion conv to t·c_in channels (left out when t = 1), a 3x3 depth-wise conv
  carrying the stride, and a 1x1 linear projection to c; BatchNorm after each conv, ReLU6 after the first two;
  a residual add when the stride is 1 and c_in = c;
- head: 1x1 conv to 1280 channels, BatchNorm, ReLU6, global average pool, dropout, linear layer (with bias).

Channel counts are multiplied by ``width`` and rounded to a multiple of 8 (never down by more than 10 %); the last
conv keeps 1280 channels for widths <= 1. All convolutions have ``bias=False``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["INVERTED_RESIDUAL_SETTING", "InvertedResidual", "MobileNetV2", "make_divisible", "mobilenet_v2"]

#: (expansion t, output channels c, repeats n, first stride s) of each stage.
INVERTED_RESIDUAL_SETTING: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round ``value`` to the nearest multiple of ``divisor``, never below 90 % of it (torchvision's rule).

    Examples
    --------
    >>> make_divisible(32 * 0.75), make_divisible(1280 * 1.4)
    (24, 1792)
    """
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1, relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(c_in, c_out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
    ]
    if relu:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """1x1 expand (t > 1), 3x3 depth-wise with the stride, 1x1 linear projection; residual when shapes agree."""

    def __init__(self, c_in: int, c_out: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = c_in * expansion
        self.use_residual = stride == 1 and c_in == c_out
        layers: list[nn.Module] = []
        if expansion != 1:
            layers.append(_conv_bn(c_in, hidden, 1))
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), _conv_bn(hidden, c_out, 1, relu=False)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(
        self,
        width: float = 1.0,
        num_classes: int = 1000,
        setting: Sequence[tuple[int, int, int, int]] = INVERTED_RESIDUAL_SETTING,
        in_channels: int = 3,
        last_channels: int = 1280,
    ) -> None:
        super().__init__()
        channels = make_divisible(32 * width)
        last = make_divisible(last_channels * max(1.0, width))
        layers: list[nn.Module] = [_conv_bn(in_channels, channels, 3, 2)]
        for t, c, n, s in setting:
            c_out = make_divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(channels, c_out, s if i == 0 else 1, t))
                channels = c_out
        layers.append(_conv_bn(channels, last, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def mobilenet_v2(width: float = 1.0, num_classes: int = 1000, in_channels: int = 3) -> MobileNetV2:
    """MobileNetV2 with width multiplier ``width``; random weights.

    Examples
    --------
    >>> sum(p.numel() for p in mobilenet_v2().parameters())
    3504872
    """
    return MobileNetV2(width, num_classes, in_channels=in_channels)
