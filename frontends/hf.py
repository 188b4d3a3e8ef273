"""Hugging Face ``transformers`` models counted from their configuration alone (``--hf``, :func:`from_hf`).

A configuration is a ``config.json`` file, a folder holding one, or a Hub model id, of which only
``config.json`` is fetched (through ``huggingface_hub``, and only when the machine is online). The model is built
on the meta device with ``AutoModelForCausalLM.from_config`` where transformers has a causal-LM head for the
configuration's ``model_type``, else ``AutoModel.from_config``: no weight is downloaded or allocated. It is then
counted as :func:`flopcount.from_torch` counts any module.

A configuration that names code of its own (``auto_map``: the model's classes live in the repository, not in
transformers) is refused unless ``trust_remote_code`` is given, since building it runs that code.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flopcount.errors import ConfigError, FrontendError, UsageError, first_line


log = logging.getLogger(__name__)

__all__ = ["TOKEN_INPUTS", "build_model", "from_hf", "hf_inputs", "is_causal_lm", "load_config", "load_model",
           "model_class"]

FRONTEND = "--hf"
INSTALL_HINT = 'pip install "flopcount[hf]" (with torch installed first, see README)'
#: Inputs that carry token ids, positions or masks: int64, as a tokenizer makes them; every other input is float.
TOKEN_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids", "position_ids", "decoder_input_ids",
                          "decoder_attention_mask", "labels", "cache_position"})
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def from_hf(config: Any, input_shapes: Mapping[str, Any] | tuple | None = None, *, trust_remote_code: bool = False,
            cache_dir: str | os.PathLike | bool | None = None, **count_kwargs: Any):
    """Count a transformers model built from its configuration, without weights.

    Parameters
    ----------
    config : str, path, dict or transformers.PretrainedConfig
        A ``config.json`` path, a folder holding one, a Hub model id (only its ``config.json`` is fetched), the
        parsed JSON, or a configuration object.
    input_shapes : mapping of input name to shape, or a shape
        The inputs of ``forward``: ``{"input_ids": (1, 2048)}``; a bare shape is ``input_ids``. Token inputs
        (:data:`TOKEN_INPUTS`) are int64, others float32.
    trust_remote_code : bool
        Allow a configuration whose classes live in its repository (``auto_map``); building it runs that code.
    cache_dir, **count_kwargs
        As for :func:`flopcount.from_torch` (``mode``, ``convention``, ``batch`` ...).

    Raises
    ------
    ConfigError
        The configuration cannot be read or built here (no such file, no ``model_type``, a ``model_type`` the
        installed transformers does not know, remote code not trusted, a Hub id while offline).
    UsageError
        ``input_shapes`` is missing or names an input ``forward`` does not take.
    FrontendError
        transformers or torch is missing, or the export failed.
    """
    from .torch import from_torch

    model = load_model(config, trust_remote_code=trust_remote_code)
    return from_torch(model, hf_inputs(model, input_shapes), cache_dir=cache_dir, **count_kwargs)


def load_model(config: Any, *, trust_remote_code: bool = False):
    """The model of ``config`` (as :func:`from_hf` takes it) built on the meta device."""
    return build_model(load_config(config, trust_remote_code=trust_remote_code), trust_remote_code=trust_remote_code)


def load_config(source: Any, *, trust_remote_code: bool = False):
    """The ``transformers.PretrainedConfig`` of ``source`` (see :func:`from_hf`)."""
    transformers = _import("transformers")
    if isinstance(source, transformers.PretrainedConfig):
        return source
    if isinstance(source, Mapping):
        return _from_dict(transformers, dict(source), "the configuration", trust_remote_code, None)
    where = os.fspath(source)
    path = Path(where)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{where}: the folder holds no config.json; give a folder or file with a model's "
                              "config.json, or a Hub model id")
    elif not path.exists():
        if not _HUB_ID.match(where) or where.endswith(".json"):
            raise ConfigError(f"{where}: no such file or folder; give a config.json, a folder holding one, or a "
                              "Hub model id (org/name)")
        path = _fetch_config(where)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not a readable JSON configuration ({first_line(e)}); give the model's "
                          "config.json") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: a configuration is a JSON object, not {type(document).__name__}")
    return _from_dict(transformers, document, str(path), trust_remote_code, path.parent)


def _from_dict(transformers, document: dict, where: str, trust_remote_code: bool, folder: Path | None):
    model_type = document.get("model_type")
    if document.get("auto_map"):
        if not trust_remote_code:
            raise ConfigError(
                f"{where}: the configuration's classes live in its repository (auto_map: "
                f"{', '.join(sorted(document['auto_map']))}), and building it runs that code; pass "
                "--trust-remote-code (trust_remote_code=True) if you trust it")
        if folder is None:
            raise ConfigError(f"{where}: remote code is read from the configuration's folder; give the folder")
        try:
            return transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=True,
                                                           local_files_only=True)
        except Exception as e:  # noqa: BLE001 - the repository's own code may raise anything
            raise ConfigError(f"{where}: its remote configuration code failed: {first_line(e)}") from None
    if not model_type:
        raise ConfigError(f"{where}: the configuration has no model_type; give a transformers config.json")
    mapping = transformers.CONFIG_MAPPING
    if model_type not in mapping:
        close = difflib.get_close_matches(str(model_type), list(mapping.keys()), n=3)
        raise ConfigError(
            f"{where}: model_type {model_type!r} is unknown to transformers {transformers.__version__}"
            + (f" (did you mean {', '.join(map(repr, close))}?)" if close else "")
            + "; upgrade transformers, or pass --trust-remote-code for a model whose code is in its repository")
    try:
        return mapping[model_type].from_dict(document)
    except Exception as e:  # noqa: BLE001 - a configuration class validates its own fields
        raise ConfigError(f"{where}: transformers refuses the {model_type} configuration: {first_line(e)}") from None


def _fetch_config(repo_id: str) -> Path:
    """Fetch the Hub repository's ``config.json`` (nothing else); offline, say to pass the folder."""
    hub = _import("huggingface_hub")
    try:
        return Path(hub.hf_hub_download(repo_id=repo_id, filename="config.json"))
    except Exception as e:  # noqa: BLE001 - offline, missing repository, gated model ...
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        reason = "the machine is offline (HF_HUB_OFFLINE)" if offline else first_line(e)
        raise ConfigError(f"{repo_id}: its config.json cannot be fetched from the Hub: {reason}; download the "
                          "model's config.json and pass its folder (or the file) instead") from None


def is_causal_lm(config) -> bool:
    """Whether ``config`` is a causal language model: its ``architectures`` name a ``...ForCausalLM`` class, or
    (without them) transformers has a causal-LM head for its ``model_type`` and it is not a masked-LM encoder
    (BERT has a decoder variant, but a BERT configuration is an encoder unless ``is_decoder`` is set)."""
    _import("transformers")
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    architectures = getattr(config, "architectures", None) or []
    if architectures:
        return any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in architectures)
    auto_map = getattr(config, "auto_map", None) or {}
    if auto_map:
        return "AutoModelForCausalLM" in auto_map
    return config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
        config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES or bool(getattr(config, "is_decoder", False)))


def model_class(config, *, trust_remote_code: bool = False):
    """The class that builds ``config``'s model: the first of its ``architectures`` that transformers has, else
    ``AutoModelForCausalLM`` for a causal LM (:func:`is_causal_lm`), else ``AutoModel``."""
    transformers = _import("transformers")
    if not trust_remote_code:
        for name in getattr(config, "architectures", None) or []:
            cls = getattr(transformers, name, None)
            if cls is not None:
                return cls
    return transformers.AutoModelForCausalLM if is_causal_lm(config) else transformers.AutoModel


def build_model(config, *, trust_remote_code: bool = False):
    """The model of ``config`` on the meta device (no weight memory), in inference mode."""
    torch = _import("torch")
    cls = model_class(config, trust_remote_code=trust_remote_code)
    kwargs = {"trust_remote_code": True} if trust_remote_code else {}
    try:
        with torch.device("meta"):
            model = cls.from_config(config, **kwargs) if hasattr(cls, "from_config") else cls._from_config(config)
    except ValueError as e:
        raise ConfigError(f"{config.model_type}: transformers cannot build a model of this configuration: "
                          f"{first_line(e)}") from None
    return model.eval()


def hf_inputs(model, input_shapes) -> dict[str, Any]:
    """The example inputs of :func:`flopcount.from_torch` for ``model``: each shape with its dtype (token inputs
    int64, others float32; a ``(shape, dtype)`` given stays), and ``use_cache=False`` where ``forward`` takes it."""
    torch = _import("torch")
    if input_shapes is None:
        raise UsageError(f"{FRONTEND}: give the input shapes, e.g. --input-shape input_ids=1x2048 "
                         "(input_shapes={'input_ids': (1, 2048)})")
    if not isinstance(input_shapes, Mapping):
        input_shapes = {"input_ids": input_shapes}
    inputs: dict[str, Any] = {}
    for name, shape in input_shapes.items():
        if isinstance(shape, tuple) and len(shape) == 2 and not isinstance(shape[1], int):
            inputs[name] = shape  # (shape, dtype) given
        else:
            inputs[name] = (tuple(shape), torch.int64 if name in TOKEN_INPUTS else torch.float32)
    import inspect

    if "use_cache" in inspect.signature(model.forward).parameters and "use_cache" not in inputs:
        inputs["use_cache"] = False  # a cache object is no tensor output; generation is counted by its steps
    return inputs


def _import(name: str):
    try:
        return __import__(name)
    except ImportError:
        raise FrontendError(f"{FRONTEND}: {name} is not installed; {INSTALL_HINT}") from None
