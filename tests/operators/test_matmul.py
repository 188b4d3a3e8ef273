"""MatMul and Gemm: 2·M·K·N per product, batch dims broadcast, 1-D operands, Gemm epilogue."""

import pytest
from helpers import single, weight

import flopcount

MATMUL = [
    # id: A shape, B shape, macs derived by hand (batch · M · K · N)
    pytest.param((7, 37), (37, 23), 7 * 37 * 23, id="2d"),
    pytest.param((5, 7, 37), (37, 23), 5 * 7 * 37 * 23, id="batched-A"),
    pytest.param((3, 1, 7, 37), (5, 37, 23), 3 * 5 * 7 * 37 * 23, id="broadcast-batch"),
    pytest.param((37,), (37, 23), 37 * 23, id="1d-A"),
    pytest.param((7, 37), (37,), 7 * 37, id="1d-B"),
    pytest.param((37,), (37,), 37, id="dot"),
    pytest.param((4, 37), (2, 3, 37, 23), 2 * 3 * 4 * 37 * 23, id="batched-B"),
]


@pytest.mark.parametrize("a, b, macs", MATMUL)
def test_matmul(a, b, macs):
    r = flopcount.count(single("MatMul", {"a": a, "b": b}))
    assert (r.total.flops, r.total.macs) == (2 * macs, macs)
    assert flopcount.count(single("MatMul", {"a": a, "b": b}), convention="table3").total.flops == macs


def test_matmul_with_weight_initializer():
    r = flopcount.count(single("MatMul", {"x": (3, 11, 91)}, [weight("W", (91, 23))]))
    assert r.total.flops == 2 * 3 * 11 * 91 * 23
    assert r.params == 91 * 23


GEMM = [
    # id: attrs, A shape, B shape, has C, C shape, expected extra FLOPs beyond 2·M·K·N (M=7, K=37, N=23)
    pytest.param({}, (7, 37), (37, 23), False, None, 0, id="plain"),
    pytest.param({}, (7, 37), (37, 23), True, (23,), 7 * 23, id="bias"),
    pytest.param({"transA": 1, "transB": 1}, (37, 7), (23, 37), True, (23,), 7 * 23, id="transposed"),
    pytest.param({"alpha": 0.5}, (7, 37), (37, 23), True, (23,), 7 * 23 + 7 * 23, id="alpha"),
    pytest.param({"beta": 2.0}, (7, 37), (37, 23), True, (7, 23), 7 * 23 + 7 * 23, id="beta-full-C"),
    pytest.param({"beta": 2.0}, (7, 37), (37, 23), True, (1, 23), 7 * 23 + 23, id="beta-row-C"),
]


@pytest.mark.parametrize("attrs, a, b, has_c, c, extra", GEMM)
def test_gemm(attrs, a, b, has_c, c, extra):
    inits = [weight("B", b)] + ([weight("C", c)] if has_c else [])
    m = single("Gemm", {"a": a}, inits, **attrs)
    r = flopcount.count(m)
    assert r.total.macs == 7 * 37 * 23
    assert r.total.flops == 2 * 7 * 37 * 23 + extra


def test_gemm_table3_is_flin_times_flout():
    # Table 3 fully-connected: FLin·FLout per sample; batch 4, 2048 → 1000 with bias
    m = single("Gemm", {"x": (4, 2048)}, [weight("W", (1000, 2048)), weight("b", (1000,))], transB=1)
    r = flopcount.count(m, convention="table3")
    assert r.per_sample.flops == 2048 * 1000
    assert flopcount.count(m).per_sample.flops == 2 * 2048 * 1000 + 1000


def test_against_torch_flop_counter():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    a, b = torch.randn(3, 1, 7, 37), torch.randn(5, 37, 23)
    with FlopCounterMode(display=False) as fc:
        torch.matmul(a, b)
    r = flopcount.count(single("MatMul", {"a": tuple(a.shape), "b": tuple(b.shape)}))
    assert r.total.flops == fc.get_total_flops()
