"""Einsum: each contraction step costs P = product of the sizes of the distinct indices it touches;
a step that sums an index is P MACs (2·P FLOPs) plus (k − 2)·P multiplies for k operands; one that
sums none is (k − 1)·P multiplies; a one-operand step is P − |out| additions. Two operands are one
naive step; three or more follow numpy.einsum_path(optimize="greedy")."""

import re

import numpy as np
import pytest
from helpers import model
from onnx import TensorProto, helper

import flopcount


def einsum(equation, *shapes, dtype=TensorProto.FLOAT, opset=18):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    return model([node], dict(zip(names, shapes)), ["y"], opset=opset, dtype=dtype)


CASES = [
    # id: equation, shapes, expected FLOPs, expected MACs (derived here)
    pytest.param("ij,jk->ik", [(7, 37), (37, 23)], 2 * 7 * 37 * 23, 7 * 37 * 23, id="matmul"),
    pytest.param("bij, bjk -> bik", [(5, 7, 37), (5, 37, 23)], 2 * 5 * 7 * 37 * 23, 5 * 7 * 37 * 23,
                 id="batch-matmul-with-spaces"),
    pytest.param("ij,jk", [(7, 37), (37, 23)], 2 * 7 * 37 * 23, 7 * 37 * 23, id="implicit-output-ik"),
    pytest.param("i,i", [(37,), (37,)], 2 * 37, 37, id="inner-product-implicit-scalar"),
    pytest.param("i,j", [(7,), (23,)], 7 * 23, 0, id="outer-product-multiplies-only"),
    pytest.param("ij,ij->ij", [(7, 23), (7, 23)], 7 * 23, 0, id="hadamard"),
    pytest.param("ij,jk->k", [(7, 37), (37, 23)], 2 * 7 * 37 * 23, 7 * 37 * 23, id="two-operands-naive"),
    pytest.param("bhqd,bhkd->bhqk", [(3, 5, 7, 11), (3, 5, 13, 11)], 2 * 3 * 5 * 7 * 13 * 11,
                 3 * 5 * 7 * 13 * 11, id="attention-scores"),
    pytest.param("...ij,...jk->...ik", [(5, 1, 7, 37), (3, 37, 23)], 2 * 5 * 3 * 7 * 37 * 23,
                 5 * 3 * 7 * 37 * 23, id="ellipsis-broadcast"),
    pytest.param("...ij,...jk", [(5, 1, 7, 37), (3, 37, 23)], 2 * 5 * 3 * 7 * 37 * 23,
                 5 * 3 * 7 * 37 * 23, id="ellipsis-implicit"),
    pytest.param("ij->ji", [(7, 23)], 0, 0, id="transpose"),
    pytest.param("ij->i", [(7, 23)], 7 * 23 - 7, 0, id="row-sum"),
    pytest.param("ij->", [(7, 23)], 7 * 23 - 1, 0, id="full-sum"),
    pytest.param("ii->i", [(37, 37)], 0, 0, id="diagonal"),
    pytest.param("ii", [(37, 37)], 37 - 1, 0, id="trace-implicit"),
    pytest.param("...ii->...i", [(3, 5, 5)], 0, 0, id="batch-diagonal"),
    pytest.param("->", [()], 0, 0, id="scalar"),
    # 3 operands, greedy: A·B first (result 7x5 removes the 91 dim), then (AB)·C
    pytest.param("ij,jk,kl->il", [(7, 91), (91, 5), (5, 37)], 2 * (7 * 91 * 5 + 7 * 5 * 37),
                 7 * 91 * 5 + 7 * 5 * 37, id="chain-greedy-ab-first"),
    # 3 operands, C·B first this time: the 91 dim sits between B and C
    pytest.param("ij,jk,kl->il", [(7, 5), (5, 91), (91, 3)], 2 * (5 * 91 * 3 + 7 * 5 * 3),
                 5 * 91 * 3 + 7 * 5 * 3, id="chain-greedy-bc-first"),
    # every index kept: numpy makes one 3-operand step of 2 multiplies per element
    pytest.param("ij,ij,ij->ij", [(7, 23), (7, 23), (7, 23)], 2 * 7 * 23, 0, id="three-way-hadamard"),
]


@pytest.mark.parametrize("equation, shapes, flops, macs", CASES)
def test_einsum(equation, shapes, flops, macs):
    r = flopcount.count(einsum(equation, *shapes)).total
    assert (r.flops, r.macs) == (flops, macs)
    assert r.int_ops == 0


def test_einsum_opset28():
    r = flopcount.count(einsum("ij,jk->ik", (7, 37), (37, 23), opset=28)).total
    assert r.flops == 2 * 7 * 37 * 23


def test_einsum_integer_inputs_are_int_ops():
    r = flopcount.count(einsum("ij,jk->ik", (7, 37), (37, 23), dtype=TensorProto.INT32)).total
    assert (r.flops, r.macs, r.int_ops) == (0, 7 * 37 * 23, 2 * 7 * 37 * 23)


def test_einsum_table3_one_flop_per_mac():
    m = einsum("ij,jk,kl->il", (7, 91), (91, 5), (5, 37))
    assert flopcount.count(m, convention="table3").total.flops == 7 * 91 * 5 + 7 * 5 * 37


def test_einsum_matches_matmul():
    m = helper.make_node("MatMul", ["x0", "x1"], ["y"])
    mm = flopcount.count(model([m], {"x0": (5, 7, 37), "x1": (5, 37, 23)}, ["y"])).total
    assert flopcount.count(einsum("bij,bjk->bik", (5, 7, 37), (5, 37, 23))).total == mm


@pytest.mark.parametrize("equation, shapes", [
    pytest.param("ij,jk,kl->il", [(7, 91), (91, 5), (5, 37)], id="chain"),
    pytest.param("bhqd,bhkd->bhqk", [(3, 5, 7, 11), (3, 5, 13, 11)], id="pair"),
    pytest.param("ab,bc,cd,de->ae", [(9, 31), (31, 3), (3, 29), (29, 5)], id="four-operands"),
])
def test_against_numpy_reported_flop_count(equation, shapes):
    # numpy's own report (printed to 4 digits) counts 2 per multiply-add and k − 1 per product
    # of k terms, like flopcount for multi-operand steps
    ops = [np.broadcast_to(np.empty(()), s) for s in shapes]
    _, text = np.einsum_path(equation, *ops, optimize="greedy")
    numpy_flops = float(re.search(r"Optimized FLOP count:\s*([0-9.e+]+)", text).group(1))
    r = flopcount.count(einsum(equation, *shapes)).total
    assert r.flops == pytest.approx(numpy_flops, rel=1e-3)
