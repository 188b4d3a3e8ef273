"""A mask a fused attention is handed that the export folded into a constant: torch's kernel makes its float mask
at each call from the boolean one the program made in the forward (positions alone: a sliding window), and keeps
it; the torch.export frontend folds that boolean mask and its conversion into one stored tensor, which is no
weight of the model. Checked against the storages torch's autograd saves in a real CPU step."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flopcount  # noqa: E402
from flopcount.frontends.export import export_dynamo  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402
from helpers import saved_storages  # noqa: E402

B, H, HEADS, HEAD = 3, 16, 4, 8  # batch, hidden, query heads, head size
SEED_OFFSET = 16


class Window(torch.nn.Module):
    """x → Q (4 heads of 8), K and V (2 heads, repeated to 4) → sdpa handed a boolean window of 2 keys made of
    positions in the forward → sum."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(H, n * HEAD, bias=False) for n in (HEADS, 2, 2))

    def forward(self, x):
        def heads(t, n):
            return t.unflatten(-1, (n, HEAD)).transpose(1, 2)

        q, k, v = heads(self.q(x), HEADS), heads(self.k(x), 2), heads(self.v(x), 2)
        i = torch.arange(x.shape[1], device=x.device)
        window = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 2)
        return torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1),
                                                                v.repeat_interleave(2, 1), attn_mask=window).sum()


def exported(s: int, dtype):
    torch.manual_seed(0)
    module, x = Window().to(dtype).train(), torch.randn(B, s, H, dtype=dtype)
    return module, x, export_dynamo(module, (x,), ["x"], ["y"], 18)


def activations(m, device: str) -> int:
    report = flopcount.count(m, mode="train", batch=B, memory=MemorySettings(device=device))
    assert not report.memory.missing and not report.memory.unsized
    return report.memory.ranks[0].activations_bytes


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("s", [8, 7])
def test_a_folded_window_is_the_float_mask_the_cpu_kernel_keeps(s, dtype):
    """The export holds the window as one stored [s, s] tensor in the scores' type (no node makes it); torch's CPU
    flash kernel keeps x (B·s·H), Q, K and V repeated and its output (B·4·s·8 each), a float32 log-sum-exp per
    query row (B·4·s) and the window converted to the query's type (s·s), 256 B in float32 at s = 8."""
    dt = getattr(torch, dtype)
    module, x, m = exported(s, dt)
    stored = {t.name: tuple(t.dims) for t in m.graph.initializer}
    made = {o for n in m.graph.node for o in n.output}
    adds = [n for n in m.graph.node if n.op_type == "Add" and any(stored.get(i) == (s, s) for i in n.input)]
    assert len(adds) == 1 and not made & {i for i in adds[0].input if i in stored}
    size = dt.itemsize
    want = size * (B * s * H + 4 * B * HEADS * s * HEAD + s * s) + 4 * B * HEADS * s
    assert activations(m, "cpu") == saved_storages(module, (x,)) == want


@pytest.mark.parametrize("s", [8, 7])
def test_a_folded_window_on_cuda_is_padded_by_the_memory_efficient_kernel(s):
    """On CUDA a float32 masked call runs the memory-efficient kernel: the window converted to float32, its rows of
    7 padded to 8 (a copy, s·8), the log-sum-exp padded to 32 rows (B·4·32·⌈s/32⌉) and the philox seed and
    offset; the same figures as the TorchScript export of the same module, which writes the mask's nodes
    (tests/memory/test_memory_cuda_sdpa.py)."""
    _, _, m = exported(s, torch.float32)
    mask = s * 8 * math.ceil(s / 8)
    want = 4 * (B * s * H + 4 * B * HEADS * s * HEAD + mask + B * HEADS * 32 * math.ceil(s / 32)) + SEED_OFFSET
    assert activations(m, "cuda") == want
