"""RoiAlign (S bilinear samples per output) and NonMaxSuppression (an upper bound of greedy NMS)."""

import pytest
from helpers import const, model, op_backward, shifted_op_model, single
from onnx import TensorProto, helper

import flopcount


def _ceil(a, b):
    return -(-a // b)


ROI_ALIGN = [
    # id: X, R rois, output h × w, sampling_ratio, mode, S samples per output (derived here)
    pytest.param((2, 5, 13, 17), 3, (7, 9), 2, "avg", 2 * 2, id="ratio2-avg"),
    pytest.param((2, 5, 13, 17), 3, (7, 9), 3, "max", 3 * 3, id="ratio3-max"),
    pytest.param((2, 5, 29, 31), 11, (7, 5), 0, "avg", _ceil(29, 7) * _ceil(31, 5), id="adaptive-bound"),
]


@pytest.mark.parametrize("x, rois, out, ratio, mode, s", ROI_ALIGN)
def test_roi_align(x, rois, out, ratio, mode, s):
    h, w = out
    m = single("RoiAlign", {"x": x, "rois": (rois, 4)}, [const("batch_indices", [0] * rois)], opset=22,
               output_height=h, output_width=w, sampling_ratio=ratio, mode=mode)
    outputs = rois * x[1] * h * w
    combine = s if mode == "avg" else s - 1  # S − 1 adds + 1 division, or S − 1 maxes
    per_output = 7 * s + combine  # 4 weighted corners per sample: 4 multiplies + 3 adds/maxes
    sample_points = rois * h * w * s  # shared by the channels, 14 FLOPs each
    assert flopcount.count(m).total.flops == per_output * outputs + 14 * sample_points


def nms(b, n, c, max_out=None, score_threshold=False, center=0, max_out_is_input=False):
    names = ["boxes", "scores", "", "iou", "score" if score_threshold else ""]
    inits = [const("iou", [0.5], "float32")] + ([const("score", [0.1], "float32")] if score_threshold else [])
    inputs = {"boxes": (b, n, 4), "scores": (b, c, n)}
    if max_out is not None:
        names[2] = "max_out"
        inits.append(const("max_out", [max_out]))
    elif max_out_is_input:
        names[2] = "max_out"
    node = helper.make_node("NonMaxSuppression", [x for x in names], ["y"], center_point_box=center)
    m = model([node], inputs, ["y"], inits, opset=11)
    if max_out_is_input:
        m.graph.input.append(helper.make_tensor_value_info("max_out", TensorProto.INT64, [1]))
    return m


NMS = [
    # id: B, n boxes, C classes, M, score threshold?, center?, IoU tests per batch and class (derived here)
    pytest.param(3, 11, 5, 20, False, 0, 11 * 10 // 2, id="M-above-n-all-pairs"),
    pytest.param(3, 11, 5, 4, False, 0, (0 + 1 + 2 + 3) + 4 * (11 - 4), id="M-limits-comparisons"),
    pytest.param(2, 13, 7, 5, True, 0, (0 + 1 + 2 + 3 + 4) + 5 * (13 - 5), id="score-threshold"),
    pytest.param(2, 13, 7, 5, False, 1, (0 + 1 + 2 + 3 + 4) + 5 * (13 - 5), id="center-point-boxes"),
]


@pytest.mark.parametrize("b, n, c, m_out, threshold, center, ious", NMS)
def test_nms(b, n, c, m_out, threshold, center, ious):
    m = nms(b, n, c, m_out, threshold, center)
    per_box = (6 if center else 4) + 3
    sort = n * 4  # ⌈log2 11⌉ = ⌈log2 13⌉ = 4
    per_class = sort + (n if threshold else 0) + 13 * ious
    assert flopcount.count(m).total.flops == b * n * per_box + b * c * per_class


def test_nms_runtime_max_output_counts_all_pairs():
    m = nms(3, 11, 5, max_out_is_input=True)
    assert flopcount.count(m).total.flops == 3 * 11 * 7 + 3 * 5 * (11 * 4 + 13 * (11 * 10 // 2))


def test_nms_without_max_output_selects_nothing():
    assert flopcount.count(nms(3, 11, 5)).total.flops == 0


def test_non_max_suppression_is_reported_as_an_upper_bound():
    from helpers import model
    from onnx import helper

    from helpers import const

    m = model([helper.make_node("NonMaxSuppression", ["boxes", "scores", "m"], ["selected"])],
              {"boxes": (1, 6, 4), "scores": (1, 2, 6)}, ["selected"], [const("m", [3])])
    r = flopcount.count(m)
    assert "NonMaxSuppression" in r.upper_bounds


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): RoiAlign.
#
# Every expected value is a closed form written here from the sizes. To make an input need a gradient the
# graphs feed it through ``Add(x, shift)`` with a trainable ``shift``; an input fed straight from the graph
# inputs is data (no gradient, like a first layer's). Only the node under test (named "op") is asserted.
# Operators whose ONNX schema marks every input non-differentiable (AffineGrid, DFT, STFT) never get a gradient
# from a count; their formulas are also called directly on a hand-built context.
# -----------------------------------------------------------------------------------------------------------------


ROI = [
    # id: sampling_ratio, mode, S (derived here), FLOPs per output element
    pytest.param(2, "avg", 2 * 2, 8 * 4 + 1, id="ratio2-avg"),
    pytest.param(0, "avg", -(-11 // 3) * -(-13 // 2), 8 * 4 * 7 + 1, id="adaptive-avg"),
    pytest.param(3, "max", 3 * 3, 2, id="ratio3-max"),
]


@pytest.mark.parametrize("ratio, mode, s, per_output", ROI)
def test_roi_align_backward(ratio, mode, s, per_output):
    if ratio == 0:
        assert s == 4 * 7
    m = shifted_op_model("RoiAlign", ["x", "rois", "batch_indices"], {"x": (1, 5, 11, 13), "rois": (7, 4)},
                 consts=[const("batch_indices", [0] * 7)], learned=("x",), opset=22, output_height=3,
                 output_width=2, sampling_ratio=ratio, mode=mode)
    assert op_backward(m).flops == per_output * 7 * 5 * 3 * 2


def test_roi_align_rois_take_no_gradient():
    m = shifted_op_model("RoiAlign", ["x", "rois", "batch_indices"], {"x": (1, 5, 11, 13), "rois": (7, 4)},
                 consts=[const("batch_indices", [0] * 7)], learned=("rois",), opset=22, sampling_ratio=2)
    assert op_backward(m) == flopcount.Cost()
