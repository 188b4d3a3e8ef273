"""String operators are free; TfIdfVectorizer counts one multiply per output in TFIDF mode."""

import pytest
from helpers import model
from onnx import TensorProto, helper

import flopcount


def tfidf(mode):
    node = helper.make_node(
        "TfIdfVectorizer", ["x"], ["y"], mode=mode, min_gram_length=1, max_gram_length=2, max_skip_count=0,
        ngram_counts=[0, 4], ngram_indexes=[0, 1, 2, 3, 4, 5, 6], pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7],
        weights=[1.0] * 7,
    )
    return flopcount.count(model([node], {"x": (3, 13)}, ["y"], opset=9, dtype=TensorProto.INT64)).total


@pytest.mark.parametrize("mode, flops", [
    pytest.param("TF", 0, id="tf"),
    pytest.param("IDF", 0, id="idf"),
    pytest.param("TFIDF", 3 * 7, id="tfidf"),  # Y [3, 7]: 7 n-gram indexes per row
])  # fmt: skip
def test_tfidf_vectorizer(mode, flops):
    assert tfidf(mode).flops == flops


@pytest.mark.parametrize(
    "op, attrs",
    [
        pytest.param("RegexFullMatch", {"pattern": "a+"}, id="regex"),
        pytest.param("StringNormalizer", {"case_change_action": "LOWER"}, id="normalizer"),
        pytest.param("StringSplit", {}, id="split"),
    ],
)
def test_string_ops_are_free(op, attrs):
    node = helper.make_node(op, ["s"], ["y"] if op != "StringSplit" else ["y", "n"], **attrs)
    m = model([node], {"s": (7,)}, [o for o in node.output], opset=20, dtype=TensorProto.STRING)
    (n,) = flopcount.count(m).nodes
    assert (n.status, n.cost.flops) == ("zero-cost", 0)


def test_string_concat_is_free():
    node = helper.make_node("StringConcat", ["a", "b"], ["y"])
    m = model([node], {"a": (7,), "b": (7,)}, ["y"], opset=20, dtype=TensorProto.STRING)
    (n,) = flopcount.count(m).nodes
    assert n.status == "zero-cost"
