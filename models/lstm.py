"""A small stacked LSTM in plain PyTorch (no weights).

:func:`lstm` builds ``nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)`` (both biases, no
projection, one direction unless ``bidirectional``) and returns the top layer's outputs for every step. The
default is 2 layers, input 64, hidden 128, fed ``(batch, seq, input)`` = (4, 35, 64) (a PTB-style language-model
shape: 35 steps, batch 4).

Per layer l, step and batch element, the gate products are 4H·(I_l + H) MACs, I_0 = input size, I_l = D·H above
the first layer (D = 2 directions when bidirectional, else 1): the whole stack does
``D·S·B·4H·Σ_l (I_l + H)`` MACs.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LSTMStack", "lstm"]


class LSTMStack(nn.Module):
    def __init__(self, input_size: int = 64, hidden_size: int = 128, num_layers: int = 2,
                 bidirectional: bool = False) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True, bidirectional=bidirectional)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output, _ = self.lstm(x)
        return output


def lstm(input_size: int = 64, hidden_size: int = 128, num_layers: int = 2, bidirectional: bool = False) -> LSTMStack:
    """A stacked LSTM; random weights. Feed it ``(batch, seq, input_size)``.

    Examples
    --------
    >>> sum(p.numel() for p in lstm().parameters())   # 4·128·(64 + 128 + 2) + 4·128·(128 + 128 + 2)
    231424
    """
    return LSTMStack(input_size, hidden_size, num_layers, bidirectional)
