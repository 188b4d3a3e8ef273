"""Hostile and invalid models: a clean one-line error with the right exit code, never a crash, a
negative dim, a wrong number or an opened file. Each case mutates one of a few small models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import onnx
import pytest
from helpers import const, model, single, weight
from onnx import TensorProto, helper

from flopcount.cli import main
from flopcount.errors import ShapeError
from flopcount.pipeline import shapes
from flopcount.pipeline.shapes import guarded

N = helper.make_node
F = TensorProto.FLOAT


def run(capsys, argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def check_error(capsys, argv, code, fragments):
    got, out, err = run(capsys, argv)
    assert got == code, err
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    if code == 2:  # argparse prints its usage lines first
        lines = lines[-1:]
    assert len(lines) == 1 and lines[0].startswith("flopcount: error: "), err
    for f in fragments:
        assert f in err, err
    return err


# --- the small models mutated below ---------------------------------------------------------------


def conv(group=1, w=(4, 3, 3, 3), x=(1, 3, 8, 8), **attrs):
    """x → Conv(W) → y, pads 1 unless told otherwise."""
    attrs.setdefault("pads", [1, 1, 1, 1])
    attrs = {k: v for k, v in attrs.items() if v is not None}
    return model([N("Conv", ["x", "W"], ["y"], name="conv", group=group, **attrs)], {"x": x}, ["y"], [weight("W", w)])


def pool(kernel, x=(1, 1, 4, 4), then=None, **attrs):
    """x → MaxPool(kernel) → p, and optionally one more node reading p."""
    nodes = [N("MaxPool", ["x"], ["p"], name="pool", kernel_shape=kernel, **attrs)]
    inits = []
    out = "p"
    if then == "slice":
        nodes.append(N("Slice", ["p", "st", "en", "ax"], ["y"], name="cut"))
        inits = [const("st", [1]), const("en", [3]), const("ax", [2])]
        out = "y"
    return model(nodes, {"x": x}, [out], inits)


def strided(side):
    """Two stride-2 convolutions (3x3, pads 1), then a fixed 7x7 AveragePool, as at the end of a
    ResNet: the feature map is ceil(side/4) wide, so the pool needs side >= 25 (25 → 13 → 7)."""
    nodes = [
        N("Conv", ["x", "W1"], ["a"], name="c1", strides=[2, 2], pads=[1, 1, 1, 1]),
        N("Conv", ["a", "W2"], ["b"], name="c2", strides=[2, 2], pads=[1, 1, 1, 1]),
        N("AveragePool", ["b"], ["y"], name="head", kernel_shape=[7, 7]),
    ]
    return model(nodes, {"x": (1, 3, side, side)}, ["y"], [weight("W1", (8, 3, 3, 3)), weight("W2", (8, 8, 3, 3))])


def reshape_to(target, op="Reshape"):
    if op == "ConstantOfShape":
        return model([N(op, ["s"], ["y"], name="fill")], {}, ["y"], [const("s", target)])
    return model([N(op, ["x", "s"], ["y"], name="shape_op")], {"x": (2, 6)}, ["y"], [const("s", target)])


def reshapes_sharing_target(target, second_x=(2, 7), **second_attrs):
    """Two Reshapes reading one target: the first of input 2x6, which fits it, the second of ``second_x``."""
    nodes = [N("Reshape", ["x", "s"], ["y"], name="fits"), N("Reshape", ["x2", "s"], ["y2"], name="second", **second_attrs)]
    return model(nodes, {"x": (2, 6), "x2": second_x}, ["y", "y2"], [const("s", target)])


def if_model(then_nodes, then_outputs):
    out = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info(o, F, None) for o in then_outputs])
    other = helper.make_graph([N("Neg", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, None)])
    node = N("If", ["c"], ["y"], name="branch", then_branch=out, else_branch=other)
    return model([node], {"x": (2, 3)}, ["y"], [const("c", True, dtype=bool)])


def loop_model(body_inputs):
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in body_inputs]
    body = helper.make_graph([N("Identity", ["c_in"], ["c_out"]), N("Relu", ["h_in"], ["h_out"])], "body", ins,
                             [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("h_out", F, [2, 4])])
    node = N("Loop", ["M", "", "h0"], ["h1"], name="loop", body=body)
    return model([node], {"h0": (2, 4)}, ["h1"], [const("M", 3)])


def with_opset(version):
    m = single("Relu", {"x": (2, 3)})
    m.opset_import[0].version = version
    return m


def with_opsets(*imports):
    """A Relu model importing the default domain at opset 18, then each (domain, version) of ``imports``."""
    m = single("Relu", {"x": (2, 3)})
    m.opset_import.extend(helper.make_opsetid(d, v) for d, v in imports)
    return m


def conv_bias(b, w=(4, 3, 3, 3), op="Conv", group=1):
    """x 1x3x8x8 → Conv(W, B) → y, pads 1."""
    node = N(op, ["x", "W", "B"], ["y"], name="conv", pads=[1, 1, 1, 1], group=group)
    return model([node], {"x": (1, 3, 8, 8)}, ["y"], [weight("W", w), weight("B", b)])


def window(op, kernel, strides, x=(1, 3, 4, 4), **attrs):
    """x → op (a 2-D window of side ``kernel``, stride ``strides``) → y; Conv gets a 4x3xKxK weight."""
    if op == "Conv":
        node = N(op, ["x", "W"], ["y"], name="win", strides=[strides] * 2, **attrs)
        return model([node], {"x": x}, ["y"], [weight("W", (4, 3, kernel, kernel))])
    return model([N(op, ["x"], ["y"], name="win", kernel_shape=[kernel] * 2, strides=[strides] * 2, **attrs)], {"x": x}, ["y"])


def mismatched(dims, values, where="initializer"):
    """Reshape(x 2x6, s) where the int64 tensor s declares ``dims`` but holds ``values``."""
    t = TensorProto(name="s", dims=list(dims), data_type=TensorProto.INT64)
    t.int64_data.extend(values)
    if where == "initializer":
        return model([N("Reshape", ["x", "s"], ["y"], name="shape_op")], {"x": (2, 6)}, ["y"], [t])
    nodes = [N("Constant", [], ["s"], name="const", value=t), N("Reshape", ["x", "s"], ["y"], name="shape_op")]
    return model(nodes, {"x": (2, 6)}, ["y"])


def with_value_info(dims):
    m = model([N("Relu", ["x"], ["r"], name="act"), N("Neg", ["r"], ["y"])], {"x": (2, 3)}, ["y"])
    m.graph.value_info.append(helper.make_tensor_value_info("r", F, dims))
    return m


def bad_utf8(field: bytes):
    data = single("Relu", {"x": (2, 3)}).SerializeToString()
    assert data.count(field) == 1
    return data.replace(field, field[:1] + b"\xff" + field[2:])


# --- the table ------------------------------------------------------------------------------------

INVALID = [
    # negative, empty or oversized inferred dims: exit 5, naming the node, its input and the cure
    pytest.param(pool([9, 9]), [], 5, ["node 'pool' (MaxPool)", "1x1x-4x-4", "'x' 1x1x4x4",  # 4 - 9 + 1 = -4
                                       "smallest input that works is --input-shape x=1x1x9x9"], id="pool-kernel-larger-than-input"),
    pytest.param(pool([9, 9], x=(1, 1, 8, 8)), [], 5, ["node 'pool'", "1x1x0x0", "empty window output",  # 8 - 9 + 1 = 0
                                                       "x=1x1x9x9"], id="pool-window-leaves-no-output"),
    pytest.param(pool([3, 3], pads=[0, 0, -4, -4]), [], 4, ["node 'pool'", "pads=[0, 0, -4, -4]", "negative"],
                 id="pool-negative-pads"),
    pytest.param(strided(16), [], 5, ["node 'head' (AveragePool)", "1x8x-2x-2", "'b' 1x8x4x4",  # 16 → 8 → 4; 4 - 7 + 1
                                      "smallest input that works is --input-shape x=1x3x25x25"], id="resnet-fixed-7x7-head-small-input"),
    pytest.param(strided(16), ["--input-shape", "x=1x3x25x25"], 0, [], id="resnet-fixed-7x7-head-at-the-smallest-input"),
    pytest.param(reshape_to([2**62, 2**62], "ConstantOfShape"), [], 5, ["node 'fill' (ConstantOfShape)", "more than 2**48 elements"],
                 id="dims-2-to-the-62"),
    pytest.param(with_value_info([2, -3]), [], 5, ["value_info of tensor 'r' declares dim 1 as -3"], id="declared-negative-dim"),
    # invalid attributes: exit 4 naming the node and the attribute
    pytest.param(single("AveragePool", {"x": (1, 1, 4, 4)}, kernel_shape=[-3, -3]), [], 4,
                 ["(AveragePool)", "kernel_shape=[-3, -3]", "zero or negative"], id="negative-kernel-shape"),
    pytest.param(conv(strides=[0, 0]), [], 4, ["node 'conv' (Conv)", "strides=[0, 0]"], id="conv-stride-zero"),
    pytest.param(conv(dilations=[1, -1]), [], 4, ["node 'conv'", "dilations=[1, -1]"], id="conv-negative-dilation"),
    pytest.param(conv(pads=[1, 1, 1]), [], 4, ["node 'conv'", "pads=[1, 1, 1]", "odd length"], id="conv-pads-odd-length"),
    pytest.param(conv(pads=[1, 1], kernel_shape=[3, 3]), [], 4, ["pads=[1, 1] has 2 values, but 4 are needed"], id="conv-pads-too-short"),
    pytest.param(conv(kernel_shape=[3, 3], strides=[1, 1, 1]), [], 4, ["strides=[1, 1, 1] has 3 values"], id="conv-strides-rank"),
    pytest.param(conv(auto_pad="SAME_UPPER"), [], 4, ["auto_pad='SAME_UPPER' and pads=[1, 1, 1, 1] are both given"],
                 id="conv-auto-pad-with-pads"),
    pytest.param(conv(auto_pad="WEIRD", pads=None), [], 4, ["auto_pad='WEIRD' is not one of NOTSET"], id="conv-unknown-auto-pad"),
    pytest.param(conv(group=0), [], 4, ["node 'conv'", "group=0"], id="conv-group-zero"),
    pytest.param(conv(group=-2), [], 4, ["node 'conv'", "group=-2"], id="conv-group-negative"),
    pytest.param(conv(group=2, w=(4, 1, 3, 3)), [], 4, ["node 'conv'", "group=2 do not fit", "(1 x 2 vs 3)"],  # 3 channels, 2 groups
                 id="conv-group-does-not-divide-channels"),
    pytest.param(conv(w=(4, 5, 3, 3)), [], 4, ["weight 'W' 4x5x3x3", "(5 x 1 vs 3)"], id="conv-weight-contradicts-input"),
    pytest.param(conv(kernel_shape=[5, 5]), [], 4, ["kernel_shape=[5, 5] contradicts weight 'W' 4x3x3x3"],
                 id="conv-kernel-shape-contradicts-weight"),
    pytest.param(conv(w=(4, 3, 3)), [], 4, ["weight 'W' is 4x3x3", "same rank"], id="conv-weight-rank"),
    # nodes alike are checked once: a second Conv with the same attributes is checked again on other shapes
    pytest.param(model([N("Conv", ["x", "W1"], ["a"], name="c1", pads=[1, 1, 1, 1]),
                        N("Conv", ["a", "W2"], ["y"], name="c2", pads=[1, 1, 1, 1])], {"x": (1, 3, 8, 8)}, ["y"],
                       [weight("W1", (4, 3, 3, 3)), weight("W2", (4, 5, 3, 3))]), [], 4,
                 ["node 'c2'", "weight 'W2' 4x5x3x3", "(5 x 1 vs 4)"], id="conv-alike-on-other-shapes"),
    pytest.param(conv(group="2"), [], 4, ["node 'conv'", "attribute 'group' is STRING, but the spec wants INT"], id="attribute-of-wrong-type"),
    pytest.param(single("LeakyRelu", {"x": (2, 3)}, alpha=[1.0, 2.0]), [], 4, ["attribute 'alpha' is FLOATS, but the spec wants FLOAT"],
                 id="zero-cost-op-attribute-of-wrong-type"),
    pytest.param(single("Relu", {"x": (2, 3)}, slope=2), [], 4, ["Unrecognized attribute: slope"], id="unknown-attribute"),
    pytest.param(single("Relu", {"x": (2, 3), "z": (2, 3)}), [], 4, ["input size 2 not in range"], id="too-many-inputs"),
    # bodies
    pytest.param(if_model([], []), [], 4, ["node 'branch' (If)", "then_branch has no outputs"], id="if-branch-without-outputs"),
    pytest.param(if_model([N("Neg", ["x"], ["t"])], ["nowhere"]), [], 4, ["output 'nowhere' of its then_branch is produced by no node"],
                 id="if-branch-output-without-producer"),
    pytest.param(if_model([N("Neg", ["x"], ["t"]), N("Neg", ["x"], ["u"])], ["t", "u"]), [], 4, ["then_branch has 2 outputs, but the node has 1"],
                 id="if-branch-output-count"),
    pytest.param(loop_model([("i", TensorProto.INT64, []), ("c_in", TensorProto.BOOL, []), ("h_in", F, [2, 4]),
                             ("extra", F, [2, 4])]), [], 4,
                 ["node 'loop' (Loop)", "its body has 4 inputs", "it needs 3 inputs"], id="loop-body-arity"),
    # negative shape targets
    pytest.param(reshape_to([-3, -4]), [], 4, ["node 'shape_op' (Reshape)", "[-3, -4]", "one -1 at most"], id="reshape-negative-target"),
    pytest.param(reshape_to([-1, -1]), [], 4, ["[-1, -1]"], id="reshape-two-minus-ones"),
    pytest.param(reshape_to([1, -2], "Tile"), [], 4, ["(Tile)", "repeats 's' is [1, -2]"], id="tile-negative-repeats"),
    pytest.param(reshape_to([2, -6], "Expand"), [], 4, ["(Expand)", "[2, -6]"], id="expand-negative-shape"),
    pytest.param(reshape_to([3, -1], "ConstantOfShape"), [], 4, ["(ConstantOfShape)", "[3, -1]"], id="constant-of-shape-negative"),
    # a Conv bias is one value per output channel
    pytest.param(conv_bias((5,)), [], 4, ["node 'conv' (Conv)", "bias 'B' is 5", "makes 4 output channels"],
                 id="conv-bias-longer-than-output-channels"),
    pytest.param(conv_bias((2, 2)), [], 4, ["node 'conv' (Conv)", "bias 'B' is 2x2", "shape 4"], id="conv-bias-rank-2"),
    pytest.param(conv_bias((3,), w=(3, 2, 3, 3), op="ConvTranspose"), [], 4,  # C_out = 2 per group x 2 groups
                 ["(ConvTranspose)", "bias 'B' is 3", "(group=1) makes 2 output channels"], id="conv-transpose-bias"),
    pytest.param(conv_bias((4,)), [], 0, [], id="conv-bias-of-output-channels"),
    # a window larger than its padded input: floor((4 - 7) / 4 + 1) = 0 outputs, which ONNX's truncating division
    # makes 1
    pytest.param(window("Conv", 7, 4), [], 4, ["node 'win' (Conv)", "spans 7", "(0 + 4 + 0 = 4)",
                                               "floor((4 - 7) / 4 + 1) = 0"], id="conv-kernel-larger-than-input"),
    pytest.param(window("MaxPool", 7, 5, pads=[1, 1, 0, 0]), [], 4, ["node 'win' (MaxPool)", "(1 + 4 + 0 = 5)",
                                                                     "floor((5 - 7) / 5 + 1) = 0"],
                 id="pool-kernel-larger-than-padded-input"),
    pytest.param(window("MaxPool", 3, 4, dilations=[3, 3]), [], 4, ["node 'win' (MaxPool)", "spans 7 (kernel 3, "
                                                                    "dilation 3)"], id="pool-dilated-window"),
    # ceil((4 - 5) / 2 + 1) = 1: ceil_mode lets the one window pass the input's end, as onnxruntime runs it
    pytest.param(window("MaxPool", 5, 2, ceil_mode=1), [], 0, [], id="pool-ceil-mode-one-window"),
    pytest.param(window("Conv", 7, 1, auto_pad="SAME_UPPER"), [], 0, [], id="conv-same-pads-grow"),
    # a Reshape keeps the element count
    pytest.param(reshape_to([5, 3]), [], 4, ["node 'shape_op' (Reshape)", "'x' 2x6 holds 12 elements", "[5, 3] needs 15"],
                 id="reshape-other-element-count"),
    pytest.param(reshape_to([5, -1]), [], 4, ["[5, -1] needs a multiple of 5"], id="reshape-minus-one-does-not-divide"),
    pytest.param(reshape_to([0, 7]), [], 4, ["[0, 7] needs 14"], id="reshape-zero-copies-a-dim"),
    pytest.param(reshape_to([0, 0, 0]), [], 4, ["0 at index 2 copies a dim"], id="reshape-zero-beyond-the-input-rank"),
    pytest.param(reshape_to([3, -1]), [], 0, [], id="reshape-3-by-4"),
    pytest.param(reshape_to([0, 3, -1]), [], 0, [], id="reshape-zero-and-minus-one"),
    # a target that fits one Reshape is checked again for another input shape, or other attributes
    pytest.param(reshapes_sharing_target([3, 4]), [], 4, ["node 'second' (Reshape)", "'x2' 2x7 holds 14 elements",
                                                         "[3, 4] needs 12"], id="reshape-shared-target-other-input"),
    pytest.param(reshapes_sharing_target([0, 6], (2, 6), allowzero=1), [], 4, ["node 'second' (Reshape)",
                 "[0, 6] needs 0"], id="reshape-shared-target-allowzero"),
    # dims and data of a kept (small) tensor disagree
    pytest.param(mismatched([0], [3]), [], 4, ["initializer 's'", "dims [0] make 0 elements", "holds 1"],
                 id="initializer-of-no-elements-with-data"),
    pytest.param(mismatched([2], [3, 4, 1]), [], 4, ["initializer 's'", "dims [2] make 2 elements", "holds 3"],
                 id="initializer-with-more-data-than-dims"),
    pytest.param(mismatched([3], [3, 4], "Constant"), [], 4, ["node 'const' (Constant), tensor 's'", "holds 2"],
                 id="constant-with-less-data-than-dims"),
    # opsets
    pytest.param(with_opsets(("", 13)), [], 4, ["imports domain 'ai.onnx' twice, at opset 18", "at opset 13"],
                 id="default-domain-imported-twice"),
    pytest.param(with_opsets(("ai.onnx", 13)), [], 4, ["at opset 18 (as '') and at opset 13 (as 'ai.onnx')"],
                 id="default-domain-imported-as-both-names"),
    pytest.param(with_opsets(("ai.onnx", 18), ("", 18)), [], 0, [], id="default-domain-imported-twice-alike"),
    pytest.param(with_opset(0), [], 4, ["imports opset 0 of domain 'ai.onnx'"], id="opset-zero"),
    pytest.param(with_opset(-3), [], 4, ["imports opset -3"], id="opset-negative"),
    # bytes that are not UTF-8
    pytest.param(bad_utf8(b"Relu"), [], 4, ["not valid UTF-8"], id="op-type-not-utf8"),
    pytest.param(bad_utf8(b"test"), [], 4, ["not valid UTF-8"], id="graph-name-not-utf8"),
    # arguments out of range: usage errors
    pytest.param(single("Relu", {"x": (2, 3)}), ["--input-shape", "x=9223372036854775808x3"], 2, ["2**48"], id="input-shape-beyond-int64"),
    pytest.param(single("Relu", {"x": (2, 3)}), ["--batch", str(10**30)], 2, ["2**48"], id="batch-10-to-the-30"),
    pytest.param(single("Relu", {"x": (2, 3)}), ["--input-shape", "x=16777217x16777216"], 2, ["2**48"], id="input-shape-too-many-elements"),
]


@pytest.mark.parametrize("built, extra, code, fragments", INVALID)
def test_hostile_model(capsys, tmp_path, built, extra, code, fragments):
    path = tmp_path / "m.onnx"
    path.write_bytes(built if isinstance(built, bytes) else built.SerializeToString())
    if code == 0:
        got, out, err = run(capsys, [path, *extra])
        assert got == 0 and err == "", err
        return
    check_error(capsys, [path, *extra], code, fragments)
    if code in (4, 5):  # --strict never lets one through
        check_error(capsys, [path, "--strict", *extra], code, fragments[:1])


def test_pool_before_slice_is_an_error_not_an_abort(tmp_path):
    # ONNX's Slice inference aborts the process (an assertion in std::clamp) on the negative dim the
    # pool makes; the guard infers the pool first. A subprocess contains the crash if that regresses.
    path = tmp_path / "m.onnx"
    path.write_bytes(pool([9, 9], then="slice").SerializeToString())
    r = subprocess.run([sys.executable, "-m", "flopcount", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 5, r.stderr
    assert r.stderr.count("\n") == 1 and "node 'pool' (MaxPool)" in r.stderr and "1x1x-4x-4" in r.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the inference child needs fork")
def test_pool_before_slice_inside_an_if_body_is_contained(tmp_path):
    # Dims inside bodies are not checked before inference (ONNX infers the branch not taken too), so a two-node
    # model whose If branches feed a pool's negative dim to a Slice aborted the process. Its inference now runs in
    # the child at any size: the abort is reported in one line, and the parent lives.
    def branch(name):
        nodes = [N("MaxPool", ["x"], ["p"], kernel_shape=[9, 9]), N("Slice", ["p", "st", "en", "ax"], ["z"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                                 [const("st", [0]), const("en", [2]), const("ax", [2])])

    m = model([N("If", ["c"], ["y"], then_branch=branch("then"), else_branch=branch("else"))],
              {"x": (1, 1, 4, 4), "c": ()}, ["y"])
    m.graph.input[1].type.tensor_type.elem_type = TensorProto.BOOL
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    r = subprocess.run([sys.executable, "-m", "flopcount", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 5, r.stderr
    assert r.stderr.count("\n") == 1 and "ONNX shape inference crashed (SIGABRT)" in r.stderr, r.stderr
    # where no fork is allowed (another Python thread runs: a service, say), a fresh interpreter infers instead
    code = ("import sys, threading, time; threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
            "import flopcount\ntry:\n    flopcount.count(sys.argv[1])\nexcept flopcount.ShapeError as e:\n"
            "    print('contained:', e)")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "contained:" in r.stdout and "crashed (SIGABRT)" in r.stdout, r.stderr


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the inference child needs fork")
def test_pool_before_slice_in_a_large_graph_is_an_error_from_the_child(tmp_path):
    # >= PARALLEL_MIN_NODES nodes: inference runs in a forked child, which applies the same guard
    chain = [N("MaxPool", ["x"], ["r0"], name="pool", kernel_shape=[9, 9])]
    chain += [N("Relu", [f"r{i}"], [f"r{i + 1}"]) for i in range(shapes.PARALLEL_MIN_NODES)]
    chain.append(N("Slice", [f"r{shapes.PARALLEL_MIN_NODES}", "st", "en", "ax"], ["y"], name="cut"))
    m = model(chain, {"x": (1, 1, 4, 4)}, ["y"], [const("st", [1]), const("en", [3]), const("ax", [2])])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    code = textwrap.dedent(f"""
        import os, sys
        from flopcount.cli import main
        from flopcount.pipeline import shapes
        forks = []
        real = os.fork
        def fork():
            pid = real()
            if pid:
                forks.append(pid)
            return pid
        os.fork = fork
        code = main([{str(path)!r}])
        sys.exit(code if forks else 99)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 5, r.stderr
    assert "node 'pool' (MaxPool)" in r.stderr and "smallest input that works is --input-shape x=1x1x9x9" in r.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the inference child needs fork")
def test_inference_child_that_aborts_is_an_error_not_a_rerun():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # as ONNX's C++ does on a failed assertion
        import faulthandler

        faulthandler.disable()  # no report of the abort on the test's stderr
        os.close(read)
        os.abort()
    os.close(write)
    inference = shapes.Inference.__new__(shapes.Inference)
    m = single("Relu", {"x": (2, 3)})
    inference.model, inference.where, inference._pid, inference._fd = m, "m.onnx", pid, read
    with pytest.raises(ShapeError, match=r"^m\.onnx: ONNX shape inference crashed \(SIGABRT\) on this model"):
        inference.collected({})


def test_empty_broadcast_operand_in_training_counts_zero(capsys, tmp_path):
    # Y = X + B with X 2x0x3 and a trained B 1x1x3: |Y| = 0, so the forward adds nothing and dB is
    # a sum of no values (zeros): 0 FLOPs, never |Y| - |B| = -3
    m = model([N("Add", ["x", "b"], ["y"])], {"x": (2, 0, 3)}, ["y"], [weight("b", (1, 1, 3))])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    code, out, err = run(capsys, [path, "--mode", "train", "--batch", "2", "--format", "json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["total"]["flops"] == 0 and report["backward"]["flops"] == 0


def test_empty_first_batch_has_no_per_sample_figures(capsys, tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(single("Relu", {"x": (0, 3)}).SerializeToString())
    code, out, err = run(capsys, [path, "--format", "json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["batch"] == 0 and report["per_sample"] is None and report["total"]["flops"] == 0  # |Y| = 0·3
    code, out, err = run(capsys, [path])
    assert code == 0 and "Per-sample FLOPs: none (the batch is 0: no sample to count per)" in out


def test_range_of_2_to_the_40_is_counted_without_materialising_it(capsys, tmp_path):
    import tracemalloc

    # Range(0, 2**40) feeding a Relu on int64: one int op per element each, 2 * 2**40
    m = model([N("Range", ["a", "b", "c"], ["r"]), N("Relu", ["r"], ["y"])], {}, ["y"],
              [const("a", 0), const("b", 2**40), const("c", 1)])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    tracemalloc.start()
    try:
        code, out, err = run(capsys, [path, "--format", "json"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 0, err
    assert json.loads(out)["total"]["int_ops"] == 2 * 2**40
    assert peak < 64 * 2**20  # folding it would allocate 8 TiB


# ONNX's data propagation holds the values of a one-dimensional tensor of known length as shape dims, with no
# bound, and again for each Cast, Add, Mul that reads it: Range(0, 2**24) → Cast took 4 GB and ended in
# std::bad_alloc under a cap. Such models are inferred without data propagation.
BIG = 2**24


def _long_vectors():
    return {
        "range-cast": model([N("Range", ["a", "b", "c"], ["r"]), N("Cast", ["r"], ["rc"], to=TensorProto.INT64),
                             N("Relu", ["rc"], ["y"])], {}, ["y"], [const("a", 0), const("b", BIG), const("c", 1)]),
        "range-of-a-size": model([N("Size", ["x"], ["s"]), N("Range", ["a", "s", "c"], ["r"]), N("Cast", ["r"], ["rc"], to=7),
                                  N("Relu", ["rc"], ["y"])], {"x": (2**12, 2**12)}, ["y"], [const("a", 0), const("c", 1)]),
        "long-input-cast": model([N("Cast", ["x"], ["xc"], to=TensorProto.INT64), N("Relu", ["xc"], ["y"])],
                                 {"x": (BIG,)}, ["y"]),
    }


# Range and Relu, one integer op per element each; Cast and Size are free
LONG_VECTOR_INT_OPS = {"range-cast": 2 * BIG, "range-of-a-size": 2 * BIG, "long-input-cast": BIG}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS caps the address space on Linux")
@pytest.mark.parametrize("which", list(LONG_VECTOR_INT_OPS))
def test_long_vectors_count_under_a_memory_cap(tmp_path, which):
    path = tmp_path / "m.onnx"
    path.write_bytes(_long_vectors()[which].SerializeToString())
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # they count in 150 MB; data propagation took over 2 GB
        from flopcount.cli import main
        sys.exit(main([{str(path)!r}, "--format", "json"]))
    """)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "FLOPCOUNT_PARALLEL": "0"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["total"]["int_ops"] == LONG_VECTOR_INT_OPS[which]


def test_short_vectors_keep_data_propagation():
    # a Reshape target computed from a short Range (2, 6): data propagation still resolves it
    m = model([N("Range", ["a", "b", "c"], ["r"]), N("Cast", ["r"], ["t"], to=TensorProto.INT64),
               N("Reshape", ["x", "t"], ["y"]), N("Relu", ["y"], ["z"])], {"x": (3, 4)}, ["z"],
              [const("a", 2), const("b", 10), const("c", 4)])
    assert shapes.data_prop_bounded(m)
    assert not shapes.data_prop_bounded(_long_vectors()["range-of-a-size"])
    from flopcount import count

    report = count(m)
    assert report.total.flops == 2 * 6  # Relu on the 2x6 reshape: one op per element
    assert [n.outputs[0].shape for n in report.nodes if n.op_type == "Relu"] == [(2, 6)]


# --- external data is never opened ----------------------------------------------------------------

_OPENED: list[str] = []


def _audit(event, args):
    if event == "open" and _OPENED and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # hooks cannot be removed: it records only while _OPENED is armed


def _external(name: str, dims, location: str) -> TensorProto:
    t = weight(name, dims)
    del t.external_data[:]
    for k, v in (("location", location), ("offset", "0"), ("length", "0")):
        t.external_data.add(key=k, value=v)
    return t


def _external_models():
    """Models whose tensors refer to external files: a weight, a zero-size initializer of a taken If
    branch (numpy_helper.to_array follows those), a Constant node's value, a zero-size initializer."""
    then = helper.make_graph([N("Concat", ["x", "empty"], ["t"], axis=0)], "then", [],
                             [helper.make_tensor_value_info("t", F, None)], [_external("empty", (0, 3), "branch.bin")])
    other = helper.make_graph([N("Neg", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, None)])
    taken_if = model([N("If", ["c"], ["y"], then_branch=then, else_branch=other)], {"x": (2, 3)}, ["y"],
                     [const("c", True, dtype=bool)])
    constant = model([N("Constant", [], ["k"], value=_external("k", (0,), "constant.bin")), N("Shape", ["x"], ["s"]),
                      N("Concat", ["s", "k"], ["y"], axis=0)], {"x": (2, 3)}, ["y"])
    constant.graph.node[0].attribute[0].t.data_type = TensorProto.INT64
    weighted = single("MatMul", {"x": (2, 3)}, [_external("W", (3, 5), "weights.bin")])
    empty = model([N("Concat", ["x", "z"], ["y"], axis=0)], {"x": (2, 3)}, ["y"], [_external("z", (0, 3), "zero.bin")])
    return {"if": taken_if, "constant": constant, "weights": weighted, "empty": empty}


@pytest.mark.parametrize("which", ["if", "constant", "weights", "empty"])
def test_external_data_is_never_opened(capsys, tmp_path, monkeypatch, which):
    m = _external_models()[which]
    files = ("branch.bin", "constant.bin", "weights.bin", "zero.bin")
    beside, cwd = tmp_path / "models", tmp_path / "cwd"
    beside.mkdir()
    cwd.mkdir()
    for folder in (beside, cwd):  # where a resolver would look: beside the model and the working directory
        for f in files:
            (folder / f).write_bytes(b"\0" * 64)
    path = beside / "m.onnx"
    path.write_bytes(m.SerializeToString())
    monkeypatch.chdir(cwd)
    _OPENED[:] = ["armed"]
    try:
        code, out, err = run(capsys, [path, "--format", "json"])
    finally:
        opened, _OPENED[:] = _OPENED[1:], []
    assert code == 0, err
    assert str(path) in opened  # the trace sees the model itself being read
    assert not [p for p in opened if os.path.basename(p) in files], opened
    flops = json.loads(out)["total"]["flops"]
    # weights: 2·2·3·5 = 60; if: Concat of 2x3 and 0x3 is free; the others are free too
    assert flops == {"weights": 60}.get(which, 0)


@pytest.mark.parametrize("tail, code, fragments", [
    pytest.param([6], 0, [], id="expand-to-dims-needs-no-guard"),
    pytest.param([-6], 5, ["(Expand)", "-6"], id="expand-to-a-negative-constant-is-guarded"),
])
def test_expand_before_slice(tmp_path, tail, code, fragments):
    # An Expand to a shape made of dims (Shape, and non-negative constants) cannot make a negative dim, so the Slice
    # after it needs no guard; a negative constant in that shape still gets one, and an error, not an abort.
    nodes = [N("Shape", ["x"], ["sx"]), N("Concat", ["sx", "tail"], ["target"], axis=0),
             N("Expand", ["one", "target"], ["e"]),
             N("Slice", ["e", "st", "en", "ax"], ["y"], name="cut")]
    m = model(nodes, {"x": (2, 3)}, ["y"], [const("tail", tail), const("st", [0]), const("en", [1]), const("ax", [2]),
                                            helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    r = subprocess.run([sys.executable, "-m", "flopcount", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stderr
    assert r.stderr.count("\n") == (1 if code else 0) and all(f in r.stderr for f in fragments), r.stderr


def deep_guarded_chain(depth: int, kernel: int = 2):
    """``depth`` times MaxPool (kernel k, stride 1: each side shrinks by k − 1) then Slice [0:H−1] on the last two
    axes: every Slice is at risk (a pool precedes it), at guard depths 1 … ``depth``."""
    nodes, x = [], "x"
    for i in range(depth):
        nodes += [N("MaxPool", [x], [f"p{i}"], kernel_shape=[kernel, kernel]),
                  N("Slice", [f"p{i}", "st", "en", "ax"], [f"s{i}"], name=f"cut{i}")]
        x = f"s{i}"
    side = 2 * depth * (kernel - 1) + 3
    return model(nodes, {"x": (1, 1, side, side)}, [x], [const("st", [0, 0]), const("en", [-1, -1]),
                                                           const("ax", [2, 3])]), side


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the inference child needs fork")
def test_the_slice_guard_infers_once_however_deep(monkeypatch):
    # 40 Slices at risk, one after the other: inferred depth by depth that was 41 inferences; now one, in a child
    depth = 40
    m, side = deep_guarded_chain(depth)
    assert max(guarded._guard_depths(m.graph)) == depth
    plain = []
    real = guarded._infer_plain
    monkeypatch.setattr(guarded, "_infer_plain", lambda *a, **k: plain.append(1) or real(*a, **k))
    inferred = guarded.infer(m, "m.onnx")
    assert plain == []  # nothing inferred in this process, depth by depth or otherwise
    out = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in inferred.graph.output}
    assert out[f"s{depth - 1}"] == [1, 1, side - 2 * depth, side - 2 * depth]  # each pool −1, each Slice −1
    monkeypatch.setenv("FLOPCOUNT_PARALLEL", "0")  # no child allowed: depth by depth, as before
    guarded.infer(m, "m.onnx")
    assert len(plain) == depth + 1


def test_a_wrong_dim_deep_in_a_guarded_chain_is_still_an_error_not_an_abort(tmp_path):
    # the last pool's window outgrows its input: a negative dim that the Slice after it would abort on
    m, side = deep_guarded_chain(6)
    m.graph.node[-2].attribute[0].ints[:] = [9, 9]
    m.graph.node[-2].name = "last_pool"
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    r = subprocess.run([sys.executable, "-m", "flopcount", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 5, r.stderr
    assert r.stderr.count("\n") == 1 and "node 'last_pool' (MaxPool)" in r.stderr, r.stderr
