"""FLOPs, collective bytes and parameters per rank against 2 real TP ranks on gloo, for a BERT-like encoder written
with Megatron-style local shards: token, position and token-type embeddings summed and normed (the token table
vocab-parallel, its lookup all-reduced), post-norm layers of bidirectional attention (separate Q, K, V projections
with biases, column-parallel) and a GELU MLP, the output projections row-parallel with their biases whole on every
rank, and the masked-LM head: a dense transform, GELU and LayerNorm run whole on every rank, then the decoder tied to
the vocab-parallel token table with its bias split, the gradient of its input all-reduced; or, in its place, a
pooler and classifier run whole on every rank (no vocab-parallel head: no collective after the layers; under sp
the tokens gathered for them, their gradient only split). Each rank's ``FlopCounterMode`` total, the bytes it hands
to each collective, and its parameter bytes equal the ledger's.

And the encoder with its classifier under FSDP2 (``dp=2,fsdp``): FLOPs, the padded parameter bytes per rank and
the bytes of its collectives equal the ledger's: FSDP2 hands them padded tensors, and by default keeps the root
module's parameters unsharded from forward to backward (gathered once a microbatch, a layer's twice)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from gloo_shards import (B, D, H, HEADS, L, M, P, S, V, Recorder, count_fsdp_collectives, ledger_bytes,
                         tp_parts, vocab_lookup)
from helpers import gloo_ranks

from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger, node_shares

torch = pytest.importorskip("torch")

TYPES, LABELS = 2, 3  # 3 labels: FSDP2 pads the classifier's bias to 4


def bert_like(t: int = 1, rank: int = 0, rec: Recorder | None = None, head: str = "mlm", sp: bool = False):
    """The encoder on TP rank ``rank`` of ``t`` (whole with t = 1) with its ``head`` (``mlm`` or ``classifier``);
    ``rec``: its collectives (none on one rank). Under ``sp`` (the classifier's): the embedding's lookup
    all-reduced and, once normed, each rank keeping its tokens; the tokens gathered before each column-parallel
    product and reduce-scattered after each row-parallel one; gathered for the classifier every rank runs whole."""
    nn = torch.nn

    def same(x):
        return x

    reduce, copy, row, split, leave = (same,) * 5 if rec is None else (rec.reduce, rec.copy, rec.reduce, same, same)
    if rec is not None and sp:
        copy, split, leave = rec.gather, rec.split, rec.whole

        def row(y):
            return rec.scatter(y.view(B, S, -1)).reshape(-1, y.shape[-1])

    torch.manual_seed(0)
    Projection, Norm = tp_parts(t, rank, row)
    heads = HEADS // t

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = (Projection(H, H) for _ in range(3))
            self.output = Projection(H, H, row=True)

        def forward(self, y):
            q, k, v = (p(y).view(B, S, heads, D).transpose(1, 2) for p in (self.query, self.key, self.value))
            a = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, -1) @ v  # bidirectional: no mask
            return self.output(a.transpose(1, 2).reshape(B, S, heads * D))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention, self.norm1 = Attention(), Norm()
            self.intermediate, self.output, self.norm2 = Projection(H, 4 * H), Projection(4 * H, H, row=True), Norm()

        def forward(self, x):
            x = self.norm1(x + self.attention(copy(x)))
            return self.norm2(x + self.output(nn.functional.gelu(self.intermediate(copy(x)))))

    class Decoder(nn.Module):  # the bias over this rank's V/t logits
        def __init__(self):
            super().__init__()
            self.bias = nn.Parameter((torch.randn(V) * 0.1).chunk(t, 0)[rank].contiguous())

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Parameter(torch.randn(V, H).chunk(t, 0)[rank].contiguous())  # tied to the decoder
            self.positions, self.types = nn.Parameter(torch.randn(P, H)), nn.Parameter(torch.randn(TYPES, H))
            self.norm = Norm()
            self.layers = nn.ModuleList(Layer() for _ in range(L))
            if head == "mlm":
                self.transform, self.head_norm, self.decoder = Projection(H, H, whole=True), Norm(), Decoder()
            else:  # the first token's pooler and a classifier of the labels, replicated
                self.pooler, self.classifier = Projection(H, H, whole=True), Projection(H, LABELS, whole=True)

        def forward(self, ids, types):
            x = vocab_lookup(ids, self.tokens, rank, t, reduce)
            x = x + nn.functional.embedding(torch.arange(S), self.positions) + nn.functional.embedding(types,
                                                                                                       self.types)
            x = split(self.norm(x))
            for layer in self.layers:
                x = layer(x)
            if head != "mlm":
                return self.classifier(torch.tanh(self.pooler(leave(x)[:, 0]))).sum()
            y = self.head_norm(nn.functional.gelu(self.transform(x)))
            return (copy(y) @ self.tokens.T + self.decoder.bias).sum()  # this rank's V/t logits

    return Model()


def inputs():
    torch.manual_seed(1)
    return torch.randint(0, V, (B, S)), torch.randint(0, TYPES, (B, S))


_counted: dict = {}


def counted(head: str):
    """The whole encoder with ``head``, counted once per test session."""
    import flopcount

    if head not in _counted:
        _counted[head] = flopcount.from_torch(bert_like(head=head), inputs(), training=True, optimizer="sgd",
                                              cache_dir=False, memory=MemorySettings(device="cpu"))
    return _counted[head]


@pytest.fixture(scope="module", params=["mlm", "classifier"])
def report(request):
    return request.param, counted(request.param)


def _worker(rank: int, world: int, init: str, out: str, head: str, sp: bool = False) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rec = Recorder()
    module = bert_like(world, rank, rec, head, sp)
    with FlopCounterMode(display=False) as counter:
        module(*inputs()).backward()
    if sp:  # the layers' LayerNorms and row-parallel biases saw the rank's tokens only
        local = partial_grads(module)
        for name, p in module.named_parameters():
            if partial(name):
                p.grad.copy_(rec.all_reduce(p.grad))
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": rec.bytes(), "params": params,
                   **({"local": local, "summed": partial_grads(module)} if sp else {})}, f)
    dist.destroy_process_group()


def partial(name: str) -> bool:
    return name.startswith("layers.") and ("norm" in name or name.endswith("output.bias"))


def partial_grads(module) -> list[float]:
    return torch.cat([p.grad for name, p in module.named_parameters() if partial(name)]).tolist()


def test_whole_model_is_the_one_counted(report):
    head, report = report
    layer = 4 * (H * H + H) + (4 * H * H + 4 * H) + (4 * H * H + H) + 2 * 2 * H
    tail = H * H + H + 2 * H + V if head == "mlm" else H * H + H + H * LABELS + LABELS
    assert report.params == V * H + P * H + TYPES * H + 2 * H + L * layer + tail


def test_tp_on_gloo_equals_the_ledger(report, tmp_path):
    head, report = report
    seen = gloo_ranks(_worker, tmp_path, head)
    p = parse_parallel("tp=2")
    led = ledger(report, p)
    mem = per_rank(report, p).ranks
    t, a = 2, M * H * 4
    # torch's addmm leaves out the Gemms' bias adds and their gradients' sums that the ledger counts, M·N each:
    # split with the column-parallel projections (Q, K, V and the MLP's 4H), whole with the row-parallel ones and
    # the head's transform (or the pooler and classifier, on the B first tokens), which every rank runs whole
    bias = L * 2 * (M * 3 * H // t + M * 4 * H // t + 2 * M * H) + (
        2 * M * H if head == "mlm" else 2 * B * (H + LABELS))
    for i, rank in enumerate(seen):
        products = sum(x.forward + x.backward for x in node_shares(report, p)
                       if x.tp == i and report.nodes[x.index].family in ("matmul", "gemm"))
        assert rank["flops"] == products - bias
        # per layer 2 all_reduces in the forward, 2 in the backward; the embedding's; the decoder input's gradient
        assert rank["bytes"] == ledger_bytes(led.ranks[i]) == {
            "all_reduce(tp)": 4 * L * a + a + (a if head == "mlm" else 0)}
        assert rank["params"] == mem[i].params_bytes == 4 * led.ranks[i].optimizer_flops // 2


def test_sp_with_a_replicated_classifier_on_gloo_equals_the_ledger(tmp_path):
    """tp=2,sp with the classifier: no vocab-parallel head, so the tokens are gathered for it and its gradient only
    split (no reduce-scatter after the layers); the embedding's lookup all-reduced (positions and token types added)
    and split once normed, its gradient gathered."""
    report = counted("classifier")
    whole = bert_like(head="classifier")
    whole(*inputs()).backward()
    seen = gloo_ranks(_worker, tmp_path, "classifier", True)
    p = parse_parallel("tp=2,sp")
    led = ledger(report, p)
    mem = per_rank(report, p).ranks
    t, a = 2, M * H * 4
    bias = L * 2 * (M * 3 * H // t + M * 4 * H // t + 2 * M * H // t) + 2 * B * (H + LABELS)
    for i, rank in enumerate(seen):
        assert not torch.allclose(torch.tensor(rank["local"]), torch.tensor(partial_grads(whole)), atol=1e-6)
        assert torch.allclose(torch.tensor(rank["summed"]), torch.tensor(partial_grads(whole)), atol=1e-5)
        assert rank["flops"] == sum(x.forward + x.backward for x in node_shares(report, p) if x.tp == i and
                                    report.nodes[x.index].family in ("matmul", "gemm")) - bias
        # the lookup, and the layers' LayerNorms (2·2h each) and row-parallel biases (2h) once a step
        assert rank["bytes"] == ledger_bytes(led.ranks[i]) == {
            "all_reduce(tp)": a + L * 6 * H * 4, "all_gather(tp)": 4 * L * a + 2 * a, "reduce_scatter(tp)": 4 * L * a}
        assert rank["params"] == mem[i].params_bytes == 4 * led.ranks[i].optimizer_flops // 2


STEPS = 2  # microbatches of the FSDP2 run


def _fsdp_worker(rank: int, world: int, init: str, out: str) -> None:
    """One data-parallel rank of the encoder with its classifier under FSDP2 (each layer and the whole model
    ``fully_shard``-ed), STEPS microbatches of its own batch, FSDP2's default gradient sync."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    moved: Counter = Counter()
    count_fsdp_collectives(moved)
    model = bert_like(head="classifier")
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    torch.manual_seed(2 + rank)  # each rank its own batch
    batches = [(torch.randint(0, V, (B, S)), torch.randint(0, TYPES, (B, S))) for _ in range(STEPS)]
    with FlopCounterMode(display=False) as counter:
        for batch in batches:
            model(*batch).backward()
    # each parameter's shard as FSDP2 keeps it: dim 0 padded to a multiple of the ranks, ⌈d0/n⌉ rows each
    def shard(p):
        return -(-p.shape[0] // world) * p[0].numel() * p.element_size()

    inner = {id(p) for p in model.layers.parameters()}
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "padded": sum(shard(p) for p in model.parameters()),
                   "padding": sum(world * shard(p) - p.numel() * p.element_size() for p in model.parameters()),
                   "root": sum(world * shard(p) for p in model.parameters() if id(p) not in inner),
                   "bytes": {f"{k}({g})": b for (k, g), b in moved.items()}}, f)
    dist.destroy_process_group()


def test_fsdp2_on_gloo_equals_the_ledger(tmp_path):
    report = counted("classifier")  # a bias of 3 labels: padded
    seen = gloo_ranks(_fsdp_worker, tmp_path)
    p = parse_parallel("dp=2,fsdp", microbatches=STEPS)
    led = ledger(report, p)
    mem = {x: r for r in per_rank(report, p).ranks for x in r.replicas}
    bias = L * 2 * (M * 3 * H + M * 4 * H + 2 * M * H) + 2 * B * (H + LABELS)  # whole at T = 1
    world_padding = (2 * -(-LABELS // 2) - LABELS) * 4  # every other first dimension is even
    products = sum(x.forward + x.backward for x in node_shares(report, p)
                   if report.nodes[x.index].family in ("matmul", "gemm"))
    for i, rank in enumerate(seen):
        assert rank["flops"] == STEPS * (products - bias)
        assert rank["padded"] == mem[i].params_bytes
        # FSDP2 hands its collectives the padded tensors (the classifier's bias of 3 as 4), and under its default
        # keeps the root module (here the embeddings, pooler and classifier) unsharded from the forward to the
        # backward, gathered once a microbatch where a layer is gathered twice: as the ledger lists them
        padded = 2 * rank["padded"]  # 2 ranks: the gathered tensors, padded
        assert rank["padding"] == world_padding and 0 < rank["root"] < padded
        assert rank["bytes"] == ledger_bytes(led.ranks[i]) == {
            "reduce_scatter(dp)": STEPS * padded, "all_gather(dp)": STEPS * (2 * padded - rank["root"])}
