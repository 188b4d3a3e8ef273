"""Each recompute policy by name against the run it names, on real training steps of a tiny Hugging Face Llama
(RMSNorm, grouped-query attention, SwiGLU) and GPT-2 (Conv1D fused QKV with biases, GELU MLP), eager attention,
counted by ``torch.utils.flop_counter.FlopCounterMode``:

* ``full``: ``torch.utils.checkpoint(..., use_reentrant=True)`` around each layer, which runs the layer's whole
  forward again in the backward (Megatron's full recompute);
* ``non-reentrant``: ``use_reentrant=False``, which stops as soon as every tensor the layer's backward saved is
  back: the MLP's last projection saves its input before it runs, so it does not run again;
* ``selective``: selective activation checkpointing that runs the score and value products and the softmax again.

torch's counter counts the products only (mm, bmm, addmm: forward, and both operands' gradients backward), without
a Gemm's bias add, so what is compared is the ledger's recompute on the product nodes, less GPT-2's bias adds
(M·N a Gemm of N outputs). Each figure is also written out as a closed form here."""

from __future__ import annotations

import functools

import pytest

from flopcount.parallel.plan import parse_parallel, parse_recompute
from flopcount.parallel.ranks import ledger, node_shares

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, L, HEADS, KV_HEADS, FFN, V = 32, 4, 4, 2, 48, 64
D = H // HEADS
B, S = 2, 8
M = B * S  # tokens of the batch
PRODUCTS = ("matmul", "gemm")
#: the score product Q·Kᵀ and the product with V of one layer, every head
CORE = 2 * 2 * B * HEADS * S * S * D


def _llama_config():
    return transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                                    num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V)


def _gpt2_config():  # no dropout: torch's CPU dropout of p = 0 returns its input, as the graph's does
    return transformers.GPT2Config(n_embd=H, n_layer=L, n_head=HEADS, vocab_size=V, n_positions=64,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


#: per model: its configuration, one layer's forward products before its last one, and that last one (the MLP's
#: down projection), as 2·M·K·N a product of M tokens, K inputs and N outputs; GPT-2's bias adds M·N each
MODELS = {
    "llama": (_llama_config, 2 * M * (H * H + 2 * H * KV_HEADS * D + H * H + 2 * H * FFN) + CORE,
              2 * M * FFN * H, 0, 0),
    "gpt2": (_gpt2_config, 2 * M * (H * 3 * H + H * H + H * 4 * H) + CORE, 2 * M * 4 * H * H,
             M * (3 * H + H + 4 * H), M * H),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    import flopcount

    return request.param, flopcount.from_hf(MODELS[request.param][0](), (B, S), cache_dir=False, mode="train")


def _attention_core(ctx, op, *args, **kwargs):
    """Selective activation checkpointing's policy for the attention core: the score and value products and the
    softmax between them run again, every other op's output is kept."""
    from torch.utils.checkpoint import CheckpointPolicy

    again = (torch.ops.aten.bmm.default, torch.ops.aten._softmax.default)
    return CheckpointPolicy.PREFER_RECOMPUTE if op in again else CheckpointPolicy.MUST_SAVE


def _checkpoint_kwargs(policy: str) -> dict | None:
    """``torch.utils.checkpoint``'s arguments for each layer of the run that ``policy`` names."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return {"none": None, "full": {"use_reentrant": True}, "non-reentrant": {"use_reentrant": False},
            "selective": {"use_reentrant": False,
                          "context_fn": functools.partial(create_selective_checkpoint_contexts, _attention_core)},
            }[policy]


@functools.cache
def _torch_step_flops(name: str, policy: str) -> int:
    """FlopCounterMode's total of one real training step (forward with the loss, backward, SGD step) of the model
    ``name`` with each layer checkpointed as ``policy`` names."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    net = transformers.AutoModelForCausalLM.from_config(MODELS[name][0](), attn_implementation="eager")
    net.config.use_cache = False
    net.train()
    kwargs = _checkpoint_kwargs(policy)
    if kwargs is not None:
        net.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ids = torch.randint(0, V, (B, S))
    with FlopCounterMode(display=False) as counter:
        net(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    return counter.get_total_flops()


def _ledger_products(report, policy: str) -> int:
    return sum(x.recompute for x in node_shares(report, parse_parallel("dp=1"), parse_recompute(policy))
               if report.nodes[x.index].family in PRODUCTS)


@pytest.mark.parametrize("policy", ["full", "non-reentrant", "selective"])
def test_each_policy_reruns_what_its_checkpoint_runs(model, policy):
    name, report = model
    _, early, last, early_bias, last_bias = MODELS[name]
    again = {"full": L * (early + last), "non-reentrant": L * early, "selective": L * CORE}[policy]
    bias = {"full": L * (early_bias + last_bias), "non-reentrant": L * early_bias, "selective": 0}[policy]
    assert _torch_step_flops(name, policy) - _torch_step_flops(name, "none") == again
    assert _ledger_products(report, policy) == again + bias


def test_full_reruns_each_layers_whole_forward_and_non_reentrant_all_but_the_last_product(model):
    """On every op, not only the products: ``full`` is the layers' whole forward; ``non-reentrant`` all of it but
    each layer's down projection (with its bias) and the residual add after it (M·H)."""
    name, report = model
    _, _, last, _, last_bias = MODELS[name]
    layers = sum(n.cost.flops for n, scopes in zip(report.nodes, report.modules.nodes)
                 if any(s.rsplit(".", 1)[-1].isdigit() for s in scopes))
    full, early = (ledger(report, parse_parallel("dp=1"), parse_recompute(p)).ranks[0].recompute_flops
                   for p in ("full", "non-reentrant"))
    assert full == layers
    assert full - early == L * (last + last_bias + M * H)
