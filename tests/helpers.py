"""Builders for small ONNX models, imported by tests as ``from helpers import model, weight, ...``. Weights are
external-data references to a file that does not exist, so every test also checks that counting never reads
weights."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from math import prod
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

__all__ = ["RESNET50_ONNX", "RESNET50_STAGES", "browser", "chromium", "console_errors", "const", "direct_backward",
           "gloo_ranks", "hidden_state_loss", "model", "needs_chromium", "node_backward", "one_node", "op_backward",
           "resnet50_architecture", "saved_storages", "saving", "shifted_op_model", "single", "tiny_llama",
           "tracked_step", "typed_model", "weight"]


def weight(name: str, dims: Sequence[int], dtype: int = TensorProto.FLOAT) -> TensorProto:
    """An initializer with dims and type whose data lives in a missing external file."""
    t = TensorProto(name=name, dims=list(dims), data_type=dtype)
    t.data_location = TensorProto.EXTERNAL
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).itemsize
    for k, v in (("location", "absent.weights"), ("offset", "0"), ("length", str(prod(dims) * itemsize))):
        t.external_data.add(key=k, value=v)
    return t


def const(name: str, values, dtype=np.int64) -> TensorProto:
    """A small inline initializer (shape vectors, axes)."""
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, Sequence | None],
    outputs: Sequence[str],
    initializers: Sequence[TensorProto] = (),
    opset: int = 18,
    dtype: int = TensorProto.FLOAT,
    extra_opsets: Mapping[str, int] | None = None,
    **kw,
) -> onnx.ModelProto:
    g = helper.make_graph(
        list(nodes),
        "test",
        [helper.make_tensor_value_info(n, dtype, s) for n, s in inputs.items()],
        [helper.make_empty_tensor_value_info(n) for n in outputs],
        list(initializers),
    )
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    return helper.make_model(g, opset_imports=imports, **kw)


def single(op_type: str, inputs: Mapping[str, Sequence], initializers: Sequence[TensorProto] = (),
           n_outputs: int = 1, opset: int = 18, dtype: int = TensorProto.FLOAT, **attrs) -> onnx.ModelProto:
    """A model of one node; ``inputs`` lists graph inputs, ``initializers`` follow them as node inputs.

    Use "" in ``inputs`` for an omitted optional input.
    """
    names = list(inputs) + [t.name for t in initializers]
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph_inputs = {n: s for n, s in inputs.items() if n}
    return model([node], graph_inputs, outs, initializers, opset=opset, dtype=dtype)


def direct_backward(op_type: str, inputs, outputs, grads, opset: int, values=None, **attrs):
    """Call the registered backward formula of ``op_type`` on a hand-built context, for gradients a
    count never asks for (inputs the schema marks non-differentiable). ``inputs``: (name, shape) or
    (name, shape, elem_type) per input, "" for an omitted one; ``outputs``: shapes; ``grads``: which
    inputs need a gradient."""
    from flopcount.context import NodeContext, TensorInfo
    from flopcount.conventions import CONVENTIONS
    from flopcount.registry import lookup_backward

    values = values or {}
    ins = tuple(
        TensorInfo(spec[0], spec[2] if len(spec) > 2 else TensorProto.FLOAT, spec[1]) if spec[0] else None
        for spec in inputs
    )
    outs = tuple(TensorInfo(f"y{i}", TensorProto.FLOAT, shape) for i, shape in enumerate(outputs))
    ctx = NodeContext("op", op_type, "", opset, ins, outs, CONVENTIONS["default"], values.get, grads=tuple(grads))
    return lookup_backward("", op_type)(ctx, **attrs)


#: The bundled weightless ResNet-50 v1.5 graph and its stages.
RESNET50_ONNX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "resnet50-v1.5.onnx")
RESNET50_STAGES = [(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)]  # blocks, width, stride of first block


def resnet50_architecture(hw=224):
    """ResNet-50 v1.5's per-layer closed forms: conv MACs, BN / ReLU / Add elements, and the pool windows."""
    conv_macs, bn, relu, add = [], 0, 0, 0
    h = hw // 2  # stem 7x7/2
    conv_macs.append(h * h * 64 * 3 * 7 * 7)
    bn += 64 * h * h
    relu += 64 * h * h
    stem_out = 64 * h * h
    h //= 2  # max pool 3x3/2, pad 1
    maxpool_out = 64 * h * h
    c_in = 64
    for blocks, w, stride in RESNET50_STAGES:
        for b in range(blocks):
            s = stride if b == 0 else 1
            ho = h // s
            conv_macs += [h * h * w * c_in, ho * ho * w * w * 9, ho * ho * 4 * w * w]
            bn += w * h * h + w * ho * ho + 4 * w * ho * ho
            relu += w * h * h + w * ho * ho + 4 * w * ho * ho
            add += 4 * w * ho * ho
            if b == 0:
                conv_macs.append(ho * ho * 4 * w * c_in)  # projection shortcut, 1x1 stride s
                bn += 4 * w * ho * ho
            c_in, h = 4 * w, ho
    return dict(conv_macs=conv_macs, bn=bn, relu=relu, add=add, stem_out=stem_out,
                maxpool_out=maxpool_out, gap_in=2048 * h * h, fc_macs=2048 * 1000)


# Backward cases (mode="train") of one node. A tensor needs a gradient when it is a trainable float initializer
# (``weight``) fed to a differentiable input, or computed from one; graph inputs are data and need none.


def typed_model(nodes, inputs, outputs, inits=(), opset=18) -> onnx.ModelProto:
    """A model whose graph inputs are ``{name: (elem_type, shape)}``."""
    g = helper.make_graph(
        list(nodes), "test",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_empty_tensor_value_info(n) for n in outputs], list(inits),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def node_backward(m: onnx.ModelProto, op_type: str):
    """The (only) ``op_type`` node's backward cost; also checks the op is never reported as lacking one."""
    import flopcount

    r = flopcount.count(m, mode="train")
    assert op_type not in r.backward_unsupported
    (n,) = [n for n in r.nodes if n.op_type == op_type]
    return n.backward


def one_node(op_type, x_shape, *, trainable=True, extra_inits=(), opset=18, n_outputs=1, **attrs) -> onnx.ModelProto:
    """One node on input ``x`` (a trainable weight, or a data input when not ``trainable``)."""
    names = ["x"] + [t.name for t in extra_inits]
    outs = [f"y{i}" for i in range(n_outputs)]
    nodes = [helper.make_node(op_type, names, outs, **attrs)]
    if trainable:
        return typed_model(nodes, {}, outs, [weight("x", x_shape), *extra_inits], opset)
    return typed_model(nodes, {"x": (TensorProto.FLOAT, x_shape)}, outs, list(extra_inits), opset)


def shifted_op_model(op_type, node_inputs, data, params=(), consts=(), learned=(), opset=18, n_outputs=1,
                     **attrs) -> onnx.ModelProto:
    """One node "op" reading ``node_inputs``; ``data`` are graph inputs (name → shape); ``params`` trainable
    initializers; ``learned`` names of data inputs routed through Add(x, shift) so that they need a
    gradient (the node then reads "<name>_t"); the shift has x's shape, as a learned table has (a
    one-element shift would be a folded constant, not trained)."""
    nodes = [helper.make_node("Add", [x, f"{x}_shift"], [f"{x}_t"], name=f"shift_{x}") for x in learned]
    names = [f"{x}_t" if x in learned else x for x in node_inputs]
    outs = [f"y{i}" for i in range(n_outputs)]
    nodes.append(helper.make_node(op_type, names, outs, name="op", **attrs))
    inits = list(params) + list(consts) + [weight(f"{x}_shift", data[x]) for x in learned]
    return model(nodes, data, outs, inits, opset=opset)


def op_backward(m: onnx.ModelProto, **kw):
    """The backward cost of the node named "op" in a training count of ``m``."""
    import flopcount

    r = flopcount.count(m, mode="train", **kw)
    assert not r.backward_unsupported
    return next(n for n in r.nodes if n.name == "op").backward


def make_folder(root, classes=("cat", "dog", "fox"), per_class=6, size=(20, 24)):
    """An ImageFolder of noise images (half JPEG, half PNG): nothing to learn, so accuracy stays near chance."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    for c in classes:
        os.makedirs(root / c)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


def fresh_nodes(nodes):
    """A new node list of ``nodes`` (nothing memoized for the old one is read): a repeated stack's kept a Tiled, as
    its copies' tensors carry their original's names."""
    from flopcount.reporting.tiled import Tiled

    return nodes.listed("plan") if isinstance(nodes, Tiled) else tuple(list(nodes))


def llama_config(folder, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> str:
    """A folder holding the ``config.json`` of a Hugging Face Llama of these sizes (for ``--hf FOLDER``), its path."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab)
    (folder / "config.json").write_text(config.to_json_string())
    return str(folder)


def tiny_llama(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int, shape: tuple[int, int],
               mode: str = "train", optimizer: str | None = None):
    """The counted report of a Hugging Face Llama of these sizes (no weights), one microbatch of ``shape``: the
    model the parallel tests divide over ranks (with ``optimizer``, its update step too)."""
    import transformers

    import flopcount

    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab)
    return flopcount.from_hf(config, shape, cache_dir=False, mode=mode, optimizer=optimizer)


def mixtral_config(hidden: int, ffn: int, layers: int, heads: int, kv_heads: int, vocab: int, experts: int,
                   top_k: int, **extra):
    """A Hugging Face Mixtral configuration of these sizes (no weights): the MoE the parallel and predictor tests
    divide over ranks (``extra``: any other field of the configuration)."""
    import transformers

    return transformers.MixtralConfig(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                                      num_local_experts=experts, num_experts_per_tok=top_k, **extra)


def gloo_ranks(worker, tmp_path, *args, world: int = 2) -> list:
    """Run ``worker(rank, world, init, out, *args)`` on ``world`` forked processes (a gloo group joins through a
    file under ``tmp_path``); each writes its JSON to ``f"{out}.{rank}"``; their results in rank order. Fork, not
    spawn: the children need not import torch again (a CPU-only run, no CUDA state to inherit); each worker must
    call torch.set_num_threads(1) before any op, so as not to enter the intra-op pool the parent may have
    started (the fork does not copy its threads)."""
    import json

    import torch.multiprocessing as mp

    out = str(tmp_path / "rank")
    mp.start_processes(worker, args=(world, f"file://{tmp_path / 'init'}", out, *args), nprocs=world, join=True,
                       start_method="fork")
    return [json.loads(open(f"{out}.{i}").read()) for i in range(world)]


def refusal_lines(err: str) -> list[str]:
    """The lines of a command's stderr other than its progress: each step that took two seconds or more says so
    (``flopcount: exporting X with torch: 12.4 s``) even on a pipe (:mod:`flopcount.pipeline.progress`), before a
    refusal that comes after it."""
    import re

    progress = re.compile(r"flopcount: (?!error: ).+: \d+\.\d s")
    return [line for line in err.strip().splitlines() if not progress.fullmatch(line)]


def hidden_state_loss(model):
    """A transformers ``model`` (its ``.model``) as a module of one input, the token ids, whose output is the model's
    last hidden state summed: the loss whose backward needs nothing kept."""
    import torch

    class Loss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model = inner

        def forward(self, ids):
            return self.model(input_ids=ids).last_hidden_state.sum()

    return Loss(model)


def saved_storages(module, inputs: Sequence) -> int:
    """Bytes of the unique storages torch's autograd keeps for the backward during ``module(*inputs)``, the
    module's parameters and buffers left out: each saved tensor's whole storage (a view keeps its base), counted
    once however many nodes save it (``torch.autograd.graph.saved_tensors_hooks``)."""
    return sum(saved_storage_bytes(module, inputs).values())


def saved_storage_bytes(module, inputs: Sequence) -> dict[int, int]:
    """The storages of :func:`saved_storages`, each storage's address and its bytes."""
    with saving(module) as seen:
        out = module(*inputs)  # held: the graph, and what it keeps, lives to the block's end
    del out
    return seen


@contextlib.contextmanager
def saving(module) -> Iterator[dict[int, int]]:
    """The storages torch's autograd keeps for the backward while the block runs (``module``'s parameters and
    buffers left out), each storage's address and its bytes, filled when the block ends: :func:`saved_storage_bytes`
    for a call of one's own (keyword inputs, a loss made of the outputs). A storage counts where a tensor saved in
    it is still kept when the block ends: one saved by a node torch has freed by then (a branch whose outputs reach
    no loss, as a router's top-k of which only the indices are read on) is not kept, and its address may be taken
    again by another storage. What is packed is the tensor detached (the same storage): a node that saves its own
    output would otherwise hold the output's Python tensor, which holds the node (a reference cycle that keeps a
    dead branch's exp alive past the forward, where torch alone frees it)."""
    import weakref

    import torch

    stored = {t.untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers())}
    seen: dict[int, int] = {}
    packed: list = []

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in stored:
            t = t.detach()
            packed.append((s.data_ptr(), s.nbytes(), weakref.ref(t)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen
    seen.update((ptr, nbytes) for ptr, nbytes, ref in packed if ref() is not None)



@dataclasses.dataclass(frozen=True)
class Tracked:
    """MemTracker's figures of one training step on the CPU, each a category's bytes by its name ("Parameter",
    "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Other" and "Total"): at the step's peak, when the step
    ends (the optimizer alive: its states counted) and when the tracked module's forward first returns (None where
    the step never called the module itself)."""

    at_peak: Mapping[str, int]
    after: Mapping[str, int]
    after_forward: Mapping[str, int] | None

    @property
    def peak(self) -> int:
        """The peak's total bytes."""
        return self.at_peak["Total"]


def tracked_step(module, loss: Callable, optimizer: Callable) -> Tracked:
    """torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``) on one training step of ``module`` on the
    CPU: the gradients set to None, ``loss()`` (the forward, its scalar loss returned) and its backward, then the
    step of ``optimizer(module.parameters())`` (``torch.optim.Adam``, or a ``functools.partial`` of one). A first
    step, untracked, makes the optimizer's states: the tracked second step is the steady state. MemTracker sees
    what is allocated while it tracks: what was made before (the input batch) is in none of its figures.

    MemTracker registers a gradient hook on every parameter a module's forward meets, which torch refuses on a
    parameter without ``requires_grad`` (Whisper's sinusoidal position embedding): for those only, while the step
    is tracked, a hook that is never called (no gradient ever reaches them) is registered as a handle that holds
    nothing."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState

    opt = optimizer(module.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()

    step()
    tracker = MemTracker()
    tracker.track_external(module, opt)
    with tracker, _frozen_hooks(module):
        step()
    cpu = torch.device("cpu")

    def named(snapshot) -> dict[str, int]:
        return {getattr(k, "value", k): v for k, v in snapshot[cpu].items()}

    stats = tracker.memory_tracking.get(module)
    forwards = stats.snapshots.get(_ModState.POST_FW) if stats is not None else None
    return Tracked(named(tracker.get_tracker_snapshot("peak")), named(tracker.get_tracker_snapshot("current")),
                   named(forwards[0]) if forwards else None)


@contextlib.contextmanager
def _frozen_hooks(module):
    """:func:`tracked_step`'s gradient hooks on ``module``'s parameters without ``requires_grad``: handles that
    hold nothing, while the block runs."""
    from collections import OrderedDict

    from torch.utils.hooks import RemovableHandle

    frozen = [p for p in module.parameters() if not p.requires_grad]
    for p in frozen:
        p.register_hook = p.register_post_accumulate_grad_hook = lambda hook: RemovableHandle(OrderedDict())
    try:
        yield
    finally:
        for p in frozen:
            del p.register_hook, p.register_post_accumulate_grad_hook


# --- a real browser (headless Chromium), for the HTML pages' tests -------------------------------------------------

def chromium() -> str | None:
    """The headless browser's executable here, or None (Debian: apt-get install -y chromium)."""
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


#: The skip mark of a test that needs the browser.
needs_chromium = pytest.mark.skipif(chromium() is None,
                                    reason="no headless Chromium here (Debian: apt-get install -y chromium)")


def browser(profile, *args: str):
    """Headless Chromium run with a fresh profile folder and ``args``; its completed process (DOM on stdout, the
    page's console on stderr)."""
    import subprocess

    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--enable-logging=stderr",
           "--v=0", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def console_errors(stderr: str) -> list[str]:
    """The page's console messages at error level, as the browser logs them on stderr."""
    return [line for line in stderr.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "ERROR" in line)]


def collectives_profile(kinds: Sequence[str], latency: float, bandwidth: float):
    """A calibrated 2-rank CPU profile whose compute takes no time (GEMM and elementwise at 10^30 per second, no
    framework overhead) and whose collectives ``kinds`` each cost ``latency`` plus their bytes over ``bandwidth`` at
    every size: a step's seconds are then its collectives' alone, in closed form."""
    import math

    from flopcount.measure.machine.calibration import Collective, MachineProfile, Point, Segment

    seg = Segment(0, math.inf, {"median": latency, "best": latency}, {"median": bandwidth, "best": bandwidth})
    fast = (Point(1, 1e30, 1e30, 1e30),)
    zero = Point(1, 0.0, 0.0, 0.0)
    return MachineProfile(True, "cpu", 2, {"gemm": fast, "elementwise": fast}, {"forward": zero, "backward": zero},
                          {k: Collective(0, (), (seg,)) for k in kinds}, peak_flops_per_s=1e30)


def products_only(report):
    """``report`` with every node but the products (MatMul, Gemm: what FlopCounterMode counts) made free."""
    def free(n):
        return n._replace(cost=n.cost._replace(flops=0), backward=n.backward._replace(flops=0))

    return dataclasses.replace(report, nodes=tuple(n if n.family in ("matmul", "gemm") else free(n)
                                                   for n in report.nodes))


def sdpa_attend(kv: int, p: float, hidden: int):
    """A module: x (``hidden`` wide) → Q (4 heads of 2) and K, V (``kv`` heads) → sdpa (``dropout_p`` p) → sum. K
    and V of fewer heads are handed to sdpa as they are (multi-query, no ``enable_gqa``)."""
    import torch

    class Attend(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.kv, self.p = kv, p
            self.q, self.k, self.v = (torch.nn.Linear(hidden, n * 2, bias=False) for n in (4, kv, kv))

        def forward(self, x):
            def heads(t, n):
                return t.unflatten(-1, (n, 2)).transpose(1, 2)

            q, k, v = heads(self.q(x), 4), heads(self.k(x), self.kv), heads(self.v(x), self.kv)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.p).sum()

    return Attend()
