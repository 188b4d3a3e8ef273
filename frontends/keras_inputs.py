"""The Keras frontend's framework and input helpers: TensorFlow, Keras 3 and tf2onnx imported quietly
(:func:`import_frameworks`), the inputs a model is traced with (:func:`traced_inputs`: names, static shapes and
dtypes, checked against the model's own), and a subclassed model built on symbolic tensors (:func:`build`).

:mod:`flopcount.frontends.keras` converts with them (tf2onnx, the cache); :mod:`flopcount.models.keras_models`
imports its frameworks through :func:`import_frameworks`. Importing this module needs only onnx.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from flopcount.errors import FrontendError, UsageError, import_framework

from . import common

__all__ = ["DEFAULT_BATCH", "FRONTEND", "INSTALL_HINT", "PROGRESS_DELAY_S", "TF_LOGGERS", "KerasInput",
           "accepts_training", "build", "call_args", "check_model", "check_opset", "error_line", "import_frameworks",
           "tensorflow_running", "traced_inputs"]

# the Keras frontend's one logger, whichever of its modules writes
log = logging.getLogger("flopcount.frontends.keras")

FRONTEND = "keras"
INSTALL_HINT = 'pip install "flopcount[tf]"'
#: Batch size given to a ``None`` batch dim when neither ``input_shapes`` nor ``batch`` sets it.
DEFAULT_BATCH = 1
#: Seconds a conversion runs before the progress indicator appears.
PROGRESS_DELAY_S = 1.0
#: Python loggers of TensorFlow, quieted while it imports and converts unless flopcount's logging is at DEBUG.
TF_LOGGERS = ("tensorflow", "absl", "h5py")
#: The lines of TensorFlow's C++ (absl) logging, written straight to stderr.
_TF_NOISE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\)|[IWE]\d{4} [\d:. ]+\d+ \S+:\d+\] ")


@dataclasses.dataclass(frozen=True)
class KerasInput:
    """One input a model is traced with."""

    name: str
    shape: tuple[int, ...]
    dtype: str


# ---------------------------------------------------------------------------------------------------------------
# Frameworks
# ---------------------------------------------------------------------------------------------------------------


def import_frameworks():
    """``(tensorflow, keras, tf2onnx)``, imported quietly (see **Logs** in :mod:`flopcount.frontends.keras`).

    Raises FrontendError naming the ``tf`` extra when one is missing, and when Keras is not Keras 3 on its
    TensorFlow backend.
    """
    modules = [sys.modules.get(name) for name in ("tensorflow", "keras", "tf2onnx")]
    if any(module is None for module in modules):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with tensorflow_running("importing TensorFlow"), common.quiet(TF_LOGGERS, log, fds=()):
            modules = [_import(name, label) for name, label in
                       (("tensorflow", "TensorFlow"), ("keras", "Keras"), ("tf2onnx", "tf2onnx"))]
    tf, keras, tf2onnx = modules
    if int(str(getattr(keras, "__version__", "0")).split(".")[0] or 0) < 3:
        raise FrontendError(
            f"{FRONTEND}: Keras {keras.__version__} is installed and this frontend needs Keras 3 (TensorFlow 2.16 "
            f"or newer); {INSTALL_HINT}"
        )
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise FrontendError(
            f"{FRONTEND}: the Keras backend is {backend!r} and tf2onnx converts TensorFlow graphs; set "
            "KERAS_BACKEND=tensorflow before Keras is imported"
        )
    return tf, keras, tf2onnx


@contextlib.contextmanager
def tensorflow_running(label: str) -> Iterator[None]:
    """While TensorFlow imports or converts: its C++ log lines, which it writes to stderr whatever
    ``TF_CPP_MIN_LOG_LEVEL`` says when it was imported before that was set, go to the DEBUG log; anything else
    written to stderr meanwhile (flopcount's own log records) is written there afterwards; the progress line
    (after :data:`PROGRESS_DELAY_S`) goes to the terminal."""
    written: list[str] = []
    try:
        with common.captured_fd(2, written) as terminal, \
                common.progress(label, delay=PROGRESS_DELAY_S, log=log, stream=terminal):
            yield
    finally:
        kept, noise = [], False
        for line in "".join(written).splitlines(keepends=True):
            # a log line of TensorFlow's, and the lines that continue it (up to one of flopcount's own)
            noise = bool(_TF_NOISE.match(line)) or (noise and not line.startswith("flopcount"))
            if noise:
                log.debug("tensorflow: %s", line.rstrip())
            else:
                kept.append(line)
        if kept:
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def _import(name: str, label: str):
    try:
        return import_framework(name)
    except ModuleNotFoundError:
        raise FrontendError(f"{FRONTEND}: {label} is not installed; {INSTALL_HINT}") from None


def check_opset(tf2onnx, opset: int | None) -> None:
    """Refuse an opset newer than the installed tf2onnx writes (read from tf2onnx itself)."""
    newest = max(getattr(getattr(tf2onnx, "constants", None), "OPSET_TO_IR_VERSION", None) or {0: 0})
    if opset is not None and newest and opset > newest:
        raise UsageError(f"{FRONTEND}: opset {opset} is newer than tf2onnx {getattr(tf2onnx, '__version__', '?')} "
                         f"writes; give an opset of at most {newest}")


def check_model(keras, model: Any) -> None:
    if not isinstance(model, keras.Model):
        hint = " (a tf_keras / Keras 2 model: rebuild it with Keras 3)" if "tf_keras" in type(model).__module__ else ""
        raise UsageError(f"{FRONTEND}: expected a keras.Model, got {type(model).__name__}{hint}")


# ---------------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------------


def _is_shape(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(
        d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in value
    )


def _model_inputs(model) -> list[tuple[str, tuple, str]] | None:
    """``(name, shape with None, dtype)`` of each of ``model.inputs``; None for a model without them."""
    try:
        tensors = list(model.inputs or ())
    except (AttributeError, ValueError):
        return None
    if not tensors:
        return None
    found = []
    for i, tensor in enumerate(tensors):
        layer = getattr(getattr(tensor, "_keras_history", None), "operation", None)
        name = getattr(layer, "name", None) or f"input_{i}"
        found.append((name, tuple(tensor.shape), str(tensor.dtype)))
    return found


def _call_parameters(model) -> list[str]:
    """Names of the positional parameters of ``model.call`` other than ``training`` and ``mask``."""
    try:
        parameters = inspect.signature(model.call).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in parameters if p.kind in kinds and p.name not in ("training", "mask")]


def traced_inputs(model, input_shapes: Any, batch: int | None) -> list[KerasInput]:
    """The input names, static shapes and dtypes the model is traced with."""
    known = _model_inputs(model)
    if input_shapes is None:
        if known is None:
            raise UsageError(
                f"{FRONTEND}: {type(model).__name__} {model.name!r} has no inputs to read shapes from (a subclassed "
                "model); give input_shapes, e.g. input_shapes=(1, 224, 224, 3), or --input-shape x=1x224x224x3"
            )
        given: list[tuple[str | None, tuple | None]] = [(None, None)] * len(known)
    elif isinstance(input_shapes, Mapping):
        given = [(name, shape) for name, shape in input_shapes.items()]
    elif _is_shape(input_shapes) and len(input_shapes) > 0:
        given = [(None, tuple(input_shapes))]
    elif isinstance(input_shapes, (tuple, list)) and all(_is_shape(s) for s in input_shapes):
        given = [(None, tuple(shape)) for shape in input_shapes]
    else:
        raise UsageError(
            f"{FRONTEND}: input_shapes must be a shape such as (1, 224, 224, 3), a list of shapes or a mapping of "
            f"input name to shape; got {input_shapes!r}"
        )
    for name, shape in given:
        if shape is not None and not _is_shape(shape):
            raise UsageError(f"{FRONTEND}: the shape of input {name!r} must be a tuple of ints, got {shape!r}")

    if known is not None:
        names = [name for name, _, _ in known]
        if isinstance(input_shapes, Mapping):  # by name; the inputs it does not name keep the model's shapes
            unknown = [name for name, _ in given if name not in names]
            if unknown:
                raise UsageError(
                    f"{FRONTEND}: {model.name} has no input named {unknown[0]!r}; its inputs: {', '.join(names)}"
                )
            by_name = dict(given)
            given = [(name, by_name.get(name)) for name in names]
        elif len(given) != len(known):
            raise UsageError(
                f"{FRONTEND}: {model.name} has {len(known)} input(s) ({', '.join(names)}); input_shapes gives "
                f"{len(given)}"
            )
        specs = [(name, model_shape if shape is None else shape, model_shape, dtype)
                 for (name, model_shape, dtype), (_, shape) in zip(known, given)]
    else:
        parameters = _call_parameters(model)  # a mapping names the inputs; else call()'s parameters do
        if len(parameters) < len(given):
            parameters = [f"input_{i}" for i in range(len(given))]
        names = [name if name is not None else parameters[i] for i, (name, _) in enumerate(given)]
        specs = [(name, shape, None, "float32") for name, (_, shape) in zip(names, given)]

    inputs = []
    for name, shape, model_shape, dtype in specs:
        shape = list(shape)
        if not shape:
            raise UsageError(f"{FRONTEND}: input {name!r} is a scalar; give it a batch dim")
        if batch is not None or shape[0] is None:
            shape[0] = DEFAULT_BATCH if batch is None else batch
        if model_shape is not None and (len(model_shape) != len(shape) or any(
            m is not None and m != d for i, (m, d) in enumerate(zip(model_shape, shape)) if i > 0 or batch is None
        )):
            raise UsageError(
                f"{FRONTEND}: input {name!r} of {model.name} has shape {_dims(model_shape)}; got {_dims(shape)}"
            )
        open_dims = [i for i, d in enumerate(shape) if d is None]
        if open_dims:
            letters = _placeholders(len(shape))
            shown = [str(d) if d is not None else letters[i] for i, d in enumerate(shape)]
            which = (f"dim {open_dims[0]} is open" if len(open_dims) == 1 else
                     f"dims {', '.join(map(str, open_dims[:-1]))} and {open_dims[-1]} are open")
            named = ", ".join(letters[i] for i in open_dims)
            raise UsageError(
                f"{FRONTEND}: input {name!r} of {model.name} has shape {_dims(shape)}: {which} (the model takes "
                f"any size there); give {'it' if len(open_dims) == 1 else 'them'}: --input-shape "
                f"{name}={'x'.join(shown)} or input_shapes={{{name!r}: ({', '.join(shown)})}} with your {named}"
            )
        if any(d <= 0 for d in shape):
            raise UsageError(f"{FRONTEND}: input {name!r} has a zero or negative dim: {_dims(shape)}")
        inputs.append(KerasInput(name, tuple(shape), dtype))
    if len({i.name for i in inputs}) != len(inputs):
        raise UsageError(f"{FRONTEND}: input names must be distinct, got {', '.join(i.name for i in inputs)}")
    return inputs


#: Names for the dims of an input by rank, in Keras's channels-last layout, for the placeholders of a suggestion.
_DIM_NAMES = {2: ("N", "C"), 3: ("N", "L", "C"), 4: ("N", "H", "W", "C"), 5: ("N", "D", "H", "W", "C")}


def _placeholders(rank: int) -> tuple[str, ...]:
    return _DIM_NAMES.get(rank, tuple(f"D{i}" for i in range(rank)))


def _dims(shape: Sequence[int | None]) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


def call_args(model, tensors: Sequence[Any]) -> tuple:
    """Positional arguments of ``model.call`` for the input tensors: one tensor, a list (Functional models, and
    ``call(self, inputs)``), or one argument each."""
    if len(tensors) == 1:
        return (tensors[0],)
    if _model_inputs(model) is None and len(_call_parameters(model)) >= len(tensors):
        return tuple(tensors)
    return (list(tensors),)


def accepts_training(model) -> bool:
    try:
        parameters = inspect.signature(model.call).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "training" or p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)


def build(keras, model, inputs: Sequence[KerasInput]) -> None:
    """Build a subclassed model by calling it on symbolic tensors (creates its variables; computes nothing)."""
    symbolic = [keras.KerasTensor(i.shape, dtype=i.dtype) for i in inputs]
    try:
        with common.quiet(TF_LOGGERS, log, fds=()):
            model(*call_args(model, symbolic))
    except Exception as e:  # noqa: BLE001 - the user's model cannot be built: one line
        raise FrontendError(
            f"{FRONTEND}: cannot build {model.name} on inputs {', '.join(_dims(i.shape) for i in inputs)}: "
            f"{type(e).__name__}: {error_line(e)}; build it first (call it once, or model.build(...))"
        ) from None


def error_line(e: BaseException) -> str:
    """The line of a TensorFlow or Keras error that says what went wrong: the last line of TensorFlow's ``in user
    code:`` tracebacks; the cause inside Keras's ``Exception encountered when calling ...`` wrapper."""
    lines = [line.strip() for line in common.strip_ansi(str(e)).splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    if lines[0].startswith("in user code"):
        return common.shorten(lines[-1])
    if lines[0].startswith("Exception encountered when calling") and len(lines) > 1:
        body = [line for line in lines[1:] if not line.startswith("•")]
        body = body[: next((i for i, line in enumerate(body) if line.startswith("Arguments received")), len(body))]
        after = [i + 1 for i, line in enumerate(body) if line.endswith("Error encountered:") and i + 1 < len(body)]
        if after or body:
            return common.shorten(body[after[0]] if after else body[0])
    return common.shorten(lines[0])


