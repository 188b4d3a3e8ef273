"""Sealing and verifying an entry of the export cache.

An entry is the exported ONNX model with three metadata properties added: the cache key it was written for, the
input signature of the call that exported it (names, shapes and element types of the graph inputs, as JSON) and the
SHA-256 of the model as serialized without these properties. :func:`unseal` serves an entry only where all three
match the call that reads it, the graph is non-empty and ONNX's checker passes; otherwise it says why in a short
phrase (the caller warns once, naming the file, and exports again). Importing this module needs only onnx.

>>> import onnx.helper as h
>>> graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
...                      [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
>>> model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
>>> entry = seal(model, "k" * 64, [["x", [2], "float32"]])
>>> unseal(entry.SerializeToString(), "k" * 64, [["x", [2], "float32"]]) == model
True
>>> unseal(entry.SerializeToString(), "j" * 64, [["x", [2], "float32"]])
'written for another key (kkkkkkkkkkkk...)'
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import onnx
import onnx.helper

__all__ = ["ENTRY_FORMAT", "seal", "unseal"]

#: Version of the entry layout; an entry of another version is not served.
ENTRY_FORMAT = "1"
_PREFIX = "flopcount.cache."
_FORMAT, _KEY, _SIGNATURE, _DIGEST = (f"{_PREFIX}{name}" for name in ("format", "key", "signature", "sha256"))


def _signature_text(signature: Any) -> str:
    return json.dumps(signature, sort_keys=True, separators=(",", ":"), default=str)


def _digest(model: onnx.ModelProto) -> str:
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def seal(model: onnx.ModelProto, key: str, signature: Any) -> onnx.ModelProto:
    """A copy of ``model`` that records ``key``, the JSON-able input ``signature`` and the digest of ``model``."""
    sealed = onnx.ModelProto()
    sealed.CopyFrom(model)
    digest = _digest(model)
    for name, value in ((_FORMAT, ENTRY_FORMAT), (_KEY, key), (_SIGNATURE, _signature_text(signature)),
                        (_DIGEST, digest)):
        sealed.metadata_props.add(key=name, value=value)
    return sealed


def unseal(data: bytes, key: str, signature: Any) -> onnx.ModelProto | str:
    """The model an entry's bytes hold, without the seal, where it was written for ``key`` and ``signature`` and is
    whole; else the reason it is not served, in a few words."""
    if not data:
        return "the file is empty"
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # noqa: BLE001 - DecodeError, RuntimeError, ValueError: any damage is a rebuild
        return f"not a readable ONNX protobuf ({type(e).__name__})"
    props: dict[str, Any] = {}
    kept = []
    for prop in model.metadata_props:
        if isinstance(prop.key, str) and prop.key.startswith(_PREFIX):
            props[prop.key] = prop.value
        else:
            kept.append(prop)
    if props.get(_FORMAT) != ENTRY_FORMAT:
        return "not sealed by this flopcount's cache (no or another entry format)"
    if props.get(_KEY) != key:
        written = props.get(_KEY)
        shown = f"{written[:12]}..." if isinstance(written, str) else "an unreadable key"
        return f"written for another key ({shown})"
    if props.get(_SIGNATURE) != _signature_text(signature):
        return f"written for other inputs ({str(props.get(_SIGNATURE))[:120]})"
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    if _digest(model) != props.get(_DIGEST):
        return "its content does not match its digest (the file was changed or damaged)"
    return _whole(model)


def _whole(model: onnx.ModelProto) -> onnx.ModelProto | str:
    """``model`` where it has a graph with nodes and outputs and passes ONNX's checker; else why not."""
    if not model.HasField("graph") or not model.graph.output:
        return "the graph is empty (no outputs)"
    if not model.graph.node and not model.graph.input:
        return "the graph is empty (no nodes)"
    try:
        onnx.checker.check_model(_checkable(model))
    except Exception as e:  # noqa: BLE001 - ValidationError and plain C++ exceptions
        text = " ".join(str(e).split())
        return f"ONNX's checker refuses it ({text[:160]})"
    return model


def _checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as ONNX's checker can take it without the weights it never reads: an entry's weights are references
    to a file that is never written (the checker would open it), so each initializer that refers to external data or
    holds none becomes a graph input of its type and shape (what it is to every node that reads it)."""
    weightless = [t for t in model.graph.initializer
                  if t.data_location == onnx.TensorProto.EXTERNAL or not _holds_data(t)]
    if not weightless:
        return model
    checkable = onnx.ModelProto()
    checkable.CopyFrom(model)
    names = {t.name for t in weightless}
    kept = [t for t in checkable.graph.initializer if t.name not in names]
    del checkable.graph.initializer[:]
    checkable.graph.initializer.extend(kept)
    inputs = {i.name for i in checkable.graph.input}
    for t in weightless:
        if t.name not in inputs:
            checkable.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return checkable


def _holds_data(t: onnx.TensorProto) -> bool:
    return t.HasField("raw_data") or any(len(getattr(t, f)) for f in (
        "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"))
