"""Control flow: If, Loop, Scan and SequenceMap count their bodies with the same machinery,
recursively, forward and (If, Loop, Scan) backward, and keep for the backward what their bodies' nodes keep,
once per run; sequence containers are zero-cost."""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Bound, Breakdown, Cost
from flopcount.errors import ShapeError, UsageError
from flopcount.registry import backward, formula, saves, saves_nothing, zero_cost
from flopcount.reporting.report import tensor_bytes
from flopcount.saved import Saved


def _larger(a: Cost, b: Cost) -> Cost:
    return a if (a.flops, a.int_ops) >= (b.flops, b.int_ops) else b


@formula("If", family="control-flow")
def if_(ctx: NodeContext, *, then_branch, else_branch, **_) -> Breakdown:
    """FLOPs = cost of the branch taken when the condition is a known constant (the other branch
    is not counted), else max(then_branch, else_branch), the larger by FLOPs: an upper bound, with
    both branches reported.
    """
    cond = ctx.value(0)
    if cond is not None and cond.size == 1:
        label, branch = ("then_branch", then_branch) if bool(cond.reshape(-1)[0]) else ("else_branch", else_branch)
        taken = ctx.subgraph_cost(branch)
        return Breakdown(taken, ((label, taken),))
    then_cost, else_cost = ctx.subgraph_cost(then_branch), ctx.subgraph_cost(else_branch)
    return Bound(
        Breakdown(_larger(then_cost, else_cost), (("then_branch", then_cost), ("else_branch", else_cost))),
        "the condition is computed at run time: the larger branch is counted",
    )


def _trips(ctx: NodeContext, what: str, known: int | None) -> int:
    if ctx.trips is not None:
        if known is not None and 0 <= known < ctx.trips:
            raise UsageError(f"node {ctx.name!r} ({ctx.op_type}): --loop-trips {ctx.name}={ctx.trips} is more than "
                             f"{what}'s maximum {known}, which it cannot exceed; give at most {known}")
        return ctx.trips
    if known is not None:
        if known < 0:
            raise ShapeError(f"node {ctx.name!r} ({ctx.op_type}): {what} is {known}; it cannot be negative")
        return known
    raise ShapeError(
        f"node {ctx.name!r} ({ctx.op_type}): {what} is not known from the graph; give it with "
        f"--loop-trips {ctx.name}=N (in Python: loop_trips={{{ctx.name!r}: N}})"
    )


@backward("If")
def if_backward(ctx: NodeContext, *, then_branch, else_branch, **_) -> Cost:
    """Backward = the backward of the branch taken when the condition is a known constant, else the
    larger of the two branches' backward (an upper bound, as the forward).

    A branch has no inputs of its own: what needs a gradient inside it follows from the tensors it
    reads from the enclosing graph (weights, activations that need one).
    """
    cond = ctx.value(0)
    if cond is not None and cond.size == 1:
        return ctx.subgraph_backward(then_branch if bool(cond.reshape(-1)[0]) else else_branch)
    return _larger(ctx.subgraph_backward(then_branch), ctx.subgraph_backward(else_branch))


def _loop_trips(ctx: NodeContext) -> int:
    m = ctx.value(0) if ctx.has_input(0) else None
    return _trips(ctx, "its trip count", int(m.reshape(-1)[0]) if m is not None and m.size == 1 else None)


@formula("Loop", family="control-flow")
def loop(ctx: NodeContext, *, body, **_) -> Breakdown:
    """FLOPs = M · body, with M the trip-count input when it is a constant (or resolvable from
    shapes), else the count given with ``--loop-trips NODE=N``.

    A loop whose condition ends it before M iterations is counted as running M times (an upper
    bound), and its stacked (scan) outputs as M long (shape resolution takes them so), which bounds what
    reads them too: the reason says so. A loop without M (a while loop) needs ``--loop-trips``.
    """
    trips = _loop_trips(ctx)
    per_iteration = ctx.subgraph_cost(body)
    counted = Breakdown(trips * per_iteration, (("body per iteration", per_iteration),))
    if ctx.trips is None and ctx.has_input(1):  # a condition may end the loop before M iterations
        stacked = len(body.output) - 1 - (len(body.input) - 2)
        what = "stacked output" if stacked == 1 else f"{stacked} stacked outputs"
        also = f", and its {what} taken {trips} long" if stacked > 0 else ""
        return Bound(counted, f"{trips} iterations counted{also}; the loop's condition may end it earlier")
    return counted


@backward("Loop")
def loop_backward(ctx: NodeContext, *, body, **_) -> Cost:
    """Backward = M · (backward of one iteration), M as in the forward: backpropagation through the
    iterations, each one's body backward given which loop-carried values need a gradient (those
    whose initial value needs one, or whose body output comes to need one, as through the carry)
    and what the body reads from the enclosing graph.

    The first iteration computes input gradients only for the carried values whose initial value
    needs one; later ones also for those the carry reaches. Intermediate values are taken as kept
    from the forward (not recomputed); the iteration number and condition never get a gradient.
    """
    carried_inputs = body.input[2:]
    needs = [vi.name for k, vi in enumerate(carried_inputs) if ctx.needs_grad(2 + k)]
    pairs = [(out.name, vi.name) for out, vi in zip(body.output[1:], carried_inputs)]
    return _through_time(ctx, body, _loop_trips(ctx), needs, pairs)


def _through_time(ctx: NodeContext, body, steps: int, needs: list[str], pairs: list) -> Cost:
    """``steps`` iterations of a body's backward: the first with the carried values that need a
    gradient from the start, every later one with those the carry makes need one as well."""
    if steps <= 0:
        return Cost()
    first = ctx.subgraph_backward(body, needs)
    later = ctx.subgraph_backward(body, needs, pairs) if steps > 1 else Cost()
    return first + (steps - 1) * later


@formula("Scan", family="control-flow")
def scan(ctx: NodeContext, *, body, num_scan_inputs: int, scan_input_axes=None, **_) -> Breakdown:
    """FLOPs = L · body, with L the length of the scanned axis of the first scan input
    (``scan_input_axes[0]``, default 0); Scan-8 runs its body once per batch element and step: B · L.
    """
    first = ctx.n_inputs - num_scan_inputs if ctx.opset >= 9 else len(ctx.inputs) - num_scan_inputs
    x = ctx.shape(first)
    if ctx.opset >= 9:
        axis = (scan_input_axes or [0])[0]
        runs = x[axis % len(x)]
    else:
        runs = x[0] * x[1]  # Scan-8: [batch, sequence, ...]
    per_step = ctx.subgraph_cost(body)
    return Breakdown(runs * per_step, (("body per iteration", per_step),))


@backward("Scan")
def scan_backward(ctx: NodeContext, *, body, num_scan_inputs: int, scan_input_axes=None, **_) -> Cost:
    """Backward = L · (backward of one step), L as in the forward: per step, the body's backward
    given which states (those whose initial value needs a gradient, or whose body output comes to
    need one) and which scan inputs need a gradient, and what the body reads from outside.
    """
    n_states = len(ctx.inputs) - num_scan_inputs
    first = ctx.n_inputs - num_scan_inputs if ctx.opset >= 9 else n_states
    x = ctx.shape(first)
    runs = x[(scan_input_axes or [0])[0] % len(x)] if ctx.opset >= 9 else x[0] * x[1]
    offset = 0 if ctx.opset >= 9 else 1  # Scan-8's first input is sequence_lens
    formal = body.input
    needs = [formal[i - offset].name for i in range(offset, len(ctx.inputs)) if ctx.needs_grad(i) and i - offset < len(formal)]
    pairs = [(out.name, vi.name) for out, vi in zip(body.output[: n_states - offset], formal[: n_states - offset])]
    return _through_time(ctx, body, runs, needs, pairs)


@formula("SequenceMap", family="control-flow")
def sequence_map(ctx: NodeContext, *, body, **_) -> Breakdown:
    """FLOPs = n · body for a sequence of n elements; n is given with ``--loop-trips NODE=n``
    (sequence lengths are run-time values)."""
    n = _trips(ctx, "the length of its input sequence", None)
    per_element = ctx.subgraph_cost(body)
    return Breakdown(n * per_element, (("body per element", per_element),))


@backward("SequenceMap")
def sequence_map_backward(ctx: NodeContext, *, body, **_) -> Cost:
    """Backward = n · (backward of the body for one element), n as in the forward: per element,
    the body's backward given which of its inputs need a gradient (those whose sequence or tensor
    does) and what it reads from outside.
    """
    n = _trips(ctx, "the length of its input sequence", None)
    needs = [vi.name for i, vi in enumerate(body.input) if ctx.needs_grad(i)]
    return n * ctx.subgraph_backward(body, needs)


zero_cost(
    "SequenceConstruct", "SequenceEmpty", "SequenceAt", "SequenceErase", "SequenceInsert", "SequenceLength",
    "SplitToSequence", "ConcatFromSequence",
    family="sequence",
    reason="builds, splits or reads containers of tensors; no arithmetic",
)  # fmt: skip
# their gradients are moved between containers and tensors by shapes and positions only
saves_nothing("SequenceConstruct", "SequenceEmpty", "SequenceAt", "SequenceErase", "SequenceInsert", "SequenceLength",
              "SplitToSequence", "ConcatFromSequence")


def _body_saved(ctx: NodeContext, b, runs: int, carried: list[tuple[str, str, int, int]],
                sliced: list[tuple[str, int]], what: str) -> Saved:
    """The :class:`~flopcount.saved.Saved` of ``runs`` runs of a body that keeps ``b``
    (:class:`~flopcount.saved.BodySaved`): what its nodes make and their statistics each run; a carried value
    (``carried``: body input, body output, node input and output positions) it keeps is the node's input in the
    first run and the run before's output after it, counted once when the body keeps that output too, whose last
    run's value is the node's output; a scanned input it keeps slice by slice (``sliced``: body input, node input
    position) is the node's whole input; activations of the enclosing graph it keeps, once (an upper bound where a
    node there keeps the same tensor)."""
    inputs: list[int] = []
    outputs: list[int] = []
    again = 0
    for formal, out, pos, out_pos in carried:
        kept_out = out in b.outputs and runs > 0 and out_pos < len(ctx.outputs) and ctx.outputs[out_pos] is not None
        if kept_out:  # the last run's output is the node's: kept as the node's output, not in the runs' bytes
            outputs.append(out_pos)
            again -= tensor_bytes(ctx.outputs[out_pos]) or 0
        if formal in b.formal:
            inputs.append(pos)
            if not kept_out and runs > 1:
                t = ctx.inputs[pos] if pos < len(ctx.inputs) else None
                again += (runs - 1) * (tensor_bytes(t) or 0) if t is not None else 0
    inputs += [pos for formal, pos in sliced if formal in b.formal]
    total = max(runs * (b.made + b.extra) + again, 0)
    extra = ((f"{what}, {runs} runs", total),) if total else ()
    if b.outer:
        extra += (("activations of the enclosing graph the body keeps", b.outer),)
    return Saved(tuple(sorted(set(inputs))), tuple(outputs), extra, b.missing, b.unsized)


@saves("Loop")
def loop_saved(ctx: NodeContext, *, body, **_) -> Saved:
    """M runs of the body's kept tensors (M as in the forward): what its nodes keep (their saved-for-backward
    rules, each run its own tensors), each iteration's carried value where the body keeps it (the Loop's initial
    value in the first; once when the body keeps the output it becomes too), activations of the enclosing graph
    once. The body's gradients are planned as in the backward's later iterations (the first keeps at most as
    much)."""
    carried_inputs = body.input[2:]
    needs = [vi.name for k, vi in enumerate(carried_inputs) if ctx.needs_grad(2 + k)]
    pairs = [(out.name, vi.name) for out, vi in zip(body.output[1:], carried_inputs)]
    b = ctx.subgraph_saved(body, needs, pairs)
    carried = [(vi.name, out.name, 2 + k, k) for k, (out, vi) in enumerate(zip(body.output[1:], carried_inputs))]
    return _body_saved(ctx, b, _loop_trips(ctx), carried, [], "body per iteration")


@saves("Scan")
def scan_saved(ctx: NodeContext, *, body, num_scan_inputs: int, scan_input_axes=None, **_) -> Saved:
    """L runs of the body's kept tensors (L as in the forward), states as a Loop's carried values, a scan input
    the body keeps slice by slice as the Scan's whole input."""
    n_states = len(ctx.inputs) - num_scan_inputs
    first = ctx.n_inputs - num_scan_inputs if ctx.opset >= 9 else n_states
    x = ctx.shape(first)
    runs = x[(scan_input_axes or [0])[0] % len(x)] if ctx.opset >= 9 else x[0] * x[1]
    offset = 0 if ctx.opset >= 9 else 1
    formal = body.input
    needs = [formal[i - offset].name for i in range(offset, len(ctx.inputs)) if ctx.needs_grad(i) and i - offset < len(formal)]
    pairs = [(out.name, vi.name) for out, vi in zip(body.output[: n_states - offset], formal[: n_states - offset])]
    b = ctx.subgraph_saved(body, needs, pairs)
    carried = [(vi.name, out.name, offset + k, k) for k, (out, vi) in enumerate(zip(
        body.output[: n_states - offset], formal[: n_states - offset]))]
    sliced = [(formal[i - offset].name, i) for i in range(n_states, len(ctx.inputs)) if i - offset < len(formal)]
    return _body_saved(ctx, b, runs, carried, sliced, "body per step")


@saves("If")
def if_saved(ctx: NodeContext, *, then_branch, else_branch, **_) -> Saved:
    """The branch taken when the condition is a known constant, else the branch that keeps more: an upper
    bound, as the FLOPs."""
    cond = ctx.value(0)
    if cond is not None and cond.size == 1:
        b = ctx.subgraph_saved(then_branch if bool(cond.reshape(-1)[0]) else else_branch)
    else:
        b = max((ctx.subgraph_saved(then_branch), ctx.subgraph_saved(else_branch)),
                key=lambda x: x.made + x.extra + x.outer)
    return _body_saved(ctx, b, 1, [], [], "branch")


@saves("SequenceMap")
def sequence_map_saved(ctx: NodeContext, *, body, **_) -> Saved:
    """n runs of the body's kept tensors (n as in the forward); an input it keeps element by element as the
    SequenceMap's input."""
    n = _trips(ctx, "the length of its input sequence", None)
    needs = [vi.name for i, vi in enumerate(body.input) if ctx.needs_grad(i)]
    b = ctx.subgraph_saved(body, needs)
    return _body_saved(ctx, b, n, [], [(vi.name, i) for i, vi in enumerate(body.input)], "body per element")
