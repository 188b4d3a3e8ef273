"""Cost formulas, one module per operator family. Importing this package imports every module in
it, which fills the registry (:mod:`flopcount.registry`).

* :mod:`.attention` Attention, FlexAttention, LinearAttention, RotaryEmbedding, SwiGLU
* :mod:`.contrib` Microsoft contrib operators (com.microsoft) that onnxruntime's optimizers write: fused
  convolutions, products and element-wise operators; :mod:`.contrib_attention` its attention and rotary
  embedding, :mod:`.contrib_normalization` its normalizations, :mod:`.contrib_parts` what they share,
  :mod:`.contrib_saved` what their backward keeps
* :mod:`.control_flow` If, Loop, Scan, SequenceMap: their bodies counted with the same formulas
* :mod:`.conv` Conv, ConvTranspose, DeformConv, Col2Im
* :mod:`.detection` RoiAlign, NonMaxSuppression
* :mod:`.einsum` Einsum, step by step
* :mod:`.elementwise` one table of per-element costs for every element-wise operator
* :mod:`.layout` operators that move, select or describe data without arithmetic: explicitly zero-cost
* :mod:`.loss` NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss
* :mod:`.matmul` MatMul, Gemm
* :mod:`.misc` small families: Det, Trilu, CumSum, CumProd, Range, OneHot; the free BitCast, ImageDecoder, Optional
* :mod:`.ml` domain ai.onnx.ml: linear models, SVMs, tree ensembles
* :mod:`.normalization` batch, layer, group and instance normalization
* :mod:`.pooling` pooling windows
* :mod:`.quantized` quantized products and (de)quantization
* :mod:`.quantized_contrib` com.microsoft's quantized operators
* :mod:`.recurrent` LSTM, GRU, RNN
* :mod:`.reduction` reductions
* :mod:`.resize` Resize, Upsample, GridSample, AffineGrid
* :mod:`.sampling` random sampling
* :mod:`.scatter` ScatterElements, ScatterND
* :mod:`.softmax` Softmax, LogSoftmax, Hardmax
* :mod:`.sorting` TopK, Unique
* :mod:`.spectral` DFT, STFT, window functions
* :mod:`.strings` string operators, TfIdfVectorizer
* :mod:`.training` domain ai.onnx.preview.training: optimizer steps
"""

import importlib
import pkgutil

__all__: list[str] = []  # the formulas are reached through flopcount.registry, not imported by name

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
