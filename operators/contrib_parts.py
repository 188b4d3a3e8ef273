"""What the Microsoft contrib operators' formulas share (:mod:`.contrib`, :mod:`.contrib_attention`,
:mod:`.contrib_normalization`): the domain, a fused activation's cost, and the node context of one default-domain
operator inside a fused node, from which a fused operator's backward is summed (see :mod:`.contrib`)."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from onnx import TensorProto

from flopcount.context import NodeContext, TensorInfo
from flopcount.cost import Cost
from flopcount.operators.elementwise import ELEMENTWISE, ELEMENTWISE_BACKWARD, elementwise_backward
from flopcount.operators.elementwise import activation as activation_cost

__all__ = ["MS", "Part", "activation", "activation_backward", "add_backward", "given", "input_info", "needs", "part",
           "rows", "static_shapes", "type_of"]

MS = "com.microsoft"


def activation(ctx: NodeContext, name: str, y: int) -> Cost:
    """One FLOP per output element for a fused activation (with its transcendentals from the
    element-wise table; weighted conventions: its primitive operations); nothing when ``name`` is
    empty."""
    if not name:
        return Cost()
    if name not in ELEMENTWISE:
        raise ValueError(f"unknown fused activation {name!r}; known: {', '.join(sorted(ELEMENTWISE))}")
    return activation_cost(ctx.convention, name, y)


def type_of(t: TensorInfo | None, default: int = 0) -> int:
    """A shape function's input's element type, ``default`` where it is omitted or unknown."""
    return t.elem_type if t is not None and t.elem_type else default


def static_shapes(inputs: Sequence[TensorInfo | None], *positions: int) -> list[tuple[int, ...]]:
    """A shape function's inputs' static shapes at ``positions``; a ``ValueError`` where one is unknown (the shape
    function then settles nothing)."""
    shapes = []
    for i in positions:
        t = inputs[i] if i < len(inputs) else None
        if t is None or not t.is_static:
            raise ValueError(f"input {i} has no static shape")
        shapes.append(t.shape)
    return shapes


def given(ctx: NodeContext, i: int) -> int:
    """1 when the fused node has its optional input ``i``, else 0."""
    return 1 if ctx.has_input(i) else 0


# --------------------------------------------------------------------------------------------
# backward (training): the sum of the backward formulas of the parts


Part = TensorInfo | tuple[int, ...] | None


def part(ctx: NodeContext, op_type: str, inputs: list[Part], outputs: list[Part], grads: list[bool],
          **fields) -> NodeContext:
    """The node context of ``op_type``, one default-domain operator inside the fused node: its input
    and output tensors (a fused node's own TensorInfo, a shape for an intermediate tensor, None for
    an omitted input) and which of its inputs need a gradient. ``fields`` replace more of the
    context (``opset``)."""

    def info(i: int, t: Part, side: str) -> TensorInfo | None:
        if t is None or isinstance(t, TensorInfo):
            return t
        return TensorInfo(f"{ctx.name}/{op_type}/{side}{i}", TensorProto.FLOAT, tuple(t))

    return ctx._replace(
        op_type=op_type,
        domain="",
        inputs=tuple(info(i, t, "in") for i, t in enumerate(inputs)),
        outputs=tuple(info(i, t, "out") for i, t in enumerate(outputs)),
        grads=tuple(bool(g) for g in grads),
        **fields,
    )


def needs(ctx: NodeContext, *inputs: int) -> bool:
    """Whether a tensor computed from these inputs needs a gradient."""
    return any(ctx.needs_grad(i) for i in inputs)


def input_info(ctx: NodeContext, i: int) -> TensorInfo | None:
    return ctx.inputs[i] if ctx.has_input(i) else None


def add_backward(ctx: NodeContext, a: Part, a_needs: bool, b: int | Part, b_needs: bool | None = None) -> Cost:
    """Backward of Add(a, b) with output a's shape: dA = dY and dB = dY, free, plus the sum of dY
    over the dims b broadcasts on (|Y| − |b| additions) when b needs a gradient. ``b`` is a fused
    input's position (nothing when omitted) or a part."""
    if isinstance(b, int):
        if not ctx.has_input(b):
            return Cost()
        b, b_needs = ctx.inputs[b], ctx.needs_grad(b)
    if not (a_needs or b_needs):
        return Cost()
    return elementwise_backward(part(ctx, "Add", [a, b], [a], [a_needs, b_needs]))


def activation_backward(ctx: NodeContext, name: str, y: Part, needs: bool) -> Cost:
    """Backward of the element-wise activation ``name`` over ``y``, as the default-domain operator's
    (nothing when ``name`` is empty or its input needs no gradient)."""
    if not name or not needs:
        return Cost()
    if name not in ELEMENTWISE_BACKWARD:
        raise ValueError(
            f"fused activation {name!r} has no backward formula; known: {', '.join(sorted(ELEMENTWISE_BACKWARD))}"
        )
    return elementwise_backward(part(ctx, name, [y], [y], [True]))


def rows(x: tuple[int, ...], axis: int = -1) -> int:
    """Rows of a normalization over the axes from ``axis`` on: the product of the dims before it."""
    return prod(x[: axis % len(x)]) if x else 1
