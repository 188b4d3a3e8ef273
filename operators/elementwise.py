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
from flopcount.registry import backward, formula

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


# Backward: op → (FLOPs per output element for the gradient of input 0, of input 1,
#                 transcendentals per element). A gradient of an input that Y broadcasts over
#                 also sums dY back to the input's shape: |Y| − |X_i| additions.
ELEMENTWISE_BACKWARD: dict[str, tuple[int, int, int]] = {
    "Add": (0, 0, 0),  # dA = dY, dB = dY
    "Sub": (0, 1, 0),  # dB = −dY
    "Mul": (1, 1, 0),  # dA = dY·B, dB = dY·A
    "Div": (1, 3, 0),  # dA = dY/B, dB = −dY·A/B² (A/B = Y is known: −dY·Y/B, 3)
    "Neg": (1, 0, 0), "Abs": (1, 0, 0), "Relu": (1, 0, 0), "LeakyRelu": (1, 0, 0),
    "ThresholdedRelu": (1, 0, 0), "Clip": (1, 0, 0), "Floor": (0, 0, 0), "Ceil": (0, 0, 0),
    "Round": (0, 0, 0), "Sign": (0, 0, 0),
    "PRelu": (1, 2, 0),  # dX = dY·(x > 0 ? 1 : slope); dSlope = dY·x where x < 0
    "Reciprocal": (2, 0, 0),  # −dY·Y²
    "Sqrt": (2, 0, 0),  # dY/(2·Y)
    "Exp": (1, 0, 0),  # dY·Y
    "Log": (1, 0, 0),  # dY/X
    "Pow": (3, 3, 2),  # dA = dY·B·Y/A; dB = dY·Y·ln A
    "Sigmoid": (3, 0, 0),  # dY·Y·(1 − Y)
    "Tanh": (3, 0, 0),  # dY·(1 − Y²)
    "Erf": (4, 0, 1),  # dY·(2/√π)·exp(−X²)
    "Gelu": (7, 0, 1),  # dY·(Φ(x) + x·φ(x)), erf form
    "Elu": (2, 0, 0), "Selu": (2, 0, 0), "Celu": (2, 0, 0),  # dY·(Y + alpha) or dY·scale
    "Softplus": (4, 0, 1),  # dY·sigmoid(X)
    "Softsign": (3, 0, 0),  # dY/(1 + |X|)²
    "HardSigmoid": (2, 0, 0), "HardSwish": (3, 0, 0),
    "Mish": (9, 0, 3), "Swish": (5, 0, 1),
    "Sin": (1, 0, 1), "Cos": (2, 0, 1), "Tan": (2, 0, 0), "Sinh": (1, 0, 1), "Cosh": (1, 0, 1),
    "Asin": (4, 0, 1), "Acos": (5, 0, 1), "Atan": (3, 0, 0), "Asinh": (4, 0, 1), "Acosh": (4, 0, 1),
    "Atanh": (3, 0, 0),
    "Max": (1, 1, 0), "Min": (1, 1, 0),  # dY routed by a mask
    "Sum": (0, 0, 0),
    "Mean": (1, 1, 0),  # dY/k
}  # fmt: skip


def _broadcast_sum(ctx: NodeContext, i: int, y: int) -> int:
    """Additions that sum dY back to input ``i``'s shape when Y broadcasts over it."""
    return y - ctx.numel(i)


@backward(*ELEMENTWISE_BACKWARD)
def elementwise_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = Σ over inputs that need a gradient of (c_i·|Y| + |Y| − |X_i|): c_i per element by op
    (table ``ELEMENTWISE_BACKWARD``: Mul 1, Div 1 and 3, Sigmoid and Tanh 3, Relu 1, Add 0 ...),
    plus the sum of dY over broadcast dims.
    """
    y = ctx.out_numel()
    per0, per1, trans = ELEMENTWISE_BACKWARD[ctx.op_type]
    flops = transcendentals = 0
    for i in range(len(ctx.inputs)):
        if ctx.needs_grad(i):
            flops += (per0 if i == 0 else per1) * y + _broadcast_sum(ctx, i, y)
            transcendentals += trans * y if i == 0 else 0
    return Cost(flops=flops, transcendentals=transcendentals)


@backward("Dropout")
def dropout_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y| (dY times mask/(1 − ratio)) when ``training_mode`` is a constant true, else 0."""
    mode = ctx.value(2) if ctx.has_input(2) else None
    return Cost(flops=ctx.out_numel()) if mode is not None and bool(mode.reshape(-1)[0]) else Cost()
