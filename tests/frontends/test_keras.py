"""The Keras frontend: ``from_keras``, its conversion cache, ``flopcount --keras``, and Keras ResNet50 (v1) against
the bundled PyTorch ResNet-50 v1.5 graph.

Expected counts are closed forms written out here from the layer sizes (distinct odd sizes in the small models).
Keras image models are channels-last: inputs are ``(N, H, W, C)``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import onnx
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("tf2onnx")

import flopcount
from flopcount import FrontendError, UsageError, count, from_keras
from flopcount.cli import main
from flopcount.frontends import keras as frontend

tf, keras, tf2onnx = frontend.import_frameworks()

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNDLED = os.path.join(ROOT, "examples", "resnet50-v1.5.onnx")

H, W, C_IN, C_OUT, CLASSES = 7, 9, 3, 5, 7


# ---------------------------------------------------------------------------------------------------------------
# A small model with closed-form FLOPs
# ---------------------------------------------------------------------------------------------------------------


def small_cnn() -> keras.Model:
    """Conv 3→5 (3x3, same, bias) → ReLU → MaxPool 2 → Flatten → Dense 60→7, on (N, 7, 9, 3) images."""
    image = keras.Input((H, W, C_IN), name="image")
    y = keras.layers.Conv2D(C_OUT, 3, padding="same", name="conv")(image)
    y = keras.layers.ReLU()(y)
    y = keras.layers.MaxPooling2D(2)(y)  # valid: 7x9 -> 3x4
    y = keras.layers.Flatten()(y)
    return keras.Model(image, keras.layers.Dense(CLASSES, name="head")(y), name="small_cnn")


def cnn_flops(n: int) -> int:
    s_out = H * W  # "same" 3x3 keeps 7x9
    conv = 2 * n * C_OUT * s_out * 3 * 3 * C_IN + n * C_OUT * s_out  # products + bias
    relu = n * C_OUT * s_out
    pooled = n * C_OUT * (H // 2) * (W // 2)  # 3x4
    pool = 2 * 2 * pooled  # a 2x2 window read per output
    features = C_OUT * (H // 2) * (W // 2)  # 60
    dense = 2 * n * features * CLASSES + n * CLASSES
    return conv + relu + pool + dense


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh conversion cache per test, also as $FLOPCOUNT_CACHE (so nothing goes to ~/.cache)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(frontend.common.CACHE_ENV, str(folder))
    return folder


@pytest.fixture
def conversions(monkeypatch):
    """Counts the real conversions (cache misses)."""
    calls = []
    real = frontend._convert

    def counting(model, inputs, training, opset):
        calls.append((model.name, tuple(i.shape for i in inputs), training))
        return real(model, inputs, training, opset)

    monkeypatch.setattr(frontend, "_convert", counting)
    return calls


def test_small_cnn_closed_form_at_the_default_batch_of_1(cache):
    report = from_keras(small_cnn())
    # 2·5·63·27 + 5·63 + 5·63 + 4·5·12 + 2·60·7 + 7 = 17,010 + 315 + 315 + 240 + 840 + 7
    assert report.total.flops == cnn_flops(1) == 18_727
    assert report.total.macs == 5 * 63 * 27 + 60 * 7
    assert report.batch == 1 and report.model.inputs[0].name == "image"
    assert report.model.inputs[0].shape == (1, H, W, C_IN)
    assert report.model.outputs[0].name == "head"
    assert report.params == small_cnn().count_params() == 3 * 3 * 3 * 5 + 5 + 60 * 7 + 7
    assert not report.unsupported


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"batch": 3}, id="batch"),
        pytest.param({"input_shapes": (3, H, W, C_IN)}, id="shape"),
        pytest.param({"input_shapes": {"image": (None, H, W, C_IN)}, "batch": 3}, id="mapping-with-open-batch"),
    ],
)
def test_small_cnn_at_batch_3(cache, kwargs):
    report = from_keras(small_cnn(), **kwargs)
    assert report.total.flops == cnn_flops(3) == 3 * 18_727
    assert report.per_sample.flops == cnn_flops(1)


def test_weights_are_references_or_small_values():
    model = frontend.to_onnx(small_cnn(), cache_dir=False)
    initializers = {t.name: t for t in model.graph.initializer}
    # the initializers are the Keras variables, named by their paths, and nothing else
    assert sorted(initializers) == ["conv/bias", "conv/kernel", "head/bias", "head/kernel"]
    head = initializers["head/kernel"]  # 60·7·4 = 1680 bytes: a reference to a file that is never written
    assert head.data_location == onnx.TensorProto.EXTERNAL and list(head.dims) == [60, 7] and not head.raw_data
    assert initializers["conv/kernel"].data_location != onnx.TensorProto.EXTERNAL  # 540 bytes stay inline
    assert [i.name for i in model.graph.input] == ["image"]


def test_subclassed_model_is_built_from_input_shapes(cache):
    class TwoInputs(keras.Model):
        def __init__(self):
            super().__init__(name="two_inputs")
            self.dense = keras.layers.Dense(3)

        def call(self, features, gate):
            return self.dense(features) * gate

    with pytest.raises(UsageError, match="has no inputs to read shapes from"):
        from_keras(TwoInputs())
    report = from_keras(TwoInputs(), [(5, 11), (5, 3)])
    # Dense 11→3 on 5 rows: 2·5·11·3 + 5·3 (bias), then the gate: 5·3
    assert report.total.flops == 2 * 5 * 11 * 3 + 5 * 3 + 5 * 3
    assert [i.name for i in report.model.inputs] == ["features", "gate"]


# ---------------------------------------------------------------------------------------------------------------
# Training graphs
# ---------------------------------------------------------------------------------------------------------------


def mlp() -> keras.Model:
    """Dense 5→7 → BatchNormalization → Dropout 0.25 → Dense 7→3."""
    x = keras.Input((5,), name="features")
    y = keras.layers.Dense(7, name="hidden")(x)
    y = keras.layers.BatchNormalization(name="bn")(y)
    y = keras.layers.Dropout(0.25)(y)
    return keras.Model(x, keras.layers.Dense(3, name="out")(y), name="mlp")


def test_training_graph_has_batch_moments_and_dropout(cache):
    n = 9
    trained = from_keras(mlp(), (n, 5), training=True)
    inference = from_keras(mlp(), (n, 5))
    assert trained.mode == "train" and inference.mode == "inference"
    # Dropout's mask (StatelessRandomUniformV2, mapped to RandomUniform) and BatchNormalization's batch moments
    assert {"RandomUniform", "ReduceMean"} <= set(trained.by_op_type)
    assert not {"RandomUniform", "ReduceMean"} & set(inference.by_op_type)
    assert not trained.unsupported and not trained.backward_unsupported
    gemm = trained.by_op_type["Gemm"]
    assert gemm.cost.macs == n * 5 * 7 + n * 7 * 3
    # the first Dense is fed by data: weight gradient only; the second: input and weight gradients
    assert gemm.backward.macs == n * 5 * 7 + 2 * n * 7 * 3
    # trainable: two kernels and biases, gamma and beta (the model's trainable_weights); the moving
    # statistics are buffers
    assert trained.trainable_params == (5 * 7 + 7) + (7 * 3 + 3) + 2 * 7
    assert trained.params == inference.params == trained.trainable_params
    assert inference.buffers == 2 * 7


def test_mode_train_implies_a_training_graph(cache, conversions):
    from_keras(mlp(), (9, 5), mode="train")
    assert conversions[-1][2] is True


# ---------------------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------------------


def test_second_call_hits_the_cache(cache, conversions):
    model = small_cnn()
    first = from_keras(model)
    second = from_keras(model)
    assert len(conversions) == 1 and first.total == second.total
    (entry,) = cache.glob("keras-*.onnx")
    assert entry.stat().st_size < 20_000
    from_keras(model, batch=3)  # another shape: another graph
    from_keras(model, training=True)  # another mode: another graph
    assert len(conversions) == 3 and len(list(cache.glob("keras-*.onnx"))) == 3


def test_cache_hit_in_a_new_process(cache, factories):
    """Layer names are part of the key (they name the graph's tensors); Keras numbers unnamed layers per process, so
    the same factory gives the same key in every process (the CLI's case)."""
    for _ in range(2):
        subprocess.run([sys.executable, "-m", "flopcount", "--keras", f"{factories}:cnn"], check=True,
                       capture_output=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert len(list(cache.glob("keras-*.onnx"))) == 1


def test_cache_disabled(cache, conversions):
    from_keras(small_cnn(), cache_dir=False)
    from_keras(small_cnn(), cache_dir=False)
    assert len(conversions) == 2 and not cache.exists()


# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------


def qr_net() -> keras.Model:
    """tf.linalg.qr (TensorFlow op Qr) has no conversion in tf2onnx 1.17."""
    x = keras.Input((4, 4), name="x")
    return keras.Model(x, keras.layers.Lambda(lambda t: keras.ops.qr(t)[1])(x), name="qr_net")


def test_failing_conversion_names_keras_tf2onnx_and_the_op(cache, capfd):
    with pytest.raises(FrontendError) as caught:
        from_keras(qr_net())
    message = str(caught.value)
    assert message.startswith("keras: cannot convert qr_net to ONNX: TensorFlow op Qr has no ONNX conversion in tf2onnx")
    assert "(tf2onnx: Tensorflow op [" in message and "\n" not in message
    assert caught.value.exit_code == 9
    out, err = capfd.readouterr()
    assert "Qr" not in out + err  # tf2onnx's own log lines stay out of the output


@pytest.mark.parametrize(
    "make, input_shapes, message",
    [
        pytest.param(small_cnn, (1, 8, 9, 3), "input 'image' of small_cnn has shape (None, 7, 9, 3); got (1, 8, 9, 3)",
                     id="wrong-shape"),
        pytest.param(small_cnn, {"picture": (1, 7, 9, 3)}, "small_cnn has no input named 'picture'; its inputs: image",
                     id="unknown-name"),
        pytest.param(small_cnn, "1x7x9x3", "input_shapes must be a shape", id="not-a-shape"),
        pytest.param(lambda: keras.Sequential([keras.Input((None, 3), name="seq"), keras.layers.Dense(2)], name="seq_net"),
                     None,
                     "input 'seq' of seq_net has shape (1, None, 3): dim 1 is open (the model takes any size there); "
                     "give it: --input-shape seq=1xLx3 or input_shapes={'seq': (1, L, 3)} with your L", id="open-dim"),
    ],
)
def test_usage_errors(make, input_shapes, message):
    with pytest.raises(UsageError) as caught:
        from_keras(make(), input_shapes, cache_dir=False)
    assert message in str(caught.value)


def test_not_a_keras_model():
    with pytest.raises(UsageError, match="keras: expected a keras.Model, got object"):
        from_keras(object())


def test_missing_tensorflow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes ``import tensorflow`` raise ImportError
    with pytest.raises(FrontendError, match=r'keras: TensorFlow is not installed; pip install "flopcount\[tf\]"'):
        from_keras(object())


def test_flopcount_import_does_not_import_tensorflow():
    code = ("import sys, flopcount, flopcount.frontends.keras, flopcount.models.keras_models; "
            "print(sorted({'tensorflow', 'keras', 'tf2onnx'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A module of Keras factories importable by a name unique to the test."""
    name = f"fc_keras_factories_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import keras

        def cnn():
            image = keras.Input(({H}, {W}, {C_IN}), name="image")
            y = keras.layers.Conv2D({C_OUT}, 3, padding="same")(image)
            y = keras.layers.MaxPooling2D(2)(keras.layers.ReLU()(y))
            return keras.Model(image, keras.layers.Dense({CLASSES})(keras.layers.Flatten()(y)))

        def broken():
            x = keras.Input((4, 4), name="x")
            return keras.Model(x, keras.layers.Lambda(lambda t: keras.ops.qr(t)[1])(x), name="qr_net")

        def not_a_model():
            return 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.mark.parametrize(
    "extra, n",
    [
        pytest.param([], 1, id="default-batch-1"),
        pytest.param(["--input-shape", f"image=3x{H}x{W}x{C_IN}"], 3, id="input-shape"),
        pytest.param(["--batch", "3"], 3, id="batch"),
    ],
)
def test_cli_keras(cache, factories, capsys, extra, n):
    assert main(["--keras", f"{factories}:cnn", "--format", "json", *extra]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total"]["flops"] == cnn_flops(n)
    assert report["model"]["inputs"][0] == {"name": "image", "dtype": "float", "shape": [n, H, W, C_IN]}


def test_cli_keras_failing_conversion_exit_9(cache, factories, capsys):
    assert main(["--keras", f"{factories}:broken"]) == 9
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("flopcount: error: keras: cannot convert qr_net to ONNX")
    assert "TensorFlow op Qr" in err and "tf2onnx" in err


def test_cli_keras_usage(factories, capsys):
    assert main(["--keras", f"{factories}:not_a_model"]) == 2
    assert "the factory returned a int, not a keras.Model" in capsys.readouterr().err
    assert main(["model.onnx", "--keras", f"{factories}:cnn"]) == 2
    assert "not both" in capsys.readouterr().err


def test_cli_missing_tensorflow(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    assert main(["--keras", "m:f"]) == 9
    assert 'pip install "flopcount[tf]"' in capsys.readouterr().err


def test_public_names():
    assert flopcount.from_keras is from_keras


# ---------------------------------------------------------------------------------------------------------------
# Keras ResNet50 (v1) against the bundled PyTorch ResNet-50 v1.5
# ---------------------------------------------------------------------------------------------------------------

STAGES = [(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)]  # blocks, width, stride of the first block


def resnet50(version: str, hw: int = 224) -> dict:
    """Per-layer closed forms at batch 1: each conv's MACs, output size and channels (each conv is followed by a
    BatchNormalization), and the ReLU and residual-add elements. v1 strides the first 1x1 conv of a downsampling
    block, so it runs at the output resolution ``ho``; v1.5 runs it at the input resolution ``h``."""
    a = {"conv_macs": [], "conv_out": [], "channels": [], "relu": 0, "add": 0}

    def conv(macs: int, c_out: int, side: int) -> None:
        a["conv_macs"].append(macs)
        a["conv_out"].append(c_out * side * side)
        a["channels"].append(c_out)

    h = hw // 2  # stem 7x7/2
    conv(h * h * 64 * 3 * 7 * 7, 64, h)
    a["relu"] += 64 * h * h
    h //= 2  # max pool 3x3/2
    c_in = 64
    for blocks, w, stride in STAGES:
        for b in range(blocks):
            ho = h // (stride if b == 0 else 1)
            h1 = ho if version == "v1" else h  # where the first 1x1 runs
            conv(h1 * h1 * w * c_in, w, h1)
            conv(ho * ho * w * w * 9, w, ho)
            conv(ho * ho * 4 * w * w, 4 * w, ho)
            if b == 0:
                conv(ho * ho * 4 * w * c_in, 4 * w, ho)  # projection shortcut, 1x1 stride s
            a["relu"] += w * h1 * h1 + w * ho * ho + 4 * w * ho * ho  # the last after the residual add
            a["add"] += 4 * w * ho * ho
            c_in, h = 4 * w, ho
    return a


@pytest.fixture(scope="module")
def resnet():
    from flopcount.models.keras_models import resnet50_keras

    model = resnet50_keras()
    return model, frontend.to_onnx(model, cache_dir=False)  # batch 1: 1x224x224x3


def test_keras_resnet50_is_v1_with_biases(resnet):
    model, _ = resnet
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert len(convs) == 53 and all(layer.use_bias for layer in convs)
    for stage in (3, 4, 5):  # the downsampling blocks: stride 2 on the first 1x1, none on the 3x3
        assert model.get_layer(f"conv{stage}_block1_1_conv").strides == (2, 2)
        assert model.get_layer(f"conv{stage}_block1_1_conv").kernel_size == (1, 1)
        assert model.get_layer(f"conv{stage}_block1_2_conv").strides == (1, 1)


def test_conv_macs_differ_from_v1_5_by_exactly_the_stride_placement(resnet):
    _, graph = resnet
    keras_report, torch_report = count(graph), count(BUNDLED)
    v1, v1_5 = resnet50("v1")["conv_macs"], resnet50("v1.5")["conv_macs"]
    # every one of the 53 convolutions is the v1 closed form (as a multiset: node order may differ)
    assert sorted(n.cost.macs for n in keras_report.nodes if n.op_type == "Conv") == sorted(v1)
    keras_macs = keras_report.by_op_type["Conv"].cost.macs
    torch_macs = torch_report.by_op_type["Conv"].cost.macs
    assert (keras_macs, torch_macs) == (sum(v1), sum(v1_5)) == (3_855_925_248, 4_087_136_256)
    # In each downsampling block (first block of stages 2-4; output h x h, input 2h x 2h, C_in channels in, width w)
    # only the first 1x1 conv differs: v1.5 runs it at the input resolution, v1 at the output resolution (the 3x3,
    # the last 1x1 and the shortcut run at h x h in both):
    #   (2h)²·C_in·w − h²·C_in·w = 3·h²·C_in·w
    per_block = [3 * h * h * c_in * w for h, c_in, w in [(28, 256, 128), (14, 512, 256), (7, 1024, 512)]]
    assert per_block == [77_070_336] * 3  # 3·28²·256·128 = 3·14²·512·256 = 3·7²·1024·512
    assert torch_macs - keras_macs == sum(per_block) == 231_211_008


def test_dense_convention_products_only(resnet):
    _, graph = resnet
    # products only (no bias, normalization, activation, pooling or softmax): the convolutions and the Dense layer
    keras_dense = count(graph, convention="dense").total.flops
    torch_dense = count(BUNDLED, convention="dense").total.flops
    assert keras_dense == 2 * (3_855_925_248 + 2048 * 1000)
    assert torch_dense - keras_dense == 2 * 231_211_008


def test_keras_resnet50_total_closed_form(resnet):
    """Everything else that differs from the PyTorch graph, term by term (default convention, batch 1)."""
    model, graph = resnet
    report = count(graph)
    a = resnet50("v1")
    # every conv has a bias: + N·C_out·H·W, each conv's output size (the stem's bias is a separate Add node)
    conv = 2 * sum(a["conv_macs"]) + sum(a["conv_out"])
    # BatchNormalization after every conv: Keras computes x·inv + (beta − mean·inv), which the frontend writes as
    # the ONNX BatchNormalization operator, 1 per element, as in the PyTorch graph
    batch_norm = sum(a["conv_out"])
    max_pool = 9 * 64 * 56 * 56  # ZeroPadding2D(1) + valid 3x3/2 (114 → 56): the same 9 reads per output
    global_pool = 7 * 7 * 2048  # GlobalAveragePooling2D: ReduceMean over H and W
    dense = 2 * 2048 * 1000 + 1000
    softmax = 5 * 1000 - 2  # Keras's classifier ends with a softmax; the PyTorch graph's does not
    expected = conv + batch_norm + a["relu"] + a["add"] + max_pool + global_pool + dense + softmax
    assert report.total.flops == expected == 7_753_634_670
    assert report.total.transcendentals == sum(a["channels"]) + 1000  # square roots; the softmax's exponentials
    assert not report.unsupported
    # parameters: the PyTorch model's plus a bias per conv output channel; buffers: BatchNorm's moving
    # statistics (Keras' non-trainable weights), as in the PyTorch graph, when the trainable weights are
    # named (from_keras does); from the graph alone the statistics, which Keras' inference graph reads
    # through Add and Sqrt as per-channel vectors, count as parameters (README, "Parameters")
    named = count(graph, trainable=[w.path for w in model.trainable_weights])
    assert named.params == count(BUNDLED).params + sum(a["channels"]) == 25_557_032 + 26_560
    assert named.buffers == count(BUNDLED).buffers == 2 * sum(a["channels"]) == 53_120
    # from_keras names the trainable weights, so its report is the named one
    assert (report.params, report.buffers) == (named.params, named.buffers)
    assert named.params + named.buffers == model.count_params() == 25_636_712


def test_keras_resnet50_training_products_closed_form():
    # Training graph of Keras ResNet50 (v1): every convolution and the Dense layer compute dX and dW (each
    # equal to their forward MACs) except the first convolution, fed by the image, which computes dW only.
    from flopcount.models.keras_models import resnet50_keras

    report = from_keras(resnet50_keras(), mode="train", convention="dense", cache_dir=False)
    v1 = resnet50("v1")["conv_macs"]
    forward_macs = sum(v1) + 2048 * 1000
    assert report.forward.flops == 2 * forward_macs
    assert report.backward.flops == 2 * (2 * forward_macs - v1[0])  # v1[0] = 112·112·64·3·49, no dX
    assert not report.backward_unsupported
