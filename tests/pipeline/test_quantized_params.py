"""Quantized weights are parameters: a model passed through onnxruntime's quantizer reports the float
model's parameter count, whatever path its int8/uint8 weights take to their product (MatMulInteger,
ConvInteger, QLinearConv, a quantized Gather then DequantizeLinear, a spelled-out Cast → Sub → Mul,
onnxruntime's fused MatMulIntegerToFloat and DynamicQuantizeMatMul). Scales and zero points are
never parameters, per tensor or per channel.

The reference is always the float model's own count: torch's ``parameters()`` (every parameter is
drawn at random first, so that the exporter cannot merge equal biases), or a closed form written here.
"""

from __future__ import annotations

import collections
import contextlib
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

SEQ = 7
VOCAB = 97
HIDDEN, FFN, LAYERS, HEADS = 32, 37, 2, 4
# the products of either encoder over SEQ tokens: Q, K, V and output projections, Q·Kᵀ and probs·V, the FFN
DENSE_MACS = LAYERS * (4 * SEQ * HIDDEN * HIDDEN + 2 * SEQ * SEQ * HIDDEN + 2 * SEQ * HIDDEN * FFN)


def _randomize(module) -> None:
    """Distinct values in every parameter: the TorchScript exporter stores equal tensors once (zero biases,
    unit LayerNorm scales), which would make the ONNX graph hold fewer parameters than the module."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.1)


class _LastHidden(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(input_ids=ids).last_hidden_state


def _transformer(kind: str):
    transformers = pytest.importorskip("transformers")
    if kind == "bert":
        config = transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=29, type_vocab_size=2, attn_implementation="eager")
        return transformers.BertModel(config, add_pooling_layer=False)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                   attn_implementation="eager")
    return transformers.T5EncoderModel(config)


@pytest.fixture(scope="module", params=["bert", "t5"])
def exported(request, tmp_path_factory):
    """(path of the float ONNX export, the module's parameter count)."""
    module = _transformer(request.param).eval()
    _randomize(module)
    path = tmp_path_factory.mktemp(request.param) / f"{request.param}.onnx"
    # dynamic axes: onnxruntime's optimizer would otherwise fold the position and token-type lookups
    # (their indices are constants in a static export), leaving the gathered rows instead of the tables
    torch.onnx.export(_LastHidden(module), (torch.randint(0, VOCAB, (1, SEQ)),), str(path), dynamo=False,
                      input_names=["input_ids"], opset_version=17, dynamic_axes={"input_ids": {0: "b", 1: "s"}})
    return path, sum(p.numel() for p in module.parameters())


@contextlib.contextmanager
def _quiet_root():
    """onnxruntime's quantizer and optimizer log advice to the root logger: silence it for the call only (a level
    left on the root logger would hide every later test's warnings from caplog)."""
    root = logging.getLogger()
    saved = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(saved)


def _quantize(src, dst, **options):
    from onnxruntime.quantization import quantize_dynamic

    with _quiet_root():  # the quantizer's advice to pre-process
        quantize_dynamic(str(src), str(dst), **options)
    return onnx.load(str(dst))


def _ops(m: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in m.graph.node)


def _count(path):
    return flopcount.count(str(path), input_shapes={"input_ids": (1, SEQ)})


def _params(path) -> int:
    return _count(path).params


@pytest.mark.parametrize("weight_type", ["QInt8", "QUInt8"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_quantize_dynamic_transformer(exported, tmp_path, weight_type, per_channel):
    from onnxruntime.quantization import QuantType

    src, torch_params = exported
    assert _params(src) == torch_params  # the float export holds every parameter
    q = _quantize(src, tmp_path / "q.onnx", weight_type=getattr(QuantType, weight_type), per_channel=per_channel)
    ops = _ops(q)
    # the paths the quantizer wrote: integer products and embeddings gathered in int8/uint8, then dequantized
    assert ops["MatMulInteger"] == 12 and ops["DequantizeLinear"] >= 2, dict(ops)
    gathered = {n.input[0] for n in q.graph.node if n.op_type == "Gather"}
    quantized = {t.name for t in q.graph.initializer if t.data_type in (TensorProto.INT8, TensorProto.UINT8)}
    assert gathered & quantized
    report = _count(tmp_path / "q.onnx")
    assert report.params == torch_params
    assert report.total.macs == DENSE_MACS


def test_session_fused_quantized_products(exported, tmp_path):
    """onnxruntime's session optimizer fuses DynamicQuantizeLinear + MatMulInteger + Mul into
    DynamicQuantizeMatMul and MatMulIntegerToFloat (com.microsoft): their int8 weights stay parameters."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType

    src, torch_params = exported
    _quantize(src, tmp_path / "q.onnx", weight_type=QuantType.QInt8)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "fused.onnx")
    ort.InferenceSession(str(tmp_path / "q.onnx"), so, providers=["CPUExecutionProvider"])
    ops = _ops(onnx.load(str(tmp_path / "fused.onnx")))
    assert ops["MatMulIntegerToFloat"] > 0 and ops["DynamicQuantizeMatMul"] > 0, dict(ops)
    assert ops["MatMulInteger"] == 0
    report = _count(tmp_path / "fused.onnx")
    assert report.params == torch_params
    assert report.total.macs == DENSE_MACS
    assert not report.unsupported


def test_optimizer_fused_then_quantized(tmp_path):
    """onnxruntime's transformer optimizer fuses BERT into EmbedLayerNormalization and Attention (it needs the
    attention mask input to see the pattern); quantize_dynamic then writes QEmbedLayerNormalization (int8
    tables, gamma and beta) and QAttention (int8 QKV weight)."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.transformers.optimizer import optimize_model

    module = _transformer("bert").eval()
    _randomize(module)

    class WithMask(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, ids, mask, segments):
            return self.inner(input_ids=ids, attention_mask=mask, token_type_ids=segments).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    ones = torch.ones(1, SEQ, dtype=torch.long)
    src = tmp_path / "bert.onnx"
    torch.onnx.export(WithMask(), (torch.randint(0, VOCAB, (1, SEQ)), ones, torch.zeros_like(ones)), str(src),
                      dynamo=False, input_names=names, opset_version=14, dynamic_axes={n: {0: "b", 1: "s"} for n in names})
    with _quiet_root():
        optimize_model(str(src), model_type="bert", num_heads=HEADS, hidden_size=HIDDEN).save_model_to_file(
            str(tmp_path / "fused.onnx"))
    # the fused ops' outputs have no ONNX type: tell the quantizer they are float
    q = _quantize(tmp_path / "fused.onnx", tmp_path / "q.onnx", weight_type=QuantType.QInt8,
                  extra_options={"DefaultTensorType": TensorProto.FLOAT})
    ops = _ops(q)
    assert ops["QAttention"] == LAYERS and ops["QEmbedLayerNormalization"] == 1, dict(ops)
    report = flopcount.count(str(tmp_path / "q.onnx"), input_shapes={n: (1, SEQ) for n in names})
    assert report.params == sum(p.numel() for p in module.parameters())
    assert report.total.macs == DENSE_MACS
    assert not report.unsupported


def test_quantized_lstm(tmp_path):
    """quantize_dynamic turns LSTM into DynamicQuantizeLSTM (int8 W and R, transposed)."""

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.fc = torch.nn.LSTM(5, 3, bidirectional=True), torch.nn.Linear(6, 7)

        def forward(self, x):
            return self.fc(self.lstm(x)[0])

    module = Tagger().eval()
    _randomize(module)
    src = tmp_path / "lstm.onnx"
    torch.onnx.export(module, (torch.randn(3, 2, 5),), str(src), dynamo=False, input_names=["x"], opset_version=17)
    q = _quantize(src, tmp_path / "q.onnx")
    assert _ops(q)["DynamicQuantizeLSTM"] == 1, dict(_ops(q))
    report = flopcount.count(str(tmp_path / "q.onnx"))
    torch_params = sum(p.numel() for p in module.parameters())
    assert torch_params == 2 * (4 * 3 * (5 + 3) + 2 * 4 * 3) + 6 * 7 + 7  # D·(4H·(I + H) + 2·4H) + the Linear
    assert report.params == torch_params
    # S·B = 6 steps and samples: 2 directions · 4H·(I + H), then the Linear 6 → 7
    assert report.total.macs == 6 * (2 * 12 * 8 + 6 * 7)


# --------------------------------------------------------------------------------------------
# a small CNN: ConvInteger (dynamic), QLinearConv with int32 biases (static, QOperator), QDQ


class _CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 5, 3)
        self.fc = torch.nn.Linear(5 * 7 * 7, 11)

    def forward(self, x):
        return self.fc(torch.relu(self.c2(torch.relu(self.c1(x)))).flatten(1))


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    module = _CNN().eval()
    _randomize(module)
    path = tmp_path_factory.mktemp("cnn") / "cnn.onnx"
    torch.onnx.export(module, (torch.randn(1, 3, 9, 9),), str(path), dynamo=False, input_names=["x"], opset_version=17)
    torch_params = sum(p.numel() for p in module.parameters())
    assert torch_params == 8 * 3 * 9 + 8 + 5 * 8 * 9 + 5 + 245 * 11 + 11
    return path, torch_params


class _Reader:
    """Calibration data for quantize_static: a few random images."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.batches = iter([{"x": rng.standard_normal((1, 3, 9, 9), dtype=np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self.batches, None)


@pytest.mark.parametrize("how, expected_op", [
    pytest.param("dynamic", "ConvInteger", id="dynamic-ConvInteger"),
    pytest.param("QOperator", "QLinearConv", id="static-QLinearConv"),
    pytest.param("QDQ", "DequantizeLinear", id="static-QDQ"),
])
def test_quantized_cnn(cnn, tmp_path, how, expected_op):
    from onnxruntime.quantization import QuantFormat, quantize_static

    src, torch_params = cnn
    dst = tmp_path / "q.onnx"
    if how == "dynamic":
        _quantize(src, dst)
    else:
        with _quiet_root():
            quantize_static(str(src), str(dst), _Reader(), quant_format=getattr(QuantFormat, how))
    ops = _ops(onnx.load(str(dst)))
    assert ops[expected_op] > 0, dict(ops)
    if how == "QOperator":
        assert ops["QGemm"] == 1, dict(ops)  # the Linear, in com.microsoft
    report = flopcount.count(str(dst))
    assert report.params == torch_params
    assert report.total.macs == 8 * 81 * 27 + 5 * 49 * 72 + 245 * 11  # C_out·H·W·C_in·K per conv, then the Linear


# --------------------------------------------------------------------------------------------
# dequantization spelled out in the graph


def _spelled_out(zero_point: bool, per_channel: bool) -> onnx.ModelProto:
    """x[3, 5] · dequantize(W int8 [5, 7]) + b[7]: W → Cast → (Sub zero point) → Mul scale → MatMul."""
    n = 7 if per_channel else 1
    inits = [numpy_helper.from_array(np.arange(35, dtype=np.int8).reshape(5, 7), "w_q"),
             numpy_helper.from_array(np.full(n, 0.1, np.float32), "w_scale"),
             numpy_helper.from_array(np.arange(7, dtype=np.float32), "b")]
    nodes = [helper.make_node("Cast", ["w_q"], ["w_f"], to=TensorProto.FLOAT)]
    data = "w_f"
    if zero_point:
        inits.append(numpy_helper.from_array(np.full(n, 3, np.int8), "w_zp"))
        nodes += [helper.make_node("Cast", ["w_zp"], ["zp_f"], to=TensorProto.FLOAT),
                  helper.make_node("Sub", ["w_f", "zp_f"], ["w_c"])]
        data = "w_c"
    nodes += [helper.make_node("Mul", [data, "w_scale"], ["w"]),
              helper.make_node("MatMul", ["x", "w"], ["xw"]),
              helper.make_node("Add", ["xw", "b"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("zero_point", [False, True], ids=["Cast-Mul", "Cast-Sub-Mul"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_cast_mul_dequantization(tmp_path, zero_point, per_channel):
    m = _spelled_out(zero_point, per_channel)
    onnx.checker.check_model(m, full_check=True)
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    import onnxruntime as ort

    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.ones((3, 5), np.float32)})
    assert y.shape == (3, 7)
    assert flopcount.count(str(path)).params == 5 * 7 + 7  # W and the bias; never the scale or zero point


def test_integer_mask_on_activations_is_no_parameter(tmp_path):
    """A uint8 mask cast to float and multiplied into attention scores dequantizes nothing: a constant."""
    inits = [numpy_helper.from_array(np.tril(np.ones((1, 1, 7, 7), np.uint8)), "mask")]
    nodes = [helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["scores", "mask_f"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "v"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 3, 7, 7]),
                                       helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 3, 7, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 7, 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    report = flopcount.count(m)
    assert report.params == 0
