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
