"""Recurrent layers: LSTM, GRU, RNN.

Vocabulary: S = sequence length, B = batch, I = input size, H = hidden size, D = number of
directions (2 when ``direction`` is "bidirectional", else 1), g = gates (LSTM 4, GRU 3, RNN 1).
S and B come from X's shape (``layout`` 0: X[S, B, I]; ``layout`` 1: X[B, S, I]); H from the
``hidden_size`` attribute or else from W[D, g·H, I].

Per time step and direction the gate products X_t·Wᵀ and H_{t−1}·Rᵀ form one contraction over
I + H for each of the g·H gate units (their sum is inside the MACs): MACs = D·S·B·g·H·(I + H),
counted at ``fc_flops_per_mac`` FLOPs each (2; 1 under ``table3``). Everything else is per hidden
unit and step, D·S·B·H times:

* each activation evaluation costs 1 FLOP (transcendentals per evaluation: Sigmoid, Tanh,
  ScaledTanh, Elu 1; Softplus 2; Relu, LeakyRelu, ThresholdedRelu, HardSigmoid, Affine,
  Softsign 0), with the activations of the ``activations`` attribute or the ONNX defaults;
* the biases Wb + Rb, when B is given: 2 adds per gate unit, 2·g (dropped by ``table3``);
* ``clip``, when set: 1 FLOP per activation input;
* the op's own element-wise work, stated per op below.

The ``sequence_lens`` input is ignored: the full padded length S is counted for every sequence
(an upper bound when sequences are shorter). Copying initial states and writing Y, Y_h, Y_c is
free.

Weighted conventions (``aiperf``): the gate products as above (2 per MAC); each activation
evaluation by its primitive operations (the element-wise table
:data:`flopcount.operators.elementwise.DECOMPOSITION`, plus Affine alpha·x + beta: 1 mul, 1 add;
ScaledTanh alpha·tanh(beta·x): a tanh and 2 muls), a clip as 2 comparisons, the biases as
additions and each op's own element-wise work as the multiplies and additions stated per op, each
at its weight. The backward estimate doubles the forward element-wise work so priced.
"""

from __future__ import annotations

from collections.abc import Sequence

from flopcount.context import NodeContext
from flopcount.cost import Bound, Cost
from flopcount.operators.elementwise import DECOMPOSITION
from flopcount.registry import backward, formula, saves
from flopcount.saved import Saved, element_bytes

# activation → transcendental evaluations per element; every activation is 1 FLOP per element
ACTIVATIONS: dict[str, int] = {
    "Sigmoid": 1, "Tanh": 1, "ScaledTanh": 1, "Elu": 1, "Softplus": 2,
    "Relu": 0, "LeakyRelu": 0, "ThresholdedRelu": 0, "HardSigmoid": 0, "Affine": 0, "Softsign": 0,
}  # fmt: skip
_BY_LOWER = {name.lower(): t for name, t in ACTIVATIONS.items()}  # names match case-insensitively, as in onnxruntime
# activation → primitive operations per evaluation, for weighted conventions
_PRIMITIVES = {
    **{name.lower(): DECOMPOSITION[name] for name in ACTIVATIONS if name not in ("Affine", "ScaledTanh")},
    "affine": {"mul": 1, "add": 1},  # alpha·x + beta
    "scaledtanh": {"mul": 3, "exp": 1, "add": 2, "div": 1},  # alpha·tanh(beta·x), tanh as in DECOMPOSITION
}


def _recurrent(
    ctx: NodeContext,
    *,
    gates: int,
    uses: Sequence[int],
    defaults: Sequence[str],
    elementwise: dict[str, int],
    hidden_size: int | None,
    direction: str,
    layout: int,
    activations: Sequence[str] | None,
    clip: float | None,
) -> Cost:
    """Cost of one recurrent layer.

    ``uses[j]`` is how many gate units per hidden unit activation slot j is applied to (LSTM f to
    i, f, o; g to c; h to C: (3, 1, 1)); ``elementwise`` the op's own primitive operations per
    hidden unit and step (flat: their number).
    """
    x = ctx.shape(0)
    steps, batch = (x[1], x[0]) if layout == 1 else (x[0], x[1])
    inp = x[2]
    hidden = hidden_size if hidden_size is not None else ctx.shape(1)[1] // gates
    dirs = 2 if direction == "bidirectional" else 1
    units = steps * batch * hidden  # hidden units per direction over the sequence

    n = len(uses)
    # schema defaults (RNN's [b"Tanh", b"Tanh"]) arrive undecoded
    acts = [a.decode() if isinstance(a, bytes) else a for a in (activations or defaults)]
    evaluations: dict[str, int] = {}  # activation (lower case) → evaluations over all directions
    for d in range(dirs):
        # a bidirectional layer lists n activations per direction; one list of n serves both
        names = acts[d * n : (d + 1) * n] if len(acts) >= (d + 1) * n else acts[:n]
        for name, k in zip(names, uses):
            if name.lower() not in _BY_LOWER:
                raise ValueError(f"unknown activation {name!r}; ONNX allows {', '.join(ACTIVATIONS)}")
            evaluations[name.lower()] = evaluations.get(name.lower(), 0) + k * units
    evals = sum(uses)
    bias = 2 * gates if ctx.has_input(3) and ctx.convention.count_bias else 0
    macs = dirs * steps * batch * gates * hidden * (inp + hidden)
    products = Cost(flops=ctx.convention.fc_flops_per_mac * macs, macs=macs)
    conv = ctx.convention
    if conv.weights is None:
        per_unit = evals + sum(elementwise.values()) + bias + (evals if clip is not None else 0)
        trans = sum(_BY_LOWER[name] * count for name, count in evaluations.items())
        cost = products + Cost(flops=dirs * units * per_unit, transcendentals=trans)
    else:
        cost = products + conv.primitives(elementwise, dirs * units) + conv.weighted(add=bias * dirs * units)
        if clip is not None:
            cost += conv.weighted(cmp=2 * evals * dirs * units)
        for name, count in evaluations.items():
            cost += conv.primitives(_PRIMITIVES[name], count)
    if ctx.has_input(4):  # sequence_lens given: shorter sequences stop early
        return Bound(cost, "every sequence counted at the full padded length; sequence_lens may end some earlier")
    return cost


@formula("LSTM", family="recurrent")
def lstm(
    ctx: NodeContext,
    *,
    hidden_size: int | None = None,
    direction: str = "forward",
    layout: int = 0,
    activations: Sequence[str] | None = None,
    clip: float | None = None,
    **_,
) -> Cost:
    """FLOPs = 2·D·S·B·4H·(I + H) + D·S·B·H·(9 + 8 with B + 6 with P + 5 with clip); transcendentals =
    5·D·S·B·H with the default activations (3 sigmoids, 2 tanh per hidden unit and step).

    Per hidden unit and step: 5 activations (f on i, f, o; g on the cell candidate; h on C_t), the
    cell update C_t = f⊙C_{t−1} + i⊙c (3 FLOPs) and H_t = o⊙h(C_t) (1 FLOP); the biases Wb + Rb
    (8 adds) when B is given; the peepholes Pi⊙C_{t−1}, Pf⊙C_{t−1}, Po⊙C_t (3 multiplies, 3 adds)
    when P is given; 5 clips when ``clip`` is set. ``input_forget`` changes nothing (W still holds
    the forget gate's rows; 1 − i replaces its activation).
    """
    peephole = 6 if ctx.has_input(7) else 0
    own = {"mul": 3 + peephole // 2, "add": 1 + peephole // 2}
    return _recurrent(
        ctx, gates=4, uses=(3, 1, 1), defaults=("Sigmoid", "Tanh", "Tanh"), elementwise=own,
        hidden_size=hidden_size, direction=direction, layout=layout, activations=activations, clip=clip,
    )


@formula("GRU", family="recurrent")
def gru(
    ctx: NodeContext,
    *,
    hidden_size: int | None = None,
    direction: str = "forward",
    layout: int = 0,
    activations: Sequence[str] | None = None,
    clip: float | None = None,
    linear_before_reset: int = 0,
    **_,
) -> Cost:
    """FLOPs = 2·D·S·B·3H·(I + H) + D·S·B·H·(8 + 1 with linear_before_reset + 6 with B + 3 with clip);
    transcendentals = 3·D·S·B·H with the default activations (2 sigmoids, 1 tanh).

    Per hidden unit and step: 3 activations (f on z and r, g on h), the update
    H_t = (1 − z)⊙h + z⊙H_{t−1} (4 FLOPs) and the reset multiply: r⊙H_{t−1} before the product with
    Rh (1 FLOP) by default, or r⊙(H_{t−1}·Rhᵀ + Rbh) after it with ``linear_before_reset`` (1 FLOP,
    plus 1 add of the now separate X_t·Whᵀ term); the biases Wb + Rb (6 adds) when B is given;
    3 clips when ``clip`` is set.
    """
    own = {"add": 2 + (1 if linear_before_reset else 0), "mul": 3}
    return _recurrent(
        ctx, gates=3, uses=(2, 1), defaults=("Sigmoid", "Tanh"), elementwise=own,
        hidden_size=hidden_size, direction=direction, layout=layout, activations=activations, clip=clip,
    )


@formula("RNN", family="recurrent")
def rnn(
    ctx: NodeContext,
    *,
    hidden_size: int | None = None,
    direction: str = "forward",
    layout: int = 0,
    activations: Sequence[str] | None = None,
    clip: float | None = None,
    **_,
) -> Cost:
    """FLOPs = 2·D·S·B·H·(I + H) + D·S·B·H·(1 + 2 with B + 1 with clip); transcendentals = D·S·B·H
    with the default Tanh.

    H_t = f(X_t·Wᵀ + H_{t−1}·Rᵀ + Wb + Rb): one activation per hidden unit and step, the two bias
    adds when B is given, one clip when ``clip`` is set.
    """
    return _recurrent(
        ctx, gates=1, uses=(1,), defaults=("Tanh",), elementwise={},
        hidden_size=hidden_size, direction=direction, layout=layout, activations=activations, clip=clip,
    )


_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_FORWARD = {"LSTM": lstm, "GRU": gru, "RNN": rnn}


@backward("LSTM", "GRU", "RNN")
def recurrent_backward(ctx: NodeContext, **attrs) -> Cost:
    """Backpropagation through time: MACs = 2·(forward MACs), less the X_t·Wᵀ share once when X
    needs no gradient (dX_t = dgates·W is then skipped), and less D·B·g·H·H for the gradient into
    the initial hidden state, which is needed only when an ``initial_h`` that needs one is given;
    dH_{t−1} = dgates·R, dW = Σ dgatesᵀ·X_t, dR = Σ dgatesᵀ·H_{t−1}. Element-wise gate
    derivatives: twice the forward element-wise FLOPs (an estimate: each activation's derivative
    and the chain products)."""
    fwd = _FORWARD[ctx.op_type](ctx, **attrs)
    if isinstance(fwd, Bound):
        fwd = fwd.total
    fpm = ctx.convention.fc_flops_per_mac
    i = ctx.shape(0)[-1]
    directions, gh = ctx.shape(1)[0], ctx.shape(1)[1]
    h = gh // _GATES[ctx.op_type]
    batch = ctx.shape(0)[1 if attrs.get("layout", 0) == 0 else 0]
    macs = 2 * fwd.macs - (0 if ctx.needs_grad(0) else fwd.macs * i // (i + h))
    if not ctx.needs_grad(5):  # no gradient into initial_h
        macs -= directions * batch * gh * h
    return Cost(flops=fpm * macs + 2 * (fwd.flops - fpm * fwd.macs), macs=macs, transcendentals=fwd.transcendentals)


# --------------------------------------------------------------------------------------------
# saved for backward (flopcount.saved)

#: Activations whose derivative is a function of their output (σ′ = Y(1 − Y), tanh′ = 1 − Y², Relu): the output,
#: which the cell's products keep anyway, is all they keep.
_KEEP_OUTPUT = frozenset({"sigmoid", "tanh", "relu"})
#: Affine (alpha·x + beta) keeps nothing; every other activation keeps its input, the pre-activation.
_KEEP_NOTHING = frozenset({"affine"})


def _keeps_input(name: str) -> int:
    return 0 if name.lower() in _KEEP_OUTPUT | _KEEP_NOTHING else 1


@saves("LSTM", "GRU", "RNN")
def recurrent_saved(ctx: NodeContext, *, direction: str = "forward", layout: int = 0,
                    activations: Sequence[str] | None = None, clip: float | None = None,
                    hidden_size: int | None = None, linear_before_reset: int = 0, **_) -> Saved:
    """What backpropagation through time keeps when the ONNX equations run step by step, each gate its own
    tensor (as autograd keeps them for the cell written gate by gate in torch), in B·H tensors per step and
    direction:

    * LSTM: the four gate outputs, C_{t−1} (for f's gradient), h(C_t) (for o's), and H_{t−1} when R needs a
      gradient: 7; C_S once more where something keeps C_t (peepholes' Po⊙C_t, a clip, an ``h`` that keeps its
      input);
    * GRU: z, r, r⊙H_{t−1} (by default; H_{t−1}·Rhᵀ + Rbh with ``linear_before_reset``), the candidate, 1 − z and
      H_{t−1}: 6;
    * RNN: H_1 … H_S (f's outputs, each the next step's H_{t−1}) and H_0 when R needs a gradient; with an f that
      does not keep its output, H_0 … H_{S−1} when R needs a gradient;

    plus one per evaluation of an activation that keeps its input (not Sigmoid, Tanh, Relu, Affine) and one per
    clipped activation input (a clip keeps what it clips); X when W needs a gradient; the initial states by
    position when given (else the zeros that stand for them). In X's element type.

    A gate output only a product keeps is not kept at the first step when the state it multiplies needs no
    gradient (the zeros, or an initial state that is data): with an f that does not keep its output, the LSTM's
    forget gate and the GRU's update gate at t = 0 (and its reset gate, but with ``linear_before_reset``)."""
    op = ctx.op_type
    x = ctx.shape(0)
    steps, batch = (x[1], x[0]) if layout == 1 else (x[0], x[1])
    gates = _GATES[op]
    hidden = hidden_size if hidden_size is not None else ctx.shape(1)[1] // gates
    dirs = 2 if direction == "bidirectional" else 1
    defaults = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}[op]
    acts = [a.decode() if isinstance(a, bytes) else a for a in (activations or defaults)]
    n = len(defaults)
    r_grad = int(ctx.needs_grad(2))
    clipped = clip is not None
    per_step = once = 0  # B·H tensors, over all directions
    h0, c0 = bool(r_grad) or op == "GRU", op == "LSTM"  # whether the initial states are kept
    for d in range(dirs):
        names = acts[d * n:(d + 1) * n] if len(acts) >= (d + 1) * n else acts[:n]
        kept = [_keeps_input(name) for name in names]
        if op == "LSTM":  # f on i, o, f; g on the candidate; h on C_t (kept already as the next C_{t−1})
            per_step += 7 - 1 + r_grad + 3 * kept[0] + kept[1] + clipped * (4 + kept[2])
            once += 1 if ctx.has_input(7) or clipped or kept[2] else 0
            once -= names[0].lower() not in _KEEP_OUTPUT and not ctx.needs_grad(6)  # f ⊙ C_0 keeps C_0 only
        elif op == "GRU":
            per_step += 6 + 2 * kept[0] + kept[1] + 3 * clipped
            if names[0].lower() not in _KEEP_OUTPUT and not ctx.needs_grad(5):  # z ⊙ H_0, r ⊙ H_0 keep H_0 only
                once -= 1 if linear_before_reset else 2
        else:
            per_step += kept[0] + clipped
            if names[0].lower() in _KEEP_OUTPUT:
                per_step, once = per_step + 1, once + r_grad
            else:
                per_step += r_grad
    e = element_bytes(ctx.inputs[0].elem_type)
    state = dirs * batch * hidden  # one initial state of every direction
    tensors = steps * batch * hidden * per_step + batch * hidden * once
    inputs = [0] if ctx.needs_grad(1) else []
    for i, held in ((5, h0), (6, c0)):
        if held and ctx.has_input(i):  # the state at t = 0 is the given input, not zeros
            inputs.append(i)
            tensors -= state
    return Saved(inputs=tuple(inputs), extra=((f"{op} gates and states per step", e * tensors),))
