"""The architecture sweep: tiny configurations (2 layers, hidden 64) of the transformers families the installed
transformers builds on the meta device, each counted by :func:`flopcount.from_hf` and checked against torch itself
over a real CPU run of the same tiny model with eager attention:

* dense forward FLOPs == ``FlopCounterMode`` over ``model(**inputs)`` under ``no_grad``;
* dense training FLOPs (forward and backward) == ``FlopCounterMode`` over ``model(**inputs)`` and the backward
  of the sum of its floating-point outputs (a sum costs nothing in either count);
* parameters == ``sum(p.numel() for p in model.parameters())``;
* for a few causal LMs, ``generate=(P, N)`` == ``FlopCounterMode`` over a real ``generate()``.

A family that cannot be counted is in :data:`PENDING` with its reason, and the test asserts that it is refused with
one line and a flopcount exit code (never a crash). A difference that is the eager run's own (transformers computes
differently under export than eagerly) is in :data:`EAGER_DIFFERS`, asserted exactly and per op.
docs/architectures.md shows the table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import Any
from unittest import mock

import pytest

import flopcount
from flopcount.errors import FlopcountError

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

H, FFN, LAYERS, HEADS, KV_HEADS, VOCAB, B, S = 64, 96, 2, 4, 2, 64, 2, 7
TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
DECODER = dict(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
               num_key_value_heads=KV_HEADS, vocab_size=VOCAB, **TOKENS)
ENCODER = dict(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
               vocab_size=VOCAB, **TOKENS)
VISION = dict(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
              image_size=32, patch_size=8, num_channels=3)
MOE = dict(num_experts_per_tok=2)
#: Whisper's log-mel input: its mel bins, and its frames (2·max_source_positions: the front end's second
#: convolution has stride 2, and the encoder takes exactly that many frames)
MELS, FRAMES = 16, 16


@dataclasses.dataclass(frozen=True)
class Family:
    model_type: str
    kind: str
    settings: dict
    inputs: dict = dataclasses.field(default_factory=lambda: {"input_ids": (B, S)})
    generate: bool = False

    def config(self):
        return transformers.CONFIG_MAPPING[self.model_type](**self.settings)


def family(model_type: str, kind: str, *groups: dict, inputs=None, generate=False, marks=(), **settings) -> Any:
    merged = {k: v for g in groups for k, v in g.items()} | settings
    made = Family(model_type, kind, merged, inputs or {"input_ids": (B, S)}, generate)
    return pytest.param(made, id=model_type, marks=marks)


FAMILIES = [
    # dense decoders
    family("llama", "dense decoder", DECODER, generate=True),
    family("mistral", "dense decoder (sliding window)", DECODER, sliding_window=4),
    family("qwen2", "dense decoder (QKV biases)", DECODER),
    family("qwen3", "dense decoder (QK norm)", DECODER, head_dim=16),
    family("gemma", "dense decoder", DECODER, head_dim=16),
    family("gemma2", "dense decoder (soft-capping, sliding)", DECODER, head_dim=16, sliding_window=4),
    family("gemma3_text", "dense decoder (tied, local/global)", DECODER, head_dim=16, sliding_window=4),
    family("phi3", "dense decoder (fused QKV)", DECODER),
    family("olmo2", "dense decoder", DECODER),
    family("stablelm", "dense decoder (partial rotary)", DECODER),
    family("cohere2", "dense decoder (parallel block)", DECODER, sliding_window=4),
    family("smollm3", "dense decoder (NoPE layers)", DECODER),
    family("gpt2", "dense decoder (learned positions)", n_embd=H, n_layer=LAYERS, n_head=HEADS, n_positions=32,
           vocab_size=VOCAB, generate=True),
    family("gpt_neox", "dense decoder (parallel residual)", ENCODER),
    family("falcon", "dense decoder (multi-query)", hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
           vocab_size=VOCAB),
    # mixture-of-experts decoders
    family("mixtral", "MoE decoder", DECODER, MOE, num_local_experts=4, generate=True),
    family("qwen2_moe", "MoE decoder (shared expert)", DECODER, MOE, moe_intermediate_size=32,
           shared_expert_intermediate_size=48, num_experts=4),
    family("qwen3_moe", "MoE decoder", DECODER, MOE, head_dim=16, moe_intermediate_size=32, num_experts=4),
    family("olmoe", "MoE decoder", DECODER, MOE, num_experts=4),
    family("granitemoe", "MoE decoder", DECODER, MOE, num_local_experts=4),
    family("deepseek_v3", "MoE decoder (MLA, shared expert)", DECODER, MOE, num_key_value_heads=HEADS,
           moe_intermediate_size=32, first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1, n_group=2,
           topk_group=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16),
    family("gpt_oss", "MoE decoder (attention sinks)", DECODER, MOE, head_dim=16, num_local_experts=4,
           sliding_window=4),
    # hybrids: linear attention and state-space layers beside attention
    family("qwen3_next", "hybrid (gated delta rule)", DECODER, MOE, head_dim=16, moe_intermediate_size=32,
           shared_expert_intermediate_size=32, num_experts=4, linear_num_key_heads=2, linear_num_value_heads=4,
           linear_key_head_dim=16, linear_value_head_dim=16, full_attention_interval=2),
    family("jamba", "hybrid (Mamba, MoE)", DECODER, MOE, num_experts=2, attn_layer_period=2, attn_layer_offset=1,
           expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8, use_mamba_kernels=False),
    family("bamba", "hybrid (Mamba 2)", DECODER, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=32,
           mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=8),
    family("lfm2", "hybrid (short convolutions)", DECODER, layer_types=["conv", "full_attention"]),
    family("falcon_h1", "hybrid (Mamba 2 beside attention)", DECODER, mamba_n_heads=4, mamba_d_head=32,
           mamba_n_groups=1, mamba_d_ssm=128, mamba_d_state=8, mamba_chunk_size=8),
    family("mamba2", "state-space (Mamba 2)", hidden_size=H, num_hidden_layers=LAYERS, vocab_size=VOCAB, num_heads=4,
           head_dim=32, n_groups=1, state_size=8, chunk_size=8, expand=2, **TOKENS),
    family("granitemoehybrid", "hybrid (Mamba 2, MoE)", DECODER, MOE, num_local_experts=4,
           layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1,
           mamba_d_state=8, mamba_chunk_size=8),
    family("llama4_text", "MoE decoder (complex rotary)", DECODER, MOE, head_dim=16, intermediate_size_mlp=96,
           num_local_experts=4, interleave_moe_layer_step=2),
    # encoders
    family("bert", "encoder", ENCODER),
    family("roberta", "encoder", ENCODER, pad_token_id=1, bos_token_id=0),
    family("electra", "encoder", ENCODER, embedding_size=32),
    family("modernbert", "encoder (tied, local/global)", ENCODER, global_attn_every_n_layers=2, local_attention=4,
           cls_token_id=1, sep_token_id=2),
    # encoder-decoders
    family("t5", "encoder-decoder", d_model=H, d_kv=16, d_ff=FFN, num_layers=LAYERS, num_heads=HEADS,
           vocab_size=VOCAB, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
           inputs={"input_ids": (B, S), "decoder_input_ids": (B, 5)}),
    family("bart", "encoder-decoder", d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS,
           encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
           vocab_size=VOCAB, max_position_embeddings=32, **TOKENS,
           inputs={"input_ids": (B, S), "decoder_input_ids": (B, 5)}),
    family("whisper", "encoder-decoder (audio, convolutional front end)", d_model=H, encoder_layers=LAYERS,
           decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
           decoder_ffn_dim=FFN, vocab_size=VOCAB, num_mel_bins=MELS, max_source_positions=FRAMES // 2,
           max_target_positions=32, decoder_start_token_id=1, **TOKENS,
           inputs={"input_features": (B, MELS, FRAMES), "decoder_input_ids": (B, 5)}),
    # vision, and the text towers of multimodal models
    family("vit", "vision encoder", VISION, inputs={"pixel_values": (B, 3, 32, 32)}),
    family("dinov2", "vision encoder", VISION, inputs={"pixel_values": (B, 3, 32, 32)}),
    family("clip_text_model", "multimodal text tower", ENCODER, max_position_embeddings=32),
    family("siglip_text_model", "multimodal text tower", ENCODER, max_position_embeddings=32,
           architectures=["SiglipTextModel"]),
]


def built_config(fam: Family):
    """The family's configuration, with eager attention and (for MoE) each token's k experts as one batched
    product: what flopcount exports, and what the eager run must run to be compared op for op."""
    config = fam.config()
    config._attn_implementation = "eager"
    return config


def real_model(config, train: bool):
    """The tiny model with real (random) weights on the CPU, as the count builds it on the meta device."""
    from flopcount.frontends.hf import EXPERTS_IMPLEMENTATION, model_class

    if hasattr(config, "_experts_implementation"):
        config._experts_implementation = EXPERTS_IMPLEMENTATION
    torch.manual_seed(0)
    cls = model_class(config)
    model = cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config)  # AutoModel or not
    return model.train(train)


def float_outputs(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() and value.requires_grad else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in float_outputs(item)]
    return []


@dataclasses.dataclass(frozen=True)
class Torch:
    """torch's own figures for one family: FlopCounterMode's FLOPs per aten op of a forward and of a training
    step (forward and backward), the parameters, and those of them the backward gave a gradient."""

    forward: dict
    training: dict
    params: int
    trained: int  # the parameters the backward gave a gradient


@contextlib.contextmanager
def exporting(model):
    """Make the modelling code of ``model`` take the branch it takes under export, in an eager run: the modules
    :func:`flopcount.frontends.hf.export_branches` names see transformers' ``is_torchdynamo_exporting`` answer
    True (the same code as the export, run for real, so that FlopCounterMode sees what the graph computes)."""
    from flopcount.frontends.hf import export_branches

    helper = transformers.utils.is_torchdynamo_exporting
    names = set(export_branches(model))
    modules = {sys.modules[type(m).__module__] for m in model.modules()
               if type(m).__module__.rpartition(".")[2] in names}
    with contextlib.ExitStack() as stack:
        for module in modules:
            for name, value in vars(module).copy().items():
                if value is helper:
                    stack.enter_context(mock.patch.object(module, name, lambda: True))
        yield


def torch_figures(fam: Family, export_branch: bool = False) -> Torch:
    """torch's figures of the family's tiny model; ``export_branch``: with its modelling code on the branch it takes
    under export (:func:`exporting`)."""
    from torch.utils.flop_counter import FlopCounterMode

    from flopcount.frontends.hf import hf_inputs
    from flopcount.frontends.torch import forward_inputs

    config = built_config(fam)
    model = real_model(config, train=False)
    with exporting(model) if export_branch else contextlib.nullcontext():
        return _figures(model, forward_inputs(model, hf_inputs(model, fam.inputs)), FlopCounterMode)


def _figures(model, inputs, FlopCounterMode) -> Torch:
    with FlopCounterMode(display=False) as forward, torch.no_grad():
        model(**inputs)
    model.train()
    with FlopCounterMode(display=False) as training:
        outputs = float_outputs(model(**inputs))
        sum(t.sum() for t in outputs).backward()
    by_op = lambda counter: {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}  # noqa: E731
    training_flops = by_op(training)
    convs = [m for m in model.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d))]
    if convs and all(m.groups > 1 for m in convs) and "aten.convolution_backward" in training_flops:
        # FlopCounterMode's convolution_backward formula takes no groups: it counts a depthwise convolution's
        # gradients (the short convolutions of Mamba, Qwen3-Next's linear attention, LFM2) as a dense one's. Their
        # true cost, in closed form: the input gradient and the weight gradient cost one forward convolution each
        training_flops["aten.convolution_backward"] = 2 * by_op(forward)["aten.convolution"]
    return Torch(by_op(forward), training_flops, sum(p.numel() for p in model.parameters()),
                 sum(p.numel() for p in model.parameters() if p.grad is not None))


#: Families the installed transformers builds but flopcount cannot count here, with the reason (the test asserts
#: that each is refused with one line and a flopcount exit code, never a crash).
PENDING: dict[str, str] = {}

#: Families whose modelling code computes differently under export than eagerly (transformers asks
#: ``is_torchdynamo_exporting()``): they are checked against FlopCounterMode over an eager run of the export's branch
#: (:func:`exporting`), and the report must say so in its notes. Qwen3-Next's gated delta rule solves its chunk's
#: triangular system with ``torch.linalg.solve_triangular`` eagerly (aten.linalg_solve_triangular, for which
#: FlopCounterMode has no formula), and under export builds the inverse by forward substitution and applies it with
#: two products (aten.bmm): docs/architectures.md gives the size of the difference.
EXPORT_BRANCH = {"qwen3_next"}


def qwen3_next_dead_state_update(config) -> int:
    """FLOPs of the product the eager run computes and the exported graph does not. After the last chunk, the gated
    delta rule still updates its recurrent state (``key[:, :, i].transpose(-1, -2) @ v_new``: per value head, a
    (dk × C) by (C × dv) product, aten.bmm) and then drops that state, as no cache asks for it (use_cache=False, so
    output_final_state=False): the exporter prunes the dead product, FlopCounterMode counts it as it runs. Nothing
    downstream of it needs a gradient, so training differs by the same amount. In closed form: 2·B·Hv·dk·C·dv per
    linear-attention layer, C = 64 the chunk (S = 7 is padded to one chunk, and only the last chunk's update is
    dead)."""
    chunk = 64
    layers = sum(kind == "linear_attention" for kind in config.layer_types)
    return layers * 2 * B * config.linear_num_value_heads * config.linear_key_head_dim * chunk \
        * config.linear_value_head_dim


#: Families whose eager run (of the export's branch) computes a product the exported graph does not: the aten op
#: FlopCounterMode files it under and its FLOPs in closed form, taken off that op's figure, forward and training.
EAGER_DIFFERS = {"qwen3_next": ("aten.bmm", qwen3_next_dead_state_update)}


@pytest.fixture(scope="session")
def sweep_exports(tmp_path_factory):
    """One export cache for the sweep's test files, which count the same training graphs (FLOPs here, memory in
    test_architecture_sweep_memory.py): a family is exported once per run, shared by xdist's workers."""
    import os

    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "sweep-exports"


def counted(fam: Family, exports):
    return flopcount.from_hf(built_config(fam), fam.inputs, convention="dense", cache_dir=exports, mode="train")


@pytest.mark.parametrize("fam", FAMILIES)
def test_sweep_equals_torch(fam, sweep_exports):
    if fam.model_type in PENDING:
        with pytest.raises(FlopcountError) as e:
            counted(fam, sweep_exports)
        assert "\n" not in str(e.value) and e.value.exit_code != 1
        return
    report = counted(fam, sweep_exports)
    theirs = torch_figures(fam, export_branch=fam.model_type in EXPORT_BRANCH)
    if fam.model_type in EAGER_DIFFERS:
        op, closed_form = EAGER_DIFFERS[fam.model_type]
        dead = closed_form(built_config(fam))
        theirs = dataclasses.replace(theirs, forward=theirs.forward | {op: theirs.forward[op] - dead},
                                     training=theirs.training | {op: theirs.training[op] - dead})
        products = sum(n.cost.flops for n in report.nodes if n.family == "matmul")  # MatMul, Gemm: per op
        assert products == sum(v for k, v in theirs.forward.items() if k in ("aten.mm", "aten.bmm", "aten.addmm"))
    forward, training = sum(theirs.forward.values()), sum(theirs.training.values())
    if fam.model_type in EXPORT_BRANCH:
        assert any("computes under export" in note for note in report.notes)
    assert report.forward.flops == forward, (report.forward.flops, theirs.forward)
    assert report.forward.flops + report.backward.flops == training, (report.backward.flops, theirs.training)
    assert report.params == theirs.params
    assert report.trainable_params == theirs.trained  # what the backward gives a gradient, and nothing else


@pytest.mark.parametrize("fam", [p for p in FAMILIES if p.values[0].generate])
def test_generate_equals_flop_counter(fam):
    """``generate=(P, N)`` against FlopCounterMode over a real greedy ``generate()`` of exactly N new tokens."""
    from torch.utils.flop_counter import FlopCounterMode

    p, n = 4, 3
    g = flopcount.from_hf(built_config(fam), generate=(p, n), convention="dense", cache_dir=False).generation
    model = real_model(built_config(fam), train=False)
    ids = torch.randint(3, VOCAB, (1, p))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=0)
    assert g.total.flops == counter.get_total_flops()


def test_qwen3_next_computes_differently_under_export():
    """transformers' gated delta rule solves each chunk's triangular system with solve_triangular eagerly (no
    FlopCounterMode formula: 0) and, under export, builds the inverse by forward substitution and applies it to the
    values and the decayed keys with two products: 2·B·Hv·C·C·(dv + dk) more in aten.bmm, forward, with C = 64 (the
    chunk), Hv = 4 value heads, dk = dv = 16, on the one linear-attention layer. The frontend names the module."""
    from flopcount.frontends.hf import build_model, export_branches

    fam = next(p.values[0] for p in FAMILIES if p.values[0].model_type == "qwen3_next")
    assert export_branches(build_model(built_config(fam))) == ("modeling_qwen3_next",)
    eager, branch = torch_figures(fam), torch_figures(fam, export_branch=True)
    chunk, heads, dk, dv = 64, 4, 16, 16
    assert branch.forward["aten.bmm"] - eager.forward["aten.bmm"] == 2 * B * heads * chunk * chunk * (dv + dk)
    assert {k: v for k, v in branch.forward.items() if k != "aten.bmm"} == \
        {k: v for k, v in eager.forward.items() if k != "aten.bmm"}
