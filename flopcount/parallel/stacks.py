"""A model of two or more stacks of layers (an **encoder-decoder**: the encoder's layers, then the decoder's, each
decoder layer's cross-attention reading the encoder's output) under a plan: what it takes, where the nodes between
its stacks run, and what a pipeline sends between its stages. :mod:`flopcount.parallel.layout` reads these rules.

**Plans.** ``tp`` (``sp`` where tp divides each stack's sequence), ``pp`` (each schedule), ``cp`` (where 2·cp
divides each stack's sequence) and any data-parallel plan; stacks without cross-attention (one reading another's
output) are refused ``pp`` and ``cp``. Under ``cp`` each stack's sequence is split in the zigzag of
:mod:`flopcount.parallel.experts`: a CP rank holds its chunks of the encoder's tokens and of the decoder's, and each
attention all-gathers the K and V it reads over CP, a cross-attention the whole encoder output's (the K/V
projections run on the rank's encoder tokens, as a self-attention's on its own): every node's work is 1/C (a
cross-attention's s_d/C queries meet all s_e keys), and per decoder layer the K and V of s_d + s_e tokens are
gathered, their gradients reduce-scattered.

**Stages.** The layers of all stacks in order (the encoder's 0 … Lₑ − 1, the decoder's Lₑ …) are split in P stages
(P·v chunks under ``interleaved:v``) as a single stack's are. The nodes between two stacks (the encoder's final norm,
the decoder's embedding ops: its position lookup on its table, its scaling, its norm) run on the chunk of the last
layer before them, as a pipeline split at the decoder's first layer runs them (``torch.distributed.pipelining``'s
split point at ``decoder.block.0``: what comes before it goes to the stage before); the token-embedding lookups stay on stage 0
with their table (the encoder's and the decoder's read one table), position tables and masks are rebuilt on every
stage. A graph of the decoder alone (a decode step of generation) runs each of its layers on that layer's stage in
the whole model, and the nodes before its first layer with the encoder's last (``before`` of
:func:`between_layers`); what crosses a stage boundary in it is sent as in the whole model.

**Messages.** What crosses a stage boundary is sent, as a pipeline split at a point sends it: each tensor made on
virtual stage c and read on a later one (up to its last reader) is sent by each virtual stage from c on, and its
gradient back (a floating-point tensor's; an integer one has none): the stream, and on every stage after the
encoder's last layer also the encoder's output, read by every decoder layer's cross-attention (Megatron's
encoder-decoder pipeline sends it with the decoder's hidden state, and its gradient back); the decoder's looked-up
tokens from stage 0 to the stage of its first ops; T5's relative position bias, made in each stack's layer 0 (from
that layer's table) and read by all its layers, carried in the messages to the stack's later stages (a pipeline split
inside a stack sends it, as HF's T5 blocks pass it from each to the next; no stage rebuilds it from a table it does
not hold). The model's inputs are read on each stage that needs them (each stage's data loader gives them), so
they are not sent. A stage's memory walk receives the messages at the same share (:mod:`flopcount.memory.ranks`).
On a TP rank a message is its maker's share: one of sequence work or replicated work (the stream, the
encoder's output, the decoder's embedded tokens) whole, 1/T under ``sp`` (split over the sequence between stages, as
Megatron's pipeline sends it under sp); one split over TP (the heads' position bias) 1/T, 1/min(T, kv) on K/V heads;
any other whole. A single stack's message, the stream alone, is the closed form of :mod:`flopcount.parallel.ranks`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..errors import UsageError
from .roles import FLOATS, Graph, elements

__all__ = ["Message", "between_layers", "check_sequences", "check_stacks", "message_divisor", "messages", "stage_sent"]


class Message(NamedTuple):
    """A tensor a pipeline sends: made on virtual stage ``made``, last read on virtual stage ``read`` (each virtual
    stage from ``made`` to ``read`` − 1 sends it on) by the node at position ``node`` of the graph, its ``bytes``
    over one microbatch whole, and whether its gradient is sent back (``grad``: a floating-point tensor)."""

    name: str
    node: int
    made: int
    read: int
    bytes: int
    grad: bool


def check_stacks(plan: Any, stacks: Sequence[tuple[str, int]], cross: bool, where: str, degrees: str) -> None:
    """:class:`UsageError` for a plan a model of two or more ``stacks`` cannot take (see the module's rules); ``cross``:
    whether a layer's cross-attention reads another stack's output."""
    names = " and ".join(p for p, _ in stacks)
    if not cross and (plan.pp > 1 or plan.cp > 1):
        raise UsageError(f"--parallel {degrees}: {where} has {len(stacks)} stacks of layers ({names}), one reading "
                         "another's output; pipeline and context parallelism of more than one stack are not "
                         "modeled; give pp=1 and cp=1")


def check_sequences(plan: Any, seqs: Sequence[int], stack_of: Callable[[int], str]) -> None:
    """:class:`UsageError` naming the first layer (of the stack ``stack_of`` names) whose tokens in a sequence
    (``seqs``: an encoder's and a decoder's differ) the zigzag split of cp or the sequence split of sp cannot
    divide."""
    t, c = plan.tp, plan.cp
    for n, s in enumerate(seqs):
        if c > 1 and s % (2 * c):
            raise UsageError(f"--parallel cp={c}: the zigzag split needs 2·cp = {2 * c} to divide the sequence length "
                             f"{s} of layer {n} ({stack_of(n)})")
        if plan.sp and (s // c) % t:
            what = f"the sequence length {s}" if c == 1 else f"each CP rank's {s // c} tokens"
            raise UsageError(f"--parallel tp={t},{'cp=' + str(c) + ',' if c > 1 else ''}sp: tp must divide {what} "
                             f"of layer {n} ({stack_of(n)}) under sp")


def between_layers(g: Graph, layer: Sequence[int | None], roles: Sequence[str], parameters: frozenset[str],
                   before: int | None = None) -> dict[int, int]:
    """The nodes outside the layers between two stacks, each with the layer before it in the graph (whose chunk runs
    it); the token-embedding lookups and the position tables rebuilt on every stage left out, but not a node among
    them that reads one of the ``parameters`` (Whisper's decoder positions: its table is held where it is looked
    up). ``before``: the layer before the graph's first (a graph of a model's later stack alone, an encoder-decoder's
    decode step), whose chunk runs the nodes before the graph's first layer as well."""
    inside = [k for k, n in enumerate(layer) if n is not None]
    out: dict[int, int] = {}
    for k in range(0 if before is not None else inside[0], inside[-1]) if inside else ():
        if layer[k] is not None:
            before = layer[k]
        elif before is not None and (roles[k] not in ("embedding", "positions") or
                                     roles[k] == "positions" and any(r in parameters for _, r in g.weights(k))):
            out[k] = before
    return out


def messages(g: Graph, chunks: Sequence[tuple[int, ...]]) -> tuple[Message, ...]:
    """Every tensor that crosses a virtual stage's boundary (see the module's rules), in the graph's order."""
    from ..reporting.report import element_bits

    out = []
    for k, n in enumerate(g.nodes):
        if len(chunks[k]) != 1:  # rebuilt on every stage
            continue
        for x in n.outputs:
            if x is None or not x.name or g.weight_root(x.name):
                continue
            again = min((q for q in g.producers.get(x.name, ()) if q > k), default=len(g.nodes))
            read = max((chunks[q][0] for q in g.consumers.get(x.name, ()) if k < q < again and len(chunks[q]) == 1),
                       default=chunks[k][0])
            if read > chunks[k][0]:
                info = g.info.get(x.name, x)
                size = elements(info) * ((element_bits(info.elem_type) or 32) // 8)
                out.append(Message(x.name, k, chunks[k][0], read, size, info.elem_type in FLOATS))
    return tuple(out)


def message_divisor(rule: str, plan: Any, kv_heads: int, sequence: bool) -> int:
    """The TP ranks a message is split over (see the module's rules): ``rule``, its maker's rule in the FLOPs ledger;
    ``sequence``, whether its maker's output is sequence or replicated work (split over the sequence under sp)."""
    t = plan.tp
    if sequence:
        return t if plan.sp else 1
    if rule == "split" or rule == "norm" and plan.sp:
        return t
    if rule == "kv":
        return min(t, kv_heads or t)
    return 1


def stage_sent(found: Sequence[Message], shares: Sequence[int], stage: int, pp: int, virtual: int,
               train: bool) -> int:
    """Bytes one TP rank of pipeline rank ``stage`` sends per microbatch: on each of its virtual stages c the messages
    that cross c's boundary forward (made at or before c, read after it), and in the backward the gradients of those
    it received (crossing c − 1's); ``shares``: each message's bytes on the rank."""
    out = 0
    for c in range(stage, pp * virtual, pp):
        out += sum(b for x, b in zip(found, shares) if x.made <= c < x.read)
        if train and c:
            out += sum(b for x, b in zip(found, shares) if x.grad and x.made <= c - 1 < x.read)
    return out
