"""Reference models in plain PyTorch, without weights.

The models here exist to produce ONNX graphs whose FLOP counts can be checked by hand. Their weights are random
(nothing is downloaded), and exported files carry only shapes: see :mod:`flopcount.models.export`.

Importing this package does not import torch; import a submodule (``resnet``, ``export``) when torch is wanted.
"""
