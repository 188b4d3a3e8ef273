"""A hybrid's sequence mixer found by its role in the graph, not by its module names (flopcount/parallel/layout.py's
rules, docs/parallel.md): small torch models whose mixer modules are called ``a``, ``b``, ``c``, with an
in-projection, a depthwise causal convolution over the sequence and an out-projection, and between them a running
state (a cumulative sum: a scan), the same with L2-normalised keys (a gated delta rule's), or nothing (a short
convolution). ``cp`` and ``tp`` are refused with one line naming the layer's mixer (exit code 2); ``pp`` and ``dp``
split a stack of mixers with the reconcile identities of tests/parallel/test_parallel_families.py."""

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
    assert {layout.roles[k] for k in products} == {"mixer"}
    assert {layout.roles[k] for k, sc in enumerate(scopes) if sc and ".norm" in sc[-1]} == {"sequence"}
    assert layout.dims.layers == LAYERS and layout.dims.heads == 0


@pytest.mark.parametrize("text, words", [("cp=2", "cannot be split over the sequence"),
                                         ("tp=2", "is not split over TP"), ("tp=2,sp", "is not split over TP")])
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
