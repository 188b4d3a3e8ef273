"""The PyTorch frontend's error messages: which operator an exporter could not convert, the exporter's own line,
and a training-mode batch norm given one value per channel (the user's input, refused as PyTorch refuses it)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence

from flopcount.errors import UsageError, first_line

from . import common

#: The name the PyTorch frontend's messages start with.
FRONTEND = "torch"

#: Where the exporters name the operator they cannot convert (normalised to ``namespace::name``).
_OP_PATTERNS = (
    re.compile(r"OpOverload\(op='(?P<op>[\w.]+)'"),  # torch.export path: No ONNX function found for <OpOverload(...)>
    re.compile(r"target=torch\.ops\.(?P<op>\w+\.\w+)"),  # torch.export path: Error when translating node ...
    re.compile(r"the operator '(?P<op>\w+::\w+)'"),  # TorchScript: Exporting the operator 'aten::x' to ONNX ...
    re.compile(r"unrecognized namespace (?P<op>\w+::\w+)"),  # TorchScript: a custom op without a symbolic
)
_SUMMARY_LINE = re.compile(r"^<class '(?:[\w.]*\.)?(?P<type>\w+)'>: (?P<message>.+)$", re.MULTILINE)


def _failing_operator(e: BaseException) -> str | None:
    for link in common.chain(e):
        text = common.strip_ansi(str(link))
        for pattern in _OP_PATTERNS:
            match = pattern.search(text)
            if match:
                op = match["op"]
                return op if "::" in op else op.replace(".", "::", 1)
    return None


_ONE_VALUE_PER_CHANNEL = re.compile(r"Expected more than 1 value per channel when training, got input size ([^\n]*)")


def refuse_untrainable_batch_norm(e: BaseException, call) -> None:
    """PyTorch's batch norm refuses, in training mode, an input with one value per channel (batch 1 and 1×1
    spatial size): that is the input's fault, not the exporter's, and the next exporter would trace past the check
    into a graph ONNX cannot infer. Raise it as the user's error."""
    chain, seen = [], set()
    while e is not None and id(e) not in seen:  # the exporters wrap the module's own error
        seen.add(id(e))
        chain.append(common.strip_ansi(str(e)))
        e = e.__cause__ or e.__context__
    match = next((m for text in chain if (m := _ONE_VALUE_PER_CHANNEL.search(text))), None)
    if match:
        size = match[1].strip().rstrip(".").removeprefix("torch.Size(").removesuffix(")")
        raise UsageError(
            f"{FRONTEND}: with {call.describe()}, a BatchNorm layer in training mode gets one value per channel "
            f"(its input size is {size}: batch × spatial size = 1), which PyTorch refuses to "
            "train on; give a batch of at least 2 or a larger input"
        ) from None


@contextlib.contextmanager
def batch_norm_size_check(torch, module, batch: int | None, training: bool):
    """Where an export traces at another batch than the user's (the torch.export path traces at batch 2), make
    each training-mode batch norm check the user's batch as PyTorch's own does at run time: one value per channel
    (batch 1, spatial size 1) is refused."""
    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not training or batch != 1 or not norms:
        yield
        return

    def check(norm, args):
        x = args[0] if args else None
        if norm.training and x is not None and x.dim() > 2:
            spatial = [int(d) for d in x.shape[2:]]
            if all(d == 1 for d in spatial):
                size = [batch, int(x.shape[1]), *spatial]
                raise ValueError(f"Expected more than 1 value per channel when training, got input size {size}")

    handles = [m.register_forward_pre_hook(check) for m in norms]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def exporter_line(e: BaseException) -> str:
    """The exporter's own first line; for the torch.export path, the first line of its exception summary."""
    text = common.strip_ansi(str(e))
    match = _SUMMARY_LINE.search(text)
    if match:
        return common.shorten(f"{match['type']}: {match['message'].strip()}")
    return common.shorten(f"{type(e).__name__}: {first_line(e)}")


def failure_message(module_name: str, errors: Sequence[tuple[str, BaseException]]) -> str:
    for exporter, error in errors:
        op = _failing_operator(error)
        if op is not None:
            return (
                f"{FRONTEND}: cannot export {module_name} to ONNX: operator {op} has no ONNX conversion "
                f"({exporter} exporter: {exporter_line(error)}); replace that operation, register an ONNX "
                "translation for it, or export the model yourself and count the .onnx file"
            )
    details = "; ".join(f"{exporter} exporter: {exporter_line(error)}" for exporter, error in errors)
    return (
        f"{FRONTEND}: cannot export {module_name} to ONNX ({details}); make the model exportable with "
        "torch.onnx.export, or export it yourself and count the .onnx file"
    )
