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
``aiperf``
    The AIPerf benchmark's weighted operation counts (:data:`AIPERF_WEIGHTS`): a multiply-add 2
    FLOPs, an addition, multiplication or comparison 1, a division 4, a square root 4, an
    exponential 8, a logarithm 1. Products are counted as under ``default`` (2 per MAC, bias
    counted); element-wise ops, activations, softmax, normalization, pooling, reductions, the
    activations and element-wise work of recurrent cells and the fused contrib operators count
    their primitive operations, each at its weight (each formula's docstring gives its
    decomposition; sin, cos, tan, their inverses and erf weigh as an exponential). Limitations:
    backward (training) formulas and the operators whose formulas are not written in primitive
    operations (resize, sampling, sorting, detection, losses, spectral, ...) keep the flat counts
    of ``default``.

Weighted conventions: a formula whose work is a sum of primitive operations returns
``ctx.convention.weighted(add=..., mul=..., cmp=..., div=..., sqrt=..., exp=..., log=...)``; with
``weights`` None every primitive counts one FLOP, which is the flat counting of the other
conventions (Table 3: one FLOP per element-wise output element). Where the flat count is not the
sum of the primitives (one FLOP per element for a sigmoid or a normalization), a formula keeps its
flat count when ``weights`` is None and counts the primitives otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .cost import ZERO, Cost
from .errors import UsageError

if TYPE_CHECKING:
    from .masks import ExecutedAttention

# Operator families whose work is products (counted by the ``dense`` and ``macs`` conventions)
DENSE_FAMILIES = frozenset({"conv", "matmul", "attention", "recurrent"})

# Primitive floating-point operations a weighted convention prices; "mac" is one multiply-accumulate
# of a product, priced through ``conv_flops_per_mac`` and ``fc_flops_per_mac``, which must equal it.
PRIMITIVES = ("mac", "add", "mul", "cmp", "div", "sqrt", "exp", "log")
TRANSCENDENTAL_PRIMITIVES = ("sqrt", "exp", "log")

# AIPerf (Ren et al., "AIPerf: Automated machine learning as an AI-HPC benchmark"): FLOPs per operation
AIPERF_WEIGHTS: Mapping[str, int] = {
    "mac": 2, "add": 1, "mul": 1, "cmp": 1, "div": 4, "sqrt": 4, "exp": 8, "log": 1,
}  # fmt: skip


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
    # FLOPs per primitive operation (keys: PRIMITIVES); None: flat counting, one FLOP per
    # element-wise output element and per normalized element, every primitive weighing 1
    weights: Mapping[str, int] | None = field(default=None, hash=False)
    # --attention executed: the eager score products of this graph and their masks (flopcount.masks); None
    # counts attention full, the whole score matrix as the graph computes it
    executed: "ExecutedAttention | None" = field(default=None, hash=False, compare=False)

    def __post_init__(self) -> None:
        if self.weights is None:
            return
        if set(self.weights) != set(PRIMITIVES):
            raise ValueError(f"convention {self.name!r}: weights must price exactly {', '.join(PRIMITIVES)}")
        if not self.conv_flops_per_mac == self.fc_flops_per_mac == self.weights["mac"]:
            raise ValueError(f"convention {self.name!r}: conv_flops_per_mac and fc_flops_per_mac must equal weights['mac']")

    def weighted(
        self, *, add: int = 0, mul: int = 0, cmp: int = 0, div: int = 0, sqrt: int = 0, exp: int = 0, log: int = 0
    ) -> Cost:
        """The cost of these counts of primitive floating-point operations: FLOPs = Σ weight·count
        (every weight 1 when ``weights`` is None), transcendentals = sqrt + exp + log.

        Additions include subtractions, comparisons include max, min, abs and rounding.

        >>> CONVENTIONS["default"].weighted(add=3, div=2, exp=2)
        Cost(flops=7, macs=0, transcendentals=2, int_ops=0)
        >>> CONVENTIONS["aiperf"].weighted(add=3, div=2, exp=2)
        Cost(flops=27, macs=0, transcendentals=2, int_ops=0)
        """
        counts = {"add": add, "mul": mul, "cmp": cmp, "div": div, "sqrt": sqrt, "exp": exp, "log": log}
        w = self.weights
        flops = sum(counts.values()) if w is None else sum(w[k] * n for k, n in counts.items())
        return Cost(flops=flops, transcendentals=sqrt + exp + log)

    def primitives(self, per_element: Mapping[str, int], n: int) -> Cost:
        """:meth:`weighted` of ``n`` times the primitive counts ``per_element`` (a decomposition table
        entry such as ``{"exp": 1, "add": 1, "div": 1}``)."""
        return self.weighted(**{k: v * n for k, v in per_element.items()})

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
        Convention(
            "aiperf",
            "AIPerf weighted operations: multiply-add 2, add/mul/compare 1, division 4, square root 4, "
            "exponential 8, log 1; element-wise, softmax, normalization, pooling and reductions counted "
            "by their primitive operations (backward formulas flat)",
            weights=AIPERF_WEIGHTS,
        ),
    )
}
"""The named conventions, by name (``default``, ``table3``, ``dense``, ``macs``, ``aiperf``: the module's docstring
says what each counts); ``convention=`` takes a name or a :class:`Convention`."""


def get_convention(name: str | Convention) -> Convention:
    if isinstance(name, Convention):
        return name
    try:
        return CONVENTIONS[name]
    except KeyError:
        raise UsageError(
            f"unknown convention {name!r}; choose one of: {', '.join(CONVENTIONS)}"
        ) from None
