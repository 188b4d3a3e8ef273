"""Einsum, counted contraction by contraction from the equation and the input shapes.

The equation is first made explicit: spaces dropped, each ``...`` replaced by letters of its own
(right-aligned across operands, as numpy broadcasts them), and an implicit output (no ``->``) set
to the ellipsis dims followed by the letters that occur exactly once, in ASCII order, as the ONNX
spec says. A dim of size 1 broadcasts against the same letter's larger size elsewhere.

Order of contraction: one or two operands are contracted in one step, naively. With three or
more operands, the order is the one ``numpy.einsum_path(..., optimize="greedy")`` picks for these
shapes (numpy's default memory limit: no intermediate larger than the largest input or output),
computed on zero-stride dummy arrays so nothing is allocated. Each step is costed as below.
"""

from __future__ import annotations

from collections import Counter
from math import prod
from string import ascii_letters

import numpy as np

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, formula, saves
from flopcount.saved import Saved, keeps


def explicit(equation: str, shapes: list[tuple[int, ...]]) -> tuple[list[str], str, dict[str, int]]:
    """(input terms, output term, size of each letter) with ellipses expanded and the output made
    explicit. Raises ValueError when the equation does not fit the shapes."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"equation {equation!r} has {len(terms)} operand terms for {len(shapes)} inputs")
    free = [c for c in ascii_letters if c not in eq]
    ell_ranks = [len(s) - len(t.replace("...", "")) for t, s in zip(terms, shapes) if "..." in t]
    ell = "".join(free[: max(ell_ranks, default=0)])
    expanded = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            k = len(s) - len(t.replace("...", ""))
            t = t.replace("...", ell[len(ell) - k :] if k else "")
        if len(t) != len(s):
            raise ValueError(f"term {t!r} of equation {equation!r} does not fit an input of rank {len(s)}")
        expanded.append(t)
    sizes: dict[str, int] = {}
    for t, s in zip(expanded, shapes):
        for c, d in zip(t, s):
            if sizes.get(c, 1) == 1:
                sizes[c] = d
            elif d not in (1, sizes[c]):
                raise ValueError(f"letter {c!r} of equation {equation!r} has sizes {sizes[c]} and {d}")
    if arrow:
        out = rhs.replace("...", ell)
    else:
        once = Counter(lhs.replace("...", "").replace(",", ""))
        out = ell + "".join(sorted(c for c, k in once.items() if k == 1))
    return expanded, out, sizes


def contraction(terms: list[str], out: str, sizes: dict[str, int], flops_per_mac: int) -> Cost:
    """Cost of one naive contraction of k operands into the letters ``out``: P = product of the sizes
    of all distinct letters. k = 1: P − |out| additions (0 for a transpose or diagonal). k ≥ 2 with
    a summed letter: P MACs plus (k − 2)·P multiplies. k ≥ 2 without one: (k − 1)·P multiplies."""
    letters = set("".join(terms))
    p = prod(sizes[c] for c in letters)
    kept = prod(sizes[c] for c in set(out))
    k = len(terms)
    if k == 1:
        return Cost(flops=p - kept)
    if letters - set(out):
        return Cost(flops=flops_per_mac * p + (k - 2) * p, macs=p)
    return Cost(flops=(k - 1) * p)


def path(terms: list[str], out: str, sizes: dict[str, int]) -> list[tuple[int, ...]]:
    """Contraction order: one step for one or two operands, numpy's greedy order for more."""
    if len(terms) <= 2:
        return [tuple(range(len(terms)))]
    dummies = [np.broadcast_to(np.empty(()), tuple(sizes[c] for c in t)) for t in terms]
    steps, _ = np.einsum_path(",".join(terms) + "->" + out, *dummies, optimize="greedy")
    return [tuple(s) for s in steps[1:]]


@formula("Einsum", family="matmul")
def einsum(ctx: NodeContext, *, equation: str, **_) -> Cost:
    """FLOPs = Σ over contraction steps, with P = product of the sizes of the distinct indices a step
    touches: a step of k ≥ 2 operands that sums an index costs P MACs (2·P FLOPs, P under
    ``table3``) plus (k − 2)·P multiplies; one that sums none, (k − 1)·P multiplies; a one-operand
    step (sum, trace, diagonal, transpose) P − |out| additions.

    Two operands are one naive step (``bij,bjk->bik``: P = B·I·J·K, FLOPs 2·B·I·J·K as MatMul);
    three or more follow numpy.einsum_path(optimize="greedy")'s order, each pairwise step costed
    alone, the intermediate keeping the indices needed later or in the output (numpy makes one
    k-operand step when every index is kept, e.g. ``ij,ij,ij->ij``). Implicit output, ``...``
    broadcasting and repeated indices (traces, diagonals) follow the ONNX spec. Integer inputs:
    the same count in ``int_ops`` (MACs still in ``macs``).
    """
    shapes = [ctx.shape(i) for i in range(len(ctx.inputs)) if ctx.has_input(i)]
    terms, out, sizes = explicit(equation, shapes)
    total = Cost()
    operands = list(terms)
    steps = path(terms, out, sizes)
    for n, step in enumerate(steps):
        chosen = [operands[i] for i in step]
        for i in sorted(step, reverse=True):
            del operands[i]
        needed = set("".join(operands)) | set(out)
        result = out if n == len(steps) - 1 else "".join(sorted(set("".join(chosen)) & needed))
        total = total + contraction(chosen, result, sizes, ctx.convention.fc_flops_per_mac)
        operands.append(result)
    if not ctx.in_is_float(0):
        return Cost(macs=total.macs, int_ops=total.flops)
    return total


@backward("Einsum")
def einsum_backward(ctx: NodeContext, *, equation: str, **_) -> Cost:
    """The forward cost once per operand that needs a gradient: each operand's gradient is an einsum
    of dY with the other operands over the same indices (exact for two operands; with more, each
    gradient is counted as its own contraction, without sharing partial products)."""
    fwd = einsum(ctx, equation=equation)
    k = sum(ctx.needs_grad(i) for i in range(len(ctx.inputs)))
    return k * fwd


@saves("Einsum")
def einsum_saved(ctx: NodeContext, **_) -> Saved:
    """Every operand another operand's gradient reads: each operand, when some other one needs a gradient."""
    n = len(ctx.inputs)
    return keeps(*(j for j in range(n) if any(ctx.needs_grad(i) for i in range(n) if i != j)))
