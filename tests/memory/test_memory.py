"""The memory ledger (flopcount.memory.ledger) on hand-built graphs: every figure a closed form written here."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import flopcount
from flopcount.errors import UnsupportedOperatorError, UsageError
from flopcount.memory.ledger import MemorySettings, optimizer_bytes
from helpers import const, model, weight

N, D_IN, D_HID, D_OUT = 7, 37, 91, 23
F32 = 4
PARAMS = F32 * (D_IN * D_HID + D_HID + D_HID * D_OUT + D_OUT)  # two Linear layers with biases
X = F32 * N * D_IN
HIDDEN = F32 * N * D_HID


def mlp(loss: bool = True):
    """x → MatMul W1 → Add b1 → Relu → MatMul W2 → Add b2 → ReduceSum (the loss)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["a"], name="add1"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["o"], name="mm2"),
        helper.make_node("Add", ["o", "b2"], ["y"], name="add2"),
    ]
    out = "y"
    if loss:
        nodes.append(helper.make_node("ReduceSum", ["y"], ["loss"], name="loss", keepdims=0))
        out = "loss"
    inits = [weight("w1", (D_IN, D_HID)), weight("b1", (D_HID,)), weight("w2", (D_HID, D_OUT)), weight("b2", (D_OUT,))]
    return model(nodes, {"x": [N, D_IN]}, [out], inits)


def rank(report):
    (r,) = report.memory.ranks
    return r


def test_inference_peak_is_two_hidden_tensors_beside_the_weights():
    r = rank(flopcount.count(mlp(), memory=True))
    assert (r.params_bytes, r.grads_bytes, r.optimizer_bytes, r.activations_bytes) == (PARAMS, 0, 0, 0)
    # at add1: h and a both live, beside the weights and the input
    assert r.peak_bytes == PARAMS + X + 2 * HIDDEN
    assert (r.peak_phase, r.peak_node) == ("forward", "add1")


def test_training_keeps_the_input_and_the_relu_output():
    report = flopcount.count(mlp(), mode="train", memory=True)
    r = rank(report)
    # mm1 keeps x (for dW1); relu keeps r, which mm2 keeps too (for dW2): one storage; Adds and ReduceSum nothing
    assert r.activations_bytes == X + HIDDEN
    assert r.grads_bytes == PARAMS and r.statistics_bytes == 0
    assert not report.memory.lower_bound


LOSS = 4  # the float32 scalar the graph outputs, held to the end of the step
SEED = 4  # the loss's gradient, ones: torch.autograd.backward holds it until the backward returns
#: the backward's peak, at mm1: every parameter gradient made, and dh (its output gradient) still live
BACKWARD_PEAK = PARAMS + X + LOSS + SEED + PARAMS + HIDDEN


@pytest.mark.parametrize("impl, temps", [
    pytest.param("single-tensor", 2 * F32 * D_IN * D_HID, id="single-tensor: sqrt(v) and its quotient, largest W"),
    pytest.param("foreach", PARAMS, id="foreach: sqrt(v) of every parameter"),
    pytest.param("fused", 0, id="fused"),
])
def test_adam_states_counters_and_step_temporaries(impl, temps):
    settings = MemorySettings(implementation=impl)
    r = rank(flopcount.count(mlp(), mode="train", optimizer="adam", memory=settings))
    states = 2 * PARAMS + 4 * 4  # m, v; a float32 step per tensor (4 tensors)
    assert r.optimizer_bytes == states
    assert r.optimizer_temp_bytes == temps
    step = PARAMS + PARAMS + states + temps + X + LOSS
    backward = BACKWARD_PEAK + states
    assert r.peak_bytes == max(step, backward)
    assert r.peak_phase == ("optimizer step" if step > backward else "backward")


@pytest.mark.parametrize("optimizer, states", [("sgd", 0), ("momentum", PARAMS), ("adamw", 2 * PARAMS + 16)])
def test_optimizer_states(optimizer, states):
    r = rank(flopcount.count(mlp(), mode="train", optimizer=optimizer, memory=True))
    assert r.optimizer_bytes == states


def test_auto_implementation_is_what_torch_picks_on_the_device():
    assert MemorySettings(device="cpu").resolved_implementation == "single-tensor"
    assert MemorySettings(device="cuda").resolved_implementation == "foreach"


def test_master_weights_of_16_bit_parameters():
    from flopcount.context import TensorInfo

    w = [TensorInfo("w", TensorProto.FLOAT16, (3, 5)), TensorInfo("b", TensorProto.FLOAT16, (5,))]
    plain, _ = optimizer_bytes("adam", w, MemorySettings(implementation="fused"))
    master, _ = optimizer_bytes("adam", w, MemorySettings(implementation="fused", master_weights=True))
    assert plain == 2 * 2 * 20 + 2 * 4  # fp16 moments, float32 step counters
    assert master == 2 * 4 * 20 + 2 * 4 + 4 * 20  # fp32 moments and counters, and the fp32 copy


def test_backward_peak_when_gradients_outgrow_the_optimizer_step():
    """Without an optimizer, the peak is in the backward."""
    r = rank(flopcount.count(mlp(), mode="train", memory=True))
    # walking back: at mm2 the kept r, do, dr and dW2 (+db2) are live; at relu r, dr, da; at mm1 every parameter
    # gradient (dW1 the largest, made last) and dh: the most
    assert (r.peak_bytes, r.peak_phase, r.peak_node) == (BACKWARD_PEAK, "backward", "mm1")


def test_an_operator_without_a_rule_makes_a_lower_bound_and_strict_refuses(monkeypatch):
    # every operator with a backward has a rule today: Binarizer's is taken away for this test
    import flopcount.memory.counted as counted_module

    real = counted_module.lookup_saved
    monkeypatch.setattr(counted_module, "lookup_saved", lambda d, o: None if o == "Binarizer" else real(d, o))
    nodes = [helper.make_node("Add", ["x", "shift"], ["xt"], name="shift"),
             helper.make_node("Binarizer", ["xt"], ["y"], name="binarize", domain="ai.onnx.ml", threshold=0.5)]
    m = model(nodes, {"x": [2, 3]}, ["y"], [weight("shift", (2, 3))], extra_opsets={"ai.onnx.ml": 3})
    report = flopcount.count(m, mode="train", memory=True)
    assert dict(report.memory.missing) == {"ai.onnx.ml:Binarizer": 1} and report.memory.lower_bound
    with pytest.raises(UnsupportedOperatorError, match="Binarizer"):
        flopcount.count(m, mode="train", memory=True, strict=True)


def test_dropout_keeps_its_mask_as_bools_and_layer_norm_its_row_statistics():
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], name="ln", axis=-1),
        helper.make_node("Dropout", ["n", "ratio", "train"], ["y"], name="drop"),
    ]
    inits = [weight("g", (11,)), weight("b", (11,)), const("ratio", 0.1, np.float32), const("train", True, np.bool_)]
    r = rank(flopcount.count(model(nodes, {"x": [3, 5, 11]}, ["y"], inits, opset=18), mode="train", memory=True))
    rows = 3 * 5
    # x kept by the norm (fp32), mean and rstd per row in float32, the mask one byte per element
    assert r.activations_bytes == F32 * 3 * 5 * 11 + 2 * 4 * rows + 3 * 5 * 11
    assert r.statistics_bytes == 2 * 4 * rows + 3 * 5 * 11


def test_settings_refuse_what_is_not_modelled_with_the_list():
    with pytest.raises(UsageError, match="single-tensor, foreach, fused"):
        MemorySettings(implementation="turbo")
    with pytest.raises(UsageError, match="sgd, momentum, adam, adamw"):
        optimizer_bytes("lion", [], MemorySettings())
    with pytest.raises(UsageError, match="MemorySettings"):
        flopcount.count(mlp(), memory="yes")


def silu_mlp(square: bool = False):
    """x → MatMul W1 → h; SiLU written as Sigmoid and Mul (h·sigmoid(h)) → g → MatMul W2 → ReduceSum.
    ``square``: x·x (a Mul whose backward does not run: x needs no gradient) in x's place."""
    nodes = [
        *([helper.make_node("Mul", ["x", "x"], ["sq"], name="square")] if square else []),
        helper.make_node("MatMul", ["sq" if square else "x", "w1"], ["h"], name="mm1"),
        helper.make_node("Sigmoid", ["h"], ["s"], name="sig"),
        helper.make_node("Mul", ["h", "s"], ["g"], name="mul"),
        helper.make_node("MatMul", ["g", "w2"], ["o"], name="mm2"),
        helper.make_node("ReduceSum", ["o"], ["loss"], name="loss", keepdims=0),
    ]
    return model(nodes, {"x": [N, D_IN]}, ["loss"], [weight("w1", (D_IN, D_HID)), weight("w2", (D_HID, D_OUT))])


def test_operator_list_recompute_spares_what_only_a_chain_of_listed_ops_keeps():
    """Without recompute the ledger keeps x (for mm1), h (Mul's input), s (Sigmoid's output, Mul's input) and g
    (mm2's input).
    Listing Sigmoid and Mul makes them one unit (Mul reads what Sigmoid made): it keeps h, read from outside, and
    makes s again; g stays kept, for mm2, which is not listed. Sigmoid alone keeps s for Mul: nothing spared.
    An ONNX type the graph does not have beside one it has selects nothing more (Sigmoid,Gelu is Sigmoid); a list
    of none of the graph's types, or a name that is no operator type, is exit 2 naming the graph's types."""
    def of(policy):
        return rank(flopcount.count(silu_mlp(), mode="train", optimizer="sgd",
                                    memory=MemorySettings(recompute=policy)))

    none = of("none")
    assert none.activations_bytes == X + 3 * HIDDEN
    both = of("Sigmoid,Mul")
    assert both.activations_bytes == X + 2 * HIDDEN
    assert of("Sigmoid").activations_bytes == X + 3 * HIDDEN
    beside = of("Sigmoid,Gelu")
    assert (beside.activations_bytes, beside.peak_bytes) == (of("Sigmoid").activations_bytes, of("Sigmoid").peak_bytes)
    for policy, what in (("Gelu", "no node of the graph is of that type"), ("sigmoid", "sigmoid is no ONNX operator")):
        with pytest.raises(UsageError, match=f"--recompute {policy}: {what}.*its operator types: MatMul, Mul, "
                                             "ReduceSum, Sigmoid(; or a policy: none, full, non-reentrant, "
                                             "selective)?$"):
            of(policy)
    # x·x alone is a unit whose backward does not run: dropped (nothing of it is kept to make again); mm1 keeps
    # x·x in x's place, and x, which only that Mul reads, is no unit's input kept for the backward
    report = flopcount.count(silu_mlp(square=True), mode="train", optimizer="sgd",
                             memory=MemorySettings(recompute="Sigmoid,Mul"))
    assert "square" not in {n.name for n in report.nodes if n.index in report.memory.graph.units}
    assert rank(report).activations_bytes == X + 2 * HIDDEN
    # both peak at mm1's backward: the weights and their gradients, x, h's gradient, the loss and its seed gradient
    # (float32 scalars; torch.autograd.backward holds the seed until it returns); s, made again at the unit's
    # backward, is freed by then
    weights = F32 * (D_IN * D_HID + D_HID * D_OUT)
    for r in (none, both):
        assert (r.peak_bytes, r.peak_phase, r.peak_node) == (2 * weights + X + HIDDEN + 2 * F32, "backward", "mm1")


def test_operator_list_units_per_layer_joined_through_tensors_and_views():
    """Listed nodes (Sigmoid, Mul) of one numbered layer joined by what one makes and another reads, through a
    view too, form one unit; the same chain crossing into the next layer starts a new unit; outside every layer,
    connectivity alone: two listed nodes that do not touch are two units, a node not listed joins nothing."""
    from flopcount.memory.units import recompute_units
    from flopcount.parallel.plan import parse_recompute

    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s1"], name="s1"),
        helper.make_node("Reshape", ["s1", "shape"], ["v"], name="view"),
        helper.make_node("Mul", ["v", "v"], ["m1"], name="m1"),
        helper.make_node("Sigmoid", ["m1"], ["s2"], name="s2"),
        helper.make_node("Mul", ["s2", "s2"], ["m2"], name="m2"),
        helper.make_node("Tanh", ["m2"], ["t"], name="tanh"),
        helper.make_node("Sigmoid", ["t"], ["s3"], name="s3"),
        helper.make_node("Sigmoid", ["x"], ["s4"], name="s4"),
        helper.make_node("Mul", ["s3", "s4"], ["y"], name="m3"),
        helper.make_node("Sigmoid", ["x"], ["s5"], name="s5"),
        helper.make_node("Add", ["y", "s5"], ["z"], name="add"),
    ]
    report = flopcount.count(model(nodes, {"x": [3, 4]}, ["z"], [const("shape", [3, 4])]), mode="train")
    where = {"s1": ("layers.0",), "view": ("layers.0",), "m1": ("layers.0",), "s2": ("layers.1",),
             "m2": ("layers.1",)}
    scopes = [where.get(n.name, ()) for n in report.nodes]
    units = recompute_units(parse_recompute("Sigmoid,Mul"), report.nodes, scopes, lambda: [])
    by_name = {n.name: units.get(n.index) for n in report.nodes}
    assert by_name == {"s1": 0, "view": None, "m1": 0, "s2": 1, "m2": 1, "tanh": None, "s3": 2, "s4": 2, "m3": 2,
                       "s5": 3, "add": None}
    assert recompute_units(parse_recompute("Sigmoid,Mul,Gelu"), report.nodes, scopes, lambda: []) == units


def test_memory_key_only_when_asked():
    from flopcount.output.render import to_dict

    assert "memory" not in to_dict(flopcount.count(mlp()))
    doc = to_dict(flopcount.count(mlp(), memory=True))
    assert doc["memory"]["ranks"][0]["params_bytes"] == PARAMS


E, PAIRS, OUT_F, IN_F = 3, 64, 29, 31  # experts, (token, expert) pairs, an expert's output and input features


def experts_gathered(op: str):
    """Stacked expert weights [E, O, I] gathered per (token, expert) pair along axis 0 (transformers' batched_mm
    experts as exported), multiplied by each pair's input: x → MatMul w0 → Relu → Unsqueeze → MatMul(gathered, ·) →
    ReduceSum (w0 trained, so the experts' product needs its input's gradient and keeps the gathered slices)."""
    idx = const("idx", [[p % E] for p in range(PAIRS)]) if op == "GatherND" else const("idx", [p % E for p in range(PAIRS)])
    gather = helper.make_node(op, ["w", "idx"], ["wg"], name="gather", **({} if op == "GatherND" else {"axis": 0}))
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["a"], name="mm0"),
             helper.make_node("Relu", ["a"], ["h"], name="relu"),
             helper.make_node("Unsqueeze", ["h", "axes"], ["hu"], name="unsqueeze"),
             gather,
             helper.make_node("MatMul", ["wg", "hu"], ["y"], name="mm"),
             helper.make_node("ReduceSum", ["y"], ["loss"], name="loss", keepdims=0)]
    return model(nodes, {"x": [PAIRS, IN_F]}, ["loss"],
                 [weight("w0", (IN_F, IN_F)), weight("w", (E, OUT_F, IN_F)), idx, const("axes", [2])])


@pytest.mark.parametrize("op", ["GatherND", "Gather"])
def test_experts_gathered_per_token_are_the_resident_weights(op):
    """What trains is a grouped product over the resident experts: the PAIRS weight slices are neither allocated,
    kept for the backward, nor given a gradient of their own (they were 4·PAIRS·O·I bytes of each)."""
    report = flopcount.count(experts_gathered(op), mode="train", memory=True)
    r = rank(report)
    weights = F32 * (IN_F * IN_F + E * OUT_F * IN_F)
    hidden, slices = F32 * PAIRS * IN_F, F32 * PAIRS * OUT_F * IN_F
    assert r.params_bytes == r.grads_bytes == weights
    # mm0 keeps x; Relu keeps h, which the experts' product keeps too (viewed); its gathered slices are the weight
    assert r.activations_bytes == 2 * hidden
    # at most: weights and their gradients, x, h, a and the gradients of h, a (each PAIRS·I) and of the product's
    # output [PAIRS, O, 1]: nothing the size of the slices
    assert r.peak_bytes <= 2 * weights + 5 * hidden + F32 * PAIRS * OUT_F < slices


def test_experts_stacked_then_gathered_are_the_resident_weights():
    """Experts kept as one 2-D weight each, stacked (``torch.stack``: each unsqueezed on a new axis 0, concatenated
    there) and gathered per pair, as the batched product of per-expert modules exports: neither the stack nor the
    PAIRS slices are allocated, kept or given a gradient; each expert's gradient is its own weight's."""
    idx = const("idx", [[p % E] for p in range(PAIRS)])
    experts = [weight(f"e{e}", (OUT_F, IN_F)) for e in range(E)]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["a"], name="mm0"),
             helper.make_node("Relu", ["a"], ["h"], name="relu"),
             helper.make_node("Unsqueeze", ["h", "axes"], ["hu"], name="unsqueeze"),
             *[helper.make_node("Unsqueeze", [f"e{e}", "first"], [f"u{e}"], name=f"u{e}") for e in range(E)],
             helper.make_node("Concat", [f"u{e}" for e in range(E)], ["stack"], name="stack", axis=0),
             helper.make_node("GatherND", ["stack", "idx"], ["wg"], name="gather"),
             helper.make_node("MatMul", ["wg", "hu"], ["y"], name="mm"),
             helper.make_node("ReduceSum", ["y"], ["loss"], name="loss", keepdims=0)]
    m = model(nodes, {"x": [PAIRS, IN_F]}, ["loss"],
              [weight("w0", (IN_F, IN_F)), *experts, idx, const("axes", [2]), const("first", [0])])
    r = rank(flopcount.count(m, mode="train", memory=True))
    hidden, slices = F32 * PAIRS * IN_F, F32 * PAIRS * OUT_F * IN_F
    weights = F32 * (IN_F * IN_F + E * OUT_F * IN_F)
    assert r.params_bytes == r.grads_bytes == weights
    assert r.activations_bytes == 2 * hidden  # x (mm0) and h (Relu, and the experts' product, viewed)
    # at most: weights and their gradients, x, h, a, the gradients of h and a, and of the product's output
    assert r.peak_bytes <= 2 * weights + 5 * hidden + F32 * PAIRS * OUT_F < slices


def test_a_stack_no_experts_are_gathered_from_is_a_copy():
    """``torch.stack`` of parameters that a product keeps whole (no slices gathered per token) is the copy torch
    makes: E·O·I floats of activations beside x and h."""
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["a"], name="mm0"),
             helper.make_node("Relu", ["a"], ["h"], name="relu"),
             helper.make_node("Unsqueeze", ["h", "axes"], ["hu"], name="unsqueeze"),
             *[helper.make_node("Unsqueeze", [f"e{e}", "first"], [f"u{e}"], name=f"u{e}") for e in range(E)],
             helper.make_node("Concat", [f"u{e}" for e in range(E)], ["stack"], name="stack", axis=0),
             helper.make_node("MatMul", ["stack", "hu"], ["y"], name="mm"),
             helper.make_node("ReduceSum", ["y"], ["loss"], name="loss", keepdims=0)]
    m = model(nodes, {"x": [E, IN_F]}, ["loss"], [weight("w0", (IN_F, IN_F)),
              *[weight(f"e{e}", (OUT_F, IN_F)) for e in range(E)], const("axes", [2]), const("first", [0])])
    r = rank(flopcount.count(m, mode="train", memory=True))
    assert r.activations_bytes == 2 * F32 * E * IN_F + F32 * E * OUT_F * IN_F


def test_an_embedding_lookup_is_still_a_new_tensor():
    """A rank-2 table gathered per token is the lookup's output, allocated as it is in the frameworks."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=0),
             helper.make_node("Relu", ["e"], ["h"], name="relu"),
             helper.make_node("ReduceSum", ["h"], ["loss"], name="loss", keepdims=0)]
    m = model(nodes, {}, ["loss"], [weight("table", (E, IN_F)), const("ids", [p % E for p in range(PAIRS)])])
    r = rank(flopcount.count(m, mode="train", memory=True))
    assert r.activations_bytes == F32 * PAIRS * IN_F  # Relu's output; the lookup's output e is not kept
    assert r.peak_bytes >= F32 * PAIRS * IN_F * 2  # e and h alive together at the Relu
