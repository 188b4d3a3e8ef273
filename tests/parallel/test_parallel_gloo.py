"""FLOPs per rank against torch's own runs: pipeline parallelism through ``torch.distributed.pipelining``, FSDP2
``fully_shard`` and expert parallelism (a fixed router, tokens moved by all_to_all) on 2 forked gloo ranks, and
recompute through ``torch.utils.checkpoint`` and selective activation checkpointing, each counted by
``torch.utils.flop_counter.FlopCounterMode`` and compared with the ledger (flopcount.parallel.ranks) exactly.

The model is the tiny Llama of tests/parallel/test_parallel_ledger.py (hidden H, L layers, HEADS heads of D, KV_HEADS
K/V heads, MLP width FFN, vocabulary V, microbatch B×S), counted once from its Hugging Face config, and written
again here with plain modules for torch to run. What torch's counter sees, and so what is compared: it counts the
products only (aten.mm, aten.bmm, aten.addmm; forward, and in the backward the gradients of both operands), not the
norms, softmax, residual adds, rotary tables or loss that the ledger also counts. So each comparison is the
ledger's share of the product nodes (family matmul/gemm) on that rank. The embedding lookup and the loss are
gathers and elementwise ops: no product in either count."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from gloo_shards import count_fsdp_collectives, rms_norm
from helpers import gloo_ranks, tiny_llama

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
    return tiny_llama(H, L, HEADS, KV_HEADS, FFN, V, (B, S))


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

    Norm = rms_norm(H)

    class Layer(nn.Module):
        def __init__(self, mlp=None):
            super().__init__()
            self.input_norm, self.post_norm = Norm(), Norm()
            self.q, self.o = nn.Linear(H, H, bias=False), nn.Linear(H, H, bias=False)
            self.k, self.v = (nn.Linear(H, KV_HEADS * D, bias=False) for _ in range(2))
            if mlp is None:
                self.gate, self.up = (nn.Linear(H, FFN, bias=False) for _ in range(2))
                self.down = nn.Linear(FFN, H, bias=False)
            self.mlp = mlp  # a mixture of experts in place of the dense MLP

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
            if self.mlp is not None:
                return x + self.mlp(y)
            return x + self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))

    class Head(nn.Module):
        def __init__(self, vocab=V):
            super().__init__()
            self.norm, self.lm_head = Norm(), nn.Linear(H, vocab, bias=False)

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


@pytest.mark.parametrize("reentrant,policy", [(True, "full"), (False, "non-reentrant")])
def test_layer_recompute_is_torch_checkpoint_per_layer(report, reentrant, policy):
    """torch.utils.checkpoint around each decoder layer runs the layer's forward again in the backward: the
    reentrant one all of it (Megatron's full recompute, the ledger's ``full``); the non-reentrant one stops as soon
    as every tensor the backward saved is back: the last one is the input of the down projection (saved by that
    product before it runs), so the down projection and the residual add after it are not run again (the
    ledger's ``non-reentrant``)."""
    from torch.utils.checkpoint import checkpoint

    base = _counted()
    rerun = _counted(lambda fn, x: checkpoint(fn, x, use_reentrant=reentrant))
    p, r = plan("dp=1"), parse_recompute(policy)
    assert base == products(report, p, what=("forward", "backward"))
    # per layer again: Q and O (H×H), K and V (H×KV_HEADS·D), gate and up (H×FFN), scores and product with V;
    # and the down projection (FFN×H) when the whole layer runs again
    down = L * 2 * B * S * FFN * H
    again = L * 2 * B * S * (2 * H * H + 2 * H * KV_HEADS * D + 2 * H * FFN + 2 * HEADS * S * D)
    again += down if reentrant else 0
    assert rerun - base == again == products(report, p, r, what=("recompute",))
    rank = ledger(report, p, r).ranks[0]
    layers_fwd = sum(n.cost.flops for n, sc in zip(report.nodes, report.modules.nodes)
                     if any(".layers." in s for s in sc))
    # the whole of each layer, or all but down_proj and its residual add
    assert rank.recompute_flops == layers_fwd - (0 if reentrant else down + L * B * S * H)


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


# --- pipeline parallelism on 2 gloo ranks through torch.distributed.pipelining ------------------------------------

M = 4  # microbatches per step

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}


def _pp_worker(rank: int, world: int, init: str, out: str, schedule: str) -> None:
    """One pipeline rank: its stages of the tiny Llama (layers split evenly, the embedding on the first stage, the
    final norm, LM head and loss on the last; interleaved, 2 stages of one layer per rank, stage c on rank
    c mod 2), one warm-up step (the stages learn their shapes), then one step of M microbatches counted by
    FlopCounterMode. Rank 0 also writes the schedule's own order of actions."""
    import torch.distributed as dist
    from torch.distributed import pipelining
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not enter the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    chunks = 2 if schedule == "interleaved" else 1
    n = world * chunks
    per = L // n
    stages = []
    for c in range(chunks):
        index = c * world + rank
        part = _llama(range(index * per, (index + 1) * per), embed=index == 0, head=index == n - 1)
        stages.append(pipelining.PipelineStage(part, index, n, torch.device("cpu")))
    kind = getattr(pipelining, SCHEDULES[schedule])
    sched = kind(stages if chunks > 1 else stages[0], n_microbatches=M, loss_fn=_loss)
    torch.manual_seed(0)
    ids = torch.randint(0, V, (M * B, S))

    def step():
        args = (ids,) if any(s.is_first for s in stages) else ()
        kwargs = {"target": ids, "losses": []} if any(s.is_last for s in stages) else {}
        sched.step(*args, **kwargs)

    step()
    ran = []  # the actions the schedule runs on this rank, in its order: (stage, F or B, microbatch)

    def recorded(run, kind, index):
        def record(chunk, *args, **kwargs):
            ran.append([index, kind, chunk])
            return run(chunk, *args, **kwargs)

        return record

    for stage in stages:
        for name, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B")):
            setattr(stage, name, recorded(getattr(stage, name), kind, stage.stage_index))
    with FlopCounterMode(display=False) as counter:
        step()
    result = {"flops": counter.get_total_flops(), "ran": ran}
    if rank == 0:
        result["order"] = {str(r): [None if a is None else [a.stage_index, str(a.computation_type), a.microbatch_index]
                                    for a in actions] for r, actions in sched.pipeline_order.items()}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def _bubble_of(order, forward, backward):
    """1 − busy / (ranks × makespan) of the schedule's own actions per rank (None: an idle slot, skipped),
    each forward of stage k lasting forward[k] and each backward backward[k]; an action starts when its rank is
    free and the action it needs is done (the forward of stage k − 1, the backward of stage k + 1, on the last
    stage its own forward)."""
    last = len(forward) - 1
    # REDUCE_GRAD closes a rank's step (the data-parallel gradient reduction): no compute, no wait on a neighbour
    todo = {r: [a for a in acts if a is not None and a[1] != "REDUCE_GRAD"] for r, acts in order.items()}
    kinds = {kind for acts in todo.values() for _, kind, _ in acts}
    assert kinds <= {"F", "B", "FORWARD", "FULL_BACKWARD"}, kinds  # no split backward (I/W) in these schedules
    done, free, busy = {}, {r: 0.0 for r in todo}, {r: 0.0 for r in todo}
    while any(todo.values()):
        moved = False
        for r, acts in todo.items():
            if not acts:
                continue
            k, kind, mb = acts[0]
            fwd = kind in ("F", "FORWARD")
            need = (("F", k - 1, mb) if k > 0 else None) if fwd else (("B", k + 1, mb) if k < last else ("F", k, mb))
            if need is not None and need not in done:
                continue
            length = forward[k] if fwd else backward[k]
            done[("F" if fwd else "B", k, mb)] = free[r] = max(free[r], done.get(need, 0.0)) + length
            busy[r] += length
            acts.pop(0)
            moved = True
        assert moved, "the schedule's actions wait on each other"
    return 1 - sum(busy.values()) / (len(todo) * max(free.values()))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_pp_on_gloo_equals_the_ledger(report, tmp_path, schedule):
    """Each pipeline rank's products over one step of M microbatches, as FlopCounterMode counts them around
    ``schedule.step``, equal the ledger's for that rank (its stages' projections, attention products and, on the
    last, the LM head; forward and backward); the ledger's bubble equals the one computed here from the schedule's
    own ``pipeline_order``, each action lasting its stage's FLOPs in the ledger."""
    text = "interleaved:2" if schedule == "interleaved" else schedule
    p = plan("pp=2", M, text)
    seen = gloo_ranks(_pp_worker, tmp_path, schedule)
    led = ledger(report, p)
    for r in range(2):
        assert seen[r]["flops"] == M * products(report, p, stage=r)
    n = 2 * (2 if schedule == "interleaved" else 1)
    shares = node_shares(report, p)
    forward = [float(sum(x.forward for x in shares if x.chunk == c and x.tp == 0)) for c in range(n)]
    backward = [float(sum(x.backward for x in shares if x.chunk == c and x.tp == 0)) for c in range(n)]
    ran = {r: [tuple(a) for a in seen[r]["ran"]] for r in range(2)}
    assert led.bubble_fraction == pytest.approx(_bubble_of(ran, forward, backward), rel=1e-12)
    # The schedule's pipeline_order (its plan of actions) is the order it ran, but for 1F1B: there torch's
    # _get_pipeline_order numbers the last rank's forwards from 1 (it steps the microbatch before the first
    # one), a plan that could not run; the recorded order above is the one that ran.
    planned = {int(r): [(a[0], "F" if a[1].endswith("FORWARD") and "BACKWARD" not in a[1] else "B", a[2])
                        for a in acts if a is not None and not a[1].endswith("REDUCE_GRAD")]
               for r, acts in seen[0]["order"].items()}
    if schedule != "1f1b":
        assert planned == ran


# --- FSDP2 fully_shard on 2 gloo ranks --------------------------------------------------------------------------

def _fsdp_worker(rank: int, world: int, init: str, out: str) -> None:
    """One data-parallel rank of the tiny Llama under FSDP2: each decoder layer and then the whole model (the
    embedding, final norm and head) sharded with ``fully_shard`` and its defaults (the root's parameters kept
    gathered from its forward to its backward); one step of M
    microbatches of the rank's own batch, FSDP2's default (no ``set_requires_gradient_sync(False)``): each
    microbatch's gradients reduce-scattered in its backward, the rank's gradients after each its shard (their
    bytes recorded); FlopCounterMode counts the products, and the bytes of each
    all-gather (the gathered output) and reduce-scatter (the unsharded input) FSDP2 issues are summed by wrapping
    torch.distributed's collectives it calls."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not enter the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    counted: Counter = Counter()
    count_fsdp_collectives(counted)
    torch.manual_seed(0)
    model = _llama()
    for layer in model.layers.values():
        fully_shard(layer)
    fully_shard(model)
    torch.manual_seed(1 + rank)  # each rank its own batch
    ids = torch.randint(0, V, (M, B, S))
    with FlopCounterMode(display=False) as counter:
        grads = []
        for j in range(M):
            _loss(model(ids[j]), ids[j]).backward()
            grads.append(sum(p.grad.to_local().numel() * p.grad.element_size() for p in model.parameters()))
    padded = sum(-(-p.shape[0] // world) * world * p[0].numel() for p in model.parameters())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "padded": padded, "grads": grads,
                   **{kind: b for (kind, _), b in counted.items()}}, f)
    dist.destroy_process_group()


def test_fsdp2_on_gloo_equals_the_ledger(report, tmp_path):
    """Under dp=2,fsdp each rank runs the whole model on its own batch, so its products equal the ledger's; the
    bytes FSDP2 hands to all-gather (a layer's parameters gathered in each microbatch's forward and again in its
    backward, the root's once: FSDP2 keeps them from the forward to the backward) and to reduce-scatter (the
    gradients in each microbatch's backward, FSDP2's default) equal the ledger's ``communication``. FSDP2 pads
    each parameter's first dimension to a multiple of the ranks before it shards it; every first dimension here
    (32, 16, 48, 64) is even, so the padded sizes are the parameters' own (checked) and no padding is moved."""
    p = plan("dp=2,fsdp", M)
    seen = gloo_ranks(_fsdp_worker, tmp_path)
    led = ledger(report, p)
    layers, root = L * (2 * H * H + 2 * H * KV_HEADS * D + 3 * H * FFN + 2 * H), V * H + H + H * V
    params = layers + root
    for r in range(2):
        assert seen[r]["flops"] == M * products(report, p) == led.ranks[r].model_flops - M * (
            sum(x.forward + x.backward for x in node_shares(report, p)
                if report.nodes[x.index].family not in PRODUCTS))
        assert seen[r]["padded"] == params
        comm = {(c.kind, c.group): c.bytes for c in led.ranks[r].communication}
        assert comm == {("all_gather", "dp"): seen[r]["all_gather"], ("reduce_scatter", "dp"): seen[r]["reduce_scatter"]}
        assert seen[r]["all_gather"] == M * 4 * (2 * layers + root) and seen[r]["reduce_scatter"] == M * 4 * params
        # after every microbatch the rank holds its shard of the gradients only, as the memory ledger does
        assert seen[r]["grads"] == [4 * params // 2] * M


def _adam_worker(rank: int, world: int, init: str, out: str) -> None:
    """One rank of the tiny Llama under FSDP2 (each layer and the whole model ``fully_shard``-ed) stepping
    ``torch.optim.Adam(foreach=False)`` once after one microbatch: the parameter elements the rank really holds
    (its shards), the elements of Adam's two moments it keeps, and what FlopCounterMode sees around opt.step()."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = _llama()
    for layer in model.layers.values():
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    torch.manual_seed(1 + rank)
    ids = torch.randint(0, V, (B, S))
    _loss(model(ids), ids).backward()
    with FlopCounterMode(display=False) as counter:
        opt.step()
    held = sum(p.to_local().numel() for p in model.parameters())
    moments = sum(st[k].to_local().numel() for st in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"held": held, "moments": moments, "counted": counter.get_total_flops()}, f)
    dist.destroy_process_group()


def test_adam_step_under_fsdp2_on_gloo_equals_the_ledger(tmp_path):
    """The optimizer step per rank: torch's counter sees none of Adam's elementwise update (it counts products), so
    the per-element count is written from Adam's update as torch documents it (torch.optim.Adam, no weight decay,
    no amsgrad): m = b1·m + (1-b1)·g (2 mul, 1 add), v = b2·v + (1-b2)·g² (3 mul, 1 add), m̂ = m/(1-b1^t) and
    v̂ = v/(1-b2^t) (1 div each; the scalars once per tensor), w -= lr·m̂/(sqrt(v̂)+eps) (sqrt, add, div, mul, sub);
    and the elements each rank updates are those FSDP2 really leaves it (its shards, Adam's moments of the same
    size), against the ledger's ``optimizer_flops`` of dp=2,fsdp."""
    per_element = (2 + 1) + (3 + 1) + (1 + 1) + 5
    seen = gloo_ranks(_adam_worker, tmp_path)
    led = ledger(tiny_llama(H, L, HEADS, KV_HEADS, FFN, V, (B, S), optimizer="adam"), plan("dp=2,fsdp"))
    params = V * H + L * (2 * H * H + 2 * H * KV_HEADS * D + 3 * H * FFN + 2 * H) + H + H * V
    assert sum(r["held"] for r in seen) == params
    for r in range(2):
        assert seen[r]["counted"] == 0  # no product in Adam's step
        assert seen[r]["moments"] == 2 * seen[r]["held"]
        assert led.ranks[r].optimizer_flops == per_element * seen[r]["held"]
        assert led.ranks[r].optimizer_redundant_flops == 0


# --- expert parallelism on 2 gloo ranks: a tiny Qwen2-MoE with a fixed router ----------------------------------

V_MOE, E, K, I_MOE, SHARED, L_MOE = 50, 6, 2, 24, 56, 2
T = B * S  # tokens of a microbatch on each rank


def _route(rank: int) -> list[tuple[int, int]]:
    """The 2 experts of each of a rank's T tokens, the same in every layer and microbatch: the first among experts
    0..3 in turn, the second 4 or 5; over both ranks experts 0..3 receive 8 tokens each, 4 and 5 receive 16."""
    return [((t + rank) % 4, 4 + t % 2) for t in range(T)]


def _histogram() -> list[int]:
    counts = [0] * E
    for rank in range(2):
        for pair in _route(rank):
            for e in pair:
                counts[e] += 1
    return counts


def _ep_worker(rank: int, world: int, init: str, out: str) -> None:
    """One rank of ep=2, dp=2: its own batch, the whole attention and shared expert, routed experts E/2 on each
    rank (0..2 on rank 0, 3..5 on rank 1). Each MoE layer computes the router's logits (a product), takes the
    experts of the fixed table above, sends each (token, expert) pair's hidden vector to the rank holding the
    expert (all_to_all_single) with the pair's probability, runs each local expert's SwiGLU on the pairs it
    received, weighs its outputs by their probabilities, and sends them back; the backward sends the gradients the
    other way. FlopCounterMode counts the products; the bytes each
    all_to_all is handed (its input) are summed."""
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not enter the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    nn, moved = torch.nn, []
    per = E // world

    class Exchange(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, sent, received):
            ctx.splits = (sent, received)
            y = x.new_empty(sum(received), x.shape[1])
            moved.append(x.numel() * x.element_size())
            dist.all_to_all_single(y, x.contiguous(), received, sent)
            return y

        @staticmethod
        def backward(ctx, g):
            sent, received = ctx.splits
            dx = g.new_empty(sum(sent), g.shape[1])
            moved.append(g.numel() * g.element_size())
            dist.all_to_all_single(dx, g.contiguous(), sent, received)
            return dx, None, None

    def swiglu(width):
        return nn.ModuleDict({"gate": nn.Linear(H, width, bias=False), "up": nn.Linear(H, width, bias=False),
                              "down": nn.Linear(width, H, bias=False)})

    def run(m, x):
        return m["down"](torch.nn.functional.silu(m["gate"](x)) * m["up"](x))

    tables = [_route(r) for r in range(world)]

    class Moe(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(H, E, bias=False)
            self.shared, self.shared_gate = swiglu(SHARED), nn.Linear(H, 1, bias=False)
            self.experts = nn.ModuleList(swiglu(I_MOE) for _ in range(per))  # experts rank·per ..

        def forward(self, y):
            b, s, _ = y.shape
            x = y.reshape(b * s, H)
            probs = torch.softmax(self.router(x), -1)
            pairs = sorted((e, t) for t, chosen in enumerate(tables[rank]) for e in chosen)  # by expert
            tokens = torch.tensor([t for _, t in pairs])
            weights = probs[tokens, torch.tensor([e for e, _ in pairs])]
            sent = [sum(1 for e, _ in pairs if e // per == r) for r in range(world)]
            # what arrives: from each rank in turn, its pairs for this rank's experts, sorted by expert
            came = [e for src in range(world) for e in sorted(e for chosen in tables[src] for e in chosen
                                                              if e // per == rank)]
            received = [sum(1 for chosen in tables[src] for e in chosen if e // per == rank) for src in range(world)]
            got = Exchange.apply(x[tokens], sent, received)
            w = Exchange.apply(weights[:, None], sent, received)  # the pairs' probabilities, with their tokens
            came = torch.tensor(came)
            done = torch.zeros_like(got)
            for j, expert in enumerate(self.experts):
                mask = came == rank * per + j
                done = done.index_put((mask.nonzero()[:, 0],), run(expert, got[mask]))
            back = Exchange.apply(done * w, received, sent)
            routed = torch.zeros_like(x).index_add(0, tokens, back)
            shared = run(self.shared, x) * torch.sigmoid(self.shared_gate(x))
            return (routed + shared).reshape(b, s, H)

    Layer, Embed, Head = _modules()
    torch.manual_seed(0)
    layers = nn.ModuleList(Layer(Moe()) for _ in range(L_MOE))
    embed, head = Embed(V_MOE, H), Head(V_MOE)
    torch.manual_seed(1 + rank)  # each rank its own batch
    ids = torch.randint(0, V_MOE, (M, B, S))
    with FlopCounterMode(display=False) as counter:
        for j in range(M):
            x = embed(ids[j])
            for layer in layers:
                x = layer(x)
            torch.nn.functional.cross_entropy(head(x).reshape(-1, V_MOE), ids[j].reshape(-1)).backward()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": sum(moved)}, f)
    dist.destroy_process_group()


def test_ep_on_gloo_equals_the_ledger(tmp_path):
    """Under ep=2, dp=2 with the fixed router's histogram as --expert-load, each rank's products equal the
    ledger's: its attention, router, shared expert and head on its own tokens, and of the group's routed-expert
    products the share its experts received (24 of the 64 pairs on rank 0, 40 on rank 1); and the bytes it hands
    to all_to_all equal the ledger's (dispatch T·k vectors and their probabilities, combine the outputs of the pairs
    it ran, each again in the backward)."""
    import flopcount
    from flopcount.parallel.experts import ExpertLoad, ep_divide

    config = transformers.Qwen2MoeConfig(
        hidden_size=H, intermediate_size=40, moe_intermediate_size=I_MOE, shared_expert_intermediate_size=SHARED,
        num_hidden_layers=L_MOE, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V_MOE,
        num_experts=E, num_experts_per_tok=K, decoder_sparse_step=1)
    moe = flopcount.from_hf(config, (B, S), cache_dir=False, mode="train")
    counts = _histogram()
    assert counts == [8, 8, 8, 8, 16, 16]
    load = ExpertLoad([counts], "fixed router")
    p = plan("ep=2,dp=2", M)
    seen = gloo_ranks(_ep_worker, tmp_path)
    led = ledger(moe, p, None, load)
    shares = node_shares(moe, p)

    def prod(rule_is_expert):
        return sum(x.forward + x.backward for x in shares if moe.nodes[x.index].family in PRODUCTS
                   and (x.rule == "expert") == rule_is_expert)

    own = prod(True)  # one rank's own tokens' routed-expert products, balanced
    assert own == L_MOE * 3 * (T * K * 2 * 3 * H * I_MOE)
    routed = ep_divide([own, own], load.fractions(0, E, 2))
    assert routed == [2 * own * 24 // 64, 2 * own * 40 // 64]
    for r in range(2):
        assert seen[r]["flops"] == M * (prod(False) + routed[r])
        comm = {(c.kind, c.group): c.bytes for c in led.ranks[r].communication}
        assert seen[r]["bytes"] == comm[("all_to_all", "ep")]
