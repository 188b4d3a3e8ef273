"""Element-wise arithmetic and activations (HPC AI500 V3.0 Table 3: element-wise, Cout·H·W).

One table, one rule: every op below costs one operation per element of its (broadcast) output Y,
counted as FLOPs when the op computes on floating-point inputs and as ``int_ops`` when it computes
on integers or booleans (shape arithmetic, masks). The table also says how many transcendental
evaluations (exp, log, tanh, erf, sqrt, pow, trigonometric) each output element needs; those are
reported in their own column and are part of the one FLOP per element, not added to it.

Weighted conventions (``aiperf``) count instead the primitive operations of each element, from
the table ``DECOMPOSITION``, each at its weight (transcendentals are then the exp, log and sqrt
evaluations of the decomposition). Rounding, abs, sign, max and min count as comparisons; sin,
cos, tan, asin, acos, atan and erf as one exponential-class evaluation each; tanh(x) as
(e^{2x} − 1)/(e^{2x} + 1): one multiply, one exp, two adds, one divide; pow(a, b) as
exp(b·log a). Integer and boolean work stays ``int_ops``, one per element, under every convention.
"""

from __future__ import annotations

from collections.abc import Mapping

from flopcount.context import NodeContext
from flopcount.conventions import Convention
from flopcount.cost import Cost
from flopcount.masks import executed_entries, executed_reduction
from flopcount.registry import backward, formula, saves, saves_nothing
from flopcount.saved import BOOL_BYTES, NOTHING, Saved, keeps

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

_TANH = {"mul": 1, "exp": 1, "add": 2, "div": 1}  # (e^{2x} − 1)/(e^{2x} + 1)
_SIGMOID = {"exp": 1, "add": 1, "div": 1}  # 1/(1 + e^{−x})
_SOFTPLUS = {"exp": 1, "add": 1, "log": 1}  # log(1 + e^x)

# op type → primitive operations per output element, for weighted conventions
DECOMPOSITION: dict[str, Mapping[str, int]] = {
    "Add": {"add": 1}, "Sub": {"add": 1}, "Mul": {"mul": 1}, "Div": {"div": 1},
    "Mod": {"div": 1, "mul": 1, "add": 1},  # fmod: x − y·trunc(x/y)
    "Neg": {"add": 1}, "Abs": {"cmp": 1}, "Reciprocal": {"div": 1},
    "Floor": {"cmp": 1}, "Ceil": {"cmp": 1}, "Round": {"cmp": 1}, "Sign": {"cmp": 1},
    "Pow": {"log": 1, "mul": 1, "exp": 1},  # exp(b·log a)
    "Sqrt": {"sqrt": 1}, "Exp": {"exp": 1}, "Log": {"log": 1}, "Erf": {"exp": 1},
    "Sin": {"exp": 1}, "Cos": {"exp": 1}, "Tan": {"exp": 1},
    "Asin": {"exp": 1}, "Acos": {"exp": 1}, "Atan": {"exp": 1},
    "Sinh": {"exp": 1, "div": 1, "add": 1, "mul": 1},  # (e^x − 1/e^x)·0.5
    "Cosh": {"exp": 1, "div": 1, "add": 1, "mul": 1},  # (e^x + 1/e^x)·0.5
    "Asinh": {"mul": 1, "add": 2, "sqrt": 1, "log": 1},  # log(x + sqrt(x² + 1))
    "Acosh": {"mul": 1, "add": 2, "sqrt": 1, "log": 1},  # log(x + sqrt(x² − 1))
    "Atanh": {"add": 2, "div": 1, "log": 1, "mul": 1},  # 0.5·log((1 + x)/(1 − x))
    "PRelu": {"cmp": 1, "mul": 1}, "Clip": {"cmp": 2},
    "Shrink": {"cmp": 2, "add": 1},  # x < −λ: x + bias; x > λ: x − bias
    "Equal": {"cmp": 1}, "Less": {"cmp": 1}, "Greater": {"cmp": 1}, "LessOrEqual": {"cmp": 1},
    "GreaterOrEqual": {"cmp": 1}, "IsNaN": {"cmp": 1}, "IsInf": {"cmp": 1},
    "Not": {"cmp": 1}, "And": {"cmp": 1}, "Or": {"cmp": 1}, "Xor": {"cmp": 1}, "BitShift": {"cmp": 1},
    "BitwiseAnd": {"cmp": 1}, "BitwiseOr": {"cmp": 1}, "BitwiseXor": {"cmp": 1}, "BitwiseNot": {"cmp": 1},
    "Relu": {"cmp": 1}, "LeakyRelu": {"cmp": 1, "mul": 1}, "ThresholdedRelu": {"cmp": 1},
    "HardSigmoid": {"mul": 1, "add": 1, "cmp": 2},  # max(0, min(1, alpha·x + beta))
    "HardSwish": {"mul": 2, "add": 1, "cmp": 2},  # x·HardSigmoid(x)
    "Softsign": {"cmp": 1, "add": 1, "div": 1},  # x/(1 + |x|)
    "Sigmoid": _SIGMOID, "Tanh": _TANH,
    "Elu": {"cmp": 1, "exp": 1, "add": 1, "mul": 1},  # x < 0: alpha·(e^x − 1)
    "Selu": {"cmp": 1, "exp": 1, "add": 1, "mul": 2},  # gamma·(x < 0: alpha·(e^x − 1), else x)
    "Celu": {"cmp": 1, "div": 1, "exp": 1, "add": 1, "mul": 1},  # x < 0: alpha·(e^{x/alpha} − 1)
    "Softplus": _SOFTPLUS,
    "Gelu": {"mul": 3, "add": 1, "exp": 1},  # 0.5·x·(1 + erf(x·(1/√2)))
    "Mish": {"mul": 2, "exp": 2, "log": 1, "add": 3, "div": 1},  # x·tanh(softplus(x))
    "Swish": {"mul": 2, "exp": 1, "add": 1, "div": 1},  # x·sigmoid(alpha·x)
}  # fmt: skip
# Gelu with approximate="tanh": 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): 6 multiplies and 2 adds
# around a tanh (1 multiply, 1 exp, 2 adds, 1 divide)
GELU_TANH: Mapping[str, int] = {"mul": 7, "add": 4, "exp": 1, "div": 1}

# Variadic ops: k inputs reduce to one output with k - 1 binary operations per element.
VARIADIC: tuple[str, ...] = ("Sum", "Max", "Min")


def activation(convention: Convention, op_type: str, n: int, *, approximate: str = "none") -> Cost:
    """Cost of ``n`` float evaluations of the element-wise op ``op_type``: n FLOPs (with the table's
    transcendentals) under flat conventions; its ``DECOMPOSITION`` (``GELU_TANH`` for a tanh-approximated
    Gelu) at the convention's weights under weighted ones. For fused activations and gates."""
    if convention.weights is None:
        return Cost(flops=n, transcendentals=ELEMENTWISE[op_type] * n)
    per_element = GELU_TANH if op_type == "Gelu" and approximate == "tanh" else DECOMPOSITION[op_type]
    return convention.primitives(per_element, n)


def _elements(ctx: NodeContext) -> int:
    """|Y|, or under ``--attention executed`` for a node on an eager attention's path (the scale, the mask's add,
    the softcap, dropout: :func:`flopcount.masks.executed_entries`) the score entries a masked kernel computes."""
    y = ctx.out_numel()
    executed = ctx.convention.executed
    if executed is None:
        return y
    kept = executed_entries(executed, ctx.name, ctx.out_shape())
    return y if kept is None else kept.pairs


def _cost(ctx: NodeContext, per_element: int, transcendentals: int, primitives: Mapping[str, int]) -> Cost:
    """``per_element`` FLOPs (and ``transcendentals``) per output element, or under a weighted convention
    the ``primitives`` per output element at their weights; integers: ``per_element`` int_ops. Under ``--attention
    executed`` an eager attention's element-wise work runs over the kept score entries (:func:`_elements`)."""
    y = _elements(ctx)
    if not ctx.in_is_float(0):
        return Cost(int_ops=per_element * y)
    if ctx.convention.weights is None:
        return Cost(flops=per_element * y, transcendentals=transcendentals * y)
    return ctx.convention.primitives(primitives, y)


@formula(*ELEMENTWISE, family="elementwise")
def elementwise(ctx: NodeContext, *, approximate: str = "none", **_) -> Cost:
    """FLOPs = |Y| (one per output element, after broadcasting); integer inputs: int_ops = |Y|.

    Weighted conventions: |Y| times the op's primitive operations at their weights (table
    ``DECOMPOSITION``: Add, Sub 1 add; Mul 1 mul; Div, Reciprocal 1 div; Relu, comparisons 1 cmp;
    Sqrt 1 sqrt; Exp 1 exp; Log 1 log; Sigmoid exp + add + div; Tanh mul + exp + 2 add + div; ...).
    """
    if ctx.op_type == "Gelu" and approximate == "tanh":
        return _cost(ctx, 1, 1, GELU_TANH)
    return _cost(ctx, 1, ELEMENTWISE[ctx.op_type], DECOMPOSITION[ctx.op_type])


@formula(*VARIADIC, family="elementwise")
def variadic(ctx: NodeContext, **_) -> Cost:
    """FLOPs = (k − 1)·|Y| for k inputs (k − 1 additions or comparisons per output element)."""
    k = ctx.n_inputs - 1
    return _cost(ctx, k, 0, {"add" if ctx.op_type == "Sum" else "cmp": k})


@formula("Mean", family="elementwise")
def mean(ctx: NodeContext, **_) -> Cost:
    """FLOPs = k·|Y| for k ≥ 2 inputs (k − 1 additions and one division per element); 0 for k = 1.

    Weighted conventions: k − 1 adds and one div per element at their weights.
    """
    k = ctx.n_inputs
    return _cost(ctx, k if k > 1 else 0, 0, {"add": k - 1, "div": 1} if k > 1 else {})


@formula("Dropout", family="elementwise")
def dropout(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 0 at inference; |Y| (one multiply by mask/(1 − ratio) per element) when the
    ``training_mode`` input is a constant true.

    A ``training_mode`` computed at run time counts as inference.
    """
    mode = ctx.value(2) if ctx.has_input(2) else None
    if mode is not None and bool(mode.reshape(-1)[0]):
        return _cost(ctx, 1, 0, {"mul": 1})
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
    """Additions that sum dY back to input ``i``'s shape when Y broadcasts over it: |Y| − |X_i|, each
    of the |X_i| sums adding |Y|/|X_i| values; none when Y is empty (a size-0 dim broadcast over a
    non-empty X_i makes dX_i zeros)."""
    return y - ctx.numel(i) if y else 0


def _gradient_sum(ctx: NodeContext, i: int, y: int) -> int:
    """:func:`_broadcast_sum`, or under ``--attention executed`` on an eager attention's path the kept entries
    summed into input ``i`` (:func:`flopcount.masks.executed_reduction`); what the graph computes where the mask's
    entries cannot be drawn."""
    if ctx.convention.executed is not None and y != ctx.out_numel():
        if ctx.numel(i) == ctx.out_numel():
            return 0
        summed = executed_reduction(ctx.convention.executed, ctx.name, ctx.out_shape(), ctx.shape(i))
        return _broadcast_sum(ctx, i, ctx.out_numel()) if summed is None else summed
    return _broadcast_sum(ctx, i, y)


@backward(*ELEMENTWISE_BACKWARD)
def elementwise_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = Σ over inputs that need a gradient of (c_i·|Y| + |Y| − |X_i|): c_i per element by op
    (table ``ELEMENTWISE_BACKWARD``: Mul 1, Div 1 and 3, Sigmoid and Tanh 3, Relu 1, Add 0 ...),
    plus the sum of dY over broadcast dims.

    Under ``--attention executed`` the element-wise nodes of an eager
    attention run over the kept score entries, in the backward as in the forward (a masked kernel's gradient of a
    pair it skipped is zero); the sums over broadcast dims then add the kept entries into the smaller input.
    """
    y = _elements(ctx)
    per0, per1, trans = ELEMENTWISE_BACKWARD[ctx.op_type]
    flops = transcendentals = 0
    for i in range(len(ctx.inputs)):
        if ctx.needs_grad(i):
            flops += (per0 if i == 0 else per1) * y + _gradient_sum(ctx, i, y)
            transcendentals += trans * y if i == 0 else 0
    return Cost(flops=flops, transcendentals=transcendentals)


@backward("Dropout")
def dropout_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y| (dY times mask/(1 − ratio)) when ``training_mode`` is a constant true, else 0."""
    mode = ctx.value(2) if ctx.has_input(2) else None
    return Cost(flops=_elements(ctx)) if mode is not None and bool(mode.reshape(-1)[0]) else Cost()


@backward("Shrink")
def shrink_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y| when the input needs a gradient: dX = dY where |x| > lambd, else 0 (the bias shifts
    the output, not its slope).

    One masked selection of dY per element, as Relu's backward counts it, the mask from the forward's
    comparisons.
    """
    return Cost(flops=ctx.out_numel()) if ctx.needs_grad(0) else Cost()


@backward("Mod")
def mod_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y| − |A| for dA (when A needs a gradient) + 4·|Y| − |B| for dB (when B does): dA = dY;
    dB = −dY·q with q = trunc(A/B) (fmod) or floor(A/B), computed as q = (A − Y)/B, so
    dB = dY·(Y − A)/B; each summed back over the dims it was broadcast on.

    dB per element: a subtraction, a division, a multiply (3), then the broadcast sum of both
    gradients (|Y| − |X_i| additions). From opset 13 on the schema marks the divisor B NonDifferentiable
    (only opset 10's unknown categories let it get a gradient); integer Mod never needs one.
    """
    y = ctx.out_numel()
    flops = _broadcast_sum(ctx, 0, y) if ctx.needs_grad(0) else 0
    if ctx.needs_grad(1):
        flops += 3 * y + _broadcast_sum(ctx, 1, y)
    return Cost(flops=flops)


# --------------------------------------------------------------------------------------------
# saved for backward: what each op's backward reads besides dY (flopcount.saved)

#: Ops whose derivative is a function of their output Y (Relu's mask Y > 0, Sigmoid's Y·(1 − Y), Tanh's 1 − Y²,
#: Exp's Y, Sqrt's 1/(2Y), Reciprocal's −Y²): they keep Y.
KEEPS_OUTPUT = ("Relu", "Sigmoid", "Tanh", "Exp", "Sqrt", "Reciprocal")
#: Ops whose derivative is a function of their input X: they keep X.
KEEPS_INPUT = (
    "LeakyRelu", "ThresholdedRelu", "Clip", "Gelu", "Erf", "Elu", "Selu", "Celu", "Softplus", "Softsign",
    "HardSigmoid", "HardSwish", "Mish", "Swish", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh",
    "Asinh", "Acosh", "Atanh", "Log", "Abs", "Shrink",
)  # fmt: skip
#: Ops whose gradient is dY itself, negated, scaled by a count, or zero: only shapes.
KEEPS_NOTHING = ("Add", "Sub", "Neg", "Sum", "Mean", "Floor", "Ceil", "Round", "Sign")


@saves(*KEEPS_OUTPUT)
def keeps_output(ctx: NodeContext, **_) -> Saved:
    """Y, when X needs a gradient."""
    return keeps(outputs=(0,)) if ctx.needs_grad(0) else NOTHING


@saves(*KEEPS_INPUT)
def keeps_input(ctx: NodeContext, **_) -> Saved:
    """X, when X needs a gradient."""
    return keeps(0) if ctx.needs_grad(0) else NOTHING


saves_nothing(*KEEPS_NOTHING)


@saves("Mul")
def mul_saved(ctx: NodeContext, **_) -> Saved:
    """B for dA = dY·B, A for dB = dY·A: each factor only when the other needs a gradient."""
    return keeps(*(j for j in (0, 1) if ctx.needs_grad(1 - j)))


@saves("Div")
def div_saved(ctx: NodeContext, **_) -> Saved:
    """B (dA = dY/B; dB = −dY·A/B²), and A when B needs a gradient."""
    return keeps(*((0, 1) if ctx.needs_grad(1) else (1,)))


@saves("Pow")
def pow_saved(ctx: NodeContext, **_) -> Saved:
    """A and B (dA = dY·B·A^(B−1)), and Y when B needs a gradient (dB = dY·Y·ln A)."""
    return keeps(0, 1, outputs=(0,) if ctx.needs_grad(1) else ())


@saves("Max", "Min", "PRelu", "Mod")
def all_inputs_saved(ctx: NodeContext, **_) -> Saved:
    """Every input: the backward routes dY by comparing them (Max, Min), or scales by the other (PRelu, Mod)."""
    return keeps(*(i for i in range(len(ctx.inputs)) if ctx.has_input(i)))


@saves("Dropout")
def dropout_saved(ctx: NodeContext, **_) -> Saved:
    """The mask as bools, |Y| bytes, in training mode (``training_mode`` a constant true) with a ratio that is not
    0 (the default 0.5, or a constant); nothing otherwise (the op is then the identity, as torch returns its input)."""
    mode = ctx.value(2) if ctx.has_input(2) else None
    ratio = ctx.value(1) if ctx.has_input(1) else None
    if mode is not None and bool(mode.reshape(-1)[0]) and (ratio is None or float(ratio.reshape(-1)[0]) != 0.0):
        return Saved(extra=(("dropout mask (bool)", BOOL_BYTES * ctx.out_numel()),))
    return NOTHING
