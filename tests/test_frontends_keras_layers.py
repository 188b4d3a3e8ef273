"""Keras layers that the TensorFlow backend runs in ways tf2onnx does not convert as they are (grouped and
depth-wise convolutions inside an XLA-compiled function, exact gelu through ``Erfc``), one count for one
architecture whichever exporter wrote it (BatchNormalization, identity arithmetic), factories with arguments and
the input shapes suggested in errors.

Expected counts are closed forms written from the layer sizes (distinct odd sizes). Keras image models are
channels-last: inputs are ``(N, H, W, C)``.
"""

from __future__ import annotations

import json
import textwrap

import onnx
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("tf2onnx")

from flopcount import UsageError, from_keras
from flopcount.cli import main
from flopcount.frontends import keras as frontend

tf, keras, tf2onnx = frontend.import_frameworks()

N, H, W = 1, 11, 13
C_IN, G, C = 9, 3, 6  # the stem: 9 → 6 channels in 3 groups (3 input channels per group)
EXPAND = 4 * C


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(frontend.common.CACHE_ENV, str(folder))
    return folder


# ---------------------------------------------------------------------------------------------------------------
# Grouped and depth-wise convolutions, exact gelu: a ConvNeXt-style block
# ---------------------------------------------------------------------------------------------------------------


def exact_gelu(t):
    return keras.activations.gelu(t, approximate=False)


def convnext_like() -> keras.Model:
    """A grouped 3x3 stem, then a ConvNeXt block: depth-wise 7x7 → LayerNorm → Dense 4C → exact gelu → Dense C,
    plus the residual."""
    x = keras.Input((H, W, C_IN), name="image")
    stem = keras.layers.Conv2D(C, 3, padding="same", groups=G, name="stem")(x)
    y = keras.layers.Conv2D(C, 7, padding="same", groups=C, name="dwconv")(stem)
    y = keras.layers.LayerNormalization(epsilon=1e-6, name="norm")(y)
    y = keras.layers.Dense(EXPAND, name="pwconv1")(y)
    y = keras.layers.Activation(exact_gelu, name="gelu")(y)
    y = keras.layers.Dense(C, name="pwconv2")(y)
    return keras.Model(x, keras.layers.Add(name="residual")([stem, y]), name="convnext_like")


@pytest.mark.slow
def test_grouped_depthwise_conv_and_exact_gelu_convert_and_count(cache):
    graph = frontend.to_onnx(convnext_like())
    report = from_keras(convnext_like())
    assert not report.unsupported
    groups = sorted(next(a.i for a in node.attribute if a.name == "group")
                    for node in graph.graph.node if node.op_type == "Conv")
    assert groups == [G, C]  # each convolution keeps its groups
    assert {"Erf"} <= set(report.by_op_type) and "Erfc" not in report.by_op_type
    assert report.by_op_type["Neg"].cost.flops == N * H * W  # LayerNorm's −mean, per row; gelu's is folded

    pixels = N * H * W
    # conv: 2·N·C_out·H·W·K·K·C_in/G + N·C_out·H·W (bias)
    stem = 2 * N * C * H * W * 3 * 3 * (C_IN // G) + N * C * H * W
    dwconv = 2 * N * C * H * W * 7 * 7 * (C // C) + N * C * H * W
    conv_macs = N * C * H * W * (9 * C_IN // G + 49)
    assert report.by_op_type["Conv"].cost.macs == conv_macs
    assert report.by_op_type["Conv"].cost.flops == stem + dwconv
    # LayerNormalization as Keras computes it, n = N·H·W·C elements in r = N·H·W rows: the mean (n), x − mean and
    # its square (2n), the variance (n); var + eps, sqrt, 1/sqrt (3r); ·gamma, x·inv, −mean (r), −mean·inv,
    # + beta, the sum (5n)
    n, r = pixels * C, pixels
    layer_norm = 9 * n + 4 * r
    dense = 2 * pixels * C * EXPAND + pixels * EXPAND + 2 * pixels * EXPAND * C + pixels * C
    # exact gelu as Keras computes it, 0.5·x·erfc(−x·(1/√2)) with erfc(z) = 1 − erf(z) and −x·(1/√2) = x·(−1/√2):
    # 0.5·x, x·(−1/√2), erf, 1 − erf, the product: 5 per element, as the PyTorch exporter's
    # 0.5·x·(1 + erf(x/√2))
    gelu = 5 * pixels * EXPAND
    residual = pixels * C
    assert report.total.flops == stem + dwconv + layer_norm + dense + gelu + residual
    assert report.total.transcendentals == r + pixels * EXPAND  # a square root per row, an erf per element


# ---------------------------------------------------------------------------------------------------------------
# One architecture, one count: the same small CNN built in Keras and in PyTorch
# ---------------------------------------------------------------------------------------------------------------

HB, WB, CB_IN, CB, K = 7, 9, 3, 5, 4


def keras_bn_cnn() -> keras.Model:
    """Rescaling(1/255) → Conv 3→5 (3x3, same, no bias) → BatchNorm → swish → exact gelu → Flatten → Dense
    315→4 → BatchNorm."""
    x = keras.Input((HB, WB, CB_IN), name="image")
    y = keras.layers.Rescaling(1 / 255)(x)
    y = keras.layers.Conv2D(CB, 3, padding="same", use_bias=False, name="conv")(y)
    y = keras.layers.BatchNormalization(name="bn")(y)
    y = keras.layers.Activation("swish")(y)
    y = keras.layers.Activation(exact_gelu)(y)
    y = keras.layers.Flatten()(y)
    y = keras.layers.Dense(K, name="head")(y)
    return keras.Model(x, keras.layers.BatchNormalization(name="bn_head")(y), name="bn_cnn")


def torch_bn_cnn():
    torch = pytest.importorskip("torch")

    class Rescale(torch.nn.Module):
        def forward(self, x):
            return x * (1 / 255)

    return torch.nn.Sequential(
        Rescale(), torch.nn.Conv2d(CB_IN, CB, 3, padding=1, bias=False), torch.nn.BatchNorm2d(CB), torch.nn.SiLU(),
        torch.nn.GELU(), torch.nn.Flatten(), torch.nn.Linear(CB * HB * WB, K), torch.nn.BatchNorm1d(K),
    ).eval()


def bn_cnn_flops(n: int) -> int:
    """The default convention: BatchNormalization 1 FLOP per element (as the ONNX operator), swish x·sigmoid(x)
    2 per element, exact gelu 5 per element (0.5·x·(1 + erf(x/√2)))."""
    pixels = n * HB * WB
    rescale = pixels * CB_IN  # x·(1/255); Keras's "+ 0" offset computes nothing
    conv = 2 * pixels * CB * 3 * 3 * CB_IN
    bn = pixels * CB
    swish = 2 * pixels * CB
    gelu = 5 * pixels * CB
    dense = 2 * n * CB * HB * WB * K + n * K
    bn_head = n * K
    return rescale + conv + bn + swish + gelu + dense + bn_head


@pytest.mark.slow
def test_batch_norm_and_swish_count_as_in_pytorch(cache):
    from flopcount import from_torch

    keras_report = from_keras(keras_bn_cnn(), batch=3)
    torch_report = from_torch(torch_bn_cnn(), (3, CB_IN, HB, WB), cache_dir=False)
    # 3·(63·3 + 2·63·5·27 + 63·5 + 2·63·5 + 5·63·5 + 2·315·4 + 4 + 4) = 3·22,247
    assert keras_report.total.flops == torch_report.total.flops == bn_cnn_flops(3) == 66_741
    # a square root per channel of each BatchNormalization, a sigmoid and an erf per element
    assert keras_report.total.transcendentals == torch_report.total.transcendentals == CB + K + 2 * 3 * HB * WB * CB
    assert keras_report.by_op_type["BatchNormalization"].nodes == 2
    assert not {"Sqrt", "Reciprocal"} & set(keras_report.by_op_type)  # the batch norms' per-channel arithmetic
    # parameters: kernel, the head, and gamma and beta of each batch norm; buffers: the batch norms' moving
    # statistics (Keras' non-trainable weights); count_params() holds both
    assert keras_report.params == 3 * 3 * 3 * 5 + 315 * 4 + 4 + 2 * (CB + K)
    assert keras_report.buffers == 2 * (CB + K)
    assert keras_report.params + keras_report.buffers == keras_bn_cnn().count_params()


def test_batch_norm_on_the_channel_axis_of_nchw_and_in_training(cache):
    """BatchNormalization(axis=1) of a channels-first sequence needs no transposes; in training the batch
    statistics are computed by the graph, and it stays as Keras computes it."""
    x = keras.Input((CB, 11), name="seq")
    model = keras.Model(x, keras.layers.BatchNormalization(axis=1, name="bn")(x), name="bn_first")
    graph = frontend.to_onnx(model, (2, CB, 11))
    assert [node.op_type for node in graph.graph.node if node.op_type != "Constant"] == ["BatchNormalization"]
    assert from_keras(model, (2, CB, 11)).total.flops == 2 * CB * 11
    trained = from_keras(model, (2, CB, 11), training=True)
    assert "BatchNormalization" not in trained.by_op_type and "ReduceMean" in trained.by_op_type


# ---------------------------------------------------------------------------------------------------------------
# Inputs: suggested shapes
# ---------------------------------------------------------------------------------------------------------------


def test_open_dims_are_suggested_with_the_declared_dims_and_placeholders():
    x = keras.Input((None, None, 3), name="input_layer")
    model = keras.Model(x, keras.layers.Conv2D(2, 3)(x), name="any_size")
    with pytest.raises(UsageError) as caught:
        from_keras(model, cache_dir=False)
    assert str(caught.value) == (
        "keras: input 'input_layer' of any_size has shape (1, None, None, 3): dims 1 and 2 are open (the model takes "
        "any size there); give them: --input-shape input_layer=1xHxWx3 or input_shapes={'input_layer': (1, H, W, 3)} "
        "with your H, W"
    )


# ---------------------------------------------------------------------------------------------------------------
# Command line: factories with arguments
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def factories(tmp_path, monkeypatch):
    name = f"fc_keras_layer_factories_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import keras

        def dense(width, weights="imagenet", input_shape=(None, 5)):
            x = keras.Input(input_shape, name="x")
            return keras.Model(x, keras.layers.Dense(width)(x))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_cli_factory_arguments(cache, factories, capsys):
    spec = f"{factories}:dense(7, weights=None, input_shape=(3, 5))"
    assert main(["--keras", spec, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total"]["flops"] == 3 * (2 * 5 * 7 + 7)  # batch 1, 3 rows of 5 → 7: products and bias
    assert main(["--keras", f"{factories}:dense(7)"]) == 2
    assert capsys.readouterr().err == (
        f"flopcount: error: --keras {factories}:dense(7): dense() loads pretrained weights by default "
        f"(weights='imagenet'), and flopcount never reads weights; build the model without them: --keras "
        f"'{factories}:dense(7, weights=None)'\n"
    )


def test_cli_keras_applications_is_refused_until_weights_none(capsys):
    assert main(["--keras", "keras.applications:MobileNetV3Small"]) == 2
    assert "--keras 'keras.applications:MobileNetV3Small(weights=None)'" in capsys.readouterr().err
    assert main(["--keras", "keras.applications:MobileNetV3Small(weights=None, size=3)"]) == 2
    err = capsys.readouterr().err
    assert "got an unexpected keyword argument 'size'; MobileNetV3Small() takes (input_shape=None, alpha=1.0," in err
