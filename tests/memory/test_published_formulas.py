"""The published activation-memory formulas beside the ledger, on Llama-3-8B and a GPT-3-like 175B (docs/memory.md,
"Published formulas beside the ledger").

Written out here as their sources state them (b sequences of s tokens, hidden h, a query heads, g K/V heads, MLP
width F, vocabulary V, L layers, t tensor-parallel ranks; 2-byte activations):

* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Table 2, per layer:
  no recompute s·b·h·(34 + 5·a·s/h), with TP s·b·h·(10 + 24/t + 5·a·s/(h·t)), with TP and SP the whole
  divided by t; selective recompute s·b·h·(10 + 24/t), with TP and SP 34·s·b·h/t.
* Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (NVIDIA/Megatron-LM at commit 00caa53a):
  ``compute_weight_and_optimizer_memory``: 18 bytes per parameter (no distributed optimizer), the parameters by
  its own formula; ``compute_activation_memory`` (sequence parallelism with selective recompute): s·b·h·(18 + 4·F/h)
  per layer, + 8·s·b + s·b·h (the embedding's input and dropout) + 4·s·b·h·(1 + V/h) (the output layer and loss),
  all / t; ``compute_activation_memory_without_sp`` (every other case, no recompute included): s·b·h·(10 + 24/t)
  per layer, + 8·s·b + s·b·h + 2·(s·b·V/t + s·b·h), all × 1.05 (one rank: t = p = 1).
* torch's eager layer as transformers writes it, bf16, dropout as the CUDA kernel keeps it (a bool mask): the
  closed forms of ``test_memory_llama_block.py`` (Llama) and of the paper's block (GPT-2's code, exact GELU).

The ledger's per-layer figure is its 2-layer count less its 1-layer count. The tables of docs/memory.md are checked
against these closed forms (fast); the slow tests count the full-size layers and check the ledger equals them.
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass
from fractions import Fraction

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SECTION = "## Published formulas beside the ledger"


@dataclass(frozen=True)
class Shape:
    """A decoder's published shape: ``ffn`` the MLP width F (SwiGLU's I when ``gated``), ``padded_vocab`` the
    vocabulary Megatron-LM pads to a multiple of 128, ``positions`` learned position embeddings (0: rotary)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    padded_vocab: int
    positions: int
    gated: bool  # SwiGLU, RMSNorm, no biases, no dropout, untied head (Llama); else GELU, LayerNorm, biases, tied


LLAMA_3_8B = Shape("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, 128256, 0, True)
#: Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads of 128, context 2048; GPT-2's 50257 tokens
GPT3_175B = Shape("GPT-3 175B", 96, 12288, 96, 96, 4 * 12288, 50257, 50304, 2048, False)
MODELS = (LLAMA_3_8B, GPT3_175B)
SEQUENCES = (2048, 4096)
B = 1


# -- the terms of one layer, as monomials in s, b and the shape ----------------------------------------------------

MONOMIALS = {
    "s·b·h": lambda m, s, b: s * b * m.hidden,
    "s·b·F": lambda m, s, b: s * b * m.ffn,
    "s·b·h·g/a": lambda m, s, b: Fraction(s * b * m.hidden * m.kv_heads, m.heads),
    "a·s²·b": lambda m, s, b: m.heads * s * s * b,
    "s·b": lambda m, s, b: s * b,
}


def value(terms: dict, m: Shape, s: int, b: int) -> Fraction:
    """The bytes of ``terms`` (monomial → coefficient) on model ``m``."""
    return sum((Fraction(c) * MONOMIALS[k](m, s, b) for k, c in terms.items()), Fraction(0))


def text(terms: dict) -> str:
    """``terms`` as the docs write them: ``4·s·b·h + 8·s·b``, or ``0``."""
    return " + ".join(k if c == 1 else f"{c}·{k}" for k, c in terms.items() if c) or "0"


#: One layer's kept tensors, term by term: (tensor, in the attention core that selective recompute makes again,
#: Korthikanti et al.'s block, Megatron-LM's SP formula, torch's GPT-2 layer (exact GELU), torch's Llama layer under
#: selective recompute, without). F is the MLP's width: 4h in the paper's block and GPT-3, I in Llama's SwiGLU.
TERMS = (
    ("attention's norm: its input and output, the QKV product's input", False,
     {"s·b·h": 4}, {"s·b·h": 4}, {"s·b·h": 4}, {"s·b·h": 8}, {"s·b·h": 8}),
    ("the norms' float32 statistics: mean and rstd, or RMSNorm's rstd", False,
     {}, {}, {"s·b": 16}, {"s·b": 8}, {"s·b": 8}),
    ("Q, K and V", False,
     {"s·b·h": 6}, {"s·b·h": 6}, {"s·b·h": 6}, {"s·b·h": 2, "s·b·h·g/a": 4}, {"s·b·h": 6}),
    ("softmax output", True,
     {"a·s²·b": 2}, {}, {"a·s²·b": 2}, {}, {"a·s²·b": 4}),
    ("attention dropout mask", True,
     {"a·s²·b": 1}, {}, {"a·s²·b": 1}, {}, {}),
    ("probabilities read by the product with V", True,
     {"a·s²·b": 2}, {}, {"a·s²·b": 2}, {}, {"a·s²·b": 2}),
    ("output projection's input", False,
     {"s·b·h": 2}, {"s·b·h": 2}, {"s·b·h": 2}, {"s·b·h": 2}, {"s·b·h": 2}),
    ("attention output dropout mask", False,
     {"s·b·h": 1}, {"s·b·h": 1}, {"s·b·h": 1}, {}, {}),
    ("MLP's norm: its input and output, the MLP's input", False,
     {"s·b·h": 4}, {"s·b·h": 4}, {"s·b·h": 4}, {"s·b·h": 8}, {"s·b·h": 8}),
    ("MLP inside: GELU's input and output / gate, SiLU of the gate, up, their product", False,
     {"s·b·h": 16}, {"s·b·F": 4}, {"s·b·h": 16}, {"s·b·F": 8}, {"s·b·F": 8}),
    ("MLP dropout mask", False,
     {"s·b·h": 1}, {"s·b·h": 1}, {"s·b·h": 1}, {}, {}),
)
PAPER, MEGATRON_SP, GPT2_EAGER, LLAMA_SELECTIVE, LLAMA_NONE = range(5)


def column(k: int, m: Shape, s: int, b: int, core: bool = True) -> Fraction:
    """The sum of column ``k`` of :data:`TERMS` (``core=False``: without the attention core's rows)."""
    return sum((value(row[2 + k], m, s, b) for row in TERMS if core or not row[1]), Fraction(0))


# -- the formulas as published --------------------------------------------------------------------------------------

def korthikanti(m: Shape, s: int, b: int, recompute: str, t: int = 1, sp: bool = False) -> Fraction:
    """Korthikanti et al. 2022, Table 2: one layer's activations on one of t tensor-parallel ranks."""
    h, a = m.hidden, m.heads
    if recompute == "selective":
        return Fraction(34 * s * b * h, t) if sp else s * b * h * (10 + Fraction(24, t))
    if sp:
        return Fraction(s * b * h, t) * (34 + Fraction(5 * a * s, h))
    return s * b * h * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))


def megatron_layer(m: Shape, s: int, b: int, sp_selective: bool, t: int = 1) -> Fraction:
    """theoretical_memory_usage.py, one layer: the SP path (sequence parallelism and selective recompute) or the
    other."""
    if sp_selective:
        return s * b * m.hidden * (18 + Fraction(4 * m.ffn, m.hidden)) / t
    return s * b * m.hidden * (10 + Fraction(24, t))


def megatron_activations(m: Shape, s: int, b: int, sp_selective: bool) -> Fraction:
    """theoretical_memory_usage.py, the whole model on one rank (t = p = 1)."""
    h, v = m.hidden, m.padded_vocab
    body = megatron_layer(m, s, b, sp_selective) * m.layers + 8 * s * b + s * b * h
    if sp_selective:
        return body + 4 * s * b * h * (1 + Fraction(v, h))
    return (body + 2 * (s * b * v + s * b * h)) * Fraction(105, 100)


def megatron_parameters(m: Shape) -> int:
    """compute_weight_and_optimizer_memory's parameter count: per layer 2h·(F·(3/2 if SwiGLU) + norm) plus
    2h²·(1 + g/a) for attention (no linear biases, no position embedding), a final norm, the padded embedding
    (twice if the head is untied)."""
    h, norm = m.hidden, 1 if m.gated else 2
    layer = 2 * h * (Fraction(3, 2) * m.ffn if m.gated else m.ffn) + 2 * h * norm + 2 * h * h * (
        1 + Fraction(m.kv_heads, m.heads))
    embedding = h * m.padded_vocab * (2 if m.gated else 1)
    return int(layer * m.layers + norm * h + embedding)


def megatron_weights_and_optimizer(m: Shape) -> int:
    """18 bytes per parameter: bf16 weight, fp32 main gradient, fp32 master weight and Adam's two moments."""
    return 18 * megatron_parameters(m)


def parameters(m: Shape) -> tuple[int, int]:
    """(elements, tensors) of the transformers model: Llama's q, k, v, o, gate, up, down and two norm weights a
    layer, the embedding, final norm and head; GPT-2's two layer norms, c_attn, attention c_proj, c_fc, MLP c_proj
    (weight and bias each) a layer, the token and position embeddings (the head tied), the final layer norm."""
    h, kv = m.hidden, m.hidden * m.kv_heads // m.heads
    if m.gated:
        layer = 2 * h * h + 2 * h * kv + 3 * h * m.ffn + 2 * h
        return layer * m.layers + 2 * m.vocab * h + h, 9 * m.layers + 3
    layer = 12 * h * h + 13 * h
    return layer * m.layers + (m.vocab + m.positions) * h + 2 * h, 12 * m.layers + 4


def ledger_states(m: Shape) -> int:
    """Weights, gradients and optimizer as the ledger counts them with ``master_weights``: bf16 weights and
    gradients (2 + 2 bytes), fp32 master weights and AdamW's two moments (12), a float32 step counter a tensor."""
    n, tensors = parameters(m)
    return 16 * n + 4 * tensors


def eager_layer(m: Shape, s: int, b: int, recompute: str) -> Fraction:
    """torch's eager layer as transformers writes it: the closed form, not the terms (its own line)."""
    h, a, g, i = m.hidden, m.heads, m.kv_heads, m.ffn
    if m.gated:
        if recompute == "selective":
            return 20 * s * b * h + Fraction(4 * s * b * h * g, a) + 8 * s * b * i + 8 * s * b
        return 24 * s * b * h + 8 * s * b * i + 8 * s * b + 6 * a * s * s * b
    return 34 * s * b * h + 16 * s * b + (5 * a * s * s * b if recompute == "none" else 0)


def eager_layer_tp(m: Shape, s: int, b: int, t: int, sp: bool) -> Fraction:
    """One of t tensor-parallel ranks' share of torch's eager layer under selective recompute, split as Megatron
    splits it: the products' operands inside attention and the MLP 1/t (K and V 1/min(t, g)); the norms, their
    statistics and the residual branches' dropout masks whole on every rank, or 1/t with sequence parallelism."""
    if sp:
        return eager_layer(m, s, b, "selective") / t
    h, a, g = m.hidden, m.heads, m.kv_heads
    if m.gated:
        split = Fraction(4 * s * b * h + 8 * s * b * m.ffn, t) + Fraction(4 * s * b * h * g, a * min(t, g))
        return 16 * s * b * h + 8 * s * b + split
    return 10 * s * b * h + 16 * s * b + Fraction(24 * s * b * h, t)


# -- the relations, in closed form ---------------------------------------------------------------------------------

@pytest.mark.parametrize("m", MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("s", SEQUENCES)
def test_the_terms_sum_to_each_published_total(m, s):
    """Each column of the term table is its formula: the paper's 34·s·b·h + 5·a·s²·b (34·s·b·h without the core's
    rows, Table 2's selective row), Megatron's SP path 18 + 4·F/h, and torch's layers' closed forms."""
    paper = 34 * s * B * m.hidden + 5 * m.heads * s * s * B
    assert column(PAPER, m, s, B) == korthikanti(m, s, B, "none") == paper
    assert column(PAPER, m, s, B, core=False) == korthikanti(m, s, B, "selective") == 34 * s * B * m.hidden
    assert column(MEGATRON_SP, m, s, B) == megatron_layer(m, s, B, sp_selective=True)
    assert megatron_layer(m, s, B, sp_selective=False) == korthikanti(m, s, B, "selective")
    eager = LLAMA_NONE if m.gated else GPT2_EAGER
    assert column(eager, m, s, B) == eager_layer(m, s, B, "none")
    selective = column(LLAMA_SELECTIVE, m, s, B) if m.gated else column(GPT2_EAGER, m, s, B, core=False)
    assert selective == eager_layer(m, s, B, "selective")


def test_llama_differs_from_the_paper_by_the_named_terms():
    """Llama-3-8B's eager layer under selective recompute against the paper's 34·s·b·h: +8 (the norms' float32
    input and bf16 copy), −3 (K and V at 8 of 32 heads), −2 (no dropout), +12 (SwiGLU's 8·s·b·I = 28·s·b·h where
    GELU keeps 16) = 49·s·b·h, and the rstd per token (8·s·b); without recompute K and V are kept repeated (+0)
    and the quadratic term is the float32 softmax and its bf16 cast, 6·a·s²·b for the paper's 5."""
    m, s, b = LLAMA_3_8B, 2048, B
    sbh = s * b * m.hidden
    assert eager_layer(m, s, b, "selective") == (34 + 8 - 3 - 2 + 12) * sbh + 8 * s * b == 49 * sbh + 8 * s * b
    assert eager_layer(m, s, b, "none") == (34 + 8 - 2 + 12) * sbh + 8 * s * b + 6 * m.heads * s * s * b
    assert column(LLAMA_SELECTIVE, m, s, b) - column(PAPER, m, s, b, core=False) == 15 * sbh + 8 * s * b


def test_gpt3_layer_is_the_papers_block_and_its_statistics():
    """transformers' GPT-2 layer with exact GELU and dropout is the paper's block: it keeps exactly
    34·s·b·h + 5·a·s²·b and the two layer norms' float32 mean and rstd (16·s·b), which the paper leaves out."""
    m = GPT3_175B
    for s in SEQUENCES:
        assert eager_layer(m, s, B, "none") - korthikanti(m, s, B, "none") == 16 * s * B
        assert eager_layer(m, s, B, "selective") - korthikanti(m, s, B, "selective") == 16 * s * B


def test_megatron_parameters_against_the_models():
    """Megatron's count is Llama-3-8B's exactly (8,030,261,248); for GPT-3 it leaves out the linear layers' biases
    (9·h a layer) and the 2048 learned positions, and counts the vocabulary padded to 50304."""
    assert megatron_parameters(LLAMA_3_8B) == parameters(LLAMA_3_8B)[0] == 8_030_261_248
    m = GPT3_175B
    left_out = 9 * m.hidden * m.layers + m.positions * m.hidden - (m.padded_vocab - m.vocab) * m.hidden
    assert parameters(m)[0] - megatron_parameters(m) == left_out


# -- the docs' tables are these figures ------------------------------------------------------------------------------

def rows_of_layer_table(m: Shape) -> dict[str, list[Fraction]]:
    """The per-layer table of docs/memory.md for ``m``: label → bytes at each of :data:`SEQUENCES`. The ledger's rows
    are the eager closed forms, which the slow tests below check the ledger gives."""
    def at(f):
        return [f(s) for s in SEQUENCES]

    return {
        "Korthikanti et al., no recompute": at(lambda s: korthikanti(m, s, B, "none")),
        "Korthikanti et al., selective": at(lambda s: korthikanti(m, s, B, "selective")),
        "Megatron-LM, without SP": at(lambda s: megatron_layer(m, s, B, sp_selective=False)),
        "Megatron-LM, SP and selective": at(lambda s: megatron_layer(m, s, B, sp_selective=True)),
        "torch's eager layer, selective": at(lambda s: eager_layer(m, s, B, "selective")),
        "ledger, selective": at(lambda s: eager_layer(m, s, B, "selective")),
        "torch's eager layer, no recompute": at(lambda s: eager_layer(m, s, B, "none")),
        "ledger, no recompute": at(lambda s: eager_layer(m, s, B, "none")),
    }


def rows_of_tp_table(m: Shape, t: int = 8) -> dict[str, list[Fraction]]:
    """The tensor-parallel rows (t = 8): one rank's layer, by each published formula."""
    return {
        "Korthikanti et al., TP, no recompute": [korthikanti(m, s, B, "none", t) for s in SEQUENCES],
        "Korthikanti et al., TP + SP, no recompute": [korthikanti(m, s, B, "none", t, True) for s in SEQUENCES],
        "Korthikanti et al., TP, selective": [korthikanti(m, s, B, "selective", t) for s in SEQUENCES],
        "Korthikanti et al., TP + SP, selective": [korthikanti(m, s, B, "selective", t, True) for s in SEQUENCES],
        "Megatron-LM, without SP": [megatron_layer(m, s, B, False, t) for s in SEQUENCES],
        "Megatron-LM, SP and selective": [megatron_layer(m, s, B, True, t) for s in SEQUENCES],
        "ledger, tp=8, selective": [eager_layer_tp(m, s, B, t, False) for s in SEQUENCES],
        "ledger, tp=8,sp=megatron, selective": [eager_layer_tp(m, s, B, t, True) for s in SEQUENCES],
    }


def rows_of_step_table() -> dict[str, list[Fraction]]:
    """The whole step on one rank (s = 2048 for the activations): label → [Llama-3-8B, GPT-3 175B]."""
    return {
        "parameters, Megatron-LM's formula": [megatron_parameters(m) for m in MODELS],
        "parameters, the model": [parameters(m)[0] for m in MODELS],
        "Megatron-LM weight and optimizer": [megatron_weights_and_optimizer(m) for m in MODELS],
        "ledger weights + gradients + optimizer": [ledger_states(m) for m in MODELS],
        "Megatron-LM activations, without SP": [megatron_activations(m, 2048, B, False) for m in MODELS],
        "Megatron-LM activations, SP and selective": [megatron_activations(m, 2048, B, True) for m in MODELS],
    }


def section() -> str:
    page = (ROOT / "docs" / "memory.md").read_text(encoding="utf-8")
    start = page.index(SECTION)
    end = page.find("\n## ", start + len(SECTION))
    return page[start:end if end > 0 else None]


def table_after(heading: str) -> dict[str, list[str]]:
    """The rows of the first table after ``heading`` in the section: first cell (its label, before any ``(``) →
    the other cells."""
    text_ = section()
    lines = text_[text_.index(heading):].splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("|"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[re.sub(r"\s*\(.*$", "", cells[0]).replace("`", "").strip()] = cells[1:]
    return rows


def number(cell: str) -> int:
    return int(cell.replace(",", ""))


def per_sbh(x: Fraction, m: Shape, s: int) -> str:
    return f"{float(x) / (s * B * m.hidden):.3f}"


@pytest.mark.parametrize("heading, rows_of", [
    pytest.param("{}, per layer", rows_of_layer_table, id="per-layer"),
    pytest.param("{}, one of 8 tensor-parallel ranks", rows_of_tp_table, id="tensor-parallel"),
])
@pytest.mark.parametrize("m", MODELS, ids=lambda m: m.name)
def test_docs_layer_tables(m, heading, rows_of):
    """Each row of the per-layer table and of one tensor-parallel rank's (t = 8): the formula's text, then bytes and
    bytes ÷ s·b·h at s = 2048 and 4096 (bytes rounded down where Megatron's ratio leaves a fraction)."""
    docs = table_after("### " + heading.format(m.name))
    expected = rows_of(m)
    assert list(docs) == list(expected)
    for label, values in expected.items():
        cells = docs[label][1:]
        assert [number(c) for c in cells[0::2]] == [int(v) for v in values], label
        assert cells[1::2] == [per_sbh(v, m, s) for v, s in zip(values, SEQUENCES)], label


def test_docs_term_table():
    """The term table: each row's cells are the terms of :data:`TERMS`, written as the test writes them."""
    docs = table_after("### Term by term")
    assert list(docs) == [row[0] for row in TERMS]
    for row in TERMS:
        label = row[0]
        assert docs[label][0] == ("yes" if row[1] else ""), label
        assert docs[label][1:] == [text(t) for t in row[2:]], label


def test_docs_step_table():
    docs = table_after("### The whole step")
    expected = rows_of_step_table()
    assert list(docs) == list(expected)
    for label, values in expected.items():
        assert [number(c) for c in docs[label]] == [round(v) for v in values], label


# -- the ledger on the full-size layers -----------------------------------------------------------------------------

def config(m: Shape, layers: int, s: int, vocab: int | None = None):
    """The transformers configuration of ``m`` with ``layers`` layers, bf16, eager attention (GPT-3 as GPT-2's
    code with exact GELU and GPT-2's dropout of 0.1, positions for s tokens), ``vocab`` tokens (default its own)."""
    transformers = pytest.importorskip("transformers")
    common = {"torch_dtype": "bfloat16", "attn_implementation": "eager"}
    if m.gated:
        return transformers.LlamaConfig(hidden_size=m.hidden, intermediate_size=m.ffn, num_hidden_layers=layers,
                                        num_attention_heads=m.heads, num_key_value_heads=m.kv_heads,
                                        vocab_size=vocab or m.vocab, architectures=["LlamaForCausalLM"], **common)
    return transformers.GPT2Config(n_embd=m.hidden, n_layer=layers, n_head=m.heads, n_positions=max(s, m.positions),
                                   vocab_size=vocab or m.vocab, activation_function="gelu",
                                   architectures=["GPT2LMHeadModel"], **common)


def count_ledger(c, shape: tuple[int, int], recompute: str, plans: tuple[str, ...] = ()):
    """The one-rank ledger of configuration ``c`` on ``shape`` input ids: AdamW with fp32 master weights, on CUDA
    (the default device: dropout keeps a bool mask); with ``plans``, also the first rank of each plan's ledger."""
    pytest.importorskip("torch")
    import flopcount
    from flopcount.memory.ledger import MemorySettings
    from flopcount.parallel.plan import parse_parallel

    report = flopcount.from_hf(c, {"input_ids": shape}, cache_dir=False, mode="train", optimizer="adamw",
                               memory=MemorySettings(recompute=recompute, master_weights=True))
    assert not report.memory.lower_bound
    (rank,) = report.memory.ranks
    if not plans:
        return rank
    return rank, [flopcount.memory_per_rank(report, parse_parallel(p)).ranks[0] for p in plans]


def ledger(m: Shape, layers: int, s: int, recompute: str):
    return count_ledger(config(m, layers, s), (B, s), recompute)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_the_dynamo_exporters_gelu_below_opset_20_keeps_x(approximate):
    """Below opset 20 (the export's default is 18) the dynamo exporter writes torch's GELU as its decomposition,
    x·(½·(1 + erf(x/√2))) or with tanh and a Pow: read as the kernel it keeps its input alone, as torch does.
    Linear(5→11) → GELU → Linear(11→5) on [3, 7, 5] float32: the first Linear keeps x (3·7·5), GELU its input
    (3·7·11), the second Linear GELU's output (3·7·11), 4 bytes each."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    import flopcount
    from flopcount.memory.ledger import MemorySettings
    from helpers import saved_storages

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 11), torch.nn.GELU(approximate=approximate),
                                 torch.nn.Linear(11, 5)).train()
    x = torch.randn(3, 7, 5)
    proto = torch.onnx.export(module, (x,), dynamo=True, opset_version=18, input_names=["x"]).model_proto
    assert {"Erf" if approximate == "none" else "Tanh", "Mul"} <= {n.op_type for n in proto.graph.node}
    report = flopcount.count(proto, mode="train", memory=MemorySettings(device="cpu"))
    assert report.memory.ranks[0].activations_bytes == saved_storages(module, (x,)) == 4 * 3 * 7 * (5 + 11 + 11)


#: a small GPT-2 of distinct odd sizes: the same closed form as the 175B layer, counted in seconds
TINY_GPT = Shape("tiny GPT-2", 2, 40, 5, 5, 160, 64, 64, 16, False)


@pytest.mark.parametrize("activation", ["gelu", "gelu_pytorch_tanh"])
def test_tiny_gpt2_layer_is_the_papers_block(activation):
    """torch's GELU kernel, exact or tanh, keeps its input alone, as the paper counts it: the dynamo exporter below
    opset 20 writes it x·(½·(1 + erf(x/√2))) (the tanh form with Pow), read as the kernel. b = 3, s = 7, no
    recompute: 34·s·b·h + 5·a·s²·b + 16·s·b per layer."""
    m, s, b = TINY_GPT, 7, 3
    kept = []
    for layers in (1, 2):
        c = config(m, layers, s)
        c.activation_function = activation
        kept.append(count_ledger(c, (b, s), "none").activations_bytes)
    assert kept[1] - kept[0] == 34 * s * b * m.hidden + 5 * m.heads * s * s * b + 16 * s * b


@pytest.mark.slow
@pytest.mark.parametrize("m", MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("s", SEQUENCES)
@pytest.mark.parametrize("recompute", ["selective", "none"])
def test_ledger_per_layer_is_the_eager_layer(m, s, recompute):
    """The full-size layer (bf16, eager attention, b = 1): the ledger's 2-layer count less its 1-layer count is the
    eager layer's closed form exactly, the figure the docs' ledger rows print; under selective recompute, so is one
    rank's under tp=8 and tp=8,sp=megatron (the vocabulary padded to Megatron's multiple of 128, which tp divides)."""
    plans = ("tp=8", "tp=8,sp=megatron") if recompute == "selective" else ()
    counts = [count_ledger(config(m, layers, s, m.padded_vocab), (B, s), recompute, plans) for layers in (1, 2)]
    if plans:
        (one, one_tp), (two, two_tp) = counts
        for plan, a, b in zip(plans, one_tp, two_tp):
            assert b.activations_bytes - a.activations_bytes == eager_layer_tp(m, s, B, 8, "sp" in plan), plan
    else:
        one, two = counts
    assert two.activations_bytes - one.activations_bytes == eager_layer(m, s, B, recompute)


@pytest.mark.slow
@pytest.mark.parametrize("m", MODELS, ids=lambda m: m.name)
def test_ledger_states_of_the_whole_model(m):
    """All L layers (counted from the 1- and 2-layer exports): weights and gradients 2 bytes a parameter, the
    optimizer 12 and a step counter a tensor, the figure of the docs' step table."""
    rank = ledger(m, m.layers, 2048, "selective")
    n, tensors = parameters(m)
    assert (rank.params_bytes, rank.grads_bytes, rank.optimizer_bytes) == (2 * n, 2 * n, 12 * n + 4 * tensors)
