"""The PyTorch frontend: ``from_torch``, its export cache and progress line, and ``flopcount --torch``.

Expected counts are closed forms written out here from the layer sizes, with distinct odd sizes so that a
swapped dimension cannot pass.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from torch import nn

import flopcount
from flopcount import FrontendError, UsageError, count, from_torch
from flopcount.cli import main
from flopcount.frontends import torch as frontend

N, C_IN, H, W = 3, 3, 7, 9
C_OUT, CLASSES = 5, 7


def small_cnn() -> nn.Module:
    """Conv 3→5 (3x3, pad 1) → ReLU → MaxPool 2 → Flatten → Linear 60→7, on 3x3x7x9 inputs."""
    return nn.Sequential(
        nn.Conv2d(C_IN, C_OUT, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(C_OUT * (H // 2) * (W // 2), CLASSES),
    )


def cnn_flops(n: int = N) -> int:
    s_out = H * W  # 3x3 conv with padding 1 keeps 7x9
    conv = 2 * n * C_OUT * s_out * 3 * 3 * C_IN + n * C_OUT * s_out  # products + bias
    relu = n * C_OUT * s_out
    pooled = n * C_OUT * (H // 2) * (W // 2)  # 3x5
    pool = 2 * 2 * pooled  # a 2x2 window read per output
    features = C_OUT * (H // 2) * (W // 2)  # 60
    linear = 2 * n * features * CLASSES + n * CLASSES
    return conv + relu + pool + linear


class TrainNet(nn.Module):
    """Conv → BatchNorm → ReLU → global mean → Dropout → Linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C_IN, C_OUT, 3)
        self.bn = nn.BatchNorm2d(C_OUT)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(C_OUT, CLASSES)

    def forward(self, image):
        return self.fc(self.drop(torch.relu(self.bn(self.conv(image))).mean((2, 3))))


class TwoInputs(nn.Module):
    def forward(self, query, key):
        return query @ key.transpose(-1, -2)


class QR(nn.Module):
    """torch.linalg.qr has no ONNX conversion in either exporter."""

    def forward(self, x):
        return torch.linalg.qr(x).R


def tiny_model() -> onnx.ModelProto:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3])
    return onnx.helper.make_model(onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))


@pytest.fixture
def fake_exports(monkeypatch):
    """Replaces the export by an instant one returning a one-Relu graph; counts the calls."""
    calls = []

    def fake(module, inputs, *args):
        calls.append(tuple(tuple(x.shape) for x in inputs))
        return tiny_model()

    monkeypatch.setattr(frontend, "_export", fake)
    return calls


def op_types(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


# ---------------------------------------------------------------------------------------------------------------
# from_torch
# ---------------------------------------------------------------------------------------------------------------


def test_from_torch_equals_count_of_the_exported_file(cache, tmp_path):
    module = small_cnn()
    path = tmp_path / "cnn.onnx"
    frontend.to_onnx(module, (N, C_IN, H, W), path=path)
    from_file = count(str(path))
    report = from_torch(module, (N, C_IN, H, W))
    assert dataclasses.replace(from_file, model=dataclasses.replace(from_file.model, path=None)) == report
    assert report.total.flops == cnn_flops()


def test_mlp_closed_form(cache):
    batch, d_in, hidden, d_out = 3, 7, 11, 5
    module = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))
    report = from_torch(module, (batch, d_in))
    # 2*3*7*11 + 3*11 (bias) | 3*11 (ReLU) | 2*3*11*5 + 3*5 (bias)
    assert report.total.flops == 2 * batch * d_in * hidden + batch * hidden + batch * hidden + 2 * batch * hidden * d_out + batch * d_out
    assert report.total.macs == batch * d_in * hidden + batch * hidden * d_out
    assert report.params == d_in * hidden + hidden + hidden * d_out + d_out
    assert report.batch == batch


def test_cnn_closed_form_and_count_kwargs(cache):
    report = from_torch(small_cnn(), torch.zeros(N, C_IN, H, W), convention="default", strict=True)
    assert report.total.flops == cnn_flops()
    assert report.by_op_type["Conv"].cost.macs == N * C_OUT * H * W * 3 * 3 * C_IN
    # batch= re-sizes dim 0 before the export; per-sample divides by it
    report = from_torch(small_cnn(), (1, C_IN, H, W), batch=4)
    assert report.total.flops == cnn_flops(4) and report.per_sample.flops * 4 == cnn_flops(4)


@pytest.mark.parametrize(
    "example, names",
    [
        pytest.param(((2, 5, 3), (2, 7, 3)), ["query", "key"], id="shapes"),
        pytest.param((torch.ones(2, 5, 3), (2, 7, 3)), ["query", "key"], id="tensor-and-shape"),
    ],
)
def test_several_inputs_named_after_forward(cache, example, names):
    report = from_torch(TwoInputs(), example)
    assert [t.name for t in report.model.inputs] == names
    assert report.total.flops == 2 * 2 * 5 * 3 * 7  # batched MatMul [5,3]x[3,7], batch 2


def test_bad_example_inputs(cache):
    with pytest.raises(UsageError, match="positive ints"):
        from_torch(small_cnn(), ((1, 3, 0, 9),))
    with pytest.raises(UsageError, match="example_inputs"):
        from_torch(small_cnn(), "1x3x7x9")
    with pytest.raises(UsageError, match="input_names"):
        from_torch(small_cnn(), (N, C_IN, H, W), input_names=["a", "b"])
    with pytest.raises(UsageError, match="expected a torch.nn.Module, got function"):
        from_torch(small_cnn, (N, C_IN, H, W))


def test_training_keeps_batch_norm_and_dropout(cache):
    module = TrainNet().eval()
    running_mean = module.bn.running_mean.clone()
    trained = frontend.to_onnx(module, (N, C_IN, H, W), training=True)
    inference = frontend.to_onnx(module, (N, C_IN, H, W), training=False)

    (bn,) = [n for n in trained.graph.node if n.op_type == "BatchNormalization"]
    assert {a.name: a.i for a in bn.attribute}["training_mode"] == 1
    assert "Dropout" in op_types(trained)
    (bn,) = [n for n in inference.graph.node if n.op_type == "BatchNormalization"]
    assert {a.name: a.i for a in bn.attribute}.get("training_mode", 0) == 0
    assert "Dropout" not in op_types(inference)
    # the module is as it was: eval mode, running statistics untouched by the traced training pass
    assert not module.training and not module.bn.training
    assert torch.equal(module.bn.running_mean, running_mean) and module.bn.num_batches_tracked.item() == 0

    report = from_torch(module, (N, C_IN, H, W), training=True)
    assert {"BatchNormalization", "Dropout", "Conv", "Gemm"} <= set(report.by_op_type)
    assert report.by_op_type["Dropout"].cost.flops == N * C_OUT  # one multiply per element in training
    assert report.mode == "train" and report.backward.flops > 0
    assert report.forward == from_torch(module, (N, C_IN, H, W), training=True, mode="inference").total


def test_mode_train_implies_a_training_export(cache):
    report = from_torch(TrainNet(), (N, C_IN, H, W), mode="train")
    assert "Dropout" in report.by_op_type and report.mode == "train"


def test_batch_norm_marked_training_on_the_dynamo_fallback(cache, monkeypatch):
    def no_torchscript(*args):
        raise RuntimeError("TorchScript exporter unavailable")

    monkeypatch.setattr(frontend, "_torchscript", no_torchscript)
    model = frontend.to_onnx(TrainNet(), (N, C_IN, H, W), training=True, cache_dir=False)
    (bn,) = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert {a.name: a.i for a in bn.attribute}["training_mode"] == 1
    assert "Dropout" in op_types(model)


# ---------------------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------------------


def test_cache_hit_then_miss_on_a_new_shape(cache, exports):
    first = from_torch(small_cnn(), (N, C_IN, H, W))
    again = from_torch(small_cnn(), (N, C_IN, H, W))  # new random weights, same structure: a hit
    assert len(exports) == 1 and again == first
    assert len(list(cache.glob("torch-*.onnx"))) == 1
    from_torch(small_cnn(), (N + 2, C_IN, H, W))
    from_torch(small_cnn(), (N, C_IN, H, W), training=True)
    assert exports == [((N, C_IN, H, W),), ((N + 2, C_IN, H, W),), ((N, C_IN, H, W),)]


def test_cache_key_sees_structure_not_values(cache):
    key = lambda m: frontend.fingerprint(torch, m, frontend._bind(torch, m, torch.zeros(1, 4), None, None), False, 18)
    assert key(nn.Linear(4, 6)) == key(nn.Linear(4, 6))
    assert key(nn.Linear(4, 6)) != key(nn.Linear(4, 7))
    assert key(nn.Linear(4, 6)) != key(nn.Linear(4, 6, bias=False))
    assert key(nn.Dropout(0.1)) != key(nn.Dropout(0.2))


@pytest.mark.parametrize("distribution", ["torch", "onnx", "onnxscript", "onnx-ir", "flopcount"])
def test_cache_key_sees_each_installed_version_an_export_depends_on(cache, monkeypatch, distribution):
    """An upgrade of the exporter, of the graph's library, of the exporter's passes (onnxscript and the IR it
    rewrites graphs with, onnx-ir) or of this package misses the cache."""
    from flopcount.frontends import common

    key = lambda: frontend.fingerprint(torch, nn.Linear(4, 6), frontend._bind(torch, nn.Linear(4, 6),
                                                                               torch.zeros(1, 4), None, None), False, 18)
    before, real = key(), common.dist_version
    monkeypatch.setattr(common, "dist_version", lambda d: "0.0.1" if d == distribution else real(d))
    assert key() != before


@pytest.mark.parametrize("cache_dir", [False, "off-env"], ids=["cache_dir=False", "FLOPCOUNT_CACHE=off"])
def test_cache_disabled(cache, fake_exports, monkeypatch, cache_dir):
    if cache_dir == "off-env":
        monkeypatch.setenv(frontend.CACHE_ENV, "off")
        cache_dir = None
    for _ in range(2):
        from_torch(nn.Linear(3, 5), (1, 3), cache_dir=cache_dir)
    assert len(fake_exports) == 2 and not cache.exists()


def test_cache_dir_argument_and_damaged_entry(tmp_path, fake_exports, caplog):
    folder = tmp_path / "explicit"
    assert from_torch(nn.Linear(3, 5), (1, 3), cache_dir=folder).total.flops == 3  # the fake's Relu on [1, 3]
    (entry,) = folder.glob("torch-*.onnx")
    stored = onnx.load(str(entry))
    seal = {p.key for p in stored.metadata_props if p.key.startswith("flopcount.cache.")}
    assert seal == {"flopcount.cache.format", "flopcount.cache.key", "flopcount.cache.signature",
                    "flopcount.cache.sha256"}
    del stored.metadata_props[:]
    assert stored == tiny_model()  # the export, sealed with its key, input signature and digest
    entry.write_bytes(b"not a model")
    with caplog.at_level(logging.WARNING, logger=frontend.__name__):
        report = from_torch(nn.Linear(3, 5), (1, 3), cache_dir=folder)
    assert report.total.flops == 3 and len(fake_exports) == 2
    assert f"ignoring the export cache entry {entry}: not a readable ONNX protobuf" in caplog.text


# ---------------------------------------------------------------------------------------------------------------
# Progress line
# ---------------------------------------------------------------------------------------------------------------


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def slow_export(*args):
    time.sleep(0.35)
    return tiny_model()


def test_spinner_on_a_terminal_during_a_slow_export(monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr(frontend, "_PROGRESS_DELAY_S", 0.05)
    monkeypatch.setattr(frontend, "_export", slow_export)
    monkeypatch.setattr(sys, "stderr", terminal)
    frontend.to_onnx(nn.Linear(3, 5), (1, 3), cache_dir=False)
    text = terminal.getvalue()
    assert "flopcount: exporting Linear with torch" in text and text.startswith("\r")
    assert text.endswith("\r")  # the line is wiped when the export ends


def test_no_spinner_under_quiet(monkeypatch):
    from flopcount.cli.console import command_logging

    terminal = FakeTerminal()
    monkeypatch.setattr(frontend, "_PROGRESS_DELAY_S", 0.05)
    monkeypatch.setattr(frontend, "_export", slow_export)
    monkeypatch.setattr(sys, "stderr", terminal)
    with command_logging(0, quiet=True):  # the command line's -q
        frontend.to_onnx(nn.Linear(3, 5), (1, 3), cache_dir=False)
    assert terminal.getvalue() == ""


def test_progress_is_one_log_line_off_a_terminal(monkeypatch, caplog):
    monkeypatch.setattr(frontend, "_PROGRESS_DELAY_S", 0.05)
    monkeypatch.setattr(frontend, "_export", slow_export)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with caplog.at_level(logging.INFO, logger=frontend.__name__):
        frontend.to_onnx(nn.Linear(3, 5), (1, 3), cache_dir=False)
    assert [r.getMessage() for r in caplog.records if "exporting" in r.getMessage()] == [
        "exporting Linear with torch (running for over 0.05 s)"
    ]
    assert sys.stderr.getvalue() == ""


def test_no_progress_for_a_fast_export(monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr(frontend, "_export", lambda *a: tiny_model())
    monkeypatch.setattr(sys, "stderr", terminal)
    frontend.to_onnx(nn.Linear(3, 5), (1, 3), cache_dir=False)
    assert terminal.getvalue() == ""


# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------


def test_failing_export_names_frontend_and_operator(cache, capsys):
    with pytest.raises(FrontendError) as caught:
        from_torch(QR(), (2, 4, 4))
    message = str(caught.value)
    assert message.startswith("torch: cannot export QR to ONNX: operator aten::linalg_qr has no ONNX conversion")
    assert "No ONNX function found" in message and "\n" not in message
    assert caught.value.exit_code == 9
    assert capsys.readouterr().out == ""  # the TorchScript exporter's graph dump stays off stdout


def test_missing_torch_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes ``import torch`` raise ImportError
    with pytest.raises(FrontendError, match=r"torch: PyTorch is not installed; pip install 'flopcount\[torch\]'"):
        from_torch(object(), (1, 3))


def test_count_kwargs_are_checked_before_exporting(fake_exports):
    with pytest.raises(TypeError, match="colour"):
        from_torch(nn.Linear(3, 5), (1, 3), colour="red")
    assert fake_exports == []


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A module of factories importable by a name unique to the test."""
    name = f"fc_factories_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import torch
        from torch import nn

        def cnn():
            return nn.Sequential(
                nn.Conv2d({C_IN}, {C_OUT}, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                nn.Linear({C_OUT * (H // 2) * (W // 2)}, {CLASSES}),
            )

        class QR(nn.Module):
            def forward(self, x):
                return torch.linalg.qr(x).R

        def broken():
            return QR()

        def not_a_module():
            return 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_cli_torch(cache, factories, capsys):
    assert main(["--torch", f"{factories}:cnn", "--input-shape", f"input={N}x{C_IN}x{H}x{W}", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total"]["flops"] == cnn_flops()
    assert [i["name"] for i in report["model"]["inputs"]] == ["input"]  # nn.Sequential.forward(input)
    assert report["model"]["inputs"][0]["shape"] == [N, C_IN, H, W]


def test_cli_torch_failing_export_exit_9(cache, factories, capsys):
    assert main(["--torch", f"{factories}:broken", "--input-shape", "x=2x4x4"]) == 9
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("flopcount: error: torch: cannot export QR")
    assert "aten::linalg_qr" in err


@pytest.mark.parametrize(
    "spec, message",
    [
        pytest.param("{m}:nope", "module '{m}' has no attribute 'nope'; its callables: QR, broken, cnn, not_a_module",
                     id="missing-factory"),
        pytest.param("no_such_package.nets:make", "cannot import module 'no_such_package.nets'", id="missing-module"),
        pytest.param("{m}", "--torch wants MODULE:FACTORY", id="no-colon"),
        pytest.param("{m}:not_a_module", "the factory returned a int, not a torch.nn.Module", id="not-a-module"),
    ],
)
def test_cli_torch_usage_errors(factories, capsys, spec, message):
    assert main(["--torch", spec.format(m=factories), "--input-shape", "x=1x3"]) == 2
    err = capsys.readouterr().err
    assert message.format(m=factories) in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["model.onnx", "--torch", "m:f", "--input-shape", "x=1"], "not both", id="both"),
        pytest.param([], "give the path of an .onnx model, or --torch", id="neither"),
        pytest.param(["--torch", "m:f"], "--torch needs the shape of each forward() input", id="no-shapes"),
        pytest.param(["--torch", "m:f", "--input-shape", "x=1", "--input-shape", "x=2"], "names one forward() input",
                     id="repeated-name"),
    ],
)
def test_cli_model_source_usage(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_missing_torch(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert main(["--torch", "m:f", "--input-shape", "x=1"]) == 9
    assert "pip install 'flopcount[torch]'" in capsys.readouterr().err


def test_public_names():
    assert flopcount.from_torch is from_torch and flopcount.FrontendError.exit_code == 9


def test_an_export_leaves_no_thread_that_would_stop_the_inference_fork():
    """The exporters show tqdm bars when tqdm is installed; tqdm's monitor thread must not outlive the export, or
    counting would never fork its shape-inference child again in this process."""
    pytest.importorskip("tqdm")
    import threading

    before = set(threading.enumerate())  # threads other tests left are not this export's
    from_torch(nn.Linear(4, 2), (2, 4), cache_dir=False)
    assert [t.name for t in threading.enumerate() if t not in before] == []


def conv_bn_relu() -> nn.Module:
    return nn.Sequential(nn.Conv2d(C_IN, C_OUT, 3, padding=1, bias=False), nn.BatchNorm2d(C_OUT), nn.ReLU())


def test_meta_device_batch_norm_trains_as_the_same_module_on_the_cpu(cache):
    """A meta-device module is exported with torch.export, a CPU one with the TorchScript exporter; in training
    mode both give BatchNormalization in training form (with the running statistics outputs the spec requires)
    and the same counts."""
    with torch.device("meta"):
        meta = conv_bn_relu()
    on_meta = from_torch(meta, (N, C_IN, H, W), mode="train", convention="dense")
    on_cpu = from_torch(conv_bn_relu(), (N, C_IN, H, W), mode="train", convention="dense")
    conv = 2 * N * C_OUT * H * W * C_IN * 3 * 3  # 2·N·C_out·H·W·C_in·K²
    assert on_meta.forward.flops == on_cpu.forward.flops == conv
    assert on_meta.backward.flops == on_cpu.backward.flops == conv  # dW only: the input is data
    assert on_meta.trainable_params == on_cpu.trainable_params == C_OUT * C_IN * 9 + 2 * C_OUT
    default = from_torch(meta, (N, C_IN, H, W), mode="train")
    assert default.total.flops == from_torch(conv_bn_relu(), (N, C_IN, H, W), mode="train").total.flops


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_batch_norm_with_one_value_per_channel_is_refused_like_pytorch(cache, device, capsys):
    """Batch 1 at 1×1 spatial size: PyTorch refuses to train batch norm on one value per channel; so does the
    count, with the input named, on both export paths (torch.export traces at batch 2, where the check passes)."""
    with torch.device(device):
        module = conv_bn_relu()
    with pytest.raises(UsageError, match=r"input: float32\[1, 3, 1, 1\], a BatchNorm layer in training mode gets one "
                                         r"value per channel \(its input size is \[1, 5, 1, 1\]"):
        from_torch(module, (1, C_IN, 1, 1), mode="train")
    assert from_torch(module, (2, C_IN, 1, 1), mode="train").forward.flops > 0  # two values per channel
    assert from_torch(module, (1, C_IN, 1, 1)).forward.flops > 0  # inference normalises with running statistics
