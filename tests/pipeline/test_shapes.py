"""Shape resolution: overrides, run-time shape subgraphs, functions, external data never read."""

import numpy as np
import onnx
import pytest
from helpers import const, model, single, weight
from onnx import TensorProto, helper

import flopcount
from flopcount.pipeline.shapes import parse_dims

N = helper.make_node


def test_parse_dims():
    assert parse_dims("8x3x224x224") == (8, 3, 224, 224)
    assert parse_dims("8,3") == (8, 3)
    assert parse_dims("") == ()


def reshape_by_runtime_shape():
    # x[N, 3, 8, 8] → Reshape to [N, 192] with the target computed from Shape(x) → MatMul W[192, 10]
    nodes = [
        N("Shape", ["x"], ["s"]),
        N("Gather", ["s", "zero"], ["n"], axis=0),
        N("Unsqueeze", ["n", "axes0"], ["n1"]),
        N("Concat", ["n1", "minus1"], ["target"], axis=0),
        N("Reshape", ["x", "target"], ["flat"]),
        N("MatMul", ["flat", "W"], ["y"]),
    ]
    inits = [const("zero", 0), const("axes0", [0]), const("minus1", [-1]), weight("W", (192, 10))]
    return model(nodes, {"x": ("N", 3, 8, 8)}, ["y"], inits)


def test_dynamic_batch_fixed_by_batch_option():
    r = flopcount.count(reshape_by_runtime_shape(), batch=4)
    assert r.total.flops == 2 * 4 * 192 * 10
    assert r.batch == 4
    assert r.per_sample.flops == 2 * 192 * 10


def test_dynamic_batch_fixed_by_input_shape():
    r = flopcount.count(reshape_by_runtime_shape(), input_shapes={"x": (5, 3, 8, 8)})
    assert r.total.flops == 2 * 5 * 192 * 10 and r.batch == 5


def test_unresolved_dim_names_tensor_and_fix():
    with pytest.raises(flopcount.ShapeError) as e:
        flopcount.count(reshape_by_runtime_shape())
    msg = str(e.value)
    assert "'x'" in msg and "--input-shape x=Nx3x8x8" in msg and "--batch" in msg


def test_weights_made_by_constant_of_shape_and_heads_split_by_div():
    # W = ConstantOfShape([last dim of x, 12]); heads split: Reshape(h, [B, T, 3, Div(12, 3)])
    nodes = [
        N("Shape", ["x"], ["s"]),
        N("Slice", ["s", "m1", "big"], ["last"]),  # [D]
        N("Concat", ["last", "twelve"], ["wshape"], axis=0),
        N("ConstantOfShape", ["wshape"], ["W"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
        N("MatMul", ["x", "W"], ["h"]),
        N("Shape", ["h"], ["hs"]),
        N("Slice", ["hs", "zero1", "two"], ["bt"]),  # [B, T]
        N("Slice", ["hs", "m1", "big"], ["width"]),  # [12]
        N("Div", ["width", "three"], ["per_head"]),  # [4]
        N("Concat", ["bt", "three", "per_head"], ["target"], axis=0),
        N("Reshape", ["h", "target"], ["heads"]),
        N("Transpose", ["heads"], ["ht"], perm=[0, 2, 1, 3]),
        N("MatMul", ["ht", "htT"], ["scores"]),
        N("Transpose", ["ht"], ["htT"], perm=[0, 1, 3, 2]),
    ]
    nodes = nodes[:-2] + [nodes[-1], nodes[-2]]  # keep topological order
    inits = [const("m1", [-1]), const("big", [2**31]), const("twelve", [12]), const("zero1", [0]),
             const("two", [2]), const("three", [3])]
    m = model(nodes, {"x": (2, 5, 7)}, ["scores"], inits)
    r = flopcount.count(m)
    proj = 2 * (2 * 5) * 7 * 12  # [2,5,7] @ [7,12]
    scores = 2 * (2 * 3) * 5 * 4 * 5  # [2,3,5,4] @ [2,3,4,5]
    assert r.total.flops == proj + scores


def test_range_and_where_in_shape_subgraph():
    # target = Where(Equal(Range(0,2,1), 1), -1, Shape(x)[0:2]) → [B, -1]; then MatMul with W[6*5, 9]
    nodes = [
        N("Range", ["r0", "r2", "r1"], ["idx"]),
        N("Equal", ["idx", "r1v"], ["is1"]),
        N("Shape", ["x"], ["s"]),
        N("Slice", ["s", "zv", "twov"], ["s2"]),
        N("Where", ["is1", "m1", "s2"], ["target"]),
        N("Reshape", ["x", "target"], ["flat"]),
        N("MatMul", ["flat", "W"], ["y"]),
    ]
    inits = [const("r0", 0), const("r2", 2), const("r1", 1), const("r1v", [1]), const("zv", [0]), const("twov", [2]),
             const("m1", [-1]), weight("W", (30, 9))]
    r = flopcount.count(model(nodes, {"x": (4, 6, 5)}, ["y"], inits))
    assert r.total.flops == 2 * 4 * 30 * 9


def test_model_local_function_is_expanded():
    fn = helper.make_function(
        "local", "Linear", ["x", "w"], ["y"],
        [N("MatMul", ["x", "w"], ["t"]), N("Relu", ["t"], ["y"])],
        opset_imports=[helper.make_opsetid("", 18)],
    )
    nodes = [N("Linear", ["x", "W1"], ["h"], domain="local"), N("Linear", ["h", "W2"], ["y"], domain="local")]
    m = model(nodes, {"x": (3, 16)}, ["y"], [weight("W1", (16, 32)), weight("W2", (32, 8))],
              extra_opsets={"local": 1}, functions=[fn])
    r = flopcount.count(m)
    assert r.total.flops == (2 * 3 * 16 * 32 + 3 * 32) + (2 * 3 * 32 * 8 + 3 * 8)
    assert set(r.by_op_type) == {"MatMul", "Relu"}


def test_missing_external_data_and_over_2gb(save):
    # 3 weights of 24000 x 24000 float32 = 2.3 GB each, all in an absent external file
    d = 24000
    m = single("MatMul", {"x": (2, d)}, [weight("W", (d, d))])
    path = save(m)
    r = flopcount.count(path)
    assert r.total.flops == 2 * 2 * d * d
    assert r.params == d * d


def test_model_proto_passed_in_is_not_modified():
    m = single("MatMul", {"x": (2, 3)}, [onnx.numpy_helper.from_array(np.ones((3, 2000), np.float32), "W")])
    before = m.SerializeToString()
    assert flopcount.count(m).total.flops == 2 * 2 * 3 * 2000
    assert m.SerializeToString() == before


def test_inline_weights_not_needed_for_shapes(save):
    # Inline data is dropped before inference: the result is the same with data present or not
    w = onnx.numpy_helper.from_array(np.ones((64, 3, 3, 3), np.float32), "W")
    m = single("Conv", {"x": (1, 3, 10, 10)}, [w])
    assert flopcount.count(save(m)).total.macs == 64 * 8 * 8 * 27


def test_static_input_overridden_by_batch():
    m = single("MatMul", {"x": (1, 7)}, [weight("W", (7, 3))])
    r = flopcount.count(m, batch=8)
    assert r.total.flops == 8 * 2 * 7 * 3
    assert r.per_sample.flops == flopcount.count(m).per_sample.flops


def test_input_values_resolve_data_dependent_shapes(capsys, save):
    # ReduceSum over axes given as a graph input: only its value fixes Y's shape
    m = model([N("ReduceSum", ["x", "axes"], ["y"], keepdims=0), N("MatMul", ["y", "W"], ["z"])],
              {"x": (4, 6, 5), "axes": (1,)}, ["z"], [weight("W", (6, 3))])
    m.graph.input[1].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(flopcount.ShapeError):
        flopcount.count(m)
    r = flopcount.count(m, input_values={"axes": [2]})
    assert r.total.flops == (4 * 6 * 5 - 4 * 6) + 2 * 4 * 6 * 3
    assert r.params == 6 * 3
    from flopcount.cli import main

    assert main([save(m), "--input-value", "axes=2", "--format", "json"]) == 0
    assert '"flops": ' + str((4 * 6 * 5 - 4 * 6) + 2 * 4 * 6 * 3) in capsys.readouterr().out
    with pytest.raises(flopcount.UsageError):
        flopcount.count(m, input_values={"nope": [1]})


def contrib_chain(op, attrs):
    # x[4, 16] → com.microsoft op with W[16, 32] → Relu: the Relu's shapes depend on the contrib op's
    nodes = [N(op, ["x", "W"], ["y"], domain="com.microsoft", **attrs), N("Relu", ["y"], ["z"])]
    return model(nodes, {"x": (4, 16)}, ["z"], [weight("W", (16, 32))], extra_opsets={"com.microsoft": 1})


def test_fused_contrib_op_shapes_through_its_standard_twin():
    r = flopcount.count(contrib_chain("FusedMatMul", {"alpha": 1.0}))
    assert r.total.flops == 2 * 4 * 16 * 32 + 4 * 32  # the product, then Relu on [4, 32]


def test_contrib_op_shapes_from_onnxruntime_symbolic_inference(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)  # onnxruntime's own entry point would write a file here: ours must not
    # SkipLayerNormalization(x, skip, gamma, beta) → Relu
    nodes = [N("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y"], domain="com.microsoft"),
             N("Relu", ["y"], ["z"])]
    m = model(nodes, {"x": (2, 5, 8), "skip": (2, 5, 8)}, ["z"], [weight("gamma", (8,)), weight("beta", (8,))],
              extra_opsets={"com.microsoft": 1})
    r = flopcount.count(m)
    assert next(n for n in r.nodes if n.op_type == "Relu").cost.flops == 2 * 5 * 8
    assert list(tmp_path.iterdir()) == []
