"""A Llama layer (GQA, RMSNorm, SwiGLU, no dropout; 2-byte activations, softmax in their type) keeps
12·s·b·h + 4·s·b·h·g/a + 8·s·b·I + 8·s·b + 2·a·s²·b bytes: the figure docs/memory.md compares term by term with
the 34·s·b·h + 5·a·s²·b of Korthikanti et al. (2022)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
from helpers import weight

B, S, A, G, D, I = 2, 5, 6, 2, 4, 22  # batch, sequence, query heads, KV heads, head width, MLP width
H = A * D
F16 = TensorProto.FLOAT16


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def llama_layer():
    n = helper.make_node
    nodes = [
        n("RMSNormalization", ["x", "g1"], ["rms1"], axis=-1),
        n("MatMul", ["rms1", "wq"], ["q0"]), n("MatMul", ["rms1", "wk"], ["k0"]), n("MatMul", ["rms1", "wv"], ["v0"]),
        n("Reshape", ["q0", "q_shape"], ["q1"]), n("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        *(m for p in "kv" for m in (  # repeat_kv: [B, G, S, D] → [B, G, A/G, S, D] → [B, A, S, D]
            n("Reshape", [f"{p}0", "kv_shape"], [f"{p}1"]), n("Transpose", [f"{p}1"], [f"{p}2"], perm=[0, 2, 1, 3]),
            n("Unsqueeze", [f"{p}2", "axis2"], [f"{p}3"]), n("Expand", [f"{p}3", "repeat"], [f"{p}4"]),
            n("Reshape", [f"{p}4", "heads"], [f"{p}5"]))),
        n("Transpose", ["k5"], ["kt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["scores"]), n("Mul", ["scores", "scale"], ["scaled"]),
        n("Softmax", ["scaled"], ["probs"], axis=-1), n("MatMul", ["probs", "v5"], ["ctx"]),
        n("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]), n("Reshape", ["ctx_t", "merged"], ["ctx_m"]),
        n("MatMul", ["ctx_m", "wo"], ["o"]), n("Add", ["x", "o"], ["r1"]),
        n("RMSNormalization", ["r1", "g2"], ["rms2"], axis=-1),
        n("MatMul", ["rms2", "wg"], ["gate"]), n("MatMul", ["rms2", "wu"], ["up"]),
        n("Swish", ["gate"], ["act"]), n("Mul", ["act", "up"], ["prod"]), n("MatMul", ["prod", "wd"], ["down"]),
        n("Add", ["r1", "down"], ["y"]),
    ]
    inits = [
        weight("g1", (H,), F16), weight("g2", (H,), F16), weight("wq", (H, H), F16), weight("wk", (H, G * D), F16),
        weight("wv", (H, G * D), F16), weight("wo", (H, H), F16), weight("wg", (H, I), F16),
        weight("wu", (H, I), F16), weight("wd", (I, H), F16),
        _i64("q_shape", [B, S, A, D]), _i64("kv_shape", [B, S, G, D]), _i64("axis2", [2]),
        _i64("repeat", [B, G, A // G, S, D]), _i64("heads", [B, A, S, D]), _i64("merged", [B, S, H]),
        numpy_helper.from_array(np.asarray(D ** -0.5, dtype=np.float16), "scale"),
    ]
    g = helper.make_graph(nodes, "llama_layer", [helper.make_tensor_value_info("x", F16, [B, S, H])],
                          [helper.make_tensor_value_info("y", F16, [B, S, H])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 24)])


def test_llama_layer_keeps_the_documented_terms():
    report = flopcount.count(llama_layer(), mode="train", memory=True)
    (r,) = report.memory.ranks
    assert not report.memory.lower_bound
    s, b, h, a, g = S, B, H, A, G
    linear = 12 * s * b * h + 4 * s * b * h * g // a + 8 * s * b * I
    assert r.activations_bytes == linear + 8 * s * b + 2 * a * s * s * b
    assert r.statistics_bytes == 8 * s * b  # two float32 rstd per token


@pytest.mark.slow
@pytest.mark.parametrize("attn, recompute", [("eager", "selective"), ("sdpa", "selective"), ("eager", "none")])
def test_llama_layer_from_torch_keeps_what_torch_keeps(attn, recompute):
    """The same layer as transformers writes it, exported from torch and read as torch's kernels, bf16: each
    RMSNorm keeps its float32 input (4·s·b·h), the cast back (2·s·b·h, for the weight's gradient), its output (kept
    by the projections, 2·s·b·h) and a float32 rstd per token; the MLP gate, SiLU's output, up and their product
    (8·s·b·I). Attention under selective recompute (Megatron's core, the grouped-query repeat inside it): Q, K and
    V at their own heads and the output projection's input; sdpa's fused kernel (flash on CUDA) keeps the same, a
    float32 log-sum-exp per query row and head and its philox seed and offset (two int64); eager without recompute keeps K and V repeated (torch's reshape copies
    them), the float32 softmax and its bf16 cast (6·a·s²·b). For Llama-3-8B (h = 4096, a = 32, g = 8,
    I = 14336) the first is 49·s·b·h + 8·s·b."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from flopcount.memory.ledger import MemorySettings

    b, s, h, a, g, i = 2, 7, 32, 4, 2, 88
    kept = {}
    for layers in (1, 2):
        config = transformers.LlamaConfig(hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
                                          num_attention_heads=a, num_key_value_heads=g, vocab_size=64,
                                          torch_dtype="bfloat16", attn_implementation=attn)
        report = flopcount.from_hf(config, {"input_ids": (b, s)}, cache_dir=False, mode="train",
                                   optimizer="adamw", repeated_layers="export",
                                   memory=MemorySettings(recompute=recompute, master_weights=True))
        kept[layers] = report.memory.ranks[0].activations_bytes
    norms = 2 * (8 * s * b * h + 4 * s * b)
    mlp = 8 * s * b * i
    if recompute == "selective":
        attention = 4 * s * b * h + 4 * s * b * h * g // a + (4 * a * s * b + 16 if attn == "sdpa" else 0)
    else:
        attention = 8 * s * b * h + 6 * a * s * s * b
    assert kept[2] - kept[1] == norms + attention + mlp
