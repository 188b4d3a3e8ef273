"""The parallel plan and the recompute policy (flopcount.parallel.plan): parsing and the checks that name the bad part."""

from __future__ import annotations

import pytest

from flopcount.errors import UsageError
from flopcount.parallel.plan import ParallelPlan, Recompute, parse_parallel, parse_recompute


def test_a_full_plan():
    plan = parse_parallel("tp=2, pp=4,cp=3,ep=5,dp=7,sp,fsdp", microbatches=8, schedule="interleaved:3")
    assert (plan.tp, plan.pp, plan.cp, plan.ep, plan.dp, plan.sp, plan.fsdp) == (2, 4, 3, 5, 7, True, True)
    assert (plan.microbatches, plan.schedule, plan.virtual_stages) == (8, "interleaved", 3)
    assert plan.world_size == 2 * 4 * 3 * 7 and plan.model_parallel_size == 2 * 4 * 3
    assert str(plan) == "tp=2,pp=4,cp=3,ep=5,dp=7,sp,fsdp microbatches=8 schedule=interleaved:3"
    assert parse_parallel("pp=2", microbatches=2, schedule="interleaved").virtual_stages == 2


def test_sp_names_how_the_gathered_inputs_are_kept():
    assert parse_parallel("tp=2,sp").sp_style == parse_parallel("tp=2,SP=Torch").sp_style == "torch"
    plan = parse_parallel("tp=2,sp=megatron")
    assert plan.sp and plan.sp_style == "megatron" and plan.as_dict()["sp_style"] == "megatron"
    assert str(plan) == "tp=2,pp=1,cp=1,ep=1,dp=1,sp=megatron microbatches=1 schedule=1f1b"
    assert parse_parallel(str(plan).split()[0]) == plan
    for bad, message in (({"sp_style": "megatron"}, "give sp=True with it"),
                         ({"sp": True, "sp_style": 1}, "unknown sp_style 1")):
        with pytest.raises(UsageError, match=message):
            ParallelPlan(tp=2, **bad)


def test_degrees_left_out_are_one_and_the_plan_is_frozen():
    plan = parse_parallel("dp=4")
    assert (plan.tp, plan.pp, plan.cp, plan.ep) == (1, 1, 1, 1) and not plan.is_single
    assert ParallelPlan().is_single
    with pytest.raises(AttributeError):
        plan.tp = 2  # type: ignore[misc]


@pytest.mark.parametrize("text, kw, message", [
    pytest.param("tp=0", {}, "tp=0 must be a positive integer", id="zero degree"),
    pytest.param("tp=x", {}, "tp=x must be a positive integer", id="not a number"),
    pytest.param("tq=2", {}, "'tq=2' is not a degree or a switch", id="unknown degree"),
    pytest.param("tp=2,tp=4", {}, "tp is given twice", id="twice"),
    pytest.param("sp", {}, "sp .* give tp=T with T > 1", id="sp without tp"),
    pytest.param("sp=megatron", {}, "sp .* give tp=T with T > 1", id="sp=megatron without tp"),
    pytest.param("tp=2,sp=nemo", {}, "'sp=nemo': sp takes one of torch, megatron", id="unknown sp style"),
    pytest.param("tp=2,sp,sp=megatron", {}, "sp is given twice", id="sp twice"),
    pytest.param("fsdp", {}, "fsdp shards over the data-parallel group", id="fsdp without dp"),
    pytest.param("pp=4", {"microbatches": 2}, "2 microbatches cannot fill 4 pipeline stages", id="few microbatches"),
    pytest.param("pp=2", {"microbatches": 2, "schedule": "zigzag"}, "unknown schedule 'zigzag'.*gpipe, 1f1b, "
                 "interleaved", id="unknown schedule"),
    pytest.param("pp=2", {"microbatches": 2, "schedule": "1f1b:2"}, "--schedule: '1f1b:2'", id="virtual stages on 1f1b"),
    pytest.param("pp=2", {"microbatches": 2, "schedule": "interleaved:0"}, "interleaved:V", id="zero virtual stages"),
])
def test_bad_plans_name_the_part(text, kw, message):
    with pytest.raises(UsageError, match=message) as e:
        parse_parallel(text, **kw)
    assert e.value.exit_code == 2


@pytest.mark.parametrize("text, policy, ops", [
    (None, "none", frozenset()), ("none", "none", frozenset()), ("FULL", "full", frozenset()),
    ("Non-Reentrant", "non-reentrant", frozenset()),
    ("selective", "selective", frozenset()), ("Softmax, Gelu", "ops", frozenset({"Softmax", "Gelu"})),
    ("com.microsoft:FastGelu", "ops", frozenset({"com.microsoft:FastGelu"})),
])
def test_recompute_policies(text, policy, ops):
    r = parse_recompute(text)
    assert (r.policy, r.ops) == (policy, ops)
    assert parse_recompute(r) is r


@pytest.mark.parametrize("text", ["", "Soft max", "all!", "non-reentrnt"])
def test_bad_recompute_lists_the_policies(text):
    with pytest.raises(UsageError, match="none, full, non-reentrant, selective"):
        parse_recompute(text)


def test_a_policy_record_is_checked():
    with pytest.raises(UsageError, match="unknown policy 'some'"):
        Recompute("some")
    with pytest.raises(UsageError, match="operator types with the 'ops' policy"):
        Recompute("full", frozenset({"Gelu"}))


def test_a_node_lists_operator_types_are_its_own_whatever_was_asked_before():
    """The operator types the plan checks read (an ``ops`` recompute policy's) are found once per node list: a
    second list's are its own, and a list asked again is answered as before."""
    from types import SimpleNamespace

    from flopcount.parallel.ranks import _op_types

    first = tuple(SimpleNamespace(op_type=t) for t in ("MatMul", "Softmax", "MatMul"))
    second = tuple(SimpleNamespace(op_type=t) for t in ("Gemm", "Relu"))
    assert _op_types(first) == {"MatMul", "Softmax"}
    assert _op_types(second) == {"Gemm", "Relu"}
    assert _op_types(first) == {"MatMul", "Softmax"}
