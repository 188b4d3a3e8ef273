"""The PyTorch frontend's cache key: a hash of everything an export depends on except weight values (see
:mod:`flopcount.frontends.torch`, **Cache**)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from . import common

log = logging.getLogger(__name__.removesuffix("_cache"))  # the torch frontend's logger: the records are its exports

CACHE_FORMAT = 5  # bump when the export pipeline changes what it writes (4: sealed entries; 5: sdpa's dropout kept)
#: The distributions an export depends on, whose installed versions (package metadata) every export key holds: the
#: exporter (torch), the graph's library and the exporter's passes (onnx, onnxscript and its IR, onnx-ir), this
#: package.
EXPORT_DISTRIBUTIONS = ("torch", "onnx", "onnxscript", "onnx-ir", "flopcount")

def fingerprint(torch, module, call, training: bool, opset: int) -> str | None:
    """Hash of everything the exported graph depends on except weight values; None (do not cache) where some
    state that ``forward`` may read cannot be described (see :class:`flopcount.frontends.common.StateDescriber`)."""
    describer = common.StateDescriber(leaf=lambda value: torch_leaf(torch, value), framework=("torch",))
    for name, sub in module.named_modules():
        describer.name(sub, f"module:{name}")
    modules = [[name, describer.object_type(sub), describer.describe(module_state(describer, sub))]
               for name, sub in module.named_modules()]
    if describer.unsound is not None:
        log.info("export of %s not cached: %s", type(module).__name__, describer.unsound)
        return None
    document = {
        "format": CACHE_FORMAT,
        "versions": {name: common.dist_version(name) for name in EXPORT_DISTRIBUTIONS},
        "module": common.without_addresses(repr(module)),
        "modules": modules,
        "parameters": [[n, list(p.shape), str(p.dtype), p.is_meta] for n, p in module.named_parameters()],
        "buffers": [[n, list(b.shape), str(b.dtype), b.is_meta] for n, b in module.named_buffers()],
        "inputs": [[n, list(x.shape), str(x.dtype), _value_digest(torch, x)] for n, x in zip(call.names, call.tensors)],
        "keyword": call.keyword,
        "constants": describer.describe(call.constants),
        "training": bool(training),
        "opset": opset,
    }
    if describer.unsound is not None:
        log.info("export of %s not cached: %s", type(module).__name__, describer.unsound)
        return None
    return common.cache_key(document)


#: Module attributes the fingerprint covers otherwise (parameters, buffers, submodules, the training flag) or that
#: do not change what ``forward`` computes (state-dict and backward hooks).
_MODULE_BOOKKEEPING = frozenset({
    "_parameters", "_buffers", "_modules", "training", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", "_backward_hooks", "_backward_pre_hooks",
    "_is_full_backward_hook", "_non_persistent_buffers_set",
})


#: Module attributes keyed by hook handle ids: numbers drawn from a counter shared by every module of the process.
_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs")


def module_state(describer: common.StateDescriber, module) -> dict[str, Any]:
    """The attributes of one module that its ``forward`` may read, for ``describer`` to describe: its own state
    without what the module tree covers otherwise (:data:`_MODULE_BOOKKEEPING`), hooks by rank."""
    return _hooks_by_rank({k: v for k, v in describer.state(module).items() if k not in _MODULE_BOOKKEEPING})


def _hooks_by_rank(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the hook handle ids in :data:`_HOOK_DICTS` replaced by their rank among the module's hooks
    (the ids count every hook registered in the process before, so they differ between processes; their order
    is the order the hooks run in)."""
    ids = sorted({k for name in _HOOK_DICTS if isinstance(state.get(name), Mapping) for k in state[name]
                  if isinstance(k, int)})
    rank = {k: i for i, k in enumerate(ids)}
    return {name: {rank.get(k, k): v for k, v in value.items()} if name in _HOOK_DICTS and isinstance(value, Mapping)
            else value for name, value in state.items()}


def torch_leaf(torch, value: Any) -> Any:
    """The description of torch values that are not plain Python objects, or :data:`common.NOT_A_LEAF`."""
    if isinstance(value, torch.Tensor):  # a tensor attribute (not a parameter or buffer): its type, not its values
        return ["tensor", list(value.shape), str(value.dtype), value.device.type]
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)):
        return repr(value)
    return common.NOT_A_LEAF


def _value_digest(torch, x) -> str | None:
    """Digest of an input tensor's values (Python control flow in forward may read them, and the TorchScript
    exporter bakes what it read into the graph); None on the meta device, which has no values."""
    if x.is_meta:
        return None
    data = x.detach().cpu().contiguous().reshape(-1)
    return common.bytes_digest(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
