"""``--memory-device cuda`` reads an exported sdpa as the kernel torch's CUDA dispatcher runs
(:mod:`flopcount.memory.cuda_sdpa`): flash, the memory-efficient kernel or the math path, each keeping what its
backward needs. The closed forms are written out below; on a CUDA device the same graphs are checked against the
storages torch's autograd saves."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flopcount  # noqa: E402
from flopcount.memory.cuda_sdpa import EFFICIENT, FLASH, MATH, SdpaCall, cuda_kernel  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402
from helpers import saved_storages  # noqa: E402

B, S, H = 3, 8, 16  # batch, sequence (a multiple of 8: the mask needs no padding), hidden
F32, BF16, SEED_OFFSET = 4, 2, 16
_F32, _F16, _BF16 = 1, 10, 16


class Attend(torch.nn.Module):
    """x → Q (4 heads of ``head``) and K, V (``kv`` heads) → sdpa → sum: ``is_causal`` (no mask handed; grouped
    where ``kv`` < 4), or K and V repeated to Q's heads and a boolean window of 2 keys handed as the mask."""

    def __init__(self, kv: int, head: int, masked: bool):
        super().__init__()
        self.kv, self.head, self.masked = kv, head, masked
        self.q, self.k, self.v = (torch.nn.Linear(H, n * head, bias=False) for n in (4, kv, kv))

    def forward(self, x):
        def heads(t, n):
            return t.unflatten(-1, (n, self.head)).transpose(1, 2)

        q, k, v = heads(self.q(x), 4), heads(self.k(x), self.kv), heads(self.v(x), self.kv)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if not self.masked:
            return sdpa(q, k, v, is_causal=True, enable_gqa=self.kv != 4).sum()
        i = torch.arange(x.shape[1], device=x.device)
        window = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 2)
        r = 4 // self.kv
        return sdpa(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), attn_mask=window).sum()


def ledger(module, dtype, device="cuda", s=S) -> int:
    """The ledger's activations of one training step of ``module`` in ``dtype``: exported by the TorchScript
    exporter in float32, by the torch.export frontend in bf16 (the TorchScript exporter writes a bf16 sdpa with
    casts inside it, which flopcount.memory.promoted reads at torch's types; either export gives the same figures)."""
    from flopcount.frontends.export import export_dynamo

    torch.manual_seed(0)
    module, x = module.to(dtype).train(), torch.randn(B, s, H, dtype=dtype)
    settings = MemorySettings(device=device)
    if dtype == torch.float32:
        report = flopcount.from_torch(module, (x,), training=True, optimizer="sgd", cache_dir=False, memory=settings)
    else:
        m = export_dynamo(module, (x,), ["x"], ["y"], 18)
        report = flopcount.count(m, mode="train", batch=B, memory=settings)
    assert not report.memory.missing and not report.memory.unsized
    return report.memory.ranks[0].activations_bytes


def test_the_dispatcher_order_and_checks():
    """torch's ``select_sdp_backend``: flash for fp16/bf16 without a mask, heads ≤ 256 (grouped allowed); else the
    memory-efficient kernel for equal heads whose sizes are multiples of 4 (fp32) or 8 (fp16, bf16); else math."""
    def call(dtype=_BF16, head=64, head_v=None, masked=False, grouped=False):
        return cuda_kernel(SdpaCall(dtype, head, head, head_v or head, masked, grouped))

    assert call() == call(_F16, 256) == call(head=4) == call(grouped=True) == FLASH
    assert call(head=264) == call(masked=True) == call(_F32) == call(_F32, 4, masked=True) == EFFICIENT
    assert call(head=4, masked=True) == call(_F32, 6) == call(_F32, grouped=True) == MATH
    assert call(_F32, 8, head_v=6) == call(masked=True, grouped=True) == call(0) == MATH


@pytest.mark.parametrize("s", [S, 7])
def test_fp32_masked_is_the_memory_efficient_kernel(s):
    """x (B·s·H), Q, K and V repeated to 4 heads and the output (B·4·s·8 each), the window converted to float32
    (s·s; at s = 7 its rows padded to 8 columns, a copy: s·8), the log-sum-exp padded to 32 rows
    (B·4·32·⌈s/32⌉ float32) and the philox seed and offset."""
    mask = s * 8 * math.ceil(s / 8)
    want = F32 * (B * s * H + 4 * B * 4 * s * 8 + mask + B * 4 * 32 * math.ceil(s / 32)) + SEED_OFFSET
    assert ledger(Attend(2, 8, True), torch.float32, s=s) == want


def test_bf16_unmasked_equal_heads_is_flash():
    """x (B·S·H), Q, K, V and the output (B·4·S·8 each, bf16), a float32 log-sum-exp per query row (B·4·S), the
    philox seed and offset."""
    want = BF16 * (B * S * H + 4 * B * 4 * S * 8) + F32 * B * 4 * S + SEED_OFFSET
    assert ledger(Attend(4, 8, False), torch.bfloat16) == want


def test_bf16_flash_pads_the_head_size():
    """A head of 4: torch pads Q, K and V to 8 before flash (copies, B·4·S·8 each) and keeps its output so padded
    (B·4·S·8); the log-sum-exp and the seed and offset as before."""
    want = BF16 * (B * S * H + 4 * B * 4 * S * 8) + F32 * B * 4 * S + SEED_OFFSET
    assert ledger(Attend(4, 4, False), torch.bfloat16) == want


def test_fp32_grouped_unmasked_is_the_math_path():
    """K and V of 2 heads for Q's 4: flash needs fp16 or bf16 and the memory-efficient kernel equal heads, so
    torch runs its math path, which keeps what eager attention keeps: x (B·S·H), the scaled Q and Kᵀ repeated to 4
    heads, the probabilities (B·4·S·S) and V repeated (B·4·S·8). The CPU's kernel reads the same graph fused."""
    want = F32 * (B * S * H + 3 * B * 4 * S * 8 + B * 4 * S * S)
    assert ledger(Attend(2, 8, False), torch.float32) == want
    cpu = F32 * (B * S * H + 2 * B * 4 * S * 8 + 2 * B * 2 * S * 8 + B * 4 * S)
    assert ledger(Attend(2, 8, False), torch.float32, "cpu") == cpu


@pytest.mark.gpu
@pytest.mark.parametrize("kv, head, masked, dtype, s", [(2, 8, True, "float32", S), (2, 8, True, "float32", 7),
                                                        (4, 8, False, "bfloat16", S), (2, 8, False, "float32", S),
                                                        (4, 8, True, "float32", S), (4, 4, False, "bfloat16", S)])
def test_the_ledger_equals_the_storages_torch_saves_on_cuda(kv, head, masked, dtype, s):
    """The storages torch's autograd keeps for one forward on a CUDA device equal the ledger's reading."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    module = Attend(kv, head, masked).to(dt).cuda().train()
    kept = saved_storages(module, (torch.randn(B, s, H, dtype=dt, device="cuda"),))
    assert ledger(Attend(kv, head, masked), dt, s=s) == kept
