"""Reference models in Keras 3 (TensorFlow backend), built without weights (nothing is downloaded).

:func:`resnet50_keras` is ``keras.applications.ResNet50``, which is ResNet **v1** (He et al., 2015), where
:mod:`flopcount.models.resnet` is v1.5. Two differences matter for FLOPs:

- the stride of each downsampling bottleneck (the first block of stages 2 to 4) sits on its *first 1x1*
  convolution (``conv3_block1_1_conv``, ``conv4_block1_1_conv``, ``conv5_block1_1_conv``: 1x1/2), so that
  convolution already runs at the block's output resolution; v1.5 puts the stride on the 3x3 convolution;
- every convolution has a bias (``use_bias=True``), followed by BatchNormalization (epsilon 1.001e-5).

The rest is laid out as in v1.5: 7x7/2 stem (``ZeroPadding2D(3)`` + valid convolution), BatchNormalization, ReLU,
``ZeroPadding2D(1)`` + valid 3x3/2 max pool, stages of (3, 4, 6, 3) bottlenecks of widths 64, 128, 256, 512 with
1x1 projection shortcuts in each stage's first block, global average pool, and a 2048 → 1000 Dense layer with its
softmax.

>>> import flopcount  # doctest: +SKIP
>>> from flopcount.models.keras_models import resnet50_keras  # doctest: +SKIP
>>> flopcount.from_keras(resnet50_keras()).by_op_type["Conv"].cost.macs  # doctest: +SKIP
3855925248

or ``flopcount --keras flopcount.models.keras_models:resnet50_keras``. Keras is imported when a model is built,
not when this module is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras

__all__ = ["resnet50_keras"]


def resnet50_keras() -> keras.Model:
    """``keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)``: ResNet v1, random
    weights, inputs ``(batch, 224, 224, 3)`` (channels last)."""
    from flopcount.frontends.keras_inputs import import_frameworks

    _, keras, _ = import_frameworks()  # quietly (TensorFlow logs on import)
    return keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
