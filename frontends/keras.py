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
  variables and writes it as ``BatchNormalization`` (:func:`~flopcount.frontends.keras_rewrites.fuse_batch_norms`), so a Keras model and its PyTorch
  twin count the same. Keras computes ``LayerNormalization`` from the moments with the same arithmetic (9 FLOPs
  per element and 4 per row, where ONNX ``LayerNormalization`` counts 1 per element); the frontend writes it as
  ``LayerNormalization`` too, in inference and training graphs alike (a layer norm has no batch statistics), also
  after a convolution, whose NCHW layout tf2onnx computes the moments in (:func:`~flopcount.frontends.keras_rewrites.fuse_layer_norms`).
  Element-wise arithmetic by a constant identity element that Keras traces (swish's
  ``1.0·x``, a ``Rescaling`` offset of 0) computes nothing and is removed (:func:`~flopcount.frontends.keras_rewrites.drop_identity_arithmetic`;
  tf2onnx folds it away itself in some graphs and not in others), and a negation multiplied by a constant is
  folded into it (:func:`~flopcount.frontends.keras_rewrites.fold_negations`: exact gelu's ``−x·(1/√2)``), so that exact gelu counts 5 FLOPs per
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
import inspect
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import onnx

from flopcount.errors import FrontendError, UsageError, first_line
from flopcount.pipeline.graph import walk_graphs

from . import common
from . import keras_rewrites as rewrites
from .keras_inputs import (
    DEFAULT_BATCH,
    FRONTEND,
    TF_LOGGERS,
    KerasInput,
    accepts_training,
    build,
    call_args,
    check_model,
    check_opset,
    error_line,
    import_frameworks,
    tensorflow_running,
    traced_inputs,
)

if TYPE_CHECKING:
    import keras

    from flopcount.options import CountOptions
    from flopcount.reporting.report import Report

__all__ = ["DEFAULT_BATCH", "count_model", "from_keras", "import_frameworks", "load_factory", "to_onnx"]

log = logging.getLogger(__name__)

_CACHE_FORMAT = 4  # bump when the conversion pipeline changes what it writes (4: sealed entries)
_TF2ONNX_LOGGER = "tf2onnx"
#: Top-level packages whose classes the cache key covers by version instead of by source.
_FRAMEWORK_PACKAGES = ("keras", "tensorflow", "tf_keras")
#: tf2onnx's line for an operator it cannot convert.
_UNSUPPORTED_OP = re.compile(r"Tensorflow op \[(?P<node>[^\]:]+): (?P<op>\w+)\] is not supported")


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
        ONNX opset of the default domain (default: :data:`flopcount.frontends.export.DEFAULT_OPSET`, 18, the newest
        tf2onnx 1.17 writes).
    cache_dir : path, bool or None
        Conversion cache folder; ``None`` or ``True``: ``$FLOPCOUNT_CACHE`` or ``~/.cache/flopcount``;
        ``False``: no cache.
    **count_kwargs
        The settings of the count (``convention``, ``strict``, ``batch``, ``mode``, ...: the fields of
        :class:`~flopcount.options.CountOptions`), made into one record and checked here, before the conversion
        (:func:`count_model` takes the record). ``batch`` sets dim 0 of every input before the conversion, so the
        graph is converted at that batch.

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
    common.check_frontend_arguments("from_keras", training=training, opset=opset, cache_dir=cache_dir)
    options, training = common.options_of("from_keras", count_kwargs, training)
    return count_model(model, input_shapes, options, training=training, opset=opset, cache_dir=cache_dir)


def count_model(
    model: keras.Model,
    input_shapes: Any,
    options: CountOptions,
    *,
    training: bool | None = None,
    opset: int | None = None,
    cache_dir: str | os.PathLike | bool | None = None,
) -> Report:
    """:func:`from_keras` under the settings of ``options``: the model converted (in training with ``training``;
    ``None`` follows ``options.mode``, at the batch ``options.batch``) and counted; ``options.trainable`` is, when
    None, the model's trainable variables."""
    from flopcount.counting import count_options

    if training is None:
        training = options.mode == "train"
    converted = to_onnx(model, input_shapes, training=training, batch=options.batch, opset=opset,
                        cache_dir=cache_dir)
    if options.trainable is None:  # the variables become initializers named by their paths
        names = {t.name for t in converted.graph.initializer}
        paths = [w.path for w in model.trainable_weights]
        options = dataclasses.replace(options, trainable=paths if all(p in names for p in paths) else None)
    return count_options(converted, options)


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
    from . import export as ex

    common.check_frontend_arguments("to_onnx", training=training, opset=opset, cache_dir=cache_dir,
                                    training_may_be_none=False)
    _, keras, tf2onnx = import_frameworks()
    check_model(keras, model)
    check_opset(tf2onnx, opset)
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0):
        raise UsageError(f"{FRONTEND}: batch must be a positive int, got {batch!r}")
    inputs = traced_inputs(model, input_shapes, batch)
    if not model.built:
        build(keras, model, inputs)
    opset = ex.DEFAULT_OPSET if opset is None else opset

    def produce() -> onnx.ModelProto:
        what = f"{model.name}{' (training)' if training else ''}"
        with tensorflow_running(f"converting {what} with tf2onnx"):
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
# Conversion
# ---------------------------------------------------------------------------------------------------------------


def _convert(model, inputs: Sequence[KerasInput], training: bool, opset: int) -> onnx.ModelProto:
    """Trace ``model.stateless_call`` with the variables as inputs, convert it with tf2onnx, and turn the variable
    inputs into weightless initializers."""
    from . import export as ex

    tf, keras, tf2onnx = import_frameworks()
    trainable, non_trainable = list(model.trainable_variables), list(model.non_trainable_variables)
    variables = trainable + non_trainable
    # Internal names, unlike any tf2onnx writes; renamed after the conversion.
    input_specs = [tf.TensorSpec(i.shape, i.dtype, name=f"fc_input_{k}") for k, i in enumerate(inputs)]
    weight_specs = [tf.TensorSpec(tuple(v.shape), v.dtype, name=f"fc_weight_{k}") for k, v in enumerate(variables)]
    signature = [input_specs, weight_specs[: len(trainable)], weight_specs[len(trainable):]]
    kwargs = {"training": training} if accepts_training(model) else {}
    output_count: list[int] = []

    def forward(xs, trainable_values, non_trainable_values):
        outputs, _ = model.stateless_call(trainable_values, non_trainable_values, *call_args(model, xs), **kwargs)
        flat = keras.tree.flatten(outputs)
        output_count.append(len(flat))
        return {f"fc_output_{k}": y for k, y in enumerate(flat)}

    function = tf.function(forward, input_signature=signature)
    converter_records: list[logging.LogRecord] = []
    with common.quiet(TF_LOGGERS, log, fds=(1,)), _captured_records(_TF2ONNX_LOGGER, converter_records):
        try:
            concrete = function.get_concrete_function(*signature)
        except Exception as e:  # noqa: BLE001 - tracing the user's model failed: one line
            raise FrontendError(
                f"{FRONTEND}: tracing {model.name} with tf.function failed: {type(e).__name__}: {error_line(e)}; "
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
    rewrites.fuse_batch_norms(converted, set(weight_names))
    rewrites.fuse_layer_norms(converted, set(weight_names))
    rewrites.fold_negations(converted, set(weight_names))
    rewrites.drop_identity_arithmetic(converted, set(weight_names))
    rewrites.drop_unread_constants(converted, set(weight_names))
    rewrites.initializers_to_constants(converted)
    location = f"{model.name}.weights"
    converted = ex.make_weightless(converted, location)
    rewrites.weights_to_initializers(converted, variables, weight_names, location)
    _write_layer_scopes(converted, model)
    ex.strip_metadata(converted)
    return converted


def _write_layer_scopes(converted: onnx.ModelProto, model) -> None:
    """Record, on every node of the main graph, the chain of Keras layers that computed it (their paths, as
    ``block1/c1``), in the module-scope metadata that per-module counts read (:data:`.export.SCOPES_KEY`).

    tf2onnx names a node after the TensorFlow name scopes it ran in: the layers' call scopes (a layer's name,
    with ``_1``, ``_2`` ... for its calls) followed by scopes of the operations inside a layer
    (``stem_bn_1/batchnorm/add_1``); a segment is a layer only where it names a child of the layer before it.
    """
    from .export import SCOPES_KEY

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
    (``flopcount/pipeline/shapes/bodies.py`` settles the body's states and stacked outputs). The inlining helper's options are
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


# ---------------------------------------------------------------------------------------------------------------
# Error messages
# ---------------------------------------------------------------------------------------------------------------


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
        detail = f"{type(error).__name__}: {error_line(error)}"
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


def _fingerprint(model, inputs: Sequence[KerasInput], training: bool, opset: int) -> str:
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
