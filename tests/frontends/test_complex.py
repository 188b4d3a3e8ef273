"""Complex arithmetic exported as pairs of real numbers (:mod:`flopcount.frontends.complex`): a rotary embedding
written with ``torch.polar`` and ``view_as_complex`` (as Llama 4's) computes the same values under the mode, and
its export counts the real operations a complex product costs. Llama 4 itself is in test_architecture_sweep.py."""

from __future__ import annotations

import pytest

import flopcount

torch = pytest.importorskip("torch")

from flopcount.frontends.complex import complex_as_pairs  # noqa: E402

B, S, HEADS, D = 2, 5, 3, 8  # D real numbers per head: D/2 complex ones


class ComplexRotary(torch.nn.Module):
    def __init__(self, scaling: float = 1.0):
        super().__init__()
        self.q = torch.nn.Linear(HEADS * D, HEADS * D, bias=False)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)), persistent=False)
        self.scaling = scaling

    def forward(self, x):
        freqs = torch.arange(x.shape[1]).float()[:, None] * self.inv_freq  # [S, D/2]
        freqs_cis = torch.polar(torch.ones_like(freqs), freqs) * self.scaling
        q = self.q(x).reshape(x.shape[0], x.shape[1], HEADS, D)
        q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        return torch.view_as_real(q_ * freqs_cis[:, None, :]).flatten(2)


def test_pairs_compute_what_complex_numbers_compute():
    torch.manual_seed(0)
    module, x = ComplexRotary(0.5).eval(), torch.randn(B, S, HEADS * D)
    with torch.no_grad():
        eager = module(x)
        with complex_as_pairs():
            paired = module(x)
    assert torch.allclose(eager, paired, atol=1e-6)


def test_complex_rotary_counts_its_real_operations():
    torch.manual_seed(0)
    r = flopcount.from_torch(ComplexRotary(0.5), (B, S, HEADS * D), cache_dir=False)
    n = B * S * HEADS * D // 2  # complex products q·freqs_cis
    table = S * D // 2  # rotary angles
    ops = {k: v.cost.flops for k, v in r.by_op_type.items()}
    assert ops["MatMul"] == 2 * B * S * (HEADS * D) ** 2
    # (a + bi)(c + di) = (ac − bd) + (ad + bc)i: four products, one difference and one sum per complex product;
    # the angles (positions × inverse frequencies), polar's r·cos θ and r·sin θ, and the scaling of both parts
    assert ops["Mul"] == 4 * n + table + 2 * table + 2 * table
    assert ops["Sub"] == n and ops["Add"] == n
    assert ops["Cos"] == ops["Sin"] == table


def test_complex_arithmetic_beyond_products_is_refused_by_name():
    # under the mode, what a pair cannot do exactly is an error naming the function (the export then fails with
    # it, rather than counting something else)
    with complex_as_pairs():
        z = torch.view_as_complex(torch.randn(B, 4, 2))
        with pytest.raises(TypeError, match="abs of a complex tensor"):
            torch.abs(z)
        with pytest.raises(TypeError, match="float32 is not supported"):
            z.to(torch.float32)
