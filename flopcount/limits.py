"""The limits every stage shares, in one place.

:data:`MAX_ELEMENTS` is the largest dim, and the largest element count of any tensor, that a model, a
configuration or an option may give: 2**48 elements (1 PiB of float32), more than any machine holds. Above it a shape
is an error, never a count; it also keeps every product of dims far inside int64, where ONNX's inference does its
arithmetic.

>>> MAX_ELEMENTS == 2**48
True
"""

__all__ = ["MAX_ELEMENTS"]

MAX_ELEMENTS = 2**48
