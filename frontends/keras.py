"""TensorFlow-Keras frontend: count a Keras 3 model by converting it with tf2onnx to a weightless ONNX graph.

>>> import flopcount, keras  # doctest: +SKIP
>>> model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])  # doctest: +SKIP
>>> flopcount.from_keras(model).total.flops  # batch 1: 2*64*10 for the products + 10 for the bias  # doctest: +SKIP
1290

**Conversion.** The model is traced as a pure function of its inputs *and its variables*:
``tf.function(lambda x, trainable, non_trainable: model.stateless_call(trainable, non_trainable, x))`` with an input
signature holding every variable's shape and dtype, converted with ``tf2onnx.convert.from_graph_def``; the variable
inputs of the ONNX graph then become initializers, those of 1 KiB or more references to ``<model name>.weights``, a
file that is never written (smaller ones keep their values). Weights are never read by the count, and the large
ones are not even copied by the conversion. Facts about TensorFlow 2.21 / Keras 3.15 / tf2onnx 1.17 behind this choice:

* ``tf2onnx.convert.from_keras`` *does* accept a Keras 3 model (a Functional ResNet50 converts), but it freezes the
  variables into constants first, and TensorFlow's grappler, which tf2onnx runs on the frozen graph, then rewrites
  the graph **by the weights' values**: a convolution bias or BatchNormalization shift that is all zeros (as in
  any model built with ``weights=None``) is removed, and BatchNormalization's scale is folded into the convolution
  kernel. The counted graph would depend on the weights (Keras ResNet50 lost its 53 bias adds and 53 batch norms).
  It is also slow: 42 s for ResNet50 against 7 s here.
* With the variables as function inputs nothing can be folded, so the graph is the computation Keras runs.
  ``Conv2D``'s bias becomes the ONNX ``Conv`` bias input (or an ``Add`` of the same cost, as for ResNet50's
  stem, whose ``ZeroPadding2D`` tf2onnx folds into the convolution). Convolutions run in NCHW between
  ``Transpose`` nodes (zero cost).
* Grouped and depth-wise convolutions (``Conv2D(groups>1)``) run, in Keras's TensorFlow backend, inside a
  ``tf.function(jit_compile=True)``, which the traced graph calls through a ``PartitionedCall`` marked
  ``_XlaMustCompile``/``_noinline``; tf2onnx converts no such call. The marks are dropped before the conversion
  (:func:`_inlinable`), so that grappler inlines the plain ``Conv2D`` inside, which tf2onnx writes as ``Conv``
  with ``group=G``. Exact ``gelu`` is ``0.5·x·erfc(−x/√2)``; tf2onnx 1.17 has no ``Erfc``, which this frontend
  writes as ``1 − Erf(x)`` (:func:`_math_handlers`).
* **One architecture, one count.** Keras 3 computes an inference BatchNormalization as ``x·inv + (beta −
  mean·inv)`` with ``inv = gamma / sqrt(var + eps)``: a ``Mul`` and an ``Add`` per element and six per-channel
  operations recomputed at every call, where the ONNX ``BatchNormalization`` operator, which the PyTorch
  exporters write for the same layer, counts 1 per element. The frontend recognises that pattern on the four
  variables and writes it as ``BatchNormalization`` (:func:`_fuse_batch_norms`), so a Keras model and its PyTorch
  twin count the same. Keras computes ``LayerNormalization`` from the moments with the same arithmetic (9 FLOPs
  per element and 4 per row, where ONNX ``LayerNormalization`` counts 1 per element); the frontend writes it as
  ``LayerNormalization`` too, in inference and training graphs alike (a layer norm has no batch statistics), also
  after a convolution, whose NCHW layout tf2onnx computes the moments in (:func:`_fuse_layer_norms`).
  Element-wise arithmetic by a constant identity element that Keras traces (swish's
  ``1.0·x``, a ``Rescaling`` offset of 0) computes nothing and is removed (:func:`_drop_identity_arithmetic`;
  tf2onnx folds it away itself in some graphs and not in others), and a negation multiplied by a constant is
  folded into it (:func:`_fold_negations`: exact gelu's ``−x·(1/√2)``), so that exact gelu counts 5 FLOPs per
  element, as the PyTorch exporter's opset-18 decomposition (``x/√2``, ``Erf``, ``+ 1``, two products). What
  still differs from a PyTorch export is what Keras computes another way: BatchNormalization in training graphs
  (batch moments computed in the graph), and the layer norms the rewrite leaves as converted (below opset 17;
  axes other than the last ones; several layer norms of one tensor, whose moments tf2onnx computes once;
  ``rms_scaling``; half-precision inputs).
* ``training=True`` traces ``model.stateless_call(..., training=True)``: BatchNormalization on batch moments
  (``ReduceMean``, ``Sub``, ``Mul``, ``ReduceMean``; the moving-average update is not part of the output and is
  pruned) and Dropout active. Keras 3 draws Dropout's mask with ``StatelessRandomUniformV2`` (seeded through
  ``StatelessRandomGetKeyCounter``), which tf2onnx 1.17 cannot convert; this frontend maps it to ONNX
  ``RandomUniform`` (not counted, like every random generator) and drops the key/counter node. The keep/drop select
  that follows is written by tf2onnx as ``GreaterOrEqual``, ``Not``, ``Cast``, ``Mul`` and ``Add``, and counted as
  such.
* The model must use the TensorFlow backend of Keras 3 (``KERAS_BACKEND=tensorflow``, the default); tf_keras
  (Keras 2) models are not accepted.

**Inputs.** ``input_shapes`` fixes the dims the model leaves open: a batch dim of ``None`` becomes ``batch`` (the
``count`` argument) or :data:`DEFAULT_BATCH` = 1; any other open dim must be given. Shapes are in the model's own
layout (channels last for Keras image models: ``(1, 224, 224, 3)``). Each shape is traced separately (the graph has
static shapes).

**Cache.** Conversions are cached as ``keras-<key>.onnx`` (see :mod:`flopcount.frontends.common` for the folder)
by a hash of the model's configuration (``get_config()`` of the model and of every layer, the source digest of
every class outside keras and tensorflow, variable paths, shapes and dtypes; never their values), the input
names, shapes and dtypes, the training flag, the opset and the tensorflow, keras, tf2onnx, onnx and flopcount
versions.

**Logs.** ``TF_CPP_MIN_LOG_LEVEL`` is set to 2 (unless already set) before TensorFlow is imported, and stays set:
TensorFlow reads it when it first logs, which may be after the import. What TensorFlow's C++ code still writes to
stderr while it is imported or converts a model (absl's oneDNN notice, which ignores that variable; everything when
TensorFlow was imported before flopcount set it), tf2onnx's log records and TensorFlow's Python warnings go to
flopcount's DEBUG log; a progress line shows after a second (importing TensorFlow takes 3 to 8 s, converting
ResNet50 about 7 s, counting it 0.1 s).

tensorflow, keras and tf2onnx are imported inside the functions that need them; importing this module needs only
onnx.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import logging
import math
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import onnx

from flopcount.errors import FrontendError, UsageError, first_line
from flopcount.graph import walk_graphs

from . import common

if TYPE_CHECKING:
    import keras

    from flopcount.report import Report

__all__ = ["DEFAULT_BATCH", "from_keras", "import_frameworks", "load_factory", "to_onnx"]

log = logging.getLogger(__name__)

FRONTEND = "keras"
INSTALL_HINT = 'pip install "flopcount[tf]"'
#: Batch size given to a ``None`` batch dim when neither ``input_shapes`` nor ``batch`` sets it.
DEFAULT_BATCH = 1
_CACHE_FORMAT = 4  # bump when the conversion pipeline changes what it writes (4: sealed entries)
#: Seconds a conversion runs before the progress indicator appears.
_PROGRESS_DELAY_S = 1.0
#: Python loggers of TensorFlow, quieted while it imports and converts unless flopcount's logging is at DEBUG.
_TF_LOGGERS = ("tensorflow", "absl", "h5py")
_TF2ONNX_LOGGER = "tf2onnx"
#: Top-level packages whose classes the cache key covers by version instead of by source.
_FRAMEWORK_PACKAGES = ("keras", "tensorflow", "tf_keras")
#: The lines of TensorFlow's C++ (absl) logging, written straight to stderr.
_TF_NOISE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\)|[IWE]\d{4} [\d:. ]+\d+ \S+:\d+\] ")
#: tf2onnx's line for an operator it cannot convert.
_UNSUPPORTED_OP = re.compile(r"Tensorflow op \[(?P<node>[^\]:]+): (?P<op>\w+)\] is not supported")


@dataclasses.dataclass(frozen=True)
class _Input:
    name: str
    shape: tuple[int, ...]
    dtype: str


# ---------------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------------


def from_keras(
    model: keras.Model,
    input_shapes: Any = None,
    training: bool | None = None,
    *,
    opset: int | None = None,
    cache_dir: str | os.PathLike | bool | None = None,
    **count_kwargs: Any,
) -> Report:
    """Convert a Keras 3 model to ONNX with tf2onnx (weightless) and count it with :func:`flopcount.count`.

    Parameters
    ----------
    model : keras.Model
        The model (Functional, Sequential or subclassed; TensorFlow backend). A subclassed model that has not been
        built is built by a symbolic call on ``input_shapes`` (no computation, no data).
    input_shapes : shape, sequence of shapes, or mapping of input name to shape, optional
        The input shapes, in the model's layout (``(1, 224, 224, 3)``). ``None`` (the default) takes them from
        ``model.inputs`` with a ``None`` batch dim set to ``batch`` or :data:`DEFAULT_BATCH` (1); a ``None`` in a
        given shape's dim 0 is the batch too, and inputs a mapping does not name keep the model's shapes. Other
        dims the model leaves open must be given. Needed for a model without ``inputs`` (subclassed), whose graph
        inputs are then named after the mapping's keys or ``call``'s parameters.
    training : bool, optional
        Convert the graph as it runs in training (BatchNormalization on batch moments, Dropout active). ``None``
        (the default) follows ``mode``: True when ``mode="train"``. With ``training=True`` the count gets
        ``mode="train"`` (forward and backward) unless ``mode`` is given.
    opset : int, optional
        ONNX opset of the default domain (default: :data:`flopcount.models.export.DEFAULT_OPSET`, 18, the newest
        tf2onnx 1.17 writes).
    cache_dir : path, bool or None
        Conversion cache folder; ``None`` or ``True``: ``$FLOPCOUNT_CACHE`` or ``~/.cache/flopcount``;
        ``False``: no cache.
    **count_kwargs
        Passed to :func:`flopcount.count` (``convention``, ``strict``, ``batch``, ``mode``, ...). ``batch`` sets
        dim 0 of every input before the conversion, so the graph is converted at that batch.

    Returns
    -------
    Report
        The same report :func:`flopcount.count` gives for the converted file.

    Raises
    ------
    FrontendError
        TensorFlow, Keras 3 or tf2onnx is missing, or the model cannot be traced or converted (the message names
        the TensorFlow op tf2onnx cannot convert, when it reports one).
    UsageError
        ``model`` is not a Keras model, or ``input_shapes`` is malformed or leaves a dim open.
    """
    from flopcount.counting import count

    common.check_frontend_arguments("from_keras", training=training, opset=opset, cache_dir=cache_dir)
    common.check_count_kwargs("from_keras", count_kwargs)
    training = common.training_flag(training, count_kwargs, log)
    converted = to_onnx(model, input_shapes, training=training, batch=count_kwargs.get("batch"), opset=opset,
                        cache_dir=cache_dir)
    if count_kwargs.get("trainable") is None:  # the variables become initializers named by their paths
        names = {t.name for t in converted.graph.initializer}
        paths = [w.path for w in model.trainable_weights]
        count_kwargs["trainable"] = paths if all(p in names for p in paths) else None
    return count(converted, **count_kwargs)


def to_onnx(
    model: keras.Model,
    input_shapes: Any = None,
    *,
    training: bool = False,
    batch: int | None = None,
    opset: int | None = None,
    cache_dir: str | os.PathLike | bool | None = None,
    path: str | os.PathLike | None = None,
) -> onnx.ModelProto:
    """Convert ``model`` to a weightless ONNX model (cached); optionally also write it to ``path``.

    The arguments are those of :func:`from_keras`; ``batch`` sets dim 0 of every input. Graph inputs are named
    after the model's inputs, outputs after its output layers (``output_<i>`` where it has none), initializers
    after the variables' paths (``conv1_conv/kernel``).
    """
    from flopcount.models import export as ex

    common.check_frontend_arguments("to_onnx", training=training, opset=opset, cache_dir=cache_dir,
                                    training_may_be_none=False)
    _, keras, tf2onnx = import_frameworks()
    _check_model(keras, model)
    _check_opset(tf2onnx, opset)
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0):
        raise UsageError(f"{FRONTEND}: batch must be a positive int, got {batch!r}")
    inputs = _inputs(model, input_shapes, batch)
    if not model.built:
        _build(keras, model, inputs)
    opset = ex.DEFAULT_OPSET if opset is None else opset

    def produce() -> onnx.ModelProto:
        what = f"{model.name}{' (training)' if training else ''}"
        with _tensorflow_running(f"converting {what} with tf2onnx"):
            return _convert(model, inputs, training, opset)

    signature = [[i.name, list(i.shape), str(i.dtype)] for i in inputs]
    return common.export_through_cache(
        cache_dir, FRONTEND, lambda: _fingerprint(model, inputs, training, opset), produce, path, log,
        signature=signature,
    )


def load_factory(spec: str) -> keras.Model:
    """Import ``package.module:factory``, call the factory and return the Keras model it makes.

    The spec may give the factory's arguments, as Python literals:
    ``keras.applications:MobileNetV3Small(weights=None, input_shape=(224, 224, 3))``; without them it is called
    with none. The current directory is searched first (as ``python -m`` does). ``factory`` may be dotted.
    Weights are never loaded by flopcount: a factory whose ``weights`` default is not ``None``
    (``keras.applications``' ``"imagenet"``) is refused until the spec says ``weights=None``, so that nothing is
    downloaded (see :func:`flopcount.frontends.common.load_factory`).
    """
    return common.load_factory(
        spec, option="--keras", frontend=FRONTEND, kind="a keras.Model", import_framework=import_frameworks,
        accepts=lambda made: isinstance(made, import_frameworks()[1].Model),
    )


# ---------------------------------------------------------------------------------------------------------------
# Frameworks
# ---------------------------------------------------------------------------------------------------------------


def import_frameworks():
    """``(tensorflow, keras, tf2onnx)``, imported quietly (see **Logs** above).

    Raises FrontendError naming the ``tf`` extra when one is missing, and when Keras is not Keras 3 on its
    TensorFlow backend.
    """
    modules = [sys.modules.get(name) for name in ("tensorflow", "keras", "tf2onnx")]
    if any(module is None for module in modules):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with _tensorflow_running("importing TensorFlow"), common.quiet(_TF_LOGGERS, log, fds=()):
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
def _tensorflow_running(label: str) -> Iterator[None]:
    """While TensorFlow imports or converts: its C++ log lines, which it writes to stderr whatever
    ``TF_CPP_MIN_LOG_LEVEL`` says when it was imported before that was set, go to the DEBUG log; anything else
    written to stderr meanwhile (flopcount's own log records) is written there afterwards; the progress line
    (after :data:`_PROGRESS_DELAY_S`) goes to the terminal."""
    written: list[str] = []
    try:
        with common.captured_fd(2, written) as terminal, \
                common.progress(label, delay=_PROGRESS_DELAY_S, log=log, stream=terminal):
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
        return importlib.import_module(name)
    except ImportError:
        raise FrontendError(f"{FRONTEND}: {label} is not installed; {INSTALL_HINT}") from None


def _check_opset(tf2onnx, opset: int | None) -> None:
    """Refuse an opset newer than the installed tf2onnx writes (read from tf2onnx itself)."""
    newest = max(getattr(getattr(tf2onnx, "constants", None), "OPSET_TO_IR_VERSION", None) or {0: 0})
    if opset is not None and newest and opset > newest:
        raise UsageError(f"{FRONTEND}: opset {opset} is newer than tf2onnx {getattr(tf2onnx, '__version__', '?')} "
                         f"writes; give an opset of at most {newest}")


def _check_model(keras, model: Any) -> None:
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


def _inputs(model, input_shapes: Any, batch: int | None) -> list[_Input]:
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
        inputs.append(_Input(name, tuple(shape), dtype))
    if len({i.name for i in inputs}) != len(inputs):
        raise UsageError(f"{FRONTEND}: input names must be distinct, got {', '.join(i.name for i in inputs)}")
    return inputs


#: Names for the dims of an input by rank, in Keras's channels-last layout, for the placeholders of a suggestion.
_DIM_NAMES = {2: ("N", "C"), 3: ("N", "L", "C"), 4: ("N", "H", "W", "C"), 5: ("N", "D", "H", "W", "C")}


def _placeholders(rank: int) -> tuple[str, ...]:
    return _DIM_NAMES.get(rank, tuple(f"D{i}" for i in range(rank)))


def _dims(shape: Sequence[int | None]) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


def _call_args(model, tensors: Sequence[Any]) -> tuple:
    """Positional arguments of ``model.call`` for the input tensors: one tensor, a list (Functional models, and
    ``call(self, inputs)``), or one argument each."""
    if len(tensors) == 1:
        return (tensors[0],)
    if _model_inputs(model) is None and len(_call_parameters(model)) >= len(tensors):
        return tuple(tensors)
    return (list(tensors),)


def _accepts_training(model) -> bool:
    try:
        parameters = inspect.signature(model.call).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "training" or p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)


def _build(keras, model, inputs: Sequence[_Input]) -> None:
    """Build a subclassed model by calling it on symbolic tensors (creates its variables; computes nothing)."""
    symbolic = [keras.KerasTensor(i.shape, dtype=i.dtype) for i in inputs]
    try:
        with common.quiet(_TF_LOGGERS, log, fds=()):
            model(*_call_args(model, symbolic))
    except Exception as e:  # noqa: BLE001 - the user's model cannot be built: one line
        raise FrontendError(
            f"{FRONTEND}: cannot build {model.name} on inputs {', '.join(_dims(i.shape) for i in inputs)}: "
            f"{type(e).__name__}: {_error_line(e)}; build it first (call it once, or model.build(...))"
        ) from None


# ---------------------------------------------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------------------------------------------


def _convert(model, inputs: Sequence[_Input], training: bool, opset: int) -> onnx.ModelProto:
    """Trace ``model.stateless_call`` with the variables as inputs, convert it with tf2onnx, and turn the variable
    inputs into weightless initializers."""
    from flopcount.models import export as ex

    tf, keras, tf2onnx = import_frameworks()
    trainable, non_trainable = list(model.trainable_variables), list(model.non_trainable_variables)
    variables = trainable + non_trainable
    # Internal names, unlike any tf2onnx writes; renamed after the conversion.
    input_specs = [tf.TensorSpec(i.shape, i.dtype, name=f"fc_input_{k}") for k, i in enumerate(inputs)]
    weight_specs = [tf.TensorSpec(tuple(v.shape), v.dtype, name=f"fc_weight_{k}") for k, v in enumerate(variables)]
    signature = [input_specs, weight_specs[: len(trainable)], weight_specs[len(trainable):]]
    kwargs = {"training": training} if _accepts_training(model) else {}
    output_count: list[int] = []

    def forward(xs, trainable_values, non_trainable_values):
        outputs, _ = model.stateless_call(trainable_values, non_trainable_values, *_call_args(model, xs), **kwargs)
        flat = keras.tree.flatten(outputs)
        output_count.append(len(flat))
        return {f"fc_output_{k}": y for k, y in enumerate(flat)}

    function = tf.function(forward, input_signature=signature)
    converter_records: list[logging.LogRecord] = []
    with common.quiet(_TF_LOGGERS, log, fds=(1,)), _captured_records(_TF2ONNX_LOGGER, converter_records):
        try:
            concrete = function.get_concrete_function(*signature)
        except Exception as e:  # noqa: BLE001 - tracing the user's model failed: one line
            raise FrontendError(
                f"{FRONTEND}: tracing {model.name} with tf.function failed: {type(e).__name__}: {_error_line(e)}; "
                "make the model's call() traceable, or convert it yourself and count the .onnx file"
            ) from None
        input_names = [t.name for t in concrete.inputs if t.dtype != tf.dtypes.resource]
        output_names = [t.name for t in concrete.outputs if t.dtype != tf.dtypes.resource]
        try:
            converted, _ = tf2onnx.convert.from_graph_def(
                _inlinable(_graph_def(concrete)), name=model.name,
                input_names=input_names, output_names=output_names, opset=opset,
                custom_op_handlers={**_random_handlers(), **_math_handlers()},
                tensors_to_rename=tf2onnx.convert.tensor_names_from_structed(concrete, input_names, output_names),
            )
        except Exception as e:  # noqa: BLE001 - any converter failure becomes one line
            raise FrontendError(_failure_message(model.name, converter_records, e)) from None
    unconverted = sorted({node.op_type for graph in walk_graphs(converted.graph) for node in graph.node
                          if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type)})
    if unconverted:
        raise FrontendError(_failure_message(model.name, converter_records, None, unconverted))
    try:
        onnx.checker.check_model(converted)
    except onnx.checker.ValidationError as e:
        raise FrontendError(
            f"{FRONTEND}: the graph tf2onnx made of {model.name} does not check: {first_line(e)}"
        ) from None

    names = {spec.name: i.name for spec, i in zip(input_specs, inputs)}
    names.update({f"fc_output_{k}": name for k, name in enumerate(_output_names(model, output_count[-1]))})
    weight_names = _unique([v.path for v in variables], taken=set(names.values()))
    names.update({spec.name: name for spec, name in zip(weight_specs, weight_names)})
    _rename(converted, names)
    converted.graph.name = model.name
    _fuse_batch_norms(converted, set(weight_names))
    _fuse_layer_norms(converted, set(weight_names))
    _fold_negations(converted, set(weight_names))
    _drop_identity_arithmetic(converted, set(weight_names))
    _drop_unread_constants(converted, set(weight_names))
    _initializers_to_constants(converted)
    location = f"{model.name}.weights"
    converted = ex.make_weightless(converted, location)
    _weights_to_initializers(converted, variables, weight_names, location)
    _write_layer_scopes(converted, model)
    ex.strip_metadata(converted)
    return converted


def _write_layer_scopes(converted: onnx.ModelProto, model) -> None:
    """Record, on every node of the main graph, the chain of Keras layers that computed it (their paths, as
    ``block1/c1``), in the module-scope metadata that per-module counts read (:data:`models.export.SCOPES_KEY`).

    tf2onnx names a node after the TensorFlow name scopes it ran in: the layers' call scopes (a layer's name,
    with ``_1``, ``_2`` ... for its calls) followed by scopes of the operations inside a layer
    (``stem_bn_1/batchnorm/add_1``); a segment is a layer only where it names a child of the layer before it.
    """
    from flopcount.models.export import SCOPES_KEY

    def children(layer) -> dict[str, Any]:
        inner = getattr(layer, "layers", None) or getattr(layer, "_layers", None) or ()
        return {child.name: child for child in inner}

    top = children(model)
    for node in converted.graph.node:
        chain: list[str] = []
        level = top
        for segment in node.name.split("/")[:-1]:
            name = segment if segment in level else re.sub(r"_\d+$", "", segment)
            layer = level.get(name)
            if layer is None:
                break
            chain.append(f"{chain[-1]}/{name}" if chain else name)
            level = children(layer)
        if chain:
            node.metadata_props.add(key=SCOPES_KEY, value=repr(["", *chain, node.name]))


@contextlib.contextmanager
def _captured_records(name: str, sink: list[logging.LogRecord]) -> Iterator[None]:
    """Collect the WARNING and ERROR records of logger ``name`` (tf2onnx names the ops it cannot convert there)
    and keep them from flopcount's output unless flopcount logs at DEBUG."""
    logger = logging.getLogger(name)
    debug = log.isEnabledFor(logging.DEBUG)

    class Sink(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            sink.append(record)

    handler = Sink(logging.WARNING)
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    if not debug:
        logger.setLevel(logging.WARNING)
        logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        for record in sink:
            log.debug("tf2onnx: %s", record.getMessage())


_WHILE_OPS = frozenset({"While", "StatelessWhile"})


def _graph_def(concrete):
    """The traced graph as tf2onnx is given it. A graph with a while loop (Keras's recurrent layers: ``LSTM``,
    ``GRU``, ``SimpleRNN``, ``Bidirectional``) has its function calls inlined first, with the loop kept as one
    functional ``While`` (``lower_control_flow=False``, what tf2onnx's own ``from_function`` does): left to the
    grappler run inside ``from_graph_def``, the loop is lowered to ``Enter``/``Exit`` frames whose
    ``TensorListReserve``/``TensorListSetItem`` tf2onnx does not convert. tf2onnx then writes the loop as an ONNX
    ``Loop`` (its trip count the sequence length, its condition the while test), which the count follows
    (``flopcount/shapes.py`` settles the body's states and stacked outputs). The inlining helper's options are
    looked up on it, so a TensorFlow that renames them falls back to the plain graph (and its one-line refusal)."""
    graph_def = concrete.graph.as_graph_def(add_shapes=True)
    ops = {node.op for node in graph_def.node} | {node.op for f in graph_def.library.function for node in f.node_def}
    if not ops & _WHILE_OPS:
        return graph_def
    inline = _inliner()
    options = {k: v for k, v in (("lower_control_flow", False), ("aggressive_inlining", True))
               if inline is not None and k in inspect.signature(inline).parameters}
    if "lower_control_flow" not in options:
        log.debug("no convert_variables_to_constants_v2 with lower_control_flow: the while loop is left to tf2onnx")
        return graph_def
    return inline(concrete, **options).graph.as_graph_def(add_shapes=True)


def _inliner():
    """TensorFlow's ``convert_variables_to_constants_v2`` (the helper tf2onnx's own ``from_function`` calls), or
    None where this TensorFlow has none: the while loop is then left to tf2onnx as it is."""
    try:
        from tensorflow.python.framework import convert_to_constants
    except ImportError:
        return None
    return getattr(convert_to_constants, "convert_variables_to_constants_v2", None)


def _inlinable(graph_def):
    """``graph_def`` with its calls of XLA-compiled functions made plain calls (in place; returned).

    Keras's TensorFlow backend runs some operations inside ``tf.function(jit_compile=True)``: grouped and
    depth-wise convolutions (``Conv2D(groups>1)``, which TensorFlow's CPU kernels do not run) and channels-first 3D
    convolutions. The traced graph calls them through a ``PartitionedCall`` marked ``_XlaMustCompile``, whose
    function is marked ``_noinline``; tf2onnx converts no function call, and grappler inlines none so marked. The
    function body is the plain operation (a ``Conv2D`` whose kernel has ``C_in/G`` input channels, which tf2onnx
    converts to a ``Conv`` with ``group=G``), so dropping the marks lets grappler inline it: the computation is
    the same, only where XLA would compile it is forgotten.
    """
    marks = ("_XlaMustCompile", "_noinline", "_XlaCompile", "_XlaScope")
    nodes = [*graph_def.node, *(node for function in graph_def.library.function for node in function.node_def)]
    for node in nodes:
        for mark in marks:
            if mark in node.attr:
                del node.attr[mark]
    for function in graph_def.library.function:
        for mark in marks:
            if mark in function.attr:
                del function.attr[mark]
    return graph_def


def _math_handlers() -> dict[str, tuple]:
    """tf2onnx handlers for TensorFlow math ops it cannot convert, written as the ONNX ops that compute them.

    ``Erfc`` (exact ``gelu``: ``0.5·x·erfc(−x/√2)``) becomes ``1 − Erf(x)``: a ``Sub`` of an ``Erf``.
    """
    from tf2onnx import utils

    def erfc(ctx, node, name, args) -> None:
        import numpy as np

        x = node.input[0]
        dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(x))
        erf = ctx.make_node("Erf", [x], op_name_scope=name)
        one = ctx.make_const(utils.make_name(f"{name}/one"), np.array(1, dtype=dtype))
        node.type = "Sub"
        for key in list(node.attr):
            del node.attr[key]
        ctx.replace_inputs(node, [one.output[0], erf.output[0]])

    return {"Erfc": (erfc, [])}


def _random_handlers() -> dict[str, tuple]:
    """tf2onnx handlers for the stateless random ops Keras 3 draws Dropout's (and GaussianNoise's) masks with."""
    from tf2onnx import utils

    def key_counter(ctx, node, name, args) -> None:
        """StatelessRandomGetKeyCounter: its consumers drop it below; tf2onnx then deletes it as unused."""

    def generator(onnx_op: str, attributes: dict[str, float]):
        def handler(ctx, node, name, args) -> None:
            shape = node.inputs[0]
            utils.make_sure(shape.is_const(), "%s %s needs a constant shape", node.type, name)
            dims = [int(d) for d in shape.get_tensor_value(as_list=True)]
            dtype = ctx.get_dtype(node.output[0])
            node.type = onnx_op
            ctx.replace_inputs(node, [])
            for key in list(node.attr):
                del node.attr[key]
            node.set_attr("shape", dims)
            node.set_attr("dtype", dtype)
            for key, value in attributes.items():
                node.set_attr(key, value)

        return handler

    return {
        "StatelessRandomGetKeyCounter": (key_counter, []),
        "StatelessRandomUniformV2": (generator("RandomUniform", {"low": 0.0, "high": 1.0}), []),
        "StatelessRandomNormalV2": (generator("RandomNormal", {"mean": 0.0, "scale": 1.0}), []),
    }


def _output_names(model, count: int) -> list[str]:
    names = list(getattr(model, "output_names", None) or [])
    if len(names) != count or len(set(names)) != count or not all(isinstance(n, str) and n for n in names):
        names = [f"output_{k}" for k in range(count)]
    return names


def _unique(names: Sequence[str], taken: set[str]) -> list[str]:
    seen = set(taken)
    unique = []
    for name in names:
        candidate, n = name, 1
        while candidate in seen:
            candidate, n = f"{name}_{n}", n + 1
        seen.add(candidate)
        unique.append(candidate)
    return unique


def _rename(model: onnx.ModelProto, names: Mapping[str, str]) -> None:
    """Rename, in place, the tensors ``names`` maps (graph inputs and outputs, node inputs and outputs, also in
    subgraphs, which may read outer tensors)."""
    def rename(values) -> None:
        for i, value in enumerate(values):
            if value in names:
                values[i] = names[value]

    for graph in walk_graphs(model.graph):
        for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
            value.name = names.get(value.name, value.name)
        for node in graph.node:
            rename(node.input)
            rename(node.output)


def _read_by_subgraphs(graph) -> set[str]:
    """Names the nodes of ``graph``'s subgraphs (If/Loop/Scan bodies, at any depth) read."""
    return {name for g in walk_graphs(graph) if g is not graph for node in g.node for name in node.input}


class _Patterns:
    """What the normalization rewrites look up in a converted graph: the producer and readers of each tensor, the
    constants the trace made (never the variables), inferred shapes, and the parameters they read."""

    def __init__(self, model: onnx.ModelProto, variables: set[str]) -> None:
        graph = model.graph
        self.graph, self.variables = graph, variables
        self.producer = {out: node for node in graph.node for out in node.output}
        self.readers: dict[str, list] = {}
        for node in graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        for value in graph.output:
            self.readers.setdefault(value.name, []).append(None)
        for name in _read_by_subgraphs(graph):  # an If/Loop body reading an outer tensor: a reader outside
            self.readers.setdefault(name, []).append(None)
        self.constants = {t.name: t for t in graph.initializer if t.name not in variables}
        inferred = onnx.shape_inference.infer_shapes(model)
        self.shapes = {
            v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
            for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
            if v.type.tensor_type.HasField("shape")
        }

    def made(self, name: str, op_type: str):
        """The node of type ``op_type`` that writes ``name``; None if another kind of node or none does."""
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    @staticmethod
    def split(node, first) -> tuple[str, str] | None:
        """The two inputs of ``node``, the one ``first(name)`` accepts first; None when neither is accepted."""
        if node is None or len(node.input) != 2:
            return None
        a, b = node.input
        return (a, b) if first(a) else (b, a) if first(b) else None

    def constant(self, name: str):
        """The value of a constant the trace made (epsilon, reduction axes; never a variable), or None."""
        from onnx import numpy_helper

        return numpy_helper.to_array(self.constants[name]) if name in self.constants else None

    def parameter(self, name: str, rank: int) -> tuple[str, int, int, list] | None:
        """``(variable, channels, axis, reshape nodes)`` for a per-channel variable read as it is (along the last
        axis of a rank-``rank`` tensor) or through a ``Reshape`` to ``[1, .., C, .., 1]`` of that rank."""
        reshape = self.made(name, "Reshape")
        source = reshape.input[0] if reshape is not None else name
        dims = self.shapes.get(source) if source in self.variables else None
        if dims is None or len(dims) != 1 or not dims[0]:
            return None
        if reshape is None:
            return source, dims[0], rank - 1, []
        out = self.shapes.get(name)
        if out is None or len(out) != rank or sorted(out) != [1] * (rank - 1) + [dims[0]] or dims[0] == 1:
            return None
        return source, dims[0], out.index(dims[0]), [reshape]

    def internal(self, nodes: Sequence[Any], last) -> bool:
        """Whether every output of ``nodes`` but ``last``'s is read only by ``nodes``."""
        inside = {id(node) for node in nodes}
        return all(reader is not None and id(reader) in inside
                   for node in nodes if node is not last for reader in self.readers.get(node.output[0], []))

    def replace(self, fusions: Sequence[tuple[Any, Sequence[Any], Sequence[Any]]]) -> None:
        """Apply ``(last node, nodes removed, nodes written in last's place)`` rewrites, in place."""
        dropped = {id(node) for _, removed, _ in fusions for node in removed}
        written = {id(last): nodes for last, _, nodes in fusions}
        kept = []
        for node in self.graph.node:
            if id(node) in written:
                kept.extend(written[id(node)])
            elif id(node) not in dropped:
                kept.append(node)
        del self.graph.node[:]
        self.graph.node.extend(kept)


def _fuse_batch_norms(model: onnx.ModelProto, variables: set[str]) -> None:
    """Write, in place, each inference BatchNormalization as the ONNX ``BatchNormalization`` operator.

    Keras 3 computes an inference batch norm (``tf.nn.batch_normalization``) as ``y = x·inv + (beta − mean·inv)``
    with ``inv = gamma · 1/sqrt(var + eps)``; tf2onnx writes that as ``Add``, ``Sqrt``, ``Reciprocal`` and three
    ``Mul`` and a ``Sub`` on the per-channel variables, then a ``Mul`` and an ``Add`` on the activations (2 FLOPs
    per element, where ONNX's ``BatchNormalization``, which the PyTorch exporters write for the same layer, counts
    1). Where exactly that pattern reads four per-channel variables (``gamma``, ``beta``, moving mean and
    variance; as they are, or reshaped to broadcast along one axis, as Keras does for ``axis=3`` or
    ``axis=1``) and a constant epsilon, and its intermediate tensors feed nothing else, it is replaced by
    ``BatchNormalization(x, gamma, beta, mean, var, epsilon)``, which computes the same; where the channels are
    not on axis 1 (Keras's default is the last axis) two ``Transpose`` nodes (free) move them there and back.
    Anything else (training-mode batch statistics, ``center=False`` or ``scale=False``) stays as converted.
    """
    from onnx import helper

    view = _Patterns(model, variables)
    made, split, shapes = view.made, view.split, view.shapes
    fusions = []
    for add in model.graph.node:
        if add.op_type != "Add":
            continue
        pair = split(add, lambda n: made(n, "Mul") is not None)
        if pair is None or made(pair[1], "Sub") is None:
            continue
        xs, shift = made(pair[0], "Mul"), made(pair[1], "Sub")
        mean_inv = made(shift.input[1], "Mul")
        if mean_inv is None:
            continue
        found = split(xs, lambda n: made(n, "Mul") is not None and n in mean_inv.input)
        if found is None:
            continue
        inv, x = made(found[0], "Mul"), found[1]
        mean = mean_inv.input[1] if mean_inv.input[0] == inv.output[0] else mean_inv.input[0]
        found = split(inv, lambda n: made(n, "Reciprocal") is not None)
        if found is None:
            continue
        reciprocal, gamma = made(found[0], "Reciprocal"), found[1]
        sqrt = made(reciprocal.input[0], "Sqrt")
        var_eps = made(sqrt.input[0], "Add") if sqrt is not None else None
        found = split(var_eps, lambda n: n in view.constants)
        rank = len(shapes.get(x) or ())
        if found is None or rank < 2 or shapes.get(add.output[0]) != shapes.get(x):
            continue
        eps = view.constant(found[0])
        params = [view.parameter(name, rank) for name in (gamma, shift.input[0], mean, found[1])]
        if eps.size != 1 or None in params or len({(c, axis) for _, c, axis, _ in params}) != 1:
            continue
        channels, axis = params[0][1], params[0][2]
        if axis == 0 or shapes[x][axis] != channels:
            continue
        removed = [var_eps, sqrt, reciprocal, inv, mean_inv, shift, xs, add, *(n for *_, ns in params for n in ns)]
        if not view.internal(removed, add):
            continue
        names, epsilon, base = [name for name, *_ in params], float(eps.reshape(())), add.name or add.output[0]
        if axis == 1:
            fusions.append((add, removed, [helper.make_node("BatchNormalization", [x, *names], [add.output[0]],
                                                            name=base, epsilon=epsilon)]))
            continue
        to_first = [0, axis, *(i for i in range(1, rank) if i != axis)]
        back = sorted(range(rank), key=to_first.__getitem__)
        fusions.append((add, removed, [
            helper.make_node("Transpose", [x], [f"{base}/channels_first"], name=f"{base}/channels_first",
                             perm=to_first),
            helper.make_node("BatchNormalization", [f"{base}/channels_first", *names], [f"{base}/normalized"],
                             name=base, epsilon=epsilon),
            helper.make_node("Transpose", [f"{base}/normalized"], [add.output[0]], name=f"{base}/channels_back",
                             perm=back),
        ]))
    if fusions:
        view.replace(fusions)
        log.debug("wrote %d Keras batch norm(s) as ONNX BatchNormalization", len(fusions))


#: The first opset of the default domain that has the ``LayerNormalization`` operator.
_LAYER_NORM_OPSET = 17


def _fuse_layer_norms(model: onnx.ModelProto, variables: set[str]) -> None:
    """Write, in place, each Keras LayerNormalization as the ONNX ``LayerNormalization`` operator.

    Keras 3 computes a layer norm (``ops.layer_normalization``) from the moments of ``x`` over the normalized
    axes: ``inv = gamma · 1/sqrt(mean((x − mean)²) + eps)``, ``y = x·inv + (−mean·inv + beta)``. tf2onnx writes
    that as two ``ReduceMean``, a ``Sub`` and a ``Mul`` for the moments, ``Add``, ``Sqrt`` and ``Reciprocal`` per
    row, a ``Neg`` and three ``Mul`` and two ``Add`` (9 FLOPs per element and 4 per row, where ONNX's
    ``LayerNormalization``, which the PyTorch exporters write for the same layer, counts 1 per element). Where
    exactly that pattern normalizes the trailing axes of ``x`` with variables of the normalized shape (as they are,
    or reshaped to broadcast) and a constant epsilon, and its intermediate tensors feed nothing else, it is
    replaced by ``LayerNormalization(x, gamma, beta, axis, epsilon)``, which computes the same; the variables keep
    their names. Without ``beta`` (``center=False``) the operator's optional B is left out; without ``gamma``
    (``scale=False``) its Scale, which it requires, is ones, as the PyTorch exporter writes it for
    ``LayerNorm(elementwise_affine=False)``, made by a ``ConstantOfShape`` (free), so that they are no initializer,
    which the report would count as a buffer of the model.

    After a convolution tf2onnx computes the moments, one or both, in the convolution's NCHW layout, on the tensor
    that a ``Transpose`` turns into ``x``, and moves the per-row statistics between the layouts with ``Reshape``
    nodes; where the transpose keeps the order of the other axes, the statistics keep theirs, so that is the same
    computation, and it is fused too. Without gamma it computes the products in NCHW too, and moves them to the
    result's layout with a ``Transpose`` each (or, without beta either, the per-row ``−mean·inv`` with a
    ``Reshape``); ``LayerNormalization`` then reads ``x`` transposed to the result's layout (a ``Transpose``, free).
    Anything else stays as converted: axes other than the last ones (``axis=1`` of a sequence); ``rms_scaling``;
    the casts around a half-precision input; several axes without gamma after a convolution (their order differs
    between the layouts); moments shared by several layer norms of one tensor (tf2onnx computes them once); a
    model below opset 17, which has no ``LayerNormalization`` (raising its opset could change what other operators
    mean).
    """
    import numpy as np
    from onnx import helper, numpy_helper

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < _LAYER_NORM_OPSET or not any(node.op_type == "ReduceMean" for node in model.graph.node):
        return
    view = _Patterns(model, variables)
    fusions, added, claimed = [], [], set()
    for add in model.graph.node:
        if add.op_type != "Add" or len(add.input) != 2:
            continue
        for scaled, shifted in (tuple(add.input), tuple(reversed(add.input))):
            found = _layer_norm(view, add, scaled, shifted)
            if found is not None:
                break
        if found is None or claimed & {id(node) for node in found.removed}:
            continue
        claimed |= {id(node) for node in found.removed}
        base = add.name or add.output[0]
        written, scale = [], found.gamma
        if scale is None:  # ones made by ConstantOfShape: no initializer, so no parameter or buffer
            scale = f"{base}/scale"
            added.append(numpy_helper.from_array(np.array(found.dims, np.int64), f"{scale}/shape"))
            written.append(helper.make_node("ConstantOfShape", [f"{scale}/shape"], [scale], name=scale,
                                            value=numpy_helper.from_array(np.ones(1, found.dtype))))
        x = found.x
        if found.perm is not None:  # x in the result's layout (free)
            x = f"{base}/x"
            written.append(helper.make_node("Transpose", [found.x], [x], name=x, perm=found.perm))
        inputs = [x, scale, *([found.beta] if found.beta is not None else [])]
        fusions.append((add, found.removed, [*written, helper.make_node(
            "LayerNormalization", inputs, [add.output[0]], name=base, axis=found.axis, epsilon=found.epsilon,
        )]))
    if fusions:
        view.replace(fusions)
        model.graph.initializer.extend(added)
        log.debug("wrote %d Keras layer norm(s) as ONNX LayerNormalization", len(fusions))


@dataclasses.dataclass(frozen=True)
class _LayerNorm:
    """A Keras layer norm found by :func:`_layer_norm`: what ``LayerNormalization`` reads, and the nodes it
    replaces."""

    x: str
    perm: list[int] | None  # of the Transpose to the result's layout, where the products are computed in another
    gamma: str | None
    beta: str | None
    axis: int
    epsilon: float
    dims: list[int]
    dtype: Any
    removed: list


def _layer_norm_output_moves(view: _Patterns, scaled: str, shifted: str):
    """The products may be computed in the layout of a convolution's output and moved to the result's layout: each
    by a Transpose, or the per-row −mean·inv (without gamma and beta) by Reshape nodes. ``(perm or None, the
    Transpose nodes, scaled and shifted before them)``, or None where the two moves disagree."""
    out_perm, out_moves = None, []
    transpose = view.made(scaled, "Transpose")
    if transpose is not None:
        out_perm = _perm(transpose)
        if out_perm is None:
            return None
        scaled = transpose.input[0]
        out_moves.append(transpose)
        moved = view.made(shifted, "Transpose")
        if moved is not None:
            if _perm(moved) != out_perm:
                return None
            shifted = moved.input[0]
            out_moves.append(moved)
    return out_perm, out_moves, scaled, shifted


@dataclasses.dataclass(frozen=True)
class _Moments:
    """The statistics of a Keras layer norm: the mean node, the variance node (``mean((x − mean)²)``), the
    ``x − mean`` node, ``1/sqrt(var + eps)`` (``rstd``), gamma (None when not scaled), eps, and every node they use."""

    mean: Any
    variance: Any
    diff: Any
    rstd: str
    gamma: str | None
    eps: Any
    nodes: tuple  # mean, diff, square, variance, plus_eps, sqrt, reciprocal, neg
    times_gamma: Any
    moves: tuple


def _layer_norm_moments(view: _Patterns, negated: str, inv: str) -> _Moments | None:
    """From ``−mean`` and ``inv`` (``1/sqrt(var + eps)``, times gamma when scaled) back to the moments, or None."""
    made = view.made
    # −mean, and the mean of the tensor the moments are computed on; the per-row statistics may pass through
    # Reshape nodes (moves between layouts) anywhere on their way
    moves: list = []
    neg = _through_reshapes(view, negated, "Neg", moves)
    mean = _through_reshapes(view, neg.input[0], "ReduceMean", moves) if neg is not None else None
    if mean is None:
        return None
    # inv: 1/sqrt(var + eps), times gamma when scaled
    times_gamma, gamma = made(inv, "Mul"), None
    rstd = inv
    if times_gamma is not None:
        found = view.split(times_gamma, lambda n: _through_reshapes(view, n, "Reciprocal", []) is not None)
        if found is None:
            return None
        rstd, gamma = found
    reciprocal = _through_reshapes(view, rstd, "Reciprocal", moves)
    sqrt = _through_reshapes(view, reciprocal.input[0], "Sqrt", moves) if reciprocal is not None else None
    plus_eps = _through_reshapes(view, sqrt.input[0], "Add", moves) if sqrt is not None else None
    found = view.split(plus_eps, lambda n: n in view.constants)
    if found is None:
        return None
    eps, variance = view.constant(found[0]), _through_reshapes(view, found[1], "ReduceMean", moves)
    # var = mean((x − mean)²)
    square = made(variance.input[0], "Mul") if variance is not None else None
    if square is None or len(square.input) != 2 or square.input[0] != square.input[1]:
        return None
    diff = made(square.input[0], "Sub")
    if diff is None or len(diff.input) != 2:
        return None
    centred = _through_reshapes(view, diff.input[1], "ReduceMean", moves)
    if centred is not mean or variance is mean:
        return None
    return _Moments(mean, variance, diff, rstd, gamma, eps,
                    (mean, diff, square, variance, plus_eps, sqrt, reciprocal, neg), times_gamma, tuple(moves))


def _layer_norm(view: _Patterns, add, scaled: str, shifted: str) -> _LayerNorm | None:
    """The Keras layer norm whose output ``add`` writes as ``scaled + shifted`` (``x·inv`` and ``−mean·inv``,
    plus ``beta`` when centered), or None."""
    made, shapes = view.made, view.shapes
    moved = _layer_norm_output_moves(view, scaled, shifted)
    if moved is None:
        return None
    out_perm, out_moves, scaled, shifted = moved
    shifted_read, shifted_moves = shifted, []
    times_x = made(scaled, "Mul")
    plus_beta = made(shifted, "Add")
    beta = None
    if plus_beta is not None:
        found = view.split(plus_beta, lambda n: made(n, "Mul") is not None)
        if found is None:
            return None
        times_mean, beta = made(found[0], "Mul"), found[1]
    else:
        times_mean = _through_reshapes(view, shifted, "Mul", shifted_moves)
    if times_x is None or times_mean is None or len(times_x.input) != 2 or len(times_mean.input) != 2:
        return None
    if out_perm is not None and len(out_moves) == 1 and not shifted_moves:
        return None  # the product moved to the result's layout, the shift not
    shared = [name for name in times_x.input if name in times_mean.input]
    if len(shared) != 1 or times_x.input[0] == times_x.input[1] or times_mean.input[0] == times_mean.input[1]:
        return None
    inv = shared[0]
    x = next(name for name in times_x.input if name != inv)
    negated = next(name for name in times_mean.input if name != inv)

    moments = _layer_norm_moments(view, negated, inv)
    if moments is None:
        return None
    mean, variance, diff, rstd, gamma, eps = (moments.mean, moments.variance, moments.diff, moments.rstd,
                                              moments.gamma, moments.eps)

    # The layouts of the moments: x, and the tensor a Transpose turned into x (a convolution's NCHW output), on
    # which tf2onnx may compute either moment. Both reduce the same axes of x; where the transpose keeps the order
    # of the other axes, the per-row statistics keep theirs, so Reshape nodes move them from one layout to another.
    x_shape = shapes.get(x)
    if not x_shape or None in x_shape:
        return None
    rank = len(x_shape)
    layouts = {x: list(range(rank))}
    transpose = made(x, "Transpose")
    if transpose is not None and _perm(transpose) is not None and len(_perm(transpose)) == rank:
        layouts[transpose.input[0]] = _perm(transpose)
    normalized, reduced = [], {}
    for node, tensor in ((mean, mean.input[0]), (variance, diff.input[0])):
        perm, axes, shape = layouts.get(tensor), _reduce_axes(view, node), shapes.get(tensor)
        if perm is None or axes is None or shape is None or [shape[p] for p in perm] != x_shape:
            return None
        normalized.append(sorted(perm.index(a) for a in axes))  # as axes of x
        reduced[tensor] = [1 if i in axes else d for i, d in enumerate(shape)]
    axes = normalized[0]
    rows = [i for i in range(rank) if i not in axes]
    if normalized[1] != axes or any(_reorders([perm[i] for i in rows]) for tensor, perm in layouts.items()
                                    if tensor in reduced):
        return None
    # the result's layout: the normalized axes last, in the order they have in x
    out_perm = out_perm or list(range(rank))
    axis = rank - len(axes)
    out_axes = [i for i in range(rank) if out_perm[i] in axes]
    if len(out_perm) != rank or out_axes != list(range(axis, rank)) or _reorders([out_perm[i] for i in out_axes]):
        return None
    out_shape = [x_shape[p] for p in out_perm]
    row = [1 if i in axes else d for i, d in enumerate(x_shape)]
    if (shapes.get(mean.output[0]) != reduced[mean.input[0]] or shapes.get(diff.input[1]) != reduced[diff.input[0]]
            or shapes.get(negated) != row or shapes.get(rstd) != row or shapes.get(times_x.output[0]) != x_shape
            or shapes.get(add.output[0]) != out_shape):
        return None
    if shifted_moves and (shapes.get(times_mean.output[0]) != row or _reorders(out_perm[:axis])
                          or shapes.get(shifted_read) != out_shape[:axis] + [1] * (rank - axis)):
        return None

    dims = [x_shape[i] for i in axes]
    broadcast = [d if i in axes else 1 for i, d in enumerate(x_shape)]
    parameters = []
    for name in (gamma, beta):
        parameter = _normalized_parameter(view, name, dims, broadcast) if name is not None else (None, [])
        if parameter is None:
            return None
        parameters.append(parameter)
    (gamma, gamma_moves), (beta, beta_moves) = parameters
    if eps is None or eps.size != 1 or eps.dtype.kind != "f":
        return None
    removed = list({id(node): node for node in (
        *moments.nodes, times_x, times_mean, moments.times_gamma, plus_beta, *moments.moves, *gamma_moves,
        *beta_moves, *out_moves, *shifted_moves, add) if node is not None}.values())
    if not view.internal(removed, add):
        return None
    perm = None if out_perm == list(range(rank)) else out_perm
    return _LayerNorm(x, perm, gamma, beta, axis - rank, float(eps.reshape(())), dims, eps.dtype, removed)


def _perm(transpose) -> list[int] | None:
    """The ``perm`` of a ``Transpose`` node, or None where it has none (reversing the dims)."""
    return next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)


def _reorders(axes: Sequence[int]) -> bool:
    """Whether ``axes`` are out of increasing order."""
    return list(axes) != sorted(axes)


def _through_reshapes(view: _Patterns, name: str, op_type: str, moves: list):
    """The node of type ``op_type`` that writes ``name``, directly or through ``Reshape`` nodes (appended to
    ``moves``); None when another kind of node writes it."""
    passed = []
    node = view.producer.get(name)
    while node is not None and node.op_type == "Reshape" and op_type != "Reshape":
        passed.append(node)
        node = view.producer.get(node.input[0])
    if node is None or node.op_type != op_type:
        return None
    moves.extend(passed)
    return node


def _reduce_axes(view: _Patterns, node) -> list[int] | None:
    """The sorted non-negative axes a ``ReduceMean`` that keeps its dims reduces (attribute before opset 18, a
    constant input from 18), or None (another kind of reduction, or axes that are not constants)."""
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    rank = len(view.shapes.get(node.input[0]) or ())
    if attributes.get("keepdims", 1) != 1 or not rank:
        return None
    axes = attributes.get("axes")
    if axes is None and len(node.input) > 1:
        constant = view.constant(node.input[1])
        axes = None if constant is None else [int(a) for a in constant.reshape(-1)]
    if not axes:
        return None
    axes = sorted({a % rank for a in axes if -rank <= a < rank})
    return axes if len(axes) == len(set(axes)) and axes else None


def _normalized_parameter(view: _Patterns, name: str, dims: list[int],
                          broadcast: list[int]) -> tuple[str, list] | None:
    """``(variable, reshape nodes)`` for a variable of shape ``dims`` (the normalized dims) read as it is or through
    a ``Reshape``, with the shape ``broadcast`` (the normalized dims in place, 1 elsewhere) or its trailing dims
    after leading 1s; None otherwise."""
    reshape = view.made(name, "Reshape")
    source = reshape.input[0] if reshape is not None else name
    read = view.shapes.get(name)
    if source not in view.variables or view.shapes.get(source) != dims or read is None:
        return None
    leading = len(broadcast) - len(read)
    if leading < 0 or read != broadcast[leading:] or any(d != 1 for d in broadcast[:leading]):
        return None
    return source, [reshape] if reshape is not None else []


def _fold_negations(model: onnx.ModelProto, variables: set[str]) -> None:
    """Fold, in place, a ``Neg`` whose only reader multiplies it by a constant the trace made into that constant:
    ``(−x)·c`` is ``x·(−c)``. Keras's exact ``gelu`` computes ``erfc(−x·(1/√2))``; the ``Neg`` is arithmetic on a
    constant that a converter folds (the PyTorch exporter writes ``x/√2``), so the count does not depend on it.
    A variable (a weight) is never folded."""
    from onnx import numpy_helper

    view = _Patterns(model, variables)
    graph = model.graph
    folded, added = set(), []
    for node in graph.node:
        if node.op_type != "Mul":
            continue
        pair = view.split(node, lambda n: view.made(n, "Neg") is not None)
        if pair is None or pair[1] not in view.constants:
            continue
        neg, constant = view.made(pair[0], "Neg"), view.constant(pair[1])
        if constant.dtype.kind != "f" or any(r is not node for r in view.readers.get(neg.output[0], [])):
            continue
        negated = f"{pair[1]}/negated"
        if negated not in view.constants and all(t.name != negated for t in added):
            added.append(numpy_helper.from_array(-constant, negated))
        node.input[list(node.input).index(pair[0])] = neg.input[0]
        node.input[list(node.input).index(pair[1])] = negated
        folded.add(id(neg))
    if folded:
        graph.initializer.extend(added)
        kept = [node for node in graph.node if id(node) not in folded]
        del graph.node[:]
        graph.node.extend(kept)
        log.debug("folded %d negation(s) into constants", len(folded))


#: Element-wise ops whose constant operand can be the identity element.
_IDENTITY_ELEMENT = {"Mul": 1.0, "Add": 0.0, "Sub": 0.0, "Div": 1.0}


def _drop_identity_arithmetic(model: onnx.ModelProto, variables: set[str]) -> None:
    """Remove, in place, element-wise arithmetic by a constant identity element (``1.0·x``, ``x + 0``, ``x − 0``,
    ``x / 1``) that Keras traces: the ``beta`` of ``swish``/``silu`` (``x·sigmoid(1.0·x)``), a ``Rescaling``
    offset of 0. They compute nothing; the PyTorch exporters do not write them for the same layers, and
    tf2onnx removes them itself where it folds constants, so whether they appear would depend on the path.

    Only a constant the trace made (never a variable: a weight that happens to be 1 is computed with) whose every
    element is the identity, on the side that does not change the result (``0 − x`` is not ``x``), and whose
    shape does not broadcast the other operand to a larger result, is removed; its output is renamed to the
    operand's name downstream.
    """
    from onnx import numpy_helper

    graph = model.graph
    constants = {t.name: t for t in graph.initializer if t.name not in variables}
    outputs = {v.name for v in graph.output} | _read_by_subgraphs(graph)
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
              if v.type.tensor_type.HasField("shape")}
    renamed: dict[str, str] = {}
    kept = []
    for node in graph.node:
        identity = _IDENTITY_ELEMENT.get(node.op_type)
        sides = (1,) if node.op_type in ("Sub", "Div") else (0, 1)
        operand = None
        if identity is not None and len(node.input) == 2 and node.output[0] not in outputs:
            for side in sides:
                name = node.input[side]
                tensor = numpy_helper.to_array(constants[name]) if name in constants else None
                if tensor is None or tensor.dtype.kind != "f" or not tensor.size or not (tensor == identity).all():
                    continue
                other = node.input[1 - side]
                if shapes.get(other) is not None and shapes.get(other) == shapes.get(node.output[0]):
                    operand = other
                    break
        if operand is None:
            kept.append(node)
            continue
        renamed[node.output[0]] = renamed.get(operand, operand)
    if not renamed:
        return
    for node in kept:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
    del graph.node[:]
    graph.node.extend(kept)
    log.debug("dropped %d element-wise operation(s) by a constant 1 or 0", len(renamed))


def _drop_unread_constants(model: onnx.ModelProto, variables: set[str]) -> None:
    """Remove, in place, the top-level initializers that are not variables and that no node reads any more (the
    epsilon of a fused batch norm, a dropped identity element)."""
    read = {name for graph in walk_graphs(model.graph) for node in graph.node for name in node.input}
    read |= {v.name for v in model.graph.output}
    kept = [t for t in model.graph.initializer if t.name in variables or t.name in read]
    if len(kept) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)


def _initializers_to_constants(model: onnx.ModelProto) -> None:
    """Turn, in place, the initializers tf2onnx wrote (the constants of the traced function: BatchNormalization's
    epsilon, Dropout's rate, reshape targets) into ``Constant`` nodes, so that the initializers of the final graph
    are the model's variables (and, from :func:`~flopcount.models.export.make_weightless`, constants of 1 KiB or
    more): flopcount counts initializers as parameters."""
    for graph in walk_graphs(model.graph):
        constants = [onnx.helper.make_node("Constant", [], [tensor.name], name=tensor.name, value=tensor)
                     for tensor in graph.initializer]
        if not constants:
            continue
        nodes = [*constants, *graph.node]
        del graph.initializer[:]
        del graph.node[:]
        graph.node.extend(nodes)


def _weights_to_initializers(model: onnx.ModelProto, variables: Sequence[Any], names: Sequence[str],
                             location: str) -> None:
    """Make the graph inputs of the variables initializers, in place: of :data:`~flopcount.models.export.
    SIZE_THRESHOLD` bytes or more, references to ``location`` laid out after the tensors already there; smaller
    ones with their values. Floating-point variables the graph does not read are kept (they are parameters: in a
    training graph, BatchNormalization's moving statistics); other unread ones (random-generator states) dropped."""
    from flopcount.models import export as ex
    from onnx import helper, numpy_helper

    graph = model.graph
    declared = {value.name: value for value in graph.input}
    read = {name for g in walk_graphs(graph) for node in g.node for name in node.input}
    offset = 0
    for g in walk_graphs(graph):
        for tensor in g.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                entries = {entry.key: int(entry.value) for entry in tensor.external_data if entry.key != "location"}
                offset = max(offset, entries.get("offset", 0) + entries.get("length", 0))
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    kept_inputs = [value for value in graph.input if value.name not in set(names)]
    for variable, name in zip(variables, names):
        value = declared.get(name)
        if value is None:
            continue
        elem_type = value.type.tensor_type.elem_type
        if name not in read and elem_type not in floats:
            continue
        dims = [int(d) for d in variable.shape]
        np_dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        nbytes = math.prod(dims) * np_dtype.itemsize
        if nbytes >= ex.SIZE_THRESHOLD:
            tensor = onnx.TensorProto(name=name, data_type=elem_type, dims=dims)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, entry_value in (("location", location), ("offset", offset), ("length", nbytes)):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(entry_value)
            offset += nbytes
        else:
            tensor = numpy_helper.from_array(variable.numpy().astype(np_dtype).reshape(dims), name)
        graph.initializer.append(tensor)
    del graph.input[:]
    graph.input.extend(kept_inputs)


# ---------------------------------------------------------------------------------------------------------------
# Error messages
# ---------------------------------------------------------------------------------------------------------------


def _error_line(e: BaseException) -> str:
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


def _failure_message(name: str, records: Sequence[logging.LogRecord], error: BaseException | None,
                     unconverted: Sequence[str] = ()) -> str:
    messages = [record.getMessage() for record in records if record.levelno >= logging.ERROR]
    ops = list(unconverted)
    for message in messages:
        match = _UNSUPPORTED_OP.search(message)
        if match and match["op"] not in ops:
            ops.append(match["op"])
    first = next((m for m in messages if _UNSUPPORTED_OP.search(m)), messages[0] if messages else None)
    detail = common.shorten(first.splitlines()[0]) if first else None
    if error is not None:
        detail = f"{type(error).__name__}: {_error_line(error)}"
    if ops:
        return (
            f"{FRONTEND}: cannot convert {name} to ONNX: TensorFlow op {', '.join(ops)} has no ONNX conversion in "
            f"tf2onnx (tf2onnx: {detail}); replace that operation, or convert the model yourself and count the "
            ".onnx file"
        )
    return (
        f"{FRONTEND}: cannot convert {name} to ONNX with tf2onnx ({detail}); convert the model yourself and count "
        "the .onnx file"
    )


# ---------------------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------------------


def _config(obj) -> Any:
    try:
        return obj.get_config()
    except Exception:  # noqa: BLE001 - a layer without a serialisable config: covered by its class and variables
        return None


def _fingerprint(model, inputs: Sequence[_Input], training: bool, opset: int) -> str:
    """Hash of everything the converted graph depends on except weight values."""
    tf, keras, tf2onnx = import_frameworks()
    try:
        layers = list(model._flatten_layers(include_self=True, recursive=True))
    except AttributeError:
        layers = [model, *model.layers]
    described = []
    for layer in layers:
        cls = type(layer)
        described.append([layer.name, f"{cls.__module__}.{cls.__qualname__}",
                          common.class_digest(cls, _FRAMEWORK_PACKAGES), _config(layer)])
    document = {
        "format": _CACHE_FORMAT,
        "versions": {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "tf2onnx": tf2onnx.__version__,
            "onnx": onnx.__version__,
            "flopcount": common.dist_version("flopcount"),
        },
        "model": _config(model),
        "layers": described,
        "trainable": [[v.path, list(v.shape), str(v.dtype)] for v in model.trainable_variables],
        "non_trainable": [[v.path, list(v.shape), str(v.dtype)] for v in model.non_trainable_variables],
        "inputs": [[i.name, list(i.shape), i.dtype] for i in inputs],
        "training": bool(training),
        "opset": opset,
    }
    return common.cache_key(document)
