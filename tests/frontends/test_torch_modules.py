"""Per-module counts of PyTorch models through the frontend, against FlopCounterMode's own per-module counts.

The frontend keeps the module path of every node (torch.export's ``pkg.torch.onnx.name_scopes``); under the
``dense`` convention a module counts what FlopCounterMode counts for it (products, 2 FLOPs per MAC). On the CPU,
FlopCounterMode counts nothing for ``scaled_dot_product_attention``: the test adds its two products back,
4·B·S²·d per attention call (QKᵀ and the weighted sum of V, d = heads · head dim), to every module holding one.
"""

from __future__ import annotations

import pytest

import flopcount
from flopcount.reporting.modules import OUTSIDE, OWN

torch = pytest.importorskip("torch")


def _reference(model, x, attention_flops: int = 0):
    """FlopCounterMode's FLOPs per module path (root's class name stripped), with ``attention_flops`` added for
    each SelfAttention module inside (or equal to) the module."""
    from torch.utils.flop_counter import FlopCounterMode

    from flopcount.models.transformer import SelfAttention

    with FlopCounterMode(display=False) as counter:
        model(x)
    counts = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    root = type(model).__name__
    attention = [name for name, m in model.named_modules() if isinstance(m, SelfAttention)]
    out = {}
    for key, flops in counts.items():
        if key.startswith(root + "."):
            path = key[len(root) + 1:]
            inside = sum(1 for a in attention if a == path or a.startswith(path + "."))
            out[path] = flops + inside * attention_flops
    total = counts["Global"] + len(attention) * attention_flops
    return out, total


def _cases():
    from flopcount.models.mobilenet import mobilenet_v2
    from flopcount.models.resnet import resnet50
    from flopcount.models.transformer import bert, gpt2, vit

    tokens = torch.zeros(1, 16, dtype=torch.int64)
    # (model, input, attention FLOPs per call: 4·B·S²·d)
    yield "resnet50", resnet50(), torch.randn(1, 3, 64, 64), 0
    yield "mobilenet_v2", mobilenet_v2(), torch.randn(1, 3, 64, 64), 0
    yield "vit", vit(layers=2, image_size=32), torch.randn(1, 3, 32, 32), 4 * 1 * (2 * 2 + 1) ** 2 * 768  # 4 patches + cls
    yield "bert", bert(layers=2), tokens, 4 * 1 * 16 ** 2 * 768
    yield "gpt2", gpt2(layers=2), tokens, 4 * 1 * 16 ** 2 * 768


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "vit", "bert", "gpt2"])
def test_modules_equal_flop_counter_mode(name, monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_CACHE", "0")
    _, model, x, attention = next(c for c in _cases() if c[0] == name)
    model.eval()
    reference, total = _reference(model, x, attention)
    report = flopcount.from_torch(model, (x,), convention="dense")
    assert report.modules.source == "metadata"
    assert report.total.flops == total
    for depth in (1, 2):
        rows = report.by_module(depth)
        for row in rows:
            if row.module.endswith(OWN) or row.module == OUTSIDE:
                assert row.flops == 0, row.module  # every product runs inside some module
            else:
                assert row.flops == reference.get(row.module, 0), row.module
        # and no module FlopCounterMode saw at these depths is missing
        listed = {r.module for r in rows}
        depth_of = {r.module: r.depth for r in report.by_module(8)}
        missing = [m for m, v in reference.items() if v and depth_of.get(m, 99) <= depth and m not in listed]
        assert not missing


@pytest.mark.slow
def test_llama_layers_equal_the_closed_form(monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("FLOPCOUNT_CACHE", "0")
    h, kv_heads, heads, ffn, layers, vocab, s = 64, 2, 4, 176, 3, 97, 11
    config = transformers.LlamaConfig(hidden_size=h, intermediate_size=ffn, num_hidden_layers=layers,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                                      attn_implementation="eager")
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    report = flopcount.from_torch(model, {"input_ids": ((1, s), torch.int64), "use_cache": False},
                                  convention="dense")
    kv = h // heads * kv_heads
    projections = 2 * s * (h * h + 2 * h * kv + h * h)  # q, k, v (grouped: kv wide), o
    mlp = 2 * s * 3 * h * ffn  # gate, up, down
    attention = 2 * 2 * s * s * h  # QKᵀ and the weighted sum of V over every query head
    per_layer = projections + mlp + attention
    rows = {r.module: r for r in report.by_module(3)}
    for i in range(layers):
        assert rows[f"model.layers.{i}"].flops == per_layer
        assert rows[f"model.layers.{i}.mlp"].flops == mlp
    assert rows["lm_head"].flops == 2 * s * h * vocab
    assert report.total.flops == layers * per_layer + 2 * s * h * vocab
