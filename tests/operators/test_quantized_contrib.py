"""onnxruntime's quantized contrib operators (domain com.microsoft): their output shapes are onnxruntime's own
(each op runs in a one-node model on CPU), a node after them resolves, and each formula is its closed form,
written here with distinct odd sizes.

Vocabulary of the closed forms: |T| is a tensor's element count; dequantizing n elements costs n FLOPs (the
scale) and n int_ops with a zero point; quantizing n elements n FLOPs, 2n with a zero point; integer products
2 int_ops per MAC plus one per element of each operand whose zero point is given.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.cost import Cost
from flopcount.errors import ShapeError

ort = pytest.importorskip("onnxruntime")

F, U8, I8, I32, B = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32, TensorProto.BOOL
MS = "com.microsoft"


def x(name, elem, shape):
    """A graph input, fed random values."""
    return ("x", name, elem, tuple(shape))


def w(name, elem, shape):
    """An initializer with random values (a quantized weight, a bias)."""
    return ("w", name, elem, tuple(shape))


def ids(name, shape, below):
    """A graph input of int32 indices in [0, below)."""
    return ("x", name, I32, tuple(shape), ("below", below))


def scale(name, shape=()):
    return ("w", name, F, tuple(shape), 0.05)


def zp(name, elem=U8, shape=()):
    return ("w", name, elem, tuple(shape), 0)


OMIT = ("", "", 0, ())


def _values(rng, elem, shape, fill=None):
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    if isinstance(fill, tuple):
        return rng.integers(0, fill[1], size=shape, dtype=dtype)
    if fill is not None:
        return np.full(shape, fill, dtype)
    if elem == F:
        return rng.standard_normal(shape).astype(dtype)
    if elem == B:
        return rng.random(shape) < 0.5
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), size=shape, dtype=dtype)


def _build(op, inputs, n_outputs, attrs) -> tuple[onnx.ModelProto, dict]:
    """The op as node "q", then Cast → Relu on its first output (a node after it whose count needs its shape)."""
    rng = np.random.default_rng(0)
    graph_inputs, inits, feeds = [], [], {}
    for kind, name, elem, shape, *fill in inputs:
        if not name:
            continue
        value = _values(rng, elem, shape, *fill)
        if kind == "x":
            graph_inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
            feeds[name] = value
        else:
            inits.append(numpy_helper.from_array(value, name))
    outs = [f"y{i}" for i in range(n_outputs)]
    nodes = [helper.make_node(op, [i[1] for i in inputs], outs, name="q", domain=MS, **attrs),
             helper.make_node("Cast", ["y0"], ["y0_float"], to=F, name="cast"),
             helper.make_node("Relu", ["y0_float"], ["after"], name="after")]
    g = helper.make_graph(nodes, "g", graph_inputs, [helper.make_empty_tensor_value_info(n) for n in [*outs, "after"]],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    return m, feeds


# (id, op, inputs, outputs, attributes, expected cost)
CASES = [
    pytest.param(
        "MatMulIntegerToFloat",
        [x("a", U8, (3, 5, 7)), w("b", I8, (7, 9)), scale("sa"), scale("sb", (9,)), zp("za"), zp("zb", I8, (9,)),
         w("bias", F, (9,))], 1, {},
        # MACs 3·5·9·7; |A| = 105, |B| = 63 zero points; |Y| = 135 scale multiplies, 135 bias adds
        Cost(flops=135 + 135, macs=3 * 5 * 9 * 7, int_ops=2 * 945 + 105 + 63), id="MatMulIntegerToFloat"),
    pytest.param(
        "MatMulIntegerToFloat", [x("a", U8, (5, 7)), w("b", U8, (7, 9)), scale("sa"), scale("sb")], 1, {},
        Cost(flops=45, macs=5 * 9 * 7, int_ops=2 * 315), id="MatMulIntegerToFloat-no-zero-points"),
    pytest.param(
        "DynamicQuantizeMatMul", [x("a", F, (3, 5, 7)), w("b", I8, (7, 9)), scale("sb"), zp("zb", I8), w("bias", F, (9,))],
        1, {},
        # quantizing A: 2·(105 − 1) + 6 + 2·105 = 424; A's zero point always subtracted
        Cost(flops=424 + 135 + 135, macs=945, int_ops=2 * 945 + 105 + 63), id="DynamicQuantizeMatMul"),
    pytest.param(
        "QGemm",
        [x("a", U8, (5, 7)), scale("sa"), zp("za"), w("b", I8, (9, 7)), scale("sb"), zp("zb", I8), w("c", I32, (9,)),
         scale("sy"), zp("zy")], 1, {"transB": 1},
        # M·N·K = 5·9·7 = 315; zero points |A| 35 + |B| 63; int32 bias M·N = 45; requantize 2·45
        Cost(flops=2 * 45, macs=315, int_ops=2 * 315 + 35 + 63 + 45), id="QGemm-requantized"),
    pytest.param(
        "QGemm", [x("a", U8, (7, 5)), scale("sa"), zp("za"), w("b", U8, (7, 9)), scale("sb"), zp("zb")], 1,
        {"transA": 1},
        Cost(flops=45, macs=315, int_ops=2 * 315 + 35 + 63), id="QGemm-float-transA"),
    pytest.param(
        "QAttention",
        [x("input", U8, (3, 5, 6)), w("weight", I8, (6, 12)), w("bias", F, (12,)), scale("si"), scale("sw"), OMIT,
         zp("zi"), zp("zw", I8)], 1, {"num_heads": 2},
        # B, S, D_in, D, H, E = 3, 5, 6, 4, 2, 2; projection 3·5·12 outputs of 6 MACs; R = B·H·S = 30 rows, T = 5;
        # core: 2·30·5·(2 + 2) products + (30·2 + 3·2·5·2) scalings + 30·(5·5 − 2) softmax
        Cost(flops=180 + 180 + 2 * 600 + 120 + 690, macs=1080 + 600, transcendentals=150,
             int_ops=2 * 1080 + 90 + 72), id="QAttention"),
    pytest.param(
        "QAttention",
        [x("input", U8, (3, 5, 6)), w("weight", U8, (6, 12)), w("bias", F, (12,)), scale("si"), scale("sw"),
         ids("mask_index", (3,), 6)], 2, {"num_heads": 2, "unidirectional": 1},
        # as above without zero points, with the present output and one mask add per score (30 rows · 5 keys)
        Cost(flops=180 + 180 + 2 * 600 + 120 + 690 + 150, macs=1080 + 600, transcendentals=150, int_ops=2 * 1080),
        id="QAttention-masked-present"),
    pytest.param(
        "DynamicQuantizeLSTM",
        [x("X", F, (3, 2, 5)), w("W", I8, (2, 5, 12)), w("R", I8, (2, 3, 12)), OMIT, OMIT, OMIT, OMIT,
         OMIT, scale("sw", (2,)), zp("zw", I8, (2,)), scale("sr", (2,)), zp("zr", I8, (2,))], 3,
        {"hidden_size": 3, "direction": "bidirectional"},
        # D = 2, no bias: per hidden unit and step 5 activations + 4; everything else twice the forward case
        Cost(flops=2 * (18 * 9 + 124 + 84 + 144), macs=2 * 576, transcendentals=2 * 5 * 18,
             int_ops=2 * (2 * 576 + 60 + 36 + 30 + 18)), id="DynamicQuantizeLSTM-bidirectional"),
    pytest.param(
        "QEmbedLayerNormalization",
        [ids("ids", (3, 5), 11), ids("seg", (3, 5), 2), w("word", U8, (11, 7)), w("pos", U8, (13, 7)),
         w("segment", U8, (2, 7)), w("gamma", U8, (7,)), w("beta", U8, (7,)), ids("mask", (3, 5), 2),
         scale("s_word"), scale("s_pos"), scale("s_seg"), scale("s_gamma"), scale("s_beta"),
         zp("z_word"), zp("z_pos"), zp("z_seg"), zp("z_gamma"), zp("z_beta")], 2, {},
        # B, S, D = 3, 5, 7 (105 elements over 15 tokens): dequantizing 3 gathered rows per token, gamma and beta
        # 3·105 + 2·7 = 329 (FLOPs and int_ops); two sums 2·105; LayerNormalization 105, 15 square roots;
        # mask_index: one integer add per mask element, 15
        Cost(flops=329 + 210 + 105, transcendentals=15, int_ops=329 + 15), id="QEmbedLayerNormalization"),
    pytest.param(
        "DynamicQuantizeLSTM",
        [x("X", F, (3, 2, 5)), w("W", I8, (1, 5, 12)), w("R", I8, (1, 3, 12)), w("B", F, (1, 24)), OMIT, OMIT, OMIT,
         OMIT, scale("sw", (1,)), zp("zw", I8, (1,)), scale("sr", (1,)), zp("zr", I8, (1,))], 3, {"hidden_size": 3},
        # S, B, I, H = 3, 2, 5, 3: MACs S·B·4H·(I + H) = 576; element-wise per hidden unit and step
        # 5 activations + 4 + 8 bias = 17 over 18 units; quantizing X (4·30 + 4) and each H (3·(4·6 + 4));
        # dequantizing both products 2·3·2·12; zero points |W| 60 + |R| 36 + |X| 30 + S·B·H 18
        Cost(flops=18 * 17 + 124 + 84 + 144, macs=576, transcendentals=5 * 18, int_ops=2 * 576 + 60 + 36 + 30 + 18),
        id="DynamicQuantizeLSTM"),
    pytest.param(
        "QLinearAdd",
        [x("a", U8, (3, 1, 7)), scale("sa"), zp("za"), x("b", U8, (5, 7)), scale("sb"), zp("zb"), scale("sc"), zp("zc")],
        1, {},
        # dequantize |A| 21 + |B| 35, add |C| 105, quantize 2·105
        Cost(flops=21 + 35 + 105 + 210, int_ops=21 + 35), id="QLinearAdd-broadcast"),
    pytest.param(
        "QLinearMul", [x("a", U8, (3, 5, 7)), scale("sa"), zp("za"), x("b", U8, (7,)), scale("sb"), zp("zb"), scale("sc")],
        1, {},
        # no C_zero_point: quantizing C is one FLOP per element
        Cost(flops=105 + 7 + 105 + 105, int_ops=105 + 7), id="QLinearMul-no-output-zero-point"),
    pytest.param(
        "QLinearSigmoid", [x("x", U8, (3, 5, 7)), scale("sx"), zp("zx"), scale("sy"), zp("zy")], 1, {},
        Cost(flops=105 + 105 + 210, transcendentals=105, int_ops=105), id="QLinearSigmoid"),
    pytest.param(
        "QLinearLeakyRelu", [x("x", U8, (3, 5, 7)), scale("sx"), zp("zx"), scale("sy"), zp("zy")], 1, {"alpha": 0.1},
        Cost(flops=105 + 105 + 210, int_ops=105), id="QLinearLeakyRelu"),
    pytest.param(
        "QLinearSoftmax", [x("x", U8, (3, 5, 7)), scale("sx"), zp("zx"), scale("sy"), zp("zy")], 1,
        {"axis": -1, "opset": 13},
        # 15 rows of 7: 15·(5·7 − 2)
        Cost(flops=105 + 15 * 33 + 210, transcendentals=105, int_ops=105), id="QLinearSoftmax"),
    pytest.param(
        "QLinearConcat",
        [scale("sy"), zp("zy"), x("a", U8, (3, 5)), scale("sa"), zp("za"), x("b", U8, (3, 7)), scale("sb"), zp("zb")],
        1, {"axis": 1},
        Cost(flops=3 * 36, int_ops=36), id="QLinearConcat"),
    pytest.param(
        "QLinearWhere",
        [x("c", B, (3, 1, 7)), x("a", U8, (5, 7)), scale("sa"), zp("za"), x("b", U8, (3, 5, 1)), scale("sb"), zp("zb"),
         scale("sz"), zp("zz")], 1, {},
        Cost(flops=35 + 15 + 2 * 105, int_ops=35 + 15), id="QLinearWhere-broadcast"),
    pytest.param(
        "QLinearAveragePool", [x("x", U8, (1, 3, 9, 11)), scale("sx"), zp("zx"), scale("sy"), zp("zy")], 1,
        {"kernel_shape": [3, 3], "strides": [2, 2]},
        # Y 1·3·4·5 = 60 windows of 9
        Cost(flops=297 + 9 * 60 + 2 * 60, int_ops=297), id="QLinearAveragePool"),
    pytest.param(
        "QLinearAveragePool", [x("x", U8, (1, 9, 11, 3)), scale("sx"), zp("zx"), scale("sy"), zp("zy")], 1,
        {"kernel_shape": [3, 3], "strides": [2, 2], "channels_last": 1},
        Cost(flops=297 + 9 * 60 + 2 * 60, int_ops=297), id="QLinearAveragePool-channels-last"),
    pytest.param(
        "QLinearGlobalAveragePool", [x("x", U8, (1, 3, 5, 7)), scale("sx"), zp("zx"), scale("sy"), zp("zy")], 1, {},
        Cost(flops=105 + 105 + 2 * 3, int_ops=105), id="QLinearGlobalAveragePool"),
    pytest.param(
        "QLinearGlobalAveragePool", [x("x", U8, (1, 5, 7, 3)), scale("sx"), zp("zx"), scale("sy"), zp("zy")], 1,
        {"channels_last": 1},
        Cost(flops=105 + 105 + 2 * 3, int_ops=105), id="QLinearGlobalAveragePool-channels-last"),
    pytest.param(
        "QLinearReduceMean", [x("x", U8, (3, 5, 7)), scale("sx"), zp("zx"), scale("sy"), zp("zy")], 1,
        {"axes": [1], "keepdims": 1},
        # ReduceMean: |X| − |Y| additions + |Y| divisions = |X|; Y 3·1·7 = 21
        Cost(flops=105 + 105 + 2 * 21, int_ops=105), id="QLinearReduceMean"),
    pytest.param(
        "QLinearConv",
        [x("x", U8, (1, 7, 9, 3)), scale("sx"), zp("zx"), w("w", U8, (5, 3, 3, 3)), scale("sw"), zp("zw"), scale("sy"),
         zp("zy"), w("bias", I32, (5,))], 1, {"channels_last": 1, "kernel_shape": [3, 3]},
        # Y (1, 5, 7, 5) channels-last: 175 outputs of 27 MACs; zero points |X| 189 + |W| 135; bias 175
        Cost(flops=2 * 175, macs=175 * 27, int_ops=2 * 4725 + 189 + 135 + 175), id="QLinearConv-channels-last"),
    pytest.param(
        "QuantizeLinear", [x("x", F, (3, 5)), scale("s"), zp("z", I8)], 1, {},
        Cost(flops=2 * 15), id="QuantizeLinear"),
    pytest.param(
        "DequantizeLinear", [x("x", U8, (3, 5)), scale("s"), zp("z")], 1, {},
        Cost(flops=15, int_ops=15), id="DequantizeLinear"),
]


# onnxruntime has no CPU kernel for these: the shape reference is its run of the float counterpart
NO_CPU_KERNEL = {"QLinearReduceMean": "ReduceMean"}


def _run(m: onnx.ModelProto, feeds) -> list[np.ndarray]:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _run_float_counterpart(op, feeds, attrs) -> list[np.ndarray]:
    ((name, value),) = feeds.items()
    node = helper.make_node(NO_CPU_KERNEL[op], [name], ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(name, F, list(value.shape))],
                          [helper.make_empty_tensor_value_info("y")])
    (y,) = _run(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), {name: value.astype(np.float32)})
    return [y.astype(value.dtype)]


@pytest.mark.parametrize("op, inputs, n_outputs, attrs, expected", CASES)
def test_quantized_contrib(tmp_path, op, inputs, n_outputs, attrs, expected):
    m, feeds = _build(op, inputs, n_outputs, attrs)
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    real = _run(m, feeds) if op not in NO_CPU_KERNEL else _run_float_counterpart(op, feeds, attrs)
    report = flopcount.count(str(path))
    (node,) = [n for n in report.nodes if n.name == "q"]
    assert [t.shape for t in node.outputs] == [r.shape for r in real[:n_outputs]]
    assert node.outputs[0].elem_type == helper.np_dtype_to_tensor_dtype(real[0].dtype)
    (after,) = [n for n in report.nodes if n.name == "after"]
    assert after.cost.flops == real[0].size  # the Relu after the op: resolved, one FLOP per element
    assert node.cost == expected
    assert not report.unsupported


def test_train_mode_reports_them_missing(tmp_path):
    """Inference-only: a quantized contrib op on the path of a gradient has no backward formula, and train
    mode says so (never a silent zero)."""
    m, _ = _build("MatMulIntegerToFloat", [x("a", U8, (5, 7)), w("b", I8, (7, 9)), scale("sa"), scale("sb"),
                                           OMIT, OMIT, w("bias", F, (9,))], 1, {})
    report = flopcount.count(m, mode="train")
    assert "com.microsoft:MatMulIntegerToFloat" in report.backward_unsupported


# --------------------------------------------------------------------------------------------
# an operator no shape inference knows: the error names it, not the node after it


@pytest.mark.parametrize("op", ["Mystery", "QEmbedLayerNormalizationV9"])
def test_shapeless_contrib_op_is_named(tmp_path, op):
    nodes = [helper.make_node(op, ["x"], ["y"], name="culprit", domain=MS),
             helper.make_node("Relu", ["y"], ["z"], name="downstream")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3, 5])],
                          [helper.make_empty_tensor_value_info("z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    with pytest.raises(ShapeError, match=rf"node 'culprit' \({op}, domain com.microsoft\): no shape inference "
                                         r"knows this operator.*'y'.*node 'downstream' \(Relu\) after it"):
        flopcount.count(m)


def test_contrib_op_whose_shape_function_cannot_tell_is_named(tmp_path):
    """QLinearReduceMean without its required axes attribute: its shape function cannot tell, and the error says so
    about it."""
    m, _ = _build("QLinearReduceMean", [x("x", U8, (3, 5, 7)), scale("sx"), zp("zx"), scale("sy"), zp("zy")], 1, {})
    with pytest.raises(ShapeError, match=r"node 'q' \(QLinearReduceMean, domain com.microsoft\): its shape function "
                                         r"cannot tell.*output 'y0' is unknown"):
        flopcount.count(m)
