"""Counts as exact formulas in the dims left as names: ``--symbolic`` (``input_ids=BxS``, or an ONNX ``dim_param``).

Where a model's cost is a polynomial in some dims (batch, sequence length, image side ...), its coefficients are
found exactly from counts: along each named dim the model is counted at consecutive sizes until a finite
difference vanishes (the degree in that dim, at most :data:`MAX_DEGREE`), then on the grid those degrees need,
and the polynomial through those counts is solved for in exact rational arithmetic. It is then checked at sizes
off the grid; where a count disagrees (pooling strides round, a shape depends on data), there is no polynomial
and :class:`NotPolynomialError` says where, rather than a formula that is wrong elsewhere.

Every figure of the count gets its formula: total, forward and backward FLOPs, MACs, and FLOPs per operator type.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..errors import ShapeError, UsageError

__all__ = ["MAX_DEGREE", "Formula", "NotPolynomialError", "Polynomial", "fit", "parse_symbolic_dims",
           "symbolic_count"]

#: The highest degree looked for in one dim (attention is 2 in the sequence length; a 3-D volume's side is 3).
MAX_DEGREE = 4
#: Size each named dim starts from, unless given: 2 (1 may be special-cased by exporters and broadcasting).
DEFAULT_START = 2
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class NotPolynomialError(ShapeError):
    """The count is not a polynomial in the named dims (exit 5): the message gives a size where it disagrees."""


@dataclass(frozen=True)
class Polynomial:
    """A polynomial in ``variables``: ``terms`` are (coefficient, powers) pairs, highest total degree first.

    >>> p = Polynomial(("B", "S"), ((Fraction(4), (1, 2)), (Fraction(6), (1, 1))))
    >>> str(p), p(B=2, S=3)
    ('4·B·S² + 6·B·S', 108)
    """

    variables: tuple[str, ...]
    terms: tuple[tuple[Fraction, tuple[int, ...]], ...]

    def __call__(self, **values: int) -> Fraction | int:
        total = sum((c * _monomial(powers, [values[v] for v in self.variables]) for c, powers in self.terms),
                    Fraction(0))
        return int(total) if total.denominator == 1 else total

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for i, (c, powers) in enumerate(self.terms):
            factors = [f"{v}{_superscript(p)}" for v, p in zip(self.variables, powers) if p]
            size = abs(c)
            number = str(size.numerator) if size.denominator == 1 else f"{size.numerator}/{size.denominator}"
            body = "·".join(([number] if size != 1 or not factors else []) + factors)
            sign = ("-" if c < 0 else "") if i == 0 else (" - " if c < 0 else " + ")
            parts.append(sign + body)
        return "".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """``{variables, terms: [{coefficient, powers}]}``: an integer coefficient as a number, another as
        ``"p/q"``."""
        return {"variables": list(self.variables), "terms": [
            {"coefficient": int(c) if c.denominator == 1 else f"{c.numerator}/{c.denominator}",
             "powers": list(powers)} for c, powers in self.terms]}


@dataclass(frozen=True)
class Formula:
    """The formulas of one count (see the module docstring) and the sizes they were found and checked at."""

    variables: tuple[str, ...]
    flops: Polynomial
    macs: Polynomial
    forward_flops: Polynomial
    backward_flops: Polynomial
    by_op_type: Mapping[str, Polynomial]
    degrees: Mapping[str, int]
    counted_at: tuple[Mapping[str, int], ...] = field(default=())  # every size counted
    checked_at: tuple[Mapping[str, int], ...] = field(default=())  # sizes off the grid that the formulas matched

    def as_dict(self) -> dict[str, Any]:
        return {"variables": list(self.variables), "degrees": dict(self.degrees),
                "formula": self.flops.as_dict(), "macs": self.macs.as_dict(),
                "forward_flops": self.forward_flops.as_dict(), "backward_flops": self.backward_flops.as_dict(),
                "by_op_type": {k: p.as_dict() for k, p in self.by_op_type.items()},
                "counted": len(self.counted_at), "checked_at": [dict(p) for p in self.checked_at]}


def _monomial(powers: Sequence[int], values: Sequence[int]) -> int:
    out = 1
    for p, x in zip(powers, values):
        out *= x**p
    return out


def _superscript(p: int) -> str:
    return "" if p == 1 else str(p).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def _figures(report) -> dict[str, int]:
    """The figures that get a formula, by name."""
    out = {"flops": report.total.flops, "macs": report.total.macs, "forward_flops": report.forward.flops,
           "backward_flops": report.backward.flops}
    out.update({f"op:{k}": s.cost.flops + s.backward.flops for k, s in report.by_op_type.items()})
    return out


def fit(count: Callable[[Mapping[str, int]], Mapping[str, int]], variables: Sequence[str],
        start: Mapping[str, int] | None = None, max_degree: int = MAX_DEGREE) -> tuple[dict[str, Polynomial],
                                                                                      dict[str, int], list, list]:
    """Polynomials in ``variables`` through the figures ``count(sizes)`` gives (name → integer), exactly.

    Returns (figure name → polynomial, degrees, sizes counted, sizes checked). Raises
    :class:`NotPolynomialError` where no polynomial of degree at most ``max_degree`` per variable fits.

    >>> polys, degrees, _, _ = fit(lambda s: {"f": 3 * s["n"] ** 2 + s["n"] * s["m"]}, ["n", "m"])
    >>> str(polys["f"]), degrees
    ('3·n² + n·m', {'n': 2, 'm': 1})
    """
    variables = tuple(variables)
    start = {v: (start or {}).get(v, DEFAULT_START) for v in variables}
    cache: dict[tuple[int, ...], Mapping[str, int]] = {}

    def at(values: tuple[int, ...]) -> Mapping[str, int]:
        if values not in cache:
            cache[values] = dict(count(dict(zip(variables, values))))
        return cache[values]

    base = tuple(start[v] for v in variables)
    # a degree is first taken where one finite difference vanishes; should the formula then miss a size off the
    # grid, where two consecutive ones do (the sizes already counted are reused), before refusing
    # grid, where two consecutive ones do (the sizes already counted are reused); and should that miss too (a
    # polynomial whose first values vanish looks flat), the whole grid up to the highest degree, before refusing
    try:
        return _fit(at, variables, start, {v: _degree(at, base, i, max_degree, v, 1) for i, v in enumerate(variables)},
                    cache)
    except NotPolynomialError:
        pass
    try:
        return _fit(at, variables, start, {v: _degree(at, base, i, max_degree, v, 2) for i, v in enumerate(variables)},
                    cache)
    except NotPolynomialError:
        return _fit(at, variables, start, {v: max_degree for v in variables}, cache)


def _fit(at, variables: tuple[str, ...], start: Mapping[str, int], degrees: Mapping[str, int], cache):
    """The polynomials of the given degrees through the grid of counts, checked off the grid."""
    grid = [range(start[v], start[v] + degrees[v] + 1) for v in variables]
    points = list(itertools.product(*grid))
    names = sorted(set().union(*(at(p).keys() for p in points)))
    monomials = list(itertools.product(*(range(degrees[v] + 1) for v in variables)))
    rows = [[Fraction(_monomial(m, p)) for m in monomials] for p in points]
    solved = _solve(rows, [[Fraction(at(p).get(n, 0)) for n in names] for p in points])
    polys = {}
    for j, name in enumerate(names):
        terms = [(solved[k][j], m) for k, m in enumerate(monomials) if solved[k][j]]
        terms.sort(key=lambda t: (-sum(t[1]), tuple(-p for p in t[1])))
        polys[name] = Polynomial(variables, tuple(terms))
    # the degrees the formulas have (a fit over a larger grid finds the higher powers' coefficients zero)
    degrees = {v: max((powers[i] for p in polys.values() for _, powers in p.terms), default=0)
               for i, v in enumerate(variables)}
    checked = []
    for offset in (2, 5):  # sizes off the grid, every variable at once
        point = tuple(start[v] + len(g) + offset + i for i, (v, g) in enumerate(zip(variables, grid)))
        figures = at(point)
        values = dict(zip(variables, point))
        for name in set(names) | set(figures):
            want, got = figures.get(name, 0), polys[name](**values) if name in polys else 0
            if want != got:
                raise NotPolynomialError(
                    f"the count is not a polynomial in {', '.join(variables)}: at "
                    f"{', '.join(f'{v}={x}' for v, x in values.items())} {name.removeprefix('op:')} is {want:,}, "
                    f"the formula through smaller sizes gives {got:,} (rounding in pooling or strides, or a shape "
                    "that depends on data); count at fixed sizes, or list them with --sweep")
        checked.append(values)
    return polys, degrees, [dict(zip(variables, p)) for p in cache], checked


def _degree(at, base: tuple[int, ...], i: int, max_degree: int, name: str, confirm: int) -> int:
    """The degree in variable ``i``: the first order whose finite differences vanish at ``confirm`` places."""
    series = []
    for k in range(max_degree + 1 + confirm):
        values = list(base)
        values[i] += k
        series.append(at(tuple(values)))
        names = set().union(*(s.keys() for s in series))
        for degree in range(len(series) - confirm):
            if all(_difference([s.get(n, 0) for s in series], degree + 1)[:confirm] == [0] * confirm for n in names):
                return degree
    sizes = f"{base[i]} to {base[i] + max_degree + confirm}"
    raise NotPolynomialError(
        f"the count is not a polynomial in {name} of degree {max_degree} or less: its finite differences over "
        f"{name} = {sizes} never vanish (rounding in pooling or strides, or a shape that depends on data); count "
        "at fixed sizes, or list them with --sweep")


def _difference(values: list[int], order: int) -> list[int]:
    for _ in range(order):
        values = [b - a for a, b in zip(values, values[1:])]
    return values


def _solve(a: list[list[Fraction]], b: list[list[Fraction]]) -> list[list[Fraction]]:
    """Solve a·x = b exactly (Gauss-Jordan on fractions); a is square and invertible (a tensor grid)."""
    n = len(a)
    m = [row[:] + rhs[:] for row, rhs in zip(a, b)]
    for col in range(n):
        pivot = next(r for r in range(col, n) if m[r][col] != 0)
        m[col], m[pivot] = m[pivot], m[col]
        inv = 1 / m[col][col]
        m[col] = [x * inv for x in m[col]]
        for r in range(n):
            if r != col and m[r][col] != 0:
                factor = m[r][col]
                m[r] = [x - factor * y for x, y in zip(m[r], m[col])]
    return [row[n:] for row in m]


def parse_symbolic_dims(text: str) -> tuple[int | str, ...]:
    """``"BxS"``, ``"1xS"``, ``"8x3x224x224"`` → dims, names kept as strings.

    >>> parse_symbolic_dims("Bx3xHxH")
    ('B', 3, 'H', 'H')
    """
    out: list[int | str] = []
    for part in re.split(r"[x,×*]", text.strip()) if text.strip() else []:
        part = part.strip()
        if part.isdigit() and int(part) > 0:
            out.append(int(part))
        elif _NAME.match(part):
            out.append(part)
        else:
            raise UsageError(f"cannot read dim {part!r} of {text!r}: give positive integers or names (BxS)")
    return tuple(out)


def symbolic_count(model, input_shapes: Mapping[str, Sequence[int | str]] | None = None, *,
                   start: Mapping[str, int] | None = None, max_degree: int = MAX_DEGREE,
                   count: Callable | None = None, **count_kwargs: Any) -> Formula:
    """Formulas of ``model``'s count in the dims named in ``input_shapes`` (``{"input_ids": ("B", "S")}``) and
    in the ``dim_param`` names of its inputs that ``input_shapes`` leaves open.

    ``start``: the size each name is first counted at (default 2; give more where a model needs it, a
    convolution's input side, for one). ``count``: for a framework model, the function that exports and counts it
    at given sizes, called as ``count(model, input_shapes=..., **count_kwargs)`` (default: ``model`` is an ONNX
    model, counted by :func:`flopcount.count`).
    """
    from ..counting import count as default_count
    from ..pipeline.loading import load

    if count is None:  # an ONNX model: parsed once, its weightless proto counted at every size
        model = load(model).model
        count = default_count
        inputs = _graph_inputs(model)
    else:  # a framework model: ``count`` exports it at each size
        inputs = {}
    given = {k: tuple(v) for k, v in (input_shapes or {}).items()}
    shapes: dict[str, tuple[int | str, ...]] = {}
    for name, dims in inputs.items():
        shapes[name] = given.get(name, dims)
    for name, dims in given.items():
        if name not in shapes:
            shapes[name] = dims  # an unknown name: count() refuses it with the list of inputs
    variables = tuple(dict.fromkeys(d for dims in shapes.values() for d in dims if isinstance(d, str)))
    for name in start or {}:
        if name not in variables:
            raise UsageError(f"--symbolic {name}=...: no input has a dim named {name!r}; the named dims are "
                             f"{', '.join(variables) or 'none'}")
    if not variables:
        raise UsageError("--symbolic: no input dim is a name; give one with --input-shape (input_ids=BxS) or "
                         "leave a dim_param of the model open")

    def figures(values: Mapping[str, int]) -> Mapping[str, int]:
        concrete = {n: tuple(values[d] if isinstance(d, str) else d for d in dims) for n, dims in shapes.items()}
        return _figures(count(model, input_shapes=concrete, **count_kwargs))

    polys, degrees, counted, checked = fit(figures, variables, start, max_degree)
    empty = Polynomial(variables, ())
    return Formula(variables, polys.get("flops", empty), polys.get("macs", empty), polys.get("forward_flops", empty),
                   polys.get("backward_flops", empty),
                   {k.removeprefix("op:"): p for k, p in polys.items() if k.startswith("op:")},
                   degrees, tuple(counted), tuple(checked))


def _graph_inputs(m) -> dict[str, tuple[int | str, ...]]:
    """The real inputs of a graph (initializers left out) with their declared dims: ints, ``dim_param`` names."""
    inits = {t.name for t in m.graph.initializer}
    out = {}
    for vi in m.graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type"):
            continue
        dims = []
        for d in vi.type.tensor_type.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else d.dim_param or "?")
        out[vi.name] = tuple(dims)
    return {k: v for k, v in out.items() if "?" not in v}
