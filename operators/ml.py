"""Classical machine learning, domain ``ai.onnx.ml``.

X is [N, F] (N samples of F features; a 1-D X is one sample). Models whose parameters are floats
(linear models, SVMs, trees, Scaler, Normalizer) compute in floating point whatever the type of X,
so they count FLOPs for every input type; element-wise Binarizer and Imputer follow their input
type. Dot products are counted as MACs at the matrix-product rate (``fc_flops_per_mac``).
Structure is read from the attributes (coefficient counts, tree shapes), never from weights.

``post_transform`` on k scores per sample costs: NONE 0; LOGISTIC k FLOPs and k exps (as Sigmoid);
SOFTMAX and SOFTMAX_ZERO 5k − 2 FLOPs (k − 1 max, k subtractions, k exps, k − 1 adds,
k divisions) and k exps; PROBIT 4k FLOPs (2p − 1, erfinv, ×√2) and k transcendentals.
"""

from __future__ import annotations

from math import prod

import numpy as np

from flopcount.context import NodeContext, TensorInfo
from flopcount.cost import Bound, Cost
from flopcount.registry import backward, formula, saves, saves_nothing, shape_function, zero_cost
from flopcount.saved import Saved, keeps

DOMAIN = "ai.onnx.ml"

# TreeEnsemble (opset 5 of ai.onnx.ml) numbers its enums
POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")


def _samples_features(ctx: NodeContext) -> tuple[int, int]:
    x = ctx.shape(0)
    f = x[-1] if x else 1
    return (prod(x) // f if f else 0), f


def post_transform_cost(transform: str | int, k: int) -> Cost:
    """Cost of ``post_transform`` on k scores of one sample (see the module docstring)."""
    if isinstance(transform, int):
        transform = POST_TRANSFORMS[transform]
    if transform == "LOGISTIC":
        return Cost(flops=k, transcendentals=k)
    if transform in ("SOFTMAX", "SOFTMAX_ZERO"):
        return Cost(flops=5 * k - 2, transcendentals=k) if k else Cost()
    if transform == "PROBIT":
        return Cost(flops=4 * k, transcendentals=k)
    return Cost()


def _elementwise(ctx: NodeContext, per_element: int) -> Cost:
    n = per_element * ctx.numel(0)
    return Cost(flops=n) if ctx.in_is_float(0) else Cost(int_ops=n)


# --- element-wise -------------------------------------------------------------------------------


@formula("Binarizer", "Imputer", family="ml", domain=DOMAIN)
def compare_elements(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X|: one comparison per element (Binarizer: x > threshold; Imputer: x equals the
    replaced value, or is NaN); ``int_ops`` for integer X. Writing the replacement is free."""
    return _elementwise(ctx, 1)


@formula("Scaler", family="ml", domain=DOMAIN)
def scaler(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·|X|: (x − offset)·scale per element, for every input type."""
    return Cost(flops=2 * ctx.numel(0))


@formula("Normalizer", family="ml", domain=DOMAIN)
def normalizer(ctx: NodeContext, *, norm: str = "MAX", **_) -> Cost:
    """FLOPs = N·(2F − 1) (MAX: F − 1 maxes, F divisions), N·(3F − 1) (L1: F absolute values,
    F − 1 adds, F divisions) or N·3F with N square roots (L2: F squares, F − 1 adds, one sqrt,
    F divisions), per row of F features."""
    n, f = _samples_features(ctx)
    per_row = {"MAX": 2 * f - 1, "L1": 3 * f - 1, "L2": 3 * f}[norm]
    return Cost(flops=n * per_row, transcendentals=n if norm == "L2" else 0)


# --- linear models ------------------------------------------------------------------------------


def _vectors(values, f: int, what: str) -> int:
    """How many vectors of F values the attribute ``what`` holds; a ValueError when it holds none or a part of one."""
    n = len(values or ())
    if not f or not n or n % f:
        raise ValueError(f"{what} holds {n} values, not a whole number of vectors of the input's {f} features")
    return n // f


def _linear(ctx: NodeContext, outputs: int, intercepts, transform: str) -> Cost:
    n, f = _samples_features(ctx)
    macs = n * f * outputs
    flops = ctx.convention.fc_flops_per_mac * macs
    if intercepts and ctx.convention.count_bias:
        flops += n * outputs
    return Cost(flops=flops, macs=macs) + n * post_transform_cost(transform, outputs)


@formula("LinearRegressor", family="ml", domain=DOMAIN)
def linear_regressor(ctx: NodeContext, *, targets: int = 1, coefficients=None, intercepts=None,
                     post_transform: str = "NONE", **_) -> Cost:  # fmt: skip
    """FLOPs = 2·N·F·T (+ N·T with intercepts) + post_transform on T scores per sample, for
    T = ``targets``: MACs = N·F·T, the product X·coefficientsᵀ."""
    if coefficients is not None and _vectors(coefficients, _samples_features(ctx)[1], "coefficients") != targets:
        raise ValueError(f"coefficients hold {len(coefficients)} values, not targets ({targets}) vectors of the "
                         f"input's {_samples_features(ctx)[1]} features")
    return _linear(ctx, targets, intercepts, post_transform)


@formula("LinearClassifier", family="ml", domain=DOMAIN)
def linear_classifier(ctx: NodeContext, *, coefficients, intercepts=None, post_transform: str = "NONE", **_) -> Cost:
    """FLOPs = 2·N·F·K (+ N·K with intercepts) + post_transform on K scores + N·max(K − 1, 1)
    for K = |coefficients|/F weight vectors: MACs = N·F·K; then the label, an argmax over the K
    scores (K − 1 comparisons) or, for one weight vector, a threshold comparison.

    The second score column that a single-vector binary model reports (its complement) is not
    counted.
    """
    n, f = _samples_features(ctx)
    k = _vectors(coefficients, f, "coefficients")
    return _linear(ctx, k, intercepts, post_transform) + Cost(flops=n * max(k - 1, 1))


# --- support vector machines --------------------------------------------------------------------

# kernel → (extra FLOPs beyond the F MACs of its dot product or squared distance, transcendentals)
KERNELS: dict[str, tuple[int, int]] = {
    "LINEAR": (0, 0),  # x·s
    "POLY": (3, 1),  # (γ·x·s + c0)^degree
    "RBF": (2, 1),  # exp(−γ·Σ(x − s)²), plus F subtractions (added below)
    "SIGMOID": (3, 1),  # tanh(γ·x·s + c0)
}


def _kernels(ctx: NodeContext, evaluations: int, f: int, kernel: str) -> Cost:
    """``evaluations`` kernel evaluations on F features."""
    extra, trans = KERNELS[kernel]
    if kernel == "RBF":
        extra += f
    macs = evaluations * f
    return Cost(
        flops=ctx.convention.fc_flops_per_mac * macs + extra * evaluations,
        macs=macs,
        transcendentals=trans * evaluations,
    )


def _support_vectors(values, f: int, count: int) -> None:
    """A ValueError unless ``support_vectors`` holds ``count`` vectors of the input's F features."""
    if values is not None and _vectors(values, f, "support_vectors") != count:
        raise ValueError(f"support_vectors hold {len(values)} values, not {count} support vectors of the input's "
                         f"{f} features")


@formula("SVMClassifier", family="ml", domain=DOMAIN)
def svm_classifier(ctx: NodeContext, *, kernel_type: str = "LINEAR", vectors_per_class=None, coefficients=None,
                   support_vectors=None, **_) -> Cost:  # fmt: skip
    """FLOPs = N·(S·k_F + 2·(K − 1)·S + K(K − 1)/2) with S = Σ vectors_per_class support vectors and
    K = |vectors_per_class| classes (one-vs-one); without support vectors (linear mode) N·(V·k_F + V) for the
    V = |coefficients|/F weight vectors. k_F is one kernel evaluation on F features: F MACs (2F FLOPs),
    plus 3 for POLY and SIGMOID or F + 2 for RBF, with one pow, exp or tanh.

    One-vs-one: every sample is compared by kernel with every support vector, then each of the
    K(K − 1)/2 class pairs (i, j) sums its n_i + n_j coefficient·kernel products (MACs, (K − 1)·S in
    all) and adds its rho. Voting is integer work, not counted; neither are probability estimates
    (prob_a/prob_b: Platt scaling and pairwise coupling) nor post_transform.
    """
    n, f = _samples_features(ctx)
    if vectors_per_class:
        s = sum(vectors_per_class)
        _support_vectors(support_vectors, f, s)
        k = len(vectors_per_class)  # one entry per class
        macs = n * (k - 1) * s
        pairs = Cost(flops=ctx.convention.fc_flops_per_mac * macs + n * (k * (k - 1) // 2), macs=macs)
        return _kernels(ctx, n * s, f, kernel_type) + pairs
    v = _vectors(coefficients, f, "coefficients")
    return _kernels(ctx, n * v, f, kernel_type) + Cost(flops=n * v)


@formula("SVMRegressor", family="ml", domain=DOMAIN)
def svm_regressor(ctx: NodeContext, *, kernel_type: str = "LINEAR", n_supports: int = 0, one_class: int = 0,
                  support_vectors=None, **_) -> Cost:  # fmt: skip
    """FLOPs = N·(S·k_F + 2S + 1 + o) for S = n_supports support vectors (k_F as in SVMClassifier:
    S kernel evaluations, S coefficient MACs, one rho add; o = 1 threshold comparison when
    ``one_class``); with S = 0 (linear mode) N·(k_F + 1 + o), one kernel with the coefficients.
    post_transform is not counted."""
    n, f = _samples_features(ctx)
    tail = 1 + (1 if one_class else 0)
    if n_supports:
        _support_vectors(support_vectors, f, n_supports)
        macs = n * n_supports
        return _kernels(ctx, n * n_supports, f, kernel_type) + Cost(
            flops=ctx.convention.fc_flops_per_mac * macs + n * tail, macs=macs
        )
    return _kernels(ctx, n, f, kernel_type) + Cost(flops=n * tail)


# --- tree ensembles -----------------------------------------------------------------------------


def _level_depths(roots: np.ndarray, true_child: np.ndarray, false_child: np.ndarray) -> int:
    """Σ over ``roots`` of the branch nodes on the longest path down from each: nodes are positions, a child is
    the position of a branch node or -1 (a leaf). Walked level by level over whole arrays, each node once per
    level; more levels than nodes means a cycle, a malformed tree (ValueError)."""
    size = len(true_child)
    owner_of = np.zeros(size, dtype=np.int64)  # the root a node descends from (trees share no node)
    total, level = 0, 0
    frontier, listed = np.unique(roots, return_counts=True)  # a root listed twice is two trees
    owner_of[frontier] = np.arange(len(frontier))
    while len(frontier):
        level += 1
        if level > size:
            raise ValueError("the tree attributes contain a cycle")
        going = np.zeros(len(listed), dtype=bool)
        going[owner_of[frontier]] = True
        total += int(listed[going].sum())  # one more level for each tree still going down
        children = np.concatenate([true_child[frontier], false_child[frontier]])
        parents = np.concatenate([frontier, frontier])
        keep = children >= 0
        children, parents = children[keep], parents[keep]
        owner_of[children] = owner_of[parents]
        reached = np.zeros(size, dtype=bool)
        reached[children] = True  # a node with two parents once
        frontier = np.flatnonzero(reached)
    return total


def _leaf_mask(modes) -> np.ndarray:
    """Which entries of ``nodes_modes`` are LEAF (str, or the raw bytes of a long attribute)."""
    modes = np.asarray(modes, dtype=object)
    if not len(modes):
        return np.zeros(0, dtype=bool)
    return modes == (b"LEAF" if isinstance(modes[0], bytes) else "LEAF")


#: Largest table (entries) indexed by a (tree, node) key; sparser ids are sorted instead.
_DENSE_KEYS = 2**27


def _legacy_depths(nodes_treeids, nodes_nodeids, nodes_modes, nodes_truenodeids, nodes_falsenodeids) -> int:
    """Σ_t d_t of the legacy encoding: per tree, the branch nodes on the longest root-to-leaf path. A tree's root is
    its last node that is no branch's child; a node listed twice is its last listing."""
    columns = [np.asarray(c) for c in (nodes_treeids, nodes_nodeids, nodes_truenodeids, nodes_falsenodeids)]
    n = min(map(len, columns + [nodes_modes]))
    if not n:
        return 0
    trees, ids, yes, no = (np.asarray(c[:n], dtype=np.int64) for c in columns)
    branch = ~_leaf_mask(nodes_modes)[:n]
    # (tree, node) as one integer key in [0, keys): the ids shifted to start at 0
    low = min(int(ids.min()), int(yes.min()), int(no.min()))
    span = max(int(ids.max()), int(yes.max()), int(no.max())) - low + 1
    first_tree = int(trees.min())
    tree_count = int(trees.max()) - first_tree + 1
    keys = tree_count * span
    if keys >= 2**62:
        raise ValueError("the tree or node ids are too far apart")
    base = (trees - first_tree) * span
    node_key = base + (ids - low)
    where = np.flatnonzero(branch)
    if keys <= _DENSE_KEYS:
        position = np.full(keys, -1, dtype=np.int64)
        position[node_key[where]] = np.arange(len(where))  # repeated keys: the last listing
        at = np.full(len(where), -1, dtype=np.int64)
        at[position[node_key[where]]] = where
        kept = at >= 0
        at = at[kept]
        position[node_key[at]] = np.arange(len(at))

        def branch_position(k: np.ndarray) -> np.ndarray:
            return position[k]
    else:
        reverse = where[::-1]
        branch_keys, last = np.unique(node_key[reverse], return_index=True)
        at = reverse[last]

        def branch_position(k: np.ndarray) -> np.ndarray:
            pos = np.minimum(np.searchsorted(branch_keys, k), len(branch_keys) - 1)
            return np.where(branch_keys[pos] == k, pos, -1) if len(branch_keys) else np.full(len(k), -1)
    true_key, false_key = base[at] + (yes[at] - low), base[at] + (no[at] - low)
    if keys <= _DENSE_KEYS:
        is_child = np.zeros(keys, dtype=bool)
        is_child[true_key] = is_child[false_key] = True
        not_child = np.flatnonzero(~is_child[node_key])
    else:
        not_child = np.flatnonzero(~np.isin(node_key, np.union1d(true_key, false_key)))
    root_of = np.full(tree_count, -1, dtype=np.int64)
    root_of[trees[not_child] - first_tree] = not_child  # per tree, its last node that is no child
    root_of = root_of[root_of >= 0]
    roots = branch_position(node_key[root_of])
    return _level_depths(roots[roots >= 0], branch_position(true_key), branch_position(false_key))


def _leaf_weights(tree_ids, node_ids) -> int:
    """Σ over trees of the most weights one leaf of the tree carries (one add each)."""
    n = min(len(tree_ids), len(node_ids))
    if not n:
        return 0
    trees, nodes = (np.asarray(np.asarray(c)[:n], dtype=np.int64) for c in (tree_ids, node_ids))
    first_tree, first_node = int(trees.min()), int(nodes.min())
    tree_span, node_span = int(trees.max()) - first_tree + 1, int(nodes.max()) - first_node + 1
    if tree_span * node_span <= _DENSE_KEYS:  # ids close together: a table of (tree, node) counts
        per_leaf = np.bincount((trees - first_tree) * node_span + (nodes - first_node), minlength=tree_span * node_span)
        return int(per_leaf.reshape(tree_span, node_span).max(axis=1).sum())
    tree_keys, tree_of = np.unique(trees, return_inverse=True)
    node_keys, node_of = np.unique(nodes, return_inverse=True)
    pairs, per_leaf = np.unique(tree_of * len(node_keys) + node_of, return_counts=True)
    most = np.zeros(len(tree_keys), dtype=np.int64)
    np.maximum.at(most, pairs // len(node_keys), per_leaf)
    return int(most.sum())


#: Why a tree ensemble's count is an upper bound (listed in every report's ``upper_bounds``).
TREE_BOUND = ("each tree counted along its deepest path and at its leaf with the most weights; a sample that reaches "
              "a shallower or lighter leaf does less")


def _tree_cost(n: int, depths: int, leaf_adds: int, outputs: int, average: bool, base: bool, transform,
               label: int = 0) -> Bound:  # fmt: skip
    per_sample = depths + leaf_adds + (outputs if average else 0) + (outputs if base else 0) + label
    return Bound(Cost(flops=n * per_sample) + n * post_transform_cost(transform, outputs), TREE_BOUND)


@formula("TreeEnsembleRegressor", family="ml", domain=DOMAIN)
def tree_ensemble_regressor(ctx: NodeContext, *, nodes_treeids, nodes_nodeids, nodes_modes, nodes_truenodeids,
                            nodes_falsenodeids, target_treeids=(), target_nodeids=(), n_targets: int = 1,
                            aggregate_function: str = "SUM", base_values=None, post_transform: str = "NONE",
                            **_) -> Bound:  # fmt: skip
    """FLOPs ≤ N·(Σ_t d_t + Σ_t w_t + a·T + b·T) + post_transform on T = n_targets scores: upper
    bound: per sample one comparison per branch node on the deepest path of each tree t (depth
    d_t, from the node attributes), one add (SUM; a comparison for MIN/MAX) per weight of the
    heaviest leaf of t (w_t), a = 1 division per target for AVERAGE, b = 1 add per target with
    ``base_values``.

    A BRANCH_MEMBER-style or NaN-tracking node counts one comparison. Feature gathering is free.
    """
    depths = _legacy_depths(nodes_treeids, nodes_nodeids, nodes_modes, nodes_truenodeids, nodes_falsenodeids)
    n, _ = _samples_features(ctx)
    return _tree_cost(n, depths, _leaf_weights(target_treeids, target_nodeids), n_targets,
                      aggregate_function == "AVERAGE", bool(base_values), post_transform)  # fmt: skip


@formula("TreeEnsembleClassifier", family="ml", domain=DOMAIN)
def tree_ensemble_classifier(ctx: NodeContext, *, nodes_treeids, nodes_nodeids, nodes_modes, nodes_truenodeids,
                             nodes_falsenodeids, class_treeids=(), class_nodeids=(), classlabels_int64s=None,
                             classlabels_strings=None, base_values=None, post_transform: str = "NONE",
                             **_) -> Bound:  # fmt: skip
    """FLOPs ≤ N·(Σ_t d_t + Σ_t w_t + b·K + max(K − 1, 1)) + post_transform on K class scores:
    upper bound: as TreeEnsembleRegressor (deepest-path comparisons d_t, the heaviest leaf's w_t
    adds, b = 1 add per class with ``base_values``) for K classes, plus the label: an argmax over
    the K scores (K − 1 comparisons; 1 threshold comparison for K ≤ 2).

    The binary case's second score column (its complement) is not counted.
    """
    depths = _legacy_depths(nodes_treeids, nodes_nodeids, nodes_modes, nodes_truenodeids, nodes_falsenodeids)
    n, _ = _samples_features(ctx)
    k = len(classlabels_int64s or classlabels_strings or ())
    return _tree_cost(n, depths, _leaf_weights(class_treeids, class_nodeids), k, False, bool(base_values),
                      post_transform, label=max(k - 1, 1))  # fmt: skip


@formula("TreeEnsemble", family="ml", domain=DOMAIN)
def tree_ensemble(ctx: NodeContext, *, tree_roots, nodes_truenodeids, nodes_trueleafs, nodes_falsenodeids,
                  nodes_falseleafs, n_targets: int = 1, aggregate_function: int = 1, post_transform: int = 0,
                  **_) -> Bound:  # fmt: skip
    """FLOPs ≤ N·(Σ_t d_t + R + a·T) + post_transform on T = n_targets scores: upper bound: per
    sample one comparison per node on the deepest path of each of the R trees (depth d_t, from
    tree_roots and the node attributes), one add (SUM; comparison for MIN/MAX) for the one weight
    of the leaf reached in each tree, a = 1 division per target for AVERAGE.

    A BRANCH_MEMBER node counts one comparison (not one per set member). Feature gathering is free.
    """

    size = len(nodes_truenodeids)
    true_child = np.where(np.asarray(nodes_trueleafs, dtype=bool), -1, np.asarray(nodes_truenodeids, dtype=np.int64))
    false_child = np.where(np.asarray(nodes_falseleafs, dtype=bool), -1, np.asarray(nodes_falsenodeids, dtype=np.int64))
    roots = np.asarray(tree_roots, dtype=np.int64)
    if any(len(c) and (c.min() < -1 or c.max() >= size) for c in (true_child, false_child)) or (
            len(roots) and (roots.min() < 0 or roots.max() >= size)):
        raise IndexError("a tree root or child is not a node index")
    depths = _level_depths(roots, true_child, false_child)
    n, _ = _samples_features(ctx)
    average = AGGREGATES[aggregate_function] == "AVERAGE"
    return _tree_cost(n, depths, len(tree_roots), n_targets, average, False, post_transform)


# --- free ---------------------------------------------------------------------------------------

zero_cost(
    "ArrayFeatureExtractor", "FeatureVectorizer", "ZipMap", "CastMap", "DictVectorizer",
    family="ml",
    domain=DOMAIN,
    reason="selects, concatenates or converts between tensors, maps and sequences; no arithmetic",
)  # fmt: skip
zero_cost(
    "LabelEncoder", "CategoryMapper", "OneHotEncoder",
    family="ml",
    domain=DOMAIN,
    reason="maps categories to labels, indices or one-hot rows by table lookup; no arithmetic",
)  # fmt: skip


@backward("Binarizer", "TreeEnsemble", "TreeEnsembleClassifier", "TreeEnsembleRegressor", domain=DOMAIN)
def piecewise_constant_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 0: a threshold (Binarizer) or a tree's leaf value is piecewise constant in X, so dX = 0
    wherever it exists; trees are not trained by gradients through the graph.

    Stated rather than left unsupported. The other ai.onnx.ml models (linear, SVM, scaler,
    normalizer, imputer) have no backward formula: a training count lists them.
    """
    return Cost()


# Piecewise constant in X (dX = 0 wherever it exists): the backward reads nothing of the forward.
saves_nothing("Binarizer", "TreeEnsemble", "TreeEnsembleClassifier", "TreeEnsembleRegressor", domain=DOMAIN)


@saves("ArrayFeatureExtractor", domain=DOMAIN)
def array_feature_extractor_saved(ctx: NodeContext, **_) -> Saved:
    """The indices Y: dX is dZ scattered back to the columns they pick."""
    return keeps(1)


# --- output shapes ------------------------------------------------------------------------------
# ONNX's inference gives most of these operators a type at best. Shapes follow the ONNX-ML spec and onnxruntime's
# kernels: a 1-D X is one sample (N = 1); labels are int64 or strings after the class label attribute given.

FLOAT, INT64, STRING = 1, 7, 8


def _known(inputs, i: int = 0) -> TensorInfo:
    t = inputs[i] if i < len(inputs) else None
    if t is None or not t.is_static:
        raise ValueError(f"input {i} has no static shape")
    return t


def _rows(inputs) -> int:
    """N: the samples of X (input 0), one for a 1-D X."""
    shape = _known(inputs).shape
    if not shape:
        raise ValueError("X is a scalar")
    return 1 if len(shape) == 1 else shape[0]


def _label_type(strings) -> int:
    return STRING if strings else INT64


@shape_function("Scaler", "Normalizer", domain=DOMAIN)
def float_like_input_shape(inputs, **_):
    """Y: float, the shape of X."""
    return ((FLOAT, _known(inputs).shape),)


@shape_function("Imputer", "Binarizer", domain=DOMAIN)
def like_input_shape(inputs, **_):
    """Y: the type and shape of X."""
    x = _known(inputs)
    return ((x.elem_type, x.shape),)


@shape_function("LinearRegressor", domain=DOMAIN)
def linear_regressor_shape(inputs, *, targets: int = 1, **_):
    """Y: float [N, targets]."""
    return ((FLOAT, (_rows(inputs), targets)),)


@shape_function("SVMRegressor", domain=DOMAIN)
def svm_regressor_shape(inputs, **_):
    """Y: float [N, 1]."""
    return ((FLOAT, (_rows(inputs), 1)),)


@shape_function("LinearClassifier", domain=DOMAIN)
def linear_classifier_shape(inputs, *, coefficients, classlabels_ints=None, classlabels_strings=None, **_):
    """Y: labels [N]; Z: float [N, K] for K = |coefficients|/F weight vectors, or [N, 2] for one weight vector
    and two class labels (the complement's column added)."""
    n, shape = _rows(inputs), _known(inputs).shape
    k = len(coefficients) // shape[-1]
    labels = classlabels_strings or classlabels_ints or ()
    scores = 2 if k == 1 and len(labels) == 2 else k
    return (_label_type(classlabels_strings), (n,)), (FLOAT, (n, scores))


@shape_function("SVMClassifier", domain=DOMAIN)
def svm_classifier_shape(inputs, *, vectors_per_class=None, prob_a=None, classlabels_ints=None,
                         classlabels_strings=None, **_):  # fmt: skip
    """Y: labels [N]; Z: float [N, E]: E = K for K classes with probabilities (prob_a) or in linear mode, else the
    K(K − 1)/2 one-vs-one scores (2 for K ≤ 2)."""
    n = _rows(inputs)
    k = len(classlabels_strings or classlabels_ints or ())
    scores = k
    if vectors_per_class and not prob_a:
        scores = k * (k - 1) // 2 if k > 2 else 2
    return (_label_type(classlabels_strings), (n,)), (FLOAT, (n, scores))


@shape_function("TreeEnsembleClassifier", domain=DOMAIN)
def tree_classifier_shape(inputs, *, classlabels_int64s=None, classlabels_strings=None, **_):
    """Y: labels [N]; Z: float [N, K] for K class labels."""
    n = _rows(inputs)
    k = len(classlabels_strings or classlabels_int64s or ())
    return (_label_type(classlabels_strings), (n,)), (FLOAT, (n, k))


@shape_function("TreeEnsembleRegressor", domain=DOMAIN)
def tree_regressor_shape(inputs, *, n_targets: int = 1, **_):
    """Y: float [N, n_targets]."""
    return ((FLOAT, (_rows(inputs), n_targets)),)


@shape_function("TreeEnsemble", domain=DOMAIN)
def tree_ensemble_shape(inputs, *, n_targets: int = 1, **_):
    """Y: [N, n_targets], the type of X."""
    return ((_known(inputs).elem_type, (_rows(inputs), n_targets)),)


@shape_function("FeatureVectorizer", domain=DOMAIN)
def feature_vectorizer_shape(inputs, *, inputdimensions, **_):
    """Y: float [N, Σ inputdimensions], N the samples of the first input."""
    return ((FLOAT, (_rows(inputs), sum(inputdimensions))),)


@shape_function("OneHotEncoder", domain=DOMAIN)
def one_hot_encoder_shape(inputs, *, cats_int64s=None, cats_strings=None, **_):
    """Y: float, the shape of X with one more axis of C = |cats| categories."""
    return ((FLOAT, (*_known(inputs).shape, len(cats_strings or cats_int64s or ()))),)


@shape_function("ArrayFeatureExtractor", domain=DOMAIN)
def array_feature_extractor_shape(inputs, **_):
    """Z: the type of X, its shape with the last axis replaced by the |Y| indices ([1, |Y|] for a 1-D X)."""
    x, y = _known(inputs, 0), _known(inputs, 1)
    picked = prod(y.shape)
    if not x.shape:
        raise ValueError("X is a scalar")
    return ((x.elem_type, (1, picked) if len(x.shape) == 1 else (*x.shape[:-1], picked)),)


# LabelEncoder's output type, from the attribute its values are in
_LABEL_VALUES = {"values_strings": STRING, "values_int64s": INT64, "values_floats": FLOAT}


@shape_function("LabelEncoder", domain=DOMAIN)
def label_encoder_shape(inputs, *, values_tensor=None, **attrs):
    """Y: the shape of X, the type of the values (values_strings, values_int64s, values_floats or values_tensor)."""
    kind = values_tensor.data_type if values_tensor is not None else next(
        (t for name, t in _LABEL_VALUES.items() if attrs.get(name)), 0)
    return ((kind, _known(inputs).shape),)


@shape_function("CategoryMapper", domain=DOMAIN)
def category_mapper_shape(inputs, **_):
    """Y: the shape of X; int64 for string X, strings for int64 X."""
    x = _known(inputs)
    return ((INT64 if x.elem_type == STRING else STRING, x.shape),)


@shape_function("DictVectorizer", domain=DOMAIN)
def dict_vectorizer_shape(inputs, *, string_vocabulary=None, int64_vocabulary=None, **_):
    """Y: [1, V] for V vocabulary entries (one map in, one row out), of the map's value type."""
    return ((0, (1, len(string_vocabulary or int64_vocabulary or ()))),)


_CAST_TO = {"TO_FLOAT": FLOAT, "TO_STRING": STRING, "TO_INT64": INT64}


@shape_function("CastMap", domain=DOMAIN)
def cast_map_shape(inputs, *, cast_to: str = "TO_FLOAT", map_form: str = "DENSE", max_map: int = 1, **_):
    """Y: [1, max_map] with map_form SPARSE; with DENSE, one column per map entry, unknown before the run."""
    return ((_CAST_TO.get(cast_to, 0), (1, max_map) if map_form == "SPARSE" else None),)


@shape_function("ZipMap", domain=DOMAIN)
def zip_map_shape(inputs, **_):
    """Z: a sequence of N maps, which has no tensor shape (nothing is computed from it)."""
    return (None,)
