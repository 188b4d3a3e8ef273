"""Reference models in plain PyTorch, without weights.

The models here exist to produce ONNX graphs whose FLOP counts can be checked by hand. Their weights are random
(nothing is downloaded), and exported files carry only shapes: see :mod:`flopcount.frontends.export`.

* :mod:`.resnet` ResNet-50 v1.5
* :mod:`.resnext` ResNeXt-50 32x4d
* :mod:`.mobilenet` MobileNetV2
* :mod:`.transformer` BERT-base, GPT-2 small, ViT-B/16
* :mod:`.lstm` a small stacked LSTM
* :mod:`.detector` the extreme-weather Faster R-CNN (HPC AI500)
* :mod:`.digits` the small CNN of ``flopcount bench digits``
* :mod:`.keras_models` reference models in Keras 3
* :mod:`.zoo` all of them by name, with their example inputs
* :mod:`.export` the command line that exports one of them weightless (``python -m flopcount.models.export``), through
  the frontends' exporter

Importing this package does not import torch; import a submodule when torch is wanted (``zoo`` imports it only when
a model is built).
"""

__all__: list[str] = []
