"""The memory ledger of graphs from torch keeps what torch's kernels keep (:mod:`flopcount.memory.kernels`), checked
against the unique storages torch's autograd saves in one real training step on this CPU.

Each kernel alone first, with the bytes written out (B·S·I float32 tensors), then whole models: a ViT, a BERT-like
encoder, a GPT-2-like decoder and a Llama-like decoder written in plain torch, and transformers' BERT, GPT-2, Llama
and ViT with eager and sdpa attention. A graph that did not come from torch keeps what its own nodes keep.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flopcount  # noqa: E402
from flopcount.memory.kernels import PATTERNS, framework_of, view_strides  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402
from helpers import saved_storages, sdpa_attend, tracked_step  # noqa: E402

F32 = 4
B, S, H, I = 3, 5, 8, 12  # noqa: E741 - batch, sequence, hidden, inner width: distinct, so no swap can pass


def activations(module, inputs, device="cpu", **kwargs):
    """The ledger's activations of one training step of ``module`` (SGD, so no optimizer figure interferes)."""
    report = flopcount.from_torch(module.train(), inputs, training=True, optimizer="sgd", cache_dir=False,
                                  memory=MemorySettings(device=device), **kwargs)
    assert not report.memory.missing and not report.memory.unsized
    return report.memory.ranks[0].activations_bytes


def torch_step(module, inputs) -> int:
    """The unique storages torch saves in one forward of ``module``, and the backward of that step run."""
    kept = saved_storages(module.train(), inputs)
    module(*inputs).backward()
    return kept


class Act(torch.nn.Module):
    """x → act(Linear(x)) → Linear → sum: the first Linear keeps x (B·S·H), the second keeps the activation's
    output (B·S·I); what the activation itself keeps is the rest."""

    def __init__(self, act):
        super().__init__()
        self.up, self.act, self.down = torch.nn.Linear(H, I), act, torch.nn.Linear(I, H)

    def forward(self, x):
        return self.down(self.act(self.up(x))).sum()


class NewGelu(torch.nn.Module):
    """transformers' ``gelu_new``: a Python formula, several torch kernels (not ``F.gelu``)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


LINEARS = F32 * B * S * (H + I)  # the two Linears' inputs
ONE = F32 * B * S * I  # one tensor of the activation's size


@pytest.mark.parametrize("act, kept", [
    pytest.param(torch.nn.GELU(), ONE, id="gelu: x"),
    pytest.param(torch.nn.GELU(approximate="tanh"), ONE, id="gelu tanh: x"),
    pytest.param(torch.nn.SiLU(), ONE, id="silu: x"),
    pytest.param(torch.nn.Mish(), ONE, id="mish: x"),
    pytest.param(torch.nn.Softplus(beta=2.0), ONE, id="softplus beta 2: x"),
    pytest.param(torch.nn.Softmax(dim=-1), 0, id="softmax: y, the next Linear's input"),
    # x (pow), tanh's output, 0.5·x and 1 + tanh (the last product's operands): four tensors
    pytest.param(NewGelu(), 4 * ONE, id="gelu_new as a formula: its parts"),
])
def test_each_activation_keeps_what_its_kernel_keeps(act, kept):
    torch.manual_seed(0)
    module, inputs = Act(act), (torch.randn(B, S, H),)
    assert activations(module, inputs) == torch_step(module, inputs) == LINEARS + kept


@pytest.mark.parametrize("act", [
    pytest.param(torch.nn.GELU(), id="gelu: one Gelu node"),
    pytest.param(torch.nn.SiLU(), id="silu: sigmoid, then the product"),
    pytest.param(torch.nn.Mish(), id="mish: one Mish node"),
    pytest.param(torch.nn.Softplus(beta=2.0), id="softplus beta 2: with its threshold's Where"),
    # its constants cast by CastLike to the type of the tensors they meet (which reads their type, not their data)
    pytest.param(torch.nn.Softplus(), id="softplus: its constants cast like x"),
])
def test_the_dynamo_exporters_activations_keep_what_the_kernel_keeps(act):
    """The torch.export-based exporter writes some kernels as one node and others its own way; each keeps x."""
    torch.manual_seed(0)
    module, inputs = Act(act).train(), (torch.randn(B, S, H),)
    m = torch.onnx.export(module, inputs, dynamo=True, input_names=["x"]).model_proto
    report = flopcount.count(m, mode="train", memory=MemorySettings(device="cpu"))
    assert report.memory.ranks[0].activations_bytes == torch_step(module, inputs) == LINEARS + ONE


class SliceWrite(torch.nn.Module):
    """Two slice assignments into a new tensor (as DeepSeek-V3's attention joins the halves of its heads): the
    halves of Linear(x) swapped, then Linear → sum."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(H, I), torch.nn.Linear(I, H)

    def forward(self, x):
        h = self.up(x)
        y = h.new_empty(h.shape)
        y[..., :I // 2] = h[..., I // 2:]
        y[..., I // 2:] = h[..., :I // 2]
        return self.down(y).sum()


def test_a_slice_assignment_keeps_nothing():
    """torch copies into a view of y and keeps nothing for it (the slice's bounds are numbers); the dynamo exporter
    writes each assignment as a ScatterND whose indices are the slice's positions (a Range of bounds that are
    shapes, with the batch symbolic as :func:`flopcount.from_hf` exports), which keep nothing either: the two
    Linears' inputs alone."""
    torch.manual_seed(0)
    module, inputs = SliceWrite().train(), (torch.randn(B, S, H),)
    from flopcount.frontends.export import export_dynamo

    m = export_dynamo(module, inputs, ["x"], ["loss"], 18)  # as from_hf exports: a symbolic batch
    assert any(n.op_type == "ScatterND" for n in m.graph.node)
    report = flopcount.count(m, mode="train", batch=B, memory=MemorySettings(device="cpu"))
    assert report.memory.ranks[0].activations_bytes == torch_step(module, inputs) == LINEARS


class Substitution(torch.nn.Module):
    """Forward substitution written in place, as Qwen3-Next's gated delta rule builds its inverse: each row of the
    [B, S, S] system Linear(x)·Linear(x)ᵀ (strictly lower) is cloned with the block above it, and the row written
    back; then a product with Linear(x) and a sum."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(H, I)

    def forward(self, x):
        h = self.up(x)
        system = (h @ h.transpose(-1, -2)).tril(-1)
        for i in range(1, S):
            row = system[..., i, :i].clone()
            sub = system[..., :i, :i].clone()
            system[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
        return (system @ h).sum()


def test_a_kept_view_of_a_tensor_written_after_is_a_copy():
    """torch keeps each step's clones (row [B, i] and block [B, i, i], for the product's gradient), not the
    system they were read from: the dynamo exporter writes the rows as Scatters and drops the clones, and the
    ledger reads the kept slices as copies. Kept besides: x (the Linear's), h (the two products'), the final
    system (the last product's; the tril keeps nothing)."""
    torch.manual_seed(0)
    module, inputs = Substitution().train(), (torch.randn(B, S, H),)
    from flopcount.frontends.export import export_dynamo

    m = export_dynamo(module, inputs, ["x"], ["loss"], 18)
    assert any(n.op_type in ("ScatterND", "ScatterElements") for n in m.graph.node)
    clones = sum(F32 * B * (i + i * i) for i in range(1, S))
    kept = F32 * B * S * (H + I) + F32 * B * S * S + clones
    report = flopcount.count(m, mode="train", batch=B, memory=MemorySettings(device="cpu"))
    assert torch_step(module, inputs) == kept
    assert report.memory.ranks[0].activations_bytes == kept


class RmsNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.proj = torch.nn.Linear(H, H), torch.nn.Linear(H, H)
        self.weight = torch.nn.Parameter(torch.ones(H))

    def forward(self, x):
        x = self.up(x)
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.proj(self.weight * y).sum()


def test_rsqrt_keeps_its_output_once():
    """up keeps its input (B·S·H); pow keeps x, up's output (B·S·H); x·rsqrt(…) keeps x and rsqrt's output (B·S
    floats, which rsqrt keeps too: once, where the exported Sqrt and division kept the square root besides); the
    weight's product keeps the normalized x and the projection its product (B·S·H each)."""
    torch.manual_seed(0)
    module, inputs = RmsNorm(), (torch.randn(B, S, H),)
    assert activations(module, inputs) == torch_step(module, inputs) == F32 * (4 * B * S * H + B * S)


class Cls(torch.nn.Module):
    """A head on the first token: ``x[:, 0]`` is a view of x, so the head keeps x's whole storage."""

    def __init__(self):
        super().__init__()
        self.up, self.head = torch.nn.Linear(H, H), torch.nn.Linear(H, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.up(x))[:, 0]).sum()


def test_a_select_is_a_view_of_the_whole_tensor():
    torch.manual_seed(0)
    module, inputs = Cls(), (torch.randn(B, S, H),)
    # up keeps x; tanh keeps its output, which the head keeps through the select (the same storage)
    assert activations(module, inputs) == torch_step(module, inputs) == F32 * 2 * B * S * H


class Drop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.drop = torch.nn.Linear(H, I), torch.nn.Dropout(0.25)

    def forward(self, x):
        return self.drop(self.up(x)).sum()


def test_dropout_keeps_float_noise_on_the_cpu_and_a_bool_mask_on_cuda():
    torch.manual_seed(0)
    module, inputs = Drop(), (torch.randn(B, S, H),)
    up = F32 * B * S * H
    assert activations(module, inputs) == torch_step(module, inputs) == up + F32 * B * S * I
    assert activations(module, inputs, device="cuda") == up + B * S * I  # native_dropout's bool mask


def test_view_strides_as_torch_views():
    """Where torch's ``view`` succeeds, the strides it gives; where it raises, None (``reshape`` copies)."""
    cases = [((2, 3, 4), (3, 4, 2)), ((2, 3, 4), (6, 4)), ((2, 3, 4), (24,)), ((4, 1, 3), (2, 2, 3, 1))]
    for shape, new in cases:
        for perm in ((0, 1, 2), (1, 0, 2), (0, 2, 1)):
            t = torch.empty(shape).permute(*perm)
            try:
                want = t.view(*new).stride()
            except RuntimeError:
                want = None
            assert view_strides(t.shape, t.stride(), new) == want, (shape, perm, new)


def test_only_torch_graphs_are_read_as_kernels():
    assert framework_of("pytorch 2.13.0") == "torch" and framework_of("pytorch") == "torch"
    assert framework_of("tf2onnx") is None and framework_of("") is None
    assert len({p.name for p in PATTERNS}) == len(PATTERNS)


def test_a_graph_from_elsewhere_keeps_what_its_nodes_keep(tmp_path):
    """The same export, its producer renamed: SiLU written as x·sigmoid(x) keeps x and sigmoid(x), as the graph's
    own nodes say (one B·S·I tensor more than torch's kernel)."""
    import onnx

    torch.manual_seed(0)
    module, inputs = Act(torch.nn.SiLU()), (torch.randn(B, S, H),)
    path = tmp_path / "silu.onnx"
    torch.onnx.export(module.train(), inputs, str(path), dynamo=False, input_names=["x"],
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    m = onnx.load(str(path))
    assert framework_of(m.producer_name) == "torch"
    counted = {}
    for producer in ("pytorch", "elsewhere"):
        m.producer_name = producer
        report = flopcount.count(m, mode="train", memory=MemorySettings(device="cpu"))
        counted[producer] = report.memory.ranks[0].activations_bytes
    assert counted["pytorch"] == LINEARS + ONE
    assert counted["elsewhere"] == LINEARS + 2 * ONE


# Whole models, in plain torch (tests/memory/kernel_models.py): every byte torch keeps, no more.

def _plain(name):
    from kernel_models import Bert, Gpt2, Llama, ViT

    torch.manual_seed(0)
    if name == "vit":
        return ViT(), (torch.randn(2, 3, 16, 16),)
    model = {"bert": Bert, "gpt2": Gpt2, "llama": Llama}[name]()
    return model, (torch.randint(0, 61, (2, 16)),)


@pytest.mark.parametrize("name", ["vit", "bert", "gpt2", "llama"])
def test_plain_torch_models_equal_the_saved_storages(name):
    """ViT: patch embedding, CLS token, exact GELU, the CLS head; BERT-like: post-norm, exact GELU, dropout, a
    tanh pooler on the CLS token; GPT-2-like: causal mask by masked fill, tanh GELU with biases, cross-entropy on
    the shifted labels (its int64 labels a copy, as torch's reshape of a slice; nll_loss's total weight); Llama-like:
    RMSNorm in float32 with rsqrt, grouped-query attention (K and V repeated by expand and reshape: copies), SiLU."""
    module, inputs = _plain(name)
    assert activations(module, inputs) == torch_step(module, inputs)


class Loss(torch.nn.Module):
    """A transformers model's last hidden state (and pooler output) summed."""

    def __init__(self, model, key):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x):
        out = self.model(**{self.key: x})
        pooled = getattr(out, "pooler_output", None)
        return out.last_hidden_state.sum() + (pooled.sum() if pooled is not None else 0)


def _hf(name, attn):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    b, s, h, i, layers = 2, 9, 24, 40, 2
    ids = (torch.randint(0, 61, (b, s)),)
    if name == "bert":
        config = transformers.BertConfig(vocab_size=61, hidden_size=h, num_hidden_layers=layers,
                                         num_attention_heads=3, intermediate_size=i, max_position_embeddings=32,
                                         attn_implementation=attn)
        return Loss(transformers.BertModel(config), "input_ids"), ids
    if name == "gpt2":
        config = transformers.GPT2Config(vocab_size=61, n_embd=h, n_layer=layers, n_head=3, n_positions=32,
                                         attn_implementation=attn)
        return Loss(transformers.GPT2Model(config), "input_ids"), ids
    if name == "llama":
        config = transformers.LlamaConfig(vocab_size=61, hidden_size=h, num_hidden_layers=layers,
                                          num_attention_heads=4, num_key_value_heads=2, intermediate_size=i,
                                          max_position_embeddings=32, attn_implementation=attn)
        return Loss(transformers.LlamaModel(config), "input_ids"), ids
    if name == "mistral":  # a sliding window of 4 over 9 tokens: a mask sdpa is handed
        config = transformers.MistralConfig(vocab_size=61, hidden_size=h, num_hidden_layers=layers,
                                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=i,
                                            max_position_embeddings=32, sliding_window=4, attn_implementation=attn)
        return Loss(transformers.MistralModel(config), "input_ids"), ids
    config = transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=h, num_hidden_layers=layers,
                                    num_attention_heads=3, intermediate_size=i, attn_implementation=attn)
    return Loss(transformers.ViTModel(config), "pixel_values"), (torch.randn(b, 3, 16, 16),)


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "mistral", "vit"])
def test_transformers_models_equal_the_saved_storages(name, attn):
    """sdpa on the CPU: the fused kernel where no dropout is asked for (Llama, ViT: Q, K and V as it reads them,
    K and V unrepeated, its output, a float32 log-sum-exp per query row; Mistral's sliding window, a mask handed
    to the kernel: K and V repeated and the mask converted to float32), the math path with dropout (BERT, GPT-2:
    the scaled Q and Kᵀ, the softmax output, the float noise and the dropped probabilities). GPT-2's ``gelu_new``
    is a formula, kept part by part, and its Q and K are views of one fused projection, which torch's matmul copies
    rather than keep the projection whole."""
    module, inputs = _hf(name, attn)
    assert activations(module, inputs) == torch_step(module, inputs)


class Unread(torch.nn.Module):
    """A module with a parameter its forward never reads (as DINOv2's ``mask_token`` without a mask)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(H, I)
        self.mask_token = torch.nn.Parameter(torch.zeros(1, 7, H))

    def forward(self, x):
        return self.up(x).sum()


def test_a_parameter_the_forward_never_reads_is_held_without_gradient_or_state():
    """torch holds the parameter (MemTracker's "Parameter"); the backward never reaches it, so it has no
    gradient, and Adam makes no states for it: the ledger's parameters are every parameter's bytes, its
    gradients and states the read ones'."""
    pytest.importorskip("torch.distributed._tools.mem_tracker")
    torch.manual_seed(0)
    module, x = Unread(), torch.randn(B, S, H)
    report = flopcount.from_torch(module.train(), (x,), training=True, optimizer="adam", cache_dir=False,
                                  memory=MemorySettings(device="cpu"))
    (rank,) = report.memory.ranks
    read, unread = H * I + I, 7 * H
    assert report.params == sum(p.numel() for p in module.parameters()) == read + unread
    assert any("mask_token (56)" in note for note in report.notes)
    # the second step under the tracker, the states made by the first
    after = tracked_step(module, lambda: module(x), torch.optim.Adam).after
    assert rank.params_bytes == after["Parameter"] == F32 * (read + unread)
    assert rank.grads_bytes == after["Gradient"] == F32 * read
    assert rank.optimizer_bytes == after["Optstate"] == 2 * F32 * read + F32 * 2  # m, v; a step counter per tensor
    assert rank.peak_bytes >= rank.params_bytes + rank.grads_bytes + rank.optimizer_bytes


@pytest.mark.slow
def test_dinov2_mask_token_is_counted_and_held():
    """transformers' DINOv2 without a mask never reads ``embeddings.mask_token`` (1 × h): the parameters are still
    torch's ``sum(p.numel())``, and the ledger holds them all (float32)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Dinov2Config(hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                       intermediate_size=40, image_size=16, patch_size=4)
    report = flopcount.from_hf(config, {"pixel_values": (2, 3, 16, 16)}, cache_dir=False, mode="train",
                               optimizer="adam", memory=MemorySettings(device="cpu"))
    torch_params = sum(p.numel() for p in transformers.Dinov2Model(config).parameters())
    assert report.params == torch_params
    assert report.memory.ranks[0].params_bytes == F32 * torch_params
    assert any("embeddings.mask_token (24)" in note for note in report.notes)


def test_sdpa_of_multi_query_k_and_v_is_the_math_path():
    """K and V of 1 head beside Q's 4: torch's fused kernels need as many heads, so it runs the math path: the
    projections keep x (B·S·H); the product with Kᵀ keeps the scaled Q (B·4·S·2) and Kᵀ copied to Q's heads
    (B·4·2·S); the product with V the softmax's output (B·4·S·S) and V copied to Q's heads (B·4·S·2). The fused
    reading would keep Q, K, V, its output and a log-sum-exp instead."""
    torch.manual_seed(0)
    module, inputs = sdpa_attend(1, 0.0, H), (torch.randn(B, S, H),)
    want = F32 * (B * S * H + 3 * B * 4 * S * 2 + B * 4 * S * S)
    assert activations(module, inputs) == torch_step(module, inputs) == want


def test_sdpa_dropout_survives_the_dynamo_export():
    """onnxscript writes sdpa's dropout as a Dropout without ``training_mode``, which its optimiser would delete;
    the torch.export frontend gives it a constant-true flag, so the CPU's math path is read: x (B·S·H), the scaled
    Q and Kᵀ and V (each B·4·S·2), the softmax's output, the float noise and the dropped probabilities (each
    B·4·S·S). The NaN guard after the softmax is ``_safe_softmax``'s own output."""
    from flopcount.frontends.export import export_dynamo

    torch.manual_seed(0)
    module, inputs = sdpa_attend(4, 0.25, H).train(), (torch.randn(B, S, H),)
    m = export_dynamo(module, inputs, ["x"], ["y"], 18)
    assert sum(n.op_type == "Dropout" for n in m.graph.node) == 1
    report = flopcount.count(m, mode="train", batch=B, memory=MemorySettings(device="cpu"))
    want = F32 * (B * S * H + 3 * B * 4 * S * 2 + 3 * B * 4 * S * S)
    assert report.memory.ranks[0].activations_bytes == torch_step(module, inputs) == want


class Grouped(torch.nn.Module):
    """x → Q (4 heads of 2) and K, V (2 heads) → sdpa → sum: ``is_causal`` with ``enable_gqa`` (no mask, K and V
    at their own heads), or K and V repeated to Q's heads and a boolean window mask of 2 keys made of positions."""

    def __init__(self, masked: bool):
        super().__init__()
        self.masked = masked
        self.q, self.k, self.v = (torch.nn.Linear(H, n * 2, bias=False) for n in (4, 2, 2))

    def forward(self, x):
        def heads(t, n):
            return t.unflatten(-1, (n, 2)).transpose(1, 2)

        q, k, v = heads(self.q(x), 4), heads(self.k(x), 2), heads(self.v(x), 2)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if not self.masked:
            return sdpa(q, k, v, is_causal=True, enable_gqa=True).sum()
        i = torch.arange(x.shape[1])
        window = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 2)
        return sdpa(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=window).sum()


@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_keeps_the_mask_it_is_handed(masked):
    """Both graphs hold a mask (the exporter writes is_causal as one); the causal one is no mask to the kernel:
    x (B·S·H), Q and the output (B·4·S·2 each), K and V at their 2 heads (B·2·S·2 each), the log-sum-exp (B·4·S).
    The window is handed to it: K and V repeated to 4 heads, and the mask converted to float32 (S·S)."""
    torch.manual_seed(0)
    module, inputs = Grouped(masked), (torch.randn(B, S, H),)
    kv = 2 * B * (4 if masked else 2) * S * 2
    want = F32 * (B * S * H + 2 * B * 4 * S * 2 + kv + B * 4 * S + (S * S if masked else 0))
    assert activations(module, inputs) == torch_step(module, inputs) == want
