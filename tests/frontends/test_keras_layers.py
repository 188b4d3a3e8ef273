"""Keras layers that the TensorFlow backend runs in ways tf2onnx does not convert as they are (grouped and
depth-wise convolutions inside an XLA-compiled function, exact gelu through ``Erfc``), one count for one
architecture whichever exporter wrote it (BatchNormalization, LayerNormalization, identity arithmetic), factories
with arguments and the input shapes suggested in errors.

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
    assert "Neg" not in report.by_op_type  # gelu's −x is folded into its constant

    pixels = N * H * W
    # conv: 2·N·C_out·H·W·K·K·C_in/G + N·C_out·H·W (bias)
    stem = 2 * N * C * H * W * 3 * 3 * (C_IN // G) + N * C * H * W
    dwconv = 2 * N * C * H * W * 7 * 7 * (C // C) + N * C * H * W
    conv_macs = N * C * H * W * (9 * C_IN // G + 49)
    assert report.by_op_type["Conv"].cost.macs == conv_macs
    assert report.by_op_type["Conv"].cost.flops == stem + dwconv
    # LayerNormalization over the channels of n = N·H·W·C elements in r = N·H·W rows: Keras computes its moments
    # in the depth-wise convolution's NCHW layout, and the frontend writes it as ONNX LayerNormalization of the
    # NHWC tensor, 1 per element
    n, r = pixels * C, pixels
    layer_norm = n
    assert report.by_op_type["LayerNormalization"].nodes == 1
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
# One architecture, one count: LayerNormalization as the ONNX operator
# ---------------------------------------------------------------------------------------------------------------

S, D, KL = 5, 7, 3  # tokens, features, outputs of the head


def keras_ln_mlp() -> keras.Model:
    """Dense D→D → LayerNormalization → Dense D→KL, on each of S tokens."""
    x = keras.Input((S, D), name="tokens")
    y = keras.layers.Dense(D, name="proj")(x)
    y = keras.layers.LayerNormalization(epsilon=1e-5, name="norm")(y)
    return keras.Model(x, keras.layers.Dense(KL, name="head")(y), name="ln_mlp")


def torch_ln_mlp():
    torch = pytest.importorskip("torch")
    return torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.LayerNorm(D, eps=1e-5), torch.nn.Linear(D, KL)).eval()


@pytest.mark.slow
def test_layer_norm_counts_as_in_pytorch_in_inference_and_training(cache):
    from flopcount import from_torch

    n = 3
    rows, elements = n * S, n * S * D
    keras_report = from_keras(keras_ln_mlp(), batch=n)
    torch_report = from_torch(torch_ln_mlp(), (n, S, D), cache_dir=False)
    # the Dense layers: 2·rows·D·D + rows·D (bias) and 2·rows·D·KL + rows·KL; LayerNormalization 1 per element
    dense = 2 * rows * D * D + rows * D + 2 * rows * D * KL + rows * KL
    assert keras_report.total.flops == torch_report.total.flops == dense + elements == 2_355
    norm = keras_report.by_op_type["LayerNormalization"]
    assert norm.nodes == 1 and (norm.cost.flops, norm.cost.transcendentals) == (elements, rows)
    assert keras_report.total.transcendentals == torch_report.total.transcendentals == rows  # one 1/sqrt per row
    assert not {"ReduceMean", "Sub", "Sqrt", "Reciprocal", "Neg", "Mul"} & set(keras_report.by_op_type)
    # parameters: kernels and biases, gamma and beta (2·D)
    params = (D * D + D) + (D * KL + KL) + 2 * D
    assert keras_report.params == torch_report.params == keras_ln_mlp().count_params() == params

    # training: the same arithmetic (a layer norm has no batch statistics), counted with LayerNormalization's
    # backward; its input is the first Dense's output, so dX too: 7 per element
    trained = from_keras(keras_ln_mlp(), batch=n, mode="train")
    torch_trained = from_torch(torch_ln_mlp(), (n, S, D), mode="train", cache_dir=False)
    norm = trained.by_op_type["LayerNormalization"]
    assert norm.nodes == 1 and norm.backward.flops == 7 * elements
    assert trained.total.flops == torch_trained.total.flops
    assert trained.backward.flops == torch_trained.backward.flops
    assert trained.trainable_params == params


@pytest.mark.slow
def test_layer_norm_without_center_or_scale_computes_keras_values(cache):
    """``center=False`` leaves out B; ``scale=False`` gets a Scale of ones (as the PyTorch exporter writes
    ``LayerNorm(elementwise_affine=False)``) made by ConstantOfShape; onnxruntime on the converted graph (whose
    small weights keep their values) gives Keras's output. Below opset 17, which has no LayerNormalization,
    Keras's arithmetic stays."""
    ort = pytest.importorskip("onnxruntime")
    np = pytest.importorskip("numpy")
    variants = {"both": {}, "gamma_only": {"center": False}, "beta_only": {"scale": False},
                "neither": {"center": False, "scale": False}}
    # one input each: tf2onnx computes the moments of one tensor once for all the layer norms that read it, and
    # shared moments stay as converted
    inputs = [keras.Input((S, D), name=name) for name in variants]
    norms = [keras.layers.LayerNormalization(name=f"{name}_norm", **kwargs)(x)
             for x, (name, kwargs) in zip(inputs, variants.items())]
    model = keras.Model(inputs, keras.layers.Add(name="sum")(norms), name="ln_variants")
    rng = np.random.default_rng(7)
    for weight in model.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    n = 2
    graph = frontend.to_onnx(model, batch=n)
    fused = {node.input[0]: node for node in graph.graph.node if node.op_type == "LayerNormalization"}
    assert list(fused["both"].input[1:]) == ["both_norm/gamma", "both_norm/beta"]
    assert list(fused["gamma_only"].input[1:]) == ["gamma_only_norm/gamma"]
    assert fused["beta_only"].input[2] == "beta_only_norm/beta" and len(fused["neither"].input) == 2
    ones = {node.output[0] for node in graph.graph.node if node.op_type == "ConstantOfShape"}
    assert {fused["beta_only"].input[1], fused["neither"].input[1]} == ones  # the Scale of ones
    data = {name: rng.normal(size=(n, S, D)).astype("float32") * 3 + 1 for name in variants}
    (got,) = ort.InferenceSession(graph.SerializeToString()).run(None, data)
    np.testing.assert_allclose(got, np.asarray(model([data[name] for name in variants])), rtol=1e-4, atol=1e-4)

    rows, elements = n * S, n * S * D
    report = from_keras(model, batch=n)
    # four LayerNormalizations, 1 per element each, and the three additions of the sum
    assert report.total.flops == 4 * elements + 3 * elements
    assert report.total.transcendentals == 4 * rows
    # gamma of two, beta of two; the ones are no weight
    assert report.params == 4 * D == model.count_params() and report.buffers == 0
    # opset 16, per layer norm of n elements in r rows: the mean (n), x − mean and its square (2n), the variance
    # (n); var + eps, sqrt, 1/sqrt and −mean (4r); x·inv and the final sum (2n); with gamma, inv·gamma (n) and
    # −mean·inv (n); without, −mean·inv per row (r); with beta, + beta (n). Both 9n + 4r, gamma only 8n + 4r,
    # beta only 7n + 5r, neither 6n + 5r; and the three additions of the sum
    old = from_keras(model, batch=n, opset=16)
    assert "LayerNormalization" not in old.by_op_type
    assert old.total.flops == (9 + 8 + 7 + 6) * elements + (4 + 4 + 5 + 5) * rows + 3 * elements


@pytest.mark.slow
def test_layer_norm_after_convolutions_computes_keras_values(cache):
    """After a convolution tf2onnx computes the moments (one of them, or both) in the convolution's channels-first
    layout and moves the per-row statistics back with Reshape nodes (and without gamma the products too, with
    Transpose nodes); the layer norm is still written as one LayerNormalization of the channels-last tensor, over
    the channels or over all of (H, W, C), and onnxruntime on the converted graph gives Keras's output."""
    ort = pytest.importorskip("onnxruntime")
    np = pytest.importorskip("numpy")
    image, sequence = keras.Input((HB, WB, CB_IN), name="image"), keras.Input((11, CB_IN), name="sequence")
    conv = keras.layers.Conv2D(CB, 3, padding="same", name="conv")(image)
    outputs = [
        keras.layers.LayerNormalization(name="channels")(conv),
        keras.layers.LayerNormalization(axis=[1, 2, 3], name="whole")(  # gamma HB·WB·3 under 1 KiB: with values
            keras.layers.Conv2D(3, 3, padding="same", name="conv_b")(image)),
        keras.layers.LayerNormalization(name="steps")(keras.layers.Conv1D(CB, 3, name="conv1d")(sequence)),
        # without gamma tf2onnx computes the products in NCHW too, and transposes them
        keras.layers.LayerNormalization(scale=False, name="shift")(
            keras.layers.Conv2D(CB, 3, padding="same", name="conv_c")(image)),
    ]
    model = keras.Model([image, sequence], outputs, name="conv_norms")
    rng = np.random.default_rng(3)
    for weight in model.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    n = 2
    graph = frontend.to_onnx(model, batch=n)
    norms = [node for node in graph.graph.node if node.op_type == "LayerNormalization"]
    assert sorted(node.input[-1] for node in norms) == ["channels/beta", "shift/beta", "steps/beta", "whole/beta"]
    assert not {"ReduceMean", "Sqrt", "Reciprocal"} & {node.op_type for node in graph.graph.node}
    data = {"image": rng.normal(size=(n, HB, WB, CB_IN)).astype("float32"),
            "sequence": rng.normal(size=(n, 11, CB_IN)).astype("float32")}
    got = ort.InferenceSession(graph.SerializeToString()).run(None, data)
    for value, expected in zip(got, model([data["image"], data["sequence"]])):
        np.testing.assert_allclose(value, np.asarray(expected), rtol=1e-4, atol=1e-4)

    report = from_keras(model, batch=n)
    pixels, steps = n * HB * WB, n * 9  # Conv1D of kernel 3 without padding: 11 − 2 steps
    convs = (2 * (2 * pixels * CB * 3 * 3 * CB_IN + pixels * CB) + (2 * pixels * 3 * 3 * 3 * CB_IN + pixels * 3)
             + (2 * steps * CB * 3 * CB_IN + steps * CB))
    # four LayerNormalizations, 1 per element; a 1/sqrt per pixel (twice), per image and per step
    assert report.total.flops == convs + 2 * pixels * CB + pixels * 3 + steps * CB
    assert report.total.transcendentals == 2 * pixels + n + steps
    assert report.params == model.count_params()


HEADS, KEY, FF = 2, 3, 11  # attention heads, key size per head, feed-forward width


def transformer_block() -> keras.Model:
    """A post-norm encoder block on S tokens of D features: self-attention (HEADS heads of KEY) and the residual,
    LayerNormalization, Dense D→FF relu → Dense FF→D and the residual, LayerNormalization."""
    x = keras.Input((S, D), name="tokens")
    attention = keras.layers.MultiHeadAttention(HEADS, KEY, name="attention")(x, x)
    y = keras.layers.LayerNormalization(epsilon=1e-6, name="norm1")(keras.layers.Add()([x, attention]))
    z = keras.layers.Dense(D, name="ff2")(keras.layers.Dense(FF, activation="relu", name="ff1")(y))
    return keras.Model(x, keras.layers.LayerNormalization(epsilon=1e-6, name="norm2")(keras.layers.Add()([y, z])),
                       name="encoder_block")


@pytest.mark.slow
def test_transformer_block_layer_norms(cache):
    n = 3
    report = from_keras(transformer_block(), batch=n)
    assert not report.unsupported
    norms = [node for node in report.nodes if node.op_type == "LayerNormalization"]
    assert len(norms) == 2 and not {"ReduceMean", "Sqrt", "Reciprocal"} & set(report.by_op_type)
    tokens, hk = n * S, HEADS * KEY
    elements = tokens * D
    assert [node.cost.flops for node in norms] == [elements, elements]
    # attention: the Q, K, V projections with bias 3·(2·tokens·D·hk + tokens·hk), the scores 2·n·HEADS·S·S·KEY
    # scaled by 1/√KEY (n·HEADS·S·S), the softmax of n·HEADS·S rows of S (5S − 2 each), the weighted sum
    # 2·n·HEADS·S·S·KEY, the output projection with bias 2·tokens·hk·D + tokens·D
    attention = (3 * (2 * tokens * D * hk + tokens * hk) + 2 * n * HEADS * S * S * KEY + n * HEADS * S * S
                 + n * HEADS * S * (5 * S - 2) + 2 * n * HEADS * S * S * KEY + 2 * tokens * hk * D + elements)
    # the feed-forward layers with bias and relu, the two residual additions, the two layer norms (1 per element)
    feed_forward = 2 * tokens * D * FF + tokens * FF + tokens * FF + 2 * tokens * FF * D + elements
    assert report.total.flops == attention + feed_forward + 2 * elements + 2 * elements
    # an exp per softmax element, a 1/sqrt per token in each layer norm
    assert report.total.transcendentals == n * HEADS * S * S + 2 * tokens
    assert report.params == transformer_block().count_params()


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
