"""Reconciliation of flopcount's ``dense`` convention with ``torch.utils.flop_counter.FlopCounterMode``.

Each reference model of :mod:`flopcount.models.zoo` is exported weightless (``export_weightless``, the dynamo
exporter and opset 18 unless a case says otherwise), counted with ``flopcount.count(path, convention="dense")``
(convolution, matrix products, attention and recurrent gate products at 2 FLOPs per MAC, nothing else), and
compared with FlopCounterMode on the same PyTorch module, forward only, eval mode, under ``torch.no_grad()``.
FlopCounterMode also counts products only (aten.convolution, mm, addmm, bmm, SDPA kernels; 2 per MAC; bias adds
of addmm and convolution left out), so both sides count the same thing and agree *exactly*: every reconciliation
below asserts equality, which is stricter than the 0.5 % the issue asks for.

Where FlopCounterMode cannot be trusted its numbers are not copied: the expected value is derived here, in closed
form, from the published architecture, and flopcount is checked against that; FlopCounterMode is then checked on
the parts it does count. Two such cases on CPU (torch 2.13):

* ``F.scaled_dot_product_attention`` runs ``aten._scaled_dot_product_flash_attention_for_cpu``, which has no flop
  formula: FlopCounterMode reports 0 for the attention core, i.e. it misses the two products Q·Kᵀ and P·V,
  2·B·S·S·d FLOPs each per head, 4·B·S²·h per layer. On the meta device (and under the MATH SDPA backend) SDPA
  decomposes into two bmm's, which it counts.
* ``nn.LSTM`` runs ``aten.mkldnn_rnn_layer``, which has no formula: 0 for the whole LSTM. On the meta device (or
  with mkldnn disabled) the composite implementation runs linear/addmm and is counted.

So every reconciliation runs FlopCounterMode on the meta device (no arithmetic, no memory), and the CPU caveats are
asserted as exactly those differences. The grouped-conv *backward* overcount of FlopCounterMode does not concern
a forward pass: its forward convolution formula (weight shape [C_out, C_in/G, k, k]) is right for groups and
depth-wise convolutions, which ResNeXt and MobileNetV2 confirm.

Depth. CI time is kept low by exporting the transformers with 1 and 2 layers (and ResNeXt with 2 blocks per
stage). Every transformer layer has the same shapes, hence the same cost, so (2-layer − 1-layer) is the per-layer
cost and ``count(1 layer) + (L − 1)·per_layer`` is the L-layer count: checked against the closed form at full depth
and against FlopCounterMode on the full-size model built on the meta device. ``benchmarks/reconcile.py`` exports
and counts every full-size model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import flopcount  # noqa: E402
from flopcount.frontends import export  # noqa: E402
from flopcount.models import resnext, zoo  # noqa: E402

# ---------------------------------------------------------------------------------------------------------------
# Closed forms, from the architectures as published (never read back from the model code)
# ---------------------------------------------------------------------------------------------------------------

H, HEADS, FFN = 768, 12, 3072  # BERT-base, GPT-2 small, ViT-B/16 alike
BERT_VOCAB, BERT_SEQ = 30522, 128
GPT2_VOCAB, GPT2_SEQ = 50257, 1024
VIT_TOKENS = (224 // 16) ** 2 + 1  # 196 patches + the class token


def transformer_layer(b: int, s: int, h: int = H, f: int = FFN) -> int:
    """Dense FLOPs of one encoder/decoder layer on B x S tokens.

    Q, K, V, output projections 4·(2·B·S·h·h); MLP 2·B·S·h·f + 2·B·S·f·h; attention Q·Kᵀ and P·V per head
    2·B·S·S·d each, times h/d heads: 2·(2·B·S²·h). With f = 4h: 24·B·S·h² + 4·B·S²·h. Causal attention still
    computes (and both tools count) the full S x S score matrix.
    """
    return 8 * b * s * h * h + 4 * b * s * h * f + 4 * b * s * s * h


def attention_products(b: int, s: int, h: int = H) -> int:
    """Q·Kᵀ and P·V of one layer: 2 products x 2·B·S·S·d FLOPs x (h/d) heads = 4·B·S²·h."""
    return 4 * b * s * s * h


def bert_dense(layers: int, b: int = 1, s: int = BERT_SEQ) -> int:
    """Embeddings are gathers (0); ``layers`` post-LN layers; pooler Linear(h, h) on the first token: 2·B·h²."""
    return layers * transformer_layer(b, s) + 2 * b * H * H


def gpt2_dense(layers: int, b: int = 1, s: int = GPT2_SEQ) -> int:
    """Embeddings are gathers (0); ``layers`` causal layers; the tied LM head 2·B·S·h·V (no bias)."""
    return layers * transformer_layer(b, s) + 2 * b * s * H * GPT2_VOCAB


def vit_dense(layers: int, b: int = 1) -> int:
    """Patch conv 16x16/16, 3 -> h, on 14x14 patches: 2·B·196·h·(3·16·16); layers on 197 tokens; head 2·B·h·1000."""
    return 2 * b * 196 * H * 3 * 16 * 16 + layers * transformer_layer(b, VIT_TOKENS) + 2 * b * H * 1000


def mobilenet_v2_macs(hw: int = 224, classes: int = 1000) -> int:
    """MobileNetV2 1.0 (Sandler et al. 2018, Table 2): stem 3x3/2 conv to 32; bottlenecks (t, c, n, s); 1x1 conv to
    1280; fc. A bottleneck: 1x1 expand c_in -> t·c_in (absent when t = 1) at the input resolution, 3x3 depth-wise
    (one 3x3 filter per channel, 9 MACs per output element) with the stride, 1x1 project to c."""
    table = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    r = hw // 2
    macs, c_in = r * r * 32 * 3 * 9, 32
    for t, c, n, s in table:
        for i in range(n):
            stride = s if i == 0 else 1
            r_out = r // stride
            hidden = c_in * t
            macs += (r * r * c_in * hidden if t != 1 else 0) + r_out * r_out * hidden * 9 + r_out * r_out * hidden * c
            c_in, r = c, r_out
    return macs + r * r * c_in * 1280 + 1280 * classes


def resnext_macs(layers=(3, 4, 6, 3), groups: int = 32, width_per_group: int = 4, hw: int = 224) -> int:
    """ResNeXt (Xie et al. 2017), v1.5 strides: stem 7x7/2 3 -> 64, max pool /2; stage base widths 64..512, inner
    width d = w·width_per_group/64·groups (2w for 32x4d), output 4w. A block: 1x1 c_in -> d at the input resolution,
    grouped 3x3 d -> d with the stride (d/groups inputs per output), 1x1 d -> 4w, and on the first block of a stage
    a 1x1 projection c_in -> 4w with the stride. fc 2048 -> 1000."""
    r = hw // 4
    macs, c_in = (hw // 2) ** 2 * 64 * 3 * 49, 64
    for stage, (blocks, w) in enumerate(zip(layers, (64, 128, 256, 512))):
        d = w * width_per_group // 64 * groups
        for block in range(blocks):
            r_out = r // 2 if stage > 0 and block == 0 else r
            macs += r * r * c_in * d + r_out * r_out * d * (d // groups) * 9 + r_out * r_out * d * 4 * w
            if block == 0:
                macs += r_out * r_out * c_in * 4 * w
            c_in, r = 4 * w, r_out
    return macs + 2048 * 1000


def lstm_dense(seq: int = 35, batch: int = 4, inp: int = 64, hidden: int = 128, layers: int = 2) -> int:
    """Per layer, step and sequence: the four gates' products x_t·W_ihᵀ and h_{t-1}·W_hhᵀ, 4H·(I_l + H) MACs,
    I_0 = input size, I_l = H above; 2 FLOPs per MAC. Biases, sigmoids, tanh and the cell update are not dense."""
    sizes = [inp] + [hidden] * (layers - 1)
    return sum(2 * seq * batch * 4 * hidden * (i + hidden) for i in sizes)


def test_closed_forms_against_published_figures():
    # BERT-base at 128 tokens: 12·(24·128·768² + 4·128²·768) + 2·768² = 12·1,862,270,976 + 1,179,648
    assert bert_dense(12) == 22_348_431_360
    # GPT-2 small at 1024 tokens: 12·(24·1024·768² + 4·1024²·768) + 2·1024·768·50257 = 212,600,881,152 + 79,047,426,048
    assert gpt2_dense(12) == 291_648_307_200
    # ViT-B/16: 231,211,008 (patches) + 12·(24·197·768² + 4·197²·768) + 1,536,000, i.e. the 17.6 G multiply-adds
    # usually quoted as "17.6 GFLOPs"
    assert vit_dense(12) == 231_211_008 + 12 * 2_907_909_120 + 1_536_000 == 35_127_656_448
    # the papers' multiply-adds: MobileNetV2 300 M, ResNeXt-50 32x4d 4.2 G
    assert mobilenet_v2_macs() == 300_774_272
    assert 4.22e9 < resnext_macs() < 4.25e9
    # LSTM 2 x 128 on 64 features, 35 steps, batch 4: 2·35·4·512·(64 + 128) + 2·35·4·512·(128 + 128)
    assert lstm_dense() == 27_525_120 + 36_700_160 == 64_225_280


# ---------------------------------------------------------------------------------------------------------------
# Export, count, and FlopCounterMode, once per case
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    model: str  # a zoo name
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    opset: int = export.DEFAULT_OPSET
    cpu: bool = True  # also run FlopCounterMode on CPU (real arithmetic; off where it takes seconds)
    exporter: str = "dynamo"


CASES = {
    "bert-1L": Case("bert-base", {"layers": 1}),
    "bert-2L": Case("bert-base", {"layers": 2}),
    # opset 23: F.scaled_dot_product_attention becomes one ONNX Attention node (family "attention")
    "bert-1L-opset23": Case("bert-base", {"layers": 1}, opset=23, cpu=False),
    "gpt2-1L": Case("gpt2-small", {"layers": 1}, cpu=False),
    "gpt2-2L": Case("gpt2-small", {"layers": 2}, cpu=False),
    "gpt2-1L-matmul": Case("gpt2-small", {"layers": 1, "attention": "matmul"}, cpu=False),
    "gpt2-1L-opset23": Case("gpt2-small", {"layers": 1}, opset=23, cpu=False),
    "vit-1L": Case("vit-b16", {"layers": 1}),
    "vit-2L": Case("vit-b16", {"layers": 2}),
    "vit-1L-matmul": Case("vit-b16", {"layers": 1, "attention": "matmul"}),
    # The legacy TorchScript exporter: the same Conv/Gemm nodes in 2.5 s instead of 15 s (the onnxscript optimiser
    # on 52 Conv + BatchNorm pairs); benchmarks/reconcile.py exports it with dynamo and counts the same figure.
    "mobilenet-v2": Case("mobilenet-v2", exporter="torchscript"),
    "resnext-2x4-stages": Case("resnext50-32x4d"),  # built with blocks (2, 2, 2, 2): see _build
    "lstm": Case("lstm"),
}
RESNEXT_TEST_LAYERS = (2, 2, 2, 2)  # both block kinds (first-of-stage with projection, and plain) in every stage


@dataclass(frozen=True)
class Result:
    dense: flopcount.Report
    torch_meta: dict[str, int]  # aten op ("mm", "addmm", "bmm", "convolution") -> FLOPs, on the meta device
    torch_cpu: dict[str, int] | None  # the same on CPU, or None where not run


def torch_flops(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, int]:
    """FlopCounterMode's FLOPs per aten op of one eval-mode forward pass, on the device the module is on."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module.eval()(*inputs)
    return {str(op).removeprefix("aten."): n for op, n in counter.get_flop_counts().get("Global", {}).items()}


def _build(case: Case) -> zoo.Built:
    torch.manual_seed(0)
    if case.model == "resnext50-32x4d":
        names = zoo.MODELS[case.model]
        return zoo.Built(resnext.resnext(RESNEXT_TEST_LAYERS), (torch.zeros(1, 3, 224, 224),),
                         names.input_names, names.output_names)
    return zoo.build(case.model, **case.options)


def _run(case: Case, directory) -> Result:
    built = _build(case)
    path = directory / f"{case.model}.onnx"
    export.export_weightless(built.module, built.inputs, path, input_names=built.input_names,
                             output_names=built.output_names, opset=case.opset, exporter=case.exporter)
    dense = flopcount.count(path, convention="dense")
    cpu = torch_flops(built.module, built.inputs) if case.cpu else None
    meta = torch_flops(built.module.to("meta"), tuple(x.to("meta") for x in built.inputs))
    return Result(dense, meta, cpu)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """case id -> Result, each exported and counted on first use only."""
    cache: dict[str, Result] = {}

    class Lazy:
        def __getitem__(self, key: str) -> Result:
            if key not in cache:
                cache[key] = _run(CASES[key], tmp_path_factory.mktemp(key))
            return cache[key]

    return Lazy()


def dense_by_family(report: flopcount.Report) -> dict[str, int]:
    """Dense FLOPs of a report grouped like FlopCounterMode's aten ops: convolutions apart, products together."""
    groups = {"Conv": "conv", "MatMul": "products", "Gemm": "products", "Attention": "products", "LSTM": "lstm"}
    out: dict[str, int] = {}
    for key, summary in report.by_op_type.items():
        if summary.cost.flops:
            out[groups[key]] = out.get(groups[key], 0) + summary.cost.flops
    return out


def torch_by_family(flops: dict[str, int]) -> dict[str, int]:
    conv = flops.get("convolution", 0)
    products = sum(flops.get(op, 0) for op in ("mm", "addmm", "bmm", "baddbmm"))
    assert conv + products == sum(flops.values()), f"FlopCounterMode counted other ops: {flops}"
    return {k: v for k, v in (("conv", conv), ("products", products)) if v}


# ---------------------------------------------------------------------------------------------------------------
# Whole-model reconciliation: dense == FlopCounterMode (meta device), exactly, for every case
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_dense_equals_flop_counter(results, case):
    r = results[case]
    assert not r.dense.unsupported
    assert r.dense.total.flops == 2 * r.dense.total.macs  # dense: products only, 2 per MAC
    torch_total = sum(r.torch_meta.values())
    assert abs(r.dense.total.flops - torch_total) <= 0.005 * torch_total  # the tolerance ...
    assert r.dense.total.flops == torch_total  # ... and in fact no difference at all
    ours = dense_by_family(r.dense)
    if "lstm" in ours:
        # the composite LSTM runs its gate products as addmm: ONNX LSTM nodes <-> FlopCounterMode products
        ours["products"] = ours.get("products", 0) + ours.pop("lstm")
    assert ours == torch_by_family(r.torch_meta)


# ---------------------------------------------------------------------------------------------------------------
# Closed forms at reduced depth, and the full depth from the per-layer cost
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, name, closed_form, tokens",
    [
        pytest.param("bert", "bert-base", bert_dense, BERT_SEQ, id="bert-base"),
        pytest.param("gpt2", "gpt2-small", gpt2_dense, GPT2_SEQ, id="gpt2-small"),
        pytest.param("vit", "vit-b16", vit_dense, VIT_TOKENS, id="vit-b16"),
    ],
)
def test_transformer_closed_form_and_full_depth(results, model, name, closed_form, tokens):
    one, two = results[f"{model}-1L"].dense.total.flops, results[f"{model}-2L"].dense.total.flops
    assert (one, two) == (closed_form(1), closed_form(2))
    per_layer = two - one
    assert per_layer == 24 * tokens * H * H + 4 * tokens * tokens * H  # f = 4h
    # every layer has the same shapes: the 12-layer model is the 1-layer count plus 11 more layers
    assert one + 11 * per_layer == closed_form(12)
    # ... which FlopCounterMode confirms on the full-size model, built on the meta device (nothing computed)
    with torch.device("meta"):
        built = zoo.build(name)
    assert sum(torch_flops(built.module, built.inputs).values()) == closed_form(12)


def test_bert_layer_breakdown(results):
    # 1 layer, B = 1, S = 128, h = 768: projections 4·2·128·768² = 603,979,776 and MLP 2·2·128·768·3072 =
    # 1,207,959,552 (MatMul, the Linear layers on 3-D activations), attention 4·128²·768 = 50,331,648 (MatMul: at
    # opset 18 SDPA is decomposed), pooler 2·768² = 1,179,648 (Gemm, a Linear on the 2-D first-token slice)
    by = results["bert-1L"].dense.by_op_type
    assert by["MatMul"].cost.flops == 603_979_776 + 1_207_959_552 + 50_331_648
    assert by["Gemm"].cost.flops == 1_179_648
    assert by["MatMul"].nodes == 4 + 2 + 2


@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_opset23_attention_node(results, model):
    # At opset 23 the exporter writes one ONNX Attention node per layer (GPT-2: is_causal=1); its dense cost is the
    # two products, 4·B·S²·h, the full S x S matrix also when causal. The totals equal the opset-18 ones.
    s = {"bert": BERT_SEQ, "gpt2": GPT2_SEQ}[model]
    r23, r18 = results[f"{model}-1L-opset23"].dense, results[f"{model}-1L"].dense
    assert r23.by_op_type["Attention"].nodes == 1
    assert r23.by_op_type["Attention"].cost.flops == attention_products(1, s)  # bert 50,331,648; gpt2 3,221,225,472
    assert r23.total.flops == r18.total.flops


@pytest.mark.parametrize("model, other", [("gpt2", "gpt2-1L"), ("vit", "vit-1L")])
def test_matmul_attention_counts_like_sdpa(results, model, other):
    # softmax(Q·Kᵀ/√d + mask)·V written out: the same two products as SDPA, the mask (Trilu/Where) costs no FLOPs
    assert results[f"{model}-1L-matmul"].dense.total.flops == results[other].dense.total.flops


# ---------------------------------------------------------------------------------------------------------------
# FlopCounterMode on CPU: the two caveats, asserted as exactly the parts it misses
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, missed",
    [
        # SDPA on CPU runs _scaled_dot_product_flash_attention_for_cpu, which FlopCounterMode does not count: it
        # misses Q·Kᵀ and P·V, 4·B·S²·h per layer: BERT 2 x 4·128²·768 = 100,663,296, ViT 2 x 4·197²·768 =
        # 238,442,496
        pytest.param("bert-2L", 2 * attention_products(1, BERT_SEQ), id="bert-sdpa"),
        pytest.param("vit-2L", 2 * attention_products(1, VIT_TOKENS), id="vit-sdpa"),
        # explicit matmul + softmax runs two bmm's per layer, which it counts: nothing missed
        pytest.param("vit-1L-matmul", 0, id="vit-matmul"),
        # nn.LSTM on CPU runs mkldnn_rnn_layer, which it does not count: all gate products, lstm_dense() = 64,225,280
        pytest.param("lstm", lstm_dense(), id="lstm"),
        # convolutions (grouped and depth-wise included) and linear layers count on CPU as on meta
        pytest.param("mobilenet-v2", 0, id="mobilenet-v2"),
        pytest.param("resnext-2x4-stages", 0, id="resnext"),
    ],
)
def test_flop_counter_on_cpu_misses_exactly(results, case, missed):
    r = results[case]
    assert sum(r.torch_cpu.values()) == r.dense.total.flops - missed


def test_lstm_counted_when_mkldnn_is_off():
    # with mkldnn disabled the CPU LSTM takes the composite path (addmm per step), which FlopCounterMode counts
    built = zoo.build("lstm")
    with torch.backends.mkldnn.flags(enabled=False):
        assert sum(torch_flops(built.module, built.inputs).values()) == lstm_dense()


# ---------------------------------------------------------------------------------------------------------------
# CNNs and the LSTM against their closed forms
# ---------------------------------------------------------------------------------------------------------------


def test_mobilenet_v2(results):
    r = results["mobilenet-v2"].dense
    # 52 convolutions: stem, 17 blocks (16 with an expansion conv: 3 convs, the first: 2), the 1x1 to 1280
    assert r.by_op_type["Conv"].nodes == 1 + 16 * 3 + 2 + 1
    assert r.by_op_type["Gemm"].cost.flops == 2 * 1280 * 1000
    assert r.total.flops == 2 * mobilenet_v2_macs() == 601_548_544


def test_resnext(results):
    r = results["resnext-2x4-stages"].dense
    assert r.by_op_type["Conv"].nodes == 1 + 4 * (2 * 3 + 1)
    assert r.total.flops == 2 * resnext_macs(RESNEXT_TEST_LAYERS)
    # full depth: the closed form against FlopCounterMode on the full-size model (meta device)
    with torch.device("meta"):
        built = zoo.build("resnext50-32x4d")
    assert sum(torch_flops(built.module, built.inputs).values()) == 2 * resnext_macs()


def test_lstm(results):
    r = results["lstm"].dense
    assert r.by_op_type["LSTM"].nodes == 2  # one ONNX LSTM per layer
    assert r.total.flops == lstm_dense()
