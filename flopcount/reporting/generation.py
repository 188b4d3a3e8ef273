"""What autoregressive generation costs: a prefill over the prompt, then one-token decode steps over a KV cache.

Arithmetic on plain numbers: the counts of the graphs come in (:mod:`flopcount.frontends.generate` exports and
counts them), the :class:`Generation` record comes out.

``generate(P, N)`` of a causal LM, as transformers' ``generate()`` runs it with a KV cache:

* the *prefill* runs the P prompt tokens at once and computes the logits of the last position only
  (``logits_to_keep=1``); it yields the first new token;
* decode step j (j = 1 … N−1) runs one token, generated token j, over a cache of the P + j − 1 positions
  before it: its attention spans a *context* of P + j positions. Step N−1 yields token N.

The cost of a decode step is affine in its context length c for attention over a plain KV cache:
``step(c) = constant + per_position · c`` (the projections, MLP and head are per token; QKᵀ and AV grow with c).
The decode total is therefore ``(N−1)·constant + per_position · Σ_{j=1}^{N−1} (P + j)``, exactly. Where a
sliding window of w keys crops the cache, the step is affine on each side of c = w: the contexts are cut
there (:func:`segments`) and each piece has its own line.

An encoder-decoder's ``generate()`` runs its encoder once over the prompt and the decoder's first step over its
start token (together the prefill); decode step j runs over the decoder's own cache of j positions (context
j + 1) and the cross-attention keys and values cached at the first step: affine in c the same way
(:attr:`Generation.encoder_decoder`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..cost import Cost
from ..errors import UsageError

__all__ = ["MAX_GENERATE_TOKENS", "DecodePiece", "Generation", "affine_steps", "check_generate", "context_lengths", "parse_generate",
           "segments"]


#: The most prompt or new tokens ``generate`` counts (2**40): more is no sequence a model runs.
MAX_GENERATE_TOKENS = 2**40


def check_generate(prompt_tokens, new_tokens) -> tuple[int, int]:
    """``(P, N)`` as ints, both at least 1 and at most :data:`MAX_GENERATE_TOKENS`; a :class:`UsageError`
    otherwise."""
    values = []
    for name, v in (("prompt tokens P", prompt_tokens), ("new tokens N", new_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"generate: the {name} must be a positive integer, got {v!r}; give P:N such as "
                             "--generate 128:64 (generate=(128, 64))")
        if v > MAX_GENERATE_TOKENS:
            raise UsageError(f"generate: the {name} is {v}, above the limit of 2**40 = {MAX_GENERATE_TOKENS} "
                             "tokens; give P:N such as --generate 128:64 (generate=(128, 64))")
        values.append(v)
    return values[0], values[1]


def parse_generate(text: str) -> tuple[int, int]:
    """``"P:N"`` → ``(P, N)``.

    >>> parse_generate("128:64")
    (128, 64)
    """
    p, sep, n = text.partition(":")
    try:
        values = (int(p), int(n)) if sep else None
    except ValueError:
        values = None
    if values is None:
        raise UsageError(f"--generate: expected P:N (prompt tokens : new tokens) such as 128:64, got {text!r}")
    return check_generate(*values)


def context_lengths(prompt_tokens: int, new_tokens: int) -> range:
    """The context of each decode step: P + j for j = 1 … N−1 (empty when N = 1).

    >>> list(context_lengths(5, 4))
    [6, 7, 8]
    """
    return range(prompt_tokens + 1, prompt_tokens + new_tokens)


def affine_steps(counts: Mapping[int, Cost]) -> tuple[Cost, Cost]:
    """``(constant, per_position)`` of the decode steps counted at the contexts of ``counts`` (context → cost),
    from the first two and checked at every other one; a :class:`ValueError` when they are not affine (a
    sliding window, a cache that is cropped) or the slope is not a whole number per position.

    >>> affine_steps({6: Cost(flops=100), 9: Cost(flops=130), 7: Cost(flops=110)})
    (Cost(flops=40, macs=0, transcendentals=0, int_ops=0), Cost(flops=10, macs=0, transcendentals=0, int_ops=0))
    """
    points = sorted(counts)
    if len(points) == 1:
        return counts[points[0]], Cost()
    c0, c1 = points[0], points[-1]
    slope = []
    for a, b in zip(counts[c0], counts[c1]):
        q, r = divmod(b - a, c1 - c0)
        if r:
            raise ValueError(f"the decode steps at contexts {c0} and {c1} differ by {b - a}, not a whole multiple "
                             f"of {c1 - c0} positions")
        slope.append(q)
    per_position = Cost(*slope)
    constant = Cost(*(a - c0 * s for a, s in zip(counts[c0], slope)))
    for c in points:
        if constant + c * per_position != counts[c]:
            raise ValueError(f"the decode step at context {c} costs {counts[c].flops} FLOPs, not the "
                             f"{(constant + c * per_position).flops} of the line through contexts {c0} and {c1}")
    return constant, per_position


def segments(contexts: range, breakpoints=()) -> list[range]:
    """``contexts`` cut around each breakpoint b (b − 1, b and b + 1 each a segment of one), so that a step whose
    form changes near b (a sliding window of b keys: the cache is cropped from there on) is affine within each.

    >>> [list(r) for r in segments(range(3, 12), [6])]
    [[3, 4], [5], [6], [7], [8, 9, 10, 11]]
    """
    cuts = sorted({c for b in breakpoints for c in (b - 1, b, b + 1, b + 2)  # no set of every context: N may be 2**40
                   if contexts.start < c < contexts.stop})
    edges = [contexts.start, *cuts, contexts.stop]
    return [range(lo, hi) for lo, hi in zip(edges, edges[1:]) if hi > lo]


@dataclass(frozen=True)
class DecodePiece:
    """Decode steps whose contexts run from ``first`` to ``last`` and cost ``constant + c · per_position``."""

    first: int
    last: int
    constant: Cost
    per_position: Cost

    def step(self, context: int) -> Cost:
        return self.constant + context * self.per_position

    @property
    def total(self) -> Cost:
        n = self.last - self.first + 1
        return n * self.constant + (self.first + self.last) * n // 2 * self.per_position

    def formula(self) -> str:
        return f"{self.constant.flops} + {self.per_position.flops}·c"

    def as_dict(self) -> dict:
        return {"contexts": [self.first, self.last], "constant": self.constant.flops,
                "per_context_position": self.per_position.flops, "formula": self.formula()}


@dataclass(frozen=True)
class Generation:
    """The cost of ``generate()`` of ``new_tokens`` tokens after a prompt of ``prompt_tokens``, for ``batch``
    sequences (every figure is for the whole batch).

    ``prefill`` is the prompt's forward (logits of its last position only); the decode steps are ``pieces``, each
    a run of contexts over which a step costs ``constant + c · per_position`` (one piece for attention over a
    plain KV cache; more where a sliding window crops the cache); ``decode`` sums the N−1 steps;
    ``kv_cache_bytes`` is the cache after the last step, by element type. ``method`` says how the steps were
    counted (the contexts exported and checked). ``step_reports``: the counted report of the decode step at the
    first and last context of each piece, ``(context, report)`` (what the FLOPs per rank of a parallel plan share
    out node by node, :mod:`flopcount.parallel.generation`); empty when the record was built from numbers.

    ``encoder_decoder``: the run of an encoder-decoder (T5, BART). Its prefill is the encoder over the P prompt
    tokens and the decoder's first step over its start token (which computes and caches the cross-attention keys
    and values of the encoder's output); decode step j then runs generated token j over the decoder's own cache,
    so its context is j + 1 (:attr:`first_context` is 2), the P cross-attended positions a constant of the step;
    the cache after the last step holds N decoder positions and the P cross-attention positions per layer.
    """

    batch: int
    prompt_tokens: int
    new_tokens: int
    prefill: Cost
    pieces: tuple[DecodePiece, ...] = ()
    kv_cache_bytes: Mapping[str, int] = field(default_factory=dict)
    method: str = ""
    step_reports: tuple = field(default=(), compare=False, repr=False)
    encoder_decoder: bool = False

    @property
    def first_context(self) -> int:
        """The context of the first decode step: P + 1, or 2 for an encoder-decoder (its decoder's own positions)."""
        return 2 if self.encoder_decoder else self.prompt_tokens + 1

    @property
    def cache_positions(self) -> int:
        """The positions the self-attention cache holds after the last step: P + N − 1, or N for an
        encoder-decoder (whose cross-attention cache holds the P prompt positions beside them)."""
        return self.new_tokens if self.encoder_decoder else self.prompt_tokens + self.new_tokens - 1

    def step(self, context: int) -> Cost:
        """The decode step whose attention spans ``context`` positions."""
        for piece in self.pieces:
            if piece.first <= context <= piece.last:
                return piece.step(context)
        raise ValueError(f"no decode step has context {context}")

    @property
    def steps(self) -> int:
        """Decode steps: N − 1."""
        return self.new_tokens - 1

    @property
    def first_step(self) -> Cost | None:
        """The first decode step (context :attr:`first_context`); None when N = 1."""
        return self.step(self.first_context) if self.steps else None

    @property
    def last_step(self) -> Cost | None:
        """The last decode step (context :attr:`first_context` + N − 2); None when N = 1."""
        return self.step(self.first_context + self.steps - 1) if self.steps else None

    @property
    def decode(self) -> Cost:
        """The N − 1 decode steps: Σ over pieces of ``n·constant + per_position · Σ c``."""
        return sum((piece.total for piece in self.pieces), Cost())

    @property
    def total(self) -> Cost:
        return self.prefill + self.decode

    @property
    def flops_per_token(self) -> int | float:
        """Total FLOPs per generated token (of the whole batch: ``total.flops / N``)."""
        return self.total.per(self.new_tokens).flops

    def formula(self) -> str:
        """The decode step's FLOPs in its context length c, as ``a + b·c`` (per piece, with its contexts)."""
        if len(self.pieces) == 1:
            return self.pieces[0].formula()
        return "; ".join(f"{p.formula()} for c in {p.first}..{p.last}" for p in self.pieces)

    def as_dict(self) -> dict:
        first, last = self.first_step, self.last_step
        return {
            "batch": self.batch,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "prefill_flops": self.prefill.flops,
            "decode_flops_per_step": {
                "first": None if first is None else first.flops,
                "first_context": self.first_context if self.steps else None,
                "last": None if last is None else last.flops,
                "last_context": self.first_context + self.steps - 1 if self.steps else None,
                "formula": self.formula() if self.pieces else None,
                "pieces": [p.as_dict() for p in self.pieces],
            },
            "decode_steps": self.steps,
            "decode_flops": self.decode.flops,
            "total_flops": self.total.flops,
            "flops_per_token": self.flops_per_token,
            "prefill": self.prefill.as_dict(),
            "decode": self.decode.as_dict(),
            "total": self.total.as_dict(),
            "kv_cache_bytes": dict(self.kv_cache_bytes),
            "method": self.method,
        }
