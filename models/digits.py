"""A small CNN for scikit-learn's bundled handwritten digits (1,797 images of 8×8 pixels, 10 classes): the model
of ``flopcount bench digits``.

Layers (input N×1×8×8): Conv 1→16 3×3 pad 1 + bias, ReLU; Conv 16→32 3×3 pad 1 + bias, ReLU; MaxPool 2×2 → 32×4×4;
Flatten; Linear 512→64 + bias, ReLU; Linear 64→10 + bias. torch is imported when the model is built.
"""

from __future__ import annotations

CHANNELS = (16, 32)
HIDDEN = 64
CLASSES = 10
SIDE = 8


def digits_cnn():
    """The digits CNN, freshly initialised (torch's default initialisation; seed torch first for a fixed one)."""
    from torch import nn

    c1, c2 = CHANNELS
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(),
        nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * (SIDE // 2) ** 2, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )
