"""Conventions, the weighted ``aiperf`` one above all.

AIPerf prices each primitive floating-point operation: multiply-add 2, add (subtract), multiply,
compare 1, divide 4, square root 4, exponential 8, log 1. Each expected value below is written from
these weights and the op's primitive operations (stated beside it), with distinct odd sizes; the
``default`` figure of the same model is written beside it, so both conventions are checked on
every case. Products cost 2 per MAC under both.
"""

import doctest
import json

import pytest
from helpers import const, single, weight
from onnx import TensorProto

import flopcount
import flopcount.conventions
from flopcount.cli import main
from flopcount.conventions import AIPERF_WEIGHTS, CONVENTIONS, Convention

MAC, ADD, MUL, CMP, DIV, SQRT, EXP, LOG = 2, 1, 1, 1, 4, 4, 8, 1

X = (3, 5, 7)
NX = 3 * 5 * 7  # 105
X4 = (3, 5, 7, 9)
NX4 = 3 * 5 * 7 * 9  # 945
R, N_ROW = 3 * 5, 7  # rows of the last axis of X

# Element-wise ops: (op, primitive cost per element under aiperf, transcendentals per element)
ELEMENTWISE = [
    pytest.param("Div", DIV, 0, id="Div"),
    pytest.param("Sub", ADD, 0, id="Sub"),
    pytest.param("Sqrt", SQRT, 1, id="Sqrt"),
    pytest.param("Exp", EXP, 1, id="Exp"),
    pytest.param("Log", LOG, 1, id="Log"),
    pytest.param("Reciprocal", DIV, 0, id="Reciprocal"),
    pytest.param("Relu", CMP, 0, id="Relu"),
    pytest.param("Sigmoid", EXP + ADD + DIV, 1, id="Sigmoid-1/(1+exp(-x))"),
    pytest.param("Tanh", MUL + EXP + 2 * ADD + DIV, 1, id="Tanh-(exp(2x)-1)/(exp(2x)+1)"),
    pytest.param("Softplus", EXP + ADD + LOG, 2, id="Softplus-log(1+exp(x))"),
    pytest.param("Sin", EXP, 1, id="Sin-exp-class"),
]
BINARY = {"Div", "Sub"}


@pytest.mark.parametrize("op, per_element, trans", ELEMENTWISE)
def test_elementwise(op, per_element, trans):
    inputs = {"a": X, "b": X} if op in BINARY else {"x": X}
    m = single(op, inputs)
    aiperf = flopcount.count(m, convention="aiperf").total
    default = flopcount.count(m).total
    assert aiperf.flops == per_element * NX
    assert aiperf.transcendentals == trans * NX
    assert default.flops == NX  # Table 3: one FLOP per output element


def test_pow_and_gelu():
    # pow(a, b) = exp(b·log a): log, mul, exp; Gelu (erf form) 0.5·x·(1 + erf(x/√2)): 3 mul, 1 add, erf as exp
    pow_model = single("Pow", {"a": X, "b": X})
    assert flopcount.count(pow_model, convention="aiperf").total.flops == (LOG + MUL + EXP) * NX
    gelu = single("Gelu", {"x": X}, opset=20)
    assert flopcount.count(gelu, convention="aiperf").total.flops == (3 * MUL + ADD + EXP) * NX
    # tanh form: 6 mul and 2 add around a tanh (mul, exp, 2 add, div)
    gelu_tanh = single("Gelu", {"x": X}, opset=20, approximate="tanh")
    assert flopcount.count(gelu_tanh, convention="aiperf").total.flops == (7 * MUL + 4 * ADD + EXP + DIV) * NX
    assert flopcount.count(gelu_tanh).total.flops == NX


def test_integer_elementwise_stays_int_ops():
    m = single("Div", {"a": X, "b": X}, dtype=TensorProto.INT64)
    r = flopcount.count(m, convention="aiperf").total
    assert r.flops == 0 and r.int_ops == NX


def test_softmax_rows_of_odd_length():
    # per row of n = 7: max n − 1 cmp, n subtractions + n − 1 sum adds, n exp, n div
    m = single("Softmax", {"x": X}, opset=13)
    per_row = (N_ROW - 1) * CMP + (2 * N_ROW - 1) * ADD + N_ROW * EXP + N_ROW * DIV
    assert per_row == 15 * N_ROW - 2
    r = flopcount.count(m, convention="aiperf").total
    assert r.flops == R * (15 * N_ROW - 2) and r.transcendentals == R * N_ROW
    assert flopcount.count(m).total.flops == R * (5 * N_ROW - 2)


def test_log_softmax():
    # max n − 1 cmp, 3n − 1 adds (subtract max, sum, subtract log), n exp, 1 log per row
    m = single("LogSoftmax", {"x": X}, opset=13)
    per_row = (N_ROW - 1) * CMP + (3 * N_ROW - 1) * ADD + N_ROW * EXP + LOG
    assert flopcount.count(m, convention="aiperf").total.flops == R * per_row == R * (12 * N_ROW - 1)


@pytest.mark.parametrize("bias", [pytest.param(True, id="with-B"), pytest.param(False, id="without-B")])
def test_layer_normalization(bias):
    # per row of m = 7 (R = 15 rows): mean (m − 1 add, 1 div), x − mean (m add), variance (m mul,
    # m − 1 add, 1 div), + eps (1 add), sqrt, 1/σ (1 div), × 1/σ (m mul), × scale (m mul), + B (m add)
    inits = [weight("scale", (7,))] + ([weight("B", (7,))] if bias else [])
    m = single("LayerNormalization", {"x": X}, inits, opset=17)
    adds = R * ((N_ROW - 1) + N_ROW + (N_ROW - 1) + 1) + (NX if bias else 0)
    muls = R * 3 * N_ROW
    expected = adds * ADD + muls * MUL + 3 * R * DIV + R * SQRT
    assert expected == (7 if bias else 6) * NX + 15 * R
    r = flopcount.count(m, convention="aiperf").total
    assert r.flops == expected and r.transcendentals == R
    assert flopcount.count(m).total.flops == NX


def test_rms_normalization():
    # per row: squares (m mul), mean (m − 1 add, 1 div), + eps (1 add), sqrt, 1/rms (1 div), × (m mul), × scale (m mul)
    m = single("RMSNormalization", {"x": X}, [weight("scale", (7,))], opset=23)
    expected = R * (3 * N_ROW * MUL + N_ROW * ADD + 2 * DIV + SQRT)
    assert flopcount.count(m, convention="aiperf").total.flops == expected
    assert flopcount.count(m).total.flops == NX


def test_batch_normalization():
    # per element (x − mean)·(1/σ)·γ + β: 2 add, 2 mul; per channel (C = 5) var + eps, sqrt, 1/σ
    c = 5
    inits = [weight(n, (c,)) for n in ("scale", "B", "mean", "var")]
    m = single("BatchNormalization", {"x": X4}, inits, opset=15)
    expected = NX4 * (2 * ADD + 2 * MUL) + c * (ADD + SQRT + DIV)
    r = flopcount.count(m, convention="aiperf").total
    assert r.flops == expected == 4 * NX4 + 9 * c and r.transcendentals == c
    assert flopcount.count(m).total.flops == NX4


def test_instance_normalization():
    # N·C = 15 statistics of H·W = 63 elements, scale and B given: as LayerNormalization with B
    stats = 3 * 5
    m = single("InstanceNormalization", {"x": X4}, [weight("scale", (5,)), weight("B", (5,))])
    assert flopcount.count(m, convention="aiperf").total.flops == 7 * NX4 + 15 * stats


# Pooling on X (1, 3, 11, 13) with a 3×5 window, stride 1 → Y (1, 3, 9, 9): K = 15, |Y| = 243
K = 3 * 5
NY_POOL = 1 * 3 * 9 * 9


def test_max_pool():
    m = single("MaxPool", {"x": (1, 3, 11, 13)}, kernel_shape=[3, 5])
    assert flopcount.count(m, convention="aiperf").total.flops == (K - 1) * CMP * NY_POOL
    assert flopcount.count(m).total.flops == K * NY_POOL


def test_average_pool():
    m = single("AveragePool", {"x": (1, 3, 11, 13)}, kernel_shape=[3, 5])
    assert flopcount.count(m, convention="aiperf").total.flops == ((K - 1) * ADD + DIV) * NY_POOL
    assert flopcount.count(m).total.flops == K * NY_POOL


def test_global_average_pool():
    # each of N·C = 15 outputs sums 7·9 = 63 elements (62 adds) and divides once
    m = single("GlobalAveragePool", {"x": X4})
    assert flopcount.count(m, convention="aiperf").total.flops == 15 * (62 * ADD + DIV)
    assert flopcount.count(m).total.flops == NX4


def test_reduce_mean():
    # X (3, 5, 7) over axis 1 → Y (3, 1, 7): |X| − |Y| adds, |Y| divisions
    m = single("ReduceMean", {"x": X}, [const("axes", [1])], opset=18)
    ny = 3 * 7
    assert flopcount.count(m, convention="aiperf").total.flops == (NX - ny) * ADD + ny * DIV
    assert flopcount.count(m).total.flops == NX


def test_conv_matmul_gemm_unchanged():
    # products: 2 per MAC under both; a bias add weighs 1
    conv = single("Conv", {"x": (1, 3, 11, 13)}, [weight("w", (7, 3, 3, 5)), weight("b", (7,))])
    y = 1 * 7 * 9 * 9
    conv_flops = MAC * y * 3 * 3 * 5 + y * ADD
    matmul = single("MatMul", {"a": (5, 7, 37), "b": (37, 23)})
    gemm = single("Gemm", {"a": (7, 37)}, [weight("w", (37, 23)), weight("c", (23,))])
    for m, flops in ((conv, conv_flops), (matmul, MAC * 5 * 7 * 37 * 23), (gemm, MAC * 7 * 37 * 23 + 7 * 23)):
        assert flopcount.count(m, convention="aiperf").total.flops == flops
        assert flopcount.count(m).total.flops == flops


def test_lstm_gates():
    # S = 3 steps, B = 5, I = 7, H = 9: gate products 2·S·B·4H·(I + H); per hidden unit and step
    # 3 sigmoids, 2 tanh, the cell update (2 mul, 1 add) and the output (1 mul)
    s, b, i, h = 3, 5, 7, 9
    m = single("LSTM", {"x": (s, b, i)}, [weight("W", (1, 4 * h, i)), weight("R", (1, 4 * h, h))],
               n_outputs=2, hidden_size=h)
    units = s * b * h
    sigmoid, tanh = EXP + ADD + DIV, MUL + EXP + 2 * ADD + DIV
    expected = MAC * s * b * 4 * h * (i + h) + units * (3 * sigmoid + 2 * tanh + 3 * MUL + ADD)
    assert flopcount.count(m, convention="aiperf").total.flops == expected
    assert flopcount.count(m).total.flops == MAC * s * b * 4 * h * (i + h) + units * 9


def test_attention_softmax_and_scaling():
    # 4-D ONNX Attention: B = 3, H = 5, S_q = 7, S_kv = 11, E = 13: R = 105 score rows of T = 11;
    # √scale on Q and K (multiplies), softmax 15T − 2 per row, products 2 per MAC
    b, h, s_q, t, e = 3, 5, 7, 11, 13
    m = single("Attention", {"q": (b, h, s_q, e), "k": (b, h, t, e), "v": (b, h, t, e)}, opset=23)
    rows = b * h * s_q
    expected = MAC * rows * t * 2 * e + MUL * (rows * e + b * h * t * e) + rows * (15 * t - 2)
    assert flopcount.count(m, convention="aiperf").total.flops == expected


def test_weighted_helper():
    flat, aiperf = CONVENTIONS["default"], CONVENTIONS["aiperf"]
    counts = {"add": 3, "mul": 5, "cmp": 7, "div": 11, "sqrt": 13, "exp": 17, "log": 19}
    assert flat.weighted(**counts).flops == sum(counts.values())
    assert aiperf.weighted(**counts).flops == 3 * ADD + 5 * MUL + 7 * CMP + 11 * DIV + 13 * SQRT + 17 * EXP + 19 * LOG
    assert aiperf.weighted(**counts).transcendentals == 13 + 17 + 19
    assert AIPERF_WEIGHTS == {"mac": MAC, "add": ADD, "mul": MUL, "cmp": CMP, "div": DIV, "sqrt": SQRT,
                              "exp": EXP, "log": LOG}
    assert doctest.testmod(flopcount.conventions).failed == 0


def test_weights_are_validated():
    with pytest.raises(ValueError, match="must price exactly"):
        Convention("x", "", weights={"add": 1})
    with pytest.raises(ValueError, match="must equal weights"):
        Convention("x", "", weights={**AIPERF_WEIGHTS, "mac": 1})


def test_cli_convention_aiperf(capsys, save):
    path = save(single("Softmax", {"x": X}, opset=13))
    assert main([path, "--convention", "aiperf", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["convention"]["name"] == "aiperf" and doc["total"]["flops"] == R * (15 * N_ROW - 2)
    assert main(["--help"]) == 0
    assert "aiperf" in capsys.readouterr().out.split("--convention", 1)[1].split("--", 1)[0]


def test_resnet50_aiperf():
    # the architecture's closed forms (tests/acceptance/test_resnet50.py); BN channels: stem 64, per bottleneck
    # w + w + 4w, per projection shortcut 4w
    from helpers import RESNET50_ONNX as BUNDLED
    from helpers import RESNET50_STAGES as STAGES
    from helpers import resnet50_architecture as architecture

    a = architecture()
    bn_channels = 64 + sum(blocks * 6 * w + 4 * w for blocks, w, _ in STAGES)
    gap_outputs = 2048
    expected = (
        MAC * (sum(a["conv_macs"]) + a["fc_macs"]) + 1000 * ADD  # products, the FC bias
        + a["bn"] * (2 * ADD + 2 * MUL) + bn_channels * (ADD + SQRT + DIV)  # batch norms
        + a["relu"] * CMP + a["add"] * ADD  # ReLUs, residual adds
        + (9 - 1) * CMP * a["maxpool_out"]  # max pool 3×3
        + (a["gap_in"] - gap_outputs) * ADD + gap_outputs * DIV  # global average pool
    )
    r = flopcount.count(BUNDLED, convention="aiperf")
    assert r.total.flops == expected
    assert r.total.transcendentals == bn_channels
