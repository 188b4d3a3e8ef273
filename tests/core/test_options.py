"""``CountOptions``, the one record of a count's settings: it checks itself when made (a UsageError naming the
setting), equal settings make equal records, the command line builds the same record as the Python call, and
``count(model, **settings)`` is ``count_options(model, CountOptions(**settings))``. ``free_ops``, the option added
through the record alone: unsupported operators declared free count as zero-cost, and ``--strict`` passes."""

from __future__ import annotations

import dataclasses

import pytest
from onnx import TensorProto, helper

import flopcount
from flopcount.cli import main
from flopcount.cli.arguments import options_from_args
from flopcount.cli.count import build_parser
from flopcount.counting import count_options
from flopcount.errors import UnsupportedOperatorError, UsageError
from flopcount.frontends.source import ModelSource
from flopcount.options import CountOptions
from flopcount.reporting.report import UNSUPPORTED, ZERO_COST


def marked_model(with_marker: bool = True):
    """input [N, 3, 4, 4] -> Relu -> y; y -> Sigmoid -> w; and, with the marker, y -> com.example:Marker -> z (an
    operator with no formula)."""
    nodes = [helper.make_node("Relu", ["input"], ["y"]), helper.make_node("Sigmoid", ["y"], ["w"])]
    outputs = [helper.make_tensor_value_info("w", TensorProto.FLOAT, None)]
    if with_marker:
        nodes.append(helper.make_node("Marker", ["y"], ["z"], domain="com.example"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 4, 4])],
                              outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])


@pytest.mark.parametrize("settings, fragment", [
    pytest.param({"mode": "training"}, "unknown mode 'training'", id="mode"),
    pytest.param({"attention": "sparse"}, "unknown attention 'sparse'", id="attention"),
    pytest.param({"optimizer": "adam"}, "with mode='train'", id="optimizer-without-train"),
    pytest.param({"mode": "train", "optimizer": "lamb"}, "optimizer 'lamb'", id="optimizer-unknown"),
    pytest.param({"loop_trips": {"loop": -1}}, "loop_trips must be non-negative", id="loop-trips-negative"),
    pytest.param({"batch": 1.5}, "count: batch must be a positive int", id="batch-float"),
    pytest.param({"input_shapes": {"input": (1, 0)}}, "dim 1 of input_shapes['input']", id="shapes-zero-dim"),
    pytest.param({"trainable_inputs": "emb"}, "trainable_inputs must be a list", id="trainable-inputs-str"),
    pytest.param({"free_ops": "Marker"}, "free_ops must be a list of operator types", id="free-ops-str"),
    pytest.param({"free_ops": [3]}, "free_ops must be a list of operator types", id="free-ops-int"),
    pytest.param({"convention": "nope"}, "nope", id="convention"),
])
def test_the_record_refuses_a_wrong_setting_naming_it(settings, fragment):
    with pytest.raises(UsageError) as caught:
        CountOptions(**settings)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_the_record_is_frozen_and_replace_checks_again():
    options = CountOptions(mode="train", optimizer="adam")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.mode = "inference"
    with pytest.raises(UsageError, match="with mode='train'"):
        dataclasses.replace(options, mode="inference")
    assert dataclasses.replace(options, optimizer="sgd").optimizer == "sgd"


def test_equal_settings_make_equal_records():
    assert CountOptions(input_values={}, loop_trips={}, trainable_inputs=[], memory=False) == CountOptions()
    assert CountOptions(input_shapes={"x": [1, 3]}, trainable=["a.*"], free_ops=["M", "M"]) == \
        CountOptions(input_shapes={"x": (1, 3)}, trainable=("a.*",), free_ops=("M",))
    assert CountOptions(trainable=[]) != CountOptions()  # nothing trained is not "decided from the graph"


def test_command_line_and_python_build_the_same_record(tmp_path):
    argv = ["model.onnx", "--input-shape", "input=2x3x4x4", "--batch", "2", "--input-value", "axes=1,2",
            "--loop-trips", "loop=5", "--mode", "train", "--optimizer", "adamw", "--trainable-input", "input",
            "--trainable", "decoder.*", "--frozen", "decoder.0.*", "--convention", "table3", "--attention",
            "executed", "--strict", "--free-op", "com.example:Marker", "--free-op", "Print"]
    source, options = options_from_args(build_parser().parse_args(argv))
    assert source == ModelSource("onnx", "model.onnx")
    assert options == CountOptions(
        input_shapes={"input": (2, 3, 4, 4)}, batch=2, input_values={"axes": [1, 2]}, loop_trips={"loop": 5},
        mode="train", optimizer="adamw", trainable_inputs=["input"], trainable=["decoder.*"], frozen=["decoder.0.*"],
        convention="table3", attention="executed", strict=True, free_ops=["com.example:Marker", "Print"])
    _, defaults = options_from_args(build_parser().parse_args(["model.onnx"]))
    assert defaults == CountOptions(input_shapes={})


def test_count_is_sugar_over_the_record():
    model = marked_model()
    settings = {"batch": 3, "mode": "train", "optimizer": "sgd"}
    a, b = flopcount.count(model, **settings), count_options(model, CountOptions(**settings))
    assert (a.forward, a.backward, a.optimizer, a.unsupported) == (b.forward, b.backward, b.optimizer, b.unsupported)
    assert ModelSource("onnx", model).count(CountOptions(**settings)).forward == a.forward


def test_a_model_source_of_an_unknown_kind_is_refused():
    with pytest.raises(UsageError, match="unknown model source 'jax'"):
        ModelSource("jax", "m:f")


@pytest.mark.parametrize("free", [["com.example:Marker"], ["Marker"]], ids=["domain-and-op", "op"])
def test_free_ops_count_zero_and_let_strict_pass(free):
    with pytest.raises(UnsupportedOperatorError, match="com.example:Marker"):
        flopcount.count(marked_model(), batch=2, strict=True)
    report = flopcount.count(marked_model(), batch=2, strict=True, free_ops=free)
    without = flopcount.count(marked_model(with_marker=False), batch=2)
    assert report.forward == without.forward and report.forward.flops > 0
    assert dict(report.unsupported) == {}
    assert [n.status for n in report.nodes if n.op_type == "Marker"] == [ZERO_COST]


def test_free_ops_leave_a_formula_and_other_unsupported_ops_alone():
    report = flopcount.count(marked_model(), batch=2, free_ops=["Relu", "Print"])
    assert report.forward == flopcount.count(marked_model(), batch=2).forward  # Relu keeps its formula
    assert [n.status for n in report.nodes if n.op_type == "Marker"] == [UNSUPPORTED]


def test_free_op_on_the_command_line(save, capsys):
    path = save(marked_model())
    assert main([path, "--batch", "2", "--strict"]) == 6
    capsys.readouterr()
    assert main([path, "--batch", "2", "--strict", "--free-op", "com.example:Marker", "--format", "json"]) == 0
    assert '"com.example:Marker"' in capsys.readouterr().out
