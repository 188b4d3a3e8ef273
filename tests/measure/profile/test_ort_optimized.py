"""Graphs that onnxruntime has optimized count as the graphs they came from.

Small BERT and GPT-2 models (2 layers, hidden h = 64, 4 heads of E = 16, FFN F = 256, vocabulary 100,
batch 2 of S = 16 tokens) are exported from PyTorch, fused by onnxruntime's transformer optimizer
(``optimize_model``) or its session-level graph optimizer, and both graphs are counted strictly
(every operator has a formula). Under the ``dense`` convention (products only) the totals agree
exactly and equal the closed form; under the default convention they differ by terms derived below:
a fused operator is counted as its ONNX counterpart, while the unfused graph spells it out in
elementary operators:

* LayerNormalization decomposed by the opset-14 exporter (ReduceMean, Sub, Pow, ReduceMean, Add ε,
  Sqrt, Div, Mul γ, Add β: 7·|X| + 2·rows) becomes one FLOP per element (Skip/Embed)LayerNormalization;
* exact Gelu x·½·(1 + erf(x/√2)) (5 per element) and the tanh form (8 per element with its Pow)
  become Gelu/BiasGelu/FastGelu at 1 per element (the bias add is kept, inside or outside);
* the score scaling Div (R·T = B·H·S·S) becomes Attention's √scale on Q and on K (R·E + B·H·T·E,
  as the ONNX Attention counts it), and a causal Where (free: a selection) becomes a mask add (R·T);
* the additive attention mask (1 − m)·(−10000) (2·B·S) becomes EmbedLayerNormalization's mask_index
  (B·S integer ops).
"""

from __future__ import annotations

import collections
import math

import onnx
import pytest

import flopcount

pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
nn = torch.nn

LAYERS, HID, HEADS, FFN, VOCAB, BATCH, SEQ = 2, 64, 4, 256, 100, 2, 16
E = HID // HEADS
MS = "com.microsoft"
TOKENS = BATCH * SEQ  # 32
ROWS = BATCH * HEADS * SEQ  # score rows R = 128
SCORES = ROWS * SEQ  # R·T = 2048 (T = S: no cache)


def dense_macs(lm_head: bool) -> int:
    """Products of the model, closed form: per layer the Q, K, V and output projections (4·tokens·h²),
    Q·Kᵀ and probs·V (2·B·S·S·h) and the two FFN layers (2·tokens·h·F); then BERT's pooler (B·h²) or
    GPT-2's LM head (tokens·h·V)."""
    per_layer = 4 * TOKENS * HID * HID + 2 * BATCH * SEQ * SEQ * HID + 2 * TOKENS * HID * FFN
    return LAYERS * per_layer + (TOKENS * HID * VOCAB if lm_head else BATCH * HID * HID)


def test_bert_dense_closed_form():
    # 2·(2·(4·32·64·64 + 2·2·16·16·64 + 2·32·64·256) + 2·64·64) = 2·3284992
    assert 2 * dense_macs(lm_head=False) == 6_569_984


# Default-convention differences, fused minus unfused (see the module docstring)
LN_DELTA = TOKENS * HID - (7 * TOKENS * HID + 2 * TOKENS)  # per LayerNorm
SCALE_DELTA = (ROWS * E + BATCH * HEADS * SEQ * E) - SCORES  # per fused Attention: √scale on Q, K vs the Div


# --------------------------------------------------------------------------------------------
# models in the style the optimizer's patterns were written for (Hugging Face BERT and GPT-2)


class BertLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value, self.out = (nn.Linear(HID, HID) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(HID, eps=1e-12), nn.LayerNorm(HID, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(HID, FFN), nn.Linear(FFN, HID)

    @staticmethod
    def heads(x):
        b, n, _ = x.size()
        return x.view(b, n, HEADS, E).permute(0, 2, 1, 3)

    def forward(self, x, mask):
        q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(E) + mask
        context = torch.matmul(scores.softmax(dim=-1), v).permute(0, 2, 1, 3).contiguous()
        x = self.ln1(self.out(context.view(context.size(0), context.size(1), HID)) + x)
        h = self.fc1(x)
        h = h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))
        return self.ln2(self.fc2(h) + x)


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.word, self.position, self.segment = nn.Embedding(VOCAB, HID), nn.Embedding(64, HID), nn.Embedding(2, HID)
        self.ln = nn.LayerNorm(HID, eps=1e-12)
        self.register_buffer("position_ids", torch.arange(64).unsqueeze(0))
        self.layers = nn.ModuleList(BertLayer() for _ in range(LAYERS))
        self.pooler = nn.Linear(HID, HID)

    def forward(self, input_ids, attention_mask, token_type_ids):
        positions = self.position_ids[:, : input_ids.size(1)]
        x = self.ln(self.word(input_ids) + self.segment(token_type_ids) + self.position(positions))
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x, torch.tanh(self.pooler(x[:, 0]))


class Conv1D(nn.Module):
    """GPT-2's linear layer: addmm of a [in, out] weight."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.n_out = n_out
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        y = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return y.view(x.size()[:-1] + (self.n_out,))


class GPT2Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(HID, eps=1e-5), nn.LayerNorm(HID, eps=1e-5)
        self.c_attn, self.c_proj = Conv1D(HID, 3 * HID), Conv1D(HID, HID)
        self.c_fc, self.c_out = Conv1D(HID, FFN), Conv1D(FFN, HID)
        self.register_buffer("bias", torch.tril(torch.ones(64, 64, dtype=torch.uint8)).view(1, 1, 64, 64))

    @staticmethod
    def heads(x, key=False):
        x = x.view(*x.size()[:-1], HEADS, x.size(-1) // HEADS)
        return x.permute(0, 2, 3, 1) if key else x.permute(0, 2, 1, 3)

    def attention(self, x):
        q, k, v = self.c_attn(x).split(HID, dim=2)
        w = torch.matmul(self.heads(q), self.heads(k, key=True)) / math.sqrt(E)
        nd, ns = w.size(-2), w.size(-1)
        w = torch.where(self.bias[:, :, ns - nd : ns, :ns].bool(), w, torch.tensor(-1e4))
        a = torch.matmul(w.softmax(dim=-1), self.heads(v)).permute(0, 2, 1, 3).contiguous()
        return self.c_proj(a.view(*a.size()[:-2], HID))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        h = self.c_fc(self.ln_2(x))
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * torch.pow(h, 3))))
        return x + self.c_out(h)


class GPT2(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, HID), nn.Embedding(64, HID)
        self.blocks = nn.ModuleList(GPT2Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(HID, eps=1e-5)

    def forward(self, input_ids):
        positions = torch.arange(0, input_ids.size(-1), dtype=torch.long).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return torch.matmul(self.ln_f(x), self.wte.weight.t())  # LM head tied to the embedding


def _inputs(kind):
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    if kind == "bert":
        ones = torch.ones(BATCH, SEQ, dtype=torch.long)
        return (ids, ones, torch.zeros_like(ones)), ["input_ids", "attention_mask", "token_type_ids"]
    return (ids,), ["input_ids"]


def export_legacy(kind, path, dynamic):
    """TorchScript export at opset 14. The optimizer's patterns need the dynamic-axes form (run-time
    shape arithmetic that a static export folds away)."""
    torch.manual_seed(0)
    m = (Bert() if kind == "bert" else GPT2()).eval()
    args, names = _inputs(kind)
    axes = {n: {0: "batch", 1: "sequence"} for n in names} if dynamic else None
    torch.onnx.export(m, args, str(path), dynamo=False, input_names=names, opset_version=14, dynamic_axes=axes)
    return names


def static_shapes(model: onnx.ModelProto, names) -> onnx.ModelProto:
    """Fix the dynamic inputs to (BATCH, SEQ) and infer every shape with onnxruntime's symbolic shape
    inference, which knows the contrib operators (ONNX's own inference does not)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    for vi in model.graph.input:
        if vi.name in names:
            for d, v in zip(vi.type.tensor_type.shape.dim, (BATCH, SEQ)):
                d.Clear()
                d.dim_value = v
    del model.graph.value_info[:]
    for o in model.graph.output:
        o.type.tensor_type.ClearField("shape")
    return SymbolicShapeInference.infer_shapes(model)


def optimize(path, kind):
    from onnxruntime.transformers.optimizer import optimize_model

    return optimize_model(str(path), model_type=kind, num_heads=HEADS, hidden_size=HID).model


def contrib_ops(m: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in m.graph.node if n.domain == "com.microsoft")


def totals(m, **kw):
    """(default, dense) forward costs, strict: an operator without a formula fails the test."""
    return tuple(flopcount.count(m, convention=c, strict=True, **kw).forward for c in ("default", "dense"))


# --------------------------------------------------------------------------------------------
# the transformer optimizer on TorchScript exports: the full set of BERT and GPT-2 fusions

LEGACY = [
    pytest.param(
        "bert",
        {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2},
        # 5 LayerNorms, Gelu 6 → 2 per FFN element (bias add + erf Gelu), √scale, mask preprocessing
        5 * LN_DELTA + LAYERS * (2 - 6) * TOKENS * FFN + LAYERS * SCALE_DELTA - 2 * TOKENS,
        id="bert",
    ),
    pytest.param(
        "gpt2",
        {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "FastGelu": 2},
        # 5 LayerNorms, tanh Gelu 8 + Gemm bias 1 → FastGelu with bias 2, √scale, causal mask add
        5 * LN_DELTA + LAYERS * (2 - 9) * TOKENS * FFN + LAYERS * (SCALE_DELTA + SCORES),
        id="gpt2",
    ),
]


@pytest.mark.parametrize("kind, fused, default_delta", LEGACY)
def test_transformer_optimizer_legacy_export(tmp_path, kind, fused, default_delta):
    path = tmp_path / f"{kind}.onnx"
    names = export_legacy(kind, path, dynamic=True)
    optimized = optimize(path, kind)
    produced = contrib_ops(optimized)
    assert {op: produced[op] for op in fused} == fused, f"onnxruntime produced {dict(produced)}"

    shapes = {n: (BATCH, SEQ) for n in names}
    before = totals(str(path), input_shapes=shapes)
    after = totals(static_shapes(optimized, names))

    assert before[1] == after[1]  # dense: the very same products
    assert after[1].flops == 2 * dense_macs(lm_head=kind == "gpt2")
    assert after[0].macs == before[0].macs
    assert after[0].flops - before[0].flops == default_delta
    assert abs(default_delta) / before[0].flops < 0.03


# --------------------------------------------------------------------------------------------
# the transformer optimizer on dynamo exports of flopcount's reference models


DYNAMO = [
    # BERT: attention fused; Gelu 5 → 1 per FFN element; √scale instead of the scores Div
    pytest.param("bert", {"Attention": 2, "SkipLayerNormalization": 4, "Gelu": 2},
                 LAYERS * ((1 - 5) * TOKENS * FFN + SCALE_DELTA), id="bert"),
    # GPT-2: its sdpa-free attention is not fused by the optimizer; tanh Gelu 9 → 2 per FFN element
    pytest.param("gpt2", {"SkipLayerNormalization": 4, "FastGelu": 2}, LAYERS * (2 - 9) * TOKENS * FFN, id="gpt2"),
]


@pytest.mark.parametrize("kind, fused, default_delta", DYNAMO)
def test_transformer_optimizer_dynamo_export(tmp_path, kind, fused, default_delta):
    transformer = pytest.importorskip("flopcount.models.transformer")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    if kind == "bert":
        m = transformer.bert(layers=LAYERS, hidden=HID, heads=HEADS, ffn=FFN, vocab=VOCAB, attention="matmul")
    else:
        m = transformer.gpt2(layers=LAYERS, hidden=HID, heads=HEADS, vocab=VOCAB, context=64, attention="matmul")
    path = tmp_path / f"{kind}.onnx"
    # opset 18: Gelu is spelled out (ONNX has a Gelu operator from opset 20 on); without tqdm's monitor thread,
    # which the exporter's progress bars would leave running in this process (and with it no inference fork)
    from flopcount.frontends.export import no_tqdm_monitor

    with no_tqdm_monitor():
        torch.onnx.export(m.eval(), (torch.randint(0, VOCAB, (BATCH, SEQ)),), str(path), dynamo=True,
                          input_names=["input_ids"], opset_version=18)
    optimized = optimize(path, kind)
    produced = contrib_ops(optimized)
    assert {op: produced[op] for op in fused} == fused, f"onnxruntime produced {dict(produced)}"

    # the optimizer keeps the exporter's value_info, but tensors it creates (MatMul + Add → Gemm with
    # Reshapes around it) have none: infer them
    before, after = totals(str(path)), totals(static_shapes(optimized, ["input_ids"]))
    assert before[1] == after[1]
    assert after[1].flops == 2 * dense_macs(lm_head=kind == "gpt2")
    assert after[0].flops - before[0].flops == default_delta
    assert abs(default_delta) / before[0].flops < 0.03


# --------------------------------------------------------------------------------------------
# the session-level graph optimizer: FusedConv, FusedGemm, FusedMatMul, Gelu


def session_optimize(src, dst):
    """Save the graph onnxruntime runs at ORT_ENABLE_EXTENDED (portable fusions, no NCHWc layout).
    Shapes inferred beforehand survive as value_info."""
    import onnxruntime as ort

    m = onnx.shape_inference.infer_shapes(onnx.load(str(src)))
    onnx.save(m, str(src))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(dst))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3)
        self.fc = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        x = torch.sigmoid(self.c2(torch.relu(self.c1(x))))
        return torch.relu(self.fc(x.flatten(1)))


def test_session_optimizer_cnn(tmp_path):
    src, dst = tmp_path / "cnn.onnx", tmp_path / "cnn_opt.onnx"
    torch.onnx.export(SmallCNN().eval(), (torch.randn(BATCH, 3, 8, 8),), str(src), dynamo=False, opset_version=14)
    optimized = session_optimize(src, dst)
    assert contrib_ops(optimized) == {"FusedConv": 2, "FusedGemm": 1}
    before, after = totals(str(src)), totals(optimized)
    # Conv + bias + activation and Gemm + Relu count the same fused or not, under every convention
    assert before == after
    c1 = BATCH * 8 * 8 * 8 * 3 * 9  # N·C_out·H·W·C_in·K
    c2 = BATCH * 8 * 6 * 6 * 8 * 9
    fc = BATCH * 288 * 10
    assert after[1].flops == 2 * (c1 + c2 + fc)


def test_session_optimizer_bert(tmp_path):
    src, dst = tmp_path / "bert.onnx", tmp_path / "bert_opt.onnx"
    export_legacy("bert", src, dynamic=False)
    optimized = session_optimize(src, dst)
    produced = contrib_ops(optimized)
    assert {"FusedMatMul", "FusedGemm", "Gelu", "SkipLayerNormalization"} <= set(produced), dict(produced)
    before, after = totals(str(src)), totals(optimized)
    assert before[1] == after[1]
    assert after[1].flops == 2 * dense_macs(lm_head=False)
    # LayerNorms fused (5), Gelu 5 → 1 per FFN element (its bias add stays an Add); FusedMatMul's
    # alpha is the scores Div it absorbed, FusedGemm's Tanh the pooler's
    assert after[0].flops - before[0].flops == 5 * LN_DELTA + LAYERS * (1 - 5) * TOKENS * FFN


# --- whole models -----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_ort_optimized_transformer_trains_as_its_unfused_graph(tmp_path, kind):
    """BERT and GPT-2 (2 layers) fused by onnxruntime's transformer optimizer into
    EmbedLayerNormalization, Attention, SkipLayerNormalization and BiasGelu or FastGelu (the models and
    helpers above): the backward products equal the unfused graph's, and
    every product has both gradients (the embeddings are trained, so every activation needs one):
    twice the forward MACs."""
    path = tmp_path / f"{kind}.onnx"
    names = export_legacy(kind, path, dynamic=True)
    fused_model = static_shapes(optimize(path, kind), names)
    assert {n.op_type for n in fused_model.graph.node if n.domain == MS} >= {"EmbedLayerNormalization", "Attention"}
    unfused = flopcount.count(str(path), input_shapes={n: (BATCH, SEQ) for n in names}, mode="train",
                              convention="dense")
    fused_report = flopcount.count(fused_model, mode="train", convention="dense", strict=True)
    assert fused_report.backward == unfused.backward
    assert fused_report.backward.macs == 2 * dense_macs(lm_head=kind == "gpt2")
    assert fused_report.trainable_params == unfused.trainable_params


def test_session_optimized_cnn_trains_as_its_unfused_graph(tmp_path):
    """onnxruntime's session optimizer fuses the small CNN above into
    FusedConv (with Relu, with Sigmoid) and FusedGemm (with Relu): the backward is the unfused
    graph's under every convention, and the dense products are closed forms: dW only for the first
    convolution (fed by the image), dX and dW for the second and for the Gemm."""
    src, dst = tmp_path / "cnn.onnx", tmp_path / "cnn_opt.onnx"
    torch.onnx.export(SmallCNN().eval(), (torch.randn(BATCH, 3, 8, 8),), str(src), dynamo=False, opset_version=14)
    optimized = session_optimize(src, dst)
    assert {n.op_type for n in optimized.graph.node if n.domain == MS} == {"FusedConv", "FusedGemm"}
    for convention in ("default", "table3", "dense"):
        before = flopcount.count(str(src), mode="train", convention=convention, strict=True)
        after = flopcount.count(optimized, mode="train", convention=convention, strict=True)
        assert after.backward == before.backward, convention
    c1 = BATCH * 8 * 8 * 8 * 3 * 9  # N·C_out·H·W·C_in·K
    c2 = BATCH * 8 * 6 * 6 * 8 * 9
    fc = BATCH * 288 * 10
    assert after.backward.flops == 2 * (c1 + 2 * c2 + 2 * fc)
