"""scikit-learn pipelines converted by skl2onnx, end to end: real estimators fitted on small generated data.

Every tensor's resolved shape equals onnxruntime's real one (every node output read back from a run of B samples),
and the counts equal closed forms written from the fitted estimator's own attributes: F features, K classes,
the trees' depths (``tree_.max_depth``: branch nodes on the deepest path), S support vectors.
One dot product of F features is F MACs = 2F FLOPs; a scaler is (x − offset)·scale, 2 FLOPs per element.
"""

import warnings

import numpy as np
import pytest
from onnx import helper

import flopcount

pytest.importorskip("sklearn")
skl2onnx = pytest.importorskip("skl2onnx")
ort = pytest.importorskip("onnxruntime")

from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier  # noqa: E402
from sklearn.impute import SimpleImputer  # noqa: E402
from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402
from sklearn.neural_network import MLPClassifier  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import Binarizer, Normalizer, OneHotEncoder, StandardScaler  # noqa: E402
from sklearn.svm import SVC, SVR  # noqa: E402

B, F = 7, 5  # samples counted and run; features
OPSETS = {"": 17, "ai.onnx.ml": 3}
rng = np.random.default_rng(0)
X = rng.normal(size=(80, F)).astype(np.float32)
LABELS3 = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.3)  # three classes
LABELS2 = (X[:, 0] + X[:, 2] > 0).astype(np.int64)
TARGET = X @ np.arange(1, F + 1, dtype=np.float32) + np.sin(X[:, 0])
CATEGORIES = rng.integers(0, 4, size=(80, 2)).astype(np.int64)


def convert(estimator, x, y, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of the tiny fits
        estimator.fit(x, y)
    return skl2onnx.to_onnx(estimator, x[:1], target_opset=OPSETS, options=options or None)


def real_shapes(m, feeds):
    """Every tensor-valued node output's shape in a real onnxruntime run on ``feeds`` (an array for the one input,
    or a dict by input name)."""
    probe = helper.make_model(m.graph, opset_imports=m.opset_import)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(o) for n in m.graph.node if n.op_type != "ZipMap"
                              for o in n.output if o and o not in {v.name for v in m.graph.output})
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    values = session.run(names, feeds if isinstance(feeds, dict) else {m.graph.input[0].name: feeds})
    return {n: v.shape for n, v in zip(names, values) if isinstance(v, np.ndarray)}


def count_and_check_shapes(m, x, batch=None):
    """The report of ``m`` counted for ``len(x)`` samples (or ``batch``), after checking every resolved shape against
    onnxruntime's run on ``x``."""
    report = flopcount.count(m, batch=batch or len(x))
    real = real_shapes(m, x)
    resolved = {t.name: t.shape for n in report.nodes for t in n.outputs if t is not None and t.name in real}
    assert resolved == real
    assert len(real) >= len(m.graph.node) - 1
    return report


def flops(report, op, domain="ai.onnx.ml"):
    return report.by_op_type[f"{domain}:{op}" if domain else op].cost


def test_standard_scaler_then_logistic_regression():
    m = convert(make_pipeline(StandardScaler(), LogisticRegression()), X, LABELS3)
    r = count_and_check_shapes(m, X[:B])
    k = 3
    assert flops(r, "Scaler").flops == 2 * B * F
    # K scores (2FK + K intercepts), softmax over K (5K − 2, K exps), argmax (K − 1)
    c = flops(r, "LinearClassifier")
    assert (c.flops, c.macs, c.transcendentals) == (B * (2 * F * k + k + (5 * k - 2) + (k - 1)), B * F * k, B * k)
    assert flops(r, "Normalizer").flops == B * (3 * k - 1)  # skl2onnx's L1 renormalization of the probabilities
    assert r.upper_bounds == {}


def test_imputer_then_scaler_then_linear_regression():
    m = convert(make_pipeline(SimpleImputer(), StandardScaler(), LinearRegression()), X, TARGET)
    r = count_and_check_shapes(m, X[:B])
    assert flops(r, "Imputer").flops == B * F  # one comparison per element
    assert flops(r, "Scaler").flops == 2 * B * F
    assert flops(r, "LinearRegressor").flops == B * (2 * F + 1)  # one dot product and the intercept
    assert r.total.flops == B * F + 2 * B * F + B * (2 * F + 1)


def test_scaler_then_random_forest():
    forest = RandomForestClassifier(n_estimators=4, max_depth=3, random_state=0)
    m = convert(make_pipeline(StandardScaler(), forest), X, LABELS3)
    r = count_and_check_shapes(m, X[:B])
    depths, k = sum(t.tree_.max_depth for t in forest.estimators_), len(forest.classes_)
    assert flops(r, "Scaler").flops == 2 * B * F
    # per sample: each tree's deepest path, K class weights at each tree's leaf, the argmax (K − 1)
    assert flops(r, "TreeEnsembleClassifier").flops == B * (depths + len(forest.estimators_) * k + (k - 1))
    assert "deepest path" in r.upper_bounds["ai.onnx.ml:TreeEnsembleClassifier"][1]


def test_scaler_then_gradient_boosting():
    boosting = GradientBoostingRegressor(n_estimators=6, max_depth=2, random_state=0)
    m = convert(make_pipeline(StandardScaler(), boosting), X, TARGET)
    r = count_and_check_shapes(m, X[:B])
    trees = boosting.estimators_.ravel()
    depths = sum(t.tree_.max_depth for t in trees)
    # per sample: each tree's deepest path, one leaf weight per tree, the initial prediction (base value) added
    assert flops(r, "TreeEnsembleRegressor").flops == B * (depths + len(trees) + 1)
    assert set(r.upper_bounds) == {"ai.onnx.ml:TreeEnsembleRegressor"}


def test_scaler_then_mlp():
    mlp = MLPClassifier(hidden_layer_sizes=(9,), max_iter=30, random_state=0)
    m = convert(make_pipeline(StandardScaler(), mlp), X, LABELS3)
    r = count_and_check_shapes(m, X[:B])
    h, k = 9, len(mlp.classes_)
    assert flops(r, "MatMul", "").flops == 2 * B * (F * h + h * k)  # the two layers
    assert flops(r, "Add", "").flops == B * (h + k)  # their biases
    assert flops(r, "Relu", "").flops == B * h
    assert flops(r, "Scaler").flops == 2 * B * F


def test_svc_one_vs_one():
    svc = SVC(kernel="rbf", gamma=0.2)
    m = convert(make_pipeline(StandardScaler(), svc), X, LABELS3)
    r = count_and_check_shapes(m, X[:B])
    s, k = int(svc.n_support_.sum()), len(svc.classes_)
    # per sample: S RBF kernels (F subtractions, F squares and adds, γ multiply, exp), (K − 1)·S coefficient
    # MACs, one rho add per class pair
    c = flops(r, "SVMClassifier")
    assert c.flops == B * (s * (F + 2 * F + 2) + 2 * (k - 1) * s + k * (k - 1) // 2)
    assert c.transcendentals == B * s


def test_svr():
    svr = SVR(kernel="rbf", gamma=0.1)
    m = convert(make_pipeline(StandardScaler(), svr), X, TARGET)
    r = count_and_check_shapes(m, X[:B])
    s = len(svr.support_)
    assert flops(r, "SVMRegressor").flops == B * (s * (3 * F + 2) + 2 * s + 1)  # kernels, coefficient MACs, rho


def test_normalizer_then_binary_logistic_regression():
    m = convert(make_pipeline(Normalizer(norm="l2"), LogisticRegression()), X, LABELS2, zipmap=False)
    r = count_and_check_shapes(m, X[:B])
    assert (flops(r, "Normalizer").flops, flops(r, "Normalizer").transcendentals) == (B * 3 * F, B)  # one sqrt a row
    assert r.upper_bounds == {}


def test_binarizer_then_logistic_regression():
    m = convert(make_pipeline(Binarizer(threshold=0.1), LogisticRegression()), X, LABELS3)
    r = count_and_check_shapes(m, X[:B])
    assert flops(r, "Binarizer").flops == B * F


def test_one_hot_encoder_then_logistic_regression():
    encoder = OneHotEncoder()
    m = convert(make_pipeline(encoder, LogisticRegression()), CATEGORIES, LABELS3)
    r = count_and_check_shapes(m, CATEGORIES[:B])
    width, k = sum(len(c) for c in encoder.categories_), 3  # the encoded features
    assert flops(r, "OneHotEncoder").flops == 0
    assert flops(r, "LinearClassifier").macs == B * width * k


def test_counting_ml_models_needs_neither_torch_nor_onnxruntime_inference(tmp_path):
    """onnxruntime's symbolic inference is loaded only for what the registered shape functions leave unknown, and
    never through ``onnxruntime.tools``, whose ``__init__`` imports torch (seconds)."""
    import subprocess
    import sys

    path = tmp_path / "svc.onnx"
    path.write_bytes(convert(make_pipeline(StandardScaler(), SVC()), X, LABELS3).SerializeToString())
    code = ("import sys, flopcount; from flopcount.pipeline.shapes import symbolic_inference\n"
            f"flopcount.count({str(path)!r}, batch=3)\n"
            "print(sorted(m for m in ('torch', 'sympy', 'onnxruntime.tools') if m in sys.modules))\n"
            "cls = symbolic_inference()\n"
            "print(cls.__name__, 'torch' in sys.modules, 'onnxruntime.tools' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "SymbolicShapeInference False False"]


def test_dict_vectorizer_then_logistic_regression():
    """One map in (a sample's named features), one row of the vocabulary's V columns out."""
    from skl2onnx.common.data_types import DictionaryType, FloatTensorType, StringTensorType
    from sklearn.feature_extraction import DictVectorizer

    samples = [{"a": float(a), "b": float(b), "c": 1.0} for a, b in X[:, :2]]
    vectorizer = DictVectorizer(sparse=False)
    pipeline = make_pipeline(vectorizer, LogisticRegression()).fit(samples, LABELS3)
    m = skl2onnx.convert_sklearn(pipeline, initial_types=[("input", DictionaryType(StringTensorType([1]),
                                                                                    FloatTensorType([1])))],
                                 target_opset=OPSETS)  # fmt: skip
    report = flopcount.count(m)
    real = real_shapes(m, {"input": samples[0]})
    assert {t.name: t.shape for n in report.nodes for t in n.outputs if t is not None and t.name in real} == real
    v, k = len(vectorizer.vocabulary_), 3
    assert flops(report, "LinearClassifier").macs == 1 * v * k


def test_column_transformer_of_two_inputs():
    """A scaled numeric column and a one-hot categorical column, concatenated, then a logistic regression."""
    from skl2onnx.common.data_types import FloatTensorType, Int64TensorType
    from sklearn.compose import ColumnTransformer

    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"num": X[:, 0], "cat": CATEGORIES[:, 0]})
    columns = ColumnTransformer([("n", StandardScaler(), ["num"]), ("c", OneHotEncoder(), ["cat"])])
    pipeline = make_pipeline(columns, LogisticRegression()).fit(frame, LABELS3)
    m = skl2onnx.convert_sklearn(pipeline, initial_types=[("num", FloatTensorType([None, 1])),
                                                          ("cat", Int64TensorType([None, 1]))], target_opset=OPSETS)
    feeds = {"num": X[:B, :1], "cat": CATEGORIES[:B, :1]}
    r = count_and_check_shapes(m, feeds, batch=B)
    width, k = 1 + len(columns.named_transformers_["c"].categories_[0]), 3  # the fitted clone's categories
    assert flops(r, "Scaler").flops == 2 * B * 1
    assert flops(r, "LinearClassifier").macs == B * width * k
