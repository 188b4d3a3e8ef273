"""Cost formulas, one module per operator family. Importing this package fills the registry."""

from . import conv, elementwise, layout, matmul, normalization, pooling, reduction  # noqa: F401
