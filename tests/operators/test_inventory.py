"""Every operator is classified: a formula or an explicit zero cost, never a silent zero.

Walks onnx's own single-node test cases (``collect_testcases()``) and the operator schemas of the
installed onnx (``onnx.defs``).
"""

import onnx
import pytest
from onnx.backend.test.case.node import collect_testcases

import flopcount
from flopcount.pipeline.onnx_cases import run_time_facts
from flopcount.registry import lookup

CASES = collect_testcases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_testcase_counts_with_no_unsupported_op(case):
    values, shapes, trips = run_time_facts(case)
    r = flopcount.count(case.model, input_values=values, input_shapes=shapes, loop_trips=trips, strict=True)
    assert r.total.flops >= 0 and r.total.int_ops >= 0


# Operators that knowingly have no backward formula yet (a training count lists them, never zero);
# none among those onnx's test cases exercise.
WITHOUT_BACKWARD: set[str] = set()


def _trained(case) -> tuple[onnx.ModelProto, dict]:
    """The case's model with every float input of static shape turned into a trainable weight
    (an initializer whose data is in a missing external file), so that every input gradient a
    backward formula can give is asked for; returns it and the input values still given."""
    from helpers import weight

    from flopcount.context import FLOAT_TYPES

    values, shapes, trips = run_time_facts(case)
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    keep = []
    for vi in m.graph.input:
        tt = vi.type.tensor_type
        dims = [d.dim_value for d in tt.shape.dim] if tt.HasField("shape") else None
        if vi.name in (values or {}) or tt.elem_type not in FLOAT_TYPES or dims is None or any(d <= 0 for d in dims):
            keep.append(vi)
        else:
            m.graph.initializer.append(weight(vi.name, dims, tt.elem_type))
    del m.graph.input[:]
    m.graph.input.extend(keep)
    shapes = {k: v for k, v in (shapes or {}).items() if k in {vi.name for vi in keep}}
    return m, dict(input_values=values, input_shapes=shapes or None, loop_trips=trips)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_testcase_counts_in_training_with_its_inputs_trained(case):
    m, facts = _trained(case)
    r = flopcount.count(m, mode="train", **facts)
    assert r.backward.flops >= 0 and r.total.flops >= r.forward.flops
    assert set(r.backward_unsupported) <= WITHOUT_BACKWARD


DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview", "ai.onnx.preview.training")
SCHEMAS = sorted({(s.domain, s.name) for s in onnx.defs.get_all_schemas_with_history() if s.domain in DOMAINS})


@pytest.mark.parametrize("domain, op_type", SCHEMAS, ids=[f"{d or 'ai.onnx'}:{o}" for d, o in SCHEMAS])
def test_every_operator_schema_is_classified(domain, op_type):
    rule = lookup(domain, op_type)
    assert rule is not None, f"{domain or 'ai.onnx'}:{op_type} has neither a formula nor a zero-cost entry"
    assert rule.equation, "a formula's docstring must state its equation; a zero-cost entry its reason"


def test_operator_docs_are_current():
    import pathlib

    from flopcount.output.docs import operators_markdown

    path = pathlib.Path(__file__).parents[2] / "docs" / "operators.md"
    assert path.read_text(encoding="utf-8") == operators_markdown(), (
        "docs/operators.md is stale: regenerate it with python -m flopcount.output.docs -o docs/operators.md"
    )
