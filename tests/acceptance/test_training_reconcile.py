"""Training products (mode="train", convention "dense") against torch.utils.flop_counter over a real
forward and backward pass, for the reference models (reduced depth where CI time needs it: every
layer has the same cost, see tests/acceptance/test_reconcile_torch.py).

FlopCounterMode runs on the meta device (nothing computed) with a loss that sums every output, as
the static graph assumes every output reaches the loss. The inputs (images, token ids, features)
need no gradient, so neither side computes the first layer's input gradient.

Known FlopCounterMode error, corrected here rather than copied: for a grouped or depth-wise
convolution it counts the weight gradient G times (it transposes the shapes as if the convolution
were ungrouped). The correction is derived per module below: that module's dW is its forward
FLOPs, so FlopCounterMode's convolution_backward there is dX + G·forward instead of dX + forward.
"""

import pytest

torch = pytest.importorskip("torch")

import flopcount  # noqa: E402
from flopcount.frontends import export  # noqa: E402
from flopcount.models import zoo  # noqa: E402


def torch_training_flops(module, inputs) -> int:
    """FlopCounterMode's forward + backward FLOPs, corrected for its grouped-conv weight-gradient error."""
    from torch.utils.flop_counter import FlopCounterMode

    module = module.to("meta").train()
    inputs = tuple(x.to("meta") for x in inputs)
    with FlopCounterMode(display=False) as counter:
        out = module(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        sum(o.sum() for o in outs).backward()
    counts = counter.get_flop_counts()  # keyed "ClassName.path.to.module"
    root = type(module).__name__
    total = counter.get_total_flops()
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.Conv2d) and sub.groups > 1 and sub.weight.requires_grad:
            forward = counts[f"{root}.{name}"][torch.ops.aten.convolution]
            total -= (sub.groups - 1) * forward
    return total


CASES = [
    pytest.param("bert-base", {"layers": 1}, None, id="bert-1-layer"),
    pytest.param("gpt2-small", {"layers": 1, "seq_len": 128}, None, id="gpt2-1-layer"),
    pytest.param("vit-b16", {"layers": 1}, None, id="vit-1-layer"),
    pytest.param("lstm", {}, None, id="lstm"),
    pytest.param("mobilenet-v2", {}, "torchscript", id="mobilenet-v2"),
]


@pytest.mark.parametrize("name, options, exporter", CASES)
def test_training_products_equal_flop_counter(tmp_path, name, options, exporter):
    torch.manual_seed(0)
    built = zoo.build(name, **options)
    path = tmp_path / f"{name}.onnx"
    export.export_weightless(built.module, built.inputs, path, input_names=built.input_names,
                             output_names=built.output_names, **({"exporter": exporter} if exporter else {}))
    report = flopcount.count(path, mode="train", convention="dense")
    assert not report.backward_unsupported
    assert report.total.flops == torch_training_flops(built.module, built.inputs)


def test_transformer_training_is_three_times_forward(tmp_path):
    # Embeddings are trained, so every projection computes dX and dW (2x its forward products) and
    # attention's backward has four products (dP, dV, dQ, dK) for the forward's two: 3x in all.
    torch.manual_seed(0)
    built = zoo.build("gpt2-small", layers=1, seq_len=128)
    path = tmp_path / "gpt2.onnx"
    export.export_weightless(built.module, built.inputs, path, input_names=built.input_names,
                             output_names=built.output_names)
    report = flopcount.count(path, mode="train", convention="dense")
    assert report.total.flops == 3 * report.forward.flops


@pytest.mark.parametrize("frozen", [
    # the token embedding is tied to the output head and exported once, as lm_head.weight
    pytest.param(["lm_head.*", "wpe.*", "blocks.0.*"], id="embeddings-and-first-block"),
    pytest.param(["blocks.1.*"], id="last-block"),
])
def test_frozen_parameters_equal_flop_counter_without_their_gradients(tmp_path, frozen):
    """Fine-tuning: the frozen parameters (shell patterns over the exported names) get no gradient, and nothing
    below the first trained layer is differentiated; FlopCounterMode sees the same with requires_grad off."""
    import fnmatch

    torch.manual_seed(0)
    built = zoo.build("gpt2-small", layers=2, seq_len=32)
    path = tmp_path / "gpt2.onnx"
    export.export_weightless(built.module, built.inputs, path, input_names=built.input_names,
                             output_names=built.output_names)
    report = flopcount.count(path, mode="train", convention="dense", frozen=frozen)
    cold = {id(p) for name, p in built.module.named_parameters(remove_duplicate=False)
            if any(fnmatch.fnmatchcase(name, f) for f in frozen)}  # a tied parameter under any of its names
    assert cold
    for p in built.module.parameters():
        p.requires_grad_(id(p) not in cold)
    assert report.trainable_params == sum(p.numel() for p in built.module.parameters() if p.requires_grad)
    assert report.total.flops == torch_training_flops(built.module, built.inputs)
    assert report.total.flops < flopcount.count(path, mode="train", convention="dense").total.flops
