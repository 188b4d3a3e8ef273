"""sdpa's math path in bfloat16 keeps its tensors in float32 (:mod:`flopcount.memory.math_sdpa`): torch upcasts Q,
K and V of a 16-bit call and runs the attention in float32. Checked against the storages torch's autograd saves in
a real CPU step, for both exporters."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flopcount  # noqa: E402
from flopcount.frontends.export import export_dynamo  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402
from helpers import saved_storages, sdpa_attend  # noqa: E402

B, S, H = 3, 5, 8  # batch, sequence, hidden
BF16, F32 = 2, 4


def ledgers(module, x) -> tuple[int, int]:
    """The ledger's activations of one CPU step of ``module``: its TorchScript export (``from_torch``), then its
    torch.export one."""
    settings = MemorySettings(device="cpu")
    script = flopcount.from_torch(module, (x,), training=True, optimizer="sgd", cache_dir=False, memory=settings)
    m = export_dynamo(module, (x,), ["x"], ["y"], 18)
    dynamo = flopcount.count(m, mode="train", batch=B, memory=settings)
    return script.memory.ranks[0].activations_bytes, dynamo.memory.ranks[0].activations_bytes


@pytest.mark.parametrize("kv, p", [(1, 0.0), (4, 0.25)])
def test_bf16_math_path_keeps_float32(kv, p):
    """K and V of one head (multi-query, no ``enable_gqa``: the math path) or dropout on the CPU: the projections
    keep x (B·S·H, bf16); the math path keeps in float32 the scaled Q and Kᵀ and V as ``matmul`` reads them (K and V
    copied to Q's 4 heads; B·4·S·2 each) and the softmax's output (B·4·S·S), with dropout also its float noise and
    the dropped probabilities (B·4·S·S each)."""
    torch.manual_seed(0)
    module, x = sdpa_attend(kv, p, H).to(torch.bfloat16).train(), torch.randn(B, S, H, dtype=torch.bfloat16)
    scores = (3 if p else 1) * B * 4 * S * S
    want = BF16 * B * S * H + F32 * (3 * B * 4 * S * 2 + scores)
    assert ledgers(module, x) == (want, want)
    assert saved_storages(module, (x,)) == want


def test_bf16_fused_kernel_keeps_its_own_type():
    """No dropout and as many K and V heads as Q's: the CPU's fused kernel, which keeps Q, K, V and its output in
    bf16 (B·4·S·2 each) and a float32 log-sum-exp per query row (B·4·S); nothing is widened."""
    torch.manual_seed(0)
    module, x = sdpa_attend(4, 0.0, H).to(torch.bfloat16).train(), torch.randn(B, S, H, dtype=torch.bfloat16)
    want = BF16 * (B * S * H + 4 * B * 4 * S * 2) + F32 * B * 4 * S
    assert ledgers(module, x) == (want, want)
    assert saved_storages(module, (x,)) == want
