"""Saved-for-backward rules (flopcount.saved, registered with registry.saves beside the backward formulas): what
each operator's backward keeps, in bytes, on one-node graphs whose inputs need a gradient."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import flopcount
import flopcount.operators  # noqa: F401  (fills the registry)
from flopcount.errors import RegistryError
from flopcount.registry import BACKWARD, SAVED, saves
from flopcount.saved import Saved
from helpers import const, shifted_op_model, weight

F32 = 4
N, C, HW = 3, 5, 6  # distinct sizes, so that a swapped dim cannot pass
X = F32 * N * C * HW * HW


def kept(m) -> tuple[int, int]:
    """(activations, of which statistics) of a training count of ``m``, with no rule missing."""
    report = flopcount.count(m, mode="train", memory=True)
    assert not report.memory.missing
    (r,) = report.memory.ranks
    return r.activations_bytes, r.statistics_bytes


def x_model(op, n_outputs=1, consts=(), params=(), opset=18, extra=(), **attrs):
    return shifted_op_model(op, ["x", *extra], {"x": [N, C, HW, HW]}, params=params, consts=consts,
                            learned=["x"], opset=opset, n_outputs=n_outputs, **attrs)


@pytest.mark.parametrize("op, expected", [
    pytest.param("Relu", X, id="Relu keeps Y"),
    pytest.param("Sigmoid", X, id="Sigmoid keeps Y"),
    pytest.param("Tanh", X, id="Tanh keeps Y"),
    pytest.param("Exp", X, id="Exp keeps Y"),
    pytest.param("Softplus", X, id="Softplus keeps X"),
    pytest.param("Neg", 0, id="Neg keeps nothing"),
    pytest.param("Flatten", 0, id="Flatten keeps nothing"),
    pytest.param("GlobalAveragePool", X, id="GlobalAveragePool keeps X"),
    pytest.param("ReduceSumSquare", X, id="ReduceSumSquare keeps X"),
])
def test_one_input_ops(op, expected):
    assert kept(x_model(op)) == (expected, 0)


def test_gelu_keeps_its_input():
    assert kept(x_model("Gelu", opset=20)) == (X, 0)


def test_add_keeps_nothing_and_mul_keeps_each_factor_for_the_other():
    both = shifted_op_model("Mul", ["a", "b"], {"a": [N, C], "b": [N, C]}, learned=["a", "b"])
    one = shifted_op_model("Mul", ["a", "b"], {"a": [N, C], "b": [N, C]}, learned=["a"])
    add = shifted_op_model("Add", ["a", "b"], {"a": [N, C], "b": [N, C]}, learned=["a", "b"])
    assert kept(both) == (2 * F32 * N * C, 0)
    assert kept(one) == (F32 * N * C, 0)  # b, for dA = dY·b; a is kept only for dB, which nothing needs
    assert kept(add) == (0, 0)


def test_softmax_keeps_its_output():
    """x·W then Softmax (a shift added before a Softmax would be taken for a mask, not a weight): MatMul keeps x for
    dW, Softmax its output."""
    from onnx import helper

    from helpers import model

    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    m = model(nodes, {"x": [N, 7]}, ["y"], [weight("w", (7, 11))])
    assert kept(m) == (F32 * N * 7 + F32 * N * 11, 0)


def test_max_pool_keeps_x_and_int64_indices():
    out = N * C * (HW // 2) ** 2
    assert kept(x_model("MaxPool", kernel_shape=[2, 2], strides=[2, 2])) == (X + 8 * out, 8 * out)


def test_batch_norm_keeps_x_and_per_channel_float32_statistics():
    params = [weight("scale", (C,)), weight("bias", (C,)), weight("mean", (C,)), weight("var", (C,))]
    m = x_model("BatchNormalization", params=params, extra=["scale", "bias", "mean", "var"], n_outputs=1)
    assert kept(m) == (X + 2 * 4 * C, 2 * 4 * C)


def test_conv_keeps_x():
    m = x_model("Conv", params=[weight("w", (7, C, 3, 3))], extra=["w"], pads=[1, 1, 1, 1])
    assert kept(m) == (X, 0)


def test_embedding_keeps_its_indices():
    m = shifted_op_model("Gather", ["table", "ids"], {"ids": [N, 11]}, params=[weight("table", (13, 17))])
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    assert kept(m) == (8 * N * 11, 0)


def test_softmax_cross_entropy_keeps_the_log_probabilities_and_labels():
    m = shifted_op_model("SoftmaxCrossEntropyLoss", ["scores", "labels"], {"scores": [N, 7], "labels": [N]},
                         learned=["scores"])
    m.graph.input[1].type.tensor_type.elem_type = TensorProto.INT64
    assert kept(m) == (F32 * N * 7 + 8 * N, F32 * N * 7)


def test_dropout_of_ratio_zero_keeps_nothing():
    consts = [const("ratio", 0.0, np.float32), const("train", True, np.bool_)]
    assert kept(x_model("Dropout", consts=consts, extra=["ratio", "train"])) == (0, 0)
    consts = [const("ratio", 0.25, np.float32), const("train", True, np.bool_)]
    assert kept(x_model("Dropout", consts=consts, extra=["ratio", "train"])) == (X // 4, X // 4)


def test_mean_variance_normalization_keeps_x_and_two_float32_statistics_each():
    assert kept(x_model("MeanVarianceNormalization")) == (X + 2 * 4 * C, 2 * 4 * C)  # axes [0, 2, 3]: per channel
    assert kept(x_model("MeanVarianceNormalization", axes=[2, 3])) == (X + 2 * 4 * N * C, 2 * 4 * N * C)


def test_grid_sample_keeps_x_and_the_grid():
    m = shifted_op_model("GridSample", ["x", "grid"], {"x": [N, C, HW, HW], "grid": [N, 4, 4, 2]}, learned=["x"],
                         opset=20)
    assert kept(m) == (X + F32 * N * 4 * 4 * 2, 0)


def test_affine_grid_col2im_and_bernoulli_keep_nothing():
    size = const("size", np.array([N, C, HW, HW], np.int64))
    theta = shifted_op_model("AffineGrid", ["theta", "size"], {"theta": [N, 2, 3]}, consts=[size], learned=["theta"],
                             opset=20)
    image, block = const("image", np.array([HW, HW], np.int64)), const("block", np.array([2, 2], np.int64))
    cols = shifted_op_model("Col2Im", ["cols", "image", "block"], {"cols": [N, C * 4, (HW - 1) ** 2]},
                            consts=[image, block], learned=["cols"])
    p = shifted_op_model("Bernoulli", ["p"], {"p": [N, C]}, learned=["p"])
    assert kept(theta) == kept(cols) == kept(p) == (0, 0)


def test_det_keeps_a_its_determinant_the_lu_factors_and_int32_pivots():
    b, m = 4, 5
    model = shifted_op_model("Det", ["a"], {"a": [b, m, m]}, learned=["a"])
    lu, pivots = F32 * b * m * m, 4 * b * m
    assert kept(model) == (F32 * b * m * m + F32 * b + lu + pivots, lu + pivots)


def test_dft_keeps_a_real_signal_and_nothing_of_a_complex_one():
    """ONNX's schema marks DFT's input not differentiable, so no count runs its backward: the rule is read directly
    (it holds for a graph whose DFT is trained all the same, as torch trains its FFTs)."""
    from flopcount.registry import lookup_saved

    class Shapes:  # the one thing the rule reads of its node
        def __init__(self, shape):
            self.shape = lambda i: shape

    rule = lookup_saved("", "DFT")
    assert rule(Shapes((N, 16, 1))) == Saved(inputs=(0,))  # F32·N·16 bytes: torch's r2c FFT keeps its input
    assert rule(Shapes((N, 16, 2))) == Saved()


def _torch_saved(fn, *shapes, dtype=None) -> int:
    """Bytes of the unique storages torch's autograd keeps for ``fn`` on new inputs of ``shapes`` that need a
    gradient (inputs included: in the graphs above they are activations)."""
    torch = pytest.importorskip("torch")
    inputs = [torch.randn(*s, dtype=dtype or torch.float32, requires_grad=True) for s in shapes]
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


def test_the_new_rules_equal_what_torch_keeps():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    grid = torch.rand(N, 4, 4, 2) * 2 - 1  # not trained (a graph input above), kept all the same
    size = const("size", np.array([N, C, HW, HW], np.int64))
    image, block = const("image", np.array([HW, HW], np.int64)), const("block", np.array([2, 2], np.int64))
    pairs = [
        (x_model("MeanVarianceNormalization"),
         _torch_saved(lambda x: F.batch_norm(x, None, None, training=True), (N, C, HW, HW))),
        (x_model("MeanVarianceNormalization", axes=[2, 3]), _torch_saved(F.instance_norm, (N, C, HW, HW))),
        (shifted_op_model("GridSample", ["x", "grid"], {"x": [N, C, HW, HW], "grid": [N, 4, 4, 2]}, learned=["x"],
                          opset=20),
         _torch_saved(lambda x: F.grid_sample(x, grid, align_corners=False), (N, C, HW, HW))),
        (shifted_op_model("AffineGrid", ["theta", "size"], {"theta": [N, 2, 3]}, consts=[size], learned=["theta"],
                          opset=20),
         _torch_saved(lambda t: F.affine_grid(t, (N, C, HW, HW), align_corners=False), (N, 2, 3))),
        (shifted_op_model("Col2Im", ["cols", "image", "block"], {"cols": [N, C * 4, (HW - 1) ** 2]},
                          consts=[image, block], learned=["cols"]),
         _torch_saved(lambda c: F.fold(c, (HW, HW), (2, 2)), (N, C * 4, (HW - 1) ** 2))),
        (shifted_op_model("Det", ["a"], {"a": [4, 5, 5]}, learned=["a"]), _torch_saved(torch.linalg.det, (4, 5, 5))),
    ]
    for m, theirs in pairs:
        assert kept(m)[0] == theirs, m.graph.node[-1].op_type
    assert _torch_saved(torch.fft.fft, (N, 16)) == F32 * N * 16  # the real signal, as the DFT rule keeps it
    assert _torch_saved(torch.fft.fft, (N, 16), dtype=torch.complex64) == 0


def test_fake_quantization_keeps_a_bool_mask_and_the_scale():
    """x → QuantizeLinear → DequantizeLinear (quantization-aware training): the straight-through mask as bools,
    one byte per element of x (the scale is a stored tensor, no activation)."""
    from onnx import helper

    from helpers import model

    nodes = [helper.make_node("Add", ["x", "x_shift"], ["x_t"]),
             helper.make_node("QuantizeLinear", ["x_t", "scale", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"])]
    inits = [weight("x_shift", (N, C)), const("scale", 0.1, np.float32), const("zp", 0, np.uint8)]
    assert kept(model(nodes, {"x": [N, C]}, ["y"], inits)) == (N * C, N * C)
    m = shifted_op_model("DynamicQuantizeLinear", ["x"], {"x": [N, C]}, learned=["x"], n_outputs=3)
    assert kept(m) == (N * C, N * C)


def test_roi_ops_keep_the_boxes_and_roi_pool_its_int32_argmax():
    rois = 7
    m = shifted_op_model("RoiAlign", ["x", "rois", "batch_indices"], {"x": (1, C, 11, 13), "rois": (rois, 4)},
                         consts=[const("batch_indices", [0] * rois)], learned=("x",), opset=22, output_height=3,
                         output_width=2)
    assert kept(m) == (F32 * rois * 4, 0)  # the boxes (the batch indices are a constant)
    m = shifted_op_model("MaxRoiPool", ["x", "rois"], {"x": (1, C, 11, 13), "rois": (rois, 5)}, learned=("x",),
                         pooled_shape=[3, 2])
    assert kept(m) == (F32 * rois * 5 + 4 * rois * C * 3 * 2, 4 * rois * C * 3 * 2)


def test_deform_conv_keeps_x_and_the_offsets():
    x, offsets = (1, 2, 5, 5), (1, 2 * 3 * 3, 3, 3)  # 3×3 kernel, no padding: 3×3 outputs, one offset group
    m = shifted_op_model("DeformConv", ["x", "w", "offset"], {"x": x, "offset": offsets},
                         params=[weight("w", (4, 2, 3, 3))], learned=("x",), opset=19, kernel_shape=[3, 3])
    assert kept(m) == (F32 * (2 * 25 + 18 * 9), 0)


def test_flex_attention_keeps_q_k_v_y_and_a_float32_log_sum_exp_per_row():
    from onnx import helper

    from helpers import model

    b, h, l, s, e = 2, 3, 5, 7, 4
    nodes = [helper.make_node("Add", ["q", "q_shift"], ["q_t"]),
             helper.make_node("FlexAttention", ["q_t", "k", "v"], ["y"], domain="ai.onnx.preview")]
    m = model(nodes, {"q": (b, h, l, e), "k": (b, h, s, e), "v": (b, h, s, e)}, ["y"],
              [weight("q_shift", (b, h, l, e))], opset=26, extra_opsets={"ai.onnx.preview": 1})
    rows = b * h * l
    assert kept(m) == (F32 * (rows * e + 2 * b * h * s * e + rows * e) + F32 * rows, F32 * rows)


def test_stft_under_the_schema_keeps_nothing():
    """Every STFT input is non-differentiable in the ONNX schema: no gradient reaches them, nothing is kept."""
    consts = [const("step", 4, np.int64), const("length", 8, np.int64)]
    m = shifted_op_model("STFT", ["x", "step", "", "length"], {"x": [2, 32, 1]}, consts=consts, learned=["x"],
                         opset=17)
    assert kept(m) == (0, 0)


def test_registering_a_rule_twice_raises():
    with pytest.raises(RegistryError, match="registered twice"):
        saves("Relu")(lambda ctx, **_: None)


#: Operators with a backward formula and no saved-for-backward rule yet: the ledger lists them (a lower bound).
NOT_YET: set[str] = set()


def test_inventory_every_backward_has_a_rule_or_is_listed():
    missing = {f"{d}:{o}" if d else o for d, o in BACKWARD if (d, o) not in SAVED}
    assert missing == NOT_YET
