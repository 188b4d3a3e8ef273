"""Per-rank FLOPs and memory of every family of the architecture sweep (tests/frontends/test_architecture_sweep.py:
its configurations, imported), each counted once for training (SGD, fp32, the memory ledger on the CPU) on
:data:`SEQ` tokens, then run through the public ledgers (:func:`flopcount.parallel.ranks.ledger`,
:func:`flopcount.memory.ranks.per_rank`) under each plan of :data:`PLANS` (and ``ep`` on the mixture-of-experts
families), asserting the reconcile identities of docs/parallel.md exactly (:func:`assert_reconciles`):

* the model FLOPs summed over the ranks == the whole model's training FLOPs × microbatches × dp;
* each rank's hardware FLOPs == its model + redundant + recompute FLOPs;
* the parameter elements each rank's optimizer updates, less its redundant copies, summed over the ranks == torch's
  ``sum(p.numel() for p in model.parameters())`` (SGD: 2 FLOPs an element);
* every rank has a memory row; unsharded, a rank's parameter bytes == the elements its optimizer updates × 4;
  under zero the parameters stay whole on every rank (the gradients accumulated over the microbatches whole under
  zero1, 1/dp of each tensor rounded up under zero2), under fsdp each rank holds FSDP2's shard of every parameter
  (dim 0 padded to ⌈d0/n⌉ rows), both from torch's parameter shapes; a parameter without a gradient (torch's
  elements less the trained ones: DINOv2's ``mask_token``, never read; Whisper's frozen positions) is held whole
  on each rank of the first stage.

A plan the ledger refuses for a family is in :data:`REFUSED` with its reason (``ep`` on a dense
family: :data:`NO_EXPERTS`): the test asserts the refusal is one
line, exit code 2, naming it. docs/architectures.md's per-rank column is this data
(:func:`per_rank_cell`, checked by tests/frontends/test_architecture_sweep_memory.py).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "frontends"))
from test_architecture_sweep import (  # noqa: E402,F401 - a fixture
    B, FAMILIES, FFN, HEADS, LAYERS, VOCAB, H, Family, built_config, sweep_exports)
from test_architecture_sweep import family as sweep_family  # noqa: E402

from flopcount.errors import UsageError  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402
from flopcount.memory.ranks import per_rank  # noqa: E402
from flopcount.parallel.plan import parse_parallel  # noqa: E402
from flopcount.parallel.ranks import ledger  # noqa: E402

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

F32 = 4
#: Tokens of a sequence: the sweep's 7 is odd, which sp (tp=2) and cp=2's zigzag split (2·cp = 4) cannot divide.
SEQ = 8

#: The plans each family is checked under, with their microbatches; a schedule other than 1f1b follows the plan
#: as the command line takes it (``pp=2 --schedule gpipe``; the sweep's 2 layers leave interleaved no 2 chunks).
PLANS = (("tp=2", 1), ("tp=2,sp", 2), ("tp=2,sp=megatron", 2), ("pp=2", 2), ("pp=2 --schedule gpipe", 2),
         ("cp=2", 1), ("dp=2,fsdp", 2), ("dp=2,zero1", 2), ("dp=2,zero2", 2))
#: The expert-parallel plan, on the mixture-of-experts families only (:func:`plans_of`).
EP_PLAN = ("dp=2,ep=2", 1)

_GQA_FUSED = "the fused QKV projection of layer 0 splits whole K/V heads only when tp divides its 1 K/V heads"
#: Each sequence mixer of the hybrids, as a refusal names it: a plan with tp or cp above 1 is refused on layer 0's.
_MAMBA = "Mamba mixer (a selective scan over the sequence)"
_DELTA = "gated delta rule mixer (linear attention: a recurrence over the sequence)"
_SHORT_CONV = "short-convolution mixer (a gated causal convolution over the sequence)"
_RECURRENCE = "its state runs from each token to the next"
_IMAGE_SEQ = {**dict.fromkeys(("tp=2,sp", "tp=2,sp=megatron"),  # 16 patches and the class token
                               "tp must divide the sequence length 17 under sp"),
              "cp=2": "the zigzag split needs 2·cp = 4 to divide the sequence length 17"}
_TP = ("tp=2", "tp=2,sp", "tp=2,sp=megatron")

def _mixer(kind: str, why: str) -> dict[str, str]:
    """The refusals of a hybrid whose layer 0 holds a sequence mixer of ``kind``: tp (with or without sp), cp."""
    return {**dict.fromkeys(_TP, f"layer 0's {kind} is not split over TP"),
            "cp=2": f"layer 0's {kind} cannot be split over the sequence: {why}"}


#: Why a dense family refuses ``ep`` (not in its per-rank cell: the plan does not apply).
NO_EXPERTS = "has no routed experts"

#: family → plan → the one line it is refused with (a part the plan cannot split, and why).
REFUSED: dict[str, dict[str, str]] = {
    "falcon": dict.fromkeys(_TP, _GQA_FUSED),
    **{name: _mixer(kind, why) for name, kind, why in (
        ("qwen3_next", _DELTA, _RECURRENCE),
        ("lfm2", _SHORT_CONV, "each token reads the tokens before it, which lie on another rank"),
        *((name, _MAMBA, _RECURRENCE) for name in ("jamba", "bamba", "falcon_h1", "mamba2", "granitemoehybrid")))},
    "vit": _IMAGE_SEQ,
    "dinov2": _IMAGE_SEQ,
}

#: family → plan → a figure the ledgers do not yet give exactly, with the difference: strict expected failures (the
#: run fails once it passes, so the table cannot go stale).
PENDING: dict[str, dict[str, str]] = {}


#: Families checked here beside the sweep's: a Switch-style encoder-decoder (top-1 router, a MoE layer in each
#: stack; its encoder builds its padding mask only outside an export, so the mask is an input).
EXTRA = [sweep_family("switch_transformers", "MoE encoder-decoder (top-1)", d_model=H, d_kv=16, d_ff=FFN,
                      num_layers=LAYERS, num_decoder_layers=LAYERS, num_heads=HEADS, vocab_size=VOCAB, num_experts=4,
                      num_sparse_encoder_layers=1, num_sparse_decoder_layers=1, router_jitter_noise=0.0,
                      decoder_start_token_id=0, inputs={"input_ids": (B, SEQ), "attention_mask": (B, SEQ),
                                                        "decoder_input_ids": (B, SEQ)})]


def is_moe(fam: Family) -> bool:
    """A family with routed experts: the sweep gives it ``num_experts_per_tok`` (Switch, top-1: ``num_experts``)."""
    return "num_experts_per_tok" in fam.settings or fam.model_type == "switch_transformers"


def plans_of(fam: Family) -> tuple[tuple[str, int], ...]:
    return PLANS + ((EP_PLAN,) if is_moe(fam) else ())


def inputs_of(fam: Family) -> dict:
    """The family's inputs with every (batch, sequence) input on :data:`SEQ` tokens (images as the sweep has them)."""
    return {k: (v[0], SEQ) if len(v) == 2 else v for k, v in fam.inputs.items()}


def torch_parameters(fam: Family) -> list:
    """The family's parameters as torch lists them (built on the meta device)."""
    from flopcount.frontends.hf import build_model

    return list(build_model(built_config(fam)).parameters())


@pytest.fixture(scope="module", params=FAMILIES + EXTRA)
def family(request, sweep_exports):  # noqa: F811 - the sweep's fixture
    import flopcount

    fam = request.param
    report = flopcount.from_hf(built_config(fam), inputs_of(fam), convention="dense", cache_dir=sweep_exports,
                               mode="train", optimizer="sgd", memory=MemorySettings(device="cpu"))
    return fam, report, torch_parameters(fam)


def fsdp_shard(parameters: list, n: int) -> int:
    """FSDP2's shard of every parameter on one of n ranks: dim 0 padded to ⌈d0/n⌉ rows (a scalar is one row)."""
    rows = lambda p: p.shape[0] if p.dim() else 1  # noqa: E731
    return sum(math.ceil(rows(p) / n) * (p.numel() // rows(p)) for p in parameters)


def plan_of(text: str, m: int):
    """The plan of a :data:`PLANS` entry: ``--parallel`` text, with ``--schedule NAME`` after it where given."""
    degrees, _, schedule = text.partition(" --schedule ")
    return parse_parallel(degrees, microbatches=m, schedule=schedule or "1f1b")


def assert_reconciles(report, parameters: list, text: str, m: int) -> None:
    """The reconcile identities of one plan on one counted model (the module's docstring lists them)."""
    p = plan_of(text, m)
    led = ledger(report, p)
    whole = report.forward.flops + report.backward.flops
    assert sum(r.model_flops for r in led.ranks) == whole * m * p.dp
    assert all(r.hardware_flops == r.model_flops + r.redundant_flops + r.recompute_flops for r in led.ranks)
    elements = sum(x.numel() for x in parameters)
    assert report.params == elements
    # the optimizer steps what the backward gives a gradient (the sweep checks report.trainable_params on torch's)
    assert sum(r.optimizer_flops - r.optimizer_redundant_flops for r in led.ranks) == 2 * report.trainable_params
    mem = per_rank(report, p)
    assert {x for r in mem.ranks for x in r.replicas} == set(range(p.world_size))
    steps = {r.rank: r.optimizer_flops for r in led.ranks}
    # no gradient: never read (DINOv2's mask_token) or frozen (Whisper's positions), held whole on stage 0
    unread = elements - report.trainable_params
    for r in mem.ranks:
        if p.fsdp:
            assert r.params_bytes == F32 * fsdp_shard(parameters, p.dp)
        elif p.zero_stage:
            assert r.params_bytes == F32 * elements
            if not unread:  # the gradients, accumulated over the 2 microbatches: whole (zero1), or 1/dp of each
                # tensor's elements rounded up (zero2), from torch's parameter shapes
                assert r.grads_bytes == F32 * sum(-(-x.numel() // (p.dp if p.zero2 else 1)) for x in parameters)
        else:
            assert all(r.params_bytes == F32 * (steps[x] // 2 + (unread if r.stage == 0 else 0)) for x in r.replicas)


@pytest.mark.parametrize("index", range(len(PLANS) + 1), ids=[t for t, _ in PLANS] + ["ep"])
def test_family_plans_reconcile(family, index, request):
    fam, report, parameters = family
    plans = plans_of(fam)
    text, m = plans[index] if index < len(plans) else EP_PLAN
    reason = REFUSED.get(fam.model_type, {}).get(text) if is_moe(fam) or text != EP_PLAN[0] else NO_EXPERTS
    if reason is not None:
        with pytest.raises(UsageError) as e:
            ledger(report, plan_of(text, m))
        assert "\n" not in str(e.value) and e.value.exit_code == 2 and reason in str(e.value)
        return
    if text in PENDING.get(fam.model_type, {}):
        request.applymarker(pytest.mark.xfail(strict=True, reason=PENDING[fam.model_type][text]))
    assert_reconciles(report, parameters, text, m)


def test_whisper_front_end_is_replicated_over_tp(sweep_exports):  # noqa: F811 - the sweep's fixture
    """Whisper's convolutional front end (two 1-D convolutions of width K = 3 over the F mel frames, the second of
    stride 2, before the encoder's layers) is replicated over TP, with and without sp: each TP rank runs it whole,
    rank 0's as model work and rank 1's as redundant work, which is all of rank 1's redundant work (the dense
    convention counts no FLOPs for the norms and sums sp splits). In closed form, per microbatch: the first
    convolution 2·B·F·M·K·d forward and once more for its weight's gradient (the features need none), the second
    2·B·(F/2)·d·K·d forward and twice more (its input's and its weight's gradients)."""
    import flopcount
    from flopcount.parallel.ranks import node_shares

    fam = next(p.values[0] for p in FAMILIES if p.values[0].model_type == "whisper")
    report = flopcount.from_hf(built_config(fam), inputs_of(fam), convention="dense", cache_dir=sweep_exports,
                               mode="train", optimizer="sgd", memory=MemorySettings(device="cpu"))
    (b, mels, frames), d = fam.inputs["input_features"], fam.settings["d_model"]
    front = 2 * (2 * b * frames * mels * 3 * d) + 3 * (2 * b * (frames // 2) * d * 3 * d)
    for text in _TP:
        m = dict(PLANS)[text]
        led = ledger(report, plan_of(text, m))
        assert [r.redundant_flops for r in led.ranks] == [0, m * front], text
        convs = [s for s in node_shares(report, plan_of(text, m)) if report.nodes[s.index].op_type == "Conv"]
        assert len(convs) == 4 and all(s.rule == "replicated" for s in convs), text  # 2 convolutions × 2 ranks


def per_rank_cell(model_type: str) -> str:
    """docs/architectures.md's per-rank cell of a family: the plans whose identities hold exactly, then those refused
    with their reason."""
    fam = next(p.values[0] for p in FAMILIES if p.values[0].model_type == model_type)
    refused = REFUSED.get(model_type, {})
    pending = PENDING.get(model_type, {})
    exact = ", ".join(f"`{t}`" for t, _ in plans_of(fam) if t not in refused and t not in pending)
    return f"exact: {exact}" + _grouped(refused, "refused") + _grouped(pending, "pending")


def _grouped(reasons: dict[str, str], verb: str) -> str:
    """``; `plan`, `plan` verb: reason`` for each distinct reason of ``reasons`` (plan → reason)."""
    by: dict[str, list[str]] = {}
    for text, why in reasons.items():
        by.setdefault(why, []).append(f"`{text}`")
    return "".join(f"; {', '.join(ts)} {verb}: {why}" for why, ts in by.items())
