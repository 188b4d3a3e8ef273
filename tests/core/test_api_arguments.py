"""Arguments checked at the call: ``count``, ``from_torch``, ``from_hf`` and ``Meter`` refuse an argument of the wrong
type or range with a UsageError naming it, before any work; a clock that goes backwards or reads NaN or a string is
refused at the reading, so that no rate is negative or NaN."""

from __future__ import annotations

import math
import re

import pytest
from onnx import TensorProto, helper

import flopcount
from flopcount.errors import UsageError


def relu_model():
    """input [N, 3, 4, 4] -> Relu: N*3*4*4 FLOPs."""
    graph = helper.make_graph([helper.make_node("Relu", ["input"], ["y"])], "g",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("kwargs, fragments", [
    pytest.param({"batch": 1.5}, ["batch", "1.5 (float)"], id="batch-float"),
    pytest.param({"batch": "8"}, ["batch", "'8' (str)"], id="batch-str"),
    pytest.param({"batch": True}, ["batch", "True (bool)"], id="batch-bool"),
    pytest.param({"batch": 0}, ["batch", "positive"], id="batch-zero"),
    pytest.param({"batch": 2**49}, ["batch", "2**48"], id="batch-huge"),
    pytest.param({"input_shapes": [1, 3, 224, 224]}, ["input_shapes must be a mapping", "(list)"], id="shapes-list"),
    pytest.param({"input_shapes": {"input": None}}, ["input_shapes['input']", "None"], id="shapes-none"),
    pytest.param({"input_shapes": {"input": (1, 3.0, 4, 4)}}, ["dim 1 of input_shapes['input']", "3.0"],
                 id="shapes-float-dim"),
    pytest.param({"input_shapes": {"input": "1x3x4x4"}}, ["input_shapes['input']", "'1x3x4x4'"], id="shapes-str"),
    pytest.param({"input_shapes": {3: (1, 3, 4, 4)}}, ["input_shapes names inputs by str"], id="shapes-int-key"),
    pytest.param({"strict": "yes"}, ["strict must be True or False"], id="strict-str"),
    pytest.param({"loop_trips": [3]}, ["loop_trips must be a mapping"], id="loop_trips-list"),
    pytest.param({"input_values": (1, 2)}, ["input_values must be a mapping"], id="input_values-tuple"),
    pytest.param({"trainable": "W"}, ["trainable must be a list or other collection of initializer names"], id="trainable-str"),
    pytest.param({"frozen": [3]}, ["frozen must hold names"], id="frozen-int"),
])
def test_count_refuses_a_wrong_argument_naming_it(kwargs, fragments):
    with pytest.raises(UsageError) as caught:
        flopcount.count(relu_model(), **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("count: ")
    for fragment in fragments:
        assert fragment in message, message


def test_count_takes_right_arguments():
    assert flopcount.count(relu_model(), batch=2).forward.flops == 2 * 3 * 4 * 4
    assert flopcount.count(relu_model(), input_shapes={"input": (5, 3, 4, 4)}).forward.flops == 5 * 3 * 4 * 4
    assert flopcount.count(relu_model(), batch=5, input_shapes={"input": [5, 3, 4, 4]}).forward.flops == 5 * 3 * 4 * 4


def test_batch_and_an_input_shape_fixing_dim_0_differently_are_refused_naming_both(save):
    with pytest.raises(UsageError) as caught:
        flopcount.count(relu_model(), batch=4, input_shapes={"input": (8, 3, 4, 4)})
    assert "--batch 4" in str(caught.value) and "input=8x3x4x4" in str(caught.value)
    from flopcount.cli import main

    assert main([save(relu_model()), "--batch", "4", "--input-shape", "input=8x3x4x4"]) == 2


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("kwargs, fragment", [
    pytest.param({"batch": 1.5}, "from_torch: batch must be a positive int", id="batch-float"),
    pytest.param({"batch": "8"}, "from_torch: batch must be a positive int", id="batch-str"),
    pytest.param({"input_shapes": [1, 3]}, "from_torch: input_shapes must be a mapping", id="shapes-list"),
])
def test_from_torch_refuses_a_wrong_count_argument_before_exporting(kwargs, fragment, exports):
    with pytest.raises(UsageError, match=fragment):
        flopcount.from_torch(torch.nn.Linear(3, 5), (2, 3), cache_dir=False, **kwargs)
    assert exports == []


def test_from_hf_refuses_a_wrong_batch_before_building():
    with pytest.raises(UsageError, match="from_hf: batch must be a positive int"):
        flopcount.from_hf({"model_type": "llama"}, {"input_ids": (1, 8)}, batch="8")


def test_meter_refuses_a_report_that_is_not_one_at_the_call():
    with pytest.raises(UsageError, match=r"Meter: report must be a flopcount.Report.*got str 'x'"):
        flopcount.Meter(report="x")


def ticking(values):
    it = iter(values)
    return lambda: next(it)


@pytest.mark.parametrize("readings, fragment", [
    pytest.param([0.0, 1.0, 0.5, 0.25, 0.0, 0.0], "went backwards, from 1.0 to 0.5", id="backwards"),
    pytest.param([0.0, math.nan, 2.0, 3.0, 4.0, 5.0], "returned nan, not a finite number", id="nan"),
    pytest.param([0.0, math.inf, 2.0, 3.0, 4.0, 5.0], "returned inf, not a finite number", id="inf"),
    pytest.param([0.0, "1.0", 2.0, 3.0, 4.0, 5.0], "must return seconds as a real number, got '1.0' (str)",
                 id="string"),
])
def test_a_bad_clock_is_refused_at_its_reading(readings, fragment):
    meter = flopcount.Meter(flops_per_sample=1000, warmup_steps=0, window_steps=2, clock=ticking(readings),
                            energy=False, device="cpu", peak_flops=1e6)
    with pytest.raises(UsageError, match=re.escape(fragment)):
        meter.start()
        for _ in range(len(readings)):
            with meter.step(samples=10):
                pass
        meter.result()


def test_a_steady_clock_gives_positive_rates():
    """Readings 0, 1, 2, ...: each step takes 1 s, so a window of 2 steps of 10 samples runs 10 samples/s."""
    meter = flopcount.Meter(flops_per_sample=1000, warmup_steps=0, window_steps=2, clock=ticking(range(100)),
                            energy=False, device="cpu", peak_flops=1e6)
    meter.start()
    for _ in range(4):
        with meter.step(samples=10):
            pass
    result = meter.result()
    assert result.samples_per_s["per_rank"] > 0 and result.wall_s > 0


@pytest.mark.parametrize("make, fragments", [
    pytest.param(lambda: flopcount.ParallelPlan(sp="no"), ["sp='no' must be True or False"], id="plan-sp-str"),
    pytest.param(lambda: flopcount.ParallelPlan(tp=2, fsdp=1), ["fsdp=1 must be True or False"], id="plan-fsdp-int"),
    pytest.param(lambda: flopcount.ParallelPlan(tp=2.0), ["tp=2.0 must be a positive integer"], id="plan-tp-float"),
    pytest.param(lambda: flopcount.ParallelPlan(schedule=None), ["unknown schedule None"], id="plan-schedule-none"),
    pytest.param(lambda: flopcount.MemorySettings(master_weights="no"), ["master_weights must be True or False"],
                 id="memory-master-weights-str"),
    pytest.param(lambda: flopcount.MemorySettings(plan="tp=2"), ["plan must be a flopcount.ParallelPlan"],
                 id="memory-plan-str"),
    pytest.param(lambda: flopcount.MemorySettings(recompute=1), ["--recompute: 1 is no policy"],
                 id="memory-recompute-int"),
    pytest.param(lambda: flopcount.Recompute("ops", "Softmax"), ["ops must be a set of operator types"],
                 id="recompute-ops-str"),
])
def test_the_plan_records_refuse_a_wrong_type_naming_it(make, fragments):
    """Where a truthy string was taken as on (``sp="no"``, ``master_weights="no"``), the records now refuse it."""
    with pytest.raises(UsageError) as caught:
        make()
    for fragment in fragments:
        assert fragment in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("call, fragments", [
    pytest.param(lambda r: flopcount.parallel_ledger("report", "tp=2"), ["parallel_ledger: report must be a "
                 "flopcount.Report", "'report' (str)"], id="ledger-report-str"),
    pytest.param(lambda r: flopcount.parallel_ledger(r, 2), ["parallel_ledger: plan must be text such as 'tp=2,pp=4'",
                                                             "2 (int)"], id="ledger-plan-int"),
    pytest.param(lambda r: flopcount.parallel_ledger(r, "tp=2", recompute=3), ["recompute must be text"],
                 id="ledger-recompute-int"),
    pytest.param(lambda r: flopcount.parallel_ledger(r, "dp=2", expert_load=[1, 2]), ["parallel_ledger: expert_load "
                 "must be the path"], id="ledger-load-list"),
    pytest.param(lambda r: flopcount.parallel_ledger(r, "tp=²"), ["tp=² must be a positive integer"],
                 id="ledger-plan-superscript"),
    pytest.param(lambda r: flopcount.memory_per_rank(r, "dp=2"), ["memory_per_rank: the report has no memory "
                 "ledger; count it with memory=True"], id="per-rank-without-memory"),
    pytest.param(lambda r: flopcount.generation_ledger(r, "tp=2"), ["generation_ledger: the report is no count of "
                 "generate()"], id="generation-of-a-plain-count"),
    pytest.param(lambda r: flopcount.parallel_ledger(r, "tp=2"), ["--parallel: g has no module scopes",
                                                                  "tp=2 splits cannot be found"], id="ledger-plan-text-parsed"),
])
def test_the_ledger_functions_check_their_arguments(call, fragments):
    """``parallel_ledger(report, "tp=2")`` reads the plan as --parallel does (here the Relu graph has no layers to
    split, which the ledger says, naming the plan); a wrong type is a UsageError naming the argument, never an
    AttributeError from inside."""
    report = flopcount.count(relu_model(), batch=2)
    with pytest.raises(UsageError) as caught:
        call(report)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)


def test_count_takes_the_plan_and_refuses_it_where_it_would_do_nothing():
    with pytest.raises(UsageError, match="--microbatches needs --parallel"):
        flopcount.count(relu_model(), microbatches=4)
    with pytest.raises(UsageError, match="parallel must be a plan"):
        flopcount.count(relu_model(), parallel=["tp=2"])
    with pytest.raises(UsageError, match="splits cannot be found"):  # the plan reaches the ledger (no layers here)
        flopcount.count(relu_model(), batch=2, parallel="tp=2")
