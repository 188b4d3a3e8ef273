"""The model table of :mod:`flopcount.models.zoo` and the export command line built on it.

Parameter counts are derived here from the published architectures (and agree with the figures the original
releases quote); models are built on the meta device, so nothing is initialised or computed.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from flopcount.frontends.export import export_weightless  # noqa: E402
from flopcount.models import export, zoo  # noqa: E402

H, F = 768, 3072


def layer_params(h: int = H, f: int = F) -> int:
    """Q, K, V, output projections with bias 4·(h² + h); MLP h·f + f + f·h + h; two LayerNorms 4h."""
    return 4 * (h * h + h) + h * f + f + f * h + h + 4 * h


@pytest.mark.parametrize(
    "name, params",
    [
        # word, position (512), token-type (2) embeddings and their LayerNorm; 12 layers; pooler h² + h
        pytest.param("bert-base", (30522 + 512 + 2) * H + 2 * H + 12 * layer_params() + H * H + H, id="bert-base"),
        # token and position (1024) embeddings; 12 layers; final LayerNorm; the LM head is the token embedding
        pytest.param("gpt2-small", (50257 + 1024) * H + 12 * layer_params() + 2 * H, id="gpt2-small"),
        # patch conv 3·16·16·h + h; class token; 197 position embeddings; 12 layers; final LayerNorm; head
        pytest.param("vit-b16", 3 * 256 * H + H + H + 197 * H + 12 * layer_params() + 2 * H + H * 1000 + 1000,
                     id="vit-b16"),
        # per layer 4H·(I + H) weights and two 4H biases: 4·128·(64 + 128 + 2) + 4·128·(128 + 128 + 2)
        pytest.param("lstm", 4 * 128 * (64 + 128 + 2) + 4 * 128 * (128 + 128 + 2), id="lstm"),
        # the figures torchvision publishes for the same architectures
        pytest.param("mobilenet-v2", 3_504_872, id="mobilenet-v2"),
        pytest.param("resnext50-32x4d", 25_028_904, id="resnext50-32x4d"),
        pytest.param("resnet50", 25_557_032, id="resnet50"),
    ],
)
def test_parameter_counts(name, params):
    with torch.device("meta"):
        built = zoo.build(name)
    assert sum(p.numel() for p in built.module.parameters()) == params


def test_published_totals():
    assert layer_params() == 7_087_872
    assert (30522 + 512 + 2) * H + 2 * H + 12 * layer_params() + H * H + H == 109_482_240  # BERT-base
    assert (50257 + 1024) * H + 12 * layer_params() + 2 * H == 124_439_808  # GPT-2 small


@pytest.mark.parametrize(
    "name, options, shapes, dtype",
    [
        pytest.param("bert-base", {}, [(1, 128)], torch.long, id="bert-base"),
        pytest.param("gpt2-small", {"seq_len": 64}, [(1, 64)], torch.long, id="gpt2-short"),
        pytest.param("vit-b16", {"image_size": 64, "batch_size": 2}, [(2, 3, 64, 64)], torch.float32, id="vit-64px"),
        pytest.param("lstm", {}, [(4, 35, 64)], torch.float32, id="lstm"),
    ],
)
def test_example_inputs(name, options, shapes, dtype):
    with torch.device("meta"):
        built = zoo.build(name, **options)
    assert [tuple(x.shape) for x in built.inputs] == shapes
    assert all(x.dtype == dtype for x in built.inputs)


def test_reduced_depth():
    with torch.device("meta"):
        assert len(zoo.build("bert-base", layers=2).module.blocks) == 2
        assert zoo.build("lstm", layers=3).module.lstm.num_layers == 3


@pytest.mark.parametrize(
    "name, options, message",
    [
        pytest.param("resnet50", {"layers": 2}, "resnet50 does not take layers", id="option-not-taken"),
        pytest.param("alexnet", {}, "unknown model 'alexnet'", id="unknown-model"),
    ],
)
def test_build_rejects(name, options, message):
    with pytest.raises(ValueError, match=message):
        zoo.build(name, **options)


def test_unknown_attention_kind():
    with pytest.raises(ValueError, match="unknown attention 'flash'"):
        zoo.build("bert-base", layers=1, attention="flash")


def test_cli_rejects_an_option_the_model_does_not_take(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        export.main(["resnet50", "--layers", "2", "-o", str(tmp_path / "r.onnx")])
    assert exit_info.value.code == 2
    assert "resnet50 does not take layers" in capsys.readouterr().err


def test_cli_exports_a_text_model(tmp_path):
    path = tmp_path / "bert.onnx"
    assert export.main(["bert-base", "--layers", "1", "--seq-len", "8", "-o", str(path)]) == 0
    model = onnx.load(path, load_external_data=False)
    dims = lambda value: [d.dim_value for d in value.type.tensor_type.shape.dim]  # noqa: E731
    assert [(v.name, v.type.tensor_type.elem_type, dims(v)) for v in model.graph.input] == [
        ("input_ids", onnx.TensorProto.INT64, [1, 8])
    ]
    assert [(v.name, dims(v)) for v in model.graph.output] == [
        ("last_hidden_state", [1, 8, 768]), ("pooler_output", [1, 768])
    ]


def test_dynamo_exporter_takes_a_batch_above_one(tmp_path):
    # the exporter traces at batch 2 from the examples' first row: examples of batch 3 must not make it fail
    model = export_weightless(torch.nn.Linear(5, 7), torch.zeros(3, 5), tmp_path / "l.onnx",
                              exporter="dynamo")
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [3, 5]
