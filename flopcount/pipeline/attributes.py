"""The attributes of a graph's nodes as Python values for their formulas: defaults filled from the operator's
schema and types checked against it (:func:`node_attributes`), converted once per distinct node
(:class:`AttributeCache`: most nodes of a large graph share their op type and attributes)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

import onnx

from ..context import LONG_ATTRIBUTE, attribute_defaults, attribute_value, is_long
from ..errors import InvalidGraphError
from ..registry import DEFAULT_DOMAIN, canonical_domain, lookup
from . import validate
from .graph import GraphIndex
from .schema import schema as _schema

__all__ = ["AttributeCache", "node_attributes"]


@lru_cache(maxsize=None)
def _attribute_types(op_type: str, version: int, domain: str) -> Mapping[str, int]:
    schema = _schema(op_type, version, domain)
    return {} if schema is None else {name: a.type.value for name, a in schema.attributes.items()}


@lru_cache(maxsize=None)
def _defaults(op_type: str, version: int, domain: str) -> Mapping[str, Any]:
    schema = _schema(op_type, version, domain)
    return {} if schema is None else attribute_defaults(schema)


def node_attributes(node: onnx.NodeProto, name: str, opsets: Mapping[str, int], where: str, force: bool = False) -> dict[str, Any] | None:
    """The attributes of a node with a formula as Python values, defaults filled from the schema
    and types checked against it; None for zero-cost and unsupported nodes, whose attributes no
    formula reads.
    """
    domain = canonical_domain(node.domain)
    rule = lookup(domain, node.op_type)
    version = opsets.get(domain)
    if version is None and domain == DEFAULT_DOMAIN:
        raise InvalidGraphError(f"{where}: node {name!r} ({node.op_type}) uses the default domain, which the model does not import")
    if (rule is None or rule.zero_cost) and not force:
        return None  # no formula reads its attributes
    types = _attribute_types(node.op_type, version, domain) if version else {}
    for a in node.attribute:
        if a.type == onnx.AttributeProto.UNDEFINED:
            raise InvalidGraphError(f"{where}: node {name!r} ({node.op_type}): attribute {a.name!r} has no type; re-export the model")
        expected = types.get(a.name)
        if expected is not None:
            if a.type != expected:
                raise InvalidGraphError(
                    f"{where}: node {name!r} ({node.op_type}): attribute {a.name!r} is "
                    f"{onnx.AttributeProto.AttributeType.Name(a.type)}, but the spec wants "
                    f"{onnx.AttributeProto.AttributeType.Name(expected)}; fix the exporter or the model"
                )
    values = dict(_defaults(node.op_type, version, domain)) if version else {}
    for a in node.attribute:
        values[a.name] = attribute_value(a)
    return values


class AttributeCache:
    """:func:`node_attributes` for many nodes: nodes of one op type with the same attributes (most of
    a large graph) share one converted dict, which formulas only read."""

    def __init__(self, opsets: Mapping[str, int], where: str, ir_version: int = 0) -> None:
        self.opsets, self.where, self.ir_version = opsets, where, ir_version
        self._wanted: dict[tuple[str, str], bool] = {}
        self._converted: dict[tuple, dict[str, Any]] = {}
        self._checked: set[tuple] = set()

    def __call__(self, node: onnx.NodeProto, name: str, force: bool = False) -> dict[str, Any] | None:
        """The attributes of ``node`` (of a subgraph body, or asked for again with ``force`` for a backward formula);
        the main graph's nodes are read, and checked against their schemas, by :meth:`of_graph`."""
        op = (node.domain, node.op_type)
        wanted = self._wanted.get(op)
        if wanted is None:
            rule = lookup(canonical_domain(node.domain), node.op_type)
            wanted = self._wanted[op] = rule is not None and not rule.zero_cost
        if not (wanted or force):
            if node.domain in ("", "ai.onnx") and DEFAULT_DOMAIN not in self.opsets:
                node_attributes(node, name, self.opsets, self.where)  # raises: the domain is not imported
            return None
        attrs = node.attribute
        key = (op, *_blobs(node, attrs)) if attrs else op
        values = self._converted.get(key)
        if values is None:  # first of its kind: converted and checked against the schema
            values = self._converted[key] = node_attributes(node, name, self.opsets, self.where, force=True)
        return values

    def of_graph(self, index: GraphIndex) -> list[dict[str, Any] | None]:
        """What :meth:`__call__` gives for every node of the main graph ``index``, in graph order, each node first
        checked against its operator schema (once per distinct node: :func:`validate.check_node`); one loop, as
        this runs once per node of the largest graphs."""
        out: list[dict[str, Any] | None] = []
        append = out.append
        wanted_of, checked, converted = self._wanted, self._checked, self._converted
        undeclared = DEFAULT_DOMAIN not in self.opsets  # a default-domain node is then an error
        bare: dict[tuple, dict[str, Any] | None] = {}  # (op, arity) of nodes without attributes → what they give
        for k, (node, name, op, inputs, outputs) in enumerate(
                zip(index.protos, index.names, index.node_ops, index.node_inputs, index.node_outputs)):
            attrs = node.attribute
            if not attrs:  # most nodes: checked and converted once per operator and arity
                arity = (op, len(inputs), len(outputs))
                values = bare.get(arity, bare)
                if values is not bare:
                    append(values)
                    continue
            wanted = wanted_of.get(op)
            if wanted is None:
                rule = lookup(canonical_domain(op[0]), op[1])
                wanted = wanted_of[op] = rule is not None and not rule.zero_cost
            blobs = _blobs(node, attrs) if attrs else ()
            check = (op, (len(inputs), len(outputs)), *blobs)
            if check not in checked:
                checked.add(check)
                validate.check_node(node, k, (), self.opsets, self.ir_version, self.where)
            if not wanted:
                if undeclared and op[0] in ("", "ai.onnx"):
                    node_attributes(node, name, self.opsets, self.where)  # raises: the domain is not imported
                values = None
            else:
                key = (op, *blobs) if attrs else op
                values = converted.get(key)
                if values is None:  # first of its kind: converted and checked against the schema
                    values = converted[key] = node_attributes(node, name, self.opsets, self.where, force=True)
            if not attrs:
                bare[(op, len(inputs), len(outputs))] = values
            append(values)
        return out


def _blobs(node: onnx.NodeProto, attrs) -> tuple:
    """:func:`_blob` of each attribute of ``node``. A node of at most :data:`~flopcount.context.LONG_ATTRIBUTE`
    bytes holds no long attribute (each repeated value takes a byte at least), so that its attributes are serialized
    by one C-level loop, without asking each whether it is long."""
    if node.ByteSize() <= LONG_ATTRIBUTE:
        return tuple(map(_SERIALIZE, attrs))
    return tuple(map(_blob, attrs))


_SERIALIZE = onnx.AttributeProto.SerializeToString


def _blob(a: onnx.AttributeProto) -> bytes | "_Itself":
    """What tells an attribute apart for :class:`AttributeCache`: its bytes, or the attribute itself for a long
    repeated one (a tree ensemble's node lists: hundreds of MB to serialize, and no other node has them). Only an
    attribute of a repeated type is asked whether it is long: a scalar one (most of them) is serialized at once."""
    return _Itself(a) if a.type in _REPEATED_TYPES and is_long(a) else a.SerializeToString()


#: Attribute types whose values may be long lists (:func:`~flopcount.context.is_long`; UNDEFINED: an old model that
#: does not say).
_REPEATED_TYPES = frozenset({onnx.AttributeProto.UNDEFINED, onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS,
                             onnx.AttributeProto.STRINGS})


class _Itself:
    """A key equal only to itself that keeps ``value`` alive (protobuf messages cannot be hashed)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value
