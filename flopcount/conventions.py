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
``dense``
    Products only (convolution, matrix products, attention, recurrent gates), 2 FLOPs per MAC: bias
    additions, softmax, activations, normalization and pooling are left out.
``macs``
    The same products, 1 per MAC: the figure MAC counters print.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cost import ZERO, Cost
from .errors import UsageError

# Operator families whose work is products (counted by the ``dense`` and ``macs`` conventions)
DENSE_FAMILIES = frozenset({"conv", "matmul", "attention", "recurrent"})


@dataclass(frozen=True)
class Convention:
    name: str
    summary: str
    conv_flops_per_mac: int = 2
    fc_flops_per_mac: int = 2  # Gemm, MatMul
    count_bias: bool = True
    pooling: str = "window"  # "window": K per output element; "input": one per input element
    # Inclusion rule: when set, only these families count, as ``products_per_mac`` FLOPs per MAC
    # of their products (all other work, theirs included, is left out); None counts everything.
    products_only: frozenset[str] | None = None
    products_per_mac: int = 2

    def apply(self, family: str, cost: Cost) -> Cost:
        """The cost a node of ``family`` contributes under this convention (the one place where
        inclusion rules act; If/Loop/Scan pass through, their bodies were already counted so)."""
        if self.products_only is None or family == "control-flow":
            return cost
        if family not in self.products_only:
            return ZERO
        return Cost(flops=self.products_per_mac * cost.macs, macs=cost.macs)


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
        Convention(
            "dense",
            "products only: convolution, matrix products, attention and recurrent gates at 2 FLOPs per MAC "
            "(what torch.utils.flop_counter counts)",
            products_only=DENSE_FAMILIES,
        ),
        Convention(
            "macs",
            "multiply-accumulates of products only, 1 per MAC (what onnx-tool, thop and ptflops print)",
            products_only=DENSE_FAMILIES,
            products_per_mac=1,
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
