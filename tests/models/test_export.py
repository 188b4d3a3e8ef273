"""Reference ResNet v1.5 and its weightless ONNX export.

Every expected number is derived here from the architecture as published (He et al. 2015, with the v1.5 stride
placement), never read back from the model code.
"""

from __future__ import annotations

import copy
from collections import Counter
from math import prod
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from flopcount.frontends import export  # noqa: E402
from flopcount.models import resnet  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "resnet50-v1.5.onnx"
WIDTHS = (64, 128, 256, 512)
EXPANSION = 4
FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}


def bottleneck_configs(layers):
    """(in_channels, width, stride) of every bottleneck block, stage by stage."""
    configs, channels = [], 64
    for stage, (blocks, width) in enumerate(zip(layers, WIDTHS)):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            configs.append((channels, width, stride))
            channels = width * EXPANSION
    return configs


def expected_counts(layers, num_classes=1000, in_channels=3):
    """Closed forms for (conv layers, parameters, BatchNorm channels) of a bottleneck ResNet.

    Per block with input c, width w, output 4w: convs c*w + 3*3*w*w + w*4w; BatchNorm over w + w + 4w channels;
    a projection shortcut (first block of each stage, where c != 4w or the stride is 2) adds a c*4w conv and a
    BatchNorm over 4w channels. Stem: 7*7 conv in_channels -> 64 and a BatchNorm over 64. Head: fc 2048 -> classes
    with bias. Each BatchNorm channel has a weight and a bias (parameters) and a running mean and variance (buffers).
    """
    convs, params, bn_channels = 1, 7 * 7 * in_channels * 64, 64
    for c, w, stride in bottleneck_configs(layers):
        convs += 3
        params += c * w + 3 * 3 * w * w + w * 4 * w
        bn_channels += w + w + 4 * w
        if stride != 1 or c != 4 * w:
            convs += 1
            params += c * 4 * w
            bn_channels += 4 * w
    params += 2 * bn_channels + WIDTHS[-1] * EXPANSION * num_classes + num_classes
    return convs, params, bn_channels


def test_resnet50_layer_inventory():
    model = resnet.resnet50()
    kinds = Counter(type(m).__name__ for m in model.modules())
    # stem 1 + 16 blocks * 3 + 4 projection shortcuts = 53
    assert (kinds["Conv2d"], kinds["Linear"], kinds["BatchNorm2d"]) == (53, 1, 53)
    assert all(m.bias is None for m in model.modules() if isinstance(m, torch.nn.Conv2d))


def test_resnet50_parameter_count():
    convs, params, bn_channels = expected_counts((3, 4, 6, 3))
    # BatchNorm channels: stem 64; per stage blocks * 6w + 4w for the projection:
    # 3*384 + 256 = 1408, 4*768 + 512 = 3584, 6*1536 + 1024 = 10240, 3*3072 + 2048 = 11264; 64 + ... = 26560
    assert (convs, params, bn_channels) == (53, 25_557_032, 26_560)
    assert sum(p.numel() for p in resnet.resnet50().parameters()) == params


@pytest.mark.parametrize(
    "layers, num_classes, in_channels",
    [
        pytest.param((3, 4, 6, 3), 1000, 3, id="resnet50"),
        pytest.param((1, 1, 1, 1), 10, 1, id="tiny-grey-10-classes"),
        pytest.param((2, 3, 1, 2), 7, 3, id="odd-depths"),
    ],
)
def test_builder_parameter_count(layers, num_classes, in_channels):
    model = resnet.resnet_v1_5(layers, num_classes=num_classes, in_channels=in_channels)
    convs, params, _ = expected_counts(layers, num_classes, in_channels)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) == convs
    assert sum(p.numel() for p in model.parameters()) == params


def test_v1_5_puts_the_stride_on_the_3x3_conv():
    model = resnet.resnet50()
    blocks = [m for m in model.modules() if isinstance(m, resnet.Bottleneck)]
    strides = [(b.conv1.stride, b.conv2.stride, b.conv3.stride) for b in blocks]
    expected = [((1, 1), (s, s), (1, 1)) for _, _, s in bottleneck_configs((3, 4, 6, 3))]
    assert strides == expected
    assert all(b.conv2.kernel_size == (3, 3) for b in blocks)
    stride_2_in_blocks = [
        m.kernel_size for b in blocks for m in (b.conv1, b.conv2, b.conv3) if m.stride == (2, 2)
    ]
    assert stride_2_in_blocks == [(3, 3)] * 3  # first block of stages 2, 3, 4


# ---------------------------------------------------------------------------------------------------------------
# Weightless export of a small model
# ---------------------------------------------------------------------------------------------------------------

SMALL_LAYERS, SMALL_CLASSES, SMALL_HW = (1, 1, 1, 1), 10, 32


@pytest.fixture(scope="module")
def small_export(tmp_path_factory):
    torch.manual_seed(0)
    model = resnet.resnet_v1_5(SMALL_LAYERS, num_classes=SMALL_CLASSES)
    path = tmp_path_factory.mktemp("export") / "tiny.onnx"
    export.export_weightless(model, torch.zeros(1, 3, SMALL_HW, SMALL_HW), path)
    return path


def test_weightless_file_loads_without_external_data(small_export):
    model = onnx.load(small_export, load_external_data=False)
    assert not (small_export.parent / "tiny.weights").exists()
    assert max(len(t.raw_data) for t in model.graph.initializer) < export.SIZE_THRESHOLD
    assert small_export.stat().st_size < 64 * 1024


def test_weightless_references_are_laid_out_back_to_back(small_export):
    model = onnx.load(small_export, load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert external
    offset = 0
    for tensor in external:
        entries = {e.key: e.value for e in tensor.external_data}
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        length = prod(tensor.dims) * itemsize
        assert entries == {"location": "tiny.weights", "offset": str(offset), "length": str(length)}
        assert int(entries["length"]) >= export.SIZE_THRESHOLD
        offset += int(entries["length"])


def test_weightless_initializers_match_parameters_and_bn_statistics(small_export):
    # Initializers: every parameter plus each BatchNorm's running_mean and running_var (two per channel).
    # num_batches_tracked is not used in eval mode and is not exported; integer shape constants are not counted.
    _, params, bn_channels = expected_counts(SMALL_LAYERS, SMALL_CLASSES)
    model = onnx.load(small_export, load_external_data=False)
    floats = [t for t in model.graph.initializer if t.data_type in FLOAT_TYPES]
    assert sum(prod(t.dims) for t in floats) == params + 2 * bn_channels


def test_export_keeps_batchnorm_and_the_graph_shape(small_export):
    model = onnx.load(small_export, load_external_data=False)
    ops = Counter(node.op_type for node in model.graph.node)
    convs, _, _ = expected_counts(SMALL_LAYERS)
    assert ops["Conv"] == ops["BatchNormalization"] == convs
    assert ops["Relu"] == 1 + 3 * sum(SMALL_LAYERS)
    assert ops["Add"] == sum(SMALL_LAYERS)
    assert (ops["MaxPool"], ops["Gemm"]) == (1, 1)
    assert ops["GlobalAveragePool"] + ops["ReduceMean"] == 1
    assert {"Constant", "Identity", "Expand", "Shape"}.isdisjoint(ops)
    strided = Counter(
        tuple(helper.get_attribute_value(a) for a in node.attribute if a.name == "kernel_shape")[0][0]
        for node in model.graph.node
        if node.op_type == "Conv"
        and any(a.name == "strides" and list(a.ints) == [2, 2] for a in node.attribute)
    )
    # stem 7x7; three 3x3 bottleneck convs and three 1x1 projections at the first block of stages 2 to 4
    assert strided == {7: 1, 3: 3, 1: 3}


def test_export_declares_static_io_and_does_not_pin_the_batch(small_export):
    model = onnx.load(small_export, load_external_data=False)
    dims = lambda value: [d.dim_value for d in value.type.tensor_type.shape.dim]  # noqa: E731
    assert [(v.name, dims(v)) for v in model.graph.input] == [("input", [1, 3, SMALL_HW, SMALL_HW])]
    assert [(v.name, dims(v)) for v in model.graph.output] == [("logits", [1, SMALL_CLASSES])]
    resized = copy.deepcopy(model)
    resized.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 8
    resized.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 8
    inferred = onnx.shape_inference.infer_shapes(resized, strict_mode=True, data_prop=True)
    assert dims(inferred.graph.output[0]) == [8, SMALL_CLASSES]


def test_export_carries_no_machine_paths(small_export):
    data = small_export.read_bytes()
    for fragment in (b"site-packages", b"/home/", b"/root/", b"/tmp/", b"/work/", str(Path.cwd()).encode()):
        assert fragment not in data


def test_export_is_deterministic(small_export, tmp_path):
    torch.manual_seed(0)
    model = resnet.resnet_v1_5(SMALL_LAYERS, num_classes=SMALL_CLASSES)
    again = tmp_path / "tiny.onnx"
    export.export_weightless(model, torch.zeros(1, 3, SMALL_HW, SMALL_HW), again)
    assert again.read_bytes() == small_export.read_bytes()


# ---------------------------------------------------------------------------------------------------------------
# make_weightless on its own (no torch involved)
# ---------------------------------------------------------------------------------------------------------------


def test_make_weightless_lifts_large_constants_and_keeps_small_ones():
    import numpy as np

    big = numpy_helper.from_array(np.ones((16, 17), np.float32))  # 16 * 17 * 4 = 1088 bytes
    small = numpy_helper.from_array(np.array([-1, 17], np.int64))  # 16 bytes
    nodes = [
        helper.make_node("Constant", [], ["w"], value=big),
        helper.make_node("Constant", [], ["shape"], value=small),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Reshape", ["y", "shape"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 17])],
    )
    light = export.make_weightless(helper.make_model(graph), "g.weights")
    assert [n.op_type for n in light.graph.node] == ["Constant", "MatMul", "Reshape"]
    (w,) = light.graph.initializer
    assert (w.name, list(w.dims), w.data_location, len(w.raw_data)) == ("w", [16, 17], TensorProto.EXTERNAL, 0)
    assert {e.key: e.value for e in w.external_data} == {"location": "g.weights", "offset": "0", "length": "1088"}


# ---------------------------------------------------------------------------------------------------------------
# The bundled example
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/resnet50-v1.5.onnx not generated")
def test_bundled_resnet50_example():
    model = onnx.load(EXAMPLE, load_external_data=False)
    convs, params, bn_channels = expected_counts((3, 4, 6, 3))
    ops = Counter(node.op_type for node in model.graph.node)
    assert ops["Conv"] == ops["BatchNormalization"] == convs
    floats = [t for t in model.graph.initializer if t.data_type in FLOAT_TYPES]
    assert sum(prod(t.dims) for t in floats) == params + 2 * bn_channels
    assert EXAMPLE.stat().st_size < 512 * 1024


def test_an_export_leaves_no_thread_that_would_stop_the_inference_fork(tmp_path):
    """As from_torch: tqdm's monitor thread (the exporters' progress bars start it) must not outlive the export."""
    pytest.importorskip("tqdm")
    import threading

    before = set(threading.enumerate())  # threads other tests left are not this export's
    export.export_weightless(torch.nn.Linear(4, 2), torch.zeros(2, 4), tmp_path / "linear.onnx")
    assert [t.name for t in threading.enumerate() if t not in before] == []



def test_onnx_export_names_the_torch_version_and_the_options_it_lacks():
    """A torch whose ``torch.onnx.export`` lost options flopcount passes (as a release that drops the TorchScript
    exporter would): one line naming that torch's version and the options, never a TypeError from inside it."""
    import types

    from flopcount.errors import FrontendError

    calls = []

    def onnx_export(model, args, f=None, *, input_names=None, opset_version=None, dynamo=True):
        calls.append((model, args, f, input_names, opset_version, dynamo))
        return "program"

    fake = types.SimpleNamespace(__version__="9.0.0", onnx=types.SimpleNamespace(export=onnx_export))
    with pytest.raises(FrontendError, match=r"^torch 9\.0\.0: torch\.onnx\.export takes no dynamic_axes, training "
                                            r"argument; .*install a torch"):
        export.onnx_export(fake, "m", ("x",), None, opset_version=18, dynamo=False, dynamic_axes={}, training=1)
    assert calls == []  # refused before the exporter ran
    assert export.onnx_export(fake, "m", ("x",), None, input_names=["x"], opset_version=18) == "program"
    assert calls == [("m", ("x",), None, ["x"], 18, True)]
