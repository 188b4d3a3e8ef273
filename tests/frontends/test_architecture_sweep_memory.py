"""The architecture sweep's memory column: every family of :mod:`test_architecture_sweep` (its configurations and
builders, imported), counted by :func:`flopcount.from_hf` with ``mode="train"``, ``optimizer="adamw"`` and the
memory ledger on the CPU (fp32), against one real AdamW step of the same tiny model on this CPU, with eager
attention and, where the family supports it, sdpa:

* activations == the unique storages ``torch.autograd.graph.saved_tensors_hooks`` catch in the step's forward
  (weights and buffers left out);
* parameters, gradients and optimizer states == ``MemTracker``'s "Parameter", "Gradient" and "Optstate" after the
  step (AdamW's single-tensor step, what torch runs on the CPU; its states made by a first step);
* the peak, less the graph's inputs (made before the tracker runs), within 2% of ``MemTracker``'s peak of the step.

The loss is the sum of the model's floating-point outputs, as in the sweep (its backward keeps nothing). A
mixture-of-experts model runs its experts with transformers' ``grouped_mm`` in the real step, the grouped product
over the resident weights that the ledger models (the count's graph gathers each token's k weight slices,
``batched_mm``, read as views: :mod:`flopcount.memory.experts`). A family whose modelling code takes another branch
under export (:data:`test_architecture_sweep.EXPORT_BRANCH`) runs its real step on the export's branch, as the
FLOP sweep does. Where torch keeps what the ledger does not,
:data:`DIFFERS` names the op and its bytes in closed form, asserted exactly; a case whose ledger is not yet torch's
is in :data:`PENDING_MEMORY` with the op and the bytes measured, a strict expected failure (it fails the run once it
passes, so the table cannot go stale). docs/architectures.md shows the column (checked against these tables by
:func:`test_docs_table_is_the_tests_table`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable

import pytest
from helpers import saving, tracked_step
from test_architecture_sweep import (  # noqa: F401 - sweep_exports is a fixture
    B, EXPORT_BRANCH, FAMILIES, PENDING, S, Family, built_config, exporting, float_outputs, real_model, sweep_exports)

import flopcount

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed._tools.mem_tracker")

pytestmark = pytest.mark.slow

F32 = 4
ATTENTIONS = ("eager", "sdpa")


def supports_sdpa(fam: Family) -> bool:
    """Whether the family's model supports sdpa (its model built on the meta device once per family: collection and
    the docs' table ask)."""
    return _supports_sdpa(fam.model_type)


@functools.cache
def _supports_sdpa(model_type: str) -> bool:
    from flopcount.frontends.hf import build_model

    fam = next(p.values[0] for p in FAMILIES if p.values[0].model_type == model_type)
    return bool(getattr(build_model(built_config(fam)), "_supports_sdpa", False))


def config_of(fam: Family, attn: str):
    config = built_config(fam)
    config._attn_implementation = attn
    return config


def ledger(fam: Family, attn: str, exports):
    from flopcount.memory.ledger import MemorySettings

    report = flopcount.from_hf(config_of(fam, attn), fam.inputs, convention="dense", mode="train", optimizer="adamw",
                               memory=MemorySettings(device="cpu"), cache_dir=exports)
    assert not report.memory.missing and not report.memory.unsized
    (rank,) = report.memory.ranks
    return rank


@dataclasses.dataclass(frozen=True)
class Step:
    """torch's figures of one real AdamW step: the saved storages' bytes, MemTracker's categories after the step
    and its peak total."""

    saved: int
    after: dict
    peak: int


def real_step(fam: Family, attn: str) -> Step:
    from flopcount.frontends.hf import hf_inputs
    from flopcount.frontends.torch import forward_inputs

    model = real_model(config_of(fam, attn), train=True)
    if getattr(model.config, "_experts_implementation", None) is not None:
        model.config._experts_implementation = "grouped_mm"  # read by the experts at each call
    inputs = forward_inputs(model, hf_inputs(model, fam.inputs))
    saved: list[int] = []  # each step's saved storages' bytes
    outputs: list = []  # the step's outputs, held through its backward and optimizer step

    def loss():
        outputs.clear()
        with saving(model) as seen:
            outputs.extend(float_outputs(model(**inputs)))
        saved.append(sum(seen.values()))
        return sum(t.sum() for t in outputs)

    branch = exporting(model) if fam.model_type in EXPORT_BRANCH else contextlib.nullcontext()
    with branch:  # the modelling code on the branch the export took, where it takes another eagerly
        tracked = tracked_step(model, loss, torch.optim.AdamW)  # its first step makes AdamW's states
    return Step(saved[-1], tracked.after, tracked.peak)


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def experts(config) -> list:
    """The family's mixture-of-experts blocks (transformers' ``...Experts`` modules), built on the meta device."""
    from flopcount.frontends.hf import build_model

    return [m for m in build_model(config).modules() if type(m).__name__.endswith("Experts")]


def grouped_mm_sort(config) -> int:
    """transformers' ``grouped_mm`` experts sort the T·k (token, expert) pairs by expert: per MoE block, the
    permutation, its inverse and the gather's index (int64 vectors of T·k, kept by aten.index's backward) and the
    E group offsets (int32, kept by aten._grouped_mm's backward); the count's batched graph has none of them."""
    pairs = B * S * config.num_experts_per_tok
    return sum(3 * pairs * 8 + 4 * m.num_experts for m in experts(config))


def sorted_routing_weights(config) -> int:
    """``grouped_mm`` multiplies each (token, expert) pair's output by its routing weight in the sorted order
    (``sample_weights[perm]``, a copy of T·k floats), which aten.mul's backward keeps. The count's batched graph
    weights by the routing weights themselves: where they are the top-k values (Mixtral: the softmax before the
    top-k) they are kept in the copy's place; GraniteMoE's softmax comes after the top-k, and its output, which the
    weighting reads, is kept by the softmax already. T·k floats a MoE block beyond the sort."""
    return len(experts(config)) * F32 * B * S * config.num_experts_per_tok


def sdpa_output_copy(config) -> int:
    """Phi-3's rotary embedding concatenates the rotated part with the part it leaves (``torch.cat``, empty here:
    the whole head is rotated), which makes Q contiguous [B, heads, S, d]; torch's CPU flash kernel writes its output
    in Q's layout, so the output projection's input (the output transposed to [B, S, heads·d]) is a copy that
    aten.mm keeps. The export drops the concatenation with an empty tensor, so the ledger sees Q transposed and
    reads that input as a view of the kept sdpa output: B·S·heads·d floats a layer."""
    return config.num_hidden_layers * F32 * B * S * config.num_attention_heads * head_dim(config)


def position_ids(config) -> int:
    """GPT-2 makes its position ids in the forward (``torch.arange``, [1, S] int64), which the position embedding's
    backward (aten.embedding_backward) keeps; the export folds them into a constant, no activation."""
    return 8 * S


def decoder_length(config) -> int:
    fam = next(p.values[0] for p in FAMILIES if p.values[0].model_type == config.model_type)
    return fam.inputs["decoder_input_ids"][1]


def decoder_position_ids(config) -> int:
    """BART's decoder makes its position ids in the forward (``torch.arange`` of the decoder's length, [1, S_dec]
    int64), which its position embedding's backward keeps; the export folds them into a constant."""
    return 8 * decoder_length(config)


def relative_position_buckets(config) -> int:
    """T5 makes the relative position buckets of its first self-attention layers in the forward ([S, S] in the
    encoder, [S_dec, S_dec] in the decoder, int64), which the bucket embedding's backward keeps; the export folds
    them into constants."""
    return 8 * (S * S + decoder_length(config) ** 2)


def decoder_causal_masks(config) -> int:
    """T5 under sdpa hands its position bias to sdpa as a float mask made per decoder self-attention layer
    (transformers' ``create_position_bias_mask``): ``torch.where`` of a boolean causal mask [1, 1, S_dec, S_dec]
    built in the forward from ``torch.arange``, which aten.where's backward keeps; the export folds it into a
    constant. One a decoder layer, a byte per element."""
    return config.num_decoder_layers * decoder_length(config) ** 2


def query_layout_copies(config) -> int:
    """Whisper makes Q contiguous as [B, heads, S, d] (``.transpose(1, 2).contiguous()``, which the export drops: ONNX
    has no layout), so torch's CPU flash kernel writes each attention's output in that layout and the output
    projection's input (the output transposed to [B, S, heads·d]) is a copy that aten.mm keeps, as Phi-3's
    (:func:`sdpa_output_copy`): B·S_q·d_model floats per attention, the encoder's self-attentions on its S frames
    (max_source_positions), the decoder's self- and cross-attentions on its S_dec tokens."""
    return F32 * B * config.d_model * (config.encoder_layers * config.max_source_positions
                                        + 2 * config.decoder_layers * decoder_length(config))


def list_indices(config) -> int:
    """Falcon's multi-query split takes K and V from the fused projection by list indexing (``fused_qkv[..., [-2],
    :]``, ``[-1]``): torch makes a one-element int64 index for each in the forward, which aten.index's backward
    keeps; the export folds them into constants. Two a layer, 8 bytes each."""
    return config.num_hidden_layers * 2 * 8


def scan_mixers(config) -> list:
    """The family's Mamba 2 mixers (the modules that run the chunked scan: a ``chunk_size``), built on the meta
    device."""
    from flopcount.frontends.hf import build_model

    return [m for m in build_model(config).modules() if hasattr(m, "chunk_size") and hasattr(m, "head_dim")]


def chunks(m) -> int:
    return -(-S // m.chunk_size)


def segment_sum_masks(config) -> int:
    """The Mamba 2 scan's ``segment_sum`` masks the sum with ``~tril(ones(n, n))`` twice (below the diagonal, then
    on it), made in the forward, which aten.masked_fill's backward keeps; the export folds them into constants. It
    runs on the chunk's positions (n = chunk_size) and on the chunks' boundaries (n = chunks + 1): per mixer
    2·(chunk_size² + (chunks + 1)²) bool bytes."""
    return sum(2 * (m.chunk_size ** 2 + (chunks(m) + 1) ** 2) for m in scan_mixers(config))


def padded_scan_output(config) -> int:
    """The scan makes its output contiguous (``(Y_diag + Y_off).contiguous()``, a copy the export drops: the
    einsums' products are laid out as their batched products), then cuts the padding off (a slice); the gated
    norm's product (aten.mul) keeps it through a view of the padded storage, where the ledger keeps the reshape of
    the slice as a copy of the unpadded length: per mixer B·(chunks·chunk_size − S)·heads·head_dim floats."""
    return sum(F32 * B * (chunks(m) * m.chunk_size - S) * m.num_heads * m.head_dim for m in scan_mixers(config))


def initial_scan_state(config) -> int:
    """The Mamba (1) mixer's recurrent scan starts from ``torch.zeros(B, intermediate, state)`` made in the forward;
    its first step's product ``discrete_A[..., 0] * ssm_state`` keeps it (aten.mul's backward, for discrete_A's
    gradient); the export folds the zeros into a constant: per mixer B·intermediate·state floats."""
    from flopcount.frontends.hf import build_model

    return sum(F32 * B * m.intermediate_size * m.ssm_state_size for m in build_model(config).modules()
               if hasattr(m, "ssm_state_size") and not hasattr(m, "chunk_size"))


def sinks_max(config) -> int:
    """GPT-OSS subtracts the row maximum of the logits concatenated with the attention sinks, ``.max(dim=-1,
    keepdim=True).values``: torch's ``max.dim`` keeps its int64 indices [B, heads, S, 1]; the export writes it as
    ReduceMax, which is also ``amax``'s node (keeping its input and output), and the ledger's ReduceMax keeps its
    input, the concatenated logits [B, heads, S, S + 1] floats (the graph cannot say which torch ran). Per layer
    B·heads·S·(8 − 4·(S + 1)) bytes, less in torch."""
    return config.num_hidden_layers * B * config.num_attention_heads * S * (8 - F32 * (S + 1))


def linear_attention_layers(config) -> int:
    return sum(kind == "linear_attention" for kind in config.layer_types)


def initial_delta_state(config) -> int:
    """Qwen3-Next's chunked gated delta rule starts its recurrent state from ``torch.zeros(B, value heads, key
    dim, value dim)`` made in the forward, which the first chunk's products with it keep (aten.bmm's backward, the
    state read as [B·heads, dk, dv], a view); the export folds the zeros into a constant: per linear-attention layer
    B·heads·dk·dv floats."""
    return linear_attention_layers(config) * F32 * B * config.linear_num_value_heads * config.linear_key_head_dim \
        * config.linear_value_head_dim


def strictly_upper_mask(config) -> int:
    """The gated delta rule masks its pairwise decays with ``torch.ones(C, C, dtype=bool).triu(1)`` made in the
    forward (C = 64, its chunk), which aten.masked_fill's backward keeps; the export folds it into a constant: per
    linear-attention layer C² bool bytes."""
    return linear_attention_layers(config) * 64 * 64


MOE = ("aten.index, aten._grouped_mm: grouped_mm's sort of the (token, expert) pairs", grouped_mm_sort)
WEIGHTS = ("aten.mul: grouped_mm's routing weights in the sorted order, a copy", sorted_routing_weights)
COPY = ("aten.mm: sdpa's output transposed, a copy (Q made contiguous by a cat the export drops)",
        sdpa_output_copy)
POSITIONS = ("aten.embedding: the position ids made in the forward", position_ids)
DECODER_POSITIONS = ("aten.embedding: the decoder's position ids made in the forward", decoder_position_ids)
INDICES = ("aten.index: K's and V's list indices made in the forward", list_indices)
MASKS = ("aten.masked_fill: the Mamba 2 scan's segment_sum masks made in the forward", segment_sum_masks)
PADDED = ("aten.mul: the Mamba 2 scan's padded output, made contiguous by a copy the export drops",
          padded_scan_output)
ZEROS = ("aten.mul: the Mamba scan's initial state made in the forward", initial_scan_state)
SINKS = ("aten.max.dim: the sinks' row maximum keeps int64 indices, the exported ReduceMax its input", sinks_max)
BUCKETS = ("aten.embedding: the relative position buckets made in the forward", relative_position_buckets)
CAUSAL = ("aten.where: the decoder's causal masks made in the forward", decoder_causal_masks)
LAYOUT = ("aten.mm: sdpa's output transposed, a copy (Q made contiguous, which the export drops)",
          query_layout_copies)
DELTA_STATE = ("aten.bmm: the gated delta rule's initial state made in the forward", initial_delta_state)
DELTA_MASK = ("aten.masked_fill: the gated delta rule's chunk mask made in the forward", strictly_upper_mask)

#: (family, attention) → what torch keeps beyond the ledger's activations (negative: less): each entry the op that
#: keeps it and its bytes in closed form of the family's configuration.
DIFFERS: dict[tuple[str, str], tuple[tuple[str, Callable], ...]] = {
    **{(name, attn): (MOE,) for name in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3")
       for attn in ATTENTIONS},
    **{("granitemoe", attn): (MOE, WEIGHTS) for attn in ATTENTIONS},
    ("phi3", "sdpa"): (COPY,),
    **{("gpt2", attn): (POSITIONS,) for attn in ATTENTIONS},
    **{("bart", attn): (DECODER_POSITIONS,) for attn in ATTENTIONS},
    ("t5", "eager"): (BUCKETS,),
    ("t5", "sdpa"): (BUCKETS, CAUSAL),
    ("whisper", "sdpa"): (LAYOUT,),
    **{("falcon", attn): (INDICES,) for attn in ATTENTIONS},
    **{(name, attn): (MASKS, PADDED) for name in ("mamba2", "bamba", "falcon_h1") for attn in ATTENTIONS},
    **{("granitemoehybrid", attn): (MOE, WEIGHTS, MASKS, PADDED) for attn in ATTENTIONS},
    **{("jamba", attn): (MOE, ZEROS) for attn in ATTENTIONS},
    ("gpt_oss", "eager"): (MOE, WEIGHTS, SINKS),
    **{("qwen3_next", attn): (MOE, DELTA_STATE, DELTA_MASK) for attn in ATTENTIONS},
}


#: (family, attention) whose ledger is not yet torch's, with the op and the bytes measured (torch's saved storages
#: less the ledger's activations, on this sweep's sizes): their test is a strict expected failure until the ledger
#: is fixed.
PENDING_MEMORY: dict[tuple[str, str], str] = {}


def cases():
    for p in FAMILIES:
        fam = p.values[0]
        if fam.model_type in PENDING:
            continue
        for attn in ATTENTIONS:
            pending = PENDING_MEMORY.get((fam.model_type, attn))
            marks = [pytest.mark.xfail(strict=True, reason=pending)] if pending else []
            if attn == "eager" or supports_sdpa(fam):
                yield pytest.param(fam, attn, id=f"{fam.model_type}-{attn}", marks=marks)


@pytest.mark.parametrize("fam, attn", list(cases()))
def test_memory_equals_torch(fam, attn, sweep_exports):
    rank = ledger(fam, attn, sweep_exports)
    theirs = real_step(fam, attn)
    config = config_of(fam, attn)
    named = {op: closed(config) for op, closed in DIFFERS.get((fam.model_type, attn), ())}
    assert theirs.saved - rank.activations_bytes == sum(named.values()), (rank.activations_bytes, theirs.saved, named)
    assert rank.params_bytes == theirs.after["Parameter"]
    assert rank.grads_bytes == theirs.after["Gradient"]
    assert rank.optimizer_bytes == theirs.after["Optstate"]
    ratio = (rank.peak_bytes - rank.inputs_bytes) / theirs.peak
    print(f"\n{fam.model_type} {attn}: activations {rank.activations_bytes} torch {theirs.saved} peak {ratio:.6f}")
    assert abs(ratio - 1) <= 0.02, ratio


@functools.cache
def supports_flex(model_type: str) -> bool:
    """Whether the family's model supports flex attention (``_supports_flex_attn``, built on the meta device)."""
    from flopcount.frontends.hf import build_model

    fam = next(p.values[0] for p in FAMILIES if p.values[0].model_type == model_type)
    return bool(getattr(build_model(built_config(fam)), "_supports_flex_attn", False))


FLEX = [p for p in FAMILIES if p.values[0].model_type not in PENDING and supports_flex(p.values[0].model_type)]


@pytest.mark.parametrize("fam", FLEX)
def test_flex_attention_is_refused_in_one_line(fam):
    """A model under flex attention cannot be exported (torch's FlexAttention does not run on the meta device, and
    the ONNX exporter has no function for its block mask): refused in one line with a flopcount exit code, before
    any export is tried."""
    from flopcount.errors import FrontendError

    with pytest.raises(FrontendError) as e:
        flopcount.from_hf(config_of(fam, "flex_attention"), fam.inputs, convention="dense", mode="train",
                          optimizer="adamw", memory=True)
    assert "\n" not in str(e.value) and e.value.exit_code == 9
    assert "attn_implementation 'flex_attention' cannot be exported to ONNX" in str(e.value)


def test_flex_attention_has_no_cpu_backward_in_torch():
    """Nor is there a real CPU step to hold the ledger against: torch's FlexAttention refuses a backward on the CPU
    (eager and compiled alike). When torch gains one, this fails: the sweep's memory column then wants flex."""
    from torch.nn.attention.flex_attention import flex_attention

    q, k = torch.randn(B, 4, S, 16, requires_grad=True), torch.randn(B, 2, S, 16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(q, k, k, enable_gqa=True)


# docs/architectures.md's table: its family rows are the sweep's, and its memory and per-rank columns are these
# tests' data (DIFFERS here, the plans tests/parallel/test_parallel_families.py checks), never written by hand.

DOCS = __import__("pathlib").Path(__file__).parents[2] / "docs" / "architectures.md"


def parallel_tests():
    """tests/parallel/test_parallel_families.py, for the plans it checks and refuses per family."""
    import importlib.util
    import sys

    name = "test_parallel_families"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, DOCS.parents[1] / "tests" / "parallel" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def memory_cell(fam: Family, attn: str) -> str:
    """The table's memory cell: ``exact`` where the activations equal torch's saved storages, else each named
    difference (torch's bytes beyond the ledger's, and the op); empty where the family has no such attention."""
    if fam.model_type in PENDING or (attn != "eager" and not supports_sdpa(fam)):
        return ""
    if (fam.model_type, attn) in PENDING_MEMORY:
        return "pending"
    named = DIFFERS.get((fam.model_type, attn), ())
    if not named:
        return "exact"
    config = config_of(fam, attn)
    return "; ".join(f"{closed(config):+,} B: {op}" for op, closed in named)


def docs_rows() -> list[list[str]]:
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| family | kind |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_docs_table_is_the_tests_table():
    """The table in docs/architectures.md has one row per family of the sweep, in its order, the generate column
    where the sweep checks generate, and the memory (eager, sdpa) and per-rank cells these tests' tables give."""
    rows = docs_rows()
    families = [p.values[0] for p in FAMILIES]
    assert [r[0] for r in rows] == [f.model_type for f in families]
    for fam, row in zip(families, rows):
        want = [memory_cell(fam, "eager"), memory_cell(fam, "sdpa"), parallel_tests().per_rank_cell(fam.model_type)]
        assert row[6:] == want, (fam.model_type, row[6:], want)
        assert (row[5] == "exact") == fam.generate, fam.model_type


def docs_table_cells() -> str:
    """The memory and per-rank cells of every family, as the table's last three columns (to update the page)."""
    return "\n".join(f"{f.model_type} | {memory_cell(f, 'eager')} | {memory_cell(f, 'sdpa')} | "
                     f"{parallel_tests().per_rank_cell(f.model_type)} |" for f in (p.values[0] for p in FAMILIES))
