"""A count of L layers from the counts of 1 and 2 (:func:`flopcount.derived.extension.extend`), on graphs built here: equal to
the count of the L-layer graph in every figure, and refused when the second layer's nodes are not what it adds."""

from __future__ import annotations

import dataclasses

import onnx
import pytest
from onnx import TensorProto, helper

import flopcount
from flopcount.derived.extension import NotExtendable, extend

B, D, C = 3, 8, 5


def stack(layers: int, *, first_extra: bool = False, unscoped: bool = False, kinds: str = "") -> onnx.ModelProto:
    """x → L × (MatMul by layers.k.fc.weight, Relu) → head; node names carry the module paths. ``first_extra``:
    layer 0 scales its output when more layers follow; ``unscoped``: each layer adds a node outside any module;
    ``kinds``: layer k's activation is Relu, or Sigmoid where ``kinds[k]`` is "s" (a layer of another kind)."""
    nodes, inits, h = [], [], "x"
    for k in range(layers):
        w = f"layers.{k}.fc.weight"
        inits.append(helper.make_tensor(w, TensorProto.FLOAT, [D, D], [0.0] * D * D))
        act = "Sigmoid" if kinds[k:k + 1] == "s" else "Relu"
        nodes += [helper.make_node("MatMul", [h, w], [f"m{k}"], name=f"/layers.{k}/fc/MatMul"),
                  helper.make_node(act, [f"m{k}"], [f"r{k}"], name=f"/layers.{k}/act/{act}")]
        h = f"r{k}"
        if unscoped:
            nodes.append(helper.make_node("Neg", [h], [f"n{k}"], name=f"Neg_{k}"))
            h = f"n{k}"
    if first_extra and layers > 1:
        nodes.insert(2, helper.make_node("Mul", ["r0", "r0"], ["sq"], name="/layers.0/Mul"))
        nodes[3].input[0] = "sq"
    inits.append(helper.make_tensor("head.weight", TensorProto.FLOAT, [D, C], [0.0] * D * C))
    nodes.append(helper.make_node("MatMul", [h, "head.weight"], ["y"], name="/head/MatMul"))
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, C])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def figures(r) -> dict:
    return {
        "forward": r.forward, "backward": r.backward, "params": r.params, "trainable": r.trainable_params,
        "ops": {k: (s.nodes, s.cost, s.backward) for k, s in r.by_op_type.items()}, "optimizer": r.optimizer,
        "modules": [(m.module, m.forward, m.backward, m.params) for m in r.by_module(2)], "nodes": len(r.nodes),
    }


@pytest.mark.parametrize("unscoped", [False, True])
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_extension_equals_the_full_count(mode, unscoped):
    kwargs = dict(mode=mode, optimizer="sgd" if mode == "train" else None)
    one, two, seven = (flopcount.count(stack(n, unscoped=unscoped), **kwargs) for n in (1, 2, 7))
    extended = extend(one, two, 7, "layers")
    assert figures(extended) == figures(seven)
    # 7 layers of B×D×D products and a B×D×C head, 2 FLOPs a MAC; a Relu (and Neg) per element
    assert extended.forward.macs == 7 * B * D * D + B * D * C
    assert extended.forward.flops == 2 * extended.forward.macs + 7 * B * D * (2 if unscoped else 1)
    names = [n.name for n in extended.nodes]
    assert "/layers.1/fc/MatMul@layers.6" in names and len(set(names)) == len(names)


def test_a_first_layer_that_changes_is_not_extended():
    one, two = flopcount.count(stack(1)), flopcount.count(stack(2, first_extra=True))
    with pytest.raises(NotExtendable, match="layers.1 are not what that block adds"):
        extend(one, two, 4, "layers")


def test_a_graph_without_scopes_is_not_extended():
    def plain(layers):
        m = stack(layers)
        for n in m.graph.node:
            n.name = ""
        return m

    with pytest.raises(NotExtendable, match="no module scopes"):
        extend(flopcount.count(plain(1)), flopcount.count(plain(2)), 3, "layers")


@pytest.mark.parametrize("kinds, first, period", [
    pytest.param("srsrsrsr", 0, 2, id="a-block-of-2"),
    pytest.param("ssrrrrr", 2, 1, id="2-first-then-identical"),
    pytest.param("srrsrrsrr", 0, 3, id="a-block-of-3"),
])
def test_a_repeated_block_after_the_first_layers(kinds, first, period):
    from flopcount.memory.ledger import MemorySettings, module_activations

    layers = len(kinds)
    kwargs = dict(mode="train", optimizer="sgd", memory=MemorySettings(recompute="full", device="cpu"))
    small, large = (flopcount.count(stack(n, kinds=kinds[:n]), **kwargs) for n in (first + period, first + 2 * period))
    extended = extend(small, large, layers, "layers", first=first, period=period)
    whole = flopcount.count(stack(layers, kinds=kinds), **kwargs)
    assert figures(extended) == figures(whole)
    (a,), (b,) = extended.memory.ranks, whole.memory.ranks
    assert dataclasses.replace(a, peak_node="") == dataclasses.replace(b, peak_node="")
    assert module_activations(extended.memory, extended.nodes, extended.modules.nodes, 2) == \
           module_activations(whole.memory, whole.nodes, whole.modules.nodes, 2)
    sigmoids = kinds.count("s")
    assert extended.by_op_type["Sigmoid"].nodes == sigmoids and extended.by_op_type["Relu"].nodes == layers - sigmoids
    assert [m.module for m in extended.by_module(1) if m.module.startswith("layers.")] == [
        f"layers.{k}" for k in range(layers)]


@pytest.mark.parametrize("unscoped", [False, True])
@pytest.mark.parametrize("mode,recompute", [("inference", "none"), ("train", "none"), ("train", "full"),
                                            ("train", "Relu,Neg")])
def test_memory_ledger_is_walked_on_the_extended_graph(mode, recompute, unscoped):
    """The ledger of 7 layers from the 1- and 2-layer counts equals the 7-layer count's, field by field."""
    from flopcount.memory.ledger import MemorySettings, module_activations

    kwargs = dict(mode=mode, optimizer="sgd" if mode == "train" else None,
                  memory=MemorySettings(recompute=recompute, device="cpu"))
    one, two, seven = (flopcount.count(stack(n, unscoped=unscoped), **kwargs) for n in (1, 2, 7))
    extended = extend(one, two, 7, "layers")
    (a,), (b,) = extended.memory.ranks, seven.memory.ranks
    base, _, where = a.peak_node.partition("@")  # a copy of layer 1's node in layer k: its name there
    k = where.rpartition(".")[2]
    assert (a.peak_phase, base.replace("layers.1", where).replace("_1", f"_{k}") if where else base) == \
           (b.peak_phase, b.peak_node)
    assert dataclasses.replace(a, peak_node="") == dataclasses.replace(b, peak_node="")
    assert module_activations(extended.memory, extended.nodes, extended.modules.nodes, 2) == \
           module_activations(seven.memory, seven.nodes, seven.modules.nodes, 2)
    # float32 weights: 7 layers of D×D and the D×C head
    assert a.params_bytes == 4 * (7 * D * D + D * C)
    if mode == "train" and recompute == "none" and not unscoped:  # each MatMul keeps its input (x, r0 … r5), the head r6
        assert a.activations_bytes == 4 * 8 * B * D


def test_memory_without_its_graph_is_not_extended():
    kwargs = dict(mode="train", optimizer="sgd", memory=True)
    one, two = (flopcount.count(stack(n), **kwargs) for n in (1, 2))
    two = dataclasses.replace(two, memory=dataclasses.replace(two.memory, graph=None))
    with pytest.raises(NotExtendable, match="--memory: the smaller counts keep no graph"):
        extend(one, two, 7, "layers")
