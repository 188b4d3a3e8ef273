"""Reference models in plain PyTorch, without weights.

The models here exist to produce ONNX graphs whose FLOP counts can be checked by hand. Their weights are random
(nothing is downloaded), and exported files carry only shapes: see :mod:`flopcount.models.export`.

Modules: ``resnet`` (ResNet-50 v1.5), ``resnext`` (ResNeXt-50 32x4d), ``mobilenet`` (MobileNetV2), ``transformer``
(BERT-base, GPT-2 small, ViT-B/16), ``lstm`` (a small stacked LSTM), ``zoo`` (all of them by name, with their example
inputs) and ``export`` (the weightless exporter and its command line).

Importing this package does not import torch; import a submodule when torch is wanted (``zoo`` imports it only when
a model is built).
"""

__all__: list[str] = []
