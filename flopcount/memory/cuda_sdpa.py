"""Which kernel torch's CUDA dispatcher runs for an exported ``scaled_dot_product_attention``, and what that
kernel keeps besides Q, K, V and its output.

torch tries flash attention, then the memory-efficient kernel, then its math path, and runs the first whose checks
pass (``select_sdp_backend`` in torch's ``cuda/sdp_utils.cpp``; an sm80 or newer device, the checks of torch 2.11,
which the H200 measurement of docs/memory.md confirms):

- flash (``can_use_flash_attention``): fp16 or bf16 (``check_dtypes_low_precision``), no mask handed
  (``check_for_attn_mask``), Q, K and V of one head size of at most 256 (``check_head_dim_size_flash``); K and V
  may have fewer heads than Q (grouped-query attention). It keeps a float32 log-sum-exp per query row,
  B·heads·S_q, and its philox seed and offset (two int64 scalars). A head size that is not a multiple of 8 is
  padded to one before the kernel (torch's ``pad_last_dim<8>``): it keeps Q, K, V and its output so padded.
- memory-efficient (``can_use_mem_efficient_attention``): fp32 too, a mask allowed, as many heads in K and V as in
  Q, Q and K of one head size, Q's and V's head sizes multiples of 4 (fp32) or 8 (fp16, bf16)
  (``minimum_gemm_alignment``). It keeps the log-sum-exp padded to 32 query rows, B·heads·32·⌈S_q/32⌉ float32,
  the mask it is handed, and its philox seed and offset. A mask whose rows are not a multiple of 8 elements is
  padded to one first (``preprocess_mask``, ``pad_bias<8>`` in torch's ``attention.cpp``): a copy, kept in its
  place.
- the math path otherwise: what eager attention keeps (:func:`flopcount.memory.kernels.kernels` reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil, prod


__all__ = ["SdpaCall", "cuda_kernel", "FLASH", "EFFICIENT", "MATH", "SEED_OFFSET", "lse_bytes", "padded_head",
           "mask_padding"]

FLASH, EFFICIENT, MATH = "flash", "memory-efficient", "math"

#: ONNX element types: float32, float16, bfloat16.
_F32, _F16, _BF16 = 1, 10, 16

#: The philox seed and offset the fused kernels keep for their backward: two int64 scalars.
SEED_OFFSET = 16


@dataclass(frozen=True)
class SdpaCall:
    """The facts of one sdpa call the dispatcher reads: Q's element type, Q's, K's and V's head sizes, whether a
    mask is handed, whether K and V have fewer heads than Q (grouped-query, the kernel reads them unrepeated)."""

    dtype: int
    head_q: int
    head_k: int
    head_v: int
    masked: bool
    grouped: bool


def cuda_kernel(c: SdpaCall) -> str:
    """The kernel torch runs for ``c`` on an sm80-or-newer CUDA device: :data:`FLASH`, :data:`EFFICIENT` or
    :data:`MATH`."""
    half = c.dtype in (_F16, _BF16)
    if half and not c.masked and c.head_q == c.head_k == c.head_v and 0 < c.head_q <= 256:
        return FLASH
    align = 8 if half else 4
    if (half or c.dtype == _F32) and not c.grouped and c.head_q == c.head_k and c.head_q > 0 and c.head_v > 0 \
            and c.head_q % align == 0 and c.head_v % align == 0:
        return EFFICIENT
    return MATH


def lse_bytes(kernel: str, rows: tuple[int, ...]) -> int:
    """The float32 log-sum-exp ``kernel`` keeps for an output whose shape without its head size is ``rows``
    (B, heads, S_q): one per query row (flash and the CPU's kernel), padded to 32 rows (memory-efficient)."""
    *lead, s_q = rows
    n = 1
    for d in lead:
        n *= d
    return 4 * n * (32 * ceil(s_q / 32) if kernel == EFFICIENT else s_q)


def padded_head(head: int) -> int:
    """The head size flash runs at: ``head`` padded to a multiple of 8."""
    return 8 * ceil(head / 8)


def mask_padding(shape: Sequence[int], elem_bytes: int) -> int:
    """The bytes the memory-efficient kernel's copy of a mask of ``shape`` (kept in a type of ``elem_bytes``) adds:
    the columns that make its rows a multiple of 8 elements (``pad_bias<8>``); none where they are already."""
    if not shape or shape[-1] % 8 == 0:
        return 0
    return prod(shape[:-1]) * (8 * ceil(shape[-1] / 8) - shape[-1]) * elem_bytes
