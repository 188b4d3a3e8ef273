"""A ``--hf`` count served from the export cache's recipe (:mod:`flopcount.frontends.hf_cache`): the same report as
the count made from the model, without importing torch or transformers; a changed configuration, call, installed
version or cache format misses."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import flopcount
from flopcount.frontends import common, hf_cache
from flopcount.output.render import to_dict

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

H, HEADS, KV_HEADS, FFN, VOCAB, S = 64, 4, 2, 176, 97, 11

#: One count in a fresh interpreter: its figures and which of the two frameworks it imported.
_CHILD = textwrap.dedent("""
    import json, sys
    import flopcount
    r = flopcount.from_hf(sys.argv[1], {"input_ids": (1, %d)}, mode="train", convention="dense", cache_dir=sys.argv[2])
    print(json.dumps({"forward": r.forward.flops, "backward": r.backward.flops, "params": r.params,
                      "layers": r.layers.method if r.layers else None,
                      "imported": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
""" % S)


def _folder(tmp_path, layers: int = 3, ffn: int = FFN):
    folder = tmp_path / f"llama-{layers}-{ffn}"
    transformers.LlamaConfig(hidden_size=H, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=HEADS,
                             num_key_value_heads=KV_HEADS, vocab_size=VOCAB).save_pretrained(folder)
    return folder


def _dense_forward(layers: int, ffn: int = FFN) -> int:
    """2·S·(matrix parameters) + the two attention products per layer (closed form, as in test_hf.py)."""
    kv = H // HEADS * KV_HEADS
    layer = 2 * S * (2 * H * H + 2 * H * kv) + 2 * S * 3 * H * ffn + 2 * 2 * S * S * H
    return layers * layer + 2 * S * H * VOCAB


def _child(folder, cache) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(folder), str(cache)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_repeated_count_imports_neither_framework_and_a_changed_configuration_misses(tmp_path):
    cache = tmp_path / "cache"
    folder = _folder(tmp_path)
    first = flopcount.from_hf(folder, {"input_ids": (1, S)}, mode="train", convention="dense", cache_dir=cache)
    assert len(list(cache.glob("hf-*.json"))) == 1
    again = _child(folder, cache)  # a fresh interpreter
    assert again["imported"] == []
    assert again["forward"] == first.forward.flops == _dense_forward(3)
    assert again["backward"] == first.backward.flops == 2 * again["forward"]  # dense: both operands need a gradient
    assert again["params"] == first.params
    assert again["layers"] == first.layers.method == "extended"
    # the same configuration with another MLP width: a miss, counted from the model
    (folder / "config.json").write_text((folder / "config.json").read_text().replace(f": {FFN},", ": 200,"))
    changed = flopcount.from_hf(folder, {"input_ids": (1, S)}, mode="train", convention="dense", cache_dir=cache)
    assert changed.forward.flops == _dense_forward(3, ffn=200)
    assert len(list(cache.glob("hf-*.json"))) == 2


@pytest.mark.parametrize("layers", [3, 2], ids=["extended", "exported-whole"])
def test_the_served_report_is_the_report_counted_from_the_model(tmp_path, layers):
    folder = _folder(tmp_path, layers)
    kwargs = dict(mode="train", convention="dense", memory=True, optimizer="adamw")
    made = flopcount.from_hf(folder, {"input_ids": (1, S)}, cache_dir=False, **kwargs)
    flopcount.from_hf(folder, {"input_ids": (1, S)}, cache_dir=tmp_path / "cache", **kwargs)  # writes the recipe
    served = flopcount.from_hf(folder, {"input_ids": (1, S)}, cache_dir=tmp_path / "cache", **kwargs)
    assert to_dict(served, per_node=True, by_module=2) == to_dict(made, per_node=True, by_module=2)
    assert served.forward.flops == _dense_forward(layers)


def test_a_served_count_says_so_and_a_damaged_recipe_is_a_warning_then_a_recount(tmp_path, caplog):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    flopcount.from_hf(folder, (1, S), convention="dense", cache_dir=cache)
    with caplog.at_level("INFO", logger="flopcount.frontends.hf"):
        served = flopcount.from_hf(folder, (1, S), convention="dense", cache_dir=cache)
    assert "counted from the export cache, without building the model" in caplog.text
    assert served.forward.flops == _dense_forward(3)
    (recipe,) = cache.glob("hf-*.json")
    recipe.write_text(recipe.read_text()[:-20])
    caplog.clear()
    again = flopcount.from_hf(folder, (1, S), convention="dense", cache_dir=cache)
    assert f"ignoring the export cache recipe {recipe}" in caplog.text
    assert again.forward.flops == _dense_forward(3)
    assert json.loads(recipe.read_text())["key"]  # written again, whole


def test_a_recipe_whose_export_is_gone_recounts(tmp_path):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    flopcount.from_hf(folder, (1, S), convention="dense", cache_dir=cache)
    for entry in cache.glob("torch-*.onnx"):
        entry.unlink()
    assert flopcount.from_hf(folder, (1, S), convention="dense", cache_dir=cache).forward.flops == _dense_forward(3)
    assert len(list(cache.glob("torch-*.onnx"))) == 2  # the 1- and 2-layer exports, made again


def _key(folder, **changed):
    from flopcount.options import CountOptions

    call = dict(config=folder, input_shapes={"input_ids": (1, S)}, options=CountOptions(mode="train"), training=None,
                export={}, repeated_layers="extend", trust_remote_code=False)
    call.update(changed)
    return hf_cache.recipe_key(hf_cache.RecipeCall(**call))


def test_the_key_changes_with_the_configuration_the_call_the_versions_and_the_formats(tmp_path, monkeypatch):
    from flopcount.options import CountOptions

    folder = _folder(tmp_path)
    key = _key(folder)
    assert key == _key(folder / "config.json") == _key(str(folder))  # the same file, however named
    document = json.loads((folder / "config.json").read_text())
    other = dict(document, rms_norm_eps=1e-5 if document["rms_norm_eps"] != 1e-5 else 1e-6)
    (tmp_path / "other.json").write_text(json.dumps(other))
    changed = {
        "config": _key(tmp_path / "other.json"),
        "shapes": _key(folder, input_shapes={"input_ids": (1, S + 1)}),
        "mode": _key(folder, options=CountOptions(mode="inference")),
        "batch": _key(folder, options=CountOptions(mode="train", batch=2)),
        "training": _key(folder, training=False),
        "opset": _key(folder, export={"opset": 17}),
        "repeated_layers": _key(folder, repeated_layers="export"),
    }
    real = common.dist_version
    for name in hf_cache.VERSIONED:
        monkeypatch.setattr(common, "dist_version", lambda d, name=name: "0.0.1" if d == name else real(d))
        changed[f"{name} version"] = _key(folder)
    monkeypatch.setattr(common, "dist_version", real)
    monkeypatch.setattr(hf_cache, "CACHE_FORMAT", hf_cache.CACHE_FORMAT + 1)
    changed["export cache format"] = _key(folder)
    monkeypatch.undo()
    monkeypatch.setattr(hf_cache, "RECIPE_FORMAT", hf_cache.RECIPE_FORMAT + 1)
    changed["recipe format"] = _key(folder)
    monkeypatch.undo()
    monkeypatch.setattr(hf_cache, "_sources_digest", lambda: "0" * 64)  # an edited frontend
    changed["sources"] = _key(folder)
    assert all(k is not None and k != key for k in changed.values()), changed
    assert len(set(changed.values())) == len(changed)


def test_no_recipe_for_remote_code_a_hub_id_or_a_configuration_object(tmp_path):
    folder = _folder(tmp_path)
    document = json.loads((folder / "config.json").read_text())
    (tmp_path / "remote.json").write_text(json.dumps(dict(document, auto_map={"AutoConfig": "x.Config"})))
    assert _key(tmp_path / "remote.json") is None
    assert _key("meta-llama/Llama-3-8B") is None
    assert _key(transformers.LlamaConfig()) is None
    assert _key(document) is not None  # a dict: its canonical JSON
