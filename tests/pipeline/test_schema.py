"""Which inputs of an operator may carry a gradient, as ONNX's schemas say (what :mod:`flopcount.pipeline.schema` reads)."""

import onnx
import pytest


# The categories of ONNX's schemas that flopcount.pipeline.schema reads and the backward cases of tests/operators/ rely on:
# an input the schema marks NonDifferentiable never gets a gradient, any other may.


def category(op_type, opset, i):
    """The differentiation category ONNX's schema of ``op_type`` at ``opset`` gives input ``i``."""
    schema = onnx.defs.get_schema(op_type, opset, "")
    return schema.inputs[min(i, len(schema.inputs) - 1)].differentiation_category


@pytest.mark.parametrize("op_type, opset, i, differentiable", [
    pytest.param("SoftmaxCrossEntropyLoss", 13, 2, False, id="sce-13-weights-non-diff"),
    pytest.param("SoftmaxCrossEntropyLoss", 12, 2, True, id="sce-12-weights-unknown"),
    pytest.param("NegativeLogLikelihoodLoss", 22, 2, False, id="nll-22-weight-non-diff"),
    pytest.param("NegativeLogLikelihoodLoss", 12, 2, True, id="nll-12-weight-unknown"),
    pytest.param("Mod", 13, 1, False, id="mod-13-divisor-non-diff"),
    pytest.param("Mod", 10, 1, True, id="mod-10-divisor-unknown"),
    pytest.param("RotaryEmbedding", 23, 1, True, id="rotary-cos-unknown"),
    pytest.param("LinearAttention", 27, 3, False, id="linear-attention-past-state-non-diff"),
    pytest.param("LinearAttention", 27, 4, True, id="linear-attention-decay-diff"),
    pytest.param("ScatterND", 18, 1, False, id="scatter-nd-indices-non-diff"),
    pytest.param("ScatterElements", 18, 2, True, id="scatter-elements-updates-diff"),
    pytest.param("CumProd", 26, 1, False, id="cumprod-axis-non-diff"),
    pytest.param("TopK", 24, 1, False, id="topk-k-non-diff"),
])  # fmt: skip
def test_schema_categories(op_type, opset, i, differentiable):
    # the cases below rely on these: NonDifferentiable inputs never get a gradient, others may
    non = category(op_type, opset, i) == onnx.defs.OpSchema.DifferentiationCategory.NonDifferentiable
    assert non is not differentiable
