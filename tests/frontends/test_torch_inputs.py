"""The PyTorch frontend, continued: counts that never depend on weight values, an export cache keyed on what the
export depends on, inputs given the way ``forward()`` takes them (dtypes, keywords, trained inputs), and models too
big to instantiate.

Expected counts are closed forms written out here from the layer sizes, with distinct odd sizes.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from torch import nn

from flopcount import from_torch
from flopcount.frontends import torch as frontend

N, C_IN, C_OUT, H, W, K = 2, 3, 5, 7, 9, 3


# ---------------------------------------------------------------------------------------------------------------
# Counts never depend on weight values
# ---------------------------------------------------------------------------------------------------------------


def conv(bias: float | None) -> nn.Module:
    """Conv C_IN→C_OUT, K×K, padding 1, with every bias element set to ``bias`` (or no bias)."""
    layer = nn.Conv2d(C_IN, C_OUT, K, padding=1, bias=bias is not None)
    if bias is not None:
        nn.init.constant_(layer.bias, bias)
    return layer


Y = N * C_OUT * H * W  # output elements (padding 1 keeps H×W)
CONV_PRODUCTS = 2 * Y * K * K * C_IN
CONV_PARAMS = C_OUT * C_IN * K * K


@pytest.mark.parametrize("bias", [0.0, 0.1, -2.5], ids=["zero-bias", "bias=0.1", "bias=-2.5"])
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_a_zero_bias_counts_like_any_other(cache, bias, mode):
    report = from_torch(conv(bias), (N, C_IN, H, W), mode=mode)
    assert report.forward.flops == CONV_PRODUCTS + Y  # products + one add per output for the bias
    assert report.params == CONV_PARAMS + C_OUT
    if mode == "train":
        # dW = dY ⋆ X: the forward products again (X is data: no dX); dB = Σ dY: one add per output
        assert report.backward.flops == CONV_PRODUCTS + Y
        assert report.trainable_params == CONV_PARAMS + C_OUT


def test_no_thread_outlives_the_export(cache):
    import threading

    before = {t.ident for t in threading.enumerate()}
    from_torch(conv(0.5), (N, C_IN, H, W))
    assert {t.name for t in threading.enumerate() if t.ident not in before} == set()  # no tqdm monitor


def test_no_bias_is_still_dropped(cache):
    """aten.conv2d(bias=None) reaches ONNX as a Conv with a zero bias the exporter builds; that one goes."""
    report = from_torch(conv(None), (N, C_IN, H, W))
    assert report.forward.flops == CONV_PRODUCTS and report.params == CONV_PARAMS


class TwoLinears(nn.Module):
    """Two Linear(4, 4) on inputs with different batches (so the TorchScript exporter runs, in eval mode)."""

    def __init__(self, same_values: bool):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        if same_values:
            with torch.no_grad():
                for p in (*self.a.parameters(), *self.b.parameters()):
                    p.fill_(0.5)

    def forward(self, x, y):
        return self.a(x) + self.b(y).sum(0)


@pytest.mark.parametrize("same_values", [False, True], ids=["distinct", "equal-values"])
def test_parameters_with_equal_values_stay_apart(cache, same_values):
    report = from_torch(TwoLinears(same_values), ((2, 4), (3, 4)))
    assert report.params == 2 * (4 * 4 + 4)


def test_tied_weights_are_one_parameter(cache):
    module = TwoLinears(False)
    module.b.weight = module.a.weight  # the same tensor: one parameter, as torch counts it
    assert report_params(module) == sum(p.numel() for p in module.parameters()) == 4 * 4 + 2 * 4  # one weight, two biases


def report_params(module) -> int:
    return from_torch(module, ((2, 4), (3, 4))).params


# ---------------------------------------------------------------------------------------------------------------
# The export cache covers what forward() reads
# ---------------------------------------------------------------------------------------------------------------


class Settings:
    """A configuration object, as Hugging Face models hold one (attributes read by forward, some private)."""

    def __init__(self):
        self.activation = "relu"
        self._scale_output = False


class Configured(nn.Module):
    """Linear(5→7), then ReLU or nothing, then ×2 or nothing, as ``self.settings`` says."""

    def __init__(self):
        super().__init__()
        self.settings = Settings()
        self.fc = nn.Linear(5, 7)

    def forward(self, x):
        y = self.fc(x)
        if self.settings.activation == "relu":
            y = torch.relu(y)
        return y * 2 if self.settings._scale_output else y


LINEAR = 2 * N * 5 * 7 + N * 7  # products + bias
ELEMENTS = N * 7


def test_a_changed_configuration_is_a_new_export(cache, exports):
    module = Configured()
    assert from_torch(module, (N, 5)).total.flops == LINEAR + ELEMENTS  # + ReLU
    module.settings.activation = "none"
    assert from_torch(module, (N, 5)).total.flops == LINEAR
    module.settings._scale_output = True  # a private attribute (as set_attn_implementation sets one)
    assert from_torch(module, (N, 5)).total.flops == LINEAR + ELEMENTS  # + Mul
    assert len(exports) == 3
    module.settings.activation, module.settings._scale_output = "relu", False
    assert from_torch(module, (N, 5)).total.flops == LINEAR + ELEMENTS
    assert len(exports) == 3  # the first export, from the cache


def test_a_forward_hook_is_part_of_the_key(cache, exports):
    module = Configured()
    from_torch(module, (N, 5))
    module.fc.register_forward_hook(lambda mod, args, out: out * 3)
    assert from_torch(module, (N, 5)).total.flops == LINEAR + 2 * ELEMENTS  # + the hook's Mul
    assert len(exports) == 2


def test_state_that_cannot_be_described_is_not_cached(cache, exports, caplog):
    import threading

    module = Configured()
    module.lock = threading.Lock()  # no __dict__: nothing says what forward could read from it
    with caplog.at_level("INFO", logger=frontend.__name__):
        for _ in range(2):
            from_torch(module, (N, 5))
    assert len(exports) == 2 and not list(cache.glob("torch-*.onnx"))
    assert "not cached: cannot describe a _thread.lock" in caplog.text


# The key is the same in every process: Python salts the hashes of strings per process (PYTHONHASHSEED), which
# orders sets and gives hash() caches their values; default reprs hold memory addresses; hook handle ids count every
# hook the process registered before.

STATEFUL = """
import json, sys
import torch
from torch import nn
from flopcount.frontends import torch as frontend

class Options:
    def __init__(self):
        self.names = {"relu", "gelu", "silu", "tanh", "mish"}        # a set of strings: hash-ordered
        self.tags = {Tag("b"), Tag("a"), Tag("c")}                    # a set of objects: id-ordered
        self._hash = hash("relu")                                     # a cached hash(): salted

class Tag:
    def __init__(self, name):
        self.name = name

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.options = Options()
        self.act = lambda y: y                                        # its repr holds an address
        self.fc = nn.Linear(5, 7)

    def extra_repr(self):
        return f"act={self.act}"

    def forward(self, x):
        return self.act(self.fc(x))

for _ in range(int(sys.argv[1])):                                     # hooks registered before draw handle ids
    nn.Linear(1, 1).register_forward_hook(lambda *a: None)
net = Net()
net.fc.register_forward_hook(lambda mod, args, out: out * 3)
call = frontend._bind(torch, net, (2, 5), None, None)
print(frontend.fingerprint(torch, net, call, False, 18))
"""


def key_in_a_process(script: str, hash_seed: int, *args: str, env: dict[str, str] | None = None) -> str:
    """The last line ``script`` prints, run by a new interpreter with ``PYTHONHASHSEED=hash_seed``."""
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, **(env or {}), "PYTHONHASHSEED": str(hash_seed)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_the_key_is_the_same_in_every_process():
    first = key_in_a_process(STATEFUL, 1, "0")
    assert first != "None"  # the state was described, the export is cached
    assert key_in_a_process(STATEFUL, 2, "3") == first


def test_the_key_still_sees_a_set_change():
    class Options:
        def __init__(self, names):
            self.names = names

    def key(names):
        module = nn.Linear(5, 7)
        module.options = Options(names)
        return frontend.fingerprint(torch, module, frontend._bind(torch, module, (2, 5), None, None), False, 18)

    assert key({"relu", "gelu"}) == key({"gelu", "relu"})
    assert key({"relu", "gelu"}) != key({"relu", "silu"})
    assert key({"relu", "gelu"}) != key(frozenset({"relu", "gelu"}))


LLAMA = """
import json, sys
import torch, transformers
from flopcount import from_torch
from flopcount.frontends import torch as frontend

exports = []
real = frontend._export
frontend._export = lambda *args: exports.append(1) or real(*args)
config = transformers.LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                  rms_norm_eps=float(sys.argv[1]))
module = transformers.LlamaForCausalLM(config)
inputs = {"input_ids": ((1, 5), torch.int64)}
key = frontend.fingerprint(torch, module, frontend._bind(torch, module, inputs, None, None), False, 18)
report = from_torch(module, inputs)
print(json.dumps({"key": key, "exports": len(exports), "flops": report.total.flops}))
"""


@pytest.mark.slow
def test_a_transformers_llama_export_is_cached_across_processes(tmp_path):
    """A tiny LlamaForCausalLM built from its config (nothing downloaded), counted by two processes with different
    hash seeds that share a cache folder: the second reads the first one's export."""
    pytest.importorskip("transformers")
    import json

    env = {frontend.CACHE_ENV: str(tmp_path / "cache")}
    first = json.loads(key_in_a_process(LLAMA, 1, "1e-6", env=env))
    (entry,) = (tmp_path / "cache").glob("torch-*.onnx")
    written = entry.stat().st_mtime_ns
    second = json.loads(key_in_a_process(LLAMA, 2, "1e-6", env=env))
    assert first["exports"] == 1 and first["key"] is not None
    assert second["key"] == first["key"]
    assert second["exports"] == 0  # a cache hit: no export ran
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [entry.name] and entry.stat().st_mtime_ns == written
    assert second["flops"] == first["flops"]
    changed = json.loads(key_in_a_process(LLAMA, 2, "1e-5", env=env))  # another rms_norm_eps: same shapes
    assert changed["key"] != first["key"] and changed["exports"] == 1


# ---------------------------------------------------------------------------------------------------------------
# Inputs: dtypes, keywords, constants
# ---------------------------------------------------------------------------------------------------------------

VOCAB, D, S, OUT = 97, 16, 11, 5


class Tagger(nn.Module):
    """Embedding(97, 16) → Linear(16→5) on token ids; an optional mask multiplies the logits; ReLU unless told."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.head = nn.Linear(D, OUT)

    def forward(self, input_ids, mask=None, activation: bool = True):
        y = self.head(self.embed(input_ids))
        if mask is not None:
            y = y * mask
        return torch.relu(y) if activation else y


TOKENS = N * S
HEAD = 2 * TOKENS * D * OUT + TOKENS * OUT  # products + bias (the Gather of the embedding is free)
LOGITS = TOKENS * OUT


@pytest.mark.parametrize(
    "inputs",
    [
        pytest.param(((N, S), torch.int64), id="(shape, dtype)"),
        pytest.param(((N, S), "int64"), id="(shape, 'int64')"),
        pytest.param(torch.zeros(N, S, dtype=torch.int64), id="tensor"),
        pytest.param({"input_ids": ((N, S), torch.int32)}, id="dict"),
    ],
)
def test_token_inputs(cache, inputs):
    report = from_torch(Tagger(), inputs)
    assert report.total.flops == HEAD + LOGITS  # + ReLU
    assert [(t.name, t.shape) for t in report.model.inputs] == [("input_ids", (N, S))]


def test_keyword_inputs_and_constants(cache):
    report = from_torch(Tagger(), {"mask": (N, S, OUT), "input_ids": ((N, S), torch.int64), "activation": False})
    assert [t.name for t in report.model.inputs] == ["input_ids", "mask"]  # forward()'s order
    assert report.total.flops == HEAD + LOGITS  # + the mask's Mul, no ReLU


def test_an_unknown_keyword_is_refused_with_the_valid_names(cache):
    with pytest.raises(frontend.UsageError) as caught:
        from_torch(Tagger(), {"input_ids": ((N, S), torch.int64), "labels": (2, 3)})
    assert str(caught.value) == (
        "torch: Tagger.forward(input_ids, mask=None, activation=True) has no parameter named 'labels'; "
        "inputs can be given by the names: input_ids, mask, activation"
    )


def test_inputs_that_do_not_fit_forward(cache, capfd):
    with pytest.raises(frontend.UsageError) as caught:
        from_torch(nn.Linear(4, 5), (N, 3))
    # torch's own words for the mismatch, as the installed release writes them (2.15 prefixes them with "addmm: ")
    with pytest.raises(RuntimeError) as torch_says:
        nn.Linear(4, 5)(torch.zeros(N, 3))
    assert "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)" in str(torch_says.value)
    assert str(caught.value) == (
        "torch: the inputs do not fit Linear.forward(input): passed input: float32[2, 3]; "
        f"forward() raised RuntimeError: {str(torch_says.value).splitlines()[0]}; "
        "give the shapes (and :dtype) forward() expects"
    )
    with pytest.raises(frontend.UsageError, match=r"passed input_ids: float32\[2, 11\]; forward\(\) raised"):
        from_torch(Tagger(), (N, S))  # float token ids: the embedding refuses them
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # none of torch's own log lines


# ---------------------------------------------------------------------------------------------------------------
# Trained inputs
# ---------------------------------------------------------------------------------------------------------------


class FedTable(nn.Module):
    """x[N, 5] @ table[5, 6] → Linear(6→7): the table is fed in, not a parameter."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 7)

    def forward(self, x, table):
        return self.fc(x @ table)


def test_trainable_inputs_get_gradients(cache):
    plain = from_torch(FedTable(), ((N, 5), (5, 6)), mode="train")
    named = from_torch(FedTable(), ((N, 5), (5, 6)), mode="train", trainable_inputs=["table"])
    grad = from_torch(FedTable(), (torch.randn(N, 5), torch.randn(5, 6, requires_grad=True)), mode="train")
    assert named.forward == plain.forward and grad == named
    # the table needs dTable = xᵀ·dH (2·5·N·6) and so dH = dY·W_fc (2·N·7·6), which data alone does not
    assert named.backward.flops - plain.backward.flops == 2 * 5 * N * 6 + 2 * N * 7 * 6
    assert named.trainable_params - plain.trainable_params == 5 * 6
    with pytest.raises(frontend.UsageError, match="'x2' is not a floating-point input of forward"):
        from_torch(FedTable(), ((N, 5), (5, 6)), mode="train", trainable_inputs=["x2"])


def test_count_trainable_inputs_on_an_onnx_file(cache, tmp_path):
    from flopcount import count

    path = tmp_path / "fed.onnx"
    frontend.to_onnx(FedTable(), ((N, 5), (5, 6)), path=path)
    plain, named = count(path, mode="train"), count(path, mode="train", trainable_inputs=["table"])
    assert named.backward.flops - plain.backward.flops == 2 * 5 * N * 6 + 2 * N * 7 * 6
    with pytest.raises(frontend.UsageError, match="'fc.weight' is not a floating-point input of the graph; "
                                                  "trainable inputs can be: x, table"):
        count(path, mode="train", trainable_inputs=["fc.weight"])
    with pytest.raises(frontend.UsageError, match=r"need mode='train'"):
        count(path, trainable_inputs=["table"])


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A module of factories importable by a name unique to the test."""
    name = f"fc_inputs_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(
        "from tests.frontends.test_torch_inputs import FedTable, Tagger\n"
        "def tagger():\n    return Tagger()\n"
        "def fed():\n    return FedTable()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_cli_dtype_and_names(cache, factories, capsys):
    import json

    from flopcount.cli import main

    assert main(["--torch", f"{factories}:tagger", "--input-shape", f"input_ids={N}x{S}:int64", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"]["flops"] == HEAD + LOGITS
    assert main(["--torch", f"{factories}:tagger", "--input-shape", f"input_ids={N}x{S}:int64",
                 "--input-shape", "labels=2x3"]) == 2
    err = capsys.readouterr().err
    assert "has no parameter named 'labels'; inputs can be given by the names: input_ids, mask, activation" in err
    assert err.count("\n") == 1
    assert main(["--torch", f"{factories}:tagger", "--input-shape", f"input_ids={N}x{S}"]) == 2  # float ids
    err = capsys.readouterr().err
    assert "the inputs do not fit Tagger.forward" in err and "passed input_ids: float32[2, 11]" in err
    assert err.count("\n") == 1


def test_cli_dtype_suffix_is_for_torch_only(capsys, tmp_path):
    from flopcount.cli import main

    assert main([str(tmp_path / "m.onnx"), "--input-shape", "input_ids=1x128:int64"]) == 2
    assert ("--input-shape input_ids=...:int64: a :DTYPE suffix is for --torch inputs; an ONNX model declares its "
            "input types, give NAME=DIMS") in capsys.readouterr().err
    assert main(["--torch", "m:f", "--input-shape", "x=1x2:int63"]) == 2
    assert "unknown element type 'int63'" in capsys.readouterr().err


def test_cli_trainable_input(cache, factories, capsys):
    import json

    from flopcount.cli import main

    args = ["--torch", f"{factories}:fed", "--input-shape", f"x={N}x5", "--input-shape", "table=5x6", "--mode", "train",
            "--format", "json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--trainable-input", "table"]) == 0
    named = json.loads(capsys.readouterr().out)
    assert named["backward"]["flops"] - plain["backward"]["flops"] == 2 * 5 * N * 6 + 2 * N * 7 * 6


# ---------------------------------------------------------------------------------------------------------------
# Modules on the meta device
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_a_meta_device_module_counts_without_weights(cache, mode):
    with torch.device("meta"):
        module = conv(0.0)
    report = from_torch(module, (N, C_IN, H, W), mode=mode)
    assert report.forward.flops == CONV_PRODUCTS + Y and report.params == CONV_PARAMS + C_OUT
    if mode == "train":
        assert report.backward.flops == CONV_PRODUCTS + Y


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face transformers (skipped where transformers is not installed)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_transformers_llm_from_its_config_on_the_meta_device(cache, exports):
    """A small Llama built from its configuration (random init, nothing downloaded), counted on the meta device,
    with its default use_cache=True (the DynamicCache output is left out of the graph)."""
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )
    with torch.device("meta"):
        meta = transformers.AutoModelForCausalLM.from_config(config)
    inputs = {"input_ids": ((N, S), torch.int64)}
    report = from_torch(meta, inputs, convention="dense", mode="train")

    real = transformers.AutoModelForCausalLM.from_config(config)  # torch's own count of the same forward
    real.set_attn_implementation("eager")  # FlopCounterMode counts no CPU scaled_dot_product_attention; matmuls it does
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        real(input_ids=torch.zeros(N, S, dtype=torch.int64))
    assert report.forward.flops == counter.get_total_flops()
    assert report.backward.flops > report.forward.flops
    assert [(t.name, t.shape) for t in report.model.outputs] == [(report.model.outputs[0].name, (N, S, VOCAB))]

    meta.set_attn_implementation("eager")  # forward now takes another path: a new export, not the cached one
    from_torch(meta, inputs, convention="dense")
    assert len(exports) == 2


def _hf_cases():
    """Small configurations of the architectures users count most (random init from the config, nothing
    downloaded): (name, config factory, auto class name, forward inputs)."""
    ids = ((N, S), torch.int64)
    return [
        pytest.param(lambda t: t.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=48, max_position_embeddings=64),
                     "AutoModelForMaskedLM", {"input_ids": ids}, id="bert"),
        pytest.param(lambda t: t.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                            bos_token_id=0, eos_token_id=0),
                     "AutoModelForCausalLM", {"input_ids": ids}, id="gpt2"),
        pytest.param(lambda t: t.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                                          decoder_start_token_id=0),
                     "AutoModelForSeq2SeqLM", {"input_ids": ids, "decoder_input_ids": ids}, id="t5-encoder-decoder"),
        pytest.param(lambda t: t.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=48, num_labels=10),
                     "AutoModelForImageClassification", {"pixel_values": (N, 3, 32, 32)}, id="vit"),
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("config", "auto", "inputs"), _hf_cases())
def test_transformers_architectures_equal_flop_counter(config, auto, inputs):
    """Encoder, decoder, encoder-decoder and vision transformers from transformers, each exported from the meta
    device and counted (forward products, convention dense) exactly as FlopCounterMode counts the real module's
    forward; their training backward is counted with no operator left without a backward formula."""
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    auto = getattr(transformers, auto)
    with torch.device("meta"):
        meta = auto.from_config(config(transformers))
    report = from_torch(meta, inputs, convention="dense", mode="train", cache_dir=False)

    real = auto.from_config(config(transformers))
    real.set_attn_implementation("eager")  # FlopCounterMode counts no CPU scaled_dot_product_attention
    example = {name: torch.zeros(*spec[0], dtype=spec[1]) if isinstance(spec[1], torch.dtype) else torch.zeros(*spec)
               for name, spec in inputs.items()}
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        real(**example)
    assert report.forward.flops == counter.get_total_flops()
    assert not report.backward_unsupported and report.backward.flops > report.forward.flops
