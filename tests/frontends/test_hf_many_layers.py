"""A configuration of more layers than are built (above ``MAX_BUILT_LAYERS``): its layers are decided from a probe of
fewer, the full model is never built, and the count is extended to the configuration's own L; above ``MAX_LAYERS``
it is exit 13 with the limit."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

from flopcount.cli import main  # noqa: E402
from flopcount.frontends import hf  # noqa: E402
from helpers import refusal_lines  # noqa: E402


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


HUGE = [pytest.param(10**5, id="1e5-layers"), pytest.param(10**9, id="1e9-layers")]
SHAPES = {"input_ids": (1, 8)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One export cache for the counts of many layers (their 1- and 2-layer models are the same graphs)."""
    return tmp_path_factory.mktemp("cache")


#: train mode exports again (its graph is another): in CI's pinned lane only
MODES = [pytest.param("inference"), pytest.param("train", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def exported():
    """C(1) and C(2) of a mode: whole exports of 1 and 2 layers, without a cache, independent of the extension."""
    memo = {}

    def of(mode: str):
        if mode not in memo:
            memo[mode] = tuple(hf.from_hf(small_llama(n), SHAPES, cache_dir=False, repeated_layers="export",
                                          mode=mode) for n in (1, 2))
        return memo[mode]

    return of


def closed_form(one, two, layers: int, figure) -> int:
    """C(L) = C(1) + (L - 1) (C(2) - C(1))."""
    return figure(one) + (layers - 1) * (figure(two) - figure(one))


def _config(tmp_path, layers: int):
    import json

    path = tmp_path / f"llama-{layers}.json"
    path.write_text(json.dumps(small_llama(layers)))
    return path


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layers", HUGE)
def test_a_huge_stack_counts_through_the_api_in_seconds(exported, cache, mode, layers):
    import time

    start = time.perf_counter()
    report = hf.from_hf(small_llama(layers), SHAPES, cache_dir=cache, mode=mode)
    elapsed = time.perf_counter() - start
    one, two = exported(mode)
    assert report.layers.layers == layers and report.layers.method == "extended"
    for figure in (lambda r: r.forward.flops, lambda r: r.forward.macs, lambda r: r.backward.flops,
                   lambda r: r.total.transcendentals, lambda r: r.params, lambda r: r.trainable_params):
        assert figure(report) == closed_form(one, two, layers, figure)
    # per operator type: L × what a layer adds, and the rest (what 1 layer's graph holds beside its layer)
    for key in set(one.by_op_type) | set(two.by_op_type) | set(report.by_op_type):
        n1, n2 = (r.by_op_type[key].nodes if key in r.by_op_type else 0 for r in (one, two))
        got = report.by_op_type[key].nodes if key in report.by_op_type else 0
        assert got == layers * (n2 - n1) + (n1 - (n2 - n1)), key
    assert len(report.nodes) == len(one.nodes) + (layers - 1) * (len(two.nodes) - len(one.nodes))
    # the nodes are read on demand: the last layer's, renamed, and the tail after the stack
    last = report.nodes[-1]
    assert last.index == len(report.nodes) - 1 and last.name == two.nodes[-1].name
    inside = [n for n in report.nodes[len(report.nodes) - 200:] if n.name.endswith(f"@model.layers.{layers - 1}")]
    assert inside and all("@model.layers." in n.name for n in inside)
    rows = report.by_module(1)
    assert sum(r.flops for r in rows if r.depth == 1) == report.total.flops
    assert sum(r.params for r in rows if r.depth == 1) == report.params
    assert elapsed < 120  # the exports of 1 and 2 layers and of the probe's; nothing grows with L


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layers", HUGE)
def test_a_huge_stack_counts_from_the_command_line(tmp_path, capsys, monkeypatch, exported, cache, mode, layers):
    import json

    monkeypatch.setenv("FLOPCOUNT_CACHE", str(cache))
    code = main(["--hf", str(_config(tmp_path, layers)), "--input-shape", "input_ids=1x8", "--mode", mode,
                 "--format", "json", "--by-module"])
    out = capsys.readouterr().out
    assert code == 0
    assert len(out) < 64_000  # small: no listing grows with L
    doc = json.loads(out)
    one, two = exported(mode)
    assert doc["total"]["flops"] == closed_form(one, two, layers, lambda r: r.total.flops)
    assert doc["total"]["params"] == closed_form(one, two, layers, lambda r: r.params)
    assert doc["layers"]["layers"] == layers
    top = [m for m in doc["modules"] if m["depth"] == 1]
    assert sum(m["flops"] for m in top) == doc["total"]["flops"]


@pytest.mark.parametrize("flags", [pytest.param(["--per-node"], id="per-node"),
                                   pytest.param(["--depth", "2"], id="depth-2"),
                                   pytest.param(["--memory"], id="memory")])
def test_a_listing_of_every_layer_is_refused_in_one_line(tmp_path, capsys, monkeypatch, cache, flags):
    monkeypatch.setenv("FLOPCOUNT_CACHE", str(cache))
    code = main(["--hf", str(_config(tmp_path, 10**5)), "--input-shape", "input_ids=1x8", *flags])
    err = refusal_lines(capsys.readouterr().err)
    assert code == 2 and len(err) == 1, err
    assert flags[0] in err[0] and "above the limit of 1,000,000" in err[0]


@pytest.mark.parametrize("layers", [hf.MAX_LAYERS + 1, 10**12])

def test_layers_beyond_the_limit_are_exit_13_with_it(tmp_path, capsys, layers):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_llama(layers)))
    code = main(["--hf", str(path), "--input-shape", "input_ids=1x8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 13 and len(err) == 1
    assert f"num_hidden_layers is {layers}, above the limit of {hf.MAX_LAYERS}" in err[0]
