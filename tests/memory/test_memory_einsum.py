"""torch's ``einsum`` and constant ``pad`` as the memory ledger reads them (:mod:`flopcount.memory.kernels`), checked
against the unique storages torch's autograd saves in one real step on this CPU and against closed forms.

``einsum`` of two operands runs one ``bmm`` (ATen's ``sumproduct_pair``): the left operand read as ``[lro, lo,
summed]``, the right as ``[lro, summed, ro]``, the operands swapped where the right's output letters all come before
the left's. An operand whose strides allow no such view is copied, and the ``bmm`` keeps the copy; the product is
laid out as ``[lro, lo, ro]``. Constant ``pad`` of a 4-D tensor whose strides are channels-last makes a
channels-last tensor. Each operand here is ``exp`` of a parameter (``exp`` keeps its output), laid out as a test
asks by a permute, so every kept byte is written out below.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flopcount  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402
from helpers import saved_storages  # noqa: E402

F32 = 4


def activations(module) -> int:
    report = flopcount.from_torch(module.train(), (), training=True, optimizer="sgd", cache_dir=False,
                                  memory=MemorySettings(device="cpu"))
    assert not report.memory.missing and not report.memory.unsized
    return report.memory.ranks[0].activations_bytes


def torch_step(module) -> int:
    kept = saved_storages(module.train(), ())
    module().backward()
    return kept


class Contract(torch.nn.Module):
    """``einsum(equation, exp(p).permute(pa), exp(q).permute(pb)).sum()``: p and q stored in the order their
    permutation reads them, so that the operands have the strides a test asks for."""

    def __init__(self, equation, a, pa, b, pb):
        super().__init__()
        self.equation, self.pa, self.pb = equation, pa, pb
        self.p, self.q = torch.nn.Parameter(torch.randn(*a) / 4), torch.nn.Parameter(torch.randn(*b) / 4)

    def forward(self):
        return torch.einsum(self.equation, self.p.exp().permute(*self.pa), self.q.exp().permute(*self.pb)).sum()


def numel(*shape: int) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


# b, c, l (s), h, n, p: distinct sizes but c, so that no swap of letters can pass
Bt, L, Hd, N, P = 2, 8, 4, 3, 5
C = (Bt, 1, L, Hd, N)  # (b, c, l, h, n), contiguous
KEEP = tuple(range(5))


@pytest.mark.parametrize("module, copied", [
    # bclhn,bcshn->bclsh: lro = b, h; lo = l; summed = n; ro = s. Neither operand is a view of [b·h, l, n]
    # (h lies inside l in memory): both copied
    pytest.param(Contract("bclhn,bcshn->bclsh", C, KEEP, C, KEEP), 2 * numel(*C), id="both operands copied"),
    # the same with each operand stored as (b, c, h, l, n): [b·h, l, n] is a view of it, nothing copied
    pytest.param(Contract("bclhn,bcshn->bclsh", (Bt, 1, Hd, L, N), (0, 1, 3, 2, 4),
                          (Bt, 1, Hd, L, N), (0, 1, 3, 2, 4)), 0, id="views: nothing copied"),
    # bclhn,bclhp->bchpn: p (the right's) comes before n (the left's) in the output, so torch swaps the operands:
    # the left is the second, read as [b·h, p, l], a view of its storage (b, c, h, p, l); the first, read as
    # [b·h, l, n], is copied. Unswapped, the second would be copied instead (P > N: the figures differ)
    pytest.param(Contract("bclhn,bclhp->bchpn", C, KEEP, (Bt, 1, Hd, P, L), (0, 1, 4, 2, 3)), numel(*C),
                 id="operands swapped: the first copied"),
    # ij,jk->ik of contiguous matrices: a view of each as [1, i, j] and [1, j, k]
    pytest.param(Contract("ij,jk->ik", (3, 4), (0, 1), (4, 5), (0, 1)), 0, id="a matrix product: views"),
])
def test_einsum_keeps_the_operands_its_bmm_copies(module, copied):
    torch.manual_seed(0)
    exps = F32 * (module.p.numel() + module.q.numel())  # exp keeps its output, the operands' storages
    assert activations(module) == torch_step(module) == exps + F32 * copied


class PaddedScan(torch.nn.Module):
    """Mamba 2's chunking: x [b, l, h, p] channels-last in memory (a transposed convolution output split into
    heads), padded along l to the chunk, reshaped into [b, c, l, h, p] and contracted with M [b, c, l, s, h]."""

    def __init__(self):
        super().__init__()
        self.x = torch.nn.Parameter(torch.randn(Bt, Hd, P, 7) / 4)  # (b, h, p, l): l innermost
        self.m = torch.nn.Parameter(torch.randn(Bt, 1, L, L, Hd) / 4)

    def forward(self):
        x = torch.nn.functional.pad(self.x.exp().permute(0, 3, 1, 2), (0, 0, 0, 0, 0, 1))
        return torch.einsum("bclsh,bcshp->bclhp", self.m.exp(), x.reshape(Bt, 1, L, Hd, P)).sum()


def test_a_constant_pad_keeps_a_channels_last_layout():
    """The pad of the channels-last x is channels-last ([b, h, p, l] in memory), so the product's right operand
    [b·h, s, p] is a view of it, kept whole; its left, M read as [b·h, l, s], is a copy (h is innermost in M). Kept:
    the two exps' outputs, the padded x and M's copy. Were the pad contiguous, x would be copied as well (its
    B·L·H·P floats twice)."""
    torch.manual_seed(0)
    module = PaddedScan()
    exps = numel(Bt, Hd, P, 7) + numel(Bt, 1, L, L, Hd)
    expected = F32 * (exps + numel(Bt, L, Hd, P) + numel(Bt, 1, L, L, Hd))
    assert activations(module) == torch_step(module) == expected
