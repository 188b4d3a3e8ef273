"""Domain ai.onnx.ml: linear models, SVMs, tree ensembles, element-wise transforms, free lookups.

X is [N, F] = [7, 11] unless said; one dot product of F features is F MACs = 2F FLOPs.
post_transform on k scores per sample: LOGISTIC k (k exps), SOFTMAX 5k − 2 (k exps).
"""

import numpy as np
import pytest
from helpers import model
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.registry import lookup

ML = "ai.onnx.ml"
N, F = 7, 11


def ml(op, x=(N, F), dtype=TensorProto.FLOAT, n_outputs=1, ml_opset=3, convention="default", **attrs):
    outs = ["y", "z"][:n_outputs]
    node = helper.make_node(op, ["x"], outs, domain=ML, **attrs)
    m = model([node], {"x": x}, outs, opset=18, dtype=dtype, extra_opsets={ML: ml_opset})
    return flopcount.count(m, convention=convention).total


# --- element-wise ---------------------------------------------------------------------------------


@pytest.mark.parametrize("op, attrs", [
    pytest.param("Binarizer", {"threshold": 0.5}, id="binarizer"),
    pytest.param("Imputer", {"imputed_value_floats": [0.0], "replaced_value_float": float("nan")}, id="imputer"),
])  # fmt: skip
def test_one_comparison_per_element(op, attrs):
    assert ml(op, **attrs).flops == N * F


def test_binarizer_integer_counts_int_ops():
    r = ml("Binarizer", dtype=TensorProto.INT64, threshold=0.5)
    assert (r.flops, r.int_ops) == (0, N * F)


def test_scaler():
    assert ml("Scaler", offset=[0.5] * F, scale=[2.0] * F).flops == 2 * N * F


@pytest.mark.parametrize("norm, per_row, trans", [
    pytest.param("MAX", (F - 1) + F, 0, id="max"),
    pytest.param("L1", F + (F - 1) + F, 0, id="l1"),
    pytest.param("L2", F + (F - 1) + 1 + F, 1, id="l2"),
])  # fmt: skip
def test_normalizer(norm, per_row, trans):
    r = ml("Normalizer", norm=norm)
    assert (r.flops, r.transcendentals) == (N * per_row, N * trans)


# --- linear models ------------------------------------------------------------------------------


def test_linear_regressor():
    attrs = {"targets": 3, "coefficients": [0.1] * (3 * F), "intercepts": [0.0] * 3}
    r = ml("LinearRegressor", **attrs)
    assert (r.flops, r.macs) == (2 * N * F * 3 + N * 3, N * F * 3)
    assert ml("LinearRegressor", convention="table3", **attrs).flops == N * F * 3


@pytest.mark.parametrize("post, extra, trans", [
    pytest.param("NONE", 0, 0, id="none"),
    pytest.param("LOGISTIC", 5, 5, id="logistic"),
    pytest.param("SOFTMAX", 5 * 5 - 2, 5, id="softmax"),
])  # fmt: skip
def test_linear_classifier(post, extra, trans):
    # 5 classes: coefficients 5·F, then an argmax over 5 scores (4 comparisons)
    r = ml("LinearClassifier", n_outputs=2, coefficients=[0.1] * (5 * F), intercepts=[0.0] * 5,
           classlabels_ints=[0, 1, 2, 3, 4], post_transform=post)
    assert r.macs == N * F * 5
    assert r.flops == 2 * N * F * 5 + N * 5 + N * extra + N * 4
    assert r.transcendentals == N * trans


def test_linear_classifier_binary_one_weight_vector():
    r = ml("LinearClassifier", n_outputs=2, coefficients=[0.1] * F, intercepts=[0.0], classlabels_ints=[0, 1])
    assert r.flops == 2 * N * F + N + N * 1  # one threshold comparison


# --- support vector machines ----------------------------------------------------------------------


def test_svm_classifier_one_vs_one_rbf():
    # 3 classes with 4, 5, 6 support vectors: S = 15 kernels per sample, (3 − 1)·15 coefficient MACs,
    # 3 pairs with a rho each. RBF kernel: F subtractions + F MACs + γ multiply + exp.
    s = 4 + 5 + 6
    r = ml("SVMClassifier", n_outputs=2, kernel_type="RBF", kernel_params=[0.1, 0.0, 3.0], vectors_per_class=[4, 5, 6],
           support_vectors=[0.0] * (s * F), coefficients=[1.0] * (2 * s), rho=[0.0] * 3, classlabels_ints=[0, 1, 2])
    kernels = N * s
    assert r.macs == kernels * F + N * 2 * s
    assert r.flops == kernels * (2 * F + F + 2) + 2 * N * 2 * s + N * 3
    assert r.transcendentals == kernels


def test_svm_classifier_linear_mode():
    r = ml("SVMClassifier", n_outputs=2, coefficients=[1.0] * (3 * F), rho=[0.0], classlabels_ints=[0, 1, 2])
    assert (r.flops, r.macs) == (N * 3 * 2 * F + N * 3, N * 3 * F)


@pytest.mark.parametrize("one_class", [0, 1])
def test_svm_regressor_poly(one_class):
    r = ml("SVMRegressor", kernel_type="POLY", kernel_params=[0.1, 1.0, 3.0], n_supports=4, one_class=one_class,
           support_vectors=[0.0] * (4 * F), coefficients=[1.0] * 4, rho=[0.5])
    kernels = N * 4
    assert r.macs == kernels * F + N * 4
    assert r.flops == kernels * (2 * F + 3) + 2 * N * 4 + N * (1 + one_class)
    assert r.transcendentals == kernels


def test_svm_regressor_linear_mode():
    r = ml("SVMRegressor", coefficients=[1.0] * F, rho=[0.5])
    assert (r.flops, r.macs) == (N * 2 * F + N, N * F)


# --- tree ensembles -------------------------------------------------------------------------------

# Tree 0 (ids 0-4): 0 → (1, 2), 1 → (3, 4); leaves 2, 3, 4: depth 2.
# Tree 1 (ids 10-12, root 10): 10 → (11, 12); leaves 11, 12: depth 1.
LEGACY = dict(
    nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1],
    nodes_nodeids=[0, 1, 2, 3, 4, 10, 11, 12],
    nodes_featureids=[0, 1, 0, 0, 0, 2, 0, 0],
    nodes_values=[0.5, 0.2, 0.0, 0.0, 0.0, 0.7, 0.0, 0.0],
    nodes_modes=["BRANCH_LEQ", "BRANCH_LT", "LEAF", "LEAF", "LEAF", "BRANCH_GT", "LEAF", "LEAF"],
    nodes_truenodeids=[1, 3, 0, 0, 0, 11, 0, 0],
    nodes_falsenodeids=[2, 4, 0, 0, 0, 12, 0, 0],
)
DEPTHS = 2 + 1


@pytest.mark.parametrize("aggregate, post, extra, trans", [
    pytest.param("SUM", "NONE", 0, 0, id="sum"),
    pytest.param("AVERAGE", "NONE", 2, 0, id="average-divides-per-target"),
    pytest.param("SUM", "LOGISTIC", 2, 2, id="logistic"),
])  # fmt: skip
def test_tree_ensemble_regressor(aggregate, post, extra, trans):
    # 2 targets; leaf 3 of tree 0 carries 2 weights, every other leaf 1: heaviest leaves 2 + 1
    r = ml("TreeEnsembleRegressor", x=(N, 3), n_targets=2, aggregate_function=aggregate, post_transform=post,
           base_values=[0.5, 0.5], target_treeids=[0, 0, 0, 0, 1, 1], target_nodeids=[2, 3, 3, 4, 11, 12],
           target_ids=[0, 0, 1, 1, 0, 1], target_weights=[1.0] * 6, **LEGACY)
    assert r.flops == N * (DEPTHS + (2 + 1) + 2 + extra)  # + 2 base values
    assert r.transcendentals == N * trans


@pytest.mark.parametrize("post, extra, trans", [
    pytest.param("NONE", 0, 0, id="none"),
    pytest.param("SOFTMAX", 5 * 3 - 2, 3, id="softmax"),
])  # fmt: skip
def test_tree_ensemble_classifier(post, extra, trans):
    # 3 classes; leaf 3 of tree 0 carries 3 weights: heaviest leaves 3 + 1; argmax 2 comparisons
    r = ml("TreeEnsembleClassifier", x=(N, 3), n_outputs=2, classlabels_int64s=[0, 1, 2], post_transform=post,
           class_treeids=[0, 0, 0, 0, 0, 1, 1], class_nodeids=[2, 3, 3, 3, 4, 11, 12], class_ids=[0, 0, 1, 2, 1, 0, 2],
           class_weights=[1.0] * 7, **LEGACY)
    assert r.flops == N * (DEPTHS + (3 + 1) + 2 + extra)
    assert r.transcendentals == N * trans


def _t(name, values, dtype):
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


@pytest.mark.parametrize("aggregate, extra", [pytest.param(1, 0, id="sum"), pytest.param(0, 1, id="average")])
def test_tree_ensemble_opset5(aggregate, extra):
    # tree A: node 0 → (node 1, leaf 0), node 1 → (leaf 1, node 2), node 2 → (leaf 2, leaf 3): depth 3
    # tree B: node 3 → (leaf 4, leaf 5): depth 1; one weight per leaf, so one add per tree
    r = ml("TreeEnsemble", x=(N, 3), ml_opset=5, n_targets=1, aggregate_function=aggregate, tree_roots=[0, 3],
           nodes_featureids=[0, 1, 2, 0], nodes_modes=_t("modes", [0, 0, 0, 0], np.uint8),
           nodes_splits=_t("splits", [0.5] * 4, np.float32),
           nodes_truenodeids=[1, 1, 2, 4], nodes_trueleafs=[0, 1, 1, 1],
           nodes_falsenodeids=[0, 2, 3, 5], nodes_falseleafs=[1, 0, 1, 1],
           leaf_targetids=[0] * 6, leaf_weights=_t("w", [1.0] * 6, np.float32))
    assert r.flops == N * ((3 + 1) + 2 + extra)


def complete_trees(trees: int, leaves: int, classes: int, seed: int = 0) -> dict:
    """Legacy attributes of ``trees`` complete binary trees of ``leaves`` leaves (node i < leaves - 1 branches to
    2i + 1 and 2i + 2), tree t scoring class t mod ``classes`` with one weight per leaf, every list in one shuffled
    order (a tree's root is found as its one node that is no child, wherever it is listed)."""
    nodes = 2 * leaves - 1
    ids = np.arange(nodes)
    branch = ids < leaves - 1
    order = np.random.default_rng(seed).permutation(trees * nodes)
    tree_of = np.repeat(np.arange(trees), nodes)[order]
    node_of = np.tile(ids, trees)[order]
    is_branch = np.tile(branch, trees)[order]
    leaf_ids = ids[~branch]
    return dict(
        nodes_treeids=tree_of.tolist(), nodes_nodeids=node_of.tolist(),
        nodes_modes=["BRANCH_LEQ" if b else "LEAF" for b in is_branch],
        nodes_featureids=[0] * (trees * nodes), nodes_values=[0.5] * (trees * nodes),
        nodes_truenodeids=np.where(is_branch, 2 * node_of + 1, 0).tolist(),
        nodes_falsenodeids=np.where(is_branch, 2 * node_of + 2, 0).tolist(),
        class_treeids=np.repeat(np.arange(trees), leaves).tolist(), class_nodeids=np.tile(leaf_ids, trees).tolist(),
        class_ids=(np.repeat(np.arange(trees), leaves) % classes).tolist(), class_weights=[1.0] * (trees * leaves),
        classlabels_int64s=list(range(classes)),
    )


@pytest.mark.parametrize("trees, leaves, depth", [
    # branch nodes 0..L-2 of a complete tree fill floor(log2(L - 1)) + 1 levels
    pytest.param(3, 5, 3, id="3-trees-of-5-leaves"),  # branches 0 | 1 2 | 3
    pytest.param(40, 100, 7, id="40-trees-of-100-leaves"),  # 7,960 nodes: lists longer than 4,096 values; 98 → 7 levels
    pytest.param(9, 256, 8, id="9-trees-of-256-leaves"),  # branches 0..254: 8 full levels
])  # fmt: skip
def test_tree_ensemble_classifier_of_generated_complete_trees(trees, leaves, depth):
    classes = 4
    r = ml("TreeEnsembleClassifier", x=(N, 3), n_outputs=2, post_transform="SOFTMAX",
           **complete_trees(trees, leaves, classes))
    # per sample: depth comparisons and 1 leaf-weight add per tree, argmax over K (K - 1), softmax (5K - 2, K exps)
    assert r.flops == N * (trees * depth + trees * 1 + (classes - 1) + (5 * classes - 2))
    assert r.transcendentals == N * classes


def test_long_tree_lists_are_read_as_arrays():
    """200 trees of 509 nodes (101,800 per list): as Python lists the 13 node and class lists took 44 MB (an int
    36 bytes with its pointer); read as arrays, only the lists the formula needs, at 8 bytes a value."""
    import tracemalloc

    node = helper.make_node("TreeEnsembleClassifier", ["x"], ["y", "z"], domain=ML, **complete_trees(200, 255, 4))
    data = model([node], {"x": (N, 3)}, ["y", "z"], opset=18, extra_opsets={ML: 3}).SerializeToString()
    del node
    tracemalloc.start()
    try:
        report = flopcount.count(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.total.flops == N * (200 * 8 + 200 + 3)  # depth 8 (254 branches), 1 add per tree, argmax of 4
    assert peak < 20 * 2**20, peak


def test_a_cycle_in_a_long_tree_list_is_refused():
    attrs = complete_trees(30, 100, 2)  # 5,970 nodes: the long-list path
    at = next(i for i, (t, n) in enumerate(zip(attrs["nodes_treeids"], attrs["nodes_nodeids"])) if t == 0 and n == 97)
    attrs["nodes_truenodeids"][at] = 48  # node 97 (a branch on the last level) points back to its parent, 48
    with pytest.raises(flopcount.FlopcountError, match="cycle"):
        ml("TreeEnsembleClassifier", x=(N, 3), n_outputs=2, **attrs)


# --- free -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArrayFeatureExtractor", "FeatureVectorizer", "ZipMap", "CastMap", "DictVectorizer",
                                "LabelEncoder", "CategoryMapper", "OneHotEncoder"])
def test_lookups_are_zero_cost(op):
    rule = lookup(ML, op)
    assert rule is not None and rule.zero_cost and rule.reason


def test_label_encoder_counts_nothing():
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain=ML, keys_int64s=[1, 2], values_int64s=[5, 6])
    m = model([node], {"x": (N,)}, ["y"], opset=18, dtype=TensorProto.INT64, extra_opsets={ML: 2})
    (n,) = flopcount.count(m).nodes
    assert (n.status, n.cost.flops, n.cost.int_ops) == ("zero-cost", 0, 0)


def test_every_ml_operator_is_classified():
    import onnx.defs

    ops = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ML}
    assert ops and all(lookup(ML, op) is not None for op in ops)


# --- output shapes: each operator's resolved outputs equal onnxruntime's real ones ----------------


def _ort_outputs(m, feeds):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _resolved(m):
    (node,) = flopcount.count(m).nodes
    return [t.shape if t is not None else None for t in node.outputs]


def _x(shape, dtype=np.float32):
    return np.random.default_rng(0).normal(size=shape).astype(dtype)


# LEGACY with tree 1's nodes numbered 0-2 (onnxruntime wants every tree's ids below its node count)
DENSE_IDS = dict(LEGACY, nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2], nodes_truenodeids=[1, 3, 0, 0, 0, 1, 0, 0],
                 nodes_falsenodeids=[2, 4, 0, 0, 0, 2, 0, 0])
SVC3 = dict(kernel_type="RBF", kernel_params=[0.1, 0.0, 3.0], vectors_per_class=[2, 3, 1], support_vectors=[0.5] * (6 * F),
            coefficients=[1.0, -1.0] * 6, rho=[0.1, 0.2, 0.3], classlabels_ints=[0, 1, 2])
SVC4 = dict(kernel_type="LINEAR", kernel_params=[0.1, 0.0, 3.0], vectors_per_class=[1, 1, 1, 1], support_vectors=[0.5] * (4 * F),
            coefficients=[1.0] * 12, rho=[0.0] * 6, classlabels_strings=["a", "b", "c", "d"])
SVC2 = dict(kernel_type="RBF", kernel_params=[0.1, 0.0, 3.0], vectors_per_class=[2, 3], support_vectors=[0.5] * (5 * F),
            coefficients=[1.0, -1.0, 1.0, -1.0, 1.0], rho=[0.1], classlabels_ints=[0, 1])


@pytest.mark.parametrize("op, x, outputs, attrs, expected", [
    pytest.param("Scaler", (N, F), 1, dict(offset=[0.5] * F, scale=[2.0] * F), [(N, F)], id="scaler"),
    pytest.param("Scaler", (F,), 1, dict(offset=[0.5], scale=[2.0]), [(F,)], id="scaler-1d"),
    pytest.param("Normalizer", (N, F), 1, dict(norm="L2"), [(N, F)], id="normalizer"),
    pytest.param("Imputer", (N, F), 1, dict(imputed_value_floats=[0.0], replaced_value_float=0.5), [(N, F)],
                 id="imputer"),
    pytest.param("Binarizer", (N, F), 1, dict(threshold=0.5), [(N, F)], id="binarizer"),
    pytest.param("LinearRegressor", (N, F), 1, dict(targets=3, coefficients=[0.1] * (3 * F), intercepts=[0.0] * 3),
                 [(N, 3)], id="linear-regressor"),
    pytest.param("LinearRegressor", (F,), 1, dict(targets=2, coefficients=[0.1] * (2 * F)), [(1, 2)],
                 id="linear-regressor-one-sample"),
    pytest.param("LinearClassifier", (N, F), 2, dict(coefficients=[0.1] * (5 * F), intercepts=[0.0] * 5,
                                                     classlabels_ints=[0, 1, 2, 3, 4]), [(N,), (N, 5)],
                 id="linear-classifier"),
    pytest.param("LinearClassifier", (N, F), 2, dict(coefficients=[0.1] * F, intercepts=[0.0],
                                                     classlabels_strings=["no", "yes"]), [(N,), (N, 2)],
                 id="linear-classifier-one-vector-two-labels"),
    pytest.param("SVMRegressor", (N, F), 1, dict(kernel_type="RBF", kernel_params=[0.1, 0.0, 3.0], n_supports=4,
                                                 support_vectors=[0.0] * (4 * F), coefficients=[1.0] * 4, rho=[0.5]),
                 [(N, 1)], id="svm-regressor"),
    pytest.param("SVMClassifier", (N, F), 2, SVC3, [(N,), (N, 3 * 2 // 2)], id="svc-3-classes-pairwise-scores"),
    pytest.param("SVMClassifier", (N, F), 2, SVC4, [(N,), (N, 4 * 3 // 2)], id="svc-4-classes-pairwise-scores"),
    pytest.param("SVMClassifier", (N, F), 2, SVC2, [(N,), (N, 2)], id="svc-2-classes"),
    pytest.param("SVMClassifier", (N, F), 2, dict(SVC3, prob_a=[-1.0] * 3, prob_b=[0.1] * 3), [(N,), (N, 3)],
                 id="svc-3-classes-probabilities"),
    pytest.param("SVMClassifier", (N, F), 2, dict(coefficients=[1.0] * (3 * F), rho=[0.0], kernel_params=[0.1, 0.0, 3.0],
                                                  classlabels_ints=[0, 1, 2]), [(N,), (N, 3)], id="svm-linear-mode"),
    pytest.param("TreeEnsembleClassifier", (N, 3), 2, dict(DENSE_IDS, classlabels_int64s=[0, 1, 2],
                                                           class_treeids=[0, 0, 0, 1, 1], class_nodeids=[2, 3, 4, 1, 2],
                                                           class_ids=[0, 1, 2, 0, 2], class_weights=[1.0] * 5),
                 [(N,), (N, 3)], id="tree-classifier"),
    pytest.param("TreeEnsembleRegressor", (N, 3), 1, dict(DENSE_IDS, n_targets=2, target_treeids=[0, 0, 0, 1, 1],
                                                          target_nodeids=[2, 3, 4, 1, 2], target_ids=[0, 1, 1, 0, 1],
                                                          target_weights=[1.0] * 5), [(N, 2)], id="tree-regressor"),
])  # fmt: skip
def test_output_shapes_equal_onnxruntime(op, x, outputs, attrs, expected):
    outs = ["y", "z"][:outputs]
    node = helper.make_node(op, ["x"], outs, domain=ML, **attrs)
    m = model([node], {"x": x}, outs, opset=18, extra_opsets={ML: 3})
    real = [o.shape for o in _ort_outputs(m, {"x": _x(x)})]
    assert real == expected  # the spec's shapes, as onnxruntime computes them
    assert _resolved(m) == expected


def test_tree_ensemble_opset5_shape_equals_onnxruntime():
    node = helper.make_node(
        "TreeEnsemble", ["x"], ["y"], domain=ML, n_targets=2, aggregate_function=1, tree_roots=[0, 3],
        nodes_featureids=[0, 1, 2, 0], nodes_modes=_t("modes", [0, 0, 0, 0], np.uint8),
        nodes_splits=_t("splits", [0.5] * 4, np.float32), nodes_truenodeids=[1, 1, 2, 4], nodes_trueleafs=[0, 1, 1, 1],
        nodes_falsenodeids=[0, 2, 3, 5], nodes_falseleafs=[1, 0, 1, 1], leaf_targetids=[0, 1, 0, 1, 0, 1],
        leaf_weights=_t("w", [1.0] * 6, np.float32))
    m = model([node], {"x": (N, 3)}, ["y"], opset=21, extra_opsets={ML: 5})
    try:
        real = [o.shape for o in _ort_outputs(m, {"x": _x((N, 3))})]
    except Exception as e:  # an onnxruntime without ai.onnx.ml opset 5
        pytest.skip(f"onnxruntime does not run TreeEnsemble: {e}")
    assert real == [(N, 2)]
    assert _resolved(m) == [(N, 2)]


def test_feature_vectorizer_concatenates_its_inputs():
    node = helper.make_node("FeatureVectorizer", ["a", "b"], ["y"], domain=ML, inputdimensions=[2, 3])
    m = model([node], {"a": (N, 2), "b": (N, 3)}, ["y"], opset=18, extra_opsets={ML: 3})
    real = [o.shape for o in _ort_outputs(m, {"a": _x((N, 2)), "b": _x((N, 3))})]
    assert real == [(N, 2 + 3)]
    assert _resolved(m) == [(N, 2 + 3)]


def test_array_feature_extractor_takes_the_indexed_columns():
    idx = numpy_helper.from_array(np.array([0, 4, 2], dtype=np.int64), "idx")
    for x, expected in [((N, F), (N, 3)), ((F,), (1, 3))]:  # a 1-D X gives one row
        node = helper.make_node("ArrayFeatureExtractor", ["x", "idx"], ["y"], domain=ML)
        m = model([node], {"x": x}, ["y"], [idx], opset=18, extra_opsets={ML: 3})
        assert [o.shape for o in _ort_outputs(m, {"x": _x(x)})] == [expected]
        assert _resolved(m) == [expected]


@pytest.mark.parametrize("op, dtype, feed, attrs, expected_type", [
    pytest.param("OneHotEncoder", TensorProto.INT64, np.array([[1, 3], [2, 2]] * 3, dtype=np.int64),
                 dict(cats_int64s=[1, 2, 3, 4]), TensorProto.FLOAT, id="one-hot"),
    pytest.param("LabelEncoder", TensorProto.INT64, np.array([[1, 2]] * 6, dtype=np.int64),
                 dict(keys_int64s=[1, 2], values_strings=["a", "b"]), TensorProto.STRING, id="label-encoder"),
    pytest.param("CategoryMapper", TensorProto.STRING, np.array([["a", "b"]] * 6, dtype=object),
                 dict(cats_strings=["a", "b"], cats_int64s=[1, 2]), TensorProto.INT64, id="category-mapper"),
])  # fmt: skip
def test_lookup_shapes_equal_onnxruntime(op, dtype, feed, attrs, expected_type):
    node = helper.make_node(op, ["x"], ["y"], domain=ML, **attrs)
    m = model([node], {"x": feed.shape}, ["y"], opset=18, dtype=dtype, extra_opsets={ML: 2})
    (real,) = _ort_outputs(m, {"x": feed})
    (out,) = flopcount.count(m).nodes[0].outputs
    assert (out.elem_type, out.shape) == (expected_type, real.shape)


def _map_model(op, **attrs):
    kind = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    g = helper.make_graph([helper.make_node(op, ["m"], ["y"], domain=ML, **attrs)], "maps",
                          [helper.make_value_info("m", kind)], [helper.make_empty_tensor_value_info("y")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(ML, 3)])


@pytest.mark.parametrize("op, attrs, expected", [
    pytest.param("DictVectorizer", dict(int64_vocabulary=[3, 1, 7, 9]), (1, 4), id="dict-vectorizer"),
    pytest.param("CastMap", dict(map_form="SPARSE", max_map=6), (1, 6), id="cast-map-sparse"),
])  # fmt: skip
def test_map_inputs_give_one_row(op, attrs, expected):
    m = _map_model(op, **attrs)
    (real,) = _ort_outputs(m, {"m": {1: 0.5, 3: 2.0}})
    (out,) = flopcount.count(m).nodes[0].outputs
    assert real.shape == expected
    assert (out.elem_type, out.shape) == (TensorProto.FLOAT, expected)


def test_a_node_after_an_ml_operator_is_counted():
    """The node after a Scaler once stopped the count (exit 5): its input had no shape."""
    scaler = helper.make_node("Scaler", ["x"], ["s"], domain=ML, offset=[0.5] * F, scale=[2.0] * F)
    square = helper.make_node("Mul", ["s", "s"], ["y"])
    r = flopcount.count(model([scaler, square], {"x": (N, F)}, ["y"], opset=18, extra_opsets={ML: 3}))
    assert r.total.flops == 2 * N * F + N * F  # (x − offset)·scale, then one multiply per element


# --- upper bounds -------------------------------------------------------------------------------


def _legacy_regressor():
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain=ML, n_targets=1, target_treeids=[0, 0, 0, 1, 1],
                            target_nodeids=[2, 3, 4, 11, 12], target_ids=[0] * 5, target_weights=[1.0] * 5, **LEGACY)
    return model([node], {"x": (N, 3)}, ["y"], opset=18, extra_opsets={ML: 3})


def test_tree_ensembles_are_listed_as_upper_bounds_in_every_format():
    import csv
    import io
    import json

    from flopcount.output.render import render

    report = flopcount.count(_legacy_regressor())
    ((key, (nodes, why)),) = report.upper_bounds.items()
    assert (key, nodes) == ("ai.onnx.ml:TreeEnsembleRegressor", 1) and "deepest path" in why
    assert json.loads(render(report, "json"))["upper_bounds"] == {key: {"nodes": 1, "why": why}}
    (row,) = csv.DictReader(io.StringIO(render(report, "csv")))
    assert row["upper_bound"] == why
    (row,) = csv.DictReader(io.StringIO(render(report, "csv", per_node=True)))
    assert row["upper_bound"] == why
    for fmt in ("table", "markdown", "html"):
        assert "deepest path" in render(report, fmt), fmt


def test_exact_counts_list_no_upper_bound():
    import csv
    import io

    from flopcount.output.render import render

    report = flopcount.count(model([helper.make_node("Scaler", ["x"], ["y"], domain=ML, offset=[0.5], scale=[2.0])],
                                   {"x": (N, F)}, ["y"], opset=18, extra_opsets={ML: 3}))
    assert report.upper_bounds == {}
    assert [r["upper_bound"] for r in csv.DictReader(io.StringIO(render(report, "csv")))] == [""]


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("op, attrs, named", [
    pytest.param("LinearClassifier", dict(coefficients=[0.1] * (2 * F + 3), classlabels_ints=[0, 1]), "coefficients",
                 id="classifier-part-of-a-vector"),
    pytest.param("LinearRegressor", dict(targets=3, coefficients=[0.1] * (2 * F)), "targets", id="regressor-too-few"),
    pytest.param("SVMClassifier", dict(coefficients=[1.0] * (F + 1), rho=[0.0], classlabels_ints=[0, 1]),
                 "coefficients", id="svm-linear-mode"),
    pytest.param("SVMClassifier", dict(SVC3, support_vectors=[0.5] * (6 * F - 1)), "support_vectors",
                 id="svc-support-vectors"),
    pytest.param("SVMRegressor", dict(n_supports=4, support_vectors=[0.0] * (3 * F), coefficients=[1.0] * 4,
                                      rho=[0.5]), "support_vectors", id="svr-support-vectors"),
])  # fmt: skip
def test_coefficients_that_do_not_fit_the_features_are_refused(op, attrs, named):
    """A silent floor division once counted part of a weight vector as none, or a whole one."""
    outs = ["y", "z"][: 1 if op.endswith("Regressor") else 2]
    m = model([helper.make_node(op, ["x"], outs, domain=ML, name="bad", **attrs)], {"x": (N, F)}, outs, opset=18,
              extra_opsets={ML: 3})
    with pytest.raises(flopcount.FlopcountError, match=f"'bad'.*{named}") as e:
        flopcount.count(m)
    assert e.value.exit_code != 0 and "\n" not in str(e.value)
