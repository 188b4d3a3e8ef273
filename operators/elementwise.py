"""Element-wise arithmetic and activations (HPC AI500 V3.0 Table 3: element-wise, Cout·H·W).

One table, one rule: every op below costs one operation per element of its (broadcast) output Y,
counted as FLOPs when the op computes on floating-point inputs and as ``int_ops`` when it computes
on integers or booleans (shape arithmetic, masks). The table also says how many transcendental
evaluations (exp, log, tanh, erf, sqrt, pow, trigonometric) each output element needs; those are
reported in their own column and are part of the one FLOP per element, not added to it.
"""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import formula

# op type → transcendental evaluations per output element
ELEMENTWISE: dict[str, int] = {
    # arithmetic
    "Add": 0, "Sub": 0, "Mul": 0, "Div": 0, "Mod": 0, "Neg": 0, "Abs": 0, "Reciprocal": 0,
    "Floor": 0, "Ceil": 0, "Round": 0, "Sign": 0, "Pow": 1, "Sqrt": 1, "Exp": 1, "Log": 1,
    "Erf": 1, "Sin": 1, "Cos": 1, "Tan": 1, "Asin": 1, "Acos": 1, "Atan": 1, "Sinh": 1,
    "Cosh": 1, "Asinh": 1, "Acosh": 1, "Atanh": 1, "PRelu": 0, "Clip": 0, "Shrink": 0,
    # comparisons and logic
    "Equal": 0, "Less": 0, "Greater": 0, "LessOrEqual": 0, "GreaterOrEqual": 0, "IsNaN": 0,
    "IsInf": 0, "Not": 0, "And": 0, "Or": 0, "Xor": 0, "BitShift": 0, "BitwiseAnd": 0,
    "BitwiseOr": 0, "BitwiseXor": 0, "BitwiseNot": 0,
    # activations
    "Relu": 0, "LeakyRelu": 0, "ThresholdedRelu": 0, "HardSigmoid": 0, "HardSwish": 0,
    "Softsign": 0, "Sigmoid": 1, "Tanh": 1, "Elu": 1, "Selu": 1, "Celu": 1, "Softplus": 2,
    "Gelu": 1, "Mish": 3, "Swish": 1,
}  # fmt: skip

# Variadic ops: k inputs reduce to one output with k - 1 binary operations per element.
VARIADIC: tuple[str, ...] = ("Sum", "Max", "Min")


def _cost(ctx: NodeContext, per_element: int, transcendentals: int) -> Cost:
    y = ctx.out_numel()
    if ctx.in_is_float(0):
        return Cost(flops=per_element * y, transcendentals=transcendentals * y)
    return Cost(int_ops=per_element * y)


@formula(*ELEMENTWISE, family="elementwise")
def elementwise(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y| (one per output element, after broadcasting); integer inputs: int_ops = |Y|."""
    return _cost(ctx, 1, ELEMENTWISE[ctx.op_type])


@formula(*VARIADIC, family="elementwise")
def variadic(ctx: NodeContext, **_) -> Cost:
    """FLOPs = (k − 1)·|Y| for k inputs (k − 1 additions or comparisons per output element)."""
    return _cost(ctx, ctx.n_inputs - 1, 0)


@formula("Mean", family="elementwise")
def mean(ctx: NodeContext, **_) -> Cost:
    """FLOPs = k·|Y| for k ≥ 2 inputs (k − 1 additions and one division per element); 0 for k = 1."""
    k = ctx.n_inputs
    return _cost(ctx, k if k > 1 else 0, 0)


@formula("Dropout", family="elementwise")
def dropout(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 0 at inference; |Y| (one multiply by mask/(1 − ratio) per element) when the
    ``training_mode`` input is a constant true.

    A ``training_mode`` computed at run time counts as inference.
    """
    mode = ctx.value(2) if ctx.has_input(2) else None
    if mode is not None and bool(mode.reshape(-1)[0]):
        return _cost(ctx, 1, 0)
    return Cost()
