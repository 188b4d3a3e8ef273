"""Training FLOPs (mode="train"): per-op backward formulas over the static graph."""

import json

import onnx
import pytest
from helpers import model, single, weight
from onnx import helper

import flopcount

N = helper.make_node


def conv_stack():
    # x[2, 3, 9, 9] → conv1 W1[8, 3, 3, 3] (first layer: data needs no gradient) → Relu
    #               → conv2 W2[12, 4, 3, 3] group 2 (inner layer) ; valid padding
    nodes = [N("Conv", ["x", "W1"], ["a"], name="conv1"), N("Relu", ["a"], ["r"], name="relu"),
             N("Conv", ["r", "W2"], ["y"], group=2, name="conv2")]
    return model(nodes, {"x": (2, 3, 9, 9)}, ["y"], [weight("W1", (8, 3, 3, 3)), weight("W2", (12, 4, 3, 3))])


CONV1_MACS = 2 * 8 * 7 * 7 * 3 * 9  # N·C_out·H·W·C_in·K
CONV2_MACS = 2 * 12 * 5 * 5 * 4 * 9  # grouped: C_in/G = 4, from W's shape
RELU = 2 * 8 * 7 * 7


def test_first_layer_has_no_input_gradient_inner_layer_has_both():
    r = flopcount.count(conv_stack(), mode="train")
    by = {n.name: n for n in r.nodes}
    assert by["conv1"].backward.macs == CONV1_MACS  # dW only
    assert by["conv2"].backward.macs == 2 * CONV2_MACS  # dX and dW, grouped conv not overcounted
    assert by["relu"].backward.flops == RELU  # dY masked
    assert r.forward.flops == 2 * CONV1_MACS + RELU + 2 * CONV2_MACS
    assert r.backward.flops == 2 * CONV1_MACS + RELU + 4 * CONV2_MACS
    assert r.total.flops == r.forward.flops + r.backward.flops
    assert r.trainable_params == 8 * 3 * 9 + 12 * 4 * 9


def test_inference_mode_has_no_backward():
    r = flopcount.count(conv_stack())
    assert r.mode == "inference" and r.backward.flops == 0 and r.total == r.forward


def test_matmul_gradients_only_where_needed():
    # y = x @ W: x is data (no gradient), W trainable: dW = xᵀ·dY only
    r = flopcount.count(single("MatMul", {"x": (5, 7)}, [weight("W", (7, 11))]), mode="train")
    assert r.backward.macs == 5 * 7 * 11
    # h = x @ W1; y = h @ W2: the second product needs dh and dW2
    m = model([N("MatMul", ["x", "W1"], ["h"]), N("MatMul", ["h", "W2"], ["y"])], {"x": (5, 7)}, ["y"],
              [weight("W1", (7, 11)), weight("W2", (11, 3))])
    r = flopcount.count(m, mode="train")
    assert r.backward.macs == 5 * 7 * 11 + 2 * 5 * 11 * 3


def test_batchnorm_running_statistics_are_not_trained():
    m = single("BatchNormalization", {"x": (2, 5, 7, 7)}, [weight(p, (5,)) for p in ("scale", "B", "mean", "var")])
    r = flopcount.count(m, mode="train")
    assert r.trainable_params == 5 + 5  # scale and B; mean and var are buffers
    # X is data: only dγ = Σ dY·x̂ (2 per element) and dβ = Σ dY (1 per element)
    assert r.backward.flops == 3 * 2 * 5 * 7 * 7


def test_broadcast_add_sums_gradient_back():
    # y = x·W + b with b[11] broadcast over 5 rows: db = Σ dY over rows: 5·11 − 11 additions
    m = model([N("MatMul", ["x", "W"], ["h"]), N("Add", ["h", "b"], ["y"])], {"x": (5, 7)}, ["y"],
              [weight("W", (7, 11)), weight("b", (11,))])
    r = flopcount.count(m, mode="train")
    add = next(n for n in r.nodes if n.op_type == "Add")
    assert add.backward.flops == (5 * 11 - 5 * 11) + (5 * 11 - 11)  # dh = dY (free), db reduces


def test_operator_without_backward_formula_is_reported(save):
    # ai.onnx.ml's LinearRegressor has a forward formula but no backward: listed, fatal with strict
    m = model([N("MatMul", ["x", "W"], ["h"]),
               N("LinearRegressor", ["h"], ["y"], domain="ai.onnx.ml", coefficients=[0.5] * 6, targets=1)],
              {"x": (3, 4)}, ["y"], [weight("W", (4, 6))], extra_opsets={"ai.onnx.ml": 3})
    r = flopcount.count(m, mode="train")
    assert r.backward_unsupported == {"ai.onnx.ml:LinearRegressor": 1}
    with pytest.raises(flopcount.UnsupportedOperatorError):
        flopcount.count(m, mode="train", strict=True)


def test_nodes_with_integer_outputs_pass_no_gradient():
    # ArgMax and NonMaxSuppression read a tensor that needs a gradient, but their outputs are integers:
    # no gradient flows back through them, so they need no backward formula
    from helpers import const
    import numpy as np

    nodes = [N("MatMul", ["x", "W"], ["h"]), N("ArgMax", ["h"], ["a"], axis=1),
             N("Reshape", ["h", "box_shape"], ["boxes"]), N("ReduceMax", ["boxes", "last"], ["s"], keepdims=0),
             N("Reshape", ["s", "score_shape"], ["scores"]), N("NonMaxSuppression", ["boxes", "scores"], ["keep"])]
    inits = [weight("W", (4, 8)), const("box_shape", [1, 6, 4]), const("last", [2]), const("score_shape", [1, 1, 6])]
    r = flopcount.count(model(nodes, {"x": (3, 4)}, ["a", "keep"], inits), mode="train")
    assert not r.backward_unsupported
    assert all(n.backward == flopcount.Cost() for n in r.nodes if n.op_type in ("ArgMax", "NonMaxSuppression"))


@pytest.mark.parametrize("optimizer, per_param", [("sgd", 2), ("momentum", 4), ("adam", 14)])
def test_optimizer_step_reported_apart(optimizer, per_param):
    r = flopcount.count(conv_stack(), mode="train", optimizer=optimizer)
    name, cost = r.optimizer
    assert name == optimizer and cost.flops == per_param * (8 * 3 * 9 + 12 * 4 * 9)
    assert r.total.flops == 2 * CONV1_MACS + RELU + 2 * CONV2_MACS + 2 * CONV1_MACS + RELU + 4 * CONV2_MACS


def test_cli_train_json(capsys, save):
    from flopcount.cli import main

    assert main([save(conv_stack()), "--mode", "train", "--optimizer", "sgd", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "train"
    assert doc["forward"]["flops"] == 2 * CONV1_MACS + RELU + 2 * CONV2_MACS
    assert doc["backward"]["flops"] == 2 * CONV1_MACS + RELU + 4 * CONV2_MACS
    assert doc["training"]["trainable_params"] == 8 * 3 * 9 + 12 * 4 * 9
    assert doc["training"]["three_times_forward_flops"] == 3 * doc["forward"]["flops"]
    assert doc["training"]["optimizer"]["flops"] == 2 * doc["training"]["trainable_params"]
    assert doc["per_sample"]["flops"] == (doc["forward"]["flops"] + doc["backward"]["flops"]) // 2


def test_optimizer_needs_train_mode():
    with pytest.raises(flopcount.UsageError):
        flopcount.count(conv_stack(), optimizer="adam")


@pytest.mark.parametrize("op, opset, extra", [
    pytest.param("Upsample", 9, [], id="upsample-9"),
    pytest.param("Resize", 10, [], id="resize-10"),
    pytest.param("Resize", 11, ["roi"], id="resize-11"),
])
def test_resize_scales_are_not_trained_where_the_schema_leaves_them_unknown(op, opset, extra):
    # conv W[5, 3, 1, 1] (15 trainable) → Resize by 2 with a float scales initializer: never a parameter
    from helpers import const
    import numpy as np

    inits = [weight("W", (5, 3, 1, 1)), const("scales", [1, 1, 2, 2], dtype=np.float32)]
    if extra:
        inits.insert(1, const("roi", [], dtype=np.float32))
    resize_inputs = ["c", *extra, "scales"]
    nodes = [N("Conv", ["x", "W"], ["c"], name="conv"), N(op, resize_inputs, ["y"], name="resize")]
    r = flopcount.count(model(nodes, {"x": (1, 3, 4, 4)}, ["y"], inits, opset=opset), mode="train")
    assert r.trainable_params == 5 * 3


def test_roi_coordinates_are_not_trained():
    from helpers import const
    import numpy as np

    inits = [weight("W", (4, 3, 1, 1)), const("rois", [[0, 0, 3, 3]], dtype=np.float32), const("idx", [0])]
    nodes = [N("Conv", ["x", "W"], ["c"], name="conv"),
             N("RoiAlign", ["c", "rois", "idx"], ["y"], name="align", output_height=2, output_width=2)]
    r = flopcount.count(model(nodes, {"x": (1, 3, 5, 5)}, ["y"], inits, opset=16), mode="train")
    assert r.trainable_params == 4 * 3


def test_fake_quantization_passes_the_gradient_straight_through():
    # quantization-aware training: W[6, 3, 3, 3] → QuantizeLinear → DequantizeLinear → Conv on data x[2, 3, 7, 7]
    from helpers import const
    import numpy as np

    inits = [weight("W", (6, 3, 3, 3)), const("s", 0.1, dtype=np.float32), const("z", 0, dtype=np.int8)]
    nodes = [N("QuantizeLinear", ["W", "s", "z"], ["wq"], name="q"), N("DequantizeLinear", ["wq", "s", "z"], ["wd"], name="dq"),
             N("Conv", ["x", "wd"], ["y"], name="conv")]
    r = flopcount.count(model(nodes, {"x": (2, 3, 7, 7)}, ["y"], inits), mode="train")
    by = {n.name: n for n in r.nodes}
    w = 6 * 3 * 3 * 3
    assert r.trainable_params == w and not r.backward_unsupported
    assert by["conv"].backward.macs == 2 * 6 * 5 * 5 * 3 * 9  # dW only: x is data
    assert (by["q"].backward.flops, by["dq"].backward.flops) == (w, w)  # masked select; × scale


def test_bernoulli_draw_has_an_explicit_zero_gradient():
    # probabilities p = Sigmoid(x @ W) drawn: the draw passes no gradient, and says so (not unsupported)
    nodes = [N("MatMul", ["x", "W"], ["h"]), N("Sigmoid", ["h"], ["p"]), N("Bernoulli", ["p"], ["d"], name="draw")]
    r = flopcount.count(model(nodes, {"x": (3, 4)}, ["d"], [weight("W", (4, 5))]), mode="train")
    assert not r.backward_unsupported
    assert next(n for n in r.nodes if n.name == "draw").backward == flopcount.Cost()


def test_weights_read_inside_a_loop_body_are_trained():
    # the body multiplies the carried state by W[6, 6], read from the outer scope (not a Loop input);
    # the carried state starts from data. W is trained through the Loop.
    from helpers import const
    from onnx import TensorProto

    body = helper.make_graph(
        [N("MatMul", ["h_in", "W"], ["h_out"]), N("Identity", ["c_in"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [3, 6])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [3, 6])],
    )
    m = model([N("Loop", ["M", "", "x"], ["h"], body=body, name="loop")], {"x": (3, 6)}, ["h"],
              [weight("W", (6, 6)), const("M", 4)])
    r = flopcount.count(m, mode="train")
    assert r.trainable_params == 6 * 6 and not r.backward_unsupported
    mm = 3 * 6 * 6  # MACs of h @ W
    # iteration 1: dW only (h starts from data); iterations 2-4: dh and dW
    assert next(n for n in r.nodes if n.name == "loop").backward.flops == 2 * mm + 3 * 4 * mm


def test_flex_attention_backward_is_attentions():
    # Q[2, 4, 3, 5], K[2, 2, 7, 5], V[2, 2, 7, 6] all trained (GQA: 4 query heads on 2 KV heads)
    b, h_q, h_kv, l, s, e, e_v = 2, 4, 2, 3, 7, 5, 6
    inits = [weight("Q", (b, h_q, l, e)), weight("K", (b, h_kv, s, e)), weight("V", (b, h_kv, s, e_v))]
    nodes = [helper.make_node("FlexAttention", ["Q", "K", "V"], ["y"], domain="ai.onnx.preview", name="flex")]
    m = model(nodes, {}, ["y"], inits, extra_opsets={"ai.onnx.preview": 1})
    r = flopcount.count(m, mode="train")
    rows = b * h_q * l
    macs = rows * s * (2 * e_v + 2 * e)  # dV, dP, dQ, dK
    assert r.nodes[0].backward.macs == macs
    assert r.nodes[0].backward.flops == 2 * macs + rows * (4 * s - 1) + rows * e + b * h_kv * s * e


def test_range_backward():
    # y_i = start + i·delta, 4 elements (1, 3, 5, 7): d start = Σ dY (3 adds), d delta = Σ i·dY (4 + 3)
    from helpers import direct_backward

    scalars = [("start", ()), ("limit", ()), ("delta", ())]
    assert direct_backward("Range", scalars, [(4,)], (True, True, True), 11).flops == 3 + 7
    assert direct_backward("Range", scalars, [(4,)], (False, True, False), 11).flops == 0


def test_given_input_values_are_not_trained():
    # Range's float start/limit/delta given with --input-value are constants, not weights
    nodes = [N("Range", ["start", "limit", "delta"], ["r"]), N("Mul", ["r", "W"], ["y"])]
    m = model(nodes, {"start": (), "limit": (), "delta": ()}, ["y"], [weight("W", (4,))])
    r = flopcount.count(m, mode="train", input_values={"start": 1.0, "limit": 8.0, "delta": 2.0})
    assert r.trainable_params == 4 and r.params == 4
    assert next(n for n in r.nodes if n.op_type == "Range").backward == flopcount.Cost()


def test_dynamic_quantization_passes_the_gradient_straight_through():
    # x @ W[4, 6] → DynamicQuantizeLinear → DequantizeLinear → Relu: dX of the quantization is |X| (STE)
    nodes = [N("MatMul", ["x", "W"], ["h"]), N("DynamicQuantizeLinear", ["h"], ["q", "scale", "zero"], name="dq8"),
             N("DequantizeLinear", ["q", "scale", "zero"], ["d"], name="deq"), N("Relu", ["d"], ["y"])]
    r = flopcount.count(model(nodes, {"x": (3, 4)}, ["y"], [weight("W", (4, 6))]), mode="train")
    by = {n.name: n for n in r.nodes}
    assert not r.backward_unsupported
    assert by["dq8"].backward.flops == 3 * 6 and by["deq"].backward.flops == 3 * 6


def test_sequence_map_backward_per_element():
    # SequenceMap over a sequence of 5 elements x_i[3, 4] (data), body x_i @ W[4, 2] with W captured:
    # per element dW = 2·3·4·2
    body = helper.make_graph(
        [N("MatMul", ["e", "W"], ["o"])], "body",
        [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, [3, 2])],
    )
    nodes = [N("SplitToSequence", ["x"], ["seq"], axis=0, keepdims=0),
             N("SequenceMap", ["seq"], ["out"], body=body, name="map")]
    m = model(nodes, {"x": (5, 3, 4)}, ["out"], [weight("W", (4, 2))])
    r = flopcount.count(m, mode="train", loop_trips={"map": 5})
    assert next(n for n in r.nodes if n.name == "map").backward.flops == 5 * 2 * 3 * 4 * 2
    assert not r.backward_unsupported and r.trainable_params == 8
