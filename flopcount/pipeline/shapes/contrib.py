"""Shapes around operators of other domains (ONNX Runtime's contrib ops), which ONNX's inference does not know:
standard twins, the shape functions registered beside the formulas, and onnxruntime's symbolic inference."""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
from collections.abc import Mapping

import onnx
from onnx import ModelProto, helper

from ...context import TensorInfo
from ...errors import first_line
from ..graph import GraphIndex
from .guarded import infer
from .interpreter import with_constants
from .tensors import collect, static, value_info

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# operators of other domains (ONNX Runtime's contrib ops), which ONNX's inference does not know

# Fused ops whose output shapes are those of a standard op given the same leading inputs and the
# standard op's attributes; attributes the standard op does not have are dropped. Only for
# inference (counting still applies the fused op's own formula).
SHAPE_TWINS: Mapping[tuple[str, str], tuple[str, int]] = {
    ("com.microsoft", "FusedConv"): ("Conv", 3),
    ("com.microsoft", "FusedGemm"): ("Gemm", 3),
    ("com.microsoft", "FusedMatMul"): ("MatMul", 2),  # only without transposes (checked below)
    ("com.microsoft", "TransposeMatMul"): ("MatMul", 2),
    ("com.microsoft", "Gelu"): ("Relu", 1),
    ("com.microsoft", "FastGelu"): ("Relu", 1),
    ("com.microsoft", "QuickGelu"): ("Relu", 1),
    ("com.microsoft", "BiasGelu"): ("Add", 2),
    ("com.microsoft", "BiasAdd"): ("Add", 2),
}


def _twin(node: onnx.NodeProto, opset: int) -> onnx.NodeProto | None:
    twin = SHAPE_TWINS.get((node.domain, node.op_type))
    if twin is None:
        return None
    op, n_inputs = twin
    attrs = {a.name: a for a in node.attribute}
    if op == "MatMul" and any(helper.get_attribute_value(attrs[k]) for k in attrs if k.startswith("trans")):
        return None
    try:
        schema = onnx.defs.get_schema(op, opset)
    except onnx.defs.SchemaError:
        return None
    out = helper.make_node(op, list(node.input[:n_inputs]), list(node.output[:1]), name=node.name)
    out.attribute.extend(a for name, a in attrs.items() if name in schema.attributes)
    return out


def contrib_shapes(model: ModelProto, index: GraphIndex, tensors: dict, values: Mapping, where: str) -> dict:
    """Shapes around other-domain ops: standard twins for fused ops, then the shape functions registered
    beside the formulas, then, only for what those leave unknown, ONNX Runtime's symbolic shape inference
    (when onnxruntime is installed), which knows Attention, SkipLayerNormalization, EmbedLayerNormalization,
    GroupQueryAttention, MatMulNBits ... Partial results are kept."""
    opset = next((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), 0)
    scratch = with_constants(model, index, values) if values else model
    twinned = ModelProto()
    twinned.CopyFrom(scratch)
    changed = False
    for i, node in enumerate(twinned.graph.node):
        t = _twin(node, opset)
        if t is not None:
            twinned.graph.node[i].CopyFrom(t)
            changed = True
    base = twinned if changed else scratch
    merged = _merged(tensors, collect(infer(twinned, where), False) if changed else {})
    merged = _registered_shapes(base, index, merged, where)
    if _other_unknown(index, merged):  # onnxruntime's inference is slow to load: only when it is needed
        merged = _merged(merged, _ort_symbolic(base, where))
        merged = _registered_shapes(base, index, merged, where)  # what it settled may feed registered operators
    # declared in the model, so that later folding rounds infer past these nodes
    ops, outputs = index.node_ops, index.node_outputs
    settled = {o: merged[o] for k, (domain, _) in enumerate(ops) if domain not in ("", "ai.onnx")
               for o in outputs[k] if o and static(merged.get(o)) and not static(tensors.get(o))}
    if settled:
        kept = [vi for vi in model.graph.value_info if vi.name not in settled]
        del model.graph.value_info[:]
        model.graph.value_info.extend(kept + [value_info(n, t) for n, t in settled.items()])
    return merged


def _merged(tensors: Mapping[str, TensorInfo], found: Mapping[str, TensorInfo]) -> dict:
    """``tensors`` with what ``found`` knows better: a static shape, or a rank where there was none."""
    merged = dict(tensors)
    for k, v in found.items():
        prev = merged.get(k)
        if prev is None or (not prev.is_static and (v.is_static or prev.shape is None)):
            merged[k] = v
    return merged


def _other_unknown(index: GraphIndex, tensors: Mapping[str, TensorInfo]) -> bool:
    """Whether a node of another domain, or one ONNX has no schema for, that no registered shape function covers
    has an output of unknown shape (a registered function is the better judge: a ZipMap's sequence of maps has
    no tensor shape to find)."""
    from ...registry import lookup_shape

    ops, outputs = index.node_ops, index.node_outputs
    uncovered = {(domain, op) for domain, op in set(ops)
                 if (domain not in ("", "ai.onnx") or not onnx.defs.has(op, domain)) and not lookup_shape(domain, op)}
    return bool(uncovered) and any(not static(tensors.get(o)) for k, key in enumerate(ops) if key in uncovered
                                   for o in outputs[k] if o)


def _registered_shapes(model: ModelProto, index: GraphIndex, tensors: dict, where: str) -> dict:
    """Output types of other-domain nodes from the shape functions registered beside their formulas
    (:func:`flopcount.registry.shape_function`), in topological order; each round that settles some is
    followed by ONNX's inference, so that what follows them resolves, until nothing new settles."""
    from ...context import attribute_value
    from ...registry import lookup_shape

    ops, node_inputs, node_outputs = index.node_ops, index.node_inputs, index.node_outputs
    targets = [k for k in index.order if ops[k][0] not in ("", "ai.onnx") and lookup_shape(*ops[k])]
    # nodes whose shapes only onnxruntime's inference knows (SkipLayerNormalization, and
    # SimplifiedLayerNormalization, which onnxruntime writes in the default domain)
    others = [k for k in index.order if not lookup_shape(*ops[k]) and not onnx.defs.has(ops[k][1], ops[k][0])]
    settled: dict[str, TensorInfo] = {}
    for _ in range(len(targets)):
        new: dict[str, TensorInfo] = {}
        for k in targets:
            outs = node_outputs[k]
            if all(not o or static(tensors.get(o)) for o in outs):
                continue
            ins = tuple(tensors.get(n) if n else None for n in node_inputs[k])
            proto = index.protos[k]
            attrs = {a.name: attribute_value(a) for a in proto.attribute}
            try:
                types = lookup_shape(*ops[k])(ins, **attrs)
            except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError) as e:
                log.debug("%s: no output shapes for node %r (%s): %s", where, proto.name, ops[k][1], e)
                continue
            for o, t in zip(outs, types):
                if o and t is not None and not t[0] and tensors.get(o) is not None:  # a type ONNX's inference knows
                    t = (tensors[o].elem_type, t[1])
                info = TensorInfo(o, *t) if o and t is not None else None
                if info is not None and info.is_static and not static(tensors.get(o)):
                    new[o] = tensors[o] = info
        if not new:
            break
        settled.update(new)
        # the settled nodes' outputs become graph inputs of a scratch copy without those nodes, which
        # both ONNX's and onnxruntime's inference then start from
        scratch = ModelProto()
        scratch.CopyFrom(model)
        kept = [n for n in scratch.graph.node if not (n.output and all(not o or o in settled for o in n.output))]
        del scratch.graph.node[:]
        scratch.graph.node.extend(kept)
        scratch.graph.input.extend(value_info(n, t) for n, t in settled.items())
        found = collect(infer(scratch, where), False)
        if any(not static(found.get(o)) for k in others for o in node_outputs[k] if o):
            found.update((n, t) for n, t in _ort_symbolic(scratch, where).items() if t.is_static)
        tensors.update((n, t) for n, t in found.items() if t.is_static and not static(tensors.get(n)))
    return tensors


_ORT_SYMBOLIC = "flopcount._onnxruntime_symbolic_shape_infer"  # the name its module file is loaded under


@functools.cache
def symbolic_inference() -> type | None:
    """onnxruntime's ``SymbolicShapeInference`` class, None without onnxruntime. Loaded from its module file
    (``onnxruntime/tools/symbolic_shape_infer.py``, which needs only onnx, numpy, sympy and packaging) without
    running the ``onnxruntime.tools`` package's ``__init__``, which imports torch when torch is installed:
    seconds for a module that needs none of it. Imported as usual where that file cannot be loaded alone."""
    loaded = sys.modules.get("onnxruntime.tools.symbolic_shape_infer") or sys.modules.get(_ORT_SYMBOLIC)
    if loaded is None:
        try:
            spec = importlib.util.find_spec("onnxruntime")  # finds the package without importing it
        except (ImportError, ValueError):
            spec = None
        folders = list(spec.submodule_search_locations or ()) if spec is not None else []
        path = next((p for f in folders if os.path.isfile(p := os.path.join(f, "tools", "symbolic_shape_infer.py"))),
                    None)  # fmt: skip
        if path is not None:
            file_spec = importlib.util.spec_from_file_location(_ORT_SYMBOLIC, path)
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[_ORT_SYMBOLIC] = module
            try:
                file_spec.loader.exec_module(module)
                loaded = module
            except Exception as e:  # a release whose file needs its package: import it the usual way
                del sys.modules[_ORT_SYMBOLIC]
                log.debug("onnxruntime's symbolic_shape_infer.py does not load alone (%s)", first_line(e))
    if loaded is None:
        try:
            import onnxruntime.tools.symbolic_shape_infer as loaded
        except Exception as e:  # absent, or a package that fails on import: no symbolic inference
            log.debug("onnxruntime's symbolic shape inference is not available (%s)", first_line(e))
            return None
    return getattr(loaded, "SymbolicShapeInference", None)


def _ort_symbolic(model: ModelProto, where: str) -> dict[str, TensorInfo]:
    """ONNX Runtime's symbolic shape inference, driven step by step so that what it resolves is
    kept even when some node stops it (its ``infer_shapes`` would raise and write a file to the
    working directory). Nothing when onnxruntime is absent or its internals differ."""
    inference = symbolic_inference()
    if inference is None:
        return {}
    try:
        engine = inference(2**31 - 1, True, False, 0)
        engine._preprocess(model)
        while engine.run_:
            engine._infer_impl()
        engine._update_output_from_vi()
        return collect(engine.out_mp_, False)
    except Exception as e:  # an internal API of onnxruntime: degrade quietly
        log.debug("%s: onnxruntime symbolic shape inference gave up: %s", where, e)
        return {}


# --------------------------------------------------------------------------------------------
# bodies of If / Loop / Scan


