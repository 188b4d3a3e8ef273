"""``--hf`` configurations: read as transformers reads them (special floats written as ``{"__float__": ...}``), and
every malformed one refused with exit 13 (2 for ``--generate``) in one line naming the field, never an internal
error."""

from __future__ import annotations

import json
import math

import pytest

from flopcount.cli import main

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")


def run(capsys, argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def small_llama(**fields) -> dict:
    document = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                        num_key_value_heads=4, num_hidden_layers=2, vocab_size=256,
                                        max_position_embeddings=64).to_dict()
    document["architectures"] = ["LlamaForCausalLM"]
    document.update(fields)
    return document


def written(tmp_path, document, name="config.json") -> str:
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


def check_refused(capsys, argv, code, fragments):
    got, out, err = run(capsys, argv)
    assert got == code, err
    assert out == "" and "Traceback" not in err and "internal error" not in err
    lines = err.strip().splitlines()
    assert len(lines[-1:]) == 1 and lines[-1].startswith("flopcount: error: "), err
    if code != 2:
        assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[-1], err


NO_HEAD_DIM = {"head_dim": None}


@pytest.mark.parametrize("fields, fragments", [
    pytest.param({"model_type": ["llama"]}, ["model_type must be a string", "['llama']"], id="model_type-list"),
    pytest.param({"model_type": 7}, ["model_type must be a string", "int 7"], id="model_type-int"),
    pytest.param({"architectures": ["pipeline"]}, ["architectures names 'pipeline'", "not a model class"],
                 id="architectures-pipeline"),
    pytest.param({"architectures": ["AutoTokenizer"]}, ["architectures names 'AutoTokenizer'", "not a model class"],
                 id="architectures-AutoTokenizer"),
    pytest.param({"architectures": ["Trainer"]}, ["architectures names 'Trainer'", "not a model class"],
                 id="architectures-Trainer"),
    pytest.param({"architectures": "LlamaForCausalLM"}, ["architectures must be a list"], id="architectures-string"),
    pytest.param({"hidden_size": -64}, ["hidden_size is -64"], id="hidden_size-negative"),
    pytest.param({"hidden_size": 10**12, **NO_HEAD_DIM}, ["hidden_size is 1000000000000"], id="hidden_size-1e12"),
    pytest.param({"hidden_size": 1e12}, ["hidden_size"], id="hidden_size-1e12-float"),
])
def test_a_malformed_field_is_exit_13_naming_it(tmp_path, capsys, fields, fragments):
    config = written(tmp_path, small_llama(**fields))
    check_refused(capsys, ["--hf", config, "--input-shape", "input_ids=1x8"], 13, fragments)


@pytest.mark.parametrize("text", [
    pytest.param("[" * 200_000 + "]" * 200_000, id="array-200000-deep"),
    pytest.param('{"model_type": "llama", "x": ' + "[" * 200_000 + "]" * 200_000 + "}", id="field-200000-deep"),
    pytest.param('{"model_type": "llama", "x": ' + '{"a": ' * 200_000 + "1" + "}" * 200_001, id="object-200000-deep"),
])
def test_json_nested_200000_deep_is_exit_13(tmp_path, capsys, text):
    config = written(tmp_path, text)
    check_refused(capsys, ["--hf", config, "--input-shape", "input_ids=1x8"], 13, [config, "nested too deep"])


def test_a_tensor_above_2_48_elements_is_exit_13_with_the_limit(tmp_path, capsys):
    """vocab_size 2**41 makes the embedding a 2**41 x 2**8 = 2**49 element tensor: the limit is named."""
    config = written(tmp_path, small_llama(vocab_size=2**41, hidden_size=256, intermediate_size=256))
    check_refused(capsys, ["--hf", config, "--input-shape", "input_ids=1x8"], 13,
                  ["2**48", "vocab_size is 2199023255552", "embed_tokens"])


@pytest.mark.parametrize("spec, fragment", [
    pytest.param(f"{2**40 + 1}:4", f"prompt tokens P is {2**40 + 1}, above the limit of 2**40", id="P"),
    pytest.param(f"8:{2**41}", f"new tokens N is {2**41}, above the limit of 2**40", id="N"),
])
def test_generate_beyond_2_40_tokens_is_exit_2_with_the_limit(tmp_path, capsys, spec, fragment):
    config = written(tmp_path, small_llama())
    check_refused(capsys, ["--hf", config, "--generate", spec], 2, [fragment])


@pytest.mark.parametrize("cls_name, fields", [
    pytest.param("Mamba2Config", dict(hidden_size=64, num_heads=8, head_dim=16, state_size=16, n_groups=1,
                                      num_hidden_layers=2, vocab_size=256, expand=2), id="mamba2"),
    pytest.param("FalconH1Config", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                        num_key_value_heads=4, num_hidden_layers=2, vocab_size=256, mamba_d_ssm=128,
                                        mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1,
                                        head_dim=16, max_position_embeddings=64), id="falcon_h1"),
])
def test_special_floats_are_read_as_transformers_reads_them(tmp_path, capsys, cls_name, fields):
    """transformers writes time_step_limit's infinity as {"__float__": "Infinity"}; the configuration is read as its
    own from_json_file reads it, and the model counts."""
    from flopcount.frontends.hf import load_config

    cls = getattr(transformers, cls_name)
    path = tmp_path / "config.json"
    cls(**fields).to_json_file(str(path))
    assert '"__float__": "Infinity"' in path.read_text()
    ours, theirs = load_config(str(path)), cls.from_json_file(str(path))
    assert ours.to_dict() == theirs.to_dict()
    assert math.isinf(ours.time_step_limit[1])
    code, out, err = run(capsys, ["--hf", str(path), "--input-shape", "input_ids=1x8", "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["forward"]["flops"] > 0


def test_a_refusal_quotes_transformers_whole_reason_in_one_line(tmp_path, capsys):
    """A field of the wrong type: transformers' reason spans lines; the error quotes it whole on one line."""
    config = written(tmp_path, small_llama(rms_norm_eps="small"))
    code, out, err = run(capsys, ["--hf", config, "--input-shape", "input_ids=1x8"])
    assert code == 13 and len(err.strip().splitlines()) == 1, err
    assert "rms_norm_eps" in err and "str" in err
