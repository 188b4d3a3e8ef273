"""Every bad input of the issue: one line on stderr naming the problem, a distinct exit code, no traceback."""

import random

import onnx
import pytest
from helpers import model, single, weight
from onnx import TensorProto, helper

from flopcount.cli import main

N = helper.make_node


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def check_error(capsys, argv, code, *fragments):
    got, out, err = run(capsys, *argv)
    assert got == code, err
    assert "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flopcount: error: ")
    for f in fragments:
        assert f in err
    return err


def write(tmp_path, data: bytes, name="m.onnx"):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def tiny():
    return single("MatMul", {"a": (2, 3)}, [weight("W", (3, 4))])


def test_missing_file(capsys, tmp_path):
    check_error(capsys, [str(tmp_path / "nope.onnx")], 3, "nope.onnx", "no such file")


def test_directory(capsys, tmp_path):
    check_error(capsys, [str(tmp_path)], 3, "is a directory")


def test_empty_file(capsys, tmp_path):
    check_error(capsys, [write(tmp_path, b"")], 3, "empty")


def test_random_bytes(capsys, tmp_path):
    data = random.Random(1).randbytes(4096)
    check_error(capsys, [write(tmp_path, data)], 3, "m.onnx")


@pytest.mark.parametrize("fraction", [0.3, 0.5, 0.9])
def test_truncated_protobuf(capsys, tmp_path, fraction):
    data = tiny().SerializeToString()
    check_error(capsys, [write(tmp_path, data[: int(len(data) * fraction)])], 3, "m.onnx")


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(onnx.helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0]), id="tensor"),
        pytest.param(tiny().graph, id="graph"),
        pytest.param(onnx.helper.make_node("Relu", ["x"], ["y"]), id="node"),
    ],
)
def test_protobuf_that_is_not_a_model(capsys, tmp_path, message):
    check_error(capsys, [write(tmp_path, message.SerializeToString())], 3, "not an ONNX model")


def test_cycle(capsys, tmp_path):
    nodes = [N("Add", ["x", "b"], ["a"], name="first"), N("Relu", ["a"], ["b"], name="second")]
    m = model(nodes, {"x": (2, 3)}, ["b"])
    check_error(capsys, [write(tmp_path, m.SerializeToString())], 4, "cycle", "'first'", "'second'")


def test_input_nothing_produces(capsys, tmp_path):
    m = model([N("Add", ["x", "ghost"], ["y"], name="adder")], {"x": (2, 3)}, ["y"])
    check_error(capsys, [write(tmp_path, m.SerializeToString())], 4, "'adder'", "'ghost'")


def test_duplicate_output_names(capsys, tmp_path):
    nodes = [N("Relu", ["x"], ["y"], name="r1"), N("Sigmoid", ["x"], ["y"], name="r2")]
    m = model(nodes, {"x": (2, 3)}, ["y"])
    check_error(capsys, [write(tmp_path, m.SerializeToString())], 4, "'y'", "produced twice")


def test_unresolved_dynamic_dim(capsys, tmp_path):
    m = single("MatMul", {"a": ("batch", 3)}, [weight("W", (3, 4))])
    check_error(capsys, [write(tmp_path, m.SerializeToString())], 5, "'a'", "--input-shape a=BATCHx3")


def test_negative_dim_in_model(capsys, tmp_path):
    m = single("Relu", {"x": (2, -3)})
    check_error(capsys, [write(tmp_path, m.SerializeToString())], 5, "'x'", "negative")


@pytest.mark.parametrize("shape", ["x=0x3", "x=2x-3", "x=2xthree"])
def test_zero_negative_or_malformed_dims_given(capsys, tmp_path, shape):
    path = write(tmp_path, single("Relu", {"x": ("N", 3)}).SerializeToString())
    code, out, err = run(capsys, path, "--input-shape", shape)
    assert code == 2 and "Traceback" not in err and "--input-shape" in err


def test_input_shape_for_unknown_input(capsys, tmp_path):
    path = write(tmp_path, single("Relu", {"x": ("N", 3)}).SerializeToString())
    check_error(capsys, [path, "--input-shape", "nope=2x3"], 2, "'nope'", "'x'")


def test_input_shape_of_wrong_rank(capsys, tmp_path):
    path = write(tmp_path, single("Relu", {"x": ("N", 3)}).SerializeToString())
    check_error(capsys, [path, "--input-shape", "x=2x3x4"], 2, "rank 2")


def test_attribute_of_wrong_type(capsys, tmp_path):
    m = single("Conv", {"x": (1, 4, 8, 8)}, [weight("W", (4, 4, 3, 3))])
    m.graph.node[0].attribute.append(helper.make_attribute("group", 1.0))  # FLOAT, spec says INT
    check_error(capsys, [write(tmp_path, m.SerializeToString())], 4, "'group'", "FLOAT", "INT")


def test_unknown_op_is_reported_not_fatal(capsys, tmp_path):
    nodes = [N("Relu", ["x"], ["h"]), N("Frobnicate", ["h"], ["y"], domain="example.custom")]
    m = model(nodes, {"x": (2, 3)}, ["y"], extra_opsets={"example.custom": 1})
    path = write(tmp_path, m.SerializeToString())
    code, out, err = run(capsys, path)
    assert code == 0 and "example.custom:Frobnicate (1)" in out and "NOT counted" in out
    check_error(capsys, [path, "--strict"], 6, "example.custom:Frobnicate")


def test_unknown_op_in_default_domain_is_unsupported(capsys, tmp_path):
    m = model([N("NoSuchOp", ["x"], ["y"])], {"x": (2, 3)}, ["y"])
    path = write(tmp_path, m.SerializeToString())
    code, out, _ = run(capsys, path)
    assert code == 0 and "NoSuchOp (1)" in out


def test_opset_newer_than_onnx_knows(capsys, tmp_path):
    m = single("Relu", {"x": (2, 3)}, opset=onnx.defs.onnx_opset_version() + 1)
    check_error(capsys, [write(tmp_path, m.SerializeToString())], 7, "opset", "upgrade")


def test_unwritable_output(capsys, tmp_path):
    path = write(tmp_path, tiny().SerializeToString())
    check_error(capsys, [path, "-o", str(tmp_path / "no" / "dir" / "out.json")], 8, "cannot write")


def test_exit_codes_are_distinct():
    from flopcount import errors
    from flopcount.errors import OutputError

    classes = [errors.UsageError, errors.ModelFileError, errors.InvalidGraphError, errors.ShapeError,
               errors.UnsupportedOperatorError, errors.OpsetError, OutputError]
    codes = [c.exit_code for c in classes]
    assert len(set(codes)) == len(codes) and 0 not in codes and 1 not in codes
