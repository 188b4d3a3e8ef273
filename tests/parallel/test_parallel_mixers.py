"""A hybrid's sequence mixer found by its role in the graph, not by its module names (flopcount/parallel/layout.py's
rules, docs/parallel.md): small torch models whose mixer modules are called ``a``, ``b``, ``c``, with an
in-projection, a depthwise causal convolution over the sequence and an out-projection, and between them a running
state (a cumulative sum: a scan), the same with L2-normalised keys (a gated delta rule's), or nothing (a short
convolution). ``cp`` and ``tp`` are refused with one line naming the layer's mixer (exit code 2); ``pp`` and ``dp``
split a stack of mixers with the reconcile identities of tests/parallel/test_parallel_families.py. A Mamba 2 mixer
(heads, groups of B and C, a grouped gated norm) is split over TP as Megatron's MambaMixer splits it: each rank's
products equal torch's FlopCounterMode on its hand-made shard (heads/T heads, groups/T groups), its parameters the
shard's, its collectives the closed forms of one block per layer; a tp that does not divide the groups is refused
naming them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flopcount.errors import UsageError
from flopcount.memory.ledger import MemorySettings
from flopcount.parallel.layout import layout_of
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))
from test_parallel_families import assert_reconciles  # noqa: E402

B, S, H, D, K, V, LAYERS = 2, 8, 16, 24, 4, 32, 2


class Mixer(torch.nn.Module):
    """x, z = a(u); x = silu(causal depthwise conv b over the sequence of x); then a running state over the sequence
    (``kind`` "scan": a cumulative sum; "delta": the same on L2-normalised x), or none ("short_conv"); c(x·silu(z))."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.a = torch.nn.Linear(H, 2 * D, bias=False)
        self.b = torch.nn.Conv1d(D, D, K, groups=D, padding=K - 1)
        self.c = torch.nn.Linear(D, H, bias=False)

    def forward(self, u):
        x, z = self.a(u).chunk(2, dim=-1)
        x = torch.nn.functional.silu(self.b(x.transpose(1, 2))[..., :S]).transpose(1, 2)
        if self.kind == "delta":
            x = x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)
        if self.kind != "short_conv":
            x = torch.cumsum(x, dim=1)
        return self.c(x * torch.nn.functional.silu(z))


class Block(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.norm = torch.nn.LayerNorm(H)
        self.mix = Mixer(kind)

    def forward(self, u):
        return u + self.mix(self.norm(u))


class Net(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.embed = torch.nn.Embedding(V, H)
        self.layers = torch.nn.ModuleList(Block(kind) for _ in range(LAYERS))
        self.head = torch.nn.Linear(H, V, bias=False)

    def forward(self, ids):
        u = self.embed(ids)
        for layer in self.layers:
            u = layer(u)
        return self.head(u)


#: kind → the words a refusal names the mixer by (written out here, not read from the code)
NAMES = {"scan": "Mamba mixer (a selective scan over the sequence)",
         "delta": "gated delta rule mixer (linear attention: a recurrence over the sequence)",
         "short_conv": "short-convolution mixer (a gated causal convolution over the sequence)"}


@pytest.fixture(scope="module", params=sorted(NAMES))
def counted(request):
    import flopcount

    torch.manual_seed(0)
    model = Net(request.param)
    report = flopcount.from_torch(model.train(), (torch.randint(0, V, (B, S)),), training=True, optimizer="sgd",
                                  cache_dir=False, convention="dense", memory=MemorySettings(device="cpu"))
    return request.param, report, list(model.parameters())


def test_the_mixer_is_found_by_its_role(counted):
    """Every product of the mixer modules (a, b, c: the two projections and the convolution) is the mixer's, and
    nothing else in the layers is (its norm and residual add are per-token work)."""
    _, report, _ = counted
    layout = layout_of(report, parse_parallel("pp=2", microbatches=2))
    scopes = report.modules.nodes
    products = [k for k, n in enumerate(report.nodes) if n.op_type in ("MatMul", "Gemm", "Conv") and scopes[k]
                and ".mix." in scopes[k][-1] + "."]
    assert len(products) == 3 * LAYERS
    # the out-projection c is row-parallel, as a Mamba 2 mixer's is under TP (its output whole after the reduction)
    assert {(scopes[k][-1].rsplit(".", 1)[-1], layout.roles[k]) for k in products} == {
        ("a", "mixer"), ("b", "mixer"), ("c", "row")}
    assert {layout.roles[k] for k, sc in enumerate(scopes) if sc and ".norm" in sc[-1]} == {"sequence"}
    assert layout.dims.layers == LAYERS and layout.dims.heads == 0


@pytest.mark.parametrize("text, words", [("cp=2", "cannot be split over the sequence"),
                                         ("tp=2", "is not split over TP: "), ("tp=2,sp", "is not split over TP: ")])
def test_a_plan_splitting_the_mixer_is_refused_naming_it(counted, text, words):
    kind, report, _ = counted
    with pytest.raises(UsageError) as e:
        ledger(report, parse_parallel(text, microbatches=2 if "sp" in text else 1))
    assert "\n" not in str(e.value) and e.value.exit_code == 2
    assert f"layer 0's {NAMES[kind]} {words}" in str(e.value)


@pytest.mark.parametrize("text, m", [("pp=2", 2), ("dp=2,fsdp", 2), ("dp=2,zero1", 1)])
def test_a_stack_of_mixers_takes_pp_and_dp(counted, text, m):
    _, report, parameters = counted
    assert_reconciles(report, parameters, text, m)


# --- a Mamba 2 mixer split over TP -------------------------------------------------------------------------------
HEADS, GROUPS, P, N = 4, 2, 6, 4  # heads of P channels, groups of B and C of state N


class Mamba2(torch.nn.Module):
    """A Mamba 2 mixer on TP rank ``rank`` of ``t`` (whole with t = 1), its modules named ``a``..``e``: in-projection
    ``a`` to z, x, B, C, dt (heads/t heads, groups/t groups), a depthwise causal convolution ``b`` over x, B, C, the
    chunk-free selective scan (the decay a cumulative sum of dt·A, scores C·Bᵀ, each head's output), D's skip, the
    gated norm ``d`` in groups, out-projection ``c`` (row-parallel: its partial sum, which a reduction would add)."""

    def __init__(self, t: int = 1):
        super().__init__()
        self.h, self.g = HEADS // t, GROUPS // t
        self.d = self.h * P
        self.xbc = self.d + 2 * self.g * N
        self.a = torch.nn.Linear(H, self.d + self.xbc + self.h, bias=False)
        self.b = torch.nn.Conv1d(self.xbc, self.xbc, K, groups=self.xbc, padding=K - 1, bias=False)
        self.a_log, self.skip, self.dt_bias = (torch.nn.Parameter(torch.rand(self.h)) for _ in range(3))
        self.norm_weight = torch.nn.Parameter(torch.ones(self.d))
        self.c = torch.nn.Linear(self.d, H, bias=False)

    def forward(self, u):
        b, s = u.shape[:2]
        z, xbc, dt = self.a(u).split([self.d, self.xbc, self.h], dim=-1)
        xbc = torch.nn.functional.silu(self.b(xbc.transpose(1, 2))[..., :s]).transpose(1, 2)
        x, bb, cc = xbc.split([self.d, self.g * N, self.g * N], dim=-1)
        x = x.reshape(b, s, self.h, P)
        bb, cc = (v.reshape(b, s, self.g, N).repeat_interleave(self.h // self.g, dim=2) for v in (bb, cc))
        dt = torch.nn.functional.softplus(dt + self.dt_bias)
        decay = torch.cumsum(dt * -torch.exp(self.a_log), dim=1).transpose(1, 2)  # (b, h, s)
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        weights = torch.exp(decay[..., :, None] - decay[..., None, :]).masked_fill(~causal, 0)
        scores = torch.einsum("bqhn,bkhn->bhqk", cc, bb) * weights
        y = torch.einsum("bhqk,bkhp->bqhp", scores, x * dt[..., None]) + x * self.skip[:, None]
        y = (y.reshape(b, s, self.d) * torch.nn.functional.silu(z)).reshape(b, s, self.g, self.d // self.g)
        y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)).reshape(b, s, self.d) * self.norm_weight
        return self.c(y)


class Mamba2Block(torch.nn.Module):
    def __init__(self, t: int = 1):
        super().__init__()
        self.norm = torch.nn.LayerNorm(H)
        self.mix = Mamba2(t)

    def forward(self, u):
        return u + self.mix(self.norm(u))


class Mamba2Net(torch.nn.Module):
    """Token embedding, LAYERS blocks of a norm and a Mamba 2 mixer, an LM head; on TP rank of ``t`` the embedding and
    the head hold V/t rows (vocab-parallel), the norms whole."""

    def __init__(self, t: int = 1):
        super().__init__()
        self.embed = torch.nn.Embedding(V // t, H)
        self.layers = torch.nn.ModuleList(Mamba2Block(t) for _ in range(LAYERS))
        self.head = torch.nn.Linear(H, V // t, bias=False)

    def forward(self, ids):
        u = self.embed(ids % self.embed.num_embeddings)
        for layer in self.layers:
            u = layer(u)
        return self.head(u)


def _torch_flops(t: int) -> int:
    """FlopCounterMode's forward and backward FLOPs (products) of one TP rank's shard of :class:`Mamba2Net`, less
    the depthwise convolution's backward, which torch's formula does not count per group (41 times its forward
    here): :func:`_counted` leaves it out too, and checks it as twice the forward."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = Mamba2Net(t)
    with FlopCounterMode(display=False) as counter:
        model(torch.randint(0, V, (B, S))).sum().backward()
    return sum(n for op, n in counter.get_flop_counts()["Global"].items() if "convolution_backward" not in str(op))


def _counted(report, shares, tp: int) -> int:
    """The products' forward and backward FLOPs of TP rank ``tp`` in ``shares``, but the convolution's backward,
    which is twice its forward (its input's gradient and its weight's, each as many products)."""
    mine = [x for x in shares if x.tp == tp and report.nodes[x.index].family in PRODUCTS]
    convs = [x for x in mine if report.nodes[x.index].op_type == "Conv"]
    assert convs and all(x.backward == 2 * x.forward for x in convs)
    return sum(x.forward + x.backward for x in mine) - sum(x.backward for x in convs)


@pytest.fixture(scope="module")
def mamba2():
    import flopcount

    torch.manual_seed(0)
    model = Mamba2Net()
    return flopcount.from_torch(model.train(), (torch.randint(0, V, (B, S)),), training=True, optimizer="sgd",
                                cache_dir=False, convention="dense", memory=MemorySettings(device="cpu"))


def test_a_mamba2_mixer_has_its_heads_and_groups(mamba2):
    from flopcount.parallel.ranks import node_shares

    led = ledger(mamba2, parse_parallel("pp=2", microbatches=2))
    assert led.dims["layers"] == LAYERS
    # one rank holds it all: its products are torch's on the whole model
    shares = node_shares(mamba2, parse_parallel("dp=1"))
    assert _counted(mamba2, shares, 0) == _torch_flops(1)


PRODUCTS = ("matmul", "gemm", "conv", "einsum")


@pytest.mark.parametrize("t", [2])
def test_a_mamba2_mixer_splits_over_tp_as_megatron(mamba2, t):
    """tp=2: each rank's products equal FlopCounterMode on its shard (2 of the 4 heads, 1 of the 2 groups, half the
    vocabulary), its parameters the shard's; the TP collectives one block (the mixer) per layer."""
    from flopcount.memory.ranks import per_rank
    from flopcount.parallel.ranks import node_shares

    m = 2
    plan = parse_parallel(f"tp={t}", microbatches=m)
    led = ledger(mamba2, plan)
    shares = node_shares(mamba2, plan)
    torch.manual_seed(0)
    shard = sum(p.numel() for p in Mamba2Net(t).parameters())
    mem = {x: r for r in per_rank(mamba2, plan).ranks for x in r.replicas}
    for i in range(t):
        assert _counted(mamba2, shares, i) == _torch_flops(t)
        assert led.ranks[i].optimizer_flops == 2 * shard  # SGD: 2 FLOPs an element it updates
        assert mem[i].params_bytes == 4 * shard
    a = B * S * H * 4
    # per microbatch: the out-projection's reduction in the forward, the in-projection's input gradient in the
    # backward, per layer; the vocab-parallel embedding's lookup and the LM head's input gradient
    assert {(c.kind, c.group): c.bytes for c in led.ranks[0].communication} == {
        ("all_reduce", "tp"): m * (2 * LAYERS * a + a + a)}
    sp = ledger(mamba2, parse_parallel(f"tp={t},sp", microbatches=m)).ranks[0].communication
    norms = LAYERS * 2 * H  # the LayerNorms' weights and biases, partial under sp, all-reduced once a step
    assert {(c.kind, c.group): c.bytes for c in sp} == {
        ("all_gather", "tp"): m * (2 * LAYERS * a + a + a), ("reduce_scatter", "tp"): m * (2 * LAYERS * a + a + a),
        ("all_reduce", "tp"): 4 * norms}


def test_a_tp_that_does_not_divide_the_groups_is_refused(mamba2):
    with pytest.raises(UsageError) as e:
        ledger(mamba2, parse_parallel("tp=4"))
    assert "\n" not in str(e.value) and e.value.exit_code == 2
    assert str(e.value).startswith("--parallel tp=4: layer 0's Mamba mixer (a selective scan over the sequence) is "
                                   "not split over TP: Megatron's MambaMixer splits its 4 heads and its 2 groups of "
                                   "B and C over TP, and tp must divide both; give tp=2")


@pytest.mark.parametrize("text, m", [("tp=2", 1), ("tp=2,sp", 2)])
def test_a_hugging_face_mamba2_of_two_groups_reconciles_under_tp(text, m):
    """Mamba 2 as transformers builds it (a chunked scan, 4 heads, 2 groups): tp=2 splits it, with the reconcile
    identities (model FLOPs summing to the whole, parameters to torch's, memory rows per rank)."""
    transformers = pytest.importorskip("transformers")
    import flopcount
    from flopcount.frontends.hf import build_model

    config = transformers.Mamba2Config(hidden_size=64, num_hidden_layers=2, vocab_size=128, num_heads=4, head_dim=32,
                                       n_groups=2, state_size=8, chunk_size=8, expand=2)
    report = flopcount.from_hf(config, (2, 8), cache_dir=False, mode="train", optimizer="sgd", convention="dense",
                               memory=MemorySettings(device="cpu"))
    assert_reconciles(report, list(build_model(config).parameters()), text, m)
