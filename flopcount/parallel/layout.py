"""The layout of a model under a parallel plan, read once from the counted graph: the one record every per-rank
ledger reads (FLOPs, :mod:`flopcount.parallel.ranks`; the optimizer step, :mod:`flopcount.parallel.optimizer`;
generation, :mod:`flopcount.parallel.generation`; memory, :mod:`flopcount.memory.ranks`). It holds the only copy of
the split rules, the pipeline stages, the rank id and the schedule's warm-up.

**Layers.** The repeated layers are the modules ``P.N`` of the one prefix ``P`` (``model.layers``, ``transformer.h``,
``encoder.layer``) whose indexed children hold the most nodes, when at least one of them holds attention (indexed
modules without it, a Sequential's children or a CNN's stages, are no stack of layers); a node without a module
scope takes the layer of the node that made its first input. Where the indexed modules of two or more prefixes hold
attention (an activation product), as an **encoder-decoder**'s encoder and decoder do, each is a stack, in the order
of its first node, its layers numbered after those of the stack before it (the encoder's 0 … Lₑ − 1, the decoder's
Lₑ …); the nodes between them (the encoder's final norm) are outside the layers.

**Roles, found by the graph's dataflow, not by module names.** A *weight product* is a MatMul, Gemm, Conv or Einsum
that reads a stored floating-point tensor (directly or through views); an *activation product* reads none. In each
layer:

* a **mixer** (state-space or linear attention) is found first: a depthwise 1-D convolution over the sequence (a
  Conv of a weight ``(C, 1, K)`` on C channels), the weight products first met going back from its input (the
  in-projection), the first weight products met going forward from its output that map back to the width the
  in-projection reads (the out-projection), and every node between them (further in-projections met going back
  from the out-projection, the scan, the gated norm): role ``mixer``, its out-projection ``row``. Its kind: a
  **Mamba** mixer (a selective scan: Mamba's, Mamba 2's) when it holds a running state (a CumSum, Scan or Loop) or
  an activation product, a **gated delta rule** mixer when, moreover, the convolution's output is L2-normalised (a
  ReduceSum, ReduceL2 or LpNormalization) before its first product (its queries and keys), else a
  **short-convolution** mixer (LFM2's gated convolution). A Mamba mixer is a **Mamba 2** mixer when its in-projections are wider than z (the
  out-projection's input, d_inner) and the convolved channels (x, B and C): the rest are its **heads** (one dt
  each), d_inner a multiple of them; its **groups** of B and C are those of its gated norm (the variance, a
  ReduceMean, over the last axis of (…, groups, d_inner/groups); one without such groups), 2·groups dividing the
  convolved channels beyond d_inner. Else (Mamba 1's in-projection is z and x alone) it has no heads. A mixer's
  products are no attention's or MLP's;
* the **attention** products are the activation products: a *score* product (Q·Kᵀ), whose inputs come from weight
  products, and a *context* product (·V), whose first input comes from the scores; their K or V may instead be the
  graph's inputs, reached through no product (a decode step's cross-attention over its cached keys and values);
* the **column-parallel** projections are the weight products first met going back from the scores' two inputs and
  the context's V (one fused QKV projection, or separate Q, K, V); those that feed K or V only are the **K/V
  projections**; a weight product further back that feeds one of these (multi-head latent attention's
  down-projections) is **latent**: replicated over TP, with the nodes between (the latent norms);
* an attention is a **cross-attention** when its K projections read a tensor made outside the layer that its Q
  projections do not read (the encoder's output, in a decoder layer): its K/V projections are column-parallel on
  that tensor, whose gradient each of them all-reduces over TP in the backward (A_e, its tokens', per layer;
  gathered in the forward and reduce-scattered in the backward under ``sp``), as each decoder layer's K/V
  ``ColumnParallelLinear`` of Megatron's T5 does; a weight product met going back from a projection through a
  row-parallel one (the self-attention's, before the cross-attention's Q) is no latent;
* the **row-parallel** projection is the weight product first met going forward from the context product;
* the **heads** are the nodes between the column projections and the row projection (rotary, scores, mask,
  softmax, ·V): split over TP; a node whose first input is 4-D with K/V heads fewer than the query heads on its
  second axis works on **K/V heads**; one with a single head there (MLA's rotary key) is **shared** by all heads:
  replicated; a lookup on a stored table among them (T5's relative position bias, an Embedding of (buckets, heads)
  in each stack's layer 0) is split by heads too: each rank holds and looks up its heads' columns, as torch's
  ``ColwiseParallel`` shards an ``nn.Embedding`` on dim 1, its output on the last axis;
* the **MLP**: of the remaining weight products, those whose output reaches another (through the activation, GELU,
  SiLU·up, ReLU², whatever it is) are column-parallel, the ones reached row-parallel, the nodes between them its
  **inner** ops: split;
* a node in the module of a projection takes that projection's role (its bias add, its reshapes); in a
  row-parallel projection's module, its outputs (the bias add, whole after the reduction) are per-token work;
* a routed MoE block's experts (:mod:`flopcount.parallel.experts`) are **expert** work, its router (the block's
  ``gate``, or any weight product whose scores reach a TopK) and the block's own ops **router** work, replicated
  over TP, split over the sequence under ``sp`` (on the rank's tokens, as Megatron's router);
* everything else in the layer (norms, residual adds, dropout) is **sequence** work: replicated over TP, split over
  the sequence under ``sp``.

Outside the layers: the **token embedding** is the Gather on a stored weight whose indices come from a model input
(the largest, when several do), and any other such Gather on the same table (an encoder-decoder's two lookups):
vocab-parallel; other lookups (position and token-type tables) are replicated; work
that depends neither on the layers nor on the embedded tokens (rotary tables, masks) is a **position** table
rebuilt on every stage (the lookups on stored tables are not); after the layers, the product whose output is as wide as the vocabulary (the token
embedding's rows; without a token embedding, the first one wider than the hidden size) is the **vocab-parallel LM
head** (tied to the embedding or not), the ops after it over the vocabulary (the loss) split too;
a cross-entropy after it (a Softmax, LogSoftmax or loss op) is vocab-parallel (its all-reduces of the maximum, the
sum and the target logit); other products after the layers (poolers, classifiers) are replicated, and the other nodes before the head (the
final norm) sequence work.

**Split rules.** Each role splits over the T ranks of a TP group one way: ``column``, ``row``, ``vocab``, heads and
inner ops 1/T; K/V projections and heads 1/min(T, kv) (one head copied on T/kv ranks when kv < T); ``expert`` 1/T of
each expert (and its share of the experts over EP); ``sequence`` whole, or 1/T of the tokens under ``sp``;
``replicated`` whole; the **gathered inputs** under ``sp``: a tensor a sequence-work node makes (split over the
sequence) and a column-parallel, K/V, vocab-parallel or mixer product reads is all-gathered over TP before it, once
however many such products read it; under ``sp=torch`` the rank keeps it gathered, whole, for the weights'
gradients, under ``sp=megatron`` only its own tokens (1/T), all-gathered again in the backward; a **Mamba 2**
``mixer`` 1/T, as Megatron's MambaMixer splits it: each TP rank holds heads/T heads and groups/T groups of B and C
(T must divide both): the in-projection column-parallel (its z, x, B, C and dt of those heads and groups), the
convolution, the scan, A, D, dt's bias and the gated norm (in groups, no collective) on them, the out-projection
row-parallel (``row``); its layer's reductions are one more block's (see
:mod:`flopcount.parallel.ranks`). Any other mixer (gated delta rule, short convolution, Mamba 1) is not split over
TP, and no mixer over the sequence: such a plan is refused naming it (a mixer's state runs from token to token,
which no framework splits over the sequence: Megatron's MambaContextParallel instead swaps the sequence split for a
split of the heads by all-to-all, not modeled).
A parameter follows its role, except a row-parallel projection's bias: whole on every rank
(Megatron's RowParallelLinear, torch's RowwiseParallel add it after the reduction), and likewise the FLOPs of a
row-parallel Gemm's bias add.

**Blocks.** Each layer's blocks that end in a TP reduction: its attentions (two in a decoder layer: self- and
cross-attention) and its MLP (not an MoE block of routed experts alone whose dispatcher gathers its tokens itself: the
all-to-all dispatcher's pairs over expert-TP under tp and sp, the all-gather dispatcher's over ``tp_ep`` under ep:
:mod:`flopcount.parallel.experts`), or a mixer and its attention and MLP where it
has them; each block reduces its layer's stream (its row-parallel projections' tokens), and the layer's
column-parallel inputs are those blocks' and its cross-attention's K/V input (:meth:`Layout.stage_tp`; the
collectives: :mod:`flopcount.parallel.ranks`).
**Encoder-decoders**: the plans they take, where the nodes between the stacks run and what a pipeline sends between
their stages, :mod:`flopcount.parallel.stacks`.
**Stages.** L layers in P stages (P·v chunks of L/(P·v) under ``interleaved:v``, chunk c on rank c mod P); the nodes
before the layers on stage 0 (position tables on every stage), those after on the last; a graph of some of a model's
layers (an encoder-decoder's decode step: the decoder's) runs each on its stage in the whole model. A module's parameters go to
the stage of the node that reads them first; a weight the token embedding and the LM head share (tied) has a second
copy on the first or the last stage, whichever the module holding it (one of its readers' modules) is not on.
**Rank id.** Megatron's order, tensor parallel fastest: rank = tp + T·(cp + C·(dp + D·pp)).
**Warm-up.** The forwards pipeline rank p runs before its first backward: GPipe all M; 1F1B min(P − 1 − p, M);
interleaved 1F1B min((P − p − 1)·2 + (v − 1)·P, M·v) chunk-forwards (Megatron's order).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from . import experts as px
from . import stacks as ps
from .plan import ParallelPlan
from .roles import (FLOATS, PRODUCTS, Found, Graph, Scoped, elements, kv_heads, layer_roles, layers_of, mixer_refused,
                    outside_roles, stack_layer, stacks_of, width)

__all__ = ["Dims", "Layout", "ModuleShare", "ROLE_RULES", "fsdp_shard", "in_flight", "layout_of", "rank_id", "split",
           "warmup"]

#: Each role's rule in the FLOPs ledger: split 1/T, kv 1/min(T, kv), norm (replicated, 1/T under sp), replicated,
#: positions (rebuilt on every stage), expert.
ROLE_RULES = {"column": "split", "row": "split", "heads": "split", "inner": "split", "vocab": "split",
              "kv": "kv", "kv_heads": "kv", "latent": "norm", "sequence": "norm", "row_out": "norm",
              "shared_head": "replicated", "router": "norm", "embedding": "replicated",
              "replicated": "replicated", "positions": "positions", "expert": "expert", "mixer": "split"}
#: Roles whose parameters are split 1/T (K/V projections: 1/min(T, kv); experts: 1/(T·E)).
PARAM_SPLIT = frozenset({"column", "row", "vocab", "embedding", "heads", "inner", "tied", "mixer"})
#: Roles whose outputs are whole on every TP rank, split over the sequence under sp (memory): row, embedding, rule norm.
SEQUENCE_ROLES = frozenset({"row", "embedding"} | {role for role, rule in ROLE_RULES.items() if rule == "norm"})
#: Roles of the products whose input sp all-gathers over TP when a sequence-work node made it (the gathered inputs).
GATHERING_ROLES = frozenset({"column", "kv", "vocab", "mixer"})
def split(f: int, t: int, i: int) -> int:
    """Rank ``i``'s part of ``f`` split over ``t`` ranks: the remainder to the first ranks, one each.

    >>> [split(7, 3, i) for i in range(3)]
    [3, 2, 2]
    """
    return f // t + (1 if i < f % t else 0)


def fsdp_shard(shape: tuple | None, tp: int, n: int) -> int | None:
    """Elements of one rank's shard of a parameter of ``shape`` split 1/``tp`` over TP (rounded up) and then sharded
    by FSDP2 over ``n`` ranks: dim 0 padded to ⌈d0/n⌉ rows on every rank, d0 the TP rank's rows (dim 0 divided by
    ``tp`` where it divides); ⌈elements/n⌉ where the TP share is not whole rows; None for an unknown shape. The
    all-gather FSDP2 runs gathers n such shards, its reduce-scatter reads as many.

    >>> fsdp_shard((65, 32), 1, 2), fsdp_shard((50, 32), 2, 2)  # ⌈65/2⌉ = 33 rows of 32; 25 rows on the TP rank: 13
    (1056, 416)
    """
    if shape is None or any(not isinstance(d, int) for d in shape):
        return None
    local = -(-math.prod(shape) // tp)
    if n == 1:
        return local
    rows = shape[0] if shape else 0
    rows = rows // tp if tp > 1 and rows % tp == 0 else rows
    if not rows or local % rows:
        return -(-local // n)
    return -(-rows // n) * (local // rows)


def rank_id(plan: ParallelPlan, tp: int, cp: int, dp: int, stage: int) -> int:
    """The global rank at these coordinates, tensor parallel fastest: tp + T·(cp + C·(dp + D·pp))."""
    return tp + plan.tp * (cp + plan.cp * (dp + plan.dp * stage))


def warmup(schedule: str, stages: int, microbatches: int, virtual: int, stage: int) -> int:
    """Forward actions pipeline rank ``stage`` runs before its first backward (see the module's rules).

    >>> [warmup("1f1b", 4, 8, 1, s) for s in range(4)], warmup("interleaved", 4, 8, 2, 0)
    ([3, 2, 1, 0], 10)
    """
    if schedule == "gpipe":
        return microbatches
    if schedule == "interleaved":
        return min((stages - stage - 1) * 2 + (virtual - 1) * stages, microbatches * virtual)
    return min(stages - 1 - stage, microbatches)


def chunks_of(plan: ParallelPlan) -> int:
    """Model chunks per pipeline rank: ``v`` of the interleaved schedule, else 1."""
    return plan.virtual_stages if plan.schedule == "interleaved" and plan.pp > 1 else 1


def in_flight(plan: ParallelPlan, stage: int) -> float:
    """Microbatches whose activations pipeline rank ``stage`` keeps at once: the warm-up's forwards and the one
    running, in microbatches (chunks / v).

    >>> from flopcount.parallel.plan import parse_parallel
    >>> [in_flight(parse_parallel("pp=4", 8), s) for s in range(4)]
    [4.0, 3.0, 2.0, 1.0]
    >>> in_flight(parse_parallel("pp=4", 8, "interleaved:2"), 0)  # (4·2 + 4 − 1) / 2 chunks
    5.5
    """
    p, m, v = plan.pp, plan.microbatches, chunks_of(plan)
    if p == 1:
        return 1.0
    if plan.schedule == "gpipe":
        return float(m)
    return min(warmup(plan.schedule, p, m, v, stage) + 1, m * v) / v


@dataclass(frozen=True)
class Dims:
    """What the rules read off the graph's shapes (0 where the model has no such part)."""

    batch: int
    seq: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    layers: int
    act_bytes: int
    param_bytes: int
    prob_bytes: int = px.PROB_BYTES  # one routing probability (:func:`~flopcount.parallel.experts.prob_bytes`)


@dataclass(frozen=True)
class ModuleShare:
    """How a module's parameters are laid out: its ``role``, its ``stage``, and the elements kept whole on every TP
    rank whatever the role (``whole``: a row-parallel projection's bias)."""

    role: str
    stage: int
    whole: int = 0


@dataclass(frozen=True)
class Layout:
    """The model's layout under ``plan`` (see the module's rules). Per node (by position in the report's nodes):
    ``roles``, ``layer`` and ``chunks`` (the virtual stages that run it); ``whole_part``: (forward, backward) FLOPs of
    a node kept whole on every TP rank (a row-parallel Gemm's bias); ``attention``: each layer's score and context
    products; ``modules``: each parameter-owning module's :class:`ModuleShare` (by the role of the first node in
    it that reads a weight)."""

    plan: ParallelPlan
    dims: Dims
    roles: tuple[str, ...]
    layer: tuple[int | None, ...]
    chunks: tuple[tuple[int, ...], ...]
    whole_part: Mapping[int, tuple[int, int]]
    attention: Mapping[int, tuple[int, ...]]
    modules: Mapping[str, ModuleShare]
    has_loss: bool
    expert: tuple[bool, ...]
    # the stacks of repeated layers: (module prefix, "model.layers", the index its layer 0 takes); an
    # encoder-decoder's two, the decoder's numbered after the encoder's
    stacks: tuple[tuple[str, int], ...] = ()
    tied: int = 0  # elements of a weight the token embedding and the LM head share (0: none)
    tied_modules: tuple[str, ...] = ()  # the modules of the nodes that read that weight, in graph order
    lookups_added: bool = False  # position or token-type tables looked up and added to the token embedding
    # under fsdp, (stage, "layer" | "root" | "expert") → the elements FSDP2's dim-0 padding adds to one rank's
    # parameters gathered (Σ n·fsdp_shard − the TP share; each parameter once a layer, at its first reader; buffers
    # and constants are not sharded)
    padding: Mapping[tuple[int, str], int] = field(default_factory=dict)
    # each layer's blocks that end in a TP reduction: attention, MLP (dense or MoE), a Mamba 2 mixer
    blocks: tuple[int, ...] = ()
    dispatched: tuple[bool, ...] = ()  # each layer whose MoE block is no TP block (:func:`_blocks`)
    # each layer's tokens in a sequence (its stream's length: an encoder's and a decoder's differ) and the tokens its
    # cross-attention's K/V projections read from the other stack (0: none)
    seqs: tuple[int, ...] = ()
    cross: tuple[int, ...] = ()
    latents: tuple[int, ...] = ()  # each layer's MLA latents its heads read (Found.latents), elements in a sequence
    latent_parts: tuple[tuple[int, ...], ...] = ()  # those by tensor (Found.latent_parts), each gathered on its own
    # the tokens in a sequence of each token-embedding lookup (an encoder-decoder's two: the encoder's, the
    # decoder's), one TP call each
    lookups: tuple[int, ...] = ()
    out_seq: int = 0  # the tokens in a sequence of the stream after the layers (the decoder's)
    # the gathered inputs under sp (see the module's rules): (node, output position) → (the virtual stage that
    # makes it, its bytes over the whole sequence of one microbatch); by node, as a stack extended by copies
    # repeats the tensors' names
    sp_inputs: Mapping[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    # what a pipeline of more than one stack sends between its virtual stages (:mod:`flopcount.parallel.stacks`);
    # empty for one stack, whose message is the stream's closed form
    messages: tuple[ps.Message, ...] = ()
    within: tuple[int, int] | None = None  # a graph of some of a model's layers: :func:`layout_of`'s

    @property
    def _per_chunk(self) -> tuple[int, int]:  # (this graph's layer 0 in the whole model, its layers in a chunk)
        first, layers = self.within or (0, len(self.blocks))
        return first, max(layers // (self.plan.pp * self.virtual), 1)

    @property
    def embedded(self) -> int:
        """The tokens in a sequence of the token-embedding lookups, all of them."""
        return sum(self.lookups)

    @property
    def virtual(self) -> int:
        return chunks_of(self.plan)

    def kv_tokens(self, stage: int) -> int:
        """Tokens of a sequence whose K and V the attentions of pipeline rank ``stage``'s layers read: each layer's own,
        and a cross-attention's of the other stack (what cp all-gathers)."""
        rows, cols, own = self.stage_tp(stage)[:3]
        return own + cols - rows

    def message_divisors(self) -> dict[str, int]:
        """Each of :attr:`messages`' TP divisor (:func:`flopcount.parallel.stacks.message_divisor`), by name."""
        return {x.name: ps.message_divisor(self.rule(x.node), self.plan, self.dims.kv_heads, self.roles[x.node]
                                           in SEQUENCE_ROLES | {"replicated"}) for x in self.messages}

    def sent(self, stage: int, train: bool) -> int:
        """Bytes one TP rank of pipeline rank ``stage`` sends per microbatch of :attr:`messages` (forward, and the
        gradients back when ``train``)."""
        div = self.message_divisors()
        return ps.stage_sent(self.messages, [-(-x.bytes // div[x.name]) for x in self.messages], stage, self.plan.pp,
                             self.virtual, train)

    def stage_tp(self, stage: int) -> tuple[int, int, int, int, int]:
        """Of the layers pipeline rank ``stage`` runs, in tokens of a sequence: (the tokens reduced after its
        row-parallel projections, a block's stream each; the tokens into its column-parallel projections, reduced in
        the backward: those and the cross-attention's from the other stack; the layers' own tokens; the MLA layers'
        own, whose attention reads its latents in place of its input; those latents' elements in a sequence)."""
        mine = self.stage_layers(stage)
        rows, mla = sum(self.blocks[n] * self.seqs[n] for n in mine), [n for n in mine if self.latents[n:n + 1] > (0,)]
        return (rows, rows + sum(self.cross[n] for n in mine), sum(self.seqs[n] for n in mine),
                sum(self.seqs[n] for n in mla), sum(self.latents[n] for n in mla))

    def stage_layers(self, stage: int) -> list[int]:
        """The layers pipeline rank ``stage`` runs (its chunks')."""
        first, per_chunk = self._per_chunk
        return [n for n in range(len(self.blocks)) if (first + n) // per_chunk % self.plan.pp == stage]

    def stage_blocks(self, stage: int) -> int:
        """The blocks ending in a TP reduction of the layers pipeline rank ``stage`` runs (its chunks')."""
        return sum(self.blocks[n] for n in self.stage_layers(stage))

    @property
    def sp_kept_whole(self) -> frozenset[tuple[int, int]]:
        """The gathered inputs a rank keeps whole over TP for the backward: all of them under ``sp=torch``, none
        without sp or under ``sp=megatron`` (which keeps the rank's tokens)."""
        return frozenset(self.sp_inputs) if self.plan.sp and self.plan.sp_style == "torch" else frozenset()

    def sp_regathered(self, stage: int) -> tuple[int, ...]:
        """The calls' bytes per microbatch pipeline rank ``stage`` all-gathers again in the backward under
        ``sp=megatron``: its gathered inputs, each over the rank's share of the sequence under cp (none in any other
        plan)."""
        if not self.plan.sp or self.plan.sp_style != "megatron":
            return ()
        return tuple(b // self.plan.cp for c, b in self.sp_inputs.values() if c % self.plan.pp == stage)

    @property
    def kv_group(self) -> int:
        """TP ranks that hold the same K/V head (1 when the heads split)."""
        kv = self.dims.kv_heads
        return self.plan.tp // kv if kv and kv < self.plan.tp else 1

    @property
    def kv_rule(self) -> str:
        """How the K/V heads are laid out over TP, in words."""
        if self.kv_group > 1 and self.dims.heads:
            return f"each TP rank holds one of the {self.dims.kv_heads} K/V heads, copied on {self.kv_group} ranks"
        return "K/V heads split over TP" if self.dims.heads else "no attention heads to split"

    def rule(self, k: int) -> str:
        """Node ``k``'s rule in the FLOPs ledger."""
        return ROLE_RULES[self.roles[k]]

    def divisor(self, role: str) -> int:
        """The ranks a parameter of ``role`` is split over within its TP group (and, for a routed expert's, over EP):
        1 when it is whole on each."""
        t = self.plan.tp
        if role == "expert":
            return t * self.plan.ep
        if role in ("kv", "kv_heads"):
            return min(t, self.dims.kv_heads or t)
        return t if role in PARAM_SPLIT else 1

    def activation_divisor(self, k: int) -> int:
        """The TP ranks node ``k``'s outputs are split over (see :mod:`flopcount.memory.ranks`' activations)."""
        role, t = self.roles[k], self.plan.tp
        return (t if self.plan.sp else 1) if role in SEQUENCE_ROLES else self.divisor(role) \
            if role in ("kv", "kv_heads") else t if ROLE_RULES[role] == "split" else 1

    def param_divisor(self, k: int, j: int) -> int:
        """:meth:`divisor` of the stored tensor node ``k`` reads as its input ``j``: its role's, but whole for a
        row-parallel Gemm's bias."""
        if self.roles[k] == "row" and j == 2 and self.whole_part.get(k) is not None:
            return 1
        return self.divisor(self.roles[k])

    def elements(self, share: ModuleShare, n: int, tp: int) -> tuple[int, int]:
        """(elements, of which a copy another TP rank holds too) of a module of ``n`` parameter elements on TP rank
        ``tp``, before EP and data-parallel sharding (a routed expert's: its 1/T; :meth:`divisor` gives the EP
        part)."""
        t = self.plan.tp
        body = n - share.whole
        if share.role == "expert":
            return split(body, t, tp), 0
        if share.role == "tied":  # the first stage's copy of a tied embedding: the LM head's weight again
            x = split(body, t, tp)
            return x, x
        if share.role in ("kv", "kv_heads") and self.kv_group > 1:
            x = split(body, self.dims.kv_heads, tp // self.kv_group)
            return x + share.whole, (x if tp % self.kv_group else 0) + (share.whole if tp else 0)
        if self.divisor(share.role) > 1:
            return split(body, t, tp) + share.whole, share.whole if tp else 0
        return n, n if tp else 0

    def stage_params(self, params: Mapping[str, int]) -> dict[int, list[tuple[str, ModuleShare, int]]]:
        """The report's parameters by stage: (module, its share, its elements); under pp, a tied embedding's second
        copy (role ``tied``: its update redundant) on the first or the last stage, whichever its module is not on.
        Memoized (the last few asked: the layouts of plans of the same modules' shares read the same); not to be
        changed."""
        key = (self.modules, params, self.tied, self.plan.pp, self.virtual, self.dims.layers, self.stacks)
        for asked, found in _staged:
            if asked[0] is key[0] and asked[1] is key[1] and asked[2:] == key[2:]:
                return found
        found = self._stage_params(params)
        _staged[:] = [*_staged[-3:], (key, found)]
        return found

    def _stage_params(self, params: Mapping[str, int]) -> dict[int, list[tuple[str, ModuleShare, int]]]:
        out: dict[int, list[tuple[str, ModuleShare, int]]] = {}
        for module, n in params.items():
            share = self.modules.get(module) or ModuleShare("expert" if px.is_expert((module,)) else "replicated",
                                                            self._module_stage(module))
            out.setdefault(share.stage, []).append((module, share, n))
        if self.tied and self.plan.pp > 1:  # the embedding on the first stage, tied to the head on the last
            holder = next((m for m in self.tied_modules if m in params and m in self.modules), None)
            second = self.plan.pp - 1 if holder is not None and self.modules[holder].stage == 0 else 0
            out.setdefault(second, []).append(("(tied embedding)", ModuleShare("tied", second), self.tied))
        return out

    def layered(self, module: str) -> bool:
        """Whether ``module`` lies in one of the repeated layers (else the root's under fsdp, as all of a CNN is)."""
        return bool(self.dims.layers) and stack_layer(module, self.stacks) is not None

    def _module_stage(self, module: str) -> int:
        layer = stack_layer(module, self.stacks)
        if layer is None:
            return 0
        first, per_chunk = self._per_chunk
        return (first + layer) // per_chunk % self.plan.pp


_last: list[tuple] = []
#: The last few :meth:`Layout.stage_params` asked (the modules' shares and the parameters by identity) and found.
_staged: list[tuple] = []


def layout_of(report: Any, plan: ParallelPlan, within: tuple[int, int] | None = None) -> Layout:
    """The :class:`Layout` of ``report`` under ``plan``, memoized (the last four asked: a plan search asks of the
    counts of two recompute policies in turn); :class:`UsageError` (exit 2) naming the part a plan cannot split and
    why. ``within``: ``report`` holds some of a model's layers, its layer 0 the whole model's layer ``within[0]`` of
    ``within[1]`` (the stages split the whole model's; see the module's rules)."""
    for (nodes, scopes, asked), found in _last:
        if nodes is report.nodes and scopes is report.modules.nodes and asked == (plan, within):
            return found
    found = _build(report, plan, within)
    _last[:] = [*_last[-3:], ((report.nodes, report.modules.nodes, (plan, within)), found)]
    return found


def _structure_of(report: Any) -> _Structure:
    from ..reporting.report import element_bits
    from ..reporting.tiled import check_listable

    nodes = report.nodes
    check_listable(nodes, "--parallel", "nodes, which the ledger shares out one by one,")
    nodes = list(nodes)
    scoped = not report.modules.missing and len(report.modules.nodes) == len(nodes)
    scopes = list(report.modules.nodes) if scoped else [()] * len(nodes)
    g = Graph(nodes, report.model.inputs)
    stacks = stacks_of(g, scopes)
    layer = layers_of(g, scopes, stacks)
    expert = tuple(px.is_expert(sc) for sc in scopes)
    blocks = px.moe_blocks(scopes)
    roles = [""] * len(nodes)
    attention: dict[int, list[int]] = {}
    members: dict[int, list[int]] = {}
    for k, n in enumerate(layer):
        if n is not None:
            members.setdefault(n, []).append(k)
    scoped = Scoped(g, scopes, expert, blocks)
    found = {n: layer_roles(scoped, ks, roles, attention, n) for n, ks in sorted(members.items())}
    if not any(f.heads or f.mixer for f in found.values()):  # indexed modules without attention or a mixer (a
        # Sequential, a CNN's stages)
        layer, members, found, roles, attention = [None] * len(nodes), {}, {}, [""] * len(nodes), {}
    stream = next((x for k in members.get(min(members), ()) if members for x in nodes[k].inputs
                   if x is not None and x.elem_type in FLOATS and x.shape and len(x.shape) >= 3), None) \
        if members else None
    tail, has_loss, vocab, tied = outside_roles(g, layer, roles, width(stream) or 0)
    for k in reversed(range(len(nodes))):  # a weight's view, or work on weights alone, goes with its reader
        n = nodes[k]
        if n.outputs and n.outputs[0] is not None and g.on_weights(k):
            reader = min((q for q in g.consumers.get(n.outputs[0].name, ()) if q > k), default=None)
            if reader is not None:  # the first after it (a stack extended by copies repeats the names)
                roles[k], layer[k] = roles[reader], layer[reader]
    first = next((f for f in found.values() if f.heads), Found())
    weight_type = next((f.weight_type for f in found.values() if f.weight_type), 0) or next(
        (g.info[r].elem_type for k in range(len(nodes)) for _, r in g.weights(k)), 0)
    dims = Dims(batch=width(stream, 0) or report.batch, seq=width(stream, -2) or 0, hidden=width(stream) or 0,
                heads=first.heads, kv_heads=kv_heads(first), head_dim=first.head_dim,
                ffn=next((f.ffn for f in found.values() if f.ffn), 0), vocab=vocab,
                layers=max(members) + 1 if members else 0,
                act_bytes=(element_bits(stream.elem_type) or 32) // 8 if stream is not None else 4,
                param_bytes=(element_bits(weight_type) or 32) // 8, prob_bytes=px.prob_bytes(g, layer, roles, expert))
    outside_attention = next((k for k in range(len(nodes)) if layer[k] is None and nodes[k].family in PRODUCTS
                              and not g.weights(k) and sum(x is not None for x in nodes[k].inputs) > 1), None)
    return _Structure(nodes, scopes, g, stacks, layer, expert, roles, attention, members, found, tail, has_loss,
                      tied, dims, outside_attention)


@dataclass(frozen=True)
class _Structure:
    """What :func:`_build` reads off a report whatever the plan: its nodes and scopes, the roles and layers found,
    the dims and the node of attention outside the layers."""

    nodes: list
    scopes: list
    g: Any
    stacks: tuple
    layer: list
    expert: tuple
    roles: list
    attention: dict
    members: dict
    found: dict
    tail: Any
    has_loss: bool
    tied: int
    dims: Dims
    outside_attention: int | None

    @functools.cached_property
    def sp_bytes(self) -> dict[tuple[int, int], int]:
        """:func:`_sp_inputs` of the graph: they read no plan."""
        return _sp_inputs(self.g, self.roles)


#: The last few reports' :class:`_Structure` (by the identity of their node and scope lists, held so that the
#: identities are not reused): a plan search asks for many plans of a few reports (one per microbatch size and
#: recompute policy), and the roles are the costly part.
_structures: list[tuple] = []
_KEPT_STRUCTURES = 8


def _structure(report: Any) -> _Structure:
    for nodes, scopes, found in _structures:
        if nodes is report.nodes and scopes is report.modules.nodes:
            return found
    found = _structure_of(report)
    _structures[:] = [(report.nodes, report.modules.nodes, found), *_structures[:_KEPT_STRUCTURES - 1]]
    return found


def _build(report: Any, plan: ParallelPlan, within: tuple[int, int] | None) -> Layout:
    where = report.model.path or report.model.graph_name or "the model"
    if not _any_model(plan) and (report.modules.missing or len(report.modules.nodes) != len(report.nodes)):
        raise UsageError(f"--parallel: {where} has no module scopes ({report.modules.missing}), so the repeated "
                         f"layers {_degrees(plan)} splits cannot be found; a plan of dp (with fsdp, zero1 or zero2) "
                         "applies to any model")
    st = _structure(report)
    _check(plan, st, where, within)
    # what the layout reads of the plan past its checks: a plan that differs in nothing of it has the layout built
    key = (report.nodes, report.modules.nodes, plan.tp, plan.ep, plan.pp, chunks_of(plan),
           plan.dp * plan.cp if plan.fsdp else 0, within, plan.sp and plan.ep > 1)
    for asked, found in _built:
        if asked[0] is key[0] and asked[1] is key[1] and asked[2:] == key[2:]:
            return Layout(**{**found.__dict__, "plan": plan})
    found = _laid(report, plan, st, within)
    _built[:] = [*_built[-7:], (key, found)]
    return found


#: The last eight layouts :func:`_laid` built, by what they read of the plan (the node and scope lists by identity).
_built: list[tuple] = []


def _laid(report: Any, plan: ParallelPlan, st: _Structure, within: tuple[int, int] | None) -> Layout:
    """The layout of a plan :func:`_check` passed: its chunks, modules' shares and FSDP's padding, which read the
    plan's tp, ep, pp and chunks and, under fsdp, its D·C, and its blocks, which read sp under ep; ``within``:
    :func:`layout_of`'s."""
    nodes, scopes, g, layer, roles, dims = st.nodes, st.scopes, st.g, st.layer, st.roles, st.dims
    attention, has_loss, expert, stacks, tied, tail = st.attention, st.has_loss, st.expert, st.stacks, st.tied, st.tail
    v = chunks_of(plan)
    first, layers = within or (0, dims.layers)
    per_chunk = layers // (plan.pp * v) if layers else 1
    last = plan.pp * v - 1
    between = ps.between_layers(g, layer, roles, report.modules.parameters, -1 if first else None) \
        if len(stacks) > 1 or first else {}
    chunks = tuple(((first + layer[k]) // per_chunk,) if layer[k] is not None else ((first + between[k]) // per_chunk,)
                   if k in between else tuple(range(plan.pp)) if roles[k] == "positions" else (last,)
                   if roles[k] in ("vocab", "sequence") or (roles[k] == "replicated" and k in tail) else (0,)
                   for k in range(len(nodes)))
    f = report.convention.fc_flops_per_mac
    whole_part = {k: (n.cost.flops - f * n.cost.macs, n.backward.flops - f * n.backward.macs)
                  for k, n in enumerate(nodes) if roles[k] == "row" and n.op_type == "Gemm" and len(n.inputs) > 2
                  and n.inputs[2] is not None and n.inputs[2].name}
    added = "embedding" in roles and any(
        layer[k] is None and k not in tail and roles[k] != "embedding" and nodes[k].op_type == "Gather"
        and any(j == 0 for j, _ in g.weights(k)) for k in range(len(nodes)))
    layout = Layout(plan, dims, tuple(roles), tuple(layer), chunks, whole_part,
                    {n: tuple(ks) for n, ks in attention.items() if ks}, {}, has_loss, expert, stacks,
                    sum(elements(g.info[r]) for r in tied), lookups_added=added, **_blocks(st, plan),
                    **_tokens(st),
                    sp_inputs={(k, j): (chunks[k][0], b) for (k, j), b in st.sp_bytes.items()},
                    messages=ps.messages(g, chunks) if (len(stacks) > 1 or within) and plan.pp > 1 else (),
                    within=within)
    return _with_parameters(layout, g, scopes, tied, report.modules.parameters)


def _blocks(st: _Structure, plan: ParallelPlan) -> dict[str, tuple]:
    """:class:`Layout`'s ``blocks`` (see the module's rules: attention and MLP, 2, one more a further attention; with
    a mixer, it and its attention and MLP where it has them) and ``dispatched``, the layers whose MoE block (routed
    experts alone: no dense MLP or shared expert) the dispatcher gathers and reduce-scatters itself, less one block
    (:func:`flopcount.parallel.experts.no_tp_block`)."""
    out, dispatched = [], []
    for n in range(st.dims.layers):
        f = st.found.get(n, Found())
        routed = any(st.expert[k] for k in st.members.get(n, ()))
        alone = routed and not f.ffn and plan.tp > 1 and px.no_tp_block(plan)
        mlp = bool(f.ffn) or routed
        out.append(1 + bool(f.heads) + mlp - alone if f.mixer else 2 - alone + max(f.attentions - 1, 0))
        dispatched.append(alone)
    return {"blocks": tuple(out), "dispatched": tuple(dispatched)}


def _tokens(st: _Structure) -> dict[str, Any]:
    """:class:`Layout`'s token counts in a sequence: each layer's stream (the row-parallel projections' outputs), the
    cross-attention's reads from the other stack, the token-embedding lookups and the stream after the layers."""
    d, nodes = st.dims, st.nodes
    batch = d.batch or 1

    def seq_of(k: int) -> int:
        x = nodes[k].outputs[0] if nodes[k].outputs else None
        w = width(x)
        return elements(x) // w // batch if w else d.seq

    seqs = []
    for n in range(d.layers):
        rows = [k for k in st.members.get(n, ()) if st.roles[k] == "row" and nodes[k].family in PRODUCTS]
        seqs.append(seq_of(rows[0]) if rows else d.seq)
    cross = tuple(st.found.get(n, Found()).cross // batch for n in range(d.layers))
    latent = tuple(st.found.get(n, Found()).latents // batch for n in range(d.layers))
    parts = tuple(tuple(x // batch for x in st.found.get(n, Found()).latent_parts) for n in range(d.layers))
    lookups = tuple(seq_of(k) for k in range(len(nodes)) if st.roles[k] == "embedding") or (d.seq,)
    return {"seqs": tuple(seqs), "cross": cross, "latents": latent, "latent_parts": parts, "lookups": lookups, "out_seq": seqs[-1] if seqs else d.seq}


def _sp_inputs(g: Graph, roles) -> dict[tuple[int, int], int]:
    """The gathered inputs under sp (see the module's rules): (node, output position) → its bytes."""
    from ..reporting.report import element_bits

    out = {}
    for k, n in enumerate(g.nodes):
        if roles[k] not in SEQUENCE_ROLES:
            continue
        for j, x in enumerate(n.outputs):
            if x is None or not x.name:
                continue
            # this copy's readers, up to the node that makes the name again (a stack extended by copies)
            again = g.next_maker(x.name, k)
            if any(roles[q] in GATHERING_ROLES for q in g.consumers.get(x.name, ()) if k < q < again):
                info = g.info.get(x.name, x)
                out[(k, j)] = elements(info) * ((element_bits(info.elem_type) or 32) // 8)
    return out


def _any_model(plan: ParallelPlan) -> bool:  # whether the plan only replicates the model over DP (any model)
    return plan.tp == plan.pp == plan.cp == plan.ep == 1


def _degrees(plan: ParallelPlan) -> str:
    return ",".join(f"{d}={getattr(plan, d)}" for d in ("tp", "pp", "cp", "ep") if getattr(plan, d) > 1) or "dp"


def _check(plan: ParallelPlan, st: _Structure, where: str, within: tuple[int, int] | None = None) -> None:
    """:class:`UsageError` for what the plan cannot split, one line naming the part and why; ``within``: a graph of
    some of a model's layers (:func:`layout_of`), whose stages the whole model's checks have passed."""
    d, found, members, nodes, scopes = st.dims, st.found, st.members, st.nodes, st.scopes
    outside_attention = st.outside_attention
    t, p, v = plan.tp, plan.pp, chunks_of(plan)
    if _any_model(plan):
        return
    if not members:
        raise UsageError(f"--parallel {_degrees(plan)}: {where} has no repeated attention layers (indexed module "
                         "scopes such as layers.N or h.N holding a product of Q and K); tp, pp, cp and ep split a "
                         "stack of such layers, while a plan of dp (with fsdp, zero1 or zero2) applies to any model")
    if outside_attention is not None:
        raise UsageError(f"--parallel {_degrees(plan)}: {where} has attention outside its repeated layers (node "
                         f"{nodes[outside_attention].name!r} in {_scope(scopes, outside_attention)}), which no rule "
                         "splits per rank; a plan of dp (with fsdp, zero1 or zero2) applies to any model")
    if len(st.stacks) > 1:
        ps.check_stacks(plan, st.stacks, any(f.cross for f in found.values()), where, _degrees(plan))
    mixer = next(((n, f.mixer) for n, f in sorted(found.items()) if f.mixer), None)
    for n, f in sorted(found.items()):
        if f.mixer and (plan.cp > 1 or t > 1 and (not f.mixer_groups or f.mixer_heads % t or f.mixer_groups % t)):
            raise UsageError(mixer_refused(plan, n, f))
    if not d.heads and mixer is None:
        raise UsageError(f"--parallel {_degrees(plan)}: {where}'s repeated layers have no attention (no product of "
                         "Q and K found in the graph); tensor, pipeline and context parallelism split a stack of "
                         "attention layers, while a plan of dp (with fsdp, zero1 or zero2) applies to any model")
    if (t > 1 or plan.cp > 1) and d.heads:
        if not d.kv_heads:
            raise UsageError(f"--parallel {_degrees(plan)}: {where}: the K/V projections' width is not whole heads "
                             f"of {d.head_dim}; the head-splitting rule cannot be applied")
    if t > 1:
        for n, f in sorted(found.items()):
            if f.unclassified:
                k = f.unclassified[0]
                raise UsageError(f"--parallel tp={t}: node {nodes[k].name!r} ({nodes[k].op_type} in "
                                 f"{_scope(scopes, k)}) is a "
                                 "product outside the attention projections and the MLP's projections around its "
                                 "activation; no tensor-parallel rule applies to it; give tp=1")
            if f.kv_fused == "qkv" and d.kv_heads % t:
                raise UsageError(f"--parallel tp={t}: the fused QKV projection of layer {n} splits whole K/V heads "
                                 f"only when tp divides its {d.kv_heads} K/V heads")
        for size, what in ((d.heads, "attention heads"), (d.ffn, "MLP width (intermediate size)"),
                           (d.vocab, "vocabulary"), *((f.heads, f"attention heads of layer {n}") for n, f in
                                                      sorted(found.items())),
                           *((f.ffn, f"MLP width of layer {n}") for n, f in sorted(found.items()))):
            if size % t:
                raise UsageError(f"--parallel tp={t}: tp must divide the {size} {what}")
        if d.kv_heads % t and t % d.kv_heads:
            raise UsageError(f"--parallel tp={t}: tp must divide the {d.kv_heads} K/V heads or be a multiple of them")
    if d.seq % (2 * plan.cp) and plan.cp > 1:
        raise UsageError(f"--parallel cp={plan.cp}: the zigzag split needs 2·cp = {2 * plan.cp} to divide the "
                         f"sequence length {d.seq}")
    if plan.sp and plan.cp > 1 and (d.seq // plan.cp) % t:
        raise UsageError(f"--parallel tp={t},cp={plan.cp},sp: tp must divide each CP rank's {d.seq // plan.cp} tokens")
    if (plan.dp * plan.cp) % plan.ep:
        raise UsageError(f"--parallel ep={plan.ep}: expert parallelism reuses the dp·cp = {plan.dp * plan.cp} "
                         "data- and context-parallel ranks; ep must divide dp·cp")
    if plan.sp and plan.cp == 1 and d.seq % t:
        raise UsageError(f"--parallel tp={t},sp: tp must divide the sequence length {d.seq} under sp")
    if len(st.stacks) > 1 and (plan.sp or plan.cp > 1):
        ps.check_sequences(plan, _tokens(st)["seqs"], lambda n: _stack_name(st, n))
    layers = d.layers if within is None else within[1]
    if layers % p:
        raise UsageError(f"--parallel pp={p}: pp must divide the {layers} layers (stages of equal layers)")
    if layers % (p * v):
        raise UsageError(f"--schedule interleaved:{v}: pp·v = {p * v} must divide the {layers} layers "
                         "(chunks of equal layers)")
    if v > 1 and plan.microbatches % p:
        raise UsageError(f"--microbatches {plan.microbatches}: the interleaved schedule runs microbatches in groups "
                         f"of pp={p}; give a multiple of {p}")


def _stack_name(st: _Structure, layer: int) -> str:
    """The module prefix of the stack that ``layer`` (numbered over all stacks) lies in."""
    return next(p for p, offset in reversed(st.stacks) if layer >= offset)


def _scope(scopes, k: int) -> str:  # the innermost module of node k
    return scopes[k][-1] if scopes[k] else "no module"


def _with_parameters(layout: Layout, g: Graph, scopes, tied: frozenset[str], parameters: frozenset[str]) -> Layout:
    """``layout`` with its modules' shares (see the module's rules), the modules that read a tied weight and, under
    fsdp, FSDP2's padding of the ``parameters`` (the stored tensors the report calls parameters)."""
    modules: dict[str, ModuleShare] = {}
    readers: list[str] = []
    whole: dict[str, int] = {}
    padding: dict[tuple[int, str], int] = {}
    seen: set[tuple[str, str]] = set()
    padded: set[tuple[int | None, str]] = set()  # (layer, parameter): a stack extended by copies repeats the names
    for k in range(len(g.nodes)):
        module = scopes[k][-1] if scopes[k] else ""
        for j, root in g.weights(k):
            div = layout.param_divisor(k, j)
            if module not in modules:
                modules[module] = ModuleShare(layout.roles[k], layout.chunks[k][0] % layout.plan.pp)
            if (module, root) not in seen and div == 1 and layout.divisor(modules[module].role) > 1 \
                    and root in parameters:  # a parameter kept whole (a row-parallel bias), not a constant
                whole[module] = whole.get(module, 0) + elements(g.info[root])
            seen.add((module, root))
            if root in tied and module not in readers:
                readers.append(module)
            if layout.plan.fsdp and root in parameters and (layout.layer[k], root) not in padded:
                padded.add((layout.layer[k], root))
                key = (layout.chunks[k][0] % layout.plan.pp,
                       "expert" if layout.expert[k] else "root" if layout.layer[k] is None else "layer")
                padding[key] = padding.get(key, 0) + _padding(layout, g.info[root], div, layout.expert[k])
    modules = {m: ModuleShare(s.role, s.stage, whole.get(m, 0)) for m, s in modules.items()}
    return Layout(**{**layout.__dict__, "modules": modules, "tied_modules": tuple(readers), "padding": padding})


def _padding(layout: Layout, info: Any, div: int, expert: bool) -> int:
    """The elements FSDP2's dim-0 padding adds to a parameter's TP share (``div``: its TP and EP divisor) gathered
    over its data-parallel group (D·C ranks, D·C/E for a routed expert's)."""
    plan = layout.plan
    n = max(plan.dp * plan.cp // plan.ep, 1) if expert else plan.dp * plan.cp
    shard = fsdp_shard(info.shape, div, n)
    return n * shard - -(-elements(info) // div) if shard is not None else 0
