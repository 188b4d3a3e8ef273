"""Quantized products and (de)quantization: MACs in ``macs``, 2 integer ops per MAC in ``int_ops``,
one integer op per element for each given zero point, float rescaling in ``flops``."""

import pytest
from helpers import model, weight
from onnx import TensorProto, helper

import flopcount

U8, I32, F32 = TensorProto.UINT8, TensorProto.INT32, TensorProto.FLOAT


def node_model(op, inputs, inits, names, dtype=U8, opset=21, **attrs):
    """One node with inputs named in order ("" for an omitted optional input)."""
    node = helper.make_node(op, names, ["y"], **attrs)
    return model([node], inputs, ["y"], inits, opset=opset, dtype=dtype)


# --- ConvInteger / QLinearConv: N 2, C_in 6, C_out 9, G 3, 3x5 kernel on 11x13 → 9x9 ----------
N, C_IN, C_OUT, G, KH, KW, XH, XW = 2, 6, 9, 3, 3, 5, 11, 13
YH, YW = XH - KH + 1, XW - KW + 1
CONV_MACS = N * C_OUT * YH * YW * KH * KW * (C_IN // G)
X_ELEMS, W_ELEMS, Y_ELEMS = N * C_IN * XH * XW, C_OUT * (C_IN // G) * KH * KW, N * C_OUT * YH * YW


@pytest.mark.parametrize("x_zp, w_zp", [(False, False), (True, False), (True, True), (False, True)],
                         ids=["no-zp", "x-zp", "both-zp", "w-zp"])
def test_conv_integer(x_zp, w_zp):
    inits = [weight("w", (C_OUT, C_IN // G, KH, KW), U8)]
    inits += [weight("xzp", (), U8)] if x_zp else []
    inits += [weight("wzp", (C_OUT,), U8)] if w_zp else []
    names = ["x", "w", "xzp" if x_zp else "", "wzp" if w_zp else ""]
    m = node_model("ConvInteger", {"x": (N, C_IN, XH, XW)}, inits, names, opset=10, group=G)
    r = flopcount.count(m)
    assert r.nodes[0].outputs[0].shape == (N, C_OUT, YH, YW)
    assert r.total.macs == CONV_MACS
    assert r.total.int_ops == 2 * CONV_MACS + (X_ELEMS if x_zp else 0) + (W_ELEMS if w_zp else 0)
    assert r.total.flops == 0


def qlinear_conv(bias):
    scalars = [weight(n, (), t) for n, t in (("xs", F32), ("xzp", U8))]
    w = [weight("w", (C_OUT, C_IN // G, KH, KW), U8), weight("ws", (C_OUT,), F32), weight("wzp", (C_OUT,), U8)]
    out = [weight("ys", (), F32), weight("yzp", (), U8)] + ([weight("b", (C_OUT,), I32)] if bias else [])
    names = ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"] + (["b"] if bias else [])
    return node_model("QLinearConv", {"x": (N, C_IN, XH, XW)}, scalars + w + out, names, opset=10, group=G)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_qlinear_conv(bias):
    r = flopcount.count(qlinear_conv(bias))
    assert r.total.macs == CONV_MACS
    # products, x and w zero points, int32 bias add per output
    assert r.total.int_ops == 2 * CONV_MACS + X_ELEMS + W_ELEMS + (Y_ELEMS if bias else 0)
    assert r.total.flops == 2 * Y_ELEMS  # requantize: × x_scale·w_scale/y_scale, + y_zero_point
    t3 = flopcount.count(qlinear_conv(bias), convention="table3").total
    assert (t3.int_ops, t3.flops) == (2 * CONV_MACS + X_ELEMS + W_ELEMS, 2 * Y_ELEMS)


# --- MatMulInteger / QLinearMatMul: A[5, 7, 37] · B[37, 23] ----------------------------------
MM_MACS = 5 * 7 * 37 * 23
A_ELEMS, B_ELEMS, MM_Y = 5 * 7 * 37, 37 * 23, 5 * 7 * 23


@pytest.mark.parametrize("a_zp, b_zp", [(False, False), (True, False), (True, True)], ids=["no-zp", "a-zp", "both-zp"])
def test_matmul_integer(a_zp, b_zp):
    inits = [weight("b", (37, 23), U8)]
    inits += [weight("azp", (), U8)] if a_zp else []
    inits += [weight("bzp", (23,), U8)] if b_zp else []
    names = ["a", "b", "azp" if a_zp else "", "bzp" if b_zp else ""]
    while names[-1] == "":
        names.pop()
    r = flopcount.count(node_model("MatMulInteger", {"a": (5, 7, 37)}, inits, names, opset=10))
    assert r.nodes[0].outputs[0].shape == (5, 7, 23)
    assert r.total.macs == MM_MACS
    assert r.total.int_ops == 2 * MM_MACS + (A_ELEMS if a_zp else 0) + (B_ELEMS if b_zp else 0)
    assert r.total.flops == 0


def test_qlinear_matmul():
    inits = [weight("as", (), F32), weight("azp", (), U8), weight("b", (37, 23), U8), weight("bs", (), F32),
             weight("bzp", (), U8), weight("ys", (), F32), weight("yzp", (), U8)]
    names = ["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"]
    r = flopcount.count(node_model("QLinearMatMul", {"a": (5, 7, 37)}, inits, names))
    assert r.total.macs == MM_MACS
    assert r.total.int_ops == 2 * MM_MACS + A_ELEMS + B_ELEMS
    assert r.total.flops == 2 * MM_Y
    t3 = flopcount.count(node_model("QLinearMatMul", {"a": (5, 7, 37)}, inits, names), convention="table3").total
    assert t3.int_ops == 2 * MM_MACS + A_ELEMS + B_ELEMS  # integer ops do not follow table3's FC factor


# --- QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear: X[3, 5, 7] = 105 elements -----
X = 3 * 5 * 7

QUANTIZE = [
    # scale shape, zero point given, attrs, FLOPs per element (divide by scale, + add zero point)
    pytest.param((), True, {}, 2, id="per-tensor"),
    pytest.param((), False, {}, 1, id="no-zero-point"),
    pytest.param((5,), True, {"axis": 1}, 2, id="per-axis"),
    pytest.param((3, 5, 1), True, {"axis": 2, "block_size": 7}, 2, id="blocked"),
]


@pytest.mark.parametrize("scale, zp, attrs, per_elem", QUANTIZE)
def test_quantize_linear(scale, zp, attrs, per_elem):
    inits = [weight("s", scale, F32)] + ([weight("zp", scale, U8)] if zp else [])
    names = ["x", "s"] + (["zp"] if zp else [])
    r = flopcount.count(node_model("QuantizeLinear", {"x": (3, 5, 7)}, inits, names, dtype=F32, **attrs))
    assert r.total.flops == per_elem * X
    assert (r.total.int_ops, r.total.macs) == (0, 0)


DEQUANTIZE = [
    # x type, zero point given, FLOPs per element, int_ops per element
    pytest.param(U8, True, 1, 1, id="uint8-zp"),
    pytest.param(U8, False, 1, 0, id="uint8-no-zp"),
    pytest.param(TensorProto.INT8, True, 1, 1, id="int8-zp"),
    pytest.param(TensorProto.FLOAT8E4M3FN, True, 2, 0, id="float8-zp"),
]


@pytest.mark.parametrize("xtype, zp, flops, int_ops", DEQUANTIZE)
def test_dequantize_linear(xtype, zp, flops, int_ops):
    inits = [weight("s", (), F32)] + ([weight("zp", (), xtype)] if zp else [])
    names = ["x", "s"] + (["zp"] if zp else [])
    r = flopcount.count(node_model("DequantizeLinear", {"x": (3, 5, 7)}, inits, names, dtype=xtype))
    assert (r.total.flops, r.total.int_ops) == (flops * X, int_ops * X)


def test_dynamic_quantize_linear():
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zp"])
    r = flopcount.count(model([node], {"x": (3, 5, 7)}, ["y", "scale", "zp"], opset=11))
    # min and max: (X − 1) comparisons each; scale 4 and zero point 2 scalar FLOPs; quantize 2 per element
    assert r.total.flops == 2 * (X - 1) + 4 + 2 + 2 * X


def test_family():
    r = flopcount.count(qlinear_conv(False))
    assert r.nodes[0].family == "quantized"
