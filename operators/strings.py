"""Text processing: string operators (free: no numeric arithmetic) and TfIdfVectorizer."""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import formula, zero_cost

zero_cost(
    "RegexFullMatch", "StringConcat", "StringNormalizer", "StringSplit",
    family="strings",
    reason="operates on strings (matching, joining, case folding, splitting); no numeric arithmetic",
)  # fmt: skip


@formula("TfIdfVectorizer", family="strings")
def tfidf_vectorizer(ctx: NodeContext, *, mode: str = "TF", **_) -> Cost:
    """FLOPs = |Y| in mode TFIDF (each n-gram frequency times its weight); 0 in modes TF and IDF.

    TF outputs the frequencies themselves and IDF the weight of each n-gram that occurs (a
    selection). Finding and counting the n-grams (integer or string lookups, data-dependent) is
    not counted.
    """
    return Cost(flops=ctx.out_numel()) if mode == "TFIDF" else Cost()
