"""FLOPs per rank against torch's own runs: pipeline parallelism through ``torch.distributed.pipelining`` and FSDP2
``fully_shard`` on 2 forked gloo ranks, and recompute through ``torch.utils.checkpoint``, each counted by
``torch.utils.flop_counter.FlopCounterMode`` and compared with the ledger (flopcount.parallel.ranks) exactly.

The model is the tiny Llama of tests/core/test_parallel_ledger.py (hidden H, L layers, HEADS heads of D, KV_HEADS
K/V heads, MLP width FFN, vocabulary V, microbatch B×S), counted once from its Hugging Face config, and written
again here with plain modules for torch to run. What torch's counter sees, and so what is compared: it counts the
products only (aten.mm, aten.bmm, aten.addmm; forward, and in the backward the gradients of both operands), not the
norms, softmax, residual adds, rotary tables or loss that the ledger also counts. So each comparison is the
ledger's share of the product nodes (family matmul/gemm) on that rank. The embedding lookup and the loss are
gathers and elementwise ops: no product in either count."""

from __future__ import annotations

import json

import pytest

from flopcount.parallel.plan import parse_parallel, parse_recompute
from flopcount.parallel.ranks import ledger, node_shares

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, L, HEADS, KV_HEADS, FFN, V = 32, 4, 4, 2, 48, 64
D = H // HEADS
B, S = 2, 8
PRODUCTS = ("matmul", "gemm")


@pytest.fixture(scope="module")
def report():
    import flopcount

    config = transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V)
    return flopcount.from_hf(config, (B, S), cache_dir=False, mode="train")


def plan(text: str, m: int = 1, schedule: str = "1f1b"):
    return parse_parallel(text, microbatches=m, schedule=schedule)


def products(report, p, recompute=None, what=("forward", "backward", "recompute"), **where):
    """The ledger's product FLOPs per microbatch on the (stage, chunk, tp) picked by ``where``."""
    return sum(sum(getattr(x, w) for w in what) for x in node_shares(report, p, recompute)
               if report.nodes[x.index].family in PRODUCTS and all(getattr(x, k) == v for k, v in where.items()))


# --- the tiny Llama as torch runs it ----------------------------------------------------------------------------

def _modules():
    """(Layer, Embed, Head): a decoder layer (RMSNorm, Q/K/V/O with 2 K/V heads shared by 2 query heads each,
    causal softmax attention, RMSNorm, SwiGLU MLP, residual adds), the embedding, the final norm and LM head."""
    nn = torch.nn

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_norm, self.post_norm = Norm(), Norm()
            self.q, self.o = nn.Linear(H, H, bias=False), nn.Linear(H, H, bias=False)
            self.k, self.v = (nn.Linear(H, KV_HEADS * D, bias=False) for _ in range(2))
            self.gate, self.up = (nn.Linear(H, FFN, bias=False) for _ in range(2))
            self.down = nn.Linear(FFN, H, bias=False)

        def forward(self, x):
            b, s = x.shape[:2]
            y = self.input_norm(x)
            q = self.q(y).view(b, s, HEADS, D).transpose(1, 2)
            k = self.k(y).view(b, s, KV_HEADS, D).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, 1)
            v = self.v(y).view(b, s, KV_HEADS, D).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, 1)
            causal = torch.full((s, s), float("-inf")).triu(1)
            a = torch.softmax(q @ k.transpose(-1, -2) / D ** 0.5 + causal, -1) @ v
            x = x + self.o(a.transpose(1, 2).reshape(b, s, H))
            y = self.post_norm(x)
            return x + self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.lm_head = Norm(), nn.Linear(H, V, bias=False)

        def forward(self, x):
            return self.lm_head(self.norm(x))

    return Layer, nn.Embedding, Head


def _llama(layers=range(L), embed=True, head=True, checkpoint=None):
    """The layers ``layers`` of the tiny Llama, with the embedding and the head when asked, as one module;
    ``checkpoint(fn, x)`` wraps each decoder layer's call."""
    Layer, Embed, Head = _modules()

    class Part(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = Embed(V, H) if embed else None
            self.layers = torch.nn.ModuleDict({str(i): Layer() for i in layers})
            self.head = Head() if head else None

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            for layer in self.layers.values():
                x = checkpoint(layer, x) if checkpoint else layer(x)
            return self.head(x) if self.head is not None else x

    return Part()


def _loss(logits, target):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1))


# --- recompute (one process) ------------------------------------------------------------------------------------

def _counted(checkpoint=None) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = _llama(checkpoint=checkpoint)
    ids = torch.randint(0, V, (B, S))
    with FlopCounterMode(display=False) as counter:
        _loss(model(ids), ids).backward()
    return counter.get_total_flops()


def test_full_recompute_is_torch_checkpoint_per_layer(report):
    """torch.utils.checkpoint (non-reentrant) around each decoder layer runs the layer's forward again in the
    backward, but stops as soon as every tensor the backward saved is back: the last one is the input of the down
    projection (saved by that product before it runs), so the down projection and the residual add after it are
    not run again. The ledger's ``full`` policy is the same set of nodes."""
    from torch.utils.checkpoint import checkpoint

    base = _counted()
    full = _counted(lambda fn, x: checkpoint(fn, x, use_reentrant=False))
    p, r = plan("dp=1"), parse_recompute("full")
    assert base == products(report, p, what=("forward", "backward"))
    # per layer again: Q and O (H×H), K and V (H×KV_HEADS·D), gate and up (H×FFN), scores and product with V
    again = L * 2 * B * S * (2 * H * H + 2 * H * KV_HEADS * D + 2 * H * FFN + 2 * HEADS * S * D)
    assert full - base == again == products(report, p, r, what=("recompute",))
    rank = ledger(report, p, r).ranks[0]
    down = L * 2 * B * S * FFN * H
    layers_fwd = sum(n.cost.flops for n, sc in zip(report.nodes, report.modules.nodes)
                     if any(".layers." in s for s in sc))
    assert rank.recompute_flops == layers_fwd - down - L * B * S * H  # all of each layer but down_proj and its add


def _attention_core_policy(ctx, op, *args, **kwargs):
    """Selective activation checkpointing that runs the attention core again (the score and value products and the
    softmax between them) and keeps every other op's output: the ledger's ``selective``."""
    from torch.utils.checkpoint import CheckpointPolicy

    again = (torch.ops.aten.bmm.default, torch.ops.aten._softmax.default)
    return CheckpointPolicy.PREFER_RECOMPUTE if op in again else CheckpointPolicy.MUST_SAVE


def _save_products_policy(ctx, op, *args, **kwargs):
    """Selective activation checkpointing that keeps every product's output and runs the rest again."""
    from torch.utils.checkpoint import CheckpointPolicy

    keep = (torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default)
    return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize("policy,recompute", [
    pytest.param(_attention_core_policy, "selective", id="attention-core"),
    pytest.param(_save_products_policy, "Softmax,Mul,Div,Add,Pow,Sqrt,Sigmoid,ReduceMean", id="save-products"),
])
def test_selective_recompute_is_torch_sac(report, policy, recompute):
    """The ledger's ``selective`` runs each layer's attention core again (score product, scale, mask, softmax,
    product with V); torch expresses it as a policy that recomputes aten.bmm and aten._softmax and saves the rest.
    The policy that saves every product (and runs the norms, activations and softmax again) is the ledger's list
    of those operator types: no product runs again."""
    import functools

    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    contexts = functools.partial(create_selective_checkpoint_contexts, policy)
    base = _counted()
    sac = _counted(lambda fn, x: checkpoint(fn, x, use_reentrant=False, context_fn=contexts))
    r = parse_recompute(recompute)
    assert sac - base == products(report, plan("dp=1"), r, what=("recompute",))
    if recompute == "selective":
        assert sac - base == L * 2 * (2 * B * HEADS * S * S * D)  # scores Q·Kᵀ and the product with V
    else:
        assert sac == base and ledger(report, plan("dp=1"), r).ranks[0].recompute_flops > 0
