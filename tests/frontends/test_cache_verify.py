"""The export cache serves only entries written for the call that reads them and whole: an empty, truncated,
bit-flipped or planted entry is one warning naming the file, then a new export stored over it; never served, never a
lasting failure, never a decode crash."""

from __future__ import annotations

import logging

import onnx
import pytest
from helpers import model, weight
from onnx import helper

from flopcount import count
from flopcount.frontends import common
from flopcount.frontends.cache_entry import seal, unseal

torch = pytest.importorskip("torch")
from flopcount.frontends.torch import from_torch  # noqa: E402

LOG = "flopcount.frontends.torch"
B, D_IN, D_HID, D_OUT = 4, 64, 128, 10
# Gemm: 2 FLOPs per multiply-add plus one per bias element
EXPECTED = (2 * B * D_IN * D_HID + B * D_HID) + B * D_HID + (2 * B * D_HID * D_OUT + B * D_OUT)


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D_IN, D_HID), torch.nn.ReLU(), torch.nn.Linear(D_HID, D_OUT))


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.fixture
def entry(cache, exports):
    """The one cache entry of the MLP, written by a first count."""
    assert from_torch(mlp(), (B, D_IN)).forward.flops == EXPECTED
    (path,) = cache.glob("torch-*.onnx")
    exports.clear()
    return path


def test_a_whole_entry_is_served(entry, exports, caplog):
    assert from_torch(mlp(), (B, D_IN)).forward.flops == EXPECTED
    assert exports == [] and warnings_of(caplog) == []


def flipped(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x10]) + data[position + 1:]


@pytest.mark.parametrize("damage", [
    pytest.param(lambda data: b"", id="empty"),
    pytest.param(lambda data: data[: len(data) // 2], id="truncated-half"),
    pytest.param(lambda data: data[:-1], id="truncated-one-byte"),
    pytest.param(lambda data: flipped(data, len(data) // 3), id="bit-flip-third"),
    pytest.param(lambda data: flipped(data, 2 * len(data) // 3), id="bit-flip-two-thirds"),
    pytest.param(lambda data: b"\xff\xfe" * 64, id="garbage"),
])
def test_a_damaged_entry_is_one_warning_then_rebuilt(entry, exports, caplog, damage):
    whole = entry.read_bytes()
    entry.write_bytes(damage(whole))
    with caplog.at_level(logging.WARNING, LOG):
        assert from_torch(mlp(), (B, D_IN)).forward.flops == EXPECTED
    (message,) = warnings_of(caplog)
    assert str(entry) in message and "\n" not in message and "exporting again" in message
    assert len(exports) == 1  # rebuilt ...
    assert isinstance(unseal(entry.read_bytes(), _key_of(whole), _signature_of(whole)), onnx.ModelProto)
    caplog.clear()
    assert from_torch(mlp(), (B, D_IN)).forward.flops == EXPECTED  # ... and served from then on
    assert len(exports) == 1 and warnings_of(caplog) == []


def _props(data: bytes) -> dict[str, str]:
    m = onnx.ModelProto()
    m.ParseFromString(data)
    return {p.key: p.value for p in m.metadata_props}


def _key_of(data: bytes) -> str:
    return _props(data)["flopcount.cache.key"]


def _signature_of(data: bytes):
    import json

    return json.loads(_props(data)["flopcount.cache.signature"])


def test_every_single_bit_flip_is_refused(entry, caplog):
    """Every flipped byte, over the whole entry, is caught before use (digest, key, signature, parse or checker):
    none is served, none raises."""
    whole = entry.read_bytes()
    key, signature = _key_of(whole), _signature_of(whole)
    assert isinstance(unseal(whole, key, signature), onnx.ModelProto)
    step = max(1, len(whole) // 300)
    for position in range(0, len(whole), step):
        for bit in (0x01, 0x80):
            damaged = whole[:position] + bytes([whole[position] ^ bit]) + whole[position + 1:]
            got = unseal(damaged, key, signature)
            assert isinstance(got, str) and got, (position, bit)


def test_a_planted_unrelated_graph_is_not_counted(entry, exports, caplog):
    """A valid ONNX model (a big Gemm) planted under the MLP's key is refused: it is not sealed for the key."""
    planted = model([helper.make_node("Gemm", ["x", "W"], ["y"])], {"x": (512, 1024)}, ["y"],
                    [weight("W", (1024, 4096))])
    assert count(planted).forward.flops == 2 * 512 * 1024 * 4096  # a valid model, and a different count
    entry.write_bytes(planted.SerializeToString())
    with caplog.at_level(logging.WARNING, LOG):
        assert from_torch(mlp(), (B, D_IN)).forward.flops == EXPECTED
    (message,) = warnings_of(caplog)
    assert str(entry) in message and "not sealed" in message
    assert len(exports) == 1


def test_an_entry_sealed_for_another_key_is_not_counted(entry, cache, exports, caplog):
    """The sealed entry of another model, copied under the MLP's key, is refused by the key it records."""
    torch.manual_seed(0)
    other = torch.nn.Sequential(torch.nn.Linear(D_IN, 2 * D_HID))
    from_torch(other, (B, D_IN))
    (other_path,) = [p for p in cache.glob("torch-*.onnx") if p != entry]
    entry.write_bytes(other_path.read_bytes())
    exports.clear()
    with caplog.at_level(logging.WARNING, LOG):
        assert from_torch(mlp(), (B, D_IN)).forward.flops == EXPECTED
    (message,) = warnings_of(caplog)
    assert str(entry) in message and "another key" in message
    assert len(exports) == 1


def test_an_entry_for_other_inputs_is_refused(entry):
    whole = entry.read_bytes()
    got = unseal(whole, _key_of(whole), [["input", [B + 1, D_IN], "torch.float32"]])
    assert isinstance(got, str) and "other inputs" in got


def test_the_served_model_is_the_exported_one(entry):
    """The seal (key, signature, digest) is taken off again: what is served is what the export gave."""
    served = unseal(entry.read_bytes(), _key_of(entry.read_bytes()), _signature_of(entry.read_bytes()))
    assert not [p for p in served.metadata_props if p.key.startswith("flopcount.cache.")]
    again = seal(served, "k", [])
    assert unseal(again.SerializeToString(), "k", []) == served


def test_a_folder_in_place_of_the_entry_is_a_rebuild(cache, exports, caplog, tmp_path):
    """An entry that cannot be read as a file: the count is right, the cache is left alone."""
    key = "0" * 64
    path = cache / f"torch-{key[:40]}.onnx"
    path.mkdir(parents=True)
    got = common.read_cache(path, logging.getLogger(LOG), key, [])
    assert got is None
