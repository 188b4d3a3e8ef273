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
    pytest.param({"parallel": 5}, "parallel must be a plan", id="parallel-int"),
    pytest.param({"parallel": ""}, "'' is no plan", id="parallel-empty"),
    pytest.param({"parallel": "tp=2", "microbatches": "4"}, "microbatches must be a positive int", id="microbatches-str"),
    pytest.param({"parallel": "tp=2", "schedule": 2}, "schedule must be text", id="schedule-int"),
    pytest.param({"microbatches": 4}, "--microbatches needs --parallel", id="microbatches-without-plan"),
    pytest.param({"schedule": "gpipe"}, "--schedule needs --parallel", id="schedule-without-plan"),
    pytest.param({"expert_load": "load.json"}, "--expert-load needs --parallel", id="expert-load-without-plan"),
    pytest.param({"parallel": "ep=2,dp=2", "expert_load": 3}, "expert_load must be the path", id="expert-load-int"),
    pytest.param({"token_dispatcher": "allgather"}, "--token-dispatcher needs --parallel",
                 id="token-dispatcher-without-plan"),
    pytest.param({"parallel": "ep=2,dp=2", "token_dispatcher": "all-gather"}, "count: token_dispatcher must be one "
                 "of 'alltoall', 'allgather'", id="token-dispatcher-unknown"),
    pytest.param({"parallel": "ep=2,dp=2", "token_dispatcher": True}, "token_dispatcher must be one of",
                 id="token-dispatcher-bool"),
    pytest.param({"recompute": "full", "mode": "train"}, "--recompute needs --memory", id="recompute-alone"),
    pytest.param({"recompute": 5, "memory": True}, "recompute must be 'none'", id="recompute-int"),
    pytest.param({"recompute": "full", "memory": True}, "give --mode train", id="recompute-inference"),
    pytest.param({"memory": "yes"}, "memory must be True or a flopcount.MemorySettings", id="memory-str"),
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


def test_the_plan_settings_make_one_plan():
    """A plan as text or as a record, its microbatches and schedule given apart or in it: one ParallelPlan; the
    recompute policy is the memory ledger's too."""
    from flopcount.memory.ledger import MemorySettings
    from flopcount.parallel.plan import ParallelPlan, Recompute

    text = CountOptions(parallel="tp=2,pp=2", microbatches=4, schedule="interleaved:2")
    record = CountOptions(parallel=ParallelPlan(tp=2, pp=2, microbatches=2), microbatches=4, schedule="interleaved:2")
    assert text.parallel == record.parallel == ParallelPlan(tp=2, pp=2, microbatches=4, schedule="interleaved",
                                                            virtual_stages=2)
    assert dataclasses.replace(text, microbatches=8).parallel.microbatches == 8
    options = CountOptions(mode="train", memory=True, recompute="selective")
    assert options.recompute == Recompute("selective") and options.memory == MemorySettings(recompute="selective")
    assert CountOptions(memory=True) == CountOptions(memory=MemorySettings())
    with pytest.raises(UsageError, match="differ"):
        CountOptions(mode="train", memory=MemorySettings(recompute="full"), recompute="selective")


def test_a_field_declared_in_the_table_is_a_flag_a_keyword_and_a_checked_setting(monkeypatch):
    """A new setting is one field of CountOptions (with its Flag and its check): the counting command then lists its
    flag in its --help group and reads it back into the record, ``count()`` takes it as a keyword, and the record
    checks it when made, with no other file touched."""
    import flopcount.counting
    import flopcount.options
    from flopcount.options import Flag, option

    def check(value):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise UsageError(f"count: exclude_ops must be operator types, got {value!r}")

    @dataclasses.dataclass(frozen=True)
    class Wider(CountOptions):
        exclude_ops: tuple = option((), Flag("--exclude-op", "counting", "an operator type left out of the count",
                                             action="append", metavar="OP"), check=check)

    monkeypatch.setattr(flopcount.options, "CountOptions", Wider)
    monkeypatch.setattr(flopcount.counting, "CountOptions", Wider)
    parser = build_parser()
    text = parser.format_help()
    counting = text[text.index("\ncounting:\n"):text.index("\nLLM:\n")]
    assert "--exclude-op OP" in counting and "an operator type left out" in counting
    _, options = options_from_args(parser.parse_args(["m.onnx", "--exclude-op", "Relu", "--exclude-op", "Gelu"]))
    assert isinstance(options, Wider) and options.exclude_ops == ["Relu", "Gelu"]
    seen = []
    monkeypatch.setattr(flopcount.counting, "count_options", lambda model, options: seen.append(options))
    flopcount.count(marked_model(), exclude_ops=("Marker",))
    assert seen == [Wider(exclude_ops=("Marker",))]
    with pytest.raises(UsageError, match="exclude_ops must be operator types"):
        flopcount.count(marked_model(), exclude_ops="Marker")
    with pytest.raises(TypeError, match="unexpected keyword argument 'include_ops'"):
        flopcount.count(marked_model(), include_ops=("Marker",))


def test_count_takes_every_field_of_the_record_and_the_command_line_every_flag():
    import inspect

    fields = [f.name for f in dataclasses.fields(CountOptions)]
    assert list(inspect.signature(flopcount.count).parameters)[1:] == fields
    from flopcount.options import flags

    import re

    text = build_parser().format_help()
    for name, flag in flags().items():
        assert len(re.findall(rf"^  {flag.flag}(?=[ \n])", text, re.MULTILINE)) == 1, name


@pytest.mark.parametrize("module", ["flopcount.options", "flopcount.calls", "flopcount.plans",
                                    "flopcount.parallel.plan"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
