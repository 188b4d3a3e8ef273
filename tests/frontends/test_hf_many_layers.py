"""A configuration of more layers than are built (above ``MAX_BUILT_LAYERS``): its layers are decided from a probe of
fewer, the full model is never built, and the count is extended to the configuration's own L; above ``MAX_LAYERS``
it is exit 13 with the limit."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

from flopcount.cli import main  # noqa: E402
from flopcount.frontends import hf  # noqa: E402


def small_llama(layers: int) -> dict:
    document = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                        num_key_value_heads=4, num_hidden_layers=layers, vocab_size=256,
                                        max_position_embeddings=64).to_dict()
    document["architectures"] = ["LlamaForCausalLM"]
    return document


def test_many_layers_count_from_a_probe_without_building_them(monkeypatch):
    layers = hf.MAX_BUILT_LAYERS + 88
    built = []
    real = hf.build_model

    def recording(config, **kwargs):
        built.append(config.num_hidden_layers)
        return real(config, **kwargs)

    monkeypatch.setattr(hf, "build_model", recording)
    report = hf.from_hf(small_llama(layers), {"input_ids": (1, 8)}, cache_dir=False)
    assert max(built) <= hf.MAX_BUILT_LAYERS  # never the full model
    assert report.layers.layers == layers and report.layers.method == "extended"
    # C(L) = C(1) + (L - 1) (C(2) - C(1)), C(1) and C(2) from whole exports of 1 and 2 layers
    one, two = (hf.from_hf(small_llama(n), {"input_ids": (1, 8)}, cache_dir=False, repeated_layers="export")
                for n in (1, 2))
    assert report.forward.flops == one.forward.flops + (layers - 1) * (two.forward.flops - one.forward.flops)
    assert report.params == one.params + (layers - 1) * (two.params - one.params)


@pytest.mark.parametrize("layers", [10**5, 10**9])
def test_layers_beyond_the_limit_are_exit_13_with_it(tmp_path, capsys, layers):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_llama(layers)))
    code = main(["--hf", str(path), "--input-shape", "input_ids=1x8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 13 and len(err) == 1
    assert f"num_hidden_layers is {layers}, above the limit of {hf.MAX_LAYERS}" in err[0]
