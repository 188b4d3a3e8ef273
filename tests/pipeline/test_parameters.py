"""Parameters mean what users think (flopcount.pipeline.parameters): weights stored as Constant nodes are
parameters, BatchNormalization's running statistics are buffers, and constants an exporter folded
(Pow exponents, epsilons, GELU coefficients, rotary tables, masks, fill values) are neither, so they
are never trained; ``trainable=`` names the framework's parameters outright."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.errors import UsageError
from flopcount.output.render import render

N = helper.make_node
F = TensorProto.FLOAT
RESNET = Path(__file__).resolve().parents[2] / "examples" / "resnet50-v1.5.onnx"


def arr(name, shape, value=0.5):
    return numpy_helper.from_array(np.full(shape, value, np.float32), name)


def model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
                          [helper.make_tensor_value_info(o, F, None) for o in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def constant(name, shape):
    return N("Constant", [], [name], value=arr(name, shape))


# --- ResNet-50 v1.5: torch's parameter count, BN statistics apart ----------------------------------


def test_resnet50_parameters_are_the_framework_count_and_buffers_apart():
    r = flopcount.count(RESNET)
    bn_channels = 26_560  # 64 (stem) + Σ over 16 bottlenecks of w + w + 4w, plus 4 downsample 4w
    assert r.params == 25_557_032  # sum(p.numel() for p in torchvision-style resnet50().parameters())
    assert r.buffers == 2 * bn_channels  # running mean and var; 25,610,152 − 25,557,032
    doc = json.loads(render(r, "json"))
    assert doc["schema_version"] == 9
    assert (doc["total"]["params"], doc["total"]["buffers"]) == (25_557_032, 53_120)
    assert "Parameters: 25,557,032 (25.56 M); buffers (not trained): 53,120" in render(r)


# --- weights stored as Constant nodes --------------------------------------------------------------


def test_constant_node_weights_are_parameters_and_trained():
    b, d_in, d_out = 4, 7, 5
    m = model([constant("W", (d_in, d_out)), constant("B", (d_out,)), constant("eps", ()),
               N("MatMul", ["x", "W"], ["h"]), N("Add", ["h", "B"], ["a"]), N("Add", ["a", "eps"], ["y"])],
              {"x": [b, d_in]}, ["y"])
    r = flopcount.count(m, mode="train")
    assert r.params == d_in * d_out + d_out  # the scalar eps is a constant
    assert r.trainable_params == d_in * d_out + d_out
    # backward: dW = xᵀ·dY (d_in·b·d_out MACs), dB sums dY over the batch (b·d_out − d_out adds),
    # no dX (x is data), eps gets none
    assert r.backward.flops == 2 * d_in * b * d_out + (b * d_out - d_out)


# --- folded constants ------------------------------------------------------------------------------

B, S, D, FF = 2, 6, 8, 12


def llama_like_graph():
    """RMSNorm (Pow exponent, eps, weight[D]), a projection, rotary Mul by cos/sin tables [S, D],
    a score Add of a causal mask [1, 1, S, S] into Softmax, a Where with a fill value, a GELU-style
    coefficient Mul, and a learned position embedding [1, S, D] added to the input."""
    nodes = [
        N("Add", ["x", "pos"], ["x0"]),
        N("Pow", ["x0", "two"], ["sq"]), N("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        N("Add", ["ms", "eps"], ["ms_eps"]), N("Sqrt", ["ms_eps"], ["rms"]), N("Div", ["x0", "rms"], ["xn"]),
        N("Mul", ["xn", "g"], ["h"]),
        N("MatMul", ["h", "wq"], ["q"]), N("MatMul", ["h", "wk"], ["k"]),
        N("Mul", ["q", "cos"], ["qc"]), N("Mul", ["q", "sin"], ["qs"]), N("Add", ["qc", "qs"], ["qr"]),
        N("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), N("MatMul", ["qr", "kt"], ["s"]),
        N("Mul", ["s", "scale"], ["ss"]), N("Add", ["ss", "mask"], ["sm"]),
        N("Softmax", ["sm"], ["p"], axis=-1), N("MatMul", ["p", "h"], ["o"]),
        N("Greater", ["o", "zero"], ["pos_mask"]), N("Where", ["pos_mask", "o", "fill"], ["ow"]),
        N("MatMul", ["ow", "w1"], ["f"]), N("Mul", ["f", "half"], ["y"]),
    ]
    inits = [arr("pos", (1, S, D)), arr("two", (), 2.0), numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             arr("eps", (1,), 1e-6), arr("g", (D,)), arr("wq", (D, D)), arr("wk", (D, D)),
             arr("cos", (S, D)), arr("sin", (S, D)), arr("scale", ()), arr("mask", (1, 1, S, S)),
             arr("zero", ()), arr("fill", (), -1.0), arr("w1", (D, FF)), arr("half", (1,))]
    return model(nodes, {"x": [B, S, D]}, ["y"], inits)


LLAMA_PARAMS = S * D + D + 2 * D * D + D * FF  # pos, g, wq, wk, w1


def test_folded_constants_are_neither_parameters_nor_trained():
    r = flopcount.count(llama_like_graph(), mode="train")
    assert r.params == LLAMA_PARAMS and r.buffers == 0
    assert r.trainable_params == LLAMA_PARAMS
    pow_node = next(n for n in r.nodes if n.op_type == "Pow")
    # x0 = x + pos needs a gradient (pos is trained): dX only, 3 per element (dY·B·Y/X); no
    # exponent gradient (3 per element and a sum to one value more)
    assert pow_node.backward.flops == 3 * B * S * D


def test_trainable_names_override_the_graph_rule():
    m = llama_like_graph()
    r = flopcount.count(m, mode="train", trainable=["wq", "wk", "w1"])
    assert r.trainable_params == r.params == 2 * D * D + D * FF
    assert r.buffers == S * D + D  # pos and g: weights the framework does not train (frozen)
    r = flopcount.count(m, mode="train", trainable=["mask"])
    assert r.trainable_params == r.params == S * S and r.buffers == LLAMA_PARAMS


def test_unknown_trainable_names_are_refused():
    with pytest.raises(UsageError, match=r"trainable 'nope' matches no floating-point initializer"):
        flopcount.count(llama_like_graph(), trainable=["nope"])
    with pytest.raises(UsageError, match=r"frozen 'enc\.\*', 'x' match no floating-point initializer"):
        flopcount.count(llama_like_graph(), frozen=["wq", "enc.*", "x"])
    with pytest.raises(UsageError, match="collection of initializer names"):
        flopcount.count(llama_like_graph(), trainable="wq")
    with pytest.raises(UsageError, match=r"trainable 'axes' matches no floating-point initializer"):
        flopcount.count(llama_like_graph(), trainable=["wq", "axes"])  # an int64 tensor of axes


def test_trainable_and_frozen_take_shell_patterns():
    m = llama_like_graph()
    r = flopcount.count(m, mode="train", trainable=["w?"])  # wq, wk, w1
    assert r.trainable_params == 2 * D * D + D * FF and r.buffers == S * D + D
    r = flopcount.count(m, mode="train", trainable=["w[qk]"])
    assert r.trainable_params == 2 * D * D
    r = flopcount.count(m, mode="train", trainable=["w*"], frozen=["wk"])
    assert r.trainable_params == D * D + D * FF
    r = flopcount.count(m, mode="train", frozen=["w[qk]", "pos"])  # the rule's parameters, less the frozen ones
    assert r.trainable_params == r.params == D + D * FF and r.buffers == 2 * D * D + S * D


TWO_LAYERS = dict(B=4, I=5, H=7, O=3)


def two_layer_graph():
    b, i, h, o = TWO_LAYERS.values()
    return model([N("MatMul", ["x", "w1"], ["a"]), N("Relu", ["a"], ["r"]), N("MatMul", ["r", "w2"], ["y"])],
                 {"x": [b, i]}, ["y"], [arr("w1", (i, h)), arr("w2", (h, o))])


def test_frozen_layers_get_no_weight_gradient_and_stop_the_backward():
    b, i, h, o = TWO_LAYERS.values()
    full = flopcount.count(two_layer_graph(), mode="train", optimizer="sgd")
    mm1, relu, mm2 = full.nodes
    assert mm2.backward.flops == 2 * (2 * b * h * o)  # dW2 and dR
    assert mm1.backward.flops == 2 * b * i * h  # dW1 only: x is data
    assert full.trainable_params == i * h + h * o

    head = flopcount.count(two_layer_graph(), mode="train", optimizer="sgd", frozen=["w1"])  # fine-tune the head
    assert [n.backward.flops for n in head.nodes] == [0, 0, 2 * b * h * o]  # dW2 only: nothing below needs dR
    assert head.trainable_params == h * o and head.params == h * o and head.buffers == i * h
    assert head.optimizer[1].flops < full.optimizer[1].flops

    body = flopcount.count(two_layer_graph(), mode="train", frozen=["w2"])
    assert body.nodes[2].backward.flops == 2 * b * h * o  # dR only, no dW2
    assert body.nodes[0].backward.flops == 2 * b * i * h and body.nodes[1].backward.flops == relu.backward.flops


def test_batch_norm_statistics_are_buffers_not_trained():
    c = 4
    m = model([N("Conv", ["x", "w"], ["c"]), N("BatchNormalization", ["c", "s", "b", "mean", "var"], ["y"])],
              {"x": [2, 3, 5, 5]}, ["y"], [arr("w", (c, 3, 3, 3)), arr("s", (c,)), arr("b", (c,)),
                                           arr("mean", (c,)), arr("var", (c,))])
    r = flopcount.count(m, mode="train")
    assert (r.params, r.buffers, r.trainable_params) == (c * 27 + 2 * c, 2 * c, c * 27 + 2 * c)


# --- the PyTorch frontend maps named_parameters() to the export ------------------------------------


def llama_block():
    import torch
    from torch import nn
    from torch.nn import functional as fn

    class RMSNorm(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def rotate(x):
        a, b = x.chunk(2, -1)
        return torch.cat((-b, a), -1)

    class Block(nn.Module):
        def __init__(self, d=32, heads=4, ff=48, seq=8):
            super().__init__()
            self.heads = heads
            self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
            self.gate, self.up = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
            self.down = nn.Linear(ff, d, bias=False)
            dh = d // heads
            t = torch.outer(torch.arange(seq).float(), 1.0 / 10000 ** (torch.arange(0, dh, 2).float() / dh))
            e = torch.cat((t, t), -1)
            self.register_buffer("cos", e.cos(), persistent=False)
            self.register_buffer("sin", e.sin(), persistent=False)

        def forward(self, x):
            b, s, d = x.shape
            h = self.n1(x)
            q, k, v = (lin(h).view(b, s, self.heads, -1).transpose(1, 2) for lin in (self.q, self.k, self.v))
            cos, sin = self.cos[:s], self.sin[:s]
            q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
            a = fn.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
            x = x + self.o(a)
            h = self.n2(x)
            return x + self.down(fn.silu(self.gate(h)) * self.up(h))

    return Block()


@pytest.mark.slow
def test_llama_block_from_torch_trains_exactly_its_parameters(tmp_path):
    pytest.importorskip("torch")
    block = llama_block()
    batch, seq, d, ff = 2, 8, 32, 48
    r = flopcount.from_torch(block, (batch, seq, d), mode="train", cache_dir=tmp_path)
    expected = 2 * d + 4 * d * d + 3 * d * ff  # two RMSNorm weights, q k v o, gate up down
    assert sum(p.numel() for p in block.parameters()) == expected
    assert r.trainable_params == r.params == expected
    # the two Pow nodes (x², one per RMSNorm): the first reads data (no backward), the second the
    # residual stream (dX only, 3 per element); never an exponent gradient
    pows = [n for n in r.nodes if n.op_type == "Pow"]
    assert len(pows) == 2 and sum(n.backward.flops for n in pows) == 3 * batch * seq * d
    # counted from the exported file alone, the graph's rule finds the same parameters
    from flopcount.frontends.torch import to_onnx

    onnx_model = to_onnx(block, (batch, seq, d), cache_dir=tmp_path)
    assert flopcount.count(onnx_model, mode="train").trainable_params == expected


def test_cli_trainable_and_frozen(tmp_path, capsys):
    from flopcount.cli import main

    b, i, h, o = TWO_LAYERS.values()
    path = tmp_path / "two.onnx"
    onnx.save(two_layer_graph(), path)
    assert main([str(path), "--mode", "train", "--frozen", "w1", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backward"]["flops"] == 2 * b * h * o
    assert out["training"]["trainable_params"] == out["total"]["params"] == h * o
    assert main([str(path), "--mode", "train", "--trainable", "w*", "--frozen", "w2", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["training"]["trainable_params"] == i * h
    assert main([str(path), "--mode", "train", "--frozen", "encoder.*"]) == 2
    err = capsys.readouterr().err
    assert "frozen 'encoder.*' matches no floating-point initializer" in err and "Traceback" not in err


@pytest.mark.parametrize("product", ["MatMul", "Gemm"])
def test_the_one_element_bias_of_a_single_output_head_is_a_parameter(product):
    # a Linear(d, 1) head: y = x·W + b with W [D, 1] and b [1]; epsilons and scales stay constants
    w = numpy_helper.from_array(np.zeros((D, 1), np.float32), "head.weight")
    b = numpy_helper.from_array(np.zeros((1,), np.float32), "head.bias")
    eps = numpy_helper.from_array(np.full((1,), 1e-5, np.float32), "eps")
    x = [B * S, D] if product == "Gemm" else [B, S, D]
    nodes = [helper.make_node("Add", ["x", "eps"], ["xe"]),  # a single value added to data: a constant
             helper.make_node(product, ["xe", "head.weight"], ["p"]),
             helper.make_node("Add", ["p", "head.bias"], ["y"])]
    r = flopcount.count(model(nodes, {"x": x}, ["y"], [w, b, eps]), mode="train")
    assert r.params == r.trainable_params == D + 1  # the weight and its one-element bias, not the epsilon
