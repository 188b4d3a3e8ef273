"""Counting conventions: named, frozen tables that formulas consult.

``default``
    One multiply-accumulate is 2 FLOPs in every product (convolution, Gemm, MatMul); bias
    additions are counted (one FLOP per output element); element-wise ops cost 1 FLOP per
    output element; pooling costs one FLOP per input element each window reads; normalization
    costs one FLOP per element it normalizes (HPC AI500 V3.0 Table 3: Cin·H·W).
``table3``
    HPC AI500 V3.0 Table 3 taken literally: convolution 2·K²·Cin·H·W·Cout (no bias term),
    fully-connected FLin·FLout (one FLOP per multiply-accumulate, no bias term), pooling Cin·H·W
    of its *input*, element-wise Cout·H·W, normalization Cin·H·W.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class Convention:
    name: str
    summary: str
    conv_flops_per_mac: int = 2
    fc_flops_per_mac: int = 2  # Gemm, MatMul
    count_bias: bool = True
    pooling: str = "window"  # "window": K per output element; "input": one per input element


CONVENTIONS: dict[str, Convention] = {
    c.name: c
    for c in (
        Convention(
            "default",
            "1 MAC = 2 FLOPs in every product; bias counted; pooling counts each element a window reads",
        ),
        Convention(
            "table3",
            "HPC AI500 V3.0 Table 3 literally: FC = FLin*FLout, no bias terms, pooling = Cin*H*W of the input",
            fc_flops_per_mac=1,
            count_bias=False,
            pooling="input",
        ),
    )
}


def get_convention(name: str | Convention) -> Convention:
    if isinstance(name, Convention):
        return name
    try:
        return CONVENTIONS[name]
    except KeyError:
        raise UsageError(
            f"unknown convention {name!r}; choose one of: {', '.join(CONVENTIONS)}"
        ) from None
